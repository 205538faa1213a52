//! Where a chunk the node does not hold comes from.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// A source of a pool image's bytes. Implementations need not be trusted: every chunk read from
/// one is hashed against the manifest before it is served ([`crate::Chunks`]).
pub trait ChunkSource: Send + Sync {
    /// Fill `buf` with the image's bytes at `offset` (one whole chunk); fewer bytes is an error.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Where the bytes come from, for messages (`/scratch/pools/gcc-12.pool`).
    fn describe(&self) -> String;
    /// Whether every chunk it gives was already hashed against the same manifest by a server of
    /// this user (the node's own on-demand server, whose digest was checked when connecting): then
    /// [`crate::Chunks`] does not hash it a second time. False for anything else.
    fn verified(&self) -> bool {
        false
    }
}

/// The pool file itself (on shared storage), read through the descriptor the manifest was read
/// from: a file replaced at its path after the mount does not change what is read (and a file
/// changed in place is caught by the chunk hashes).
pub struct FileSource {
    file: File,
    path: PathBuf,
}

impl FileSource {
    pub fn new(file: File, path: &Path) -> FileSource {
        // chunks are read whole, in the order readers touch them, and (on demand) only those this
        // node owns: read-ahead would pull the next chunk too, which another node may own
        // (measured on the testbed's sshfs: 1.13x the pool's bytes from storage without this)
        let _ = rustix::fs::fadvise(&file, 0, 0, rustix::fs::Advice::Random);
        FileSource {
            file,
            path: path.to_path_buf(),
        }
    }
}

impl ChunkSource for FileSource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file is shorter than its manifest says (truncated since it was checked?)",
                )
            } else {
                e
            }
        })
    }
    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}
