//! `sw-pool mount IMAGE [MOUNTPOINT]` on one node, as a use case: a pool is loaded (checked
//! against the trust policy, copied into the node-local cache verifying every chunk, mounted from
//! there), a bare image is mounted where it lies (when the policy accepts unsigned images).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{authorize_in_place, load, LoadRequest, Loaded, NodeContext, Quiet};
use crate::error::{Error, LoadError};
use crate::mount::{ImageInfo, MountOptions};
use crate::pool::{ManifestError, Pool};
use crate::state::{AcquireRequest, Acquired};
use crate::userimage::lease;
use crate::ExitStatus;

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
    /// A pool served from where it lies through the verifying chunk server (no copy).
    pub in_place: bool,
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
    if req.options.writable() {
        return Err(Error::other(
            ExitStatus::BadInput,
            format!(
                "{}: rw: pools and images are mounted read-only; a user image is mounted read-write \
                 under its lease with `sw-pool mount --rw IMG DIR`",
                req.image.display()
            ),
        ));
    }
    let spec = req.image.to_string_lossy().into_owned();
    let by_name =
        std::fs::symlink_metadata(&req.image).is_err() && crate::pool::spec::is_pool_spec(&spec);
    if req.in_place {
        return mount_in_place(node, req);
    }
    // A pool (NAME/VERSION, or a file with a manifest) is never mounted where it lies: a mounted
    // pool serves only bytes its manifest vouches for, also when the file it came from is changed
    // after the mount. Only a bare image (no manifest, nothing to verify against) is mounted in
    // place, and only when the policy accepts unsigned images.
    if by_name || is_pool(&req.image)? {
        let l = load(
            &crate::Job::single(),
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
    let warning = if let Some(why) = own_data_image(node, &image) {
        // the caller's own data: outside the trust policy, which covers pools (SECURITY.md)
        Some(format!(
            "{} is a bare image of yours ({why}): mounted read-only where it lies as your own data; the trust policy covers pools, not your own images",
            crate::exec::show(&image)
        ))
    } else {
        match authorize_in_place(node, &image)? {
            Some(v) => v.warning(&image),
            None => Some(format!(
            "{} is a bare image without a sw-pool manifest: it is mounted where it lies and nothing verifies or vouches for its content (build it as a pool with `sw-pool build` and sign it; to refuse bare images, set require_signature = true)",
                crate::exec::show(&image)
            )),
        }
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
    // an ext image mounted read-only is a reader of a user image: it holds a read-only lease, so
    // that no node mounts it read-write meanwhile (and it is refused while one does)
    let (lease, notes) = read_lease(node, &image, &mountpoint, req.job_id.clone())?;
    let mut acquired = super::mount_rw::acquire_leased(
        node.sys,
        &node.state,
        &AcquireRequest {
            image,
            mountpoint,
            options: req.options,
            job_id: req.job_id.clone(),
            timeout: req.timeout,
            once_per_job: false,
            shell: None,
            source: None,
            lease,
            serve: None,
            reader: node.cfg.fuse_reader.value,
        },
    )?;
    acquired.notes.extend(notes);
    Ok(MountOutcome::InPlace {
        acquired: Box::new(acquired),
        warning,
    })
}

/// `mount --in-place POOL [DIR]`: the pool file where it lies, served through the verifying chunk
/// server (every chunk hashed against the manifest the trust policy accepted before any byte of it
/// is served); nothing is copied. A bare image has no manifest to verify against: refused.
fn mount_in_place(node: &NodeContext, req: &MountRequest) -> Result<MountOutcome, Error> {
    let pool = super::resolve(&req.image, &node.cfg.pool_path.value)?;
    // the trailer read once: pool or bare image, its manifest, the policy's verdict
    let (opened, verdict) = match super::open_authorized(node, &pool) {
        Err(Error::Manifest(ManifestError::NotAPool { .. } | ManifestError::NoTrailer { .. })) => {
            return Err(Error::other(
                ExitStatus::BadInput,
                format!(
                    "{}: --in-place serves a pool, chunk by chunk against its manifest, and this \
                     is a bare image without one: mount it without --in-place (it is mounted where \
                     it lies), or build it as a pool with `sw-pool build`",
                    crate::exec::show(&pool)
                ),
            ))
        }
        r => r?,
    };
    let id = opened.manifest;
    let mountpoint = match &req.mountpoint {
        Some(m) => super::explicit_mountpoint(m)?,
        None => node.default_mountpoint(&id.name, &id.version)?,
    };
    let acquired = crate::state::acquire(
        node.sys,
        &node.state,
        &AcquireRequest {
            image: pool.clone(),
            mountpoint,
            options: req.options,
            job_id: req.job_id.clone(),
            timeout: req.timeout,
            once_per_job: false,
            shell: None,
            source: Some(pool.clone()),
            lease: None,
            serve: Some(crate::mount::serve::InPlace {
                digest: id.digest,
                keep: None,
                source: None,
            }),
            reader: node.cfg.fuse_reader.value,
        },
    )?;
    Ok(MountOutcome::InPlace {
        acquired: Box::new(acquired),
        warning: verdict.warning(&pool),
    })
}

/// The caller's own data image, which the trust policy does not cover (SECURITY.md, "What the
/// trust policy covers"): a bare image (no manifest) that is a regular file owned by the caller,
/// writable by no one else (no group or other write bit), and not inside a `pool_path` directory
/// (where pools shared with others are published). Its owner could mount it read-write
/// (`mount --rw`); mounting it read-only (FUSE, as the caller, `nosuid,nodev`) trusts nothing more.
/// Returns why it counts as the caller's, or `None`: then the trust policy decides.
fn own_data_image(node: &NodeContext, image: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(image).ok()?;
    if !meta.is_file() || meta.uid() != node.uid || meta.mode() & 0o022 != 0 {
        return None;
    }
    if is_pool(image).ok()? {
        return None;
    }
    let real = std::fs::canonicalize(image).ok()?;
    let published = node.cfg.pool_path.value.iter().any(|dir| {
        std::fs::canonicalize(dir).is_ok_and(|d| real.starts_with(d)) || real.starts_with(dir)
    });
    if published {
        return None;
    }
    Some(format!(
        "owned by uid {}, writable by no one else, not on pool_path",
        node.uid
    ))
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

/// The read-only lease of an ext image mounted in place (`None` for squashfs, which is never
/// written). Where the image's directory is not writable (another user's data set), no lease can
/// be recorded: the mount goes ahead with a note saying that a writer elsewhere would not know.
fn read_lease(
    node: &NodeContext,
    image: &std::path::Path,
    mountpoint: &std::path::Path,
    job: Option<String>,
) -> Result<(Option<lease::Holder>, Vec<String>), Error> {
    if !crate::image::detect(image).is_ok_and(|f| f.is_ext()) {
        return Ok((None, Vec::new()));
    }
    let mp = crate::mount::canonical_mountpoint(mountpoint)?;
    let h = lease::Holder::here(lease::Mode::Ro, &mp, job);
    let live = lease::RealLiveness::here(node.env.path_var());
    match lease::take(image, &h, &live) {
        Ok(t) => Ok((
            Some(h),
            t.dropped
                .iter()
                .map(|(d, why)| format!("dropped a gone holder of {}: {} ({why})", image.display(), d.describe()))
                .collect(),
        )),
        Err(lease::LeaseError::Io { path, source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied
                || source.raw_os_error() == Some(rustix::io::Errno::ROFS.raw_os_error()) =>
        {
            Ok((
                None,
                vec![format!(
                    "no read-only lease recorded beside {} ({}: {source}): a read-write mount elsewhere would not know of this one",
                    image.display(),
                    path.display()
                )],
            ))
        }
        Err(e) => Err(crate::userimage::UserImageError::from(e).into()),
    }
}
