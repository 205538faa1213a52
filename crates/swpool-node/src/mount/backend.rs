//! The FUSE server of each image ([`Backend`]) and how the config's [`FuseReader`] picks it.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{serve, ImageInfo, MountOptions};
use crate::config::FuseReader;
use crate::exec::{Tool, ToolCommand};
use crate::image::ImageFormat;

/// The FUSE helper for a format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    SquashfuseLl,
    Fuse2fs,
    /// sw-pool's own one-hop FUSE server of a squashfs pool's tree (`sw-pool-serve --tree`):
    /// reading the node-local pool file (`--cached`), or, served in place or on demand, the
    /// verifying chunk engine (its reader parses only chunks hashed against the manifest).
    SwPoolTree,
}

/// The exit status of `sw-pool-serve --tree` for an image its reader does not read (another
/// compressor, not squashfs): mount it with squashfuse_ll instead.
pub(super) const TREE_UNSUPPORTED: &str = "exit status: 3";

impl Backend {
    pub fn for_format(f: ImageFormat) -> Backend {
        if f.is_ext() {
            Backend::Fuse2fs
        } else {
            Backend::SquashfuseLl
        }
    }
    pub fn tool(self) -> Tool {
        match self {
            Backend::SquashfuseLl => Tool::SquashfuseLl,
            Backend::Fuse2fs => Tool::Fuse2fs,
            Backend::SwPoolTree => Tool::ChunkServer,
        }
    }

    /// `sw-pool-serve --tree` serving the pool file `image` at `mountpoint` in the foreground, the
    /// server beside this program (else on the search path). Without `serve`: `--cached`, the
    /// node-local file itself (manifest `digest`, as inspected). With `serve` (in place, on
    /// demand): through the verifying chunk engine, against the authorized digest, with the
    /// chunk store and source `serve` names. It ends when the mount point is unmounted, or
    /// unmounts it on SIGTERM.
    pub fn tree_command(
        image: &Path,
        digest: &str,
        serve: Option<&serve::Serve>,
        mountpoint: &Path,
    ) -> ToolCommand {
        let mut c = ToolCommand::new(Tool::ChunkServer);
        if let Some(p) = serve::beside_us() {
            c = c.program(p);
        }
        c = c.arg("--tree");
        let digest = match serve {
            None => {
                c = c.arg("--cached");
                digest
            }
            Some(s) => {
                if let Some(k) = &s.keep {
                    c = c.arg("--keep").path(k);
                }
                if let Some(src) = &s.source {
                    c = c.arg("--source").arg(format!("unix:{}", src.display()));
                }
                &s.digest
            }
        };
        c.arg("--pool")
            .path(image)
            .arg("--digest")
            .arg(digest)
            .arg("--dir")
            .path(mountpoint)
    }
    /// The helper's command line, in the foreground (`-f`) so that it is our child. Paths are absolute
    /// (neither helper understands `--`). fuse2fs: `fakeroot` makes its own permission checks behave
    /// like squashfuse_ll's (the mounting user reads every file, as they can read the image); `ro` is
    /// enforced by fuse2fs itself (writes fail with EROFS, though the kernel lists the mount as rw).
    pub fn command(self, image: &Path, mountpoint: &Path) -> ToolCommand {
        match self {
            Backend::SquashfuseLl => ToolCommand::new(Tool::SquashfuseLl)
                .arg("-f")
                .arg("-o")
                .arg(MountOptions::FIXED)
                .path(image)
                .path(mountpoint),
            Backend::Fuse2fs => ToolCommand::new(Tool::Fuse2fs)
                .path(image)
                .path(mountpoint)
                .arg("-f")
                .arg("-o")
                .arg(format!("{},fakeroot", MountOptions::FIXED)),
            // without a digest (see ImageInfo::helper_command): an image with no manifest
            Backend::SwPoolTree => Backend::SquashfuseLl.command(image, mountpoint),
        }
    }

    /// The helper's command line for a read-write mount of a user image (fuse2fs only): the user's
    /// own files, so no `fakeroot`; `nosuid,nodev` as always.
    pub fn command_rw(self, image: &Path, mountpoint: &Path) -> ToolCommand {
        ToolCommand::new(Tool::Fuse2fs)
            .path(image)
            .path(mountpoint)
            .arg("-f")
            .arg("-o")
            .arg(MountOptions::WRITABLE)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.tool().program())
    }
}

impl ImageInfo {
    /// The FUSE server `reader` for this image: sw-pool's tree server only for a read-only
    /// squashfs pool (cached, in place or on demand; not a bare image: the server checks the
    /// manifest's digest); everything else keeps its helper.
    pub fn with_reader(mut self, reader: FuseReader) -> ImageInfo {
        self.backend = match reader {
            FuseReader::SwPool
                if self.format == ImageFormat::Squashfs
                    && self.pool.is_some()
                    && !self.writable =>
            {
                Backend::SwPoolTree
            }
            _ => Backend::for_format(self.format),
        };
        self
    }
}
