//! `sw-pool cleanup`: what a job left behind, stale mounts, or everything of the caller on this node
//! (like `umount_all_images.py` / `cleanup_images.py` of the University of Oslo disk-image tools). As root with `--user`, it runs itself as
//! that user: user mounts are unmounted and user helpers signalled by their owner, never by root.

use swpool_core::config::EnvVar;
use swpool_core::mount::RealSys;
use swpool_core::slurm::{self, valid_job_id};
use swpool_core::state::{self, Action, Selection, StateDir};
use swpool_core::users::{self, hostname};
use swpool_core::{Error, ExitStatus};

use crate::cli::{CleanupArgs, GlobalArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: CleanupArgs) -> Result<(), Error> {
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
            let mut args: Vec<String> = Vec::new();
            if let Some(j) = &a.job {
                args.extend(["--job".into(), j.clone()]);
            }
            for (f, on) in [
                ("--stale", a.stale),
                ("--all", a.all),
                ("--kill", a.kill),
                ("--dry-run", a.dry_run),
                ("--json", a.json),
            ] {
                if on {
                    args.push(f.into());
                }
            }
            let st = as_user(uid, None, "cleanup", &args, &[])?;
            std::process::exit(st);
        }
    }
    let sel = Selection {
        job: a.job.clone(),
        stale: a.stale,
        all: a.all,
        kill: a.kill,
        dry_run: a.dry_run,
    };
    let p = Printer::new(g, a.json);
    let actions = clean_all_stores(euid, &sel, a.job.as_deref())?;
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

/// Clean every store this user's mounts may be recorded in on this node; log each action to syslog.
pub fn clean_all_stores(
    uid: u32,
    sel: &Selection,
    job: Option<&str>,
) -> Result<Vec<Action>, Error> {
    let sys = RealSys::new();
    let mut dirs = state::candidate_dirs(uid);
    if dirs.is_empty() {
        dirs.push(StateDir::default_path(uid)); // unrecorded mounts are still found
    }
    let mut actions = Vec::new();
    for d in dirs {
        let dir = StateDir::open(&d, uid)?;
        actions.extend(state::clean(&sys, &dir, sel)?);
    }
    if !sel.dry_run {
        let user = users::name_of(uid);
        for x in &actions {
            let jobs = if x.jobs.is_empty() {
                job.map(String::from).unwrap_or_else(|| "-".into())
            } else {
                x.jobs.join(",")
            };
            slurm::syslog(
                if x.action == "failed" {
                    swpool_core::slurm::Level::Error
                } else {
                    swpool_core::slurm::Level::Notice
                },
                &format!(
                    "job={jobs} user={user} node={} {} {} at {}{}{}",
                    hostname(),
                    x.action,
                    x.pool,
                    x.mount_point.display(),
                    if x.detail.is_empty() { "" } else { ": " },
                    x.detail
                ),
            );
        }
    }
    Ok(actions)
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

/// Run `sw-pool SUB ARGS` as `uid` with a clean environment: PATH, HOME, USER, LOGNAME, plus
/// `extra`. Returns its exit status.
///
/// The user comes from the user database (NSS); the primary group is `gid` (Slurm's job gid) or the
/// user's own, never one made up. No supplementary groups: the cleanup only touches what the uid
/// owns (its state directories, its FUSE mounts and helpers). The child checks after switching that
/// it is not root and has exactly these ids, else it does not run (see [`users::Credentials`]).
pub fn as_user(
    uid: u32,
    gid: Option<u32>,
    sub: &str,
    args: &[String],
    extra: &[(&str, String)],
) -> Result<i32, Error> {
    let who = users::by_uid(uid).map_err(|e| {
        Error::other(
            ExitStatus::System,
            format!("cannot run sw-pool {sub} as uid {uid}: {e}"),
        )
    })?;
    let gid = gid.unwrap_or(who.gid);
    let creds = users::Credentials::without_groups(uid, gid)
        .map_err(|e| Error::other(ExitStatus::System, format!("sw-pool {sub}: {e}")))?;
    let exe = std::env::current_exe().map_err(|e| {
        Error::other(
            ExitStatus::System,
            format!("cannot find our own executable: {e}"),
        )
    })?;
    let user = who.name;
    let mut c = std::process::Command::new(&exe);
    c.arg(sub)
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", &who.home)
        .env("USER", &user)
        .env("LOGNAME", &user)
        .current_dir("/");
    creds.apply_to(&mut c);
    if let Some(v) = EnvVar::SystemConfig.get_os() {
        c.env(EnvVar::SystemConfig.name(), v);
    }
    if let Some(v) = std::env::var_os("RUST_LOG") {
        c.env("RUST_LOG", v);
    }
    for (k, v) in extra {
        c.env(k, v);
    }
    tracing::debug!(
        "as uid {uid} gid {gid}: {} {sub} {}",
        exe.display(),
        args.join(" ")
    );
    let st = c.status().map_err(|e| {
        Error::other(
            ExitStatus::System,
            format!(
                "cannot run {} as uid {uid}: {}",
                exe.display(),
                creds.explain(&e)
            ),
        )
    })?;
    Ok(st
        .code()
        .unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0)))
}
