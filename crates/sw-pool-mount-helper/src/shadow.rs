//! Shadow mounts (seed 002's software images): `shadow [--job-id J] POOL` mounts a site pool as
//! `mount-pool` does (one verified copy, one mount per node) and binds each of its
//! `install/<pkg>/<ver>` directories over `<shadow_root>/<pkg>/<ver>` **where that directory
//! exists** — the original installation of the same package, which the site's modulefiles already
//! point at. Everyone on the node then runs the package from the pool; when a bind cannot be made
//! the original stays visible, and the answer says which and why. A pool directory with no
//! original is left alone (nothing is created under the shadow root).
//!
//! Both sides are walked by descriptor: the target is opened beneath the shadow root with
//! `RESOLVE_BENEATH|NO_SYMLINKS|NO_XDEV` (a symlink or an existing mount there is refused), the
//! source beneath the pool's own mount the same way, and the bind (`open_tree(OPEN_TREE_CLONE)` of
//! that one directory) keeps the pool mount's `ro,nosuid,nodev`. The shadows are made by the first
//! `shadow` of the pool on the node and removed with the last shadow reference (`release-pool
//! --shadow`, the job's epilog), before the pool's own mount can go.

use std::path::{Path, PathBuf};

use serde::Serialize;
use swpool_sys::kmount;
use swpool_sys::pinned::Pinned;

use crate::caller::Caller;
use crate::config::HelperConfig;
use crate::error::{HelperError, Refusal, Result};
use crate::pool::PoolMounted;
use crate::state::{Record, ShadowMount, State};

#[derive(Debug, Serialize)]
pub struct Shadowed {
    #[serde(flatten)]
    pub pool: PoolMounted,
    /// The directories now showing the pool's packages.
    pub shadows: Vec<PathBuf>,
    /// `<pkg>/<ver>` of the pool with no original under the shadow root (not shadowed).
    pub no_original: Vec<String>,
    /// Originals that stay visible because the bind failed, each with why.
    pub failed: Vec<String>,
}

/// `shadow POOL`: the pool mounted (a shadow reference), then its shadows made if they are not yet.
pub fn shadow<H: crate::host::Host>(
    h: &H,
    cfg: &HelperConfig,
    c: &Caller,
    pool: &Path,
    job: Option<&str>,
) -> Result<Shadowed> {
    let root = cfg.shadow_root.clone().ok_or_else(|| {
        HelperError::refused(Refusal::TurnedOff,
            "no shadow_root in /etc/sw-pool/helper.toml: this node makes no shadow mounts (the original software stays)",
        )
    })?;
    let mounted = crate::pool::mount_pool(h, cfg, c, pool, job, true)?;
    let mut st = State::open()?;
    let here = crate::state::mount_namespace();
    let rec = st.records.mounts.iter_mut().find(|r| {
        r.in_namespace(here)
            && matches!(r, Record::Pool { name, version, .. }
                if *name == mounted.name && *version == mounted.version)
    });
    let Some(Record::Pool {
        shadows,
        mount_point,
        ..
    }) = rec
    else {
        return Err(HelperError::refused(
            Refusal::Conflict,
            format!(
                "{}/{} was released while its shadows were being made; ask again",
                mounted.name, mounted.version
            ),
        ));
    };
    let mut out = Shadowed {
        pool: mounted,
        shadows: Vec::new(),
        no_original: Vec::new(),
        failed: Vec::new(),
    };
    if !shadows.is_empty() {
        out.shadows = shadows.iter().map(|s| s.target.clone()).collect();
        return Ok(out);
    }
    let root_fd = Pinned::open_root(&root).map_err(|e| HelperError::system(&root, e))?;
    let pool_fd =
        Pinned::open_root(mount_point).map_err(|e| HelperError::system(mount_point, e))?;
    for (pkg, ver) in swpool_format::pool::layout::installed(mount_point) {
        let rel = Path::new(&pkg).join(&ver);
        let target = root.join(&rel);
        let pin = match Pinned::open_beneath(&root_fd, &rel) {
            Ok(p) => p,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                out.no_original.push(format!("{pkg}/{ver}"));
                continue;
            }
            Err(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::EXDEV) => "something is mounted there already".to_string(),
                    Some(libc::ELOOP) | Some(libc::ENOTDIR) => {
                        "it is a symlink or not a directory".to_string()
                    }
                    _ => e.to_string(),
                };
                out.failed.push(format!("{}: {why}", target.display()));
                continue;
            }
        };
        match kmount::bind_beneath(&pool_fd, &Path::new("install").join(&rel), &pin) {
            Ok(id) => {
                shadows.push(ShadowMount {
                    target: target.clone(),
                    mount_id: id,
                });
                out.shadows.push(target);
            }
            Err(e) => out.failed.push(format!("{}: {e}", target.display())),
        }
    }
    st.save()?;
    Ok(out)
}

/// Unmount `shadows` (lazily: a program still running from one keeps its files); those that
/// could not be removed stay in the list and their errors are added to `errors`. Returns the
/// directories that show their originals again.
pub fn remove(shadows: &mut Vec<ShadowMount>, errors: &mut Vec<String>) -> Vec<PathBuf> {
    let mut done = Vec::new();
    let mounts = swpool_sys::proc::read_mountinfo().unwrap_or_default();
    shadows.retain(|s| {
        // mount IDs are reused: only the mount with that ID on that very directory is ours
        let ours = mounts
            .iter()
            .any(|m| u64::from(m.mount_id) == s.mount_id && m.mount_point == s.target);
        if !ours {
            done.push(s.target.clone());
            return false;
        }
        match kmount::unmount_id(s.mount_id, true) {
            Ok(_) => {
                done.push(s.target.clone());
                false
            }
            Err(e) => {
                errors.push(format!("{}: {e}", s.target.display()));
                true
            }
        }
    });
    done
}
