//! `sw-pool load POOL`: parse, call [`swpool_core::load::load`] on every rank, print.
//!
//! Standard output carries only the shell code (or `--json`), so that `eval "$(sw-pool load …)"`
//! and the profile.d function work; messages and `-v` timings go to standard error.

use std::time::Duration;

use swpool_core::config::{EnvVar, Environment};
use swpool_core::env::{self, Snapshot};
use swpool_core::load::{self, LoadRequest, Loaded, NodeContext, Quiet};
use swpool_core::mount::RealSys;
use swpool_core::Job;
use swpool_core::{collective::Collective, Error, ExitStatus};

use crate::cli::{GlobalArgs, LoadArgs};
use crate::eline;

pub fn run(g: &GlobalArgs, a: LoadArgs, env: &Environment) -> Result<(), Error> {
    // shell code on a terminal changes nothing: say what to run instead of half-acting
    // (`--shell SHELL` given: the caller takes the code for that shell itself, as the SPANK
    // plugin's broadcast does with its output on /dev/null)
    super::shell_init::refuse_unless_evaluated(env, a.json, a.shell.is_some())?;
    if a.lazy {
        return super::lazy::launch(g, &a, env);
    }
    super::spread_over_allocation(env)?;
    let job = Job::init(env)?;
    let r = load(g, &a, &job, env);
    super::finish_collective(job, r)
}

/// `load`'s configuration (with `--require-signature`) and the shell its code is printed for
/// (`load --lazy` too).
pub fn settings(
    a: &LoadArgs,
    env: &Environment,
) -> Result<(swpool_core::config::Config, swpool_core::env::Shell), Error> {
    let mut cfg = super::config(env)?;
    if a.require_signature {
        cfg.require_signature.flag(Some(true));
    }
    Ok((cfg, crate::output::shell(a.shell.as_deref(), env)?))
}

fn load(g: &GlobalArgs, a: &LoadArgs, job: &Job, env: &Environment) -> Result<(), Error> {
    let rank0 = job.world_rank() == 0;
    let (cfg, shell) = settings(a, env)?;
    let sys = RealSys::new(env.path_var());
    let node = NodeContext::real(&cfg, env, &sys)?;
    let bar = crate::output::progress(rank0 && !a.no_progress && !a.json && !g.quiet);
    let req = LoadRequest {
        pool: a.pool.clone(),
        mountpoint: a.mountpoint.clone(),
        cache_dir: a.cache_dir.clone(),
        job_id: super::mount::job_id(a.job_id.clone(), env),
        timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
        progress: bar.as_ref().map(crate::output::progress_sink),
        no_fallback: a.no_fallback,
        // one reference per pool per shell
        shell: super::shell_init::calling_shell(env, a.json),
        ..LoadRequest::default()
    };
    let loaded = load::load(job, &node, &req, &Quiet);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let l = loaded?;
    if !rank0 {
        return Ok(()); // world rank 0 speaks for the job
    }
    if let Some(w) = super::trust_warning(env, &l.plan).filter(|_| !g.quiet) {
        eline!("sw-pool: warning: {w}");
    }
    if let Some(w) = &l.in_place {
        eline!("sw-pool: warning: {w}");
    }
    if a.json {
        let v = l.report(job.world_size());
        crate::output::json(&v);
        return Ok(());
    }
    if g.verbose > 0 {
        print_timings(&l);
    }
    if !l.mount_point.join("modulefiles").is_dir() {
        eline!(
            "sw-pool: warning: {}/{} has no modulefiles/ directory: no modules will appear",
            l.plan.name,
            l.plan.version
        );
    }
    let job_pools = env.get(EnvVar::JobPools);
    let changes = load::environment(
        &l,
        &Snapshot::from_env(env),
        job_pools.as_deref(),
        req.job_id.is_some(),
    );
    let code = env::render(shell, &changes).map_err(|e| Error::other(ExitStatus::BadInput, e))?;
    crate::output::shell_code(&code);
    Ok(())
}

/// The paper's per-phase breakdown (`-v`), on standard error.
fn print_timings(l: &Loaded) {
    let (r, ph) = (&l.copy, &l.copy.phases);
    eline!(
        "sw-pool: loaded {}/{} on {} node(s){}: {}",
        l.plan.name,
        l.plan.version,
        r.nodes,
        if l.in_place.is_some() {
            " (served in place, nothing copied)"
        } else if r.skipped_all {
            " (already cached everywhere)"
        } else {
            ""
        },
        l.mount_point.display()
    );
    for (k, d) in [
        ("resolve+trust", l.timings.resolve_trust),
        ("preflight", ph.preflight),
        ("read", ph.read),
        ("distribute", ph.distribute),
        ("write", ph.write),
        ("verify", ph.verify),
        ("commit", ph.commit),
        ("mount", l.timings.mount),
        ("total", l.timings.total),
    ] {
        eline!("{k:<14} {:8.3} s", d.as_secs_f64());
    }
    eline!(
        "bytes read from {}: {}, sent: {}, written: {} (all nodes)",
        l.plan.src.display(),
        r.bytes_read_from_src,
        r.bytes_sent,
        r.bytes_written
    );
    if r.bytes_reused > 0 {
        eline!(
            "bytes taken from the nodes' partial copies (an on-demand run's, verified): {}",
            r.bytes_reused
        );
    }
}
