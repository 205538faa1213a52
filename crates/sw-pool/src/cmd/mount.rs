use std::time::Duration;

use swpool_core::load::{LoadRequest, NodeContext, Quiet};
use swpool_core::mount::{paths, ImageInfo, MountOptions, RealSys};
use swpool_core::state::{self, AcquireRequest, StateDir};
use swpool_core::transfer::Job;
use swpool_core::Error;

use crate::cli::{GlobalArgs, MountArgs};
use crate::output::Printer;

/// `--job-id`, else `$SLURM_JOB_ID`.
pub fn job_id(flag: Option<String>) -> Option<String> {
    flag.or_else(|| std::env::var("SLURM_JOB_ID").ok())
        .filter(|j| !j.is_empty())
}

pub fn run(g: &GlobalArgs, a: MountArgs) -> Result<(), Error> {
    let mut p = Printer::new(g, a.json);
    if a.print_mountpoint {
        p.verbosity = crate::output::Verbosity::Quiet; // stdout is the mount point only
    }
    let options = MountOptions::parse(a.options.as_deref())?;
    let cfg = super::config()?;
    let uid = rustix::process::geteuid().as_raw();
    let sys = RealSys::new();
    let node = NodeContext::real(&cfg, &sys)?;
    let spec = a.image.to_string_lossy().into_owned();
    let by_name = std::fs::symlink_metadata(&a.image).is_err()
        && swpool_core::pool::spec::is_pool_spec(&spec);
    // A pool (NAME/VERSION, or a file with a manifest) is never mounted where it lies: the load
    // pipeline on this node checks it against the trust policy, copies it into the node-local
    // cache verifying every chunk against its manifest, and mounts that read-only copy. A mounted
    // pool thus serves only bytes its manifest vouches for, also when the file it came from is
    // changed after the mount. Only a bare image (no manifest, nothing to verify against) is
    // mounted in place, and only when the policy accepts unsigned images.
    if by_name || is_pool(&a.image)? {
        let req = LoadRequest {
            pool: a.image.clone(),
            mountpoint: a.mountpoint.clone(),
            job_id: job_id(a.job_id.clone()),
            timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
            ..LoadRequest::default()
        };
        let l = swpool_core::load::load(&Job::single(), &node, &req, &Quiet)?;
        if let Some(w) = l.plan.verdict.warning(&l.plan.src) {
            p.warn(w);
        }
        if a.print_mountpoint {
            println!("{}", l.mount_point.display());
        }
        print_mounted(&p, &l.record, l.reused, l.timings.mount.as_secs_f64());
        p.verbose(format!(
            "verified   {} (copied into {})",
            l.plan.src.display(),
            l.plan.dest.display()
        ));
        p.json(&serde_json::json!({
            "record": l.record,
            "reused": l.reused,
            "mount_seconds": l.timings.mount.as_secs_f64(),
            "notes": [],
            "load": l.report(1),
        }));
        return Ok(());
    }
    let image = a.image.clone();
    match swpool_core::load::authorize_in_place(&node, &image)? {
        Some(v) => {
            if let Some(w) = v.warning(&image) {
                p.warn(w);
            }
        }
        None => p.warn(format!(
            "{} is a bare image without a sw-pool manifest: it is mounted where it lies and nothing verifies or vouches for its content (build it as a pool with `sw-pool build` and sign it; to refuse bare images, set require_signature = true)",
            swpool_core::exec::show(&image)
        )),
    }
    let mountpoint = match a.mountpoint {
        Some(m) => m,
        None => {
            let info = ImageInfo::inspect(&image)?;
            let Some(pool) = info.pool else {
                return Err(Error::other(
                    swpool_core::ExitStatus::BadInput,
                    format!(
                        "{} is a bare image without a sw-pool manifest: give a MOUNTPOINT",
                        image.display()
                    ),
                ));
            };
            let root = paths::default_mount_dir(cfg.mount_dir.value.as_deref(), uid);
            paths::create_mountpoint(&root, &pool.name, &pool.version, uid)?
        }
    };
    let dir = StateDir::open_default()?;
    let req = AcquireRequest {
        image,
        mountpoint,
        options,
        job_id: job_id(a.job_id),
        timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
        once_per_job: false,
        source: None,
    };
    let r = state::acquire(&sys, &dir, &req)?;
    for n in &r.notes {
        p.warn(n);
    }
    if a.print_mountpoint {
        println!("{}", r.record.mount_point.display());
    }
    print_mounted(&p, &r.record, r.reused, r.mount_seconds);
    p.json(&serde_json::to_value(&r).expect("json"));
    Ok(())
}

/// A sw-pool pool (a file with a manifest), as opposed to a bare image; a damaged trailer is an
/// error, not a bare image.
fn is_pool(image: &std::path::Path) -> Result<bool, Error> {
    use swpool_core::pool::{ManifestError, Pool};
    match Pool::open(image) {
        Ok(_) => Ok(true),
        Err(ManifestError::NotAPool { .. } | ManifestError::NoTrailer { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The result line of a mount (the same for a pool file and for NAME/VERSION).
fn print_mounted(p: &Printer, rec: &swpool_core::state::Record, reused: bool, seconds: f64) {
    if reused {
        p.result(format!(
            "{} is already mounted at {}: reference added (now {})",
            rec.label(),
            rec.mount_point.display(),
            rec.refcount()
        ));
    } else {
        p.result(format!(
            "mounted {} ({}, {} pid {}) at {}",
            rec.label(),
            rec.format,
            rec.backend,
            rec.helper_pid,
            rec.mount_point.display()
        ));
        p.verbose(format!("mount      {seconds:.3} s"));
    }
    if let Some(pool) = &rec.pool {
        p.verbose(format!("digest     {}", pool.digest));
    }
}
