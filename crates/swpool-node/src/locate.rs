//! Where a pool a user loaded is mounted on this node (`umount`, `env`, `unload`, `run --shadow`
//! and `run --base` take a pool file, NAME/VERSION or the mount point).

use std::path::{Path, PathBuf};

use crate::config::Environment;
use crate::mount::{self, paths, MountError};
use crate::pool::{ManifestError, Pool};
use crate::state::{self, StateDir};

/// Why [`mountpoint_of`] found no mount point (swpool-core's `load::mountpoint_of` says it as a
/// load error).
#[derive(Debug, thiserror::Error)]
pub enum Unplaced {
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Pool(#[from] ManifestError),
    #[error("{} is neither a pool file, NAME/VERSION nor a mount point", spec.display())]
    UnknownSpec { spec: PathBuf },
    #[error("pool {name}/{version} is not loaded on this node (nothing at {})", at.display())]
    NotLoaded {
        name: String,
        version: String,
        at: PathBuf,
    },
}

/// The mount point of what `spec` names: a directory is the mount point itself; a pool file or
/// NAME/VERSION is looked up at `<mount dir>/NAME/VERSION` (`umount`, `env` and `unload` take all
/// three).
pub fn mountpoint_of(
    spec: &Path,
    mount_dir: Option<&Path>,
    uid: u32,
    env: &Environment,
) -> Result<(PathBuf, Option<(String, String)>), Unplaced> {
    if spec.is_dir() {
        return Ok((mount::canonical_mountpoint(spec)?, None));
    }
    let s = spec.to_string_lossy();
    let (name, version) = if spec.is_file() {
        let p = Pool::open(spec)?;
        (p.manifest.name, p.manifest.version)
    } else if crate::pool::spec::is_pool_spec(&s) {
        let (n, v) = s.split_once('/').expect("NAME/VERSION");
        (n.to_string(), v.to_string())
    } else {
        return Err(Unplaced::UnknownSpec {
            spec: spec.to_path_buf(),
        });
    };
    let mp = paths::default_mount_dir(mount_dir, uid, env)
        .join(&name)
        .join(&version);
    if !mp.is_dir() {
        // a site pool the site's mount helper mounted for this user is where the helper put it
        let by_helper = StateDir::open_default(env)
            .and_then(|d| d.find_pool(&name, &version))
            .unwrap_or_default()
            .into_iter()
            .find(|r| matches!(r.serving, Some(state::Serving::Kernel { .. })));
        if let Some(r) = by_helper {
            return Ok((r.mount_point, Some((name, version))));
        }
        return Err(Unplaced::NotLoaded {
            name,
            version,
            at: mp,
        });
    }
    Ok((mount::canonical_mountpoint(&mp)?, Some((name, version))))
}
