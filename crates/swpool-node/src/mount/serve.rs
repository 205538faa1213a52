//! The verifying chunk server in front of a pool's FUSE helper (`mount --in-place`, and `load`
//! where a node has no room for a copy): `sw-pool-serve` serves the pool's image from where it
//! lies, hashing each chunk against the authorized manifest before any byte of it is served, and
//! runs the helper (squashfuse_ll, fuse2fs) on the served file as its child. The server is the
//! mount's recorded process: it ends when the helper ends (the pool is unmounted); when it dies,
//! reads of the pool fail with `EIO` at once and the record reads as stale. A squashfs pool read
//! by sw-pool's tree server ([`super::Backend::SwPoolTree`]) needs no helper: the server reads
//! the tree from its verified chunks and serves it at the mount point itself, in one hop (a dead
//! server: `ENOTCONN` at once, stale); its directory here is then not used.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{proc, unmount, Sys};
use crate::exec::{Tool, ToolCommand};

/// What a caller asks for: serve this pool (its authorized digest) in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InPlace {
    pub digest: String,
    /// Keep fetched chunks here (sparse file and record); none: memory only.
    pub keep: Option<PathBuf>,
    /// Chunks from the node's on-demand server at this socket (`load --lazy`), not the file.
    pub source: Option<PathBuf>,
}

/// How to serve an image through the chunk server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Serve {
    /// An empty directory of the caller's where the server shows the image (`DIR/image`).
    pub dir: PathBuf,
    /// The manifest digest the trust policy accepted: the server refuses a pool whose manifest
    /// is another one by the time it opens it.
    pub digest: String,
    /// Keep fetched chunks in this sparse file (and its `.chunks` record); none: memory only.
    pub keep: Option<PathBuf>,
    /// The node's on-demand server's socket (`--source unix:PATH`); none: the pool file.
    pub source: Option<PathBuf>,
}

impl Serve {
    /// The served file, the FUSE helper's image.
    pub fn image(&self) -> PathBuf {
        self.dir.join("image")
    }

    /// `sw-pool-serve ... -- HELPER ARGS...`: the server beside this program (else on the search
    /// path), running `inner`.
    pub fn wrap(&self, pool: &Path, inner: ToolCommand) -> ToolCommand {
        let mut c = ToolCommand::new(Tool::ChunkServer);
        if let Some(p) = beside_us() {
            c = c.program(p);
        }
        c = c
            .arg("--pool")
            .path(pool)
            .arg("--digest")
            .arg(&self.digest)
            .arg("--dir")
            .path(&self.dir);
        if let Some(k) = &self.keep {
            c = c.arg("--keep").path(k);
        }
        if let Some(s) = &self.source {
            c = c.arg("--source").arg(format!("unix:{}", s.display()));
        }
        c.arg("--").then_run(inner)
    }
}

/// `sw-pool-serve` installed beside the running program.
pub fn beside_us() -> Option<PathBuf> {
    let p = std::env::current_exe()
        .ok()?
        .with_file_name(Tool::ChunkServer.program());
    p.is_file().then_some(p)
}

/// Make `dir` ready to serve in: created (0700) if missing; a mount left there by a server that
/// died is detached first. It must be an empty directory afterwards.
pub fn prepare_dir(sys: &dyn Sys, dir: &Path) -> std::io::Result<()> {
    detach_leftover(sys, dir);
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && !m.file_type().is_symlink() => Ok(()),
        Ok(_) => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a directory", dir.display()),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(dir)
        }
        Err(e) => Err(e),
    }
}

/// After the pool's mount is gone: wait (≤ 2 s) for the server `pid` to end, which unmounts its
/// directory; detach what is still mounted there (a server that was killed) and remove it.
pub fn release_dir(sys: &dyn Sys, dir: &Path, pid: u32) {
    wait_ended(sys, pid);
    detach_leftover(sys, dir);
    let _ = std::fs::remove_dir(dir);
}

/// After the pool's mount is gone: wait (≤ 2 s) for the server `pid` to end (a one-hop server
/// notices its unmount within a fraction of a second), so that nothing of the mount is left when
/// `umount` returns.
pub fn wait_ended(sys: &dyn Sys, pid: u32) {
    let mut waited = Duration::ZERO;
    while pid > 1 && sys.running(pid) && waited < Duration::from_secs(2) {
        sys.sleep(Duration::from_millis(20));
        waited += Duration::from_millis(20);
    }
}

fn detach_leftover(sys: &dyn Sys, dir: &Path) {
    let mounted = sys
        .mounts()
        .map(|m| proc::mount_at(&m, dir).is_some())
        .unwrap_or(false);
    if mounted {
        if let Err(e) = unmount(sys, dir, true) {
            tracing::warn!(dir = %dir.display(), "cannot detach the chunk server's mount: {e}");
        }
    }
}
