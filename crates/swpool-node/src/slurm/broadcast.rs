//! `sbatch --pool` (the SPANK plugin): the job's pools loaded on every node of the allocation with
//! one broadcast each, before the batch script starts.

use std::path::Path;

use super::{parse_load_var, spread_command, HookError};
use crate::config::{EnvVar, Environment, HostVar, SPANK_PREFIX};

/// Load each pool of `list` on every node of job `job` (`nodes` nodes) with one broadcast:
/// `exe load` spread over the allocation by `srun --overlap` (as `load` in a batch script does).
/// The step's tasks get no `SW_POOL_LOAD`, so their TaskProlog does not load per node; they get
/// `SW_POOL_SPANK_DONE`, so the plugin does not start again inside them.
pub fn broadcast(
    exe: &Path,
    job: &str,
    nodes: u32,
    list: &str,
    env: &Environment,
) -> Result<(), HookError> {
    let nodes_s = nodes.to_string();
    // the allocation as given, not as the caller's environment says (srun's own process, a task)
    let mut alloc = env.clone();
    alloc.set(HostVar::SlurmJobId, job);
    alloc.set(HostVar::SlurmJobNumNodes, &nodes_s);
    alloc.set(HostVar::SlurmNnodes, &nodes_s);
    alloc.remove(HostVar::SlurmStepId);
    alloc
        .retain(|k, _| !(k.starts_with("PMI") || k.starts_with("OMPI_") || k == "MPI_LOCALNRANKS"));
    for spec in parse_load_var(list) {
        let args = [
            "load",
            "-q",
            "--no-progress",
            "--shell",
            "sh",
            spec.as_str(),
        ]
        .map(std::ffi::OsString::from);
        let cmd = match spread_command(&alloc, exe, args.clone()) {
            Some(c) => c,
            // one node: no srun needed
            None => crate::exec::ToolCommand::new(crate::exec::Tool::Srun)
                .program(exe)
                .args(args),
        };
        let spawn_err = |reason: String| HookError::Broadcast {
            pool: spec.clone(),
            nodes,
            reason,
        };
        let mut c = cmd
            .command(env.path_var())
            .map_err(|e| spawn_err(e.to_string()))?;
        // srun would apply the plugin's option again (sbatch passes it on to every srun in the
        // job as SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_pool): the tasks' TaskProlog would then
        // load the pool on each node before the broadcast does
        for k in env.names_with_prefix(SPANK_PREFIX) {
            c.env_remove(k);
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
        let st = c
            .status()
            .map_err(|e| spawn_err(format!("cannot run {}: {e}", cmd.cmdline())))?;
        if !st.success() {
            return Err(spawn_err(format!(
                "loading it failed ({st}); see the messages above"
            )));
        }
    }
    Ok(())
}

/// In the batch step of a `--pool` job (`SW_POOL_SPANK_STEP=batch`, set by the plugin), before the
/// script starts: the broadcast. Returns the line the TaskProlog prints so that the script's steps
/// skip it (`export SW_POOL_SPANK_DONE=JOB`), or `None` when there is nothing to do here.
pub fn spank_batch_broadcast(
    exe: &Path,
    job_id: Option<&str>,
    env: &Environment,
) -> Result<Option<String>, HookError> {
    let (Some(job), Some(pools)) = (job_id, env.get_nonempty(EnvVar::SpankPools)) else {
        return Ok(None);
    };
    if env.get_nonempty(EnvVar::SpankStep).as_deref() != Some("batch")
        || env.get_nonempty(EnvVar::SpankDone).as_deref() == Some(job)
    {
        return Ok(None);
    }
    let nodes = env
        .get_nonempty(HostVar::SlurmJobNumNodes)
        .or_else(|| env.get_nonempty(HostVar::SlurmNnodes))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    broadcast(exe, job, nodes, &pools, env)?;
    Ok(Some(format!("export {}={job}", EnvVar::SpankDone.name())))
}
