//! `sw-pool cache fetch POOL`: the load pipeline up to the node-local copy, verified, without a
//! mount ([`swpool_core::load::place`]); collective like `load`. With `--for-step` each node also
//! leaves its outcome for the tasks of a job step (`run --pool`, `crate::environment`).

use std::path::Path;

use swpool_core::config::Environment;
use swpool_core::load::{self, LoadRequest, NodeContext, Placed, Quiet};
use swpool_core::mount::RealSys;
use swpool_core::size::Bytes;
use swpool_core::Job;
use swpool_core::{collective::Collective, Error};

use crate::cli::GlobalArgs;
use crate::eline;

/// `cache fetch`'s arguments.
pub struct Fetch<'a> {
    pub cache_dir: Option<&'a Path>,
    pub require_signature: bool,
    pub no_progress: bool,
    pub json: bool,
    pub for_step: Option<&'a str>,
    pub pool: &'a Path,
}

pub fn run(g: &GlobalArgs, f: Fetch, env: &Environment) -> Result<(), Error> {
    super::spread_over_allocation(env)?;
    let job = Job::init(env)?;
    let r = fetch(g, &f, &job, env);
    super::finish_collective(job, r)
}

fn fetch(g: &GlobalArgs, f: &Fetch, job: &Job, env: &Environment) -> Result<(), Error> {
    let rank0 = job.world_rank() == 0;
    let mut cfg = super::config(env)?;
    if f.require_signature {
        cfg.require_signature.flag(Some(true));
    }
    let sys = RealSys::new(env.path_var());
    let node = NodeContext::real(&cfg, env, &sys)?;
    let bar = crate::output::progress(rank0 && !f.no_progress && !f.json && !g.quiet);
    let req = LoadRequest {
        pool: f.pool.to_path_buf(),
        cache_dir: f.cache_dir.map(Path::to_path_buf),
        progress: bar.as_ref().map(crate::output::progress_sink),
        no_fallback: true,
        ..LoadRequest::default()
    };
    let placed = load::place(job, &node, &req, &Quiet);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let (Some(step), true) = (f.for_step, job.is_leader()) {
        mark_step(&cfg, f, step, &placed, env);
    }
    let p = placed?;
    if !rank0 {
        return Ok(()); // world rank 0 speaks for the job
    }
    if let Some(w) = super::trust_warning(env, &p.plan).filter(|_| !g.quiet) {
        eline!("sw-pool: warning: {w}");
    }
    let r = &p.copy;
    if f.json {
        crate::output::json(&serde_json::json!({
            "pool": {"name": p.plan.name, "version": p.plan.version, "digest": p.plan.digest,
                     "src": p.plan.src, "trust": p.plan.verdict.to_string()},
            "cache": p.placement.image,
            "format": p.placement.format,
            "nodes": r.nodes,
            "nodes_received": r.nodes_received,
            "skipped_all": r.skipped_all,
            "bytes_read_from_src": r.bytes_read_from_src,
            "bytes_sent": r.bytes_sent,
            "bytes_written": r.bytes_written,
            "seconds": p.total.as_secs_f64(),
            // what `run --pool` mounts, in the form the step marks carry it
            "placement": p.placement,
        }));
        return Ok(());
    }
    // for a step's tasks (`run --pool`): the warnings only, not a line per step in the job's output
    if !g.quiet && f.for_step.is_none() {
        crate::output::Printer::new(g, false).result(format!(
            "{}/{}: in the cache of {} node(s) ({}), {} read from {} in {:.2} s{}",
            p.plan.name,
            p.plan.version,
            r.nodes,
            p.placement.image.display(),
            Bytes(r.bytes_read_from_src),
            p.plan.src.display(),
            p.total.as_secs_f64(),
            if r.skipped_all {
                " (every node had it already)"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

/// This node's outcome for the tasks of `step` (the same message on every node when it failed:
/// the collective agreed on it).
fn mark_step(
    cfg: &swpool_core::config::Config,
    f: &Fetch,
    step: &str,
    placed: &Result<Placed, Error>,
    env: &Environment,
) {
    let uid = rustix::process::geteuid().as_raw();
    let base = swpool_core::cache::base_dir(f.cache_dir, cfg.cache_dir.value.as_deref(), env);
    let Ok(cache) = swpool_core::cache::dir(&base, uid, true) else {
        return; // the tasks time out naming `cache fetch`; the step itself failed already
    };
    // the step's marks go under `base`: the epilog's cleanup looks there too
    swpool_core::state::StateDir::remember_job_base(env, &base);
    let spec = f.pool.to_string_lossy();
    let Some(mark) = swpool_core::cache::step_mark(&cache, step, &spec) else {
        return;
    };
    let (json, why);
    let outcome = match placed {
        Ok(p) => {
            json = serde_json::to_vec(&p.placement).expect("json");
            Ok(json.as_slice())
        }
        Err(e) => {
            why = e.to_string();
            Err(why.as_str())
        }
    };
    if let Err(e) = swpool_core::cache::write_step_mark(&mark, outcome) {
        tracing::warn!(
            "cannot leave the outcome for step {step} at {}: {e}",
            mark.display()
        );
    }
}
