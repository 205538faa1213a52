//! `sw-pool run` / `sw-pool shell`'s logic: what an isolated environment ([`swpool_env`]) is made
//! of on this node, from the command's options and the captured process environment — the layer
//! store and the job's node-local copy of the layer ([`layer`]), `--shadow` and `--base` ([`binds`]),
//! `--pool` ([`pools`]) and `--cache` ([`views`]), the step key its tasks meet by — and its start.
//! The front (`sw-pool`) parses the command line and prints; everything it decides is here.

use std::ffi::OsString;
use std::path::PathBuf;

use swpool_env::{LayerStore, RunRequest};

use crate::config::{Config, Environment, HostVar};
use crate::ExitStatus;

mod binds;
mod layer;
pub mod pools;
pub mod views;

pub use pools::Voice;

/// An error of `run`/`shell`: its message and exit status (typed as every sw-pool error's status;
/// the message names what failed, where, and what to do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub status: ExitStatus,
    pub message: String,
}

impl Failed {
    pub fn new(status: ExitStatus, m: impl std::fmt::Display) -> Failed {
        Failed {
            status,
            message: m.to_string(),
        }
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failed {}

/// What the command line asks of an environment (`sw-pool run|shell`'s options).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--layer NAME`: the writable layer.
    pub layer: Option<String>,
    /// `--root`: uid 0 inside.
    pub root: bool,
    /// `--layer-dir DIR`.
    pub layer_dir: Option<PathBuf>,
    /// `--keep-upper DIR` (with a layer's node-local copy in a job).
    pub keep_upper: Option<PathBuf>,
    /// `--shadow NAME/VERSION...`.
    pub shadow: Vec<String>,
    /// `--base NAME/VERSION...`, bottom first.
    pub base: Vec<String>,
    /// `--pool SPEC...`.
    pub pool: Vec<String>,
    /// `--cache DIR...`.
    pub cache: Vec<PathBuf>,
    /// How much the fetches of `--pool` say (the front's `-q` / `-v`).
    pub voice: Voice,
}

/// An environment ready to start: the request [`swpool_env::run`] takes and the layer store.
pub struct Prepared {
    pub request: RunRequest,
    pub store: LayerStore,
}

fn config(env: &Environment) -> Result<Config, Failed> {
    Config::load(env).map_err(|e| Failed::new(ExitStatus::BadInput, e))
}

/// The layer store: `--layer-dir`, config `layer_dir` / `$SW_POOL_LAYER_DIR`, else the default.
pub fn store(flag: Option<PathBuf>, cfg: &Config, env: &Environment) -> Result<LayerStore, Failed> {
    let root = flag
        .or_else(|| cfg.layer_dir.value.clone())
        .or_else(|| {
            LayerStore::default_root(env.get_os(HostVar::XdgDataHome), env.get_os(HostVar::Home))
        })
        .ok_or_else(|| {
            Failed::new(
                ExitStatus::BadInput,
                "no layer directory: $HOME is not set; give --layer-dir DIR (or config `layer_dir`)",
            )
        })?;
    Ok(LayerStore::new(root, rustix::process::getuid().as_raw()))
}

/// Everything `argv`'s environment is made of on this node, placed and checked (a `--pool` is
/// fetched to the node here, a layer synced to a step's nodes): the request to start it with.
/// `warn` gets what is worth saying but stops nothing. The pools' module changes are made in this
/// process's environment (the command inherits it; call from a single-threaded program).
pub fn prepare(
    o: Options,
    argv: Vec<OsString>,
    env: &Environment,
    warn: &dyn Fn(String),
) -> Result<Prepared, Failed> {
    let cfg = config(env)?;
    let store = store(o.layer_dir, &cfg, env)?;
    let self_exe = std::env::current_exe().map_err(|e| {
        Failed::new(
            ExitStatus::BadInput,
            format!("cannot find our own executable: {e}"),
        )
    })?;
    let step_key = step_key(env);
    let synced = match &o.layer {
        Some(name) => layer::synced_copy(&store, &cfg, name, step_key.as_deref(), env)?.map(|s| {
            swpool_env::Synced {
                keep_upper: o.keep_upper.clone(),
                ..s
            }
        }),
        None => None,
    };
    if o.keep_upper.is_some() && synced.is_none() {
        return Err(Failed::new(
            ExitStatus::BadInput,
            "--keep-upper applies in a job over the layer's node-local copy (after `sw-pool layer \
             sync`); here the environment writes into the layer itself",
        ));
    }
    let shadows = binds::shadows(&o.shadow, &cfg, env, warn)?;
    let bases = binds::bases(&o.base, &cfg, env)?;
    let mut pools = pools::pools(&o.pool, &cfg, env, o.voice)?;
    let warm = (!o.cache.is_empty()).then(|| warm_dir(&cfg, env)).flatten();
    // a job-wide view's socket lies in the user's state directory
    let view_state = (!o.cache.is_empty())
        .then(|| crate::state::StateDir::open_default(env).ok())
        .flatten()
        .map(|d| d.path().to_path_buf());
    pools.extend(
        views::views(
            &o.cache,
            &self_exe,
            warm.as_deref(),
            view_state.as_deref(),
            env,
        )
        .map_err(|e| Failed::new(ExitStatus::BadInput, e))?,
    );
    // only an environment with a layer, of a job step or of an MPI launcher's ranks is shared
    let shared = o.layer.is_some() || step_key.is_some();
    let request = RunRequest {
        argv,
        layer: o.layer,
        root: o.root,
        self_exe,
        path_var: env.path_var().map(OsString::from),
        verbose: o.voice == Voice::Verbose,
        // environments meet their joiners in the user's private state directory on the node
        state_dir: shared
            .then(|| match crate::state::StateDir::open_default(env) {
                Ok(d) => Some(d.path().to_path_buf()),
                Err(e) => {
                    tracing::warn!("no shared environments on this node: {e}");
                    None
                }
            })
            .flatten(),
        home: env
            .get_os(HostVar::Home)
            .map(PathBuf::from)
            .filter(|h| h.is_absolute()),
        // the tasks of one job step (or the ranks of one launcher) on a node share one environment
        step_key,
        synced,
        shadows,
        helper: cfg.mount_helper.value.clone(),
        bases,
        pools,
        // squashfs pools: sw-pool's one-hop server unless the config picks squashfuse_ll
        tree_server: (cfg.fuse_reader.value == crate::config::FuseReader::SwPool)
            .then(crate::mount::serve::beside_us)
            .flatten(),
    };
    Ok(Prepared { request, store })
}

/// Start the prepared environment and wait for its command: [`swpool_env::run`], with root's
/// `PATH` for a command run as uid 0. `on_plan` is called once the way it is made is chosen.
pub fn start(
    p: &Prepared,
    env: &Environment,
    on_plan: &dyn Fn(&swpool_env::Plan),
) -> Result<swpool_env::RunOutcome, Failed> {
    if p.request.root {
        // uid 0's commands (dpkg's ldconfig and start-stop-daemon, apt's, `make install`'s) are
        // in the sbin directories a user's PATH lacks; pid 1 and the command inherit this
        // process's environment (single-threaded here: nothing reads it concurrently)
        std::env::set_var("PATH", root_path(env.path_var()));
    }
    swpool_env::run(&p.request, &p.store, on_plan).map_err(|e| Failed::new(ExitStatus::BadInput, e))
}

/// The key the environments of one job step's tasks (or of one MPI launcher's ranks) on this node
/// meet by; `None`: the environment is this command's alone.
pub fn step_key(env: &Environment) -> Option<String> {
    env.get(HostVar::SlurmJobId)
        .zip(env.get(HostVar::SlurmStepId))
        .and_then(|(j, s)| swpool_env::rendezvous::step_key(&j, &s))
        // under an MPI launcher outside a Slurm step (mpirun, mpiexec) the ranks it starts on this
        // node share one environment as a step's tasks do (MPI needs a node's ranks in one
        // namespace: Open MPI's shared memory breaks across them, MPICH's hangs now and then),
        // keyed by the process that started them all
        .or_else(|| {
            crate::slurm::launched_by_launcher(env)
                .unwrap_or(false)
                .then(rustix::process::getppid)
                .flatten()
                .and_then(|p| swpool_env::rendezvous::launcher_key(p.as_raw_nonzero().get() as u32))
        })
}

/// The `PATH` of a command run as uid 0 (`--root`): the caller's, with each of
/// `/usr/local/sbin`, `/usr/sbin` and `/sbin` it lacks put before its `bin` (as in root's own
/// PATH), or at the end when that is not there either.
pub fn root_path(user: Option<&std::ffi::OsStr>) -> OsString {
    use std::path::Path;
    let mut dirs: Vec<PathBuf> = user
        .filter(|p| !p.is_empty())
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_else(|| {
            ["/usr/local/bin", "/usr/bin", "/bin"]
                .map(PathBuf::from)
                .to_vec()
        });
    for (sbin, bin) in [
        ("/usr/local/sbin", "/usr/local/bin"),
        ("/usr/sbin", "/usr/bin"),
        ("/sbin", "/bin"),
    ] {
        if dirs.iter().any(|d| d == Path::new(sbin)) {
            continue;
        }
        match dirs.iter().position(|d| d == Path::new(bin)) {
            Some(i) => dirs.insert(i, sbin.into()),
            None => dirs.push(sbin.into()),
        }
    }
    std::env::join_paths(dirs).unwrap_or_else(|_| user.unwrap_or_default().to_os_string())
}

/// The user's node-local directory of views' warm starts ([`crate::cache::views_dir`]), made
/// private if missing; `None` (said in a log line: the views then start cold) when it cannot be.
fn warm_dir(cfg: &Config, env: &Environment) -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = crate::cache::base_dir(None, cfg.cache_dir.value.as_deref(), env);
    let uid = rustix::process::getuid().as_raw();
    let r = crate::cache::dir(&base, uid, true)
        .map_err(|e| e.to_string())
        .and_then(|c| {
            let d = crate::cache::views_dir(&c);
            match std::fs::DirBuilder::new().mode(0o700).create(&d) {
                Ok(()) => Ok(d),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(d),
                Err(e) => Err(format!("{}: {e}", d.display())),
            }
        });
    r.map_err(|e| tracing::warn!("--cache: no warm start on this node: {e}"))
        .ok()
}

/// `srun --overlap` of `exe ARGS` on the step's `nodelist` (`slurm::overlap_step`, `export` its
/// extra variables) as a command to run, without this task's own step variables: the new step
/// sets its own.
fn nested_step(
    env: &Environment,
    exe: &std::path::Path,
    args: impl IntoIterator<Item = OsString>,
    nodes: u64,
    nodelist: &str,
    export: &str,
) -> Result<std::process::Command, crate::exec::ExecError> {
    let mut cmd = crate::slurm::overlap_step(env, exe, args, nodes, Some(nodelist), export)
        .command(env.path_var())?;
    for k in env.step_task_names() {
        cmd.env_remove(k);
    }
    Ok(cmd)
}

/// The full program beside this one (`layer sync`, `cache fetch`: MPI and the trust code), or
/// this one where it is not there.
fn full_program() -> Result<PathBuf, Failed> {
    let exe = std::env::current_exe().map_err(|e| {
        Failed::new(
            ExitStatus::BadInput,
            format!("cannot find our own executable: {e}"),
        )
    })?;
    let full = exe.with_file_name("sw-pool-full");
    Ok(if full.is_file() { full } else { exe })
}

#[cfg(test)]
mod tests;
