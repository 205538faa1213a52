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

use swpool_core::config::{EnvVar, Environment, HostVar, HOST_PREFIXES};
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
    let specs = slurm::parse_load_var(list);
    if specs.is_empty() {
        return Err(Error::other(
            ExitStatus::Usage,
            "--pool: give NAME/VERSION[,NAME/VERSION...]".to_string(),
        ));
    }
    let cfg = super::config(env)?;
    let sys = RealSys::new(env.path_var());
    let node = NodeContext::real(&cfg, env, &sys)?;
    for spec in specs {
        let ctx = |e: Error| Error::other(e.exit_status(), format!("--pool={spec}: {e}"));
        let src = swpool_core::load::resolve(std::path::Path::new(&spec), &cfg.pool_path.value)
            .map_err(ctx)?;
        let verdict = swpool_core::load::authorize_in_place(&node, &src).map_err(ctx)?;
        if let Some(w) = verdict.as_ref().and_then(|v| v.warning(&src)) {
            crate::eline!("sw-pool: warning: --pool={spec}: {w}");
        }
    }
    Ok(())
}

/// Load each pool on every node of the job with one broadcast: `sw-pool load` spread over the
/// allocation by `srun --overlap` (as `load` in a batch script does). The step's tasks get no
/// `SW_POOL_LOAD`, so their TaskProlog does not load per node; they get `SW_POOL_SPANK_DONE`, so
/// the plugin does not start again inside them.
fn broadcast(job: &str, nodes: u32, list: &str, env: &Environment) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(|e| {
        Error::other(
            ExitStatus::System,
            format!("cannot find our own executable: {e}"),
        )
    })?;
    let nodes_s = nodes.to_string();
    // the allocation as given, not as the caller's environment says (srun's own process, a task)
    let mut alloc = env.clone();
    alloc.set(HostVar::SlurmJobId, job);
    alloc.set(HostVar::SlurmJobNumNodes, &nodes_s);
    alloc.set(HostVar::SlurmNnodes, &nodes_s);
    alloc.remove(HostVar::SlurmStepId);
    alloc
        .retain(|k, _| !(k.starts_with("PMI") || k.starts_with("OMPI_") || k == "MPI_LOCALNRANKS"));
    for spec in slurm::parse_load_var(list) {
        let args = [
            "load",
            "-q",
            "--no-progress",
            "--shell",
            "sh",
            spec.as_str(),
        ]
        .map(std::ffi::OsString::from);
        let cmd = match slurm::spread_command(&alloc, &exe, args.clone()) {
            Some(c) => c,
            // one node: no srun needed
            None => swpool_core::exec::ToolCommand::new(swpool_core::exec::Tool::Srun)
                .program(&exe)
                .args(args),
        };
        let mut c = cmd.command(env.path_var())?;
        // srun would apply the plugin's option again (sbatch passes it on to every srun in the
        // job as SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_pool): the tasks' TaskProlog would then
        // load the pool on each node before the broadcast does
        for prefix in HOST_PREFIXES {
            for k in env.names_with_prefix(prefix) {
                c.env_remove(k);
            }
        }
        c.env(HostVar::SlurmJobId.name(), job)
            .env(EnvVar::SpankDone.name(), job)
            .env(EnvVar::Spread.name(), "0")
            .env_remove(EnvVar::Load.name())
            .env_remove(EnvVar::SpankPools.name())
            .env_remove(EnvVar::SpankStep.name())
            .env_remove(EnvVar::JobPools.name())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null());
        let st = c.status().map_err(|e| {
            Error::other(
                ExitStatus::Tool,
                format!("--pool={spec}: cannot run {}: {e}", cmd.cmdline()),
            )
        })?;
        if !st.success() {
            return Err(Error::other(
                ExitStatus::Collective,
                format!(
                    "--pool={spec}: loading it on the job's {nodes} node(s) failed ({st}); see the messages above"
                ),
            ));
        }
    }
    Ok(())
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
    let r = spank_batch_broadcast(job_id.as_deref(), env);
    if let Err(e) = r {
        let msg = format!("sw-pool: error: task prolog on {node}: {e}");
        println!("print {}", msg.replace('\n', " "));
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

/// In the batch step of a `--pool` job (`SW_POOL_SPANK_STEP=batch`, set by the plugin), before the
/// script starts: the broadcast, then `export SW_POOL_SPANK_DONE=JOB` so the script's steps skip it.
fn spank_batch_broadcast(job_id: Option<&str>, env: &Environment) -> Result<(), Error> {
    let (Some(job), Some(pools)) = (job_id, env.get_nonempty(EnvVar::SpankPools)) else {
        return Ok(());
    };
    if env.get_nonempty(EnvVar::SpankStep).as_deref() != Some("batch")
        || env.get_nonempty(EnvVar::SpankDone).as_deref() == Some(job)
    {
        return Ok(());
    }
    let nodes = env
        .get_nonempty(HostVar::SlurmJobNumNodes)
        .or_else(|| env.get_nonempty(HostVar::SlurmNnodes))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    broadcast(job, nodes, &pools, env)?;
    println!("export {}={job}", EnvVar::SpankDone.name());
    Ok(())
}
