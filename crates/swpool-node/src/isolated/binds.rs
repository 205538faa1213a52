//! `--shadow` and `--base`: pools this user loaded on this node, bound over the site's original
//! software or stacked as the environment's root file system.

use std::path::PathBuf;

use crate::config::{Config, Environment};
use crate::ExitStatus;

use super::Failed;

/// Where the pool `spec` names (NAME/VERSION, a pool file or a mount point) is mounted for this
/// user on this node, if it is. The error itself is not formatted here (see `Failed`): the callers
/// say what it means.
fn loaded_at(spec: &str, cfg: &Config, uid: u32, env: &Environment) -> Option<PathBuf> {
    crate::locate::mountpoint_of(
        std::path::Path::new(spec),
        cfg.mount_dir.value.as_deref(),
        uid,
        env,
    )
    .ok()
    .map(|(mp, _)| mp)
}

/// The binds of `--shadow NAME/VERSION...`: each pool must be loaded by this user on this node.
pub(super) fn shadows(
    specs: &[String],
    cfg: &Config,
    env: &Environment,
    warn: &dyn Fn(String),
) -> Result<Vec<(PathBuf, PathBuf)>, Failed> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let root = cfg.shadow_root.value.clone().ok_or_else(|| {
        Failed::new(
            ExitStatus::BadInput,
            "--shadow needs to know where the site's original software is: config key              `shadow_root` (or $SW_POOL_SHADOW_ROOT), e.g. /sw",
        )
    })?;
    let uid = rustix::process::getuid().as_raw();
    let mut out = Vec::new();
    for spec in specs {
        let Some(mp) = loaded_at(spec, cfg, uid, env) else {
            return Err(Failed::new(
                ExitStatus::BadInput,
                format!(
                    "--shadow {spec}: it is not loaded on {}: run `sw-pool load {spec}` first \
                     (in a job, once for all its nodes: `sw-pool load` in the batch script)",
                    crate::users::hostname()
                ),
            ));
        };
        let (binds, none) = crate::shadow::private_shadows(&mp, &root);
        if binds.is_empty() {
            warn(format!(
                "--shadow {spec}: none of its packages ({}) has an original under {}: nothing is shadowed",
                if none.is_empty() { "none in install/".to_string() } else { none.join(", ") },
                root.display()
            ));
        }
        out.extend(binds);
    }
    Ok(out)
}

/// The `--base` pools, bottom first: each a squashfs pool this user loaded (or mounted) on this
/// node with FUSE, whose verified node-local image the environment mounts again inside itself.
pub(super) fn bases(
    specs: &[String],
    cfg: &Config,
    env: &Environment,
) -> Result<Vec<swpool_env::Base>, Failed> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    use crate::state::Serving;
    let uid = rustix::process::getuid().as_raw();
    let node = crate::users::hostname();
    let bad = |m: String| Failed::new(ExitStatus::BadInput, m);
    let state = crate::state::StateDir::open_default(env).map_err(|e| {
        bad(format!(
            "--base: cannot open this user's state on {node}: {e}"
        ))
    })?;
    let records = state.records().map_err(|e| {
        bad(format!(
            "--base: cannot read this user's mounts on {node}: {e}"
        ))
    })?;
    let mut out = Vec::new();
    for spec in specs {
        let not_loaded = || {
            bad(format!(
                "--base {spec}: it is not loaded on {node}: run `sw-pool load {spec}` first (in a \
                 job, once for all its nodes: `sw-pool load` in the batch script)"
            ))
        };
        let Some(mp) = loaded_at(spec, cfg, uid, env) else {
            return Err(not_loaded());
        };
        let rec = records
            .iter()
            .flatten()
            .filter(|r| r.uid == uid && !r.pending && r.mount_point == mp)
            .max_by_key(|r| r.created)
            .ok_or_else(not_loaded)?;
        match rec.serving {
            Some(Serving::Fuse { .. }) | None => {}
            _ => {
                return Err(bad(format!(
                    "--base {spec}: its mount at {} on {node} is not served from a verified \
                     node-local copy by FUSE; --base mounts that copy again inside the \
                     environment: load it with a full copy (`sw-pool load {spec}`, not --lazy or \
                     --in-place, not through the site's helper)",
                    mp.display()
                )))
            }
        }
        if rec.format != crate::image::ImageFormat::Squashfs {
            return Err(bad(format!(
                "--base {spec}: {} is a {} image; a base is mounted inside the environment by \
                 sw-pool's squashfs server (or squashfuse_ll), so it must be a squashfs pool \
                 (`sw-pool build --format squashfs`)",
                rec.image.display(),
                rec.format.as_str()
            )));
        }
        out.push(swpool_env::Base {
            label: rec
                .pool
                .as_ref()
                .map_or_else(|| spec.clone(), |p| format!("{}/{}", p.name, p.version)),
            image: rec.image.clone(),
            at: mp,
            digest: rec.pool.as_ref().map(|p| p.digest.clone()),
        });
    }
    Ok(out)
}
