//! Unmounting: root's through the walked parent, a user's through `fusermount3 -u`; busy mounts
//! named by their holders.

use super::*;

/// Unmount `mp`. As root with `umount2(UMOUNT_NOFOLLOW)`: a path whose parent a user can change
/// is never followed through a symlink swapped in after it was checked in the mount table. As a
/// user with `fusermount3 -u`, which makes its own checks.
pub(super) fn run_unmount(sys: &dyn Sys, mp: &Path, lazy: bool) -> Result<(), ExecError> {
    if sys.euid() == 0 {
        return sys.unmount_nofollow(mp, lazy);
    }
    let c = ToolCommand::new(Tool::Fusermount3).arg("-u");
    let c = if lazy { c.arg("-z") } else { c };
    sys.run(&c.path(mp)).map(drop)
}

/// Transient EBUSY: a path walk in another process (a `stat`, a mount-table scan) holds a
/// reference to the mount for microseconds. Try again a few times (about 0.3 s in all) before
/// calling it busy; a real holder is still there afterwards and is named then.
const BUSY_RETRIES: [u64; 4] = [10, 30, 80, 180];

/// The unmount failed because the mount is in use (EBUSY, from umount2 or fusermount3).
fn is_busy(e: &ExecError) -> bool {
    e.stderr().is_some_and(|s| s.contains("busy"))
}

fn unmount_retrying_busy(sys: &dyn Sys, mp: &Path) -> Result<(), ExecError> {
    let mut result = run_unmount(sys, mp, false);
    for ms in BUSY_RETRIES {
        match &result {
            Err(e) if is_busy(e) => {
                tracing::debug!(mount_point = %mp.display(), "busy; trying again in {ms} ms");
                sys.sleep(std::time::Duration::from_millis(ms));
                result = run_unmount(sys, mp, false);
            }
            _ => break,
        }
    }
    result
}

/// How an unmount went.
#[derive(Debug, Clone, Serialize)]
pub struct Unmounted {
    pub mount_point: PathBuf,
    /// It was stale (its FUSE process had died).
    pub was_stale: bool,
    /// It was busy and lazily detached (`--force`); these held it.
    pub lazy: bool,
    pub holders: Vec<Holder>,
}

/// Unmount the FUSE mount at the canonical `mp`. Busy: an error naming the holders, unless `force`
/// (then a lazy unmount, still naming them). Stale mounts are unmounted normally.
pub fn unmount(sys: &dyn Sys, mp: &Path, force: bool) -> Result<Unmounted, MountError> {
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    let Some(entry) = proc::mount_at(&mounts, mp) else {
        return Err(MountError::NotMounted {
            path: mp.to_path_buf(),
        });
    };
    if !entry.is_fuse() {
        return Err(MountError::NotOurs {
            path: mp.to_path_buf(),
            fstype: entry.fstype.clone(),
        });
    }
    let was_stale = state(sys, &mounts, mp) == MountState::Stale;
    match unmount_retrying_busy(sys, mp) {
        Ok(_) => Ok(Unmounted {
            mount_point: mp.to_path_buf(),
            was_stale,
            lazy: false,
            holders: Vec::new(),
        }),
        Err(e) if is_busy(&e) => {
            let (holders, hidden) = proc::holders(mp);
            if !force {
                return Err(MountError::Busy {
                    path: mp.to_path_buf(),
                    holders,
                    hidden,
                });
            }
            run_unmount(sys, mp, true).map_err(|source| MountError::Unmount {
                path: mp.to_path_buf(),
                source,
            })?;
            Ok(Unmounted {
                mount_point: mp.to_path_buf(),
                was_stale,
                lazy: true,
                holders,
            })
        }
        Err(source) => {
            if force && run_unmount(sys, mp, true).is_ok() {
                return Ok(Unmounted {
                    mount_point: mp.to_path_buf(),
                    was_stale,
                    lazy: true,
                    holders: Vec::new(),
                });
            }
            Err(MountError::Unmount {
                path: mp.to_path_buf(),
                source,
            })
        }
    }
}
