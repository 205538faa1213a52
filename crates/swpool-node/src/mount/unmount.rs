//! Unmounting: root's through the walked parent, a user's through `fusermount3 -u`; busy mounts
//! named by their holders.

use super::*;

/// Unmount `mp`. As root with `umount2(UMOUNT_NOFOLLOW)`: a path whose parent a user can change
/// is never followed through a symlink swapped in after it was checked in the mount table. As a
/// user with `fusermount3 -u`, which makes its own checks.
pub(super) fn run_unmount(sys: &dyn Sys, mp: &Path, lazy: bool) -> Result<(), ExecError> {
    run_unmount_id(sys, mp, None, lazy)
}

/// The mount of a record: its ID in the mount table and the uid that made it.
pub type Identity = (u32, u32);

/// [`run_unmount`]; as root with the mount's [`Identity`], by that ID wherever the mount is now
/// (opened by descriptor, its ID checked there, then unmounted through it), never what else sits
/// at `mp`. A mount that is gone by then is an error "not mounted", not a success.
fn run_unmount_id(
    sys: &dyn Sys,
    mp: &Path,
    id: Option<Identity>,
    lazy: bool,
) -> Result<(), ExecError> {
    if sys.euid() == 0 {
        return match id {
            Some((id, user)) => match sys.unmount_id(id, user, mp, lazy)? {
                true => Ok(()),
                false => Err(ExecError::Failed {
                    tool: swpool_sys::exec::Tool::Umount,
                    cmdline: format!("umount2(mount {id}, last seen at {})", mp.display()),
                    status: "failed".into(),
                    stderr: format!("mount {id} is no longer mounted (anywhere)"),
                }),
            },
            None => sys.unmount_nofollow(mp, lazy),
        };
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

fn unmount_retrying_busy(sys: &dyn Sys, mp: &Path, id: Option<Identity>) -> Result<(), ExecError> {
    let mut result = run_unmount_id(sys, mp, id, false);
    for ms in BUSY_RETRIES {
        match &result {
            Err(e) if is_busy(e) => {
                tracing::debug!(mount_point = %mp.display(), "busy; trying again in {ms} ms");
                sys.sleep(std::time::Duration::from_millis(ms));
                result = run_unmount_id(sys, mp, id, false);
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
    unmount_identified(sys, mp, None, force)
}

/// [`unmount`] of a recorded mount last seen at `mp`: with its [`Identity`] (root), the mount is
/// looked up by its ID (and that it is still a FUSE mount of sw-pool's helpers by the same user)
/// wherever a user moved it, and unmounted there by that ID; what sits at `mp` is not touched.
pub fn unmount_identified(
    sys: &dyn Sys,
    mp: &Path,
    id: Option<Identity>,
    force: bool,
) -> Result<Unmounted, MountError> {
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    let id = id.filter(|_| sys.euid() == 0);
    let found = match id {
        Some((i, user)) => mounts.iter().find(|e| {
            e.mount_id == i && e.is_fuse() && e.is_swpool_helper() && e.fuse_user_id() == Some(user)
        }),
        None => proc::mount_at(&mounts, mp),
    };
    let mp = &found.map_or_else(|| mp.to_path_buf(), |e| e.mount_point.clone());
    let mp = mp.as_path();
    let Some(entry) = found else {
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
    match unmount_retrying_busy(sys, mp, id) {
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
            run_unmount_id(sys, mp, id, true).map_err(|source| MountError::Unmount {
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
            if force && run_unmount_id(sys, mp, id, true).is_ok() {
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
