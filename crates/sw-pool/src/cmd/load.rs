//! `sw-pool load POOL`: the main job (DESIGN.md, "The main job"), collective under MPI.
//!
//! Node leaders do the I/O; every rank takes part in each agreement, so a failure anywhere fails
//! every rank with the same message naming the node. Standard output carries only the shell code
//! (or `--json`), so that `eval "$(sw-pool load …)"` and the profile.d function work; messages and
//! `-v` timings go to standard error.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use swpool_core::cache;
use swpool_core::env::{self, PoolMount, Shell, Snapshot};
use swpool_core::mount::{paths, MountOptions, RealSys};
use swpool_core::pool::Pool;
use swpool_core::state::{self, AcquireRequest, StateDir};
use swpool_core::transfer::{copy, CopyOptions, CopyReport, Job};
use swpool_core::trust::{authorize, TrustPolicy, TrustedKeys, Verdict};
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, LoadArgs};

/// One message line on stderr in a single write(2): under mpirun, stdout and stderr are forwarded
/// separately, and a line written in pieces (as `eprintln!` does) can be split by the shell code on
/// stdout.
macro_rules! eline {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($t)*));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

/// Everything a leader decided before the copy, sent to the other ranks of its node.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Plan {
    src: PathBuf,
    dest: PathBuf,
    name: String,
    version: String,
    digest: String,
    verdict: String,
}

/// Agree on a step: every rank passes its local result; all get `Ok` or all get an error that
/// names the failing node(s). A failing rank keeps its own exit status, the others get 8.
pub fn agree<T>(job: &Job, r: Result<T, Error>) -> Result<T, Error> {
    let local = r.as_ref().map(|_| ()).map_err(|e| e.to_string());
    match (job.all_agree(local), r) {
        (Ok(()), Ok(v)) => Ok(v),
        (Err(te), Err(own)) => Err(Error::other(own.exit_status(), te.to_string())),
        (Err(te), Ok(_)) => Err(te.into()),
        (Ok(()), Err(own)) => Err(own), // cannot happen: all_agree fails when any rank failed
    }
}

/// The shell for printed environment code: `--shell`, `$SW_POOL_SHELL`, else from `$SHELL`.
pub fn shell(flag: Option<&str>) -> Result<Shell, Error> {
    match flag.map(String::from).or_else(|| {
        std::env::var("SW_POOL_SHELL")
            .ok()
            .filter(|s| !s.is_empty())
    }) {
        Some(s) => s
            .parse()
            .map_err(|e: String| Error::other(ExitStatus::BadInput, e)),
        None => Ok(Shell::from_env()),
    }
}

pub(crate) fn resolve(spec: &Path, pool_path: &[PathBuf]) -> Result<PathBuf, Error> {
    let s = spec.to_string_lossy();
    if !spec.exists() && paths::is_pool_spec(&s) {
        return Ok(paths::resolve_pool(&s, pool_path)?);
    }
    if !spec.is_file() {
        return Err(Error::other(
            ExitStatus::BadInput,
            format!(
                "pool {} does not exist (give a pool file, or NAME/VERSION found on $SW_POOL_PATH)",
                spec.display()
            ),
        ));
    }
    Ok(swpool_core::exec::absolute(spec))
}

/// Create `-m DIR` if it is missing (its parent must exist), like the paper's `-m $LOCAL_TMPDIR/mnt`.
pub(crate) fn explicit_mountpoint(mp: &Path) -> Result<PathBuf, Error> {
    if std::fs::symlink_metadata(mp).is_err() {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(mp)
            .map_err(|e| {
                Error::other(
                    ExitStatus::BadInput,
                    format!("cannot create mount point {}: {e}", mp.display()),
                )
            })?;
    }
    Ok(swpool_core::mount::canonical_mountpoint(mp)?)
}

/// Job-aware loading: `sw-pool load` (or `unload`) run as a single process in a Slurm allocation of
/// several nodes (a batch script, an `salloc` shell) re-runs itself as one task per node of the
/// allocation (`srun --overlap`), so the pool is broadcast to and mounted on every node, and its
/// standard output (rank 0's environment change) is the caller's. Returns when nothing is to be
/// spread; otherwise it does not return (exec). `SW_POOL_SPREAD=0` turns it off.
pub fn spread_over_allocation() -> Result<(), Error> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if get("SW_POOL_SPREAD").as_deref() == Some("0") || get("SLURM_JOB_ID").is_none() {
        return Ok(());
    }
    if swpool_core::transfer::job::launched_by_launcher(|k| std::env::var(k).ok()).unwrap_or(true) {
        return Ok(()); // already one task of an MPI launch: the launcher chose the nodes
    }
    // inside a job step (srun -N1 …) we are one task on one node: do what was asked, here
    if let Some(step) = get("SLURM_STEP_ID") {
        if !matches!(
            step.as_str(),
            "batch" | "interactive" | "4294967294" | "4294967291"
        ) {
            return Ok(());
        }
    }
    let nodes: u64 = get("SLURM_JOB_NUM_NODES")
        .or_else(|| get("SLURM_NNODES"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    if nodes <= 1 {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(|e| {
        Error::other(
            ExitStatus::System,
            format!("cannot find our own executable: {e}"),
        )
    })?;
    let mut cmd = swpool_core::exec::ToolCommand::new(swpool_core::exec::Tool::Srun)
        .arg("--overlap")
        .arg(format!("--nodes={nodes}"))
        .arg(format!("--ntasks={nodes}"))
        .arg("--ntasks-per-node=1")
        .arg("--kill-on-bad-exit=1")
        .arg("--export=ALL,SW_POOL_SPREAD=0");
    match get("SW_POOL_SRUN_MPI") {
        Some(m) if m == "none" => {}
        Some(m) => cmd = cmd.arg(format!("--mpi={m}")),
        None => cmd = cmd.arg("--mpi=pmix"),
    }
    let cmd = cmd.arg(&exe).args(std::env::args_os().skip(1));
    tracing::debug!("spreading over the job's {nodes} nodes: {}", cmd.cmdline());
    use std::os::unix::process::CommandExt;
    let e = cmd.command()?.exec();
    Err(Error::other(
        ExitStatus::Tool,
        format!("cannot run srun to load on the job's {nodes} nodes: {e} (set SW_POOL_SPREAD=0 to load on this node only)"),
    ))
}

pub fn run(g: &GlobalArgs, a: LoadArgs) -> Result<(), Error> {
    spread_over_allocation()?;
    let job = Job::init()?;
    let r = load(g, &a, &job);
    super::finish_collective(job, r)
}

fn load(g: &GlobalArgs, a: &LoadArgs, job: &Job) -> Result<(), Error> {
    let t0 = Instant::now();
    let rank0 = job.world_rank() == 0;
    let leader = job.is_leader();
    let uid = rustix::process::geteuid().as_raw();
    let mut cfg = super::config()?;
    if a.require_signature {
        cfg.require_signature.flag(Some(true));
    }
    let shell = shell(a.shell.as_deref())?;

    // 1. resolve, read the manifest, apply the trust policy: before any byte moves
    let plan: Result<Plan, Error> = if leader {
        (|| {
            let src = resolve(&a.pool, &cfg.pool_path.value)?;
            let pool = Pool::open(&src)?;
            let policy = TrustPolicy {
                require_signature: cfg.require_signature.value,
                keys: TrustedKeys::load(&TrustedKeys::default_dirs()),
            };
            let verdict = match authorize(&pool, &policy)? {
                Verdict::Trusted(s) => format!("signed by {} ({})", s.name, s.fingerprint),
                Verdict::Unsigned => "unsigned".into(),
                Verdict::UnknownSigner { fingerprint } => {
                    format!("signed by an untrusted key {fingerprint}")
                }
            };
            let m = &pool.manifest;
            let base = cache::base_dir(a.cache_dir.as_deref(), cfg.cache_dir.value.as_deref());
            let dest = cache::entry_path(
                &cache::dir(&base, uid, true)?,
                &m.name,
                &m.version,
                &m.digest,
            );
            Ok(Plan {
                src,
                dest,
                name: m.name.clone(),
                version: m.version.clone(),
                digest: m.digest.clone(),
                verdict,
            })
        })()
    } else {
        Ok(Plan::default())
    };
    let plan = agree(job, plan)?;
    let bytes = serde_json::to_vec(&plan).expect("plan serialises");
    let plan: Plan = serde_json::from_slice(&job.from_leader(leader.then_some(&bytes[..]))?)
        .map_err(|e| {
            Error::other(
                ExitStatus::Internal,
                format!("plan from the node leader: {e}"),
            )
        })?;
    let t_plan = t0.elapsed();
    if rank0 && !a.json && !plan.verdict.starts_with("signed by ") {
        eline!(
            "sw-pool: warning: {} is {}; nothing vouches for its content",
            plan.src.display(),
            plan.verdict
        );
    }

    // 2.-6. the broadcast into the node-local cache (nothing when every node holds it already)
    let opts = CopyOptions {
        progress: false,
        ..CopyOptions::default()
    };
    let report: CopyReport = copy(job, &plan.src, &plan.dest, &opts)?;

    // 7. mount on every node
    let t_mount = Instant::now();
    let sys = RealSys::new();
    let job_id = super::mount::job_id(a.job_id.clone());
    let mounted: Result<Option<(PathBuf, bool)>, Error> = if leader {
        (|| {
            let mp = match &a.mountpoint {
                Some(m) => explicit_mountpoint(m)?,
                None => {
                    let root = paths::default_mount_dir(cfg.mount_dir.value.as_deref(), uid);
                    paths::create_mountpoint(&root, &plan.name, &plan.version, uid)?
                }
            };
            let dir = StateDir::open_default()?;
            let req = AcquireRequest {
                image: plan.dest.clone(),
                mountpoint: mp,
                options: MountOptions::parse(None)?,
                job_id: job_id.clone(),
                timeout: Duration::from_secs_f64(a.timeout.max(0.1)),
                once_per_job: false,
            };
            let r = state::acquire(&sys, &dir, &req)?;
            Ok(Some((r.record.mount_point.clone(), r.reused)))
        })()
    } else {
        Ok(None)
    };
    let local_mount = mounted.as_ref().ok().cloned().flatten();
    let mounted = match agree(job, mounted) {
        Ok(m) => m,
        Err(e) => {
            // all or nothing: the nodes that did mount take their mount (or reference) back
            if let Some((mp, _)) = local_mount {
                if let Ok(dir) = StateDir::open_default() {
                    let _ = state::release(&sys, &dir, &mp, true, job_id.as_deref());
                }
            }
            return Err(e);
        }
    };
    if leader {
        let _ = cache::touch(&plan.dest); // least-recently-used bookkeeping
        super::cache::prune_to_watermarks(&cfg, &plan.dest, uid);
    }
    let mp_bytes = mounted
        .as_ref()
        .map(|(m, _)| m.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mp = PathBuf::from(
        String::from_utf8_lossy(&job.from_leader(leader.then_some(mp_bytes.as_bytes()))?)
            .into_owned(),
    );
    let t_mount = t_mount.elapsed();
    let total = t0.elapsed();

    // 8. the environment change (world rank 0 speaks for the job)
    if !rank0 {
        return Ok(());
    }
    let ph = &report.phases;
    if g.verbose > 0 && !a.json {
        let lines = [
            ("resolve+trust", t_plan),
            ("preflight", ph.preflight),
            ("read", ph.read),
            ("distribute", ph.distribute),
            ("write", ph.write),
            ("verify", ph.verify),
            ("commit", ph.commit),
            ("mount", t_mount),
            ("total", total),
        ];
        eline!(
            "sw-pool: loaded {}/{} on {} node(s){}: {}",
            plan.name,
            plan.version,
            report.nodes,
            if report.skipped_all {
                " (already cached everywhere)"
            } else {
                ""
            },
            mp.display()
        );
        for (k, d) in lines {
            eline!("{k:<14} {:8.3} s", d.as_secs_f64());
        }
        eline!(
            "bytes read from {}: {}, sent: {}, written: {} (all nodes)",
            plan.src.display(),
            report.bytes_read_from_src,
            report.bytes_sent,
            report.bytes_written
        );
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "pool": {"name": plan.name, "version": plan.version, "digest": plan.digest, "src": plan.src, "trust": plan.verdict},
                "cache": plan.dest,
                "mountpoint": mp,
                "nodes": report.nodes,
                "nodes_received": report.nodes_received,
                "ranks": job.world_size(),
                "skipped_all": report.skipped_all,
                "bytes_read_from_src": report.bytes_read_from_src,
                "bytes_sent": report.bytes_sent,
                "bytes_written": report.bytes_written,
                "phases": {
                    "resolve_trust": t_plan.as_secs_f64(),
                    "preflight": ph.preflight.as_secs_f64(),
                    "read": ph.read.as_secs_f64(),
                    "distribute": ph.distribute.as_secs_f64(),
                    "write": ph.write.as_secs_f64(),
                    "verify": ph.verify.as_secs_f64(),
                    "commit": ph.commit.as_secs_f64(),
                    "copy": ph.total.as_secs_f64(),
                    "mount": t_mount.as_secs_f64(),
                    "total": total.as_secs_f64(),
                },
            }))
            .expect("json")
        );
        return Ok(());
    }
    if !mp.join("modulefiles").is_dir() {
        eline!(
            "sw-pool: warning: {}/{} has no modulefiles/ directory: no modules will appear",
            plan.name,
            plan.version
        );
    }
    let pm = PoolMount {
        mount_point: mp.clone(),
        pool: Some((plan.name.clone(), plan.version.clone())),
    };
    let mut changes = env::load_changes(&Snapshot::from_env(), &pm);
    if job_id.is_some() {
        // the job's later steps mount the same pool on their nodes (TaskProlog)
        changes.push(swpool_core::slurm::add_job_pool(
            std::env::var(swpool_core::slurm::JOB_POOLS_VAR)
                .ok()
                .as_deref(),
            &swpool_core::slurm::JobPool {
                name: plan.name,
                version: plan.version,
                digest: plan.digest,
                src: plan.src,
                mount_point: mp,
            },
        ));
    }
    let code = env::render(shell, &changes).map_err(|e| Error::other(ExitStatus::BadInput, e))?;
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(code.as_bytes());
    let _ = out.flush();
    Ok(())
}
