//! `sw-pool run` / `sw-pool shell`: a command in an isolated environment (swpool-env).

use std::ffi::OsString;
use std::path::PathBuf;

use swpool_env::{LayerStore, RunRequest};
use swpool_node::config::{Config, Environment, HostVar};
use swpool_node::ExitStatus;

use crate::cli::{EnvironmentArgs, GlobalArgs, RunArgs, ShellArgs};
use crate::output::Printer;

mod pools;
mod views;

/// An error of `run`/`shell`: its message and exit status (this library does not link
/// swpool-core: its `Error`'s trust variants would link libcrypto into the front, measured ~0.8 ms
/// more per start; the full program maps it to one).
#[derive(Debug)]
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

    /// Print it as every sw-pool error is printed (one write).
    pub fn print(&self) {
        crate::eline!("sw-pool: error: {}", self.message);
    }
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
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

pub fn run(g: &GlobalArgs, a: RunArgs, env: &Environment) -> Result<(), Failed> {
    start(g, a.env, a.cmd, env, None, None)
}

pub fn shell(g: &GlobalArgs, a: ShellArgs, env: &Environment) -> Result<(), Failed> {
    let sh = env
        .get_os(HostVar::Shell)
        .filter(|s| !s.is_empty())
        .map(OsString::from)
        .unwrap_or_else(|| "/bin/sh".into());
    let layer = a.env.layer.as_deref();
    let mark = prompt_mark(
        env.get(swpool_node::config::EnvVar::Prompt),
        layer,
        a.env.root,
    );
    if !mark.is_empty() {
        // bash runs PROMPT_COMMAND before each prompt, after its start-up files set PS1: the mark
        // goes in front of whatever PS1 they made; other shells get it in PS1 from the environment
        // (single-threaded here: nothing reads the environment concurrently)
        let ps1 = env.get_os(HostVar::Ps1).map(OsString::from);
        let mut with_mark = OsString::from(&mark);
        with_mark.push(ps1.as_deref().unwrap_or_else(|| "$ ".as_ref()));
        std::env::set_var("PS1", with_mark);
        std::env::set_var("SW_POOL_PROMPT_MARK", &mark);
        let mut pc = OsString::from(
            r#"case "$PS1" in "$SW_POOL_PROMPT_MARK"*) ;; *) PS1="$SW_POOL_PROMPT_MARK$PS1" ;; esac"#,
        );
        if let Some(before) = env.get_os(HostVar::PromptCommand).filter(|p| !p.is_empty()) {
            pc.push("; ");
            pc.push(before);
        }
        std::env::set_var("PROMPT_COMMAND", pc);
    }
    let what = match (layer, a.env.root) {
        (Some(l), false) => format!("with layer {l} (what you change in / goes into it)"),
        (Some(l), true) => format!(
            "with layer {l} AS ROOT: uid 0 inside is you, not the node's root; what you change in / \
             goes into the layer"
        ),
        (None, false) => "without a layer (/ is the node's, read-only where it is for you)".into(),
        (None, true) => "without a layer AS ROOT: uid 0 inside is you, not the node's root".into(),
    };
    let name = layer.map_or_else(
        || "the environment".to_string(),
        |l| format!("layer {l}'s environment"),
    );
    let quiet = g.quiet;
    let enter = (!quiet)
        .then(|| format!("sw-pool: entering an isolated environment {what}; `exit` leaves it"));
    let leave = (!quiet).then(|| format!("sw-pool: left {name}"));
    let login = a.login.map(|file| Login {
        file,
        layer: layer.unwrap_or("-").to_string(),
    });
    start(
        g,
        a.env,
        vec![sh],
        env,
        Some((enter, leave)),
        login.as_ref(),
    )
}

/// A `shell` started for a login (`shell-init --login-env`, `shell --login FILE`).
struct Login {
    /// Made by the login's shell: gets the environment's shell's status once that has run.
    file: PathBuf,
    layer: String,
}

/// The one line a login gets when its environment cannot start: why, and what to do.
pub fn login_failed_line(layer: &str, why: &str) -> String {
    let why = why.trim().replace('\n', "; ");
    format!(
        "sw-pool: your logins go into layer {layer}'s environment (shell-init --login-env {layer}), \
         but it could not start: {why}. This is a plain shell: fix that, or log in without it \
         (SW_POOL_NO_LOGIN_ENV=1, or drop --login-env from your shell's start-up file)"
    )
}

/// Tell the login's shell that the environment's shell ran (its status in `file`, which that
/// shell made): it then ends with it. Opened without following a link and without creating.
fn login_ran(file: &std::path::Path, status: i32) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let wrote = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(file)
        .and_then(|mut f| writeln!(f, "{status}"));
    if let Err(e) = wrote {
        crate::eline!(
            "sw-pool: warning: cannot tell the login's shell that the environment ended ({}: {e}): \
             it stays open, `exit` it",
            file.display()
        );
    }
}

/// The mark `shell` puts before the prompt: `$SW_POOL_PROMPT` with `LAYER` replaced (empty: none),
/// else `(sw-pool LAYER) `, and `, root` with `--root`.
pub fn prompt_mark(configured: Option<String>, layer: Option<&str>, root: bool) -> String {
    let name = layer.unwrap_or("-");
    match configured {
        Some(c) => c.replace("LAYER", name),
        None => format!("(sw-pool {name}{}) ", if root { ", root" } else { "" }),
    }
}

/// The key the environments of one job step's tasks (or of one MPI launcher's ranks) on this node
/// meet by; `None`: the environment is this command's alone.
fn step_key(env: &Environment) -> Option<String> {
    env.get(HostVar::SlurmJobId)
        .zip(env.get(HostVar::SlurmStepId))
        .and_then(|(j, s)| swpool_env::rendezvous::step_key(&j, &s))
        // under an MPI launcher outside a Slurm step (mpirun, mpiexec) the ranks it starts on this
        // node share one environment as a step's tasks do (MPI needs a node's ranks in one
        // namespace: Open MPI's shared memory breaks across them, MPICH's hangs now and then),
        // keyed by the process that started them all
        .or_else(|| {
            swpool_node::slurm::launched_by_launcher(env)
                .unwrap_or(false)
                .then(rustix::process::getppid)
                .flatten()
                .and_then(|p| swpool_env::rendezvous::launcher_key(p.as_raw_nonzero().get() as u32))
        })
}

/// Set up, run, and exit with the command's status (125 when the environment could not be made).
fn start(
    g: &GlobalArgs,
    a: EnvironmentArgs,
    argv: Vec<OsString>,
    env: &Environment,
    lines: Option<(Option<String>, Option<String>)>,
    login: Option<&Login>,
) -> Result<(), Failed> {
    let p = Printer::new(g, false);
    let setup_failed = |e: &dyn std::fmt::Display| -> ! {
        match login {
            Some(l) => crate::eline!("{}", login_failed_line(&l.layer, &e.to_string())),
            None => Failed::new(ExitStatus::BadInput, e).print(),
        }
        std::process::exit(swpool_env::EXIT_SETUP)
    };
    let cfg = match config(env) {
        Ok(c) => c,
        Err(e) => setup_failed(&e),
    };
    let store = match store(a.layer_dir, &cfg, env) {
        Ok(s) => s,
        Err(e) => setup_failed(&e),
    };
    let self_exe = match std::env::current_exe() {
        Ok(x) => x,
        Err(e) => setup_failed(&format!("cannot find our own executable: {e}")),
    };
    let step_key = step_key(env);
    let synced = match &a.layer {
        Some(name) => match synced_copy(&store, &cfg, name, step_key.as_deref(), env) {
            Ok(s) => s.map(|s| swpool_env::Synced {
                keep_upper: a.keep_upper.clone(),
                ..s
            }),
            Err(e) => setup_failed(&e),
        },
        None => None,
    };
    if a.keep_upper.is_some() && synced.is_none() {
        setup_failed(&"--keep-upper applies in a job over the layer's node-local copy (after `sw-pool layer sync`); here the environment writes into the layer itself");
    }
    let shadows = match shadows(&a.shadow, &cfg, env, &p) {
        Ok(s) => s,
        Err(e) => setup_failed(&e),
    };
    let bases = match bases(&a.base, &cfg, env) {
        Ok(b) => b,
        Err(e) => setup_failed(&e),
    };
    let mut pools = match pools::pools(&a.pool, &cfg, env, pools::Voice::of(g)) {
        Ok(p) => p,
        Err(e) if login.is_some() => setup_failed(&e),
        Err(e) => {
            e.print();
            std::process::exit(swpool_env::EXIT_SETUP)
        }
    };
    match views::views(&a.cache, &self_exe, env) {
        Ok(v) => pools.extend(v),
        Err(e) => setup_failed(&e),
    }
    // only an environment with a layer, of a job step or of an MPI launcher's ranks is shared
    let shared = a.layer.is_some() || step_key.is_some();
    let req = RunRequest {
        argv,
        layer: a.layer,
        root: a.root,
        self_exe,
        path_var: env.path_var().map(OsString::from),
        verbose: g.verbose > 0,
        // environments meet their joiners in the user's private state directory on the node
        state_dir: shared
            .then(|| match swpool_node::state::StateDir::open_default(env) {
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
        tree_server: (cfg.fuse_reader.value == swpool_node::config::FuseReader::SwPool)
            .then(swpool_node::mount::serve::beside_us)
            .flatten(),
    };
    if req.root {
        // uid 0's commands (dpkg's ldconfig and start-stop-daemon, apt's, `make install`'s) are
        // in the sbin directories a user's PATH lacks; pid 1 and the command inherit this
        // process's environment (single-threaded here: nothing reads it concurrently)
        std::env::set_var("PATH", root_path(env.path_var()));
    }
    let (enter, leave) = lines.unwrap_or_default();
    let on_plan = |plan: &swpool_env::Plan| {
        if let Some(l) = &enter {
            crate::eline!("{l}");
        }
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
            if let Some(l) = login {
                // the shell itself could not run in it (a layer that hides or breaks it): the
                // login stays a plain shell
                if matches!(
                    out.status,
                    swpool_env::EXIT_CANNOT_EXEC | swpool_env::EXIT_NOT_FOUND
                ) {
                    setup_failed(&format!(
                        "its shell ({}) could not run in it (exit status {})",
                        req.argv[0].to_string_lossy(),
                        out.status
                    ));
                }
                login_ran(&l.file, out.status);
            }
            if let Some(l) = &leave {
                crate::eline!("{l} (exit status {})", out.status);
            }
            std::process::exit(out.status)
        }
        Err(e) => setup_failed(&e),
    }
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

/// Where the pool `spec` names (NAME/VERSION, a pool file or a mount point) is mounted for this
/// user on this node, if it is. The error itself is not formatted here (see `Failed`): the callers
/// say what it means.
fn loaded_at(spec: &str, cfg: &Config, uid: u32, env: &Environment) -> Option<PathBuf> {
    swpool_node::locate::mountpoint_of(
        std::path::Path::new(spec),
        cfg.mount_dir.value.as_deref(),
        uid,
        env,
    )
    .ok()
    .map(|(mp, _)| mp)
}

/// The binds of `--shadow NAME/VERSION...`: each pool must be loaded by this user on this node.
fn shadows(
    specs: &[String],
    cfg: &Config,
    env: &Environment,
    p: &Printer,
) -> Result<Vec<(PathBuf, PathBuf)>, Failed> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let root = cfg.shadow_root.value.clone().ok_or_else(|| {
        Failed::new(
            ExitStatus::BadInput,
            "--shadow needs to know where the site's original software is: config key              `shadow_root` (or $SW_POOL_SHADOW_ROOT), e.g. /sw",
        )
    })?;
    let uid = rustix::process::getuid().as_raw();
    let mut out = Vec::new();
    for spec in specs {
        let Some(mp) = loaded_at(spec, cfg, uid, env) else {
            return Err(Failed::new(
                ExitStatus::BadInput,
                format!(
                    "--shadow {spec}: it is not loaded on {}: run `sw-pool load {spec}` first \
                     (in a job, once for all its nodes: `sw-pool load` in the batch script)",
                    swpool_node::users::hostname()
                ),
            ));
        };
        let (binds, none) = swpool_node::shadow::private_shadows(&mp, &root);
        if binds.is_empty() {
            p.warn(format!(
                "--shadow {spec}: none of its packages ({}) has an original under {}: nothing is shadowed",
                if none.is_empty() { "none in install/".to_string() } else { none.join(", ") },
                root.display()
            ));
        }
        out.extend(binds);
    }
    Ok(out)
}

/// The `--base` pools, bottom first: each a squashfs pool this user loaded (or mounted) on this
/// node with FUSE, whose verified node-local image the environment mounts again inside itself.
fn bases(
    specs: &[String],
    cfg: &Config,
    env: &Environment,
) -> Result<Vec<swpool_env::Base>, Failed> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    use swpool_node::state::Serving;
    let uid = rustix::process::getuid().as_raw();
    let node = swpool_node::users::hostname();
    let bad = |m: String| Failed::new(ExitStatus::BadInput, m);
    let state = swpool_node::state::StateDir::open_default(env).map_err(|e| {
        bad(format!(
            "--base: cannot open this user's state on {node}: {e}"
        ))
    })?;
    let records = state.records().map_err(|e| {
        bad(format!(
            "--base: cannot read this user's mounts on {node}: {e}"
        ))
    })?;
    let mut out = Vec::new();
    for spec in specs {
        let not_loaded = || {
            bad(format!(
                "--base {spec}: it is not loaded on {node}: run `sw-pool load {spec}` first (in a \
                 job, once for all its nodes: `sw-pool load` in the batch script)"
            ))
        };
        let Some(mp) = loaded_at(spec, cfg, uid, env) else {
            return Err(not_loaded());
        };
        let rec = records
            .iter()
            .flatten()
            .filter(|r| r.uid == uid && !r.pending && r.mount_point == mp)
            .max_by_key(|r| r.created)
            .ok_or_else(not_loaded)?;
        match rec.serving {
            Some(Serving::Fuse { .. }) | None => {}
            _ => {
                return Err(bad(format!(
                    "--base {spec}: its mount at {} on {node} is not served from a verified \
                     node-local copy by FUSE; --base mounts that copy again inside the \
                     environment: load it with a full copy (`sw-pool load {spec}`, not --lazy or \
                     --in-place, not through the site's helper)",
                    mp.display()
                )))
            }
        }
        if rec.format != swpool_node::image::ImageFormat::Squashfs {
            return Err(bad(format!(
                "--base {spec}: {} is a {} image; a base is mounted inside the environment by \
                 sw-pool's squashfs server (or squashfuse_ll), so it must be a squashfs pool \
                 (`sw-pool build --format squashfs`)",
                rec.image.display(),
                rec.format.as_str()
            )));
        }
        out.push(swpool_env::Base {
            label: rec
                .pool
                .as_ref()
                .map_or_else(|| spec.clone(), |p| format!("{}/{}", p.name, p.version)),
            image: rec.image.clone(),
            at: mp,
            digest: rec.pool.as_ref().map(|p| p.digest.clone()),
        });
    }
    Ok(out)
}

/// In a job: the layer's copy `sw-pool layer sync` made on this node for the job, if any (then
/// the environment stacks a fresh node-local upper on it; else it writes into the layer itself).
fn synced_copy(
    store: &LayerStore,
    cfg: &Config,
    name: &str,
    step_key: Option<&str>,
    env: &Environment,
) -> Result<Option<swpool_env::Synced>, Failed> {
    let Some(job) = env.get(HostVar::SlurmJobId).filter(|j| !j.is_empty()) else {
        return Ok(None);
    };
    let base = swpool_node::cache::base_dir(None, cfg.cache_dir.value.as_deref(), env);
    let uid = rustix::process::getuid().as_raw();
    // a step over several nodes: the layer goes to them first (unless this job has synced it)
    let step_nodes: u32 = env
        .get(HostVar::SlurmStepNumNodes)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let cache = if step_nodes > 1 {
        Some(
            swpool_node::cache::dir(&base, uid, true)
                .map_err(|e| Failed::new(e.exit_status(), e))?,
        )
    } else {
        swpool_node::cache::existing_dir(&base, uid).map_err(|e| Failed::new(e.exit_status(), e))?
    };
    let Some(cache) = cache else {
        return Ok(None);
    };
    let layers = swpool_node::cache::layers_dir(&cache);
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
        let mut cmd = swpool_node::slurm::overlap_step(
            env,
            &prog,
            ["-q", "layer", "sync", name].map(OsString::from),
            u64::from(nodes),
            Some(&nodelist),
            &format!(",SW_POOL_SYNC_FOR={step}"),
        )
        .command(env.path_var())
        .map_err(|e| fail(format!("cannot sync layer {name} to the step's nodes: {e}")))?;
        // the new step's own MPI and task variables, not this task's
        for k in env.step_task_names() {
            cmd.env_remove(k);
        }
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

#[cfg(test)]
mod tests {
    use super::root_path;

    #[test]
    fn root_path_adds_the_sbin_directories_before_their_bin() {
        let p = |s: &str| root_path(Some(s.as_ref())).into_string().unwrap();
        assert_eq!(
            p("/home/u/bin:/usr/local/bin:/usr/bin:/bin"),
            "/home/u/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        );
        // already there: unchanged
        let full = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
        assert_eq!(p(full), full);
        // a merged-/usr PATH without /bin: /sbin at the end
        assert_eq!(p("/usr/bin"), "/usr/sbin:/usr/bin:/usr/local/sbin:/sbin");
        // no PATH: a usual one
        assert_eq!(root_path(None), std::ffi::OsString::from(full));
    }
}
