//! The pool's tree over FUSE in one hop: a squashfs image read by [`swpool_squashfs`] through a
//! positional read: the pool file itself for a cached copy (verified when it landed), or the
//! verifying chunk engine ([`ChunkReader`]) for `mount --in-place` and `load --lazy`, so that the
//! reader parses only bytes hashed against the authorized manifest.
//!
//! Built for the kernel: the file system never changes while it is served, so entries, attributes
//! and negative lookups are kept for a day, file pages across opens (`FOPEN_KEEP_CACHE`) and
//! directory listings in the page cache (`FOPEN_CACHE_DIR`); the first open and the first opendir
//! answer `ENOSYS` (when the kernel offered `FUSE_NO_OPEN_SUPPORT` / `FUSE_NO_OPENDIR_SUPPORT` at
//! init), which tells the kernel to open every file and directory without asking, with those two
//! flags, and to send no release on close; `flush` answers `ENOSYS` too, so a close costs no
//! request; listings come with their entries' attributes (`READDIRPLUS`), so a walk that stats
//! what it lists needs no lookup per entry; requests are answered by the session's worker
//! threads; decompressed blocks are kept in the reader's bounded cache and the next blocks of a
//! file being read are decompressed ahead by a small pool of threads.
//!
//! After the server died: what the kernel already holds of the verified pool (entries,
//! attributes, file pages, listings) may still be read; every other read, lookup and listing
//! fails at once (`ENOTCONN`), never hangs, and `statfs` (which always asks) says the mount is
//! stale. An open does not ask the server, so a file whose pages are all cached opens and reads
//! its verified bytes. Measured (`bench/tree-ab.sh`, `bench/results/noopen-20261129-0203.md`):
//! a warm batched md5 of 5,695 files costs the server 1 request instead of 12,155 (an open and a
//! release per file, an opendir and a releasedir per directory) and takes 0.60× the time, 0.51×
//! in place.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEntry, ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyXattr,
    Request,
};
use swpool_squashfs::{Archive, DirEntry, Inode, InodeKind, ReadAt};

use crate::chunks::Chunks;

/// A pool never changes while it is served.
const TTL: Duration = Duration::from_secs(24 * 3600);
/// Inodes and listings kept parsed (each at most a block list); past this the maps start over.
const MAX_KEPT: usize = 200_000;
/// Blocks decompressed ahead of a sequential reader.
const AHEAD: u64 = 4;

/// The verifying chunk engine as the reader's source: a chunk that does not verify is an error
/// (the engine logs the pool, chunk, offset and node once) and none of its bytes reach the reader.
pub struct ChunkReader(pub Arc<Chunks>);

impl ReadAt for ChunkReader {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let mut pos = 0usize;
        // the engine reads at most u32::MAX bytes at once; the reader asks for blocks
        while pos < buf.len() {
            let n = (buf.len() - pos).min(1 << 30);
            let mut v = Vec::with_capacity(n);
            self.0
                .read_into(offset + pos as u64, n as u32, &mut v)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            if v.len() != n {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "{} bytes at {} past the image's end",
                        n,
                        offset + pos as u64
                    ),
                ));
            }
            buf[pos..pos + n].copy_from_slice(&v);
            pos += n;
        }
        Ok(())
    }
}

struct Shared<R: ReadAt> {
    ar: Archive<R>,
    inodes: RwLock<HashMap<u64, Arc<Inode>>>,
    listings: RwLock<HashMap<u64, Arc<Vec<DirEntry>>>>,
    /// the pool, for log lines
    what: String,
}

/// A block of a file to decompress ahead of its reader.
type AheadJob = (Arc<Inode>, u64);

/// See the module's documentation.
pub struct TreeFs<R: ReadAt + 'static> {
    s: Arc<Shared<R>>,
    ahead: Mutex<Option<SyncSender<AheadJob>>>,
    readahead_threads: usize,
    /// The last block read of each file being read (to tell a sequential reader from a random one).
    last: Mutex<HashMap<u64, u64>>,
    /// The kernel opens files without asking once an open answers `ENOSYS` (it said so at init).
    no_open: bool,
    /// The same for directories.
    no_opendir: bool,
}

/// FUSE node ids: the root is 1, any other inode is its reference + 2 (references start at 0).
fn node_of(reference: u64, root: u64) -> INodeNo {
    if reference == root {
        INodeNo::ROOT
    } else {
        INodeNo(reference + 2)
    }
}

fn kind_of(t: swpool_squashfs::FileType) -> FileType {
    use swpool_squashfs::FileType as T;
    match t {
        T::Directory => FileType::Directory,
        T::File => FileType::RegularFile,
        T::Symlink => FileType::Symlink,
        T::BlockDevice => FileType::BlockDevice,
        T::CharDevice => FileType::CharDevice,
        T::Fifo => FileType::NamedPipe,
        T::Socket => FileType::Socket,
    }
}

impl<R: ReadAt + 'static> TreeFs<R> {
    /// Serve `ar`; `what` names the pool in log lines; `readahead_threads` decompress ahead.
    pub fn new(ar: Archive<R>, what: &str, readahead_threads: usize) -> TreeFs<R> {
        TreeFs {
            s: Arc::new(Shared {
                ar,
                inodes: RwLock::new(HashMap::new()),
                listings: RwLock::new(HashMap::new()),
                what: what.to_string(),
            }),
            ahead: Mutex::new(None),
            readahead_threads,
            last: Mutex::new(HashMap::new()),
            no_open: false,
            no_opendir: false,
        }
    }

    fn root_ref(&self) -> u64 {
        self.s.ar.superblock().root_inode
    }

    fn reference(&self, ino: INodeNo) -> Option<u64> {
        match ino.0 {
            1 => Some(self.root_ref()),
            0 => None,
            n => Some(n - 2),
        }
    }

    fn inode(&self, ino: INodeNo) -> Result<Arc<Inode>, Errno> {
        let r = self.reference(ino).ok_or(Errno::ENOENT)?;
        self.s.inode(r)
    }

    fn attr(&self, i: &Inode) -> FileAttr {
        let t = UNIX_EPOCH + Duration::from_secs(u64::from(i.mtime));
        let size = i.size();
        FileAttr {
            ino: node_of(i.reference, self.root_ref()),
            size,
            blocks: size.div_ceil(512),
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: kind_of(i.file_type()),
            perm: i.perm & 0o7777,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev(),
            flags: 0,
            blksize: self.s.ar.superblock().block_size,
        }
    }

    fn start_readahead(&self) {
        if self.readahead_threads == 0 {
            return;
        }
        let (tx, rx) = sync_channel::<AheadJob>(64);
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..self.readahead_threads {
            let rx = rx.clone();
            let s = self.s.clone();
            std::thread::spawn(move || loop {
                let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                let Ok((ino, idx)) = job else { return };
                if !s.ar.block_cached(&ino, idx) {
                    // an error here is the reader's to report when the block is really read
                    let _ = s.ar.file_block(&ino, idx);
                }
            });
        }
        *self.ahead.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
    }

    /// Whether a read of blocks `first..=end` of file `number` follows that file's previous read
    /// closely (a sequential reader, its requests maybe a little out of order; a read of block 0):
    /// only then are the next blocks decompressed ahead. A random reader's next blocks are mostly
    /// never read, and in place or on demand each can cost a chunk fetched from storage
    /// (measured with `bench/in-place.sh`, `bench/lazy.sh`).
    fn sequential(&self, number: u32, first: u64, end: u64) -> bool {
        let mut m = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() >= 4096 {
            m.clear();
        }
        match m.insert(u64::from(number), end) {
            Some(prev) => first.abs_diff(prev) <= AHEAD + 1,
            None => first == 0,
        }
    }

    fn read_ahead(&self, ino: &Arc<Inode>, next: u64) {
        let InodeKind::File(f) = &ino.kind else {
            return;
        };
        let nblocks = f.blocks.len() as u64;
        let g = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = g.as_ref() else { return };
        for idx in next..(next + AHEAD).min(nblocks) {
            if self.s.ar.block_cached(ino, idx) {
                continue;
            }
            // a full queue means the threads are busy: skip rather than wait
            if tx.try_send((ino.clone(), idx)).is_err() {
                return;
            }
        }
    }
}

impl<R: ReadAt> Shared<R> {
    fn fail(&self, what: &str, e: swpool_squashfs::Error) -> Errno {
        tracing::error!("{}: {what}: {e}", self.what);
        Errno::EIO
    }

    fn inode(&self, r: u64) -> Result<Arc<Inode>, Errno> {
        if let Some(i) = self
            .inodes
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&r)
        {
            return Ok(i.clone());
        }
        let i = Arc::new(
            self.ar
                .inode(r)
                .map_err(|e| self.fail(&format!("inode {r:#x}"), e))?,
        );
        let mut m = self.inodes.write().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_KEPT {
            m.clear();
        }
        m.insert(r, i.clone());
        Ok(i)
    }

    fn listing(&self, dir: &Inode) -> Result<Arc<Vec<DirEntry>>, Errno> {
        let r = dir.reference;
        if let Some(l) = self
            .listings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&r)
        {
            return Ok(l.clone());
        }
        let l = Arc::new(
            self.ar
                .read_dir(dir)
                .map_err(|e| self.fail(&format!("directory inode {}", dir.number), e))?,
        );
        let mut m = self.listings.write().unwrap_or_else(|p| p.into_inner());
        if m.len() >= MAX_KEPT / 10 {
            m.clear();
        }
        m.insert(r, l.clone());
        Ok(l)
    }
}

impl<R: ReadAt + 'static> Filesystem for TreeFs<R> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // the largest read-ahead the kernel allows (its max_pages_limit bounds requests)
        if let Err(max) = config.set_max_readahead(u32::MAX) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        for f in [
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            // every listing with its entries' attributes: a walk that stats what it lists (find,
            // ls -l, Python's imports) then needs no lookup per entry (READDIRPLUS_AUTO would
            // send them only for the first batch of a listing read whole before its stats)
            InitFlags::FUSE_DO_READDIRPLUS,
        ] {
            let _ = config.add_capabilities(f);
        }
        // offered by the kernel (FUSE protocol 7.23 and 7.29 on), nothing to request: see `open`
        let offered = config.capabilities();
        self.no_open = offered.contains(InitFlags::FUSE_NO_OPEN_SUPPORT);
        self.no_opendir = offered.contains(InitFlags::FUSE_NO_OPENDIR_SUPPORT);
        self.start_readahead();
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let dir = match self.inode(parent) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        if !matches!(dir.kind, InodeKind::Directory { .. }) {
            return reply.error(Errno::ENOTDIR);
        }
        let l = match self.s.listing(&dir) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let name = name.as_bytes();
        // listings are sorted by name (mksquashfs sorts them bytewise); fall back to a scan
        let found = match l.binary_search_by(|e| e.name.as_slice().cmp(name)) {
            Ok(i) => Some(&l[i]),
            Err(_) => l.iter().find(|e| e.name == name),
        };
        match found {
            Some(e) => match self.s.inode(e.inode) {
                Ok(i) => reply.entry(&TTL, &self.attr(&i), Generation(0)),
                Err(e) => reply.error(e),
            },
            None => {
                // a negative entry the kernel keeps for TTL: node id 0
                let mut a = self.attr(&dir);
                a.ino = INodeNo(0);
                reply.entry(&TTL, &a, Generation(0))
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.inode(ino) {
            Ok(i) => reply.attr(&TTL, &self.attr(&i)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.inode(ino) {
            Ok(i) => match &i.kind {
                InodeKind::Symlink { target } => reply.data(target),
                _ => reply.error(Errno::EINVAL),
            },
            Err(e) => reply.error(e),
        }
    }

    // The first open answers ENOSYS: the kernel then opens every file itself, with
    // FOPEN_KEEP_CACHE and file handle 0 (what this server would answer), and sends no release.
    // A write open never gets here (the mount is read-only: the kernel's EROFS), nor a directory
    // (its open is an opendir). An older kernel asks every time.
    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        match self.inode(ino) {
            Ok(i) if matches!(i.kind, InodeKind::Directory { .. }) => reply.error(Errno::EISDIR),
            Ok(_) if self.no_open => reply.error(Errno::ENOSYS),
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
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
        let i = match self.inode(ino) {
            Ok(i) => i,
            Err(e) => return reply.error(e),
        };
        let InodeKind::File(f) = &i.kind else {
            return reply.error(Errno::EISDIR);
        };
        let want = (size as u64).min(f.size.saturating_sub(offset)) as usize;
        let bs = u64::from(self.s.ar.superblock().block_size);
        let (idx, inb) = (offset / bs, (offset % bs) as usize);
        if want > 0 && inb + want <= bs as usize {
            // within one block (the kernel's page-aligned requests mostly are): answer from the
            // cached block itself, no buffer of our own
            return match self.s.ar.file_block(&i, idx) {
                Ok(b) if inb + want <= b.len() => {
                    if self.sequential(i.number, idx, idx) {
                        self.read_ahead(&i, idx + 1);
                    }
                    reply.data(&b[inb..inb + want])
                }
                Ok(_) => reply.error(Errno::EIO),
                Err(e) => reply.error(
                    self.s
                        .fail(&format!("reading inode {} at {offset}", i.number), e),
                ),
            };
        }
        let mut buf = vec![0u8; want];
        match self.s.ar.read(&i, offset, &mut buf) {
            Ok(n) => {
                let next = (offset + n as u64).div_ceil(bs);
                if self.sequential(i.number, idx, next.saturating_sub(1)) {
                    self.read_ahead(&i, next);
                }
                reply.data(&buf[..n])
            }
            Err(e) => reply.error(
                self.s
                    .fail(&format!("reading inode {} at {offset}", i.number), e),
            ),
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

    // as `open`: the kernel then opens every directory itself, with FOPEN_KEEP_CACHE and
    // FOPEN_CACHE_DIR, and sends no releasedir
    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.inode(ino) {
            Ok(i) if matches!(i.kind, InodeKind::Directory { .. }) && self.no_opendir => {
                reply.error(Errno::ENOSYS)
            }
            Ok(i) if matches!(i.kind, InodeKind::Directory { .. }) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(e),
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
        let dir = match self.inode(ino) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let l = match self.s.listing(&dir) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let root = self.root_ref();
        let me = node_of(dir.reference, root);
        let mut i = offset;
        loop {
            let (node, kind, name): (INodeNo, FileType, &[u8]) = match i {
                0 => (me, FileType::Directory, b"."),
                // the parent's node id is not known from an inode number without the export
                // table; the kernel answers `..` itself
                1 => (me, FileType::Directory, b".."),
                n => match l.get((n - 2) as usize) {
                    Some(e) => (node_of(e.inode, root), kind_of(e.kind), &e.name),
                    None => break,
                },
            };
            if reply.add(node, i + 1, kind, OsStr::from_bytes(name)) {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let dir = match self.inode(ino) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let l = match self.s.listing(&dir) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
        };
        let me = self.attr(&dir);
        let mut i = offset;
        loop {
            let (child, name): (Option<Arc<Inode>>, &[u8]) = match i {
                // the kernel links neither `.` nor `..` from a READDIRPLUS reply
                0 => (None, b"."),
                1 => (None, b".."),
                n => match l.get((n - 2) as usize) {
                    Some(e) => match self.s.inode(e.inode) {
                        Ok(c) => (Some(c), &e.name),
                        Err(e) => return reply.error(e),
                    },
                    None => break,
                },
            };
            let a = child.as_ref().map_or(me, |c| self.attr(c));
            if reply.add(
                a.ino,
                i + 1,
                OsStr::from_bytes(name),
                &TTL,
                &a,
                Generation(0),
            ) {
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

    // No ioctls: ENOTTY, what the caller gets from a file without any (fuser's default logs a
    // warning first, one for each file Python opens: its isatty check). The kernel asks again
    // for every ioctl whatever the answer.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let sb = self.s.ar.superblock();
        let bs = u64::from(sb.block_size);
        reply.statfs(
            sb.bytes_used.div_ceil(bs),
            0,
            0,
            u64::from(sb.inode_count),
            0,
            sb.block_size,
            256,
            sb.block_size,
        );
    }
}
