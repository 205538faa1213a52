use swpool_core::config::Environment;
use swpool_core::mount::{describe_holders, RealSys};
use swpool_core::state::{self, StateDir};
use swpool_core::Error;

use crate::cli::{GlobalArgs, UmountArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: UmountArgs, env: &Environment) -> Result<(), Error> {
    if a.shadow {
        return super::shadow::umount(g, &a, env);
    }
    let p = Printer::new(g, a.json);
    let dir = StateDir::open_default(env)?;
    let sys = RealSys::new(env.path_var());
    let job = super::mount::job_id(a.job_id, env);
    // a mount point, or the pool (NAME/VERSION, a pool file) mounted at its default place
    let uid = rustix::process::geteuid().as_raw();
    let mp = swpool_core::load::named_mountpoint(
        &a.mountpoint,
        || Ok(super::config(env)?.mount_dir.value),
        uid,
        env,
    )?;
    let r = state::release(&sys, &dir, &mp, a.force, job.as_deref())?;
    let label = r
        .record
        .as_ref()
        .map(|r| r.label())
        .unwrap_or_else(|| "unrecorded mount".into());
    match &r.unmounted {
        None if r.remaining > 0 => p.result(format!(
            "{} at {} is still used ({} reference{} left); not unmounted",
            label,
            r.mount_point.display(),
            r.remaining,
            if r.remaining == 1 { "" } else { "s" }
        )),
        None => p.result(format!(
            "{} at {} was not mounted any more; record removed",
            label,
            r.mount_point.display()
        )),
        Some(u) => {
            if u.lazy {
                p.warn(format!(
                    "{} was busy and has been detached lazily; it disappears when these let go: {}",
                    r.mount_point.display(),
                    describe_holders(&u.holders, 0)
                ));
            }
            p.result(format!(
                "unmounted {} from {}{}",
                label,
                r.mount_point.display(),
                if u.was_stale {
                    " (it was stale: its FUSE process had died)"
                } else {
                    ""
                }
            ));
        }
    }
    p.json(&serde_json::to_value(&r).expect("json"));
    Ok(())
}
