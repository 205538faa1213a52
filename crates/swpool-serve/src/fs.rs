//! The FUSE file system: a directory holding one read-only file, `image`, whose bytes are the
//! pool's image served by [`Chunks`]. Attributes and entries never change (a pool is immutable), so
//! the kernel may keep them, and the file's page cache, for as long as it likes.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, ReplyOpen, Request,
};

use crate::chunks::Chunks;

/// The name of the one file.
pub const IMAGE: &str = "image";
const IMAGE_INO: INodeNo = INodeNo(2);
/// A pool never changes while it is served.
const TTL: Duration = Duration::from_secs(24 * 3600);

/// See the module's documentation.
pub struct ImageFs {
    chunks: Arc<Chunks>,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    direct: bool,
}

impl ImageFs {
    /// Files owned by `uid`:`gid` (the server's user), dated `mtime` (the pool's build time).
    pub fn new(chunks: Arc<Chunks>, uid: u32, gid: u32, mtime: SystemTime) -> ImageFs {
        ImageFs {
            chunks,
            uid,
            gid,
            mtime,
            direct: false,
        }
    }

    /// Reads of the image bypass the kernel's page cache (`FOPEN_DIRECT_IO`): for a server whose
    /// chunks another cache on the node already holds (the on-demand server's store), a second
    /// copy of the image in the page cache only costs memory and copies. The file system's helper
    /// (squashfuse_ll, fuse2fs) keeps its own cache of what it decoded, and its mount has the page
    /// cache of the files. Measured on the testbed with `bench/lazy.sh` (see docs/architecture.md).
    pub fn direct_io(mut self, direct: bool) -> ImageFs {
        self.direct = direct;
        self
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o500, 0, 2),
            IMAGE_INO => (FileType::RegularFile, 0o400, self.chunks.image_size(), 1),
            _ => return None,
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            crtime: self.mtime,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }
}

impl Filesystem for ImageFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, name.to_str()) {
            (INodeNo::ROOT, Some(IMAGE)) => {
                let a = self.attr(IMAGE_INO).expect("the image");
                reply.entry(&TTL, &a, Generation(0));
            }
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != IMAGE_INO {
            return reply.error(Errno::EISDIR);
        }
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        if self.direct {
            return reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
        // the page cache stays valid across opens: the bytes never change
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
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
        if ino != IMAGE_INO {
            return reply.error(Errno::EISDIR);
        }
        match self.chunks.read(offset, size) {
            Ok(v) => reply.data(&v),
            // the engine logged why (once per bad chunk)
            Err(_) => reply.error(Errno::EIO),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: fuser::ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (IMAGE_INO, FileType::RegularFile, IMAGE),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }
}
