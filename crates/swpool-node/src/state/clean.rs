//! Clean-up of a node's mounts and records: what a job leaves behind (the Slurm epilog,
//! `sw-pool cleanup --job`), what crashed (`--stale`: FUSE helpers that died, records without a
//! mount, mounts whose writer was killed before the record was complete), or everything (`--all`).
//!
//! Everything happens under the store's lock, so a `load` on the same node either finished before
//! or starts after. A mount shared with other jobs only loses the selected job's references. Only
//! processes proven to be ours are signalled: a FUSE helper whose `/proc` entry shows our uid, a
//! helper command line and the mount point; with `kill`, processes that hold the mount (named
//! first, by PID, never PID 1 and never ourselves).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::{Record, Serving, StateDir, StateError};
use crate::config::Environment;
use crate::mount::{self, MountError, MountState, Sys};

/// What to clean.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Drop this job's references (the last one unmounts).
    pub job: Option<String>,
    /// Stale FUSE mounts, records without a mount, interrupted mounts.
    pub stale: bool,
    /// Everything of this user on this node.
    pub all: bool,
    /// End the processes that keep a mount busy (after naming them) instead of detaching lazily.
    pub kill: bool,
    /// Say what would be done; change nothing.
    pub dry_run: bool,
}

impl Selection {
    /// The `sw-pool cleanup` arguments that select the same.
    pub fn cleanup_args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        if let Some(j) = &self.job {
            args.extend(["--job".into(), j.clone()]);
        }
        for (f, on) in [
            ("--stale", self.stale),
            ("--all", self.all),
            ("--kill", self.kill),
            ("--dry-run", self.dry_run),
        ] {
            if on {
                args.push(f.into());
            }
        }
        args
    }
}

/// Root cleans for user `uid` by running `sw-pool cleanup` as that user (no supplementary groups,
/// a clean environment plus `env`; [`crate::users::run_self_as`]): the user's mounts are unmounted
/// and the user's helpers signalled by their owner, never by root. `flags` go first (`-q`,
/// `--json`). Returns its exit status.
pub fn clean_as(
    uid: u32,
    gid: Option<u32>,
    sel: &Selection,
    flags: &[&str],
    extra: &[(&str, String)],
    env: &crate::config::Environment,
) -> Result<i32, crate::users::UserError> {
    let mut args: Vec<String> = flags.iter().map(|f| f.to_string()).collect();
    args.extend(sel.cleanup_args());
    crate::users::run_self_as(uid, gid, "cleanup", &args, extra, env)
}

/// One thing done (or, in a dry run, to be done).
#[derive(Debug, Clone, Serialize)]
pub struct Action {
    pub mount_point: PathBuf,
    /// `name/version` or the image's file name; `-` for a mount without a record.
    pub pool: String,
    pub jobs: Vec<String>,
    /// `released`, `unmounted`, `record-removed`, `helper-killed`, `holder-killed`, `socket-removed`
    /// and `upper-removed` (an environment's, `sw-pool cleanup`), `failed`.
    pub action: &'static str,
    pub detail: String,
    pub done: bool,
}

fn act(
    out: &mut Vec<Action>,
    sel: &Selection,
    mp: &Path,
    pool: &str,
    jobs: Vec<String>,
    action: &'static str,
    detail: String,
) {
    out.push(Action {
        mount_point: mp.to_path_buf(),
        pool: pool.to_string(),
        jobs,
        action,
        detail,
        done: !sel.dry_run,
    });
}

/// Clean this node's mounts and records of the store's user as `sel` says.
pub fn clean(sys: &dyn Sys, dir: &StateDir, sel: &Selection) -> Result<Vec<Action>, StateError> {
    let _lock = dir.lock()?;
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    let me = sys.euid();
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in dir.records()? {
        let rec = match r {
            Ok(r) => r,
            Err(e) => {
                if sel.all || sel.stale {
                    let path = match &e {
                        StateError::Corrupt { path, .. } => path.clone(),
                        _ => dir.path().to_path_buf(),
                    };
                    act(
                        &mut out,
                        &Selection {
                            dry_run: true,
                            ..sel.clone()
                        },
                        &path,
                        "-",
                        vec![],
                        "failed",
                        format!("{e}: left for an admin to inspect"),
                    );
                }
                continue;
            }
        };
        seen.insert(rec.mount_point.clone());
        if let Some(Serving::ChunkServer { dir: Some(d), .. }) = &rec.serving {
            // the chunk server's own mount goes with its record's (Record::release_server)
            seen.insert(d.clone());
        }
        clean_record(sys, dir, sel, &mounts, rec, &mut out)?;
    }
    // FUSE mounts of ours without a record
    for m in &mounts {
        if !(m.is_swpool_helper() && m.fuse_user_id() == Some(me)) || seen.contains(&m.mount_point)
        {
            continue;
        }
        seen.insert(m.mount_point.clone());
        // only `--all` touches mounts no record of ours names (another store, another tool)
        if !sel.all {
            continue;
        }
        unmount_and_reap(
            sys,
            sel,
            &m.mount_point,
            "-",
            vec![],
            None,
            None,
            me,
            &mut out,
        );
    }
    // the sockets of on-demand servers that ended without removing them (SIGKILL, a cancelled
    // step), whose process is gone
    if sel.all || sel.stale || sel.job.is_some() {
        for (path, pid) in dead_server_sockets(sys, dir.path()) {
            if !sel.dry_run {
                let _ = std::fs::remove_file(&path);
            }
            act(
                &mut out,
                sel,
                &path,
                "-",
                vec![],
                "socket-removed",
                format!("the socket of an on-demand server that is gone (pid {pid})"),
            );
        }
    }
    Ok(out)
}

/// The on-demand servers' sockets in the store ([`StateDir::server_socket`]) whose process is not
/// running.
fn dead_server_sockets(sys: &dyn Sys, dir: &Path) -> Vec<(PathBuf, u32)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let pid = StateDir::server_socket_pid(e.file_name().to_str()?)?;
            (!sys.running(pid)).then(|| (e.path(), pid))
        })
        .collect()
}

fn clean_record(
    sys: &dyn Sys,
    dir: &StateDir,
    sel: &Selection,
    mounts: &[crate::mount::MountEntry],
    mut rec: Record,
    out: &mut Vec<Action>,
) -> Result<(), StateError> {
    if let Err(e) = rec.check_known() {
        let (mp, label, jobs) = (rec.mount_point.clone(), rec.label(), rec.job_ids());
        act(out, sel, &mp, &label, jobs, "failed", e.to_string());
        return Ok(());
    }
    // the record's key, and where its mount is now (a parent may have been renamed since)
    let key = rec.mount_point.clone();
    let mp = rec.located(mounts);
    let label = rec.label();
    let st = rec.mount_state(sys, mounts, &mp);
    let writer_dead = rec.pending && rec.refs.iter().all(|r| !sys.running(r.pid));
    let broken = st != MountState::Mounted || writer_dead;
    let of_job = sel
        .job
        .as_ref()
        .is_some_and(|j| rec.refs.iter().any(|r| r.job_id.as_deref() == Some(j)));
    let whole = sel.all || (sel.stale && broken);
    if !whole && !of_job {
        return Ok(());
    }
    let jobs = rec.job_ids();
    if !whole {
        let j = sel.job.as_deref().expect("of_job");
        let before = rec.refs.len();
        rec.refs.retain(|r| r.job_id.as_deref() != Some(j));
        let dropped = before - rec.refs.len();
        if !rec.refs.is_empty() && !broken {
            if !sel.dry_run {
                dir.write(&rec)?;
            }
            act(
                out,
                sel,
                &mp,
                &label,
                jobs,
                "released",
                format!(
                    "dropped {dropped} reference(s) of job {j}; stays mounted for {} other reference(s) ({})",
                    rec.refs.len(),
                    {
                        let o = rec.job_ids();
                        if o.is_empty() { "interactive".to_string() } else { format!("jobs {}", o.join(",")) }
                    }
                ),
            );
            return Ok(());
        }
    }
    if let Some(Serving::Kernel {
        helper: Some(h), ..
    }) = &rec.serving
    {
        // the site's mount helper holds it: a site pool mounted for every user (drop this user's
        // reference there, the job's or all of this user's; the helper unmounts after the last
        // user), or a user image it mounted for this user (`mount --rw --kernel`: it unmounts it)
        let done = match (&rec.pool, sel.dry_run) {
            (_, true) => Ok(()),
            (Some(p), false) => {
                let job = if whole { None } else { sel.job.as_deref() };
                super::helper_release(sys, h, p, job)
            }
            (None, false) if st != MountState::Absent => super::helper_umount(sys, h, &mp),
            (None, false) => Ok(()),
        };
        if let Err(e) = done {
            act(
                out,
                sel,
                &mp,
                &label,
                jobs,
                "failed",
                format!("the site's mount helper: {e}"),
            );
            return Ok(());
        }
    } else if st != MountState::Absent {
        let helper = (rec.helper_pid > 1).then_some(rec.helper_pid);
        let id = rec.mount_id;
        if !unmount_and_reap(
            sys,
            sel,
            &mp,
            &label,
            jobs.clone(),
            helper,
            id,
            rec.uid,
            out,
        ) {
            return Ok(()); // still mounted: keep the record that says so
        }
    } else if rec.helper_pid > 1 && sys.is_our_helper(rec.helper_pid, rec.uid, &mp) {
        reap_helper(sys, sel, &mp, &label, jobs.clone(), rec.helper_pid, out);
    }
    if !sel.dry_run {
        rec.release_server(sys);
        dir.remove(&key)?;
    }
    act(
        out,
        sel,
        &mp,
        &label,
        jobs,
        "record-removed",
        match (st, writer_dead) {
            (_, true) => "the mount was interrupted (its writer died)".into(),
            (MountState::Absent, _) => "recorded but not mounted".into(),
            (MountState::Stale, _) => "its FUSE helper had died (stale mount)".into(),
            (MountState::Mounted, _) => "no references left".into(),
        },
    );
    Ok(())
}

/// Unmount `mp` (naming and, with `kill`, ending what holds it; else detaching lazily), then make sure
/// its helper is gone. `false` when it stays mounted.
#[allow(clippy::too_many_arguments)]
fn unmount_and_reap(
    sys: &dyn Sys,
    sel: &Selection,
    mp: &Path,
    label: &str,
    jobs: Vec<String>,
    helper: Option<u32>,
    mount_id: Option<u32>,
    uid: u32,
    out: &mut Vec<Action>,
) -> bool {
    let me = std::process::id();
    if sel.kill {
        let (holders, hidden) = mount::proc::holders(mp);
        for h in holders.iter().filter(|h| h.pid > 1 && h.pid != me) {
            if Some(h.pid) == helper {
                continue;
            }
            if h.uid != Some(uid) && sys.euid() != 0 {
                continue;
            }
            let detail = format!(
                "pid {} ({}) held it: {}",
                h.pid,
                h.command,
                h.what.join(", ")
            );
            let r = if sel.dry_run {
                Ok(())
            } else {
                sys.terminate(h.pid, Duration::from_secs(3))
            };
            match r {
                Ok(()) => act(out, sel, mp, label, jobs.clone(), "holder-killed", detail),
                Err(e) => act(
                    out,
                    sel,
                    mp,
                    label,
                    jobs.clone(),
                    "failed",
                    format!("{detail}; {e}"),
                ),
            }
        }
        if hidden > 0 {
            act(
                out,
                sel,
                mp,
                label,
                jobs.clone(),
                "failed",
                format!("{hidden} process(es) we may not inspect may hold it"),
            );
        }
    }
    if sel.dry_run {
        act(
            out,
            sel,
            mp,
            label,
            jobs.clone(),
            "unmounted",
            String::new(),
        );
    } else {
        // by the record's mount ID (root), wherever a user moved the mount since `mp` was read
        match mount::unmount_identified(sys, mp, mount_id.map(|i| (i, uid)), true) {
            Ok(u) => act(
                out,
                sel,
                mp,
                label,
                jobs.clone(),
                "unmounted",
                if u.was_stale {
                    "stale mount detached".into()
                } else if u.lazy {
                    format!(
                        "busy: detached lazily ({})",
                        mount::describe_holders(&u.holders, 0)
                    )
                } else {
                    String::new()
                },
            ),
            Err(MountError::NotMounted { .. }) => {}
            Err(e) => {
                act(out, sel, mp, label, jobs, "failed", e.to_string());
                return false;
            }
        }
    }
    if let Some(pid) = helper {
        if sys.is_our_helper(pid, uid, mp) {
            // give a helper that was unmounted a moment to exit on its own
            let t = sys.now();
            while !sel.dry_run && sys.running(pid) && sys.now() - t < Duration::from_secs(2) {
                sys.sleep(Duration::from_millis(20));
            }
            if sys.running(pid) {
                reap_helper(sys, sel, mp, label, jobs, pid, out);
            }
        }
    }
    true
}

fn reap_helper(
    sys: &dyn Sys,
    sel: &Selection,
    mp: &Path,
    label: &str,
    jobs: Vec<String>,
    pid: u32,
    out: &mut Vec<Action>,
) {
    let r = if sel.dry_run {
        Ok(())
    } else {
        sys.terminate(pid, Duration::from_secs(2))
    };
    match r {
        Ok(()) => act(
            out,
            sel,
            mp,
            label,
            jobs,
            "helper-killed",
            format!("FUSE helper pid {pid} outlived its mount"),
        ),
        Err(e) => act(out, sel, mp, label, jobs, "failed", e),
    }
}

/// Clean every store this user's mounts may be recorded in on this node; log each action to syslog.
pub fn clean_all_stores(
    sys: &dyn Sys,
    uid: u32,
    sel: &Selection,
    job: Option<&str>,
    env: &Environment,
) -> Result<Vec<Action>, StateError> {
    let mut dirs = candidate_dirs(uid, env);
    if dirs.is_empty() {
        dirs.push(StateDir::default_path(uid, env)); // unrecorded mounts are still found
    }
    let mut actions = Vec::new();
    for d in dirs {
        let dir = StateDir::open(&d, uid)?;
        actions.extend(clean(sys, &dir, sel)?);
    }
    if !sel.dry_run {
        let user = crate::users::name_of(uid);
        for x in &actions {
            let jobs = if x.jobs.is_empty() {
                job.map(String::from).unwrap_or_else(|| "-".into())
            } else {
                x.jobs.join(",")
            };
            swpool_sys::syslog::syslog(
                if x.action == "failed" {
                    swpool_sys::syslog::Level::Error
                } else {
                    swpool_sys::syslog::Level::Notice
                },
                &format!(
                    "job={jobs} user={user} node={} {} {} at {}{}{}",
                    crate::users::hostname(),
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

/// The stores a user's mounts may be recorded in on this node, whatever environment the job had:
/// `$XDG_RUNTIME_DIR/sw-pool` (as this process sees it: `env`), `/run/user/<uid>/sw-pool`,
/// `/tmp/sw-pool-<uid>`, and `/run/sw-pool` for root. Only existing directories.
///
/// A set `SW_POOL_STATE_DIR` is the only store (the caller chose it).
pub fn candidate_dirs(uid: u32, env: &Environment) -> Vec<PathBuf> {
    let mut v = vec![StateDir::default_path(uid, env)];
    if env
        .get_os(crate::config::EnvVar::StateDir)
        .is_some_and(|v| !v.is_empty())
    {
        v.truncate(1);
        return v
            .into_iter()
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
            .collect();
    }
    if uid == 0 {
        v.push(PathBuf::from("/run/sw-pool"));
    } else {
        v.push(PathBuf::from(format!("/run/user/{uid}/sw-pool")));
        v.push(PathBuf::from(format!("/tmp/sw-pool-{uid}")));
        // private fallbacks made when someone squatted /tmp/sw-pool-<uid>
        v.extend(crate::userdir::fallbacks(Path::new("/tmp"), uid));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for p in v {
        // only the user's own directories: a name another user squatted is not a store of ours
        let own = std::fs::symlink_metadata(&p)
            .is_ok_and(|m| crate::userdir::not_private(&m, uid).is_none());
        if !out.contains(&p) && own {
            out.push(p);
        }
    }
    out
}
