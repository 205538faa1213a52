//! `sw-pool slurm prolog|task-prolog|epilog`: the Slurm hooks (Prolog=, TaskProlog=, Epilog=).
//!
//! * **task-prolog** runs as the job's user for every task of every step. It does nothing (and prints
//!   nothing) unless the task's environment names pools: `SW_POOL_JOB_POOLS` (set by `sw-pool load` in
//!   the job) or `SW_POOL_LOAD` (given at submission). Then, once per node and job, it makes sure each
//!   pool is in the node-local cache (verified chunk by chunk) and mounted at the job's mount point,
//!   and prints `export` lines so that the task's `MODULEPATH` shows the pool's modules.
//! * **epilog** runs as root on every node of the job: it drops to the job's user and runs
//!   `sw-pool cleanup --job JOB_ID` (the job's references go; a mount other jobs use stays; the last
//!   reference unmounts; leftover helpers are killed). Safe to run twice, and after `scancel -s KILL`.
//! * **prolog** runs as root on every node at allocation: it drops to the job's user and cleans that
//!   user's stale mounts on the node (helpers that died in earlier jobs), so the job starts clean.
//!
//! All three return at once for jobs that never used sw-pool.

use swpool_core::config::{EnvVar, Environment, HostVar};
use swpool_core::load::NodeContext;
use swpool_core::mount::RealSys;
use swpool_core::slurm::{self, JobEnv};
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, HookArgs, SlurmArgs, SlurmHook};

pub fn run(g: &GlobalArgs, a: SlurmArgs, env: &Environment) -> Result<(), Error> {
    match a.hook {
        SlurmHook::Prolog(h) => root_hook(g, h, "prolog", env),
        SlurmHook::Epilog(h) => root_hook(g, h, "epilog", env),
        SlurmHook::TaskProlog => task_prolog(env),
        SlurmHook::CheckPools { pools } => check_pools(&pools, env),
        SlurmHook::Broadcast {
            job_id,
            nodes,
            pools,
        } => broadcast(&job_id, nodes, &pools, env),
    }
}

/// `--pool LIST` at submission: each entry resolves to a pool that the trust policy accepts, or
/// the submission fails with the reason.
fn check_pools(list: &str, env: &Environment) -> Result<(), Error> {
    let cfg = super::config(env)?;
    let sys = RealSys::new(env.path_var());
    let node = NodeContext::real(&cfg, env, &sys)?;
    for w in swpool_core::load::check_pools(&node, list)? {
        crate::eline!("sw-pool: warning: {w}");
    }
    Ok(())
}

fn own_exe() -> Result<std::path::PathBuf, Error> {
    std::env::current_exe().map_err(|e| {
        Error::other(
            ExitStatus::System,
            format!("cannot find our own executable: {e}"),
        )
    })
}

fn broadcast(job: &str, nodes: u32, list: &str, env: &Environment) -> Result<(), Error> {
    Ok(slurm::broadcast(&own_exe()?, job, nodes, list, env)?)
}

fn root_hook(_g: &GlobalArgs, h: HookArgs, kind: &str, env: &Environment) -> Result<(), Error> {
    let je = JobEnv::from_env(env, h.job.as_deref(), h.uid)
        .map_err(|e| Error::other(ExitStatus::Usage, format!("sw-pool slurm {kind}: {e}")))?;
    let sys = swpool_core::mount::RealSys::new(env.path_var());
    Ok(slurm::root_hook(&sys, kind == "epilog", &je, env)?)
}

fn task_prolog(env: &Environment) -> Result<(), Error> {
    if env.get_nonempty(EnvVar::JobPools).is_none() && env.get_nonempty(EnvVar::Load).is_none() {
        return Ok(()); // this job does not use sw-pool
    }
    let node = swpool_core::users::hostname();
    let job_id = env.get_nonempty(HostVar::SlurmJobId);
    // the batch step of a job submitted with `--pool` (SPANK plugin): broadcast its pools to every
    // node first, once, so that no node reads them from shared storage on its own
    let r =
        own_exe().and_then(|exe| Ok(slurm::spank_batch_broadcast(&exe, job_id.as_deref(), env)?));
    if let Ok(Some(line)) = &r {
        crate::output::outln(line);
    }
    if let Err(e) = r {
        let msg = format!("sw-pool: error: task prolog on {node}: {e}");
        crate::output::outln(&format!("print {}", msg.replace('\n', " ")));
        return Err(e);
    }
    let r = (|| -> Result<String, Error> {
        let cfg = super::config(env)?;
        let sys = RealSys::new(env.path_var());
        let node_ctx = NodeContext::real(&cfg, env, &sys)?;
        let changes = swpool_core::load::task_prolog(&node_ctx, job_id.as_deref())?;
        slurm::task_prolog_lines(&changes).map_err(|e| Error::other(ExitStatus::BadInput, e))
    })();
    match r {
        Ok(lines) => {
            crate::output::out(lines.as_bytes());
            Ok(())
        }
        Err(e) => {
            // slurmstepd shows `print` lines on the task's stdout
            let msg = format!("sw-pool: error: task prolog on {node}: {e}");
            crate::output::outln(&format!("print {}", msg.replace('\n', " ")));
            slurm::syslog(
                swpool_core::slurm::Level::Error,
                &format!(
                    "job={} node={node} task-prolog: {e}",
                    job_id.as_deref().unwrap_or("-")
                ),
            );
            Err(e)
        }
    }
}
