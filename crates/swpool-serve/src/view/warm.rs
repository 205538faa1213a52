//! The warm start of a view: the files a job read, kept in the user's node-local cache between
//! jobs, so that the next job on the same node reads from shared storage only what changed.
//!
//! [`Warm`] is a [`FileBytes`] in front of another (the tree on storage): a file is looked up in
//! its directory under a key made of the file's path below the view, its size and its mtime (as
//! the snapshot listed them); an entry that is there, names that file with that size and mtime and
//! whose bytes hash (BLAKE3) to the hash it was written with is served without touching storage.
//! Anything else (no entry, another version, a torn or corrupted entry) is fetched from storage
//! as before and written for the next job (a temporary name, renamed when complete).
//!
//! Not in the key: the inode number (recorded, not compared): FUSE file systems such as sshfs
//! (without `use_ino`) number a file anew when the kernel forgot it, so an unchanged file would
//! never be found again. A file rewritten with the same size and mtime (to the nanosecond) is
//! taken for the old one, as `make` and `rsync` take it.
//!
//! Bounded: [`open_dir`] removes the least recently used entries (their mtime, set again at
//! each hit) until the directory holds at most its limit.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, Mode, OFlags, Timestamps};

use super::{FileBytes, Node};

const MAGIC: &[u8; 16] = b"sw-pool-warm 2\n\0";
/// Magic, path length, size, mtime seconds and nanoseconds, inode, content hash, offset.
const HEAD: usize = 16 + 4 + 8 + 8 + 4 + 8 + 32 + 8;
/// A path below a view is at most this long (`PATH_MAX`).
const MAX_PATH: usize = 4096;

/// See the module's documentation.
pub struct Warm {
    inner: Box<dyn FileBytes>,
    dir: OwnedFd,
    /// Files served from the warm cache (storage untouched).
    pub hits: AtomicU64,
    /// Files fetched from `inner` (and written for the next job).
    pub misses: AtomicU64,
}

/// The name of the entry of a file's bytes at `offset` (a whole file: 0): its key, hashed.
fn entry_name(node: &Node, offset: u64) -> String {
    let mut h = blake3::Hasher::new();
    h.update(node.path.as_os_str().as_bytes());
    h.update(&[0]);
    h.update(&node.size.to_le_bytes());
    h.update(&node.mtime.0.to_le_bytes());
    h.update(&node.mtime.1.to_le_bytes());
    h.update(&offset.to_le_bytes());
    h.finalize().to_hex()[..40].to_string()
}

fn head(node: &Node, hash: &blake3::Hash, offset: u64) -> Vec<u8> {
    let path = node.path.as_os_str().as_bytes();
    let mut v = Vec::with_capacity(HEAD + path.len());
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&(path.len() as u32).to_le_bytes());
    v.extend_from_slice(&node.size.to_le_bytes());
    v.extend_from_slice(&node.mtime.0.to_le_bytes());
    v.extend_from_slice(&node.mtime.1.to_le_bytes());
    v.extend_from_slice(&node.ino.to_le_bytes());
    v.extend_from_slice(hash.as_bytes());
    v.extend_from_slice(&offset.to_le_bytes());
    v.extend_from_slice(path);
    v
}

/// An entry's head, as [`head`] wrote it.
struct Head<'a> {
    size: u64,
    mtime: (i64, u32),
    hash: [u8; 32],
    offset: u64,
    /// The file's path below the tree.
    path: &'a [u8],
    /// What follows the path: the bytes.
    rest: &'a [u8],
}

/// The head of entry `e` (of it, at least its head and path), parsed with every length bounded:
/// the entry is on a disk another process of the user's could have written.
fn parse_head(e: &[u8]) -> Option<Head<'_>> {
    let (h, rest) = (e.get(..HEAD)?, e.get(HEAD..)?);
    if &h[..16] != MAGIC {
        return None;
    }
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
    let path_len = u32_at(16) as usize;
    if path_len > MAX_PATH {
        return None;
    }
    Some(Head {
        size: u64_at(20),
        mtime: (u64_at(28) as i64, u32_at(36)),
        hash: h[48..80].try_into().ok()?,
        offset: u64_at(80),
        path: rest.get(..path_len)?,
        rest: rest.get(path_len..)?,
    })
}

/// The `len` bytes of `node` at `offset` in an entry, if the entry is of that file, that version,
/// those bytes, whole and unaltered.
fn parse_entry(node: &Node, e: &[u8], offset: u64, len: u64) -> Option<Vec<u8>> {
    let h = parse_head(e)?;
    if h.size != node.size
        || h.mtime != node.mtime
        || h.offset != offset
        || h.path != node.path.as_os_str().as_bytes()
        || h.rest.len() as u64 != len
    {
        return None;
    }
    (blake3::hash(h.rest) == blake3::Hash::from(h.hash)).then(|| h.rest.to_vec())
}

/// The warm cache's directory `dir` (the user's own node-local directory, made if missing, mode
/// 0700), opened, its entries beyond `limit` bytes removed, least recently used first.
pub fn open_dir(dir: &Path, limit: u64) -> Result<OwnedFd, String> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{}: {e}", dir.display()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("{}: {e}", dir.display()))?;
    if st.st_uid != rustix::process::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
        return Err(format!(
            "{}: not a private directory of yours (owner {}, mode {:o}); nothing of it is used",
            dir.display(),
            st.st_uid,
            st.st_mode & 0o7777
        ));
    }
    trim(&fd, limit);
    Ok(fd)
}

/// Remove entries of `dir`, least recently used first, until they hold at most `limit` bytes (and
/// every temporary file a writer left behind).
fn trim(dir: &OwnedFd, limit: u64) {
    let Ok(mut rd) = rustix::fs::Dir::read_from(dir) else {
        return;
    };
    let mut entries: Vec<(i64, u64, std::ffi::CString)> = Vec::new();
    let mut total = 0u64;
    while let Some(Ok(e)) = rd.read() {
        let name = e.file_name().to_owned();
        if matches!(name.as_bytes(), b"." | b"..") {
            continue;
        }
        let Ok(st) = rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        if name.as_bytes().starts_with(b".") {
            // a writer's temporary file: a view that ended while writing it
            let _ = rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty());
            continue;
        }
        total += st.st_size as u64;
        entries.push((st.st_mtime as i64, st.st_size as u64, name));
    }
    entries.sort();
    for (_, size, name) in entries {
        if total <= limit {
            break;
        }
        if rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty()).is_ok() {
            total -= size;
        }
    }
}

/// A file of a tree that views read on this node, as its warm cache records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The file's path below the tree.
    pub path: std::path::PathBuf,
    /// Its size when it was read.
    pub size: u64,
    /// Bytes of it the cache holds (a large file's pieces that were read).
    pub held: u64,
}

/// The files of the warm cache in `dir` (a tree's: see [`open_dir`]), one each, by path: what
/// jobs on this node read of the tree, as far as the cache still holds it. Only an entry's head
/// is read, bounded; an entry that is no entry is skipped.
pub fn list(dir: &Path) -> Result<Vec<Kept>, String> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    let mut by_path: std::collections::BTreeMap<Vec<u8>, Kept> = Default::default();
    for e in rd.flatten() {
        if e.file_name().as_bytes().starts_with(b".") {
            continue;
        }
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(e.path())
        else {
            continue;
        };
        let Ok(st) = f.metadata() else { continue };
        if !st.is_file() {
            continue;
        }
        let mut h = Vec::with_capacity(HEAD + MAX_PATH);
        if f.take((HEAD + MAX_PATH) as u64)
            .read_to_end(&mut h)
            .is_err()
        {
            continue;
        }
        let Some(head) = parse_head(&h) else { continue };
        let held = (st.len()).saturating_sub((HEAD + head.path.len()) as u64);
        let k = by_path.entry(head.path.to_vec()).or_insert_with(|| Kept {
            path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(head.path)),
            size: head.size,
            held: 0,
        });
        k.held += held;
    }
    Ok(by_path.into_values().collect())
}

impl Warm {
    /// The warm cache in the directory [`open_dir`] opened, in front of `inner`.
    pub fn new(inner: Box<dyn FileBytes>, dir: OwnedFd) -> Warm {
        Warm {
            inner,
            dir,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    fn lookup(&self, node: &Node, name: &str, offset: u64, len: u64) -> Option<Vec<u8>> {
        let fd = rustix::fs::openat(
            &self.dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        // a regular file of the size an entry of this file has: nothing larger is read
        if st.st_mode & libc::S_IFMT != libc::S_IFREG
            || st.st_size as u64 != (HEAD + node.path.as_os_str().len()) as u64 + len
        {
            return None;
        }
        let mut e = Vec::with_capacity(st.st_size as usize);
        File::from(fd).read_to_end(&mut e).ok()?;
        let bytes = parse_entry(node, &e, offset, len);
        if bytes.is_none() {
            // another version or a damaged entry: never served; the fetch writes it anew
            let _ = rustix::fs::unlinkat(&self.dir, name, AtFlags::empty());
        }
        bytes
    }

    fn keep(&self, node: &Node, name: &str, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        let tmp = format!(".{name}.{}", std::process::id());
        let fd = rustix::fs::openat(
            &self.dir,
            tmp.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        let r = (|| {
            let mut f = File::from(fd);
            f.write_all(&head(node, &blake3::hash(bytes), offset))?;
            f.write_all(bytes)?;
            rustix::fs::renameat(&self.dir, tmp.as_str(), &self.dir, name)?;
            Ok(())
        })();
        if r.is_err() {
            let _ = rustix::fs::unlinkat(&self.dir, tmp.as_str(), AtFlags::empty());
        }
        r
    }
}

impl Warm {
    /// The `len` bytes of `node` at `offset` from the cache, else from `inner` (`get`) and kept.
    fn bytes(
        &self,
        node: &Node,
        offset: u64,
        len: u64,
        get: impl FnOnce() -> Result<Vec<u8>, String>,
    ) -> Result<Vec<u8>, String> {
        let name = entry_name(node, offset);
        if let Some(v) = self.lookup(node, &name, offset, len) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            // used now: the last to go when the cache is trimmed
            let now = Timestamps {
                last_access: rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_NOW,
                },
                last_modification: rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_NOW,
                },
            };
            let _ = rustix::fs::utimensat(&self.dir, name.as_str(), &now, AtFlags::empty());
            return Ok(v);
        }
        let v = get()?;
        self.misses.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.keep(node, &name, &v, offset) {
            tracing::warn!(
                "{}: not kept for the next job ({}): {e}",
                node.path.display(),
                self.describe()
            );
        }
        Ok(v)
    }
}

impl FileBytes for Warm {
    fn fetch(&self, node: &Node) -> Result<Vec<u8>, String> {
        self.bytes(node, 0, node.size, || self.inner.fetch(node))
    }

    fn fetch_piece(&self, node: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        self.bytes(node, offset, u64::from(len), || {
            self.inner.fetch_piece(node, offset, len)
        })
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests;
