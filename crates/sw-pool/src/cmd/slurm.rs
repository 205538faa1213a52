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

use std::io::Write;

use swpool_core::load::NodeContext;
use swpool_core::mount::RealSys;
use swpool_core::slurm::{self, JobEnv, JOB_POOLS_VAR, LOAD_VAR};
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, HookArgs, SlurmArgs, SlurmHook};

pub fn run(g: &GlobalArgs, a: SlurmArgs) -> Result<(), Error> {
    match a.hook {
        SlurmHook::Prolog(h) => root_hook(g, h, "prolog"),
        SlurmHook::Epilog(h) => root_hook(g, h, "epilog"),
        SlurmHook::TaskProlog => task_prolog(),
    }
}

fn getenv(k: &str) -> Option<String> {
    std::env::var(k).ok().filter(|v| !v.is_empty())
}

fn root_hook(_g: &GlobalArgs, h: HookArgs, kind: &str) -> Result<(), Error> {
    let je = JobEnv::from_env(getenv, h.job.as_deref(), h.uid)
        .map_err(|e| Error::other(ExitStatus::Usage, format!("sw-pool slurm {kind}: {e}")))?;
    slurm::root_hook(kind == "epilog", &je)
}

fn task_prolog() -> Result<(), Error> {
    if getenv(JOB_POOLS_VAR).is_none() && getenv(LOAD_VAR).is_none() {
        return Ok(()); // this job does not use sw-pool
    }
    let node = swpool_core::users::hostname();
    let job_id = getenv("SLURM_JOB_ID");
    let r = (|| -> Result<String, Error> {
        let cfg = super::config()?;
        let sys = RealSys::new();
        let node_ctx = NodeContext::real(&cfg, &sys)?;
        let changes = swpool_core::load::task_prolog(&node_ctx, getenv, job_id.as_deref())?;
        slurm::task_prolog_lines(&changes).map_err(|e| Error::other(ExitStatus::BadInput, e))
    })();
    match r {
        Ok(lines) => {
            print!("{lines}");
            let _ = std::io::stdout().flush();
            Ok(())
        }
        Err(e) => {
            // slurmstepd shows `print` lines on the task's stdout
            let msg = format!("sw-pool: error: task prolog on {node}: {e}");
            println!("print {}", msg.replace('\n', " "));
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
