//! `layer sync NAME`, collective: a user's writable layer copied to node-local storage on every
//! node of the job ([`crate::transfer::layer::sync_layer`]: read by node 0 only, under the layer's
//! writer lock, so that no environment writes it meanwhile), where `run --layer` stacks a fresh
//! upper on it. A failure on any node fails it on every node, and the tasks of a step waiting for
//! this node's copy (`SW_POOL_SYNC_FOR`) are told why.

use std::path::Path;

use swpool_env::{EnvError, LayerStore};
use swpool_node::config::{Config, EnvVar, Environment, HostVar};

use crate::collective::Collective;
use crate::transfer::layer::{LayerSync, LayerSyncReport};
use crate::{Error, ExitStatus};

/// An environment error as sw-pool's, with its exit status.
pub fn env_error(e: EnvError) -> Error {
    let status = match &e {
        EnvError::Io { .. } | EnvError::Start { .. } => ExitStatus::System,
        EnvError::Unsupported(_) => ExitStatus::Tool,
        _ => ExitStatus::BadInput,
    };
    Error::other(status, e)
}

/// Sync layer `name` of `store` to every node of `job` (`cache_dir`: `--cache-dir`, else the
/// configuration's). Every rank returns the same outcome.
pub fn sync(
    job: &dyn Collective,
    store: &LayerStore,
    cfg: &Config,
    name: &str,
    cache_dir: Option<&Path>,
    env: &Environment,
) -> Result<LayerSyncReport, Error> {
    let uid = rustix::process::getuid().as_raw();
    // the layer is read by node 0 only; there it must be yours, and no environment may be
    // writing it meanwhile (the lock is held until the sync ends)
    let writer_lock = (job.world_rank() == 0).then(|| {
        store
            .get(name)
            .and_then(|l| store.lock(&l))
            .map_err(env_error)
    });
    let checked: Result<(), (ExitStatus, String)> = match &writer_lock {
        Some(Err(e)) => Err((e.exit_status(), e.to_string())),
        _ => Ok(()),
    };
    let layer = store.paths(name);
    let base = crate::cache::base_dir(cache_dir, cfg.cache_dir.value.as_deref(), env);
    let node_layers = crate::cache::dir(&base, uid, true)
        .map(|c| crate::cache::layers_dir(&c))
        .map_err(|e| (e.exit_status(), e.to_string()));
    if node_layers.is_ok() && env.get(HostVar::SlurmJobId).is_some() {
        // the job's marks and uppers go under `base`: the epilog's cleanup looks there too
        crate::state::StateDir::remember_job_base(env, &base);
    }
    let r = job
        .agree(checked.and(node_layers.clone().map(|_| ())))
        .map_err(Error::from)
        .and_then(|()| {
            let req = LayerSync {
                name: name.to_string(),
                layer_dir: layer.dir.clone(),
                upper: layer.upper.clone(),
                node_layers: node_layers.clone().expect("agreed"),
                job: env.get(HostVar::SlurmJobId),
                chunk_size: cfg.chunk_size.value,
            };
            crate::transfer::layer::sync_layer(job, &req).map_err(Error::from)
        });
    if let Err(e) = &r {
        // the tasks of the step waiting for this node's copy (`run --layer`) stop waiting
        if let (Some(step), Ok(nl)) = (env.get(EnvVar::SyncFor), &node_layers) {
            if let Ok(c) = swpool_env::sync::NodeCopies::open(nl, name, &layer.dir) {
                let _ = c.mark_failed(&step, &e.to_string());
            }
        }
    }
    drop(writer_lock);
    r
}
