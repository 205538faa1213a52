use std::time::Duration;

use swpool_core::config::{Environment, HostVar};
use swpool_core::load::{mount_image, MountOutcome, MountRequest, NodeContext};
use swpool_core::mount::{MountOptions, RealSys};
use swpool_core::Error;

use crate::cli::{GlobalArgs, MountArgs};
use crate::output::Printer;

/// `--job-id`, else `$SLURM_JOB_ID` (in `env`).
pub fn job_id(flag: Option<String>, env: &Environment) -> Option<String> {
    flag.or_else(|| env.get(HostVar::SlurmJobId))
        .filter(|j| !j.is_empty())
}

pub fn run(g: &GlobalArgs, a: MountArgs, env: &Environment) -> Result<(), Error> {
    if a.shadow {
        return super::shadow::mount(g, &a, env);
    }
    let mut p = Printer::new(g, a.json);
    // stdout is the mount point only; warnings go to stderr as ever (the pool modulefile shows them)
    p.stdout_taken = a.print_mountpoint;
    // `mount DIR POOL`: the arguments swapped (issue 32, point 8)
    if let Some(m) = a
        .mountpoint
        .as_ref()
        .filter(|m| m.is_file() && a.image.is_dir())
    {
        return Err(Error::other(
            swpool_core::ExitStatus::Usage,
            format!(
                "{} is a directory and {} a file: the pool comes first, then the mount point: \
                 `sw-pool mount {} {}`",
                a.image.display(),
                m.display(),
                m.display(),
                a.image.display()
            ),
        ));
    }
    let options = MountOptions::parse(a.options.as_deref())?;
    if a.rw || options.writable() {
        return mount_rw(&a, env, &p);
    }
    let cfg = super::config(env)?;
    let sys = RealSys::new(env.path_var());
    let node = NodeContext::real(&cfg, env, &sys)?;
    // a pool is copied (verified) into the node-local cache before it is mounted: a bar for it
    let bar = crate::output::progress(!a.json && !g.quiet && !a.print_mountpoint);
    let req = MountRequest {
        image: a.image.clone(),
        mountpoint: a.mountpoint.clone(),
        options,
        job_id: job_id(a.job_id.clone(), env),
        timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
        progress: bar.as_ref().map(crate::output::progress_sink),
        in_place: a.in_place,
    };
    let outcome = mount_image(&node, &req);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match outcome? {
        MountOutcome::Pool(l) => {
            if let Some(w) = super::trust_warning(env, &l.plan) {
                p.warn(w);
            }
            if a.print_mountpoint {
                crate::output::outln(&l.mount_point.display().to_string());
            }
            print_mounted(&p, &l.record, l.reused, l.timings.mount.as_secs_f64());
            // where the copy went (it takes the pool's size on this node's disk); nothing to say
            // when the mount itself was there already (a reference added)
            if !l.reused {
                p.result(format!(
                    "{} {} into the node-local cache: {}",
                    if l.copy.skipped_all {
                        "reused the verified copy of"
                    } else {
                        "verified and copied"
                    },
                    l.plan.src.display(),
                    l.plan.dest.display()
                ));
            }
            p.json(&serde_json::json!({
                "record": l.record,
                "reused": l.reused,
                "mount_seconds": l.timings.mount.as_secs_f64(),
                "notes": [],
                "load": l.report(1),
            }));
        }
        MountOutcome::InPlace {
            acquired: r,
            warning,
        } => {
            if let Some(w) = warning {
                p.warn(w);
            }
            for n in &r.notes {
                p.warn(n);
            }
            if a.print_mountpoint {
                crate::output::outln(&r.record.mount_point.display().to_string());
            }
            print_mounted(&p, &r.record, r.reused, r.mount_seconds);
            p.json(&serde_json::to_value(&r).expect("json"));
        }
    }
    Ok(())
}

/// `mount --rw IMG DIR`: a user image, read-write on this node under its lease.
fn mount_rw(a: &MountArgs, env: &Environment, p: &Printer) -> Result<(), Error> {
    let Some(mountpoint) = a.mountpoint.clone() else {
        return Err(Error::other(
            swpool_core::ExitStatus::Usage,
            format!(
                "--rw needs the mount point: `sw-pool mount --rw {} DIR`",
                a.image.display()
            ),
        ));
    };
    let sys = RealSys::new(env.path_var());
    let dir = swpool_core::state::StateDir::open_default(env)?;
    let req = swpool_core::load::MountRw {
        image: a.image.clone(),
        mountpoint,
        job_id: job_id(a.job_id.clone(), env),
        timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
    };
    let (r, taken, report) = if a.kernel {
        let cfg = super::config(env)?;
        let Some(helper) = cfg.mount_helper.value.clone() else {
            return Err(Error::other(
                swpool_core::ExitStatus::BadInput,
                "--kernel mounts through the site's mount helper, and none is configured here \
                 (config key mount_helper); without --kernel the image is mounted with fuse2fs",
            ));
        };
        swpool_core::load::mount_rw_kernel(
            &sys,
            &dir,
            &req,
            &helper,
            &super::image::liveness(env),
            env.path_var(),
        )?
    } else {
        swpool_core::load::mount_rw(
            &sys,
            &dir,
            &req,
            &super::image::liveness(env),
            env.path_var(),
        )?
    };
    for (h, why) in &taken.dropped {
        p.warn(format!(
            "took over the lease of {} from {} ({why})",
            a.image.display(),
            h.describe()
        ));
    }
    // e2fsck -p says what it replayed or fixed only when it did something
    if report.contains("recovering journal") || report.contains("FIXED") {
        p.warn(format!(
            "{} was not unmounted cleanly last time; e2fsck replayed its journal: {}",
            a.image.display(),
            report.trim().replace('\n', "; ")
        ));
    }
    for n in &r.notes {
        p.warn(n);
    }
    if a.print_mountpoint {
        crate::output::outln(&r.record.mount_point.display().to_string());
    }
    print_mounted(p, &r.record, r.reused, r.mount_seconds);
    if !r.reused {
        p.result("read-write on this node; other nodes may not mount it until `sw-pool umount`");
    }
    p.json(&serde_json::to_value(&r).expect("json"));
    Ok(())
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
    } else if let (Some(swpool_core::state::Serving::ChunkServer { pid, .. }), true) = (
        &rec.serving,
        rec.backend == swpool_core::mount::Backend::SwPoolTree,
    ) {
        p.result(format!(
            "mounted {} ({}, sw-pool-serve pid {pid}, one hop) at {}: served in place from {}, \
             each chunk verified on first read; nothing copied",
            rec.label(),
            rec.format,
            rec.mount_point.display(),
            rec.image.display()
        ));
        p.verbose(format!("mount      {seconds:.3} s"));
    } else if let Some(swpool_core::state::Serving::ChunkServer { pid, .. }) = &rec.serving {
        p.result(format!(
            "mounted {} ({}, {} under sw-pool-serve pid {pid}) at {}: served in place from {}, \
             each chunk verified on first read; nothing copied",
            rec.label(),
            rec.format,
            rec.backend,
            rec.mount_point.display(),
            rec.image.display()
        ));
        p.verbose(format!("mount      {seconds:.3} s"));
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
