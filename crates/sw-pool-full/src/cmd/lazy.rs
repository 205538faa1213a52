//! `sw-pool load --lazy POOL` (the launcher) and `sw-pool-full lazy-serve` (one node's server, a
//! task of the background step the launcher starts): see `swpool_core::ondemand`.
//!
//! The launcher authorizes the pool itself first (a clear error before anything starts), then
//! starts the servers and waits for them (`swpool_core::ondemand::launch`: a background step of the
//! job, detached, so that `eval "$(sw-pool load --lazy …)"` does not wait for it), and prints.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use swpool_core::config::{Environment, HostVar};
use swpool_core::env::{self, PoolMount, Snapshot};
use swpool_core::load::NodeContext;
use swpool_core::mount::RealSys;
use swpool_core::ondemand::launch::{self, Servers};
use swpool_core::ondemand::serve::LazyRequest;
use swpool_core::Job;
use swpool_core::{collective::Collective, Error, ExitStatus};

use crate::cli::{GlobalArgs, LazyServeArgs, LoadArgs, ViewServeArgs};
use crate::eline;

/// One node's server of a job-wide view (`swpool_core::ondemand::view_serve`), a task of the
/// background step task 0 of `run --cache` starts.
pub fn view_serve(_g: &GlobalArgs, a: ViewServeArgs, env: &Environment) -> Result<(), Error> {
    use swpool_core::ondemand::view_serve::{self, ViewRequest};
    let job = Job::init(env)?;
    let req = ViewRequest {
        tree: a.tree.clone(),
        socket: a.socket.clone(),
        stall: Duration::from_secs(a.stall.max(1)),
        wait: Duration::from_secs(a.wait.max(1)),
        max_kept: a.max_kept,
        small: a.small,
        small_total: a.small_total,
    };
    let stop = AtomicBool::new(false);
    let r = view_serve::serve(&job, &req, &stop, &|| {
        tracing::debug!("{}: serving {}", job.hostname(), a.socket.display())
    });
    match r {
        Ok(s) => {
            if view_serve::claim_end_line() {
                tracing::info!(
                    asked = s.exchange.asked,
                    answered = s.exchange.answered,
                    "{}",
                    s.line(job.hostname(), &a.tree)
                );
            }
            Ok(())
        }
        Err(e) => super::finish_collective(job, Err(e)),
    }
}

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
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{}", launch::ready_line(&rec.mount_point, nodes as u64));
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
                let _ = writeln!(o, "{}", launch::failed_line(&e));
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
    let t0 = Instant::now();
    let quiet = g.quiet;
    let ready = servers.start_and_wait(
        env,
        &format!("{}/{}", m.name, m.version),
        Duration::from_secs_f64(a.timeout.max(0.1)),
        &|w| {
            if !quiet {
                eline!("sw-pool: warning: {w}");
            }
        },
    )?;
    let log = &servers.log;
    let mp = ready.mount_point;
    if a.json {
        crate::output::json(&serde_json::json!({
            "pool": {"name": m.name, "version": m.version, "digest": m.digest, "src": src,
                     "trust": verdict.to_string()},
            "mountpoint": mp, "nodes": ready.nodes, "lazy": true, "log": log,
            "seconds": t0.elapsed().as_secs_f64(),
        }));
        return Ok(());
    }
    if g.verbose > 0 {
        eline!(
            "sw-pool: {}/{} served on demand on {} node(s) at {} after {:.3} s ({}; log {})",
            m.name,
            m.version,
            ready.nodes,
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
