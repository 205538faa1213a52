//! Dropping a reference; the last one unmounts.

use super::*;

/// The result of [`release`].
#[derive(Debug, Clone, Serialize)]
pub struct Released {
    pub mount_point: PathBuf,
    /// The record as it was (none for a mount that had no record).
    pub record: Option<Record>,
    /// References left (0: unmounted).
    pub remaining: usize,
    /// Set when the mount was taken down.
    pub unmounted: Option<Unmounted>,
}

/// Drop one reference to the mount at `mountpoint` (the one of `job_id` if there is one); the last
/// reference unmounts it and removes the record. A FUSE mount without a record is unmounted; a record
/// whose mount is gone is removed. `force`: a busy mount is detached lazily.
pub fn release(
    sys: &dyn Sys,
    dir: &StateDir,
    mountpoint: &Path,
    force: bool,
    job_id: Option<&str>,
) -> Result<Released, StateError> {
    release_for(sys, dir, mountpoint, force, job_id, None)
}

/// [`release`] for the shell `shell` (`unload` through the shell function): the reference that
/// shell's load took is the one dropped, else one no shell took, else the last.
pub fn release_for(
    sys: &dyn Sys,
    dir: &StateDir,
    mountpoint: &Path,
    force: bool,
    job_id: Option<&str>,
    shell: Option<u32>,
) -> Result<Released, StateError> {
    let _lock = dir.lock()?;
    // a mount point whose directories are gone or were swapped for a symlink since (a user owns a
    // parent) is still found by its record, under the path it was recorded with
    let mp = match mount::canonical_mountpoint(mountpoint) {
        Ok(mp) => mp,
        Err(e) => {
            let lex = mount::walk::lexical(mountpoint);
            match dir.read(&lex) {
                Ok(Some(_)) => lex,
                _ => return Err(e.into()),
            }
        }
    };
    let rec = match dir.read(&mp) {
        Ok(r) => r,
        Err(e @ StateError::Corrupt { .. }) if force => {
            tracing::warn!("{e}; removing it (--force)");
            dir.remove(&mp)?;
            None
        }
        Err(e) => return Err(e),
    };
    if let Some(r) = &rec {
        r.check_known()?;
    }
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    // where the mount is now (its parent may have been renamed since it was made)
    let at = rec
        .as_ref()
        .map_or_else(|| mp.clone(), |r| r.located(&mounts));
    let st = match &rec {
        Some(r) => r.mount_state(sys, &mounts, &at),
        None => mount::state(sys, &mounts, &at),
    };
    let Some(mut rec) = rec else {
        if st == MountState::Absent {
            return Err(MountError::NotMounted { path: mp }.into());
        }
        let u = mount::unmount(sys, &mp, force)?;
        return Ok(Released {
            mount_point: mp,
            record: None,
            remaining: 0,
            unmounted: Some(u),
        });
    };
    if st == MountState::Mounted && rec.refs.len() > 1 {
        let i = job_id
            .and_then(|j| {
                rec.refs
                    .iter()
                    .rposition(|r| r.job_id.as_deref() == Some(j))
            })
            .or_else(|| {
                shell.and_then(|s| {
                    let mine = rec.refs.iter().rposition(|r| r.shell == Some(s));
                    mine.or_else(|| rec.refs.iter().rposition(|r| r.shell.is_none()))
                })
            })
            .unwrap_or(rec.refs.len() - 1);
        let before = rec.clone();
        rec.refs.remove(i);
        dir.write(&rec)?;
        return Ok(Released {
            mount_point: mp,
            record: Some(before),
            remaining: rec.refs.len(),
            unmounted: None,
        });
    }
    let unmounted = match (&rec.serving, st) {
        (
            Some(Serving::Kernel {
                helper: Some(h), ..
            }),
            _,
        ) => {
            // the site's helper holds the kernel mount for every user: drop ours there
            if let Some(p) = &rec.pool {
                helper_release(sys, h, p, None).map_err(|reason| StateError::Conflict {
                    mount_point: mp.clone(),
                    reason: format!("the site's mount helper did not release it: {reason}"),
                })?;
            } else if st != MountState::Absent {
                // a user image the helper mounted for us (`mount --rw --kernel`)
                helper_umount(sys, h, &at).map_err(|reason| StateError::Conflict {
                    mount_point: mp.clone(),
                    reason: format!("the site's mount helper did not unmount it: {reason}"),
                })?;
            }
            None
        }
        (_, MountState::Absent) => None,
        // by the record's mount ID (root): wherever a user moved it since, and never another
        // mount a user put at `at`; gone meanwhile → "not mounted", the record kept
        _ => Some(mount::unmount_identified(sys, &at, rec.identity(), force)?),
    };
    rec.release_server(sys);
    dir.remove(&mp)?;
    Ok(Released {
        mount_point: mp,
        record: Some(rec),
        remaining: 0,
        unmounted,
    })
}

pub use swpool_sys::exec::helper_sudo;

/// Drop this user's reference to a site pool at the site's mount helper (`sudo -n HELPER
/// release-pool NAME/VERSION [--job-id J]`); the last user's unmounts it there.
pub fn helper_release(
    sys: &dyn Sys,
    helper: &Path,
    pool: &crate::mount::PoolId,
    job: Option<&str>,
) -> Result<(), String> {
    helper_release_spec(sys, helper, &format!("{}/{}", pool.name, pool.version), job)
}

/// [`helper_release`] by `NAME/VERSION`.
pub fn helper_release_spec(
    sys: &dyn Sys,
    helper: &Path,
    spec: &str,
    job: Option<&str>,
) -> Result<(), String> {
    let mut cmd = helper_sudo(helper).arg("release-pool").arg(spec);
    if let Some(j) = job {
        cmd = cmd.arg("--job-id").arg(j);
    }
    sys.run(&cmd).map(drop).map_err(|e| e.helper_reason())
}

/// `sudo -n HELPER umount DIR`: the helper unmounts a user image it mounted for this user.
pub fn helper_umount(sys: &dyn Sys, helper: &Path, mp: &Path) -> Result<(), String> {
    let cmd = helper_sudo(helper).arg("umount").path(mp);
    sys.run(&cmd).map(drop).map_err(|e| e.helper_reason())
}
