//! `sw-pool inspect`: what a pool file holds, read and checked without mounting it — its manifest
//! (the trailer parsed with bounds), the file system's superblock against the manifest, the file
//! system's own check (`unsquashfs -stat`, `fsck.erofs`, `e2fsck -n`) and the setuid/setgid files
//! and device nodes in the image. A library call: the command prints it.

use std::path::Path;

use crate::error::Error;
use crate::image::check::{check, CheckReport};
use crate::image::Special;
use crate::image::{detect, DetectError};
use crate::pool::Pool;
use crate::ExitStatus;

/// What [`inspect`] found.
pub struct Inspection {
    pub pool: Pool,
    /// The file system's own check (`None`: not asked for).
    pub fsck: Option<CheckReport>,
    /// Setuid/setgid files and device nodes, or why they could not be listed.
    pub special: Result<Vec<Special>, String>,
}

/// Open the pool at `path` and check it: the image fits in the pool file, its superblock is the
/// format the manifest names, and (`fsck`) the file system's own check. A damaged pool is an
/// error naming the file and what is wrong (the check's failure is reported in
/// [`Inspection::fsck`], for the caller to print before failing).
pub fn inspect(
    path: &Path,
    fsck: bool,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<Inspection, Error> {
    let pool = Pool::open(path)?;
    crate::pool::fs_size::check_fits(&pool)?;
    let m = &pool.manifest;
    let found = match detect(path) {
        Ok(f) if f == m.format => None,
        Ok(f) => Some(format!("the image is {f}")),
        Err(DetectError::Unknown { .. }) => {
            Some("the image has no file-system magic (damaged superblock)".into())
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(found) = found {
        return Err(Error::other(
            ExitStatus::InvalidPool,
            format!(
                "{}: the manifest says {} but {found}; the pool is damaged, rebuild it",
                path.display(),
                m.format
            ),
        ));
    }
    let fsck = if fsck {
        Some(check(path, m.format, path_var)?)
    } else {
        None
    };
    // setuid/setgid files and device nodes, read from the image: what a mount without
    // nosuid/nodev (or an unpacking as root) would give their owner
    let special = crate::image::special::list(path, m.format, path_var).map_err(|e| e.to_string());
    Ok(Inspection {
        pool,
        fsck,
        special,
    })
}
