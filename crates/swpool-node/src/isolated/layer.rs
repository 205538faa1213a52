//! `--layer NAME` in a job: the layer's node-local copy `sw-pool layer sync` made for the job
//! (synced to a step's nodes first when the job has none yet).

use std::ffi::OsString;
use std::path::PathBuf;

use swpool_env::LayerStore;

use crate::config::{Config, Environment, HostVar};
use crate::ExitStatus;

use super::{full_program, Failed};

/// In a job: the layer's copy `sw-pool layer sync` made on this node for the job, if any (then
/// the environment stacks a fresh node-local upper on it; else it writes into the layer itself).
pub(super) fn synced_copy(
    store: &LayerStore,
    cfg: &Config,
    name: &str,
    step_key: Option<&str>,
    env: &Environment,
) -> Result<Option<swpool_env::Synced>, Failed> {
    let Some(job) = env.get(HostVar::SlurmJobId).filter(|j| !j.is_empty()) else {
        return Ok(None);
    };
    let base = crate::cache::base_dir(None, cfg.cache_dir.value.as_deref(), env);
    let uid = rustix::process::getuid().as_raw();
    // a step over several nodes: the layer goes to them first (unless this job has synced it)
    let step_nodes: u32 = env
        .get(HostVar::SlurmStepNumNodes)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let cache = if step_nodes > 1 {
        Some(crate::cache::dir(&base, uid, true).map_err(|e| Failed::new(e.exit_status(), e))?)
    } else {
        crate::cache::existing_dir(&base, uid).map_err(|e| Failed::new(e.exit_status(), e))?
    };
    let Some(cache) = cache else {
        return Ok(None);
    };
    let layers = crate::cache::layers_dir(&cache);
    if step_nodes <= 1 && !layers.is_dir() {
        return Ok(None);
    }
    let copies = swpool_env::sync::NodeCopies::open(&layers, name, &store.paths(name).dir)
        .map_err(|e| Failed::new(ExitStatus::BadInput, e))?;
    let state = match copies.for_job(&job) {
        Some(s) => s,
        None if step_nodes > 1 => step_sync(&copies, name, &job, step_nodes, env)?,
        None => return Ok(None),
    };
    // fuse-overlayfs takes its directories in a comma- and colon-separated option
    let bad = |p: &std::path::Path| p.to_str().is_none_or(|s| s.contains([',', ':']));
    if bad(&state) {
        return Err(Failed::new(
            ExitStatus::BadInput,
            format!(
                "the node-local copy of layer {name} is at {}, a path with ',' or ':' that fuse-overlayfs cannot take: choose another cache_dir",
                state.display()
            ),
        ));
    }
    let run_key = step_key
        .map(String::from)
        .unwrap_or_else(|| format!("job-{job}-{}", std::process::id()));
    let scratch = copies.dir().join("run").join(run_key);
    Ok(Some(swpool_env::Synced {
        copies,
        state,
        scratch,
        keep_upper: None,
    }))
}

/// `run --layer NAME` in a step over several nodes whose job has no copy of the layer yet: task 0
/// syncs it to the step's nodes (`srun --overlap` of `sw-pool layer sync`, one task per node,
/// collective) while every task waits for its node's copy (or the sync's failure).
fn step_sync(
    copies: &swpool_env::sync::NodeCopies,
    name: &str,
    job: &str,
    nodes: u32,
    env: &Environment,
) -> Result<PathBuf, Failed> {
    let fail = |m: String| Failed::new(ExitStatus::Collective, m);
    // this step's sync records its failure under the step's name (an earlier step's failed sync
    // in the same job does not stop this one)
    let step = format!(
        "{job}.{}",
        env.get(HostVar::SlurmStepId).unwrap_or_else(|| "0".into())
    );
    if env.get(HostVar::SlurmProcid).as_deref() == Some("0") {
        let nodelist = env
            .get(HostVar::SlurmStepNodelist)
            .ok_or_else(|| fail("SLURM_STEP_NODELIST is not set: cannot sync the layer to the step's nodes; run `sw-pool layer sync` first".into()))?;
        let prog = full_program().map_err(|e| fail(e.message))?;
        let mut cmd = super::nested_step(
            env,
            &prog,
            ["-q", "layer", "sync", name].map(OsString::from),
            u64::from(nodes),
            &nodelist,
            &format!(",SW_POOL_SYNC_FOR={step}"),
        )
        .map_err(|e| fail(format!("cannot sync layer {name} to the step's nodes: {e}")))?;
        tracing::debug!("syncing layer {name} to the step's nodes: {cmd:?}");
        let st = cmd.status().map_err(|e| {
            fail(format!(
                "cannot run srun to sync layer {name} to the step's nodes: {e}"
            ))
        })?;
        if !st.success() {
            if let Some(why) = copies.failed(&step) {
                return Err(fail(why));
            }
            return Err(fail(format!(
                "syncing layer {name} to the step's {nodes} nodes failed (srun exit {}); run `sw-pool layer sync {name}` in the job to see why",
                swpool_env::exit_code(st)
            )));
        }
    }
    // every task: the node's copy, made by the sync's task on this node
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    loop {
        if let Some(s) = copies.for_job(job) {
            return Ok(s);
        }
        if let Some(why) = copies.failed(&step) {
            return Err(fail(format!("the sync of layer {name} failed: {why}")));
        }
        if std::time::Instant::now() > deadline {
            return Err(fail(format!(
                "no copy of layer {name} reached this node within 600 s (task 0 of the step syncs it): run `sw-pool layer sync {name}` in the job first"
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
