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
    let (image, mp) = writable_image(req, false)?;
    let me = lease::Holder::here(Mode::Rw, &mp, req.job_id.clone());
    let (taken, report) = lease_and_fsck(&image, &me, live, path_var)?;
    let acquired = acquire_leased(
        sys,
        dir,
        &crate::state::AcquireRequest {
            image: image.clone(),
            mountpoint: mp,
            options: crate::mount::MountOptions::read_write(),
            job_id: req.job_id.clone(),
            timeout: req.timeout,
            once_per_job: false,
            shell: None,
            source: None,
            lease: Some(me),
            serve: None,
            // a user image: fuse2fs
            reader: crate::mount::FuseReader::SquashfuseLl,
        },
    )?;
    Ok((acquired, taken, report))
}

/// What a read-write mount checks before it takes anything (FUSE and kernel alike): `req.image`
/// is a user image (absolute) the caller may open for writing (it is theirs; fuse2fs runs as them),
/// and the mount point; returns both. A kernel mount's point (`helper_makes_it`) is taken as given
/// (made absolute): the site's helper makes it, root's, beneath the caller's directory of its
/// mount root, and refuses a `.`, `..` or symlink on the way itself; its parents need not exist.
pub(super) fn writable_image(
    req: &MountRw,
    helper_makes_it: bool,
) -> Result<(PathBuf, PathBuf), crate::Error> {
    let image = crate::exec::absolute(&req.image);
    userimage::check_image(&image)?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&image)
        .map_err(|source| userimage::UserImageError::Io {
            what: "open for writing",
            path: image.clone(),
            source,
        })?;
    let mp = if helper_makes_it {
        crate::exec::absolute(&req.mountpoint)
    } else {
        crate::mount::canonical_mountpoint(&req.mountpoint)?
    };
    Ok((image, mp))
}

/// Take `me`'s read-write lease of `image`, then make the image clean (`e2fsck -f -p`: replays the
/// journal of a mount that ended without unmounting); a failed check gives the lease back.
/// Returns the lease taken and e2fsck's report.
pub(super) fn lease_and_fsck(
    image: &std::path::Path,
    me: &lease::Holder,
    live: &dyn Liveness,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<(lease::Taken, String), crate::Error> {
    let taken = lease::take(image, me, live).map_err(userimage::UserImageError::from)?;
    match userimage::fsck(image, true, path_var) {
        Ok(r) => Ok((taken, r)),
        Err(e) => {
            let _ = lease::release(image, me);
            Err(e.into())
        }
    }
}

/// [`crate::state::acquire`] of a mount that holds the lease in `req.lease` (taken by the caller):
/// a failure gives the lease back; a new mount makes the serving helper the holder (another node
/// of the same boot can then tell it is gone), a failure to say so being a note.
pub(super) fn acquire_leased(
    sys: &dyn crate::mount::Sys,
    dir: &crate::state::StateDir,
    req: &crate::state::AcquireRequest,
) -> Result<crate::state::Acquired, crate::Error> {
    let mut acquired = match crate::state::acquire(sys, dir, req) {
        Ok(a) => a,
        Err(e) => {
            if let Some(h) = &req.lease {
                let _ = lease::release(&req.image, h);
            }
            return Err(e.into());
        }
    };
    if let (Some(h), false) = (&req.lease, acquired.reused) {
        let mut held = h.clone();
        held.pid = acquired.record.helper_pid;
        if let Err(e) = lease::update(&req.image, &held) {
            acquired.notes.push(e.to_string());
        }
    }
    Ok(acquired)
}
