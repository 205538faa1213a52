//! `sw-pool load --lazy POOL` (the launcher) and `sw-pool-full lazy-serve` (one node's server, a
//! task of the background step the launcher starts): see `swpool_core::ondemand`.
//!
//! The launcher authorizes the pool itself first (a clear error before anything starts), then
//! starts `srun --overlap` of `lazy-serve` on every node of the job, detached, its output going to
//! a log in the user's state directory (so that `eval "$(sw-pool load --lazy …)"` does not wait for
//! it), and waits for task 0's line saying every node mounted (or why not). The step lives as long
//! as the job; `unload` (the mounts go) or the end of the job ends it.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use swpool_core::config::{Environment, HostVar};
use swpool_core::env::{self, PoolMount, Snapshot};
use swpool_core::load::NodeContext;
use swpool_core::mount::RealSys;
use swpool_core::ondemand::serve::LazyRequest;
use swpool_core::Job;
use swpool_core::{collective::Collective, Error, ExitStatus};

use crate::cli::{GlobalArgs, LazyServeArgs, LoadArgs};
use crate::eline;

const READY: &str = "sw-pool-lazy: ready ";
const FAILED: &str = "sw-pool-lazy: failed ";

/// One node's server (see the module's documentation).
pub fn serve(_g: &GlobalArgs, a: LazyServeArgs, env: &Environment) -> Result<(), Error> {
    let job = Job::init(env)?;
    let rank0 = job.world_rank() == 0;
    let r = (|| {
        let cfg = super::config(env)?;
        let sys = RealSys::new(env.path_var());
        let node = NodeContext::real(&cfg, env, &sys)?;
        let req = LazyRequest {
            pool: a.pool.clone(),
            digest: Some(a.digest.clone()),
            mountpoint: a.mountpoint.clone(),
            cache_dir: a.cache_dir.clone(),
            job_id: super::mount::job_id(a.job_id.clone(), env),
            stall: Duration::from_secs(a.stall.max(1)),
            timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
            prefetch: a.prefetch.clone(),
        };
        let stop = AtomicBool::new(false);
        let nodes = job.nodes();
        swpool_core::ondemand::serve::serve(&job, &node, &req, &stop, &|rec| {
            if rank0 {
                let line = serde_json::json!({"mountpoint": rec.mount_point, "nodes": nodes});
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{READY}{line}");
                let _ = o.flush();
            }
        })
    })();
    match r {
        Ok(stats) => {
            tracing::info!(
                asked = stats.asked,
                answered = stats.answered,
                "{}: on-demand server ends",
                job.hostname()
            );
            Ok(())
        }
        Err(e) => {
            if rank0 {
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{FAILED}{}", e.to_string().replace('\n', " "));
                let _ = o.flush();
            }
            super::finish_collective(job, Err(e))
        }
    }
}

/// `load --lazy` (see the module's documentation).
///
/// Three ways, by where it runs: in a Slurm job's batch script or shell (not in a step), the servers
/// are a background step of the job; started by an MPI launcher (`mpirun -np N sw-pool load --lazy
/// POOL`, one rank per node, or `srun --mpi=pmix` in a step), every rank is its node's server, in
/// the foreground, until the mounts go (`sw-pool unload` on the nodes) or it is interrupted;
/// neither (one node outside a job), the node's server is started detached, like the step, and
/// lives until `unload`.
pub fn launch(g: &GlobalArgs, a: &LoadArgs, env: &Environment) -> Result<(), Error> {
    if matches!(swpool_core::job::launched_by_launcher(env), Ok(true)) {
        return foreground(g, a, env);
    }
    let in_job = env.get(HostVar::SlurmJobId).is_some();
    let job_id = super::mount::job_id(a.job_id.clone(), env).filter(|_| in_job);
    let (cfg, shell) = super::load::settings(a, env)?;
    let sys = RealSys::new(env.path_var());
    let node = NodeContext::real(&cfg, env, &sys)?;
    // authorize here first: a clear error before any step starts
    let src = swpool_core::load::resolve(&a.pool, &cfg.pool_path.value)?;
    let (pool, verdict) = swpool_core::load::open_authorized(&node, &src)?;
    let m = &pool.manifest;
    if let Some(w) = verdict.warning(&src).filter(|_| !g.quiet) {
        eline!("sw-pool: warning: {w}");
    }
    let nodes = swpool_core::slurm::job_nodes(env);
    let me = super::own_exe()?;
    let full = me.with_file_name("sw-pool-full");
    let exe = if full.is_file() { full } else { me };
    let mut args: Vec<std::ffi::OsString> = vec![
        "lazy-serve".into(),
        "--digest".into(),
        m.digest.clone().into(),
        "--timeout".into(),
        a.timeout.to_string().into(),
    ];
    if let Some(j) = &job_id {
        args.extend(["--job-id".into(), j.into()]);
    }
    if let Some(p) = &a.mountpoint {
        args.extend(["-m".into(), swpool_core::exec::absolute(p).into_os_string()]);
    }
    if let Some(p) = &a.cache_dir {
        args.extend([
            "--cache-dir".into(),
            swpool_core::exec::absolute(p).into_os_string(),
        ]);
    }
    if let Some(list) = prefetch_list(g, a.prefetch.as_deref(), &src, m)? {
        args.extend(["--prefetch".into(), list.into_os_string()]);
    }
    args.push(src.clone().into_os_string());
    let short = m
        .digest
        .rsplit(':')
        .next()
        .unwrap_or("")
        .get(..12)
        .unwrap_or("");
    let log: PathBuf = node.state.path().join(format!(
        "lazy-{}-{short}.log",
        job_id.as_deref().unwrap_or("local")
    ));
    let servers = Servers {
        exe,
        args,
        log,
        in_job,
        nodes,
    };
    let start = || servers.start(env);
    let t0 = Instant::now();
    let ready = wait_ready(g, a, &servers, &start, m)?;
    let log = &servers.log;
    let mp = ready["mountpoint"]
        .as_str()
        .map(PathBuf::from)
        .unwrap_or_default();
    if a.json {
        crate::output::json(&serde_json::json!({
            "pool": {"name": m.name, "version": m.version, "digest": m.digest, "src": src,
                     "trust": verdict.to_string()},
            "mountpoint": mp, "nodes": ready["nodes"], "lazy": true, "log": log,
            "seconds": t0.elapsed().as_secs_f64(),
        }));
        return Ok(());
    }
    if g.verbose > 0 {
        eline!(
            "sw-pool: {}/{} served on demand on {} node(s) at {} after {:.3} s ({}; log {})",
            m.name,
            m.version,
            ready["nodes"],
            mp.display(),
            t0.elapsed().as_secs_f64(),
            if in_job {
                "background step"
            } else {
                "server in the background until `sw-pool unload`"
            },
            log.display()
        );
    }
    let changes = env::load_changes(
        &Snapshot::from_env(env),
        &PoolMount {
            mount_point: mp,
            pool: Some((m.name.clone(), m.version.clone())),
        },
    );
    let code = env::render(shell, &changes).map_err(|e| Error::other(ExitStatus::BadInput, e))?;
    crate::output::shell_code(&code);
    Ok(())
}

/// The node servers `load --lazy` starts: the program and its arguments, the log their output goes
/// to, and where (a background step of the job on `nodes` nodes, or this node's server, detached).
struct Servers {
    exe: PathBuf,
    args: Vec<std::ffi::OsString>,
    log: PathBuf,
    in_job: bool,
    nodes: u64,
}

impl Servers {
    /// (Re)start the servers, their output in a fresh log.
    fn start(&self, env: &Environment) -> Result<std::process::Child, Error> {
        let out = std::fs::File::create(&self.log).map_err(|e| {
            Error::other(ExitStatus::System, format!("{}: {e}", self.log.display()))
        })?;
        let err = out
            .try_clone()
            .map_err(|e| Error::other(ExitStatus::System, e.to_string()))?;
        let (mut c, cmdline) = if self.in_job {
            let cmd = swpool_core::slurm::overlap_step(
                env,
                &self.exe,
                self.args.clone(),
                self.nodes,
                None,
                "",
            );
            (cmd.command(env.path_var())?, cmd.cmdline())
        } else {
            let line = format!(
                "{} {}",
                self.exe.display(),
                self.args.join(" ".as_ref()).to_string_lossy()
            );
            let mut c = std::process::Command::new(&self.exe);
            c.args(&self.args).stdin(std::process::Stdio::null());
            (c, line)
        };
        {
            use std::os::unix::process::CommandExt;
            c.stdout(out).stderr(err).process_group(0);
        }
        tracing::debug!("starting the servers: {cmdline}");
        c.spawn().map_err(|e| {
            Error::other(
                ExitStatus::Tool,
                format!("cannot start the servers ({cmdline}): {e}"),
            )
        })
    }
}

/// Wait until every node mounted (the servers' ready line, its JSON), they failed (their failed
/// line, or their end: once more if Open MPI could not connect two nodes), or the time is up.
fn wait_ready(
    g: &GlobalArgs,
    a: &LoadArgs,
    servers: &Servers,
    start: &dyn Fn() -> Result<std::process::Child, Error>,
    m: &swpool_core::pool::Manifest,
) -> Result<serde_json::Value, Error> {
    let mut child = start()?;
    let mut retried = false;
    let t0 = Instant::now();
    // the servers start MPI, authorize on every node and mount: allow for the job's size
    let limit = Duration::from_secs_f64(a.timeout.max(0.1)) + Duration::from_secs(60);
    let tail = |s: &str| {
        s.lines()
            .rev()
            .take(8)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n  ")
    };
    loop {
        let text = std::fs::read_to_string(&servers.log).unwrap_or_default();
        if let Some(l) = text.lines().find_map(|l| l.strip_prefix(READY)) {
            return Ok(serde_json::from_str::<serde_json::Value>(l).unwrap_or_default());
        }
        if let Some(l) = text.lines().find_map(|l| l.strip_prefix(FAILED)) {
            let _ = child.wait();
            return Err(Error::other(ExitStatus::System, l.to_string()));
        }
        if let Ok(Some(st)) = child.try_wait() {
            // Open MPI's TCP wire-up between two nodes can fail under load ("failed to TCP connect
            // to a peer", EINPROGRESS; seen on the testbed's busy 2 cores): nothing was mounted
            // for good (a node that had mounted released it), so the servers start once more
            if !retried && text.contains("Open MPI failed to TCP connect to a peer") {
                retried = true;
                if !g.quiet {
                    eline!(
                        "sw-pool: warning: the on-demand servers could not start MPI (Open MPI \
                         failed to connect two nodes over TCP); starting them once more"
                    );
                }
                child = start()?;
                continue;
            }
            return Err(Error::other(
                ExitStatus::System,
                format!(
                    "the on-demand servers ended ({st}) before every node mounted {}/{}:\n  {}\n(log: {})",
                    m.name,
                    m.version,
                    tail(&text),
                    servers.log.display()
                ),
            ));
        }
        if t0.elapsed() > limit {
            let _ = child.kill(); // srun (it ends the step's tasks) or the server: our child
            let _ = child.wait();
            return Err(Error::other(
                ExitStatus::System,
                format!(
                    "the on-demand servers did not mount {}/{} on every node within {} s:\n  {}\n(log: {})",
                    m.name,
                    m.version,
                    limit.as_secs(),
                    tail(&text),
                    servers.log.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `load --lazy` started by an MPI launcher: this rank is its node's server (see [`launch`]).
fn foreground(g: &GlobalArgs, a: &LoadArgs, env: &Environment) -> Result<(), Error> {
    let job = Job::init(env)?;
    let rank0 = job.world_rank() == 0;
    let r = (|| {
        if job.world_size() != job.nodes() {
            return Err(Error::other(
                ExitStatus::Usage,
                format!(
                    "load --lazy under an MPI launcher takes one rank per node ({} ranks on {} \
                     nodes): mpirun --map-by ppr:1:node, or srun --ntasks-per-node=1",
                    job.world_size(),
                    job.nodes()
                ),
            ));
        }
        let (cfg, _) = super::load::settings(a, env)?;
        let sys = RealSys::new(env.path_var());
        let node = NodeContext::real(&cfg, env, &sys)?;
        let src = swpool_core::load::resolve(&a.pool, &cfg.pool_path.value)?;
        // (checked by every server against the pool node 0 authorized; one that does not fit is
        // skipped with a warning)
        let prefetch = a
            .prefetch
            .as_deref()
            .and_then(|p| swpool_core::ondemand::prefetch::requested(p, &src))
            .map(|(p, _)| p);
        let req = LazyRequest {
            pool: src,
            digest: None,
            mountpoint: a.mountpoint.as_deref().map(swpool_core::exec::absolute),
            cache_dir: a.cache_dir.as_deref().map(swpool_core::exec::absolute),
            job_id: super::mount::job_id(a.job_id.clone(), env),
            stall: Duration::from_secs(60),
            timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
            prefetch,
        };
        let stop = AtomicBool::new(false);
        let (nodes, quiet) = (job.nodes(), g.quiet);
        swpool_core::ondemand::serve::serve(&job, &node, &req, &stop, &|rec| {
            if rank0 && !quiet {
                eline!(
                    "sw-pool: {} served on demand on {nodes} node(s) at {}; it stays until \
                     `sw-pool unload {}` on every node (or an interrupt)",
                    a.pool.display(),
                    rec.mount_point.display(),
                    rec.mount_point.display()
                );
            }
        })
    })();
    super::finish_collective(job, r.map(|_| ()))
}

/// `--prefetch FILE|auto`: the list's path for the servers, checked here first (a clear error
/// before any step starts; the policy: `swpool_core::ondemand::prefetch::choose`).
fn prefetch_list(
    g: &GlobalArgs,
    arg: Option<&str>,
    pool: &std::path::Path,
    m: &swpool_core::pool::manifest::Manifest,
) -> Result<Option<PathBuf>, Error> {
    let Some(arg) = arg else { return Ok(None) };
    let (path, skipped) = swpool_core::ondemand::prefetch::choose(arg, pool, m)?;
    if let Some(w) = skipped.filter(|_| !g.quiet) {
        eline!("sw-pool: warning: {w}");
    }
    Ok(path)
}
