//! The tree on shared storage as a view reads it ([`Storage`]): by descriptor below the tree's
//! root, each file checked against the snapshot after it was read.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::{FileBytes, Node};

/// The tree on storage itself, through the directory descriptor opened before the view was
/// mounted over it: each file opened below it with no symlink followed and nothing outside it
/// reachable (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
pub struct Storage {
    root: OwnedFd,
    what: PathBuf,
    /// Directories opened below the root, by path: a file is opened relative to its directory,
    /// so that opening it costs storage one lookup, not one per component of its path (on a
    /// coherent network file system each is a request to the server).
    dirs: Kept<OwnedFd>,
    /// Large files opened for their pieces, by path, kept for the next piece (one open per file,
    /// not per piece; a file replaced on storage since is read as it was opened, checked as any).
    files: Kept<File>,
    /// Files opened on storage (one request each, plus the reads and an `fstat`).
    pub opens: AtomicU64,
    /// Bytes read from storage.
    pub bytes: AtomicU64,
}

/// Directories a [`Storage`] keeps open at most.
const MAX_DIRS: usize = 256;
/// Large files a [`Storage`] keeps open at most.
const MAX_FILES: usize = 64;

/// Descriptors kept open by path, at most `max` (past it, it starts again).
struct Kept<T> {
    map: Mutex<HashMap<PathBuf, Arc<T>>>,
    max: usize,
}

impl<T> Kept<T> {
    fn new(max: usize) -> Kept<T> {
        Kept {
            map: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// The one kept for `path`, else `open()`'s, kept.
    fn get_or_open<E>(
        &self,
        path: &Path,
        open: impl FnOnce() -> Result<T, E>,
    ) -> Result<Arc<T>, E> {
        if let Some(d) = self.map.lock().unwrap_or_else(|e| e.into_inner()).get(path) {
            return Ok(d.clone());
        }
        let fd = Arc::new(open()?);
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= self.max {
            map.clear();
        }
        map.insert(path.to_path_buf(), fd.clone());
        Ok(fd)
    }
}

impl Storage {
    pub fn new(root: OwnedFd, what: &Path) -> Storage {
        Storage {
            root,
            what: what.to_path_buf(),
            dirs: Kept::new(MAX_DIRS),
            files: Kept::new(MAX_FILES),
            opens: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// `rel` (below the root) opened with `flags`, relative to its directory ([`Storage::dir`]),
    /// no symlink followed and nothing outside the root reachable.
    fn open_beneath(&self, rel: &Path, flags: OFlags) -> Result<OwnedFd, rustix::io::Errno> {
        let (parent, name) = match (rel.parent(), rel.file_name()) {
            (Some(p), Some(n)) => (p, n),
            _ => return Err(rustix::io::Errno::INVAL),
        };
        let up = match parent.as_os_str().is_empty() {
            true => None,
            false => Some(self.dir(parent)?),
        };
        rustix::fs::openat2(
            up.as_deref().unwrap_or(&self.root),
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
    }

    /// The directory `rel` below the root, opened relative to its parent (kept open too: each
    /// directory costs one lookup however deep), and only as a path (`O_PATH`: no directory
    /// handle on the server); kept for the next file of it.
    fn dir(&self, rel: &Path) -> Result<Arc<OwnedFd>, rustix::io::Errno> {
        self.dirs.get_or_open(rel, || {
            self.open_beneath(rel, OFlags::PATH | OFlags::DIRECTORY)
        })
    }
}

/// Whether `st` is the file the snapshot saw: the same size and mtime. Not the inode number:
/// FUSE file systems such as sshfs (without `use_ino`) number a file anew when the kernel forgot
/// it, so an unchanged file would look replaced.
fn same(node: &Node, st: &rustix::fs::Stat) -> Result<(), String> {
    let now = (
        st.st_size as u64,
        (st.st_mtime as i64, st.st_mtime_nsec as u32),
    );
    if now != (node.size, node.mtime) {
        return Err(format!(
            "changed on storage since the job's snapshot (size {} → {}, mtime {}.{:09} → {}.{:09}): \
             not served, so that every reader sees one version; run the job again to see the new one",
            node.size, now.0, node.mtime.0, node.mtime.1, now.1 .0, now.1 .1
        ));
    }
    Ok(())
}

impl Storage {
    /// `len` bytes of file `node` at `offset`, checked as [`FileBytes::fetch`] checks a whole
    /// file: the file the snapshot saw after the read, all of the bytes there.
    pub fn read_piece(&self, node: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        let f = self.files.get_or_open(&node.path, || {
            let f = self.open_checked(node)?;
            // its pieces are read here and there (and by several nodes, each its own): no
            // read-ahead of bytes another node reads or nobody needs
            let _ = rustix::fs::fadvise(&f, 0, 0, rustix::fs::Advice::Random);
            Ok::<_, String>(f)
        })?;
        let mut v = vec![0u8; len as usize];
        let read = f.read_exact_at(&mut v, offset);
        let after = rustix::fs::fstat(&*f).map_err(|e| format!("fstat: {e}"))?;
        // a file cut short since says so, rather than that a read came short
        same(node, &after)?;
        read.map_err(|e| format!("reading {len} bytes at {offset} on storage: {e}"))?;
        self.bytes.fetch_add(v.len() as u64, Ordering::Relaxed);
        Ok(v)
    }

    /// File `node` opened below the root (relative to its directory, [`Storage::dir`]; the file
    /// itself no symlink). Whether it is the file the snapshot saw is checked after the read
    /// (its size and mtime then: a file changed before or while it was read shows a new mtime).
    fn open_checked(&self, node: &Node) -> Result<File, String> {
        self.opens.fetch_add(1, Ordering::Relaxed);
        self.open_beneath(&node.path, OFlags::RDONLY)
            .map(File::from)
            .map_err(|e| format!("opening it on storage: {e}"))
    }
}

impl FileBytes for Storage {
    fn fetch(&self, node: &Node) -> Result<Vec<u8>, String> {
        let mut f = self.open_checked(node)?;
        let mut v = Vec::with_capacity(node.size as usize);
        f.read_to_end(&mut v)
            .map_err(|e| format!("reading it on storage: {e}"))?;
        self.bytes.fetch_add(v.len() as u64, Ordering::Relaxed);
        let after = rustix::fs::fstat(&f).map_err(|e| format!("fstat: {e}"))?;
        same(node, &after)?;
        if v.len() as u64 != node.size {
            return Err(format!(
                "changed on storage while it was read ({} bytes read, {} expected): not served",
                v.len(),
                node.size
            ));
        }
        Ok(v)
    }

    fn fetch_piece(&self, node: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        self.read_piece(node, offset, len)
    }

    fn describe(&self) -> String {
        self.what.display().to_string()
    }
}
