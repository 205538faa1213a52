//! `sw-pool run` / `sw-pool shell`: a command in an isolated environment (swpool-env).

use std::ffi::OsString;
use std::path::PathBuf;

use swpool_core::config::{Environment, HostVar};
use swpool_core::{Error, ExitStatus};
use swpool_env::{LayerStore, RunRequest};

use crate::cli::{EnvironmentArgs, GlobalArgs, RunArgs, ShellArgs};
use crate::output::Printer;

/// The layer store: `--layer-dir`, config `layer_dir` / `$SW_POOL_LAYER_DIR`, else the default.
pub fn store(flag: Option<PathBuf>, env: &Environment) -> Result<LayerStore, Error> {
    let cfg = swpool_core::config::Config::load(env)?;
    let root = flag
        .or(cfg.layer_dir.value)
        .or_else(|| {
            LayerStore::default_root(env.get_os(HostVar::XdgDataHome), env.get_os(HostVar::Home))
        })
        .ok_or_else(|| {
            Error::other(
                ExitStatus::BadInput,
                "no layer directory: $HOME is not set; give --layer-dir DIR (or config `layer_dir`)",
            )
        })?;
    Ok(LayerStore::new(root, rustix::process::getuid().as_raw()))
}

pub fn run(g: &GlobalArgs, a: RunArgs, env: &Environment) -> Result<(), Error> {
    start(g, a.env, a.cmd, env)
}

pub fn shell(g: &GlobalArgs, a: ShellArgs, env: &Environment) -> Result<(), Error> {
    let sh = env
        .get_os(HostVar::Shell)
        .filter(|s| !s.is_empty())
        .map(OsString::from)
        .unwrap_or_else(|| "/bin/sh".into());
    start(g, a.env, vec![sh], env)
}

/// Set up, run, and exit with the command's status (125 when the environment could not be made).
fn start(
    g: &GlobalArgs,
    a: EnvironmentArgs,
    argv: Vec<OsString>,
    env: &Environment,
) -> Result<(), Error> {
    let p = Printer::new(g, false);
    let setup_failed = |e: &dyn std::fmt::Display| -> ! {
        crate::output::print_error(&Error::other(ExitStatus::BadInput, e));
        std::process::exit(swpool_env::EXIT_SETUP)
    };
    let store = match store(a.layer_dir, env) {
        Ok(s) => s,
        Err(e) => setup_failed(&e),
    };
    let self_exe = match std::env::current_exe() {
        Ok(x) => x,
        Err(e) => setup_failed(&format!("cannot find our own executable: {e}")),
    };
    let req = RunRequest {
        argv,
        layer: a.layer,
        root: a.root,
        self_exe,
        path_var: env.path_var().map(OsString::from),
        verbose: g.verbose > 0,
        // environments meet their joiners in the user's private state directory on the node
        state_dir: match swpool_core::state::StateDir::open_default(env) {
            Ok(d) => Some(d.path().to_path_buf()),
            Err(e) => {
                tracing::warn!("no shared environments on this node: {e}");
                None
            }
        },
        home: env
            .get_os(HostVar::Home)
            .map(PathBuf::from)
            .filter(|h| h.is_absolute()),
        // the tasks of one job step on a node share one environment
        step_key: env
            .get(HostVar::SlurmJobId)
            .zip(env.get(HostVar::SlurmStepId))
            .and_then(|(j, s)| swpool_env::share::step_key(&j, &s)),
    };
    let on_plan = |plan: &swpool_env::Plan| {
        if p.verbosity >= crate::output::Verbosity::Verbose {
            crate::eline!(
                "sw-pool: environment: {} ({})",
                plan.method.as_str(),
                plan.why
            );
        }
    };
    match swpool_env::run(&req, &store, &on_plan) {
        Ok(out) => {
            let _ = crate::output::stdout_status();
            std::process::exit(out.status)
        }
        Err(e) => setup_failed(&e),
    }
}
