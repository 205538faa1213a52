//! `sw-pool cleanup`: what a job left behind, stale mounts, or everything of the caller on this node
//! (like `umount_all_images.py` / `cleanup_images.py` of the University of Oslo disk-image tools). As root with `--user`, it runs itself as
//! that user: user mounts are unmounted and user helpers signalled by their owner, never by root.

use swpool_core::config::Environment;
use swpool_core::slurm::valid_job_id;
use swpool_core::state::{self, Action, Selection};
use swpool_core::users::{self, hostname};
use swpool_core::{Error, ExitStatus};

use crate::cli::{CleanupArgs, GlobalArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: CleanupArgs, env: &Environment) -> Result<(), Error> {
    if a.job.is_none() && !a.stale && !a.all {
        return Err(Error::other(
            ExitStatus::Usage,
            "say what to clean: --job JOB_ID, --stale or --all (add --dry-run to see it first)",
        ));
    }
    if let Some(j) = &a.job {
        if !valid_job_id(j) {
            return Err(Error::other(
                ExitStatus::BadInput,
                format!("--job {j:?} is not a Slurm job id"),
            ));
        }
    }
    let sel = Selection {
        job: a.job.clone(),
        stale: a.stale,
        all: a.all,
        kill: a.kill,
        dry_run: a.dry_run,
    };
    let euid = rustix::process::geteuid().as_raw();
    if let Some(u) = &a.user {
        if euid != 0 {
            return Err(Error::other(
                ExitStatus::Usage,
                "--user needs root (as a user, `sw-pool cleanup` cleans your own mounts)",
            ));
        }
        let uid = uid_of(u)?;
        if uid != 0 {
            let flags: &[&str] = if a.json { &["--json"] } else { &[] };
            let st = state::clean_as(uid, None, &sel, flags, &[], env)?;
            std::process::exit(st);
        }
    }
    let p = Printer::new(g, a.json);
    let sys = swpool_core::mount::RealSys::new(env.path_var());
    let cfg = super::config(env)?;
    let places = state::NodePlaces {
        cache_dir: cfg.cache_dir.value.as_deref(),
        mount_helper: cfg.mount_helper.value.as_deref(),
    };
    let actions = state::clean_node(&sys, euid, &sel, &places, env)?;
    report(&p, &actions, a.dry_run);
    p.json(&serde_json::json!({
        "node": hostname(),
        "dry_run": a.dry_run,
        "actions": actions,
    }));
    let failed: Vec<&Action> = actions.iter().filter(|x| x.action == "failed").collect();
    if !failed.is_empty() {
        return Err(Error::other(
            ExitStatus::System,
            format!(
                "{} thing(s) could not be cleaned on {}: {}",
                failed.len(),
                hostname(),
                failed
                    .iter()
                    .map(|x| format!("{}: {}", x.mount_point.display(), x.detail))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ));
    }
    Ok(())
}

/// One line per action (`would …` in a dry run).
pub fn report(p: &Printer, actions: &[Action], dry_run: bool) {
    if actions.is_empty() {
        p.result(format!("nothing to clean on {}", hostname()));
        return;
    }
    for x in actions {
        p.result(format!(
            "{}{:<14} {:<20} {}{}{}",
            if dry_run { "would: " } else { "" },
            x.action,
            x.pool,
            x.mount_point.display(),
            if x.detail.is_empty() { "" } else { ": " },
            x.detail
        ));
    }
}

/// A user name or number to a uid (names through the user database: NSS).
pub fn uid_of(u: &str) -> Result<u32, Error> {
    users::uid_of(u).map_err(|e| Error::other(ExitStatus::BadInput, e.to_string()))
}
