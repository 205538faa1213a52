//! `sw-pool unload POOL`: parse, call [`swpool_core::load::unload`] on every rank, print the shell
//! code that undoes `load`.

use swpool_core::collective::Collective;
use swpool_core::env::{self, Snapshot};
use swpool_core::load::{self, NodeContext};
use swpool_core::mount::RealSys;
use swpool_core::transfer::Job;
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, UnloadArgs};
use crate::eline;

pub fn run(g: &GlobalArgs, a: UnloadArgs) -> Result<(), Error> {
    super::spread_over_allocation()?;
    let job = Job::init()?;
    let r = unload(g, &a, &job);
    super::finish_collective(job, r)
}

fn unload(_g: &GlobalArgs, a: &UnloadArgs, job: &Job) -> Result<(), Error> {
    let cfg = super::config()?;
    let shell = crate::output::shell(a.shell.as_deref())?;
    let sys = RealSys::new();
    let node = NodeContext::real(&cfg, &sys)?;
    let job_id = super::mount::job_id(a.job_id.clone());
    let u = load::unload(job, &node, &a.pool, a.force, job_id.as_deref())?;
    if job.world_rank() != 0 {
        return Ok(());
    }
    if u.remaining > 0 {
        eline!(
            "sw-pool: {} stays mounted: {} other reference(s)",
            u.mount_point.display(),
            u.remaining
        );
    }
    let job_pools = swpool_core::config::EnvVar::JobPools.get();
    let changes = load::unload_environment(&u, &Snapshot::from_env(), job_pools.as_deref());
    let code = env::render(shell, &changes).map_err(|e| Error::other(ExitStatus::BadInput, e))?;
    crate::output::shell_code(&code);
    Ok(())
}
