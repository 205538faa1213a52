//! `sw-pool mount --rw`: a user image mounted read-write on this node under its lease.

use std::path::PathBuf;

use crate::userimage::{self, lease, lease::Liveness, lease::Mode};

/// What `sw-pool mount --rw` needs to know.
#[derive(Debug, Clone)]
pub struct MountRw {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    pub job_id: Option<String>,
    pub timeout: std::time::Duration,
}

/// `sw-pool mount --rw IMG DIR`: take the image's read-write lease on this node (refused, naming
/// the holder, while another node or job holds it), make it clean (`e2fsck -f -p`: replays the
/// journal of a mount that ended without unmounting, and repairs what is safe), then mount it with
/// fuse2fs, read-write, `nosuid,nodev`, recorded with the lease so that the last unmount gives it
/// back after the helper wrote everything out. Any failure gives the lease back.
pub fn mount_rw(
    sys: &dyn crate::mount::Sys,
    dir: &crate::state::StateDir,
    req: &MountRw,
    live: &dyn Liveness,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<(crate::state::Acquired, lease::Taken, String), crate::Error> {
    let image = crate::exec::absolute(&req.image);
    userimage::check_image(&image)?;
    // the image must be writable by the caller (it is theirs; the helper runs as them)
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&image)
        .map_err(|source| userimage::UserImageError::Io {
            what: "open for writing",
            path: image.clone(),
            source,
        })?;
    let mp = crate::mount::canonical_mountpoint(&req.mountpoint)?;
    let mut me = userimage::offline_holder(&mp, Mode::Rw, req.job_id.clone());
    me.mount_point = mp.clone();
    let taken = lease::take(&image, &me, live).map_err(userimage::UserImageError::from)?;
    let give_back = |e: crate::Error| {
        let _ = lease::release(&image, &me);
        e
    };
    let report = userimage::fsck(&image, true, path_var).map_err(|e| give_back(e.into()))?;
    let acquired = crate::state::acquire(
        sys,
        dir,
        &crate::state::AcquireRequest {
            image: image.clone(),
            mountpoint: mp.clone(),
            options: crate::mount::MountOptions::read_write(),
            job_id: req.job_id.clone(),
            timeout: req.timeout,
            once_per_job: false,
            source: None,
            lease: Some(me.clone()),
        },
    )
    .map_err(|e| give_back(e.into()))?;
    // the lease now follows the helper's life (another node can tell it is gone)
    if !acquired.reused {
        let mut held = me.clone();
        held.pid = acquired.record.helper_pid;
        if let Err(e) = lease::update(&image, &held) {
            tracing::warn!("{e}");
        }
    }
    Ok((acquired, taken, report))
}
