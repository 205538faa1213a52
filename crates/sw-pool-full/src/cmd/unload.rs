//! `sw-pool unload POOL`: parse, call [`swpool_core::load::unload`] on every rank, print the shell
//! code that undoes `load`.

use swpool_core::collective::Collective;
use swpool_core::config::{EnvVar, Environment};
use swpool_core::env::{self, Snapshot};
use swpool_core::load::{self, NodeContext};
use swpool_core::mount::RealSys;
use swpool_core::Job;
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, UnloadArgs};
use crate::eline;

pub fn run(g: &GlobalArgs, a: UnloadArgs, env: &Environment) -> Result<(), Error> {
    // shell code on a terminal changes nothing: say what to run instead of half-acting
    super::shell_init::refuse_on_terminal(env, false)?;
    super::spread_over_allocation(env)?;
    let job = Job::init(env)?;
    let r = unload(g, &a, &job, env);
    super::finish_collective(job, r)
}

fn unload(_g: &GlobalArgs, a: &UnloadArgs, job: &Job, env: &Environment) -> Result<(), Error> {
    let cfg = super::config(env)?;
    let shell = crate::output::shell(a.shell.as_deref(), env)?;
    let sys = RealSys::new(env.path_var());
    let node = NodeContext::real(&cfg, env, &sys)?;
    let job_id = super::mount::job_id(a.job_id.clone(), env);
    let caller = super::shell_init::calling_shell(env, false);
    let u = load::unload(job, &node, &a.pool, a.force, job_id.as_deref(), caller)?;
    if job.world_rank() != 0 {
        return Ok(());
    }
    if let Some(why) = &u.not_loaded {
        // as asked already: a note, exit 0; the shell code still takes the pool's entries off
        // MODULEPATH and SW_POOL_LOADED should the shell have them
        if !_g.quiet {
            eline!("sw-pool: note: {why}: nothing to unload");
        }
    } else if u.remaining > 0 {
        eline!(
            "sw-pool: {} stays mounted: {} other reference(s)",
            u.mount_point.display(),
            u.remaining
        );
    } else if !_g.quiet {
        let what = u
            .pool
            .as_ref()
            .map(|(n, v)| format!("{n}/{v}"))
            .unwrap_or_else(|| "the pool".into());
        eline!(
            "sw-pool: unloaded {what}: that was the last reference, {} is unmounted{}",
            u.mount_point.display(),
            if job.is_mpi() { " on every node" } else { "" }
        );
    }
    let job_pools = env.get(EnvVar::JobPools);
    let changes = load::unload_environment(&u, &Snapshot::from_env(env), job_pools.as_deref());
    let code = env::render(shell, &changes).map_err(|e| Error::other(ExitStatus::BadInput, e))?;
    crate::output::shell_code(&code);
    Ok(())
}
