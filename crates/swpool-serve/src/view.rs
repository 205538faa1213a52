//! A read-once view of a directory tree on shared storage (`sw-pool run --cache DIR`): the tree is
//! walked once when the view starts (every entry `lstat`ed: type, mode, size, mtime, inode,
//! symlink target) and every lookup, readdir, getattr and readlink is answered from that
//! snapshot, failed lookups included (negative entries the kernel keeps); a file's bytes are read
//! from storage once, at its first open (a file larger than [`PIECE`] by the pieces reads touch,
//! each at its first read), kept in node-local memory or in an unnamed file of a node-local
//! directory, and served from there for the rest of the view's life (the warm cache hashes what
//! it keeps, `view::warm`; a job-wide view's owner hashes what it sends, [`job`]).
//!
//! Consistency: the view is a snapshot. A file whose size or mtime on storage differs from
//! the snapshot's when it is first read (or changes while it is read) is not served: its reads
//! fail with `EIO` for the rest of the view's life and one log line names it; a file (or piece)
//! read once is served as read, whatever happens on storage after. Nothing is written back (the view is
//! read-only).
//!
//! Every node of a job makes its own snapshot, each at its own time: a node whose view starts
//! after a file changed would list the new version while the others serve the old one. So a view
//! that knows the job's start (its [`Epoch`], one time for the whole job: the Slurm step's start)
//! serves no file whose mtime is at or after it: a file changed since the job began is refused on
//! every node alike, whenever each node listed it, and the nodes serve one version of a file or
//! none.
//!
//! The pieces behind seams, so that unit tests run them without FUSE:
//! - [`Snapshot::walk`]: the listing, made by descriptor from a directory opened before the view
//!   is mounted over it.
//! - [`FileBytes`]: where a file's bytes come from ([`Storage`]: the tree itself through that
//!   descriptor; the job's other nodes implement the same trait).
//! - [`View`]: the answers (lookup, attributes, reads) as plain results; [`ViewFs`] is the FUSE
//!   file system that passes them on.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use rustix::fs::{Mode, OFlags};

mod epoch;
pub mod job;
mod storage;
pub use storage::Storage;
mod walk;
mod warm;
pub use epoch::Epoch;
pub use warm::{list as warm_list, open_dir as open_warm_dir, Kept, Warm};

/// The snapshot never changes while it is served.
const TTL: Duration = Duration::from_secs(24 * 3600);
/// Entries of one view at most (a conda environment has ~50k, a Spack tree a few 100k).
pub const MAX_ENTRIES: usize = 5_000_000;

/// The kind of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// A fifo, socket or device node: listed, never opened.
    Other,
}

/// One entry of the snapshot, as `lstat` saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The path below the view's root (empty for the root).
    pub path: PathBuf,
    pub kind: Kind,
    /// Permission bits (`st_mode & 0o7777`).
    pub perm: u16,
    pub size: u64,
    pub mtime: (i64, u32),
    /// The inode number on storage (kept for a later cache key; not compared, see `same`).
    pub ino: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// A symlink's target.
    pub target: Vec<u8>,
    /// A directory's entries, sorted by name: (name, index into [`Snapshot::nodes`]).
    pub children: Vec<(Vec<u8>, u32)>,
    /// A directory the walk could not read (its lookups fail with `EACCES`, as they would), or a
    /// symlink whose target it could not read (its readlink fails with `EPERM`).
    pub unreadable: bool,
    /// The index of the parent directory (the root's own for the root).
    pub parent: u32,
}

/// The listing of a whole tree, made once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Index 0 is the root; a node's FUSE inode number is its index + 1.
    pub nodes: Vec<Node>,
    /// Calls made to storage to make it (one `lstat` per entry, one open and read per directory).
    pub requests: u64,
}

#[cfg(test)]
impl Node {
    /// A regular file's entry of `size` bytes in directory `parent`, for tests.
    pub(crate) fn test_file(path: &str, size: u64, parent: u32) -> Node {
        Node {
            path: PathBuf::from(path),
            kind: Kind::File,
            perm: 0o644,
            size,
            mtime: (0, 0),
            ino: 0,
            nlink: 1,
            uid: 0,
            gid: 0,
            target: Vec::new(),
            children: Vec::new(),
            unreadable: false,
            parent,
        }
    }
}

fn kind_of(mode: u32) -> Kind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFREG => Kind::File,
        libc::S_IFLNK => Kind::Symlink,
        _ => Kind::Other,
    }
}

impl Snapshot {
    /// Walk the tree below `root` (a directory opened before anything is mounted over it), by
    /// descriptor (see [`walk`]). `what` names the tree in errors.
    pub fn walk(root: BorrowedFd<'_>, what: &Path) -> Result<Snapshot, String> {
        walk::walk(root, what, walk::THREADS)
    }

    /// The entry `name` of the directory `dir`: `Ok(None)` when it has none (a negative entry),
    /// `Err` when `dir` is not a directory (`ENOTDIR`) or could not be read (`EACCES`).
    pub fn lookup(&self, dir: u32, name: &[u8]) -> Result<Option<u32>, Errno> {
        let d = self.nodes.get(dir as usize).ok_or(Errno::ENOENT)?;
        if d.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        if d.unreadable {
            return Err(Errno::EACCES);
        }
        Ok(d.children
            .binary_search_by(|(n, _)| n.as_slice().cmp(name))
            .ok()
            .map(|i| d.children[i].1))
    }

    /// Regular files and their bytes in all.
    pub fn files(&self) -> (u64, u64) {
        self.nodes
            .iter()
            .filter(|n| n.kind == Kind::File)
            .fold((0, 0), |(c, b), n| (c + 1, b + n.size))
    }
}

fn node_of(path: PathBuf, st: &rustix::fs::Stat, target: Vec<u8>, parent: u32) -> Node {
    Node {
        path,
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        size: st.st_size as u64,
        mtime: (st.st_mtime as i64, st.st_mtime_nsec as u32),
        ino: st.st_ino,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        target,
        children: Vec::new(),
        unreadable: false,
        parent,
    }
}

/// Where a file's bytes come from. The answer is the file's whole content as the snapshot saw
/// it, or why not (a file changed since, unreadable, gone): the view logs it and fails the
/// file's reads with `EIO`.
pub trait FileBytes: Send + Sync {
    fn fetch(&self, node: &Node) -> Result<Vec<u8>, String>;
    /// `len` bytes of file `node` at `offset` (a piece of a file larger than the view's piece,
    /// [`PIECE`]), checked as [`FileBytes::fetch`] checks a whole file: the file the snapshot saw,
    /// all of the bytes there. By default the whole file, cut.
    fn fetch_piece(&self, node: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        let v = self.fetch(node)?;
        let s = (offset as usize).min(v.len());
        Ok(v[s..(s + len as usize).min(v.len())].to_vec())
    }
    /// Where the bytes come from, for messages.
    fn describe(&self) -> String;
}

impl<T: FileBytes + ?Sized> FileBytes for Arc<T> {
    fn fetch(&self, node: &Node) -> Result<Vec<u8>, String> {
        (**self).fetch(node)
    }
    fn fetch_piece(&self, node: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        (**self).fetch_piece(node, offset, len)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// Files larger than this (64 KiB) are read piece by piece, each piece at the first read that
/// needs it, so that a large library of which a program touches a few pages costs storage those
/// pages' pieces only; smaller files are read whole at their first open. The job-wide view's
/// chunk ([`job::CHUNK`]), so that a piece is one ask of the node's server. 64 KiB rather than
/// 128: storage bytes 1.06–1.09× what one rank reads straight instead of 1.10–1.13× (256 KiB:
/// 1.20×); with a read's missing pieces fetched side by side ([`View::fetch_missing`]) the time
/// against straight from storage is the same (bench/results/storm-job-20261129-64k-par against
/// -ra128k; 64 KiB fetched one after another was slower, -64k).
pub const PIECE: u64 = 1 << 16;

/// Pieces of one read fetched at once, at most ([`View::fetch_missing`]).
const PIECES_AT_ONCE: usize = 16;

/// A file's bytes as the view keeps them.
enum Held {
    Memory(Vec<u8>),
    /// An unnamed file (`O_TMPFILE`) in the node-local directory: nothing is left when the
    /// view ends, however it ends.
    Disk(File),
    /// A file larger than [`PIECE`]: each piece fetched at its first read.
    Pieces(Pieces),
}

/// The pieces of a large file: in memory, or written at their offsets into one unnamed file of
/// the node-local directory.
struct Pieces {
    cells: Vec<OnceLock<Result<Option<Vec<u8>>, ()>>>,
    disk: Option<File>,
}

/// What the view did, for its log line and tests.
#[derive(Debug, Default)]
pub struct Stats {
    /// Files whose bytes were fetched (once each).
    pub fetched: AtomicU64,
    pub fetched_bytes: AtomicU64,
    /// Files that were not served (changed, unreadable).
    pub failed: AtomicU64,
}

/// The answers of the view, without FUSE. See the module's documentation.
pub struct View {
    pub snap: Arc<Snapshot>,
    bytes: Box<dyn FileBytes>,
    /// Node-local directory for the bytes (else memory).
    store: Option<OwnedFd>,
    /// Each file's bytes once fetched.
    held: Vec<OnceLock<Result<Held, ()>>>,
    pub stats: Stats,
    /// The paths fetched, in order (`--trace`).
    trace: Mutex<Vec<u32>>,
    /// The view's path and node, for log lines.
    what: String,
    /// The job's start: files changed since are not served (see the module's documentation).
    epoch: Option<Epoch>,
}

impl View {
    /// A view of `snap` whose bytes come from `bytes` and are kept in the directory `store`
    /// (opened; node-local) or in memory; `what` names the tree and node in log lines.
    pub fn new(
        snap: Snapshot,
        bytes: Box<dyn FileBytes>,
        store: Option<OwnedFd>,
        what: &str,
    ) -> View {
        let n = snap.nodes.len();
        View {
            snap: Arc::new(snap),
            bytes,
            store,
            held: (0..n).map(|_| OnceLock::new()).collect(),
            stats: Stats::default(),
            trace: Mutex::new(Vec::new()),
            what: what.to_string(),
            epoch: None,
        }
    }

    /// Serve no file whose mtime is at or after `epoch` (the job's start, the same on every node).
    pub fn with_epoch(mut self, epoch: Option<Epoch>) -> View {
        self.epoch = epoch;
        self
    }

    /// The node at FUSE inode `ino`.
    pub fn node(&self, ino: u64) -> Option<&Node> {
        ino.checked_sub(1)
            .and_then(|i| self.snap.nodes.get(i as usize))
    }

    /// The bytes of file `idx`, fetched at the first call (one fetch however many ask at once).
    fn held(&self, idx: u32) -> Result<&Held, Errno> {
        let node = &self.snap.nodes[idx as usize];
        if node.kind != Kind::File {
            return Err(Errno::EISDIR);
        }
        let r = self.held[idx as usize].get_or_init(|| {
            let fail = |why: String| self.failed(node, "", why);
            if let Some(e) = self.epoch.as_ref().filter(|e| node.mtime >= e.at) {
                fail(format!(
                    "changed on storage at or after the job's start (mtime {}.{:09}, {} {}.{:09}): \
                     not served on any node, so that every node sees one version; a file written \
                     in the second the job step started counts as changed: run the job again",
                    node.mtime.0, node.mtime.1, e.source, e.at.0, e.at.1
                ));
                return Err(());
            }
            if node.size > PIECE {
                self.note_fetched(idx);
                let disk = match &self.store {
                    None => None,
                    Some(dir) => match keep_on_disk(dir.as_fd(), &[]) {
                        Ok(f) => Some(f),
                        Err(e) => {
                            fail(format!("keeping it in the node-local directory: {e}"));
                            return Err(());
                        }
                    },
                };
                let n = node.size.div_ceil(PIECE) as usize;
                let cells = (0..n).map(|_| OnceLock::new()).collect();
                return Ok(Held::Pieces(Pieces { cells, disk }));
            }
            let v = match self.bytes.fetch(node) {
                Ok(v) => v,
                Err(why) => {
                    fail(why);
                    return Err(());
                }
            };
            self.note_fetched(idx);
            self.stats
                .fetched_bytes
                .fetch_add(v.len() as u64, Ordering::Relaxed);
            let held = match &self.store {
                None => Held::Memory(v),
                Some(dir) => match keep_on_disk(dir.as_fd(), &v) {
                    Ok(f) => Held::Disk(f),
                    Err(e) => {
                        fail(format!("keeping it in the node-local directory: {e}"));
                        return Err(());
                    }
                },
            };
            Ok(held)
        });
        r.as_ref().map_err(|()| Errno::EIO)
    }

    /// File `node` (its bytes `part`, or "" for all of them) not served: counted, and said why.
    fn failed(&self, node: &Node, part: &str, why: String) {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            "{}: {}:{part} {why} (from {})",
            self.what,
            node.path.display(),
            self.bytes.describe()
        );
    }

    /// File `idx` opened for the first time: counted and traced.
    fn note_fetched(&self, idx: u32) {
        self.stats.fetched.fetch_add(1, Ordering::Relaxed);
        self.trace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(idx);
    }

    /// Piece `k` of the large file `idx`, fetched at the first call (one fetch however many ask
    /// at once); `Some` when it is kept in memory, `None` when it was written into `p.disk`.
    fn piece<'a>(&self, idx: u32, p: &'a Pieces, k: usize) -> Result<Option<&'a [u8]>, Errno> {
        let node = &self.snap.nodes[idx as usize];
        let cell = p.cells.get(k).ok_or(Errno::EIO)?;
        let r = cell.get_or_init(|| {
            let off = k as u64 * PIECE;
            let len = (node.size - off).min(PIECE) as u32;
            let fail = |why: String| {
                self.failed(
                    node,
                    &format!(" bytes {off}..{}:", off + u64::from(len)),
                    why,
                )
            };
            let v = match self.bytes.fetch_piece(node, off, len) {
                Ok(v) if v.len() == len as usize => v,
                Ok(v) => {
                    fail(format!("{} bytes came, {len} expected", v.len()));
                    return Err(());
                }
                Err(why) => {
                    fail(why);
                    return Err(());
                }
            };
            self.stats
                .fetched_bytes
                .fetch_add(v.len() as u64, Ordering::Relaxed);
            match &p.disk {
                None => Ok(Some(v)),
                Some(f) => match f.write_all_at(&v, off) {
                    Ok(()) => Ok(None),
                    Err(e) => {
                        fail(format!("keeping it in the node-local directory: {e}"));
                        Err(())
                    }
                },
            }
        });
        match r {
            Ok(Some(v)) => Ok(Some(v.as_slice())),
            Ok(None) => Ok(None),
            Err(()) => Err(Errno::EIO),
        }
    }

    /// Up to `size` bytes at `offset` of the large file `idx`, from its pieces (the pieces a read
    /// needs and no one fetched yet are fetched side by side, [`Self::fetch_missing`]).
    fn read_pieces(&self, idx: u32, p: &Pieces, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let fsize = self.snap.nodes[idx as usize].size;
        let end = offset.saturating_add(u64::from(size)).min(fsize);
        if end > offset {
            self.fetch_missing(
                idx,
                p,
                (offset / PIECE) as usize..=((end - 1) / PIECE) as usize,
            );
        }
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        let mut at = offset;
        while at < end {
            let k = (at / PIECE) as usize;
            let (ps, pe) = (k as u64 * PIECE, ((k as u64 + 1) * PIECE).min(end));
            match self.piece(idx, p, k)? {
                Some(v) => out.extend_from_slice(&v[(at - ps) as usize..(pe - ps) as usize]),
                None => {
                    let f = p.disk.as_ref().ok_or(Errno::EIO)?;
                    let from = out.len();
                    out.resize(from + (pe - at) as usize, 0);
                    f.read_exact_at(&mut out[from..], at).map_err(|e| {
                        tracing::error!("{}: the node-local copy: {e}", self.what);
                        Errno::EIO
                    })?;
                }
            }
            at = pe;
        }
        Ok(out)
    }

    /// The pieces `ks` of the large file `idx` that are not fetched yet, fetched side by side
    /// (at most [`PIECES_AT_ONCE`] at a time): a read-ahead of the kernel's (up to 1 MiB) waits for
    /// the slowest of its pieces, not for their sum. A piece that fails is kept failed, as one
    /// fetched by the read itself would be; the read then meets it and fails (`EIO`).
    fn fetch_missing(&self, idx: u32, p: &Pieces, ks: std::ops::RangeInclusive<usize>) {
        let missing: Vec<usize> = ks
            .filter(|&k| p.cells.get(k).is_some_and(|c| c.get().is_none()))
            .collect();
        if missing.len() < 2 {
            return;
        }
        for batch in missing.chunks(PIECES_AT_ONCE) {
            std::thread::scope(|s| {
                for &k in batch {
                    s.spawn(move || {
                        let _ = self.piece(idx, p, k);
                    });
                }
            });
        }
    }

    /// Open file `ino`: a file of at most [`PIECE`] bytes is fetched now, so that it is read
    /// from storage whole and once, at its first open; a larger one piece by piece as it is read.
    pub fn open(&self, ino: u64) -> Result<(), Errno> {
        let n = self.node(ino).ok_or(Errno::ENOENT)?;
        match n.kind {
            Kind::Dir => Err(Errno::EISDIR),
            Kind::File => self.held((ino - 1) as u32).map(|_| ()),
            _ => Err(Errno::EACCES),
        }
    }

    /// Up to `size` bytes of file `ino` at `offset`.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        self.node(ino).ok_or(Errno::ENOENT)?;
        let h = self.held((ino - 1) as u32)?;
        match h {
            Held::Pieces(p) => self.read_pieces((ino - 1) as u32, p, offset, size),
            Held::Memory(v) => {
                let s = (offset as usize).min(v.len());
                let e = (s + size as usize).min(v.len());
                Ok(v[s..e].to_vec())
            }
            Held::Disk(f) => {
                let mut buf = vec![0u8; size as usize];
                let mut n = 0;
                while n < buf.len() {
                    match f.read_at(&mut buf[n..], offset + n as u64) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            tracing::error!("{}: the node-local copy: {e}", self.what);
                            return Err(Errno::EIO);
                        }
                    }
                }
                buf.truncate(n);
                Ok(buf)
            }
        }
    }

    /// The paths of the files fetched so far, in the order they were first opened.
    pub fn trace(&self) -> Vec<PathBuf> {
        self.trace
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|&i| self.snap.nodes[i as usize].path.clone())
            .collect()
    }

    fn attr(&self, idx: u32) -> FileAttr {
        let n = &self.snap.nodes[idx as usize];
        let t = if n.mtime.0 >= 0 {
            UNIX_EPOCH + Duration::new(n.mtime.0 as u64, n.mtime.1)
        } else {
            UNIX_EPOCH
        };
        let size = match n.kind {
            Kind::Symlink => n.target.len() as u64,
            _ => n.size,
        };
        FileAttr {
            ino: INodeNo(idx as u64 + 1),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: match n.kind {
                Kind::Dir => FileType::Directory,
                Kind::File => FileType::RegularFile,
                Kind::Symlink => FileType::Symlink,
                // never opened: shown as an empty fifo
                Kind::Other => FileType::NamedPipe,
            },
            perm: n.perm,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }
}

/// `bytes` in a new unnamed file of `dir`.
fn keep_on_disk(dir: BorrowedFd<'_>, bytes: &[u8]) -> std::io::Result<File> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let mut f = File::from(fd);
    f.write_all(bytes)?;
    Ok(f)
}

/// The FUSE file system of a [`View`]. A close costs no request (`flush` answers `ENOSYS`); an
/// open asks, since the first open of a file fetches it and refuses a changed one.
pub struct ViewFs(pub Arc<View>);

impl Filesystem for ViewFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        for f in [
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
        ] {
            let _ = config.add_capabilities(f);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let v = &self.0;
        let Some(dir) = parent.0.checked_sub(1) else {
            return reply.error(Errno::ENOENT);
        };
        match v.snap.lookup(dir as u32, name.as_bytes()) {
            Ok(Some(i)) => reply.entry(&TTL, &v.attr(i), Generation(0)),
            Ok(None) => {
                // a negative entry the kernel keeps for TTL: node id 0
                let mut a = v.attr(dir as u32);
                a.ino = INodeNo(0);
                reply.entry(&TTL, &a, Generation(0))
            }
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.node(ino.0) {
            Some(_) => reply.attr(&TTL, &self.0.attr((ino.0 - 1) as u32)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.0.node(ino.0) {
            Some(n) if n.kind == Kind::Symlink && n.unreadable => reply.error(Errno::EPERM),
            Some(n) if n.kind == Kind::Symlink => reply.data(&n.target),
            Some(_) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.0.open(ino.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.0.read(ino.0, offset, size) {
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(e),
        }
    }

    // nothing to flush: ENOSYS tells the kernel not to send it again on close
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.0.node(ino.0) {
            Some(n) if n.kind == Kind::Dir && n.unreadable => reply.error(Errno::EACCES),
            Some(n) if n.kind == Kind::Dir => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Some(_) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let v = &self.0;
        let Some(d) = v.node(ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if d.kind != Kind::Dir {
            return reply.error(Errno::ENOTDIR);
        }
        let mut i = offset;
        loop {
            let (node, kind, name): (u64, FileType, &[u8]) = match i {
                0 => (ino.0, FileType::Directory, b"."),
                1 => (u64::from(d.parent) + 1, FileType::Directory, b".."),
                n => match d.children.get((n - 2) as usize) {
                    Some((name, c)) => (u64::from(*c) + 1, v.attr(*c).kind, name),
                    None => break,
                },
            };
            if reply.add(INodeNo(node), i + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    // no extended attributes are served: ENOSYS tells the kernel not to ask again
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    // a file is no terminal (Python asks, `isatty`, for every file it opens)
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (_, bytes) = self.0.snap.files();
        reply.statfs(
            bytes.div_ceil(4096),
            0,
            0,
            self.0.snap.nodes.len() as u64,
            0,
            4096,
            255,
            4096,
        );
    }
}

#[cfg(test)]
mod tests;
