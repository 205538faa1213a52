//! `sw-pool cleanup` on one node, as a library call the command, the epilog or a daemon can make:
//! the caller's recorded mounts by the [`Selection`] ([`clean_all_stores`]), what environments
//! killed with their job step left (their rendezvous sockets and, over a synced layer, their
//! node-local uppers and step marks), and with `--stale`/`--all` the site helper's mounts of the
//! caller ([`super::clean_helper`]).

use std::path::{Path, PathBuf};

use super::{
    candidate_dirs, clean_all_stores, clean_helper, Action, Selection, StateDir, StateError,
};
use crate::config::Environment;
use crate::mount::Sys;

/// Where the node's things are: the cache directory the configuration names (`cache_dir`) and the
/// site's mount helper, when one is configured.
pub struct NodePlaces<'a> {
    pub cache_dir: Option<&'a Path>,
    pub mount_helper: Option<&'a Path>,
}

/// Clean what `sel` selects of user `uid`'s on this node; every step's outcome is one [`Action`]
/// (`failed` ones included: the caller decides the exit status). Only a state directory that
/// cannot be read at all is an error.
pub fn clean_node(
    sys: &dyn Sys,
    uid: u32,
    sel: &Selection,
    places: &NodePlaces,
    env: &Environment,
) -> Result<Vec<Action>, StateError> {
    let mut actions = clean_all_stores(sys, uid, sel, sel.job.as_deref(), env)?;
    // environments killed with their job step (`kill -9`, a cancelled step) leave their
    // rendezvous socket and, over a synced layer, their node-local upper; nobody holds their lock
    let stores = candidate_dirs(uid, env);
    let envs: Vec<PathBuf> = stores.iter().map(|d| d.join("envs")).collect();
    for base in cache_bases(&stores, places.cache_dir, env) {
        let Ok(Some(cache)) = crate::cache::existing_dir(&base, uid) else {
            continue;
        };
        let layers = crate::cache::layers_dir(&cache);
        // the job's `run --pool` step marks and which layer state it used (a few bytes each; the
        // epilog passes the job)
        if let (Some(job), false) = (sel.job.as_deref(), sel.dry_run) {
            crate::cache::remove_step_marks(&cache, job);
            swpool_env::sync::remove_job_marks(&layers, job);
        }
        for d in swpool_env::sync::remove_stale_runs(&layers, &envs, sel.dry_run) {
            actions.push(leftover(
                sel,
                d,
                "upper-removed",
                "the node-local upper of an environment that is gone",
            ));
        }
    }
    for d in &envs {
        for sock in swpool_env::rendezvous::remove_stale(d, sel.dry_run) {
            actions.push(leftover(
                sel,
                sock,
                "socket-removed",
                "the socket of an environment that is gone",
            ));
        }
    }
    if sel.stale || sel.all {
        if let Some(h) = places.mount_helper {
            actions.extend(clean_helper(sys, h, sel.all, sel.dry_run, env));
        }
    }
    Ok(actions)
}

/// The cache base this environment names, and those the user's jobs put job-scoped things under
/// on this node (`StateDir::remember_base`: the epilog does not see the tasks' variables).
fn cache_bases(stores: &[PathBuf], configured: Option<&Path>, env: &Environment) -> Vec<PathBuf> {
    let mut bases = vec![crate::cache::base_dir(None, configured, env)];
    for d in stores {
        for b in StateDir::remembered_bases_in(d) {
            if !bases.contains(&b) {
                bases.push(b);
            }
        }
    }
    bases
}

fn leftover(sel: &Selection, path: PathBuf, action: &'static str, detail: &str) -> Action {
    Action {
        mount_point: path,
        pool: "-".into(),
        jobs: sel.job.iter().cloned().collect(),
        action,
        detail: detail.into(),
        done: !sel.dry_run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EnvVar;
    use crate::mount::sys::{FakeScript, FakeSys};

    /// A state directory with two environments' sockets: `gone` (nobody holds its lock, as after
    /// a `kill -9` of its step) and `alive` (its lock held, as by a running pid 1).
    fn node() -> (tempfile::TempDir, PathBuf, Environment, std::fs::File) {
        let d = tempfile::tempdir().unwrap();
        let state = std::fs::canonicalize(d.path()).unwrap().join("state");
        let envs = state.join("envs");
        std::fs::create_dir_all(&envs).unwrap();
        for k in ["gone", "alive"] {
            std::fs::write(envs.join(format!("{k}.sock")), b"").unwrap();
            std::fs::write(envs.join(format!("{k}.lock")), b"").unwrap();
        }
        let held = std::fs::File::open(envs.join("alive.lock")).unwrap();
        rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive).unwrap();
        let env = Environment::from_vars([("PATH", "/usr/bin:/bin")])
            .with(EnvVar::StateDir, state.as_os_str())
            .with(EnvVar::Cache, d.path().join("cache").as_os_str());
        (d, envs, env, held)
    }

    fn sel(dry_run: bool) -> Selection {
        Selection {
            job: None,
            stale: true,
            all: false,
            kill: false,
            dry_run,
        }
    }

    fn sys() -> FakeSys {
        FakeSys::new(FakeScript {
            euid: rustix::process::geteuid().as_raw(),
            ..Default::default()
        })
    }

    const NOWHERE: NodePlaces = NodePlaces {
        cache_dir: None,
        mount_helper: None,
    };

    #[test]
    fn the_socket_of_an_environment_that_is_gone_is_removed_and_a_running_ones_kept() {
        let (_d, envs, env, _held) = node();
        let uid = rustix::process::geteuid().as_raw();
        let actions = clean_node(&sys(), uid, &sel(false), &NOWHERE, &env).unwrap();
        let removed: Vec<_> = actions
            .iter()
            .filter(|a| a.action == "socket-removed")
            .collect();
        assert_eq!(removed.len(), 1, "{actions:?}");
        assert_eq!(removed[0].mount_point, envs.join("gone.sock"));
        assert!(removed[0].done);
        assert!(!envs.join("gone.sock").exists());
        assert!(
            envs.join("alive.sock").exists(),
            "a running environment's socket was removed"
        );
    }

    #[test]
    fn a_dry_run_names_the_socket_and_removes_nothing() {
        let (_d, envs, env, _held) = node();
        let uid = rustix::process::geteuid().as_raw();
        let actions = clean_node(&sys(), uid, &sel(true), &NOWHERE, &env).unwrap();
        let named: Vec<_> = actions
            .iter()
            .filter(|a| a.action == "socket-removed")
            .collect();
        assert_eq!(named.len(), 1, "{actions:?}");
        assert!(!named[0].done);
        assert!(envs.join("gone.sock").exists() && envs.join("alive.sock").exists());
    }
}
