//! `run`, `shell` and the layer store of the sw-pool library (shared with the front), their errors
//! as swpool-core's.

use std::path::PathBuf;

use swpool_core::config::{Config, Environment};
use swpool_core::Error;
use swpool_env::LayerStore;

use crate::cli::{GlobalArgs, RunArgs, ShellArgs};
use sw_pool::environment::Failed;

/// A failure of the library's `run`/`shell` as swpool-core's error (the same message and status).
pub fn error(f: Failed) -> Error {
    Error::other(f.status, f.message)
}

pub fn store(flag: Option<PathBuf>, cfg: &Config, env: &Environment) -> Result<LayerStore, Error> {
    sw_pool::environment::store(flag, cfg, env).map_err(error)
}

pub fn run(g: &GlobalArgs, a: RunArgs, env: &Environment) -> Result<(), Error> {
    sw_pool::environment::run(g, a, env).map_err(error)
}

pub fn shell(g: &GlobalArgs, a: ShellArgs, env: &Environment) -> Result<(), Error> {
    sw_pool::environment::shell(g, a, env).map_err(error)
}
