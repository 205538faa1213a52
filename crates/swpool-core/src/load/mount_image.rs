//! `sw-pool mount IMAGE [MOUNTPOINT]` on one node, as a use case: a pool is loaded (checked
//! against the trust policy, copied into the node-local cache verifying every chunk, mounted from
//! there), a bare image is mounted where it lies (when the policy accepts unsigned images).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{authorize_in_place, load, LoadRequest, Loaded, NodeContext, Quiet};
use crate::error::{Error, LoadError};
use crate::mount::{ImageInfo, MountOptions};
use crate::pool::{ManifestError, Pool};
use crate::state::{self, AcquireRequest, Acquired};

/// What to mount.
#[derive(Clone)]
pub struct MountRequest {
    /// A pool file, `NAME/VERSION`, or a bare image.
    pub image: PathBuf,
    /// Where (default: the pool's default mount point; a bare image needs one).
    pub mountpoint: Option<PathBuf>,
    pub options: MountOptions,
    pub job_id: Option<String>,
    pub timeout: Duration,
    /// Progress of the copy into the cache.
    pub progress: Option<crate::transfer::ProgressSink>,
}

/// How it was mounted.
#[derive(Debug)]
pub enum MountOutcome {
    /// A pool: verified into this node's cache and mounted from the copy.
    Pool(Box<Loaded>),
    /// A bare image mounted in place; `warning` says what nothing vouches for.
    InPlace {
        acquired: Box<Acquired>,
        warning: Option<String>,
    },
}

/// Mount `req.image` on this node (see the module's documentation).
pub fn mount_image(node: &NodeContext, req: &MountRequest) -> Result<MountOutcome, Error> {
    let spec = req.image.to_string_lossy().into_owned();
    let by_name =
        std::fs::symlink_metadata(&req.image).is_err() && crate::pool::spec::is_pool_spec(&spec);
    // A pool (NAME/VERSION, or a file with a manifest) is never mounted where it lies: a mounted
    // pool serves only bytes its manifest vouches for, also when the file it came from is changed
    // after the mount. Only a bare image (no manifest, nothing to verify against) is mounted in
    // place, and only when the policy accepts unsigned images.
    if by_name || is_pool(&req.image)? {
        let l = load(
            &crate::transfer::Job::single(),
            node,
            &LoadRequest {
                pool: req.image.clone(),
                mountpoint: req.mountpoint.clone(),
                job_id: req.job_id.clone(),
                timeout: req.timeout,
                progress: req.progress.clone(),
                ..LoadRequest::default()
            },
            &Quiet,
        )?;
        return Ok(MountOutcome::Pool(Box::new(l)));
    }
    let image = req.image.clone();
    let warning = match authorize_in_place(node, &image)? {
        Some(v) => v.warning(&image),
        None => Some(format!(
            "{} is a bare image without a sw-pool manifest: it is mounted where it lies and nothing verifies or vouches for its content (build it as a pool with `sw-pool build` and sign it; to refuse bare images, set require_signature = true)",
            crate::exec::show(&image)
        )),
    };
    let mountpoint = match &req.mountpoint {
        Some(m) => m.clone(),
        None => {
            let info = ImageInfo::inspect(&image)?;
            let Some(pool) = info.pool else {
                return Err(LoadError::BareNeedsMountpoint { image }.into());
            };
            node.default_mountpoint(&pool.name, &pool.version)?
        }
    };
    let acquired = state::acquire(
        node.sys,
        &node.state,
        &AcquireRequest {
            image,
            mountpoint,
            options: req.options,
            job_id: req.job_id.clone(),
            timeout: req.timeout,
            once_per_job: false,
            source: None,
        },
    )?;
    Ok(MountOutcome::InPlace {
        acquired: Box::new(acquired),
        warning,
    })
}

/// A sw-pool pool (a file with a manifest), as opposed to a bare image; a damaged trailer is an
/// error, not a bare image.
fn is_pool(image: &Path) -> Result<bool, Error> {
    match Pool::open(image) {
        Ok(_) => Ok(true),
        Err(ManifestError::NotAPool { .. } | ManifestError::NoTrailer { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// `--pool LIST` at submission (the SPANK plugin): each entry must resolve to a pool that the
/// trust policy accepts, else the submission fails with the reason. Returns the verdicts'
/// warnings, each naming its entry.
pub fn check_pools(node: &NodeContext, list: &str) -> Result<Vec<String>, Error> {
    let specs = crate::slurm::parse_load_var(list);
    if specs.is_empty() {
        return Err(LoadError::NoPoolsGiven.into());
    }
    let mut warnings = Vec::new();
    for spec in specs {
        let ctx = |e: Error| LoadError::PoolEntry {
            spec: spec.clone(),
            source: Box::new(e),
        };
        let src = super::resolve(Path::new(&spec), &node.cfg.pool_path.value).map_err(ctx)?;
        let verdict = authorize_in_place(node, &src).map_err(ctx)?;
        if let Some(w) = verdict.as_ref().and_then(|v| v.warning(&src)) {
            warnings.push(format!("--pool={spec}: {w}"));
        }
    }
    Ok(warnings)
}
