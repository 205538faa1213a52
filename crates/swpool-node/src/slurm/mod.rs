//! Slurm integration: the pieces the `sw-pool slurm prolog|task-prolog|epilog` entry points share.
//!
//! * [`JobPool`] / [`JOB_POOLS_VAR`]: the pools a job loaded, carried in the job's environment
//!   (`SW_POOL_JOB_POOLS`), so that every later step's TaskProlog mounts the same pool (same digest)
//!   at the same mount point on its node, and the job's `MODULEPATH` is right everywhere.
//! * [`JobEnv`]: who and what a hook runs for (`SLURM_JOB_ID`, `SLURM_JOB_UID`, …), validated.
//! * [`task_prolog_lines`]: the `export NAME=value` / `unset NAME` lines slurmstepd reads from a
//!   TaskProlog (it takes the value literally: no shell quoting).
//! * [`syslog`]: one line per action, tagged `sw-pool`, with the job id (like the Oslo disk-image
//!   tools' `logger -t software_images`).

use std::path::PathBuf;

use crate::config::{EnvVar, Environment, HostVar};
use crate::env::Change;

/// The job's loaded pools, for the TaskProlog of later steps.
pub const JOB_POOLS_VAR: &str = EnvVar::JobPools.name();
/// Pools to load in every step of a job, given at submission (`sbatch --export=ALL,SW_POOL_LOAD=demo/1.0`).
pub const LOAD_VAR: &str = EnvVar::Load.name();

/// A pool as loaded by a job: what, from where, and where it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobPool {
    pub name: String,
    pub version: String,
    /// The manifest digest (`blake3:…`): every node must mount this very pool.
    pub digest: String,
    /// The pool file on shared storage.
    pub src: PathBuf,
    pub mount_point: PathBuf,
    /// The node-local cache entry the job's load used: a later step's node that lacks the pool
    /// caches it in the same directory (not in one its own environment would choose).
    pub cache: Option<PathBuf>,
}

fn enc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' | ':' | '@' | '\n' | '\r' | '\0' => o.push_str(&format!("%{:02X}", c as u32)),
            c => o.push(c),
        }
    }
    o
}

fn dec(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut o = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad %-escape in {s:?}"))?;
            o.push(h);
            i += 3;
        } else {
            o.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(o).map_err(|_| format!("{s:?} is not UTF-8"))
}

impl JobPool {
    /// `name@version@digest@src@mountpoint[@cache]`, each field %-escaped.
    pub fn encode(&self) -> String {
        let mut f = vec![
            enc(&self.name),
            enc(&self.version),
            enc(&self.digest),
            enc(&self.src.to_string_lossy()),
            enc(&self.mount_point.to_string_lossy()),
        ];
        if let Some(c) = &self.cache {
            f.push(enc(&c.to_string_lossy()));
        }
        f.join("@")
    }

    pub fn decode(s: &str) -> Result<JobPool, String> {
        let f: Vec<&str> = s.split('@').collect();
        if f.len() != 5 && f.len() != 6 {
            return Err(format!(
                "{s:?} is not name@version@digest@pool@mountpoint[@cache]"
            ));
        }
        let p = JobPool {
            name: dec(f[0])?,
            version: dec(f[1])?,
            digest: dec(f[2])?,
            src: PathBuf::from(dec(f[3])?),
            mount_point: PathBuf::from(dec(f[4])?),
            cache: f.get(5).map(|c| dec(c).map(PathBuf::from)).transpose()?,
        };
        if p.name.is_empty() || p.version.is_empty() || !p.digest.starts_with("blake3:") {
            return Err(format!(
                "{s:?}: empty name/version or a digest that is not blake3:…"
            ));
        }
        if !p.src.is_absolute()
            || !p.mount_point.is_absolute()
            || p.cache.as_ref().is_some_and(|c| !c.is_absolute())
        {
            return Err(format!(
                "{s:?}: pool and mount point must be absolute paths"
            ));
        }
        Ok(p)
    }
}

/// Parse `SW_POOL_JOB_POOLS` (`:`-separated entries).
pub fn decode_job_pools(v: &str) -> Result<Vec<JobPool>, String> {
    v.split(':')
        .filter(|e| !e.is_empty())
        .map(JobPool::decode)
        .collect()
}

/// `SW_POOL_JOB_POOLS` with `p` added (replacing an entry for the same mount point).
pub fn add_job_pool(current: Option<&str>, p: &JobPool) -> Change {
    let mut v: Vec<JobPool> = current
        .map(decode_job_pools)
        .and_then(Result::ok)
        .unwrap_or_default();
    v.retain(|e| e.mount_point != p.mount_point);
    v.push(p.clone());
    Change::Set(
        JOB_POOLS_VAR,
        v.iter().map(JobPool::encode).collect::<Vec<_>>().join(":"),
    )
}

/// `SW_POOL_JOB_POOLS` without the entry mounted at `mp` (`None`: nothing to change).
pub fn remove_job_pool(current: Option<&str>, mp: &std::path::Path) -> Option<Change> {
    let mut v = decode_job_pools(current?).ok()?;
    let n = v.len();
    v.retain(|e| e.mount_point != mp);
    if v.len() == n {
        return None;
    }
    Some(if v.is_empty() {
        Change::Unset(JOB_POOLS_VAR)
    } else {
        Change::Set(
            JOB_POOLS_VAR,
            v.iter().map(JobPool::encode).collect::<Vec<_>>().join(":"),
        )
    })
}

/// `SW_POOL_LOAD`: pool specs separated by commas or white space.
pub fn parse_load_var(v: &str) -> Vec<String> {
    v.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The lines a TaskProlog prints for slurmstepd. Values are taken literally by Slurm, so a value
/// with a line break cannot be passed (refused).
pub fn task_prolog_lines(changes: &[Change]) -> Result<String, String> {
    let mut s = String::new();
    for c in changes {
        match c {
            Change::Set(k, v) => {
                if v.contains('\n') || v.contains('\r') {
                    return Err(format!("{k}'s value contains a line break"));
                }
                s.push_str(&format!("export {k}={v}\n"));
            }
            Change::Unset(k) => s.push_str(&format!("unset {k}\n")),
        }
    }
    Ok(s)
}

/// Who and what a Slurm hook runs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobEnv {
    pub job_id: String,
    pub uid: u32,
    pub gid: Option<u32>,
    pub user: Option<String>,
}

/// A Slurm job id: digits, optionally `_`-joined (array tasks as some sites pass them).
pub fn valid_job_id(j: &str) -> bool {
    !j.is_empty()
        && j.len() <= 32
        && j.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        && j.as_bytes()[0].is_ascii_digit()
}

impl JobEnv {
    /// From a hook's environment `env` (`SLURM_JOB_ID`, `SLURM_JOB_UID`, `SLURM_JOB_GID`,
    /// `SLURM_JOB_USER`; empty values count as unset), with explicit values taking precedence.
    pub fn from_env(
        env: &Environment,
        job: Option<&str>,
        uid: Option<u32>,
    ) -> Result<JobEnv, String> {
        let get = |v: HostVar| env.get_nonempty(v);
        let job_id = job
            .map(String::from)
            .or_else(|| get(HostVar::SlurmJobId))
            .filter(|j| !j.is_empty())
            .ok_or(
                "no job id: SLURM_JOB_ID is not set (run it from Slurm, or give --job JOB_ID)",
            )?;
        if !valid_job_id(&job_id) {
            return Err(format!("{job_id:?} is not a Slurm job id"));
        }
        let uid = match uid {
            Some(u) => u,
            None => get(HostVar::SlurmJobUid)
                .ok_or("SLURM_JOB_UID is not set (run it from Slurm, or give --uid UID)")?
                .parse()
                .map_err(|_| "SLURM_JOB_UID is not a number".to_string())?,
        };
        Ok(JobEnv {
            job_id,
            uid,
            gid: get(HostVar::SlurmJobGid).and_then(|g| g.parse().ok()),
            user: get(HostVar::SlurmJobUser).filter(|u| !u.is_empty()),
        })
    }
}

pub use swpool_sys::syslog::{syslog, Level};

mod broadcast;
pub use broadcast::{broadcast, spank_batch_broadcast};

/// Job-aware loading: `sw-pool load` (or `unload`) run as a single process in a Slurm allocation
/// of several nodes (a batch script, an `salloc` shell) re-runs itself as one task per node of the
/// allocation (`srun --overlap`), so the pool is broadcast to and mounted on every node, and its
/// standard output (rank 0's environment change) is the caller's. `None` when nothing is to be
/// spread: not in a job, `SW_POOL_SPREAD=0`, already one task of a launch or of a step, one node.
/// The variables come from `env`; empty ones count as unset.
pub fn spread_command(
    env: &Environment,
    exe: &std::path::Path,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Option<crate::exec::ToolCommand> {
    let mut env = env.clone();
    env.retain(|_, v| !v.is_empty());
    if env.get(EnvVar::Spread).as_deref() == Some("0") || env.get(HostVar::SlurmJobId).is_none() {
        return None;
    }
    if launched_by_launcher(&env).unwrap_or(true) {
        return None; // already one task of an MPI launch: the launcher chose the nodes
    }
    // inside a job step (srun -N1 …) we are one task on one node: do what was asked, here
    if let Some(step) = env.get(HostVar::SlurmStepId) {
        if !matches!(
            step.as_str(),
            "batch" | "interactive" | "4294967294" | "4294967291"
        ) {
            return None;
        }
    }
    let nodes = job_nodes(&env);
    if nodes <= 1 {
        return None;
    }
    Some(overlap_step(&env, exe, args, nodes, None, ""))
}

/// The number of nodes of the job (`SLURM_JOB_NUM_NODES`, else `SLURM_NNODES`; 1 outside a job).
pub fn job_nodes(env: &Environment) -> u64 {
    env.get(HostVar::SlurmJobNumNodes)
        .or_else(|| env.get(HostVar::SlurmNnodes))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// How sbatch passes the SPANK plugin's `--layer` on to the job's sruns.
const SPANK_LAYER_OPTION: &str = "SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_layer";

/// Was this process started by an MPI launcher (mpirun, mpiexec, srun with an MPI plugin)?
/// `Err` when started by srun with several tasks but without a PMI plugin (every task would
/// believe it is alone).
pub fn launched_by_launcher(env: &Environment) -> Result<bool, String> {
    for v in [
        HostVar::OmpiCommWorldSize,
        HostVar::PmixRank,
        HostVar::PmiRank,
        HostVar::PmiSize,
        HostVar::MpiLocalnranks,
    ] {
        if env.get(v).is_some() {
            return Ok(true);
        }
    }
    let ntasks = env
        .get(HostVar::SlurmNtasks)
        .or_else(|| env.get(HostVar::SlurmNprocs))
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(1);
    if env.get(HostVar::SlurmStepId).is_some() && ntasks > 1 {
        return Err(format!(
            "started by srun with {ntasks} tasks but without MPI (no PMIx/PMI variables): run it with \
             `srun --mpi=pmix …` (or mpirun) so that the tasks form one MPI job"
        ));
    }
    Ok(false)
}

/// `srun --overlap` of `exe ARGS` as a new step of the job, one task on each of `nodes` nodes
/// (`nodelist`: exactly these), with MPI as `SW_POOL_SRUN_MPI` says (default `pmix`), not
/// spreading again (`SW_POOL_SPREAD=0`; `export` adds `,NAME=VALUE` pairs): how `load` in a batch
/// script and `run --layer`'s sync in a step start their collective.
pub fn overlap_step(
    env: &Environment,
    exe: &std::path::Path,
    args: impl IntoIterator<Item = std::ffi::OsString>,
    nodes: u64,
    nodelist: Option<&str>,
    export: &str,
) -> crate::exec::ToolCommand {
    let mpi = match env.get(EnvVar::SrunMpi) {
        Some(m) if m == "none" => None,
        Some(m) => Some(m.to_string()),
        None => Some("pmix".to_string()),
    };
    // one fence algorithm for MPI_Init's two fences: by default Slurm's pmix plugin runs them as
    // two separate collectives and Open MPI 4.1 ranks can crash in MPI_Init (README "For admins:
    // Slurm", testbed/README.md "Open MPI start-up crash"). A SLURM_PMIX_FENCE already in the
    // environment is kept (an empty one is not a choice: Slurm ignores it and runs its default);
    // the one set here overrides mpi.conf's PMIxCollFence, as any would.
    let fence = if mpi.as_deref().is_some_and(|m| m.starts_with("pmix"))
        && env.get_nonempty(HostVar::SlurmPmixFence).is_none()
    {
        ",SLURM_PMIX_FENCE=tree"
    } else {
        ""
    };
    // --ntasks: a job's SLURM_NTASKS would make srun ignore --ntasks-per-node=1
    let mut cmd = crate::exec::ToolCommand::new(crate::exec::Tool::Srun)
        .arg("--overlap")
        .arg(format!("--nodes={nodes}"))
        .arg(format!("--ntasks={nodes}"))
        .arg("--ntasks-per-node=1")
        .arg("--kill-on-bad-exit=1")
        .arg(format!("--export=ALL,SW_POOL_SPREAD=0{fence}{export}"))
        // sw-pool's own step runs sw-pool, never inside the job's `--layer` environment (the
        // SPANK plugin would otherwise start each of its tasks as `run --layer`, which may sync
        // with a step of its own, and so on)
        .env_remove(SPANK_LAYER_OPTION)
        .env_remove(EnvVar::SpankLayer.name());
    if let Some(l) = nodelist {
        cmd = cmd.arg(format!("--nodelist={l}"));
    }
    if let Some(m) = mpi {
        cmd = cmd.arg(format!("--mpi={m}"));
    }
    cmd.arg(exe).args(args)
}

/// Does `uid` have any sw-pool state or sw-pool FUSE mount on this node?
fn user_has_state(sys: &dyn crate::mount::Sys, uid: u32, env: &Environment) -> bool {
    if !crate::state::candidate_dirs(uid, env).is_empty() {
        return true;
    }
    sys.mounts()
        .map(|m| {
            m.iter()
                .any(|e| e.is_swpool_helper() && e.fuse_user_id() == Some(uid))
        })
        .unwrap_or(false)
}

/// How a root-run hook (Prolog, Epilog) failed.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("sw-pool slurm {kind} for job {job} must run as root (slurmd) or as the job's user (uid {uid})")]
    WrongUser {
        kind: &'static str,
        job: String,
        uid: u32,
    },
    #[error("sw-pool slurm {kind} on {node}: cleaning job {job}'s mounts failed (status {status}); see `sw-pool list` as uid {uid} and syslog (tag sw-pool)")]
    CleanupFailed {
        kind: &'static str,
        node: String,
        job: String,
        uid: u32,
        status: i32,
    },
    #[error("--pool={pool}: on the job's {nodes} node(s): {reason}")]
    Broadcast {
        pool: String,
        nodes: u32,
        reason: String,
    },
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error(transparent)]
    User(#[from] crate::users::UserError),
}

impl HookError {
    pub fn exit_status(&self) -> swpool_format::status::ExitStatus {
        use swpool_format::status::ExitStatus;
        match self {
            HookError::WrongUser { .. } => ExitStatus::Usage,
            HookError::CleanupFailed { .. } => ExitStatus::System,
            HookError::Broadcast { .. } => ExitStatus::Collective,
            HookError::State(e) => e.exit_status(),
            HookError::User(e) => e.exit_status(),
        }
    }
}

/// The Epilog as root, where the site configured its mount helper: `HELPER cleanup --job-id J`
/// directly (no sudo) drops every reference of the job there, whoever took it (site pools the
/// users' loads mounted, shadow mounts of module loads, images mounted for the job, ending the
/// job user's processes that still hold those: `--kill`) and frees loop devices that back no
/// mount. Its failure is logged, never fails the epilog by itself: the next epilog or an admin's
/// `cleanup` retries. `true` when it ran through.
fn helper_epilog(sys: &dyn crate::mount::Sys, je: &JobEnv, env: &Environment) -> bool {
    let Ok(cfg) = crate::config::Config::load(env) else {
        return false;
    };
    let Some(helper) = cfg.mount_helper.value else {
        return false;
    };
    if !helper.is_file() {
        return false;
    }
    let cmd = crate::exec::ToolCommand::new(crate::exec::Tool::MountHelper)
        .program(&helper)
        .arg("cleanup")
        .arg("--job-id")
        .arg(&je.job_id)
        .arg("--kill");
    let ran = sys.run(&cmd);
    if let Err(e) = &ran {
        let why = e.helper_reason();
        syslog(
            Level::Error,
            &format!(
                "job={} node={} epilog: {} cleanup --job-id {} failed: {why}",
                je.job_id,
                crate::users::hostname(),
                helper.display(),
                je.job_id
            ),
        );
    }
    ran.is_ok()
}

/// The Prolog (`epilog` false: the user's stale mounts) and the Epilog (`epilog`: the job's
/// references and mounts), run by slurmd as root on every node of the job (or as the job's user):
/// nothing for a user without sw-pool state on the node; else `sw-pool cleanup` as the job's user
/// (no supplementary groups, clean environment), its failure logged to syslog. `env`: the hook's
/// environment (where state may be; what the cleanup is given of it).
pub fn root_hook(
    sys: &dyn crate::mount::Sys,
    epilog: bool,
    je: &JobEnv,
    env: &Environment,
) -> Result<(), HookError> {
    let r = user_hook(sys, epilog, je, env);
    // after the user's own cleanup (which releases the user's references itself): what is left,
    // ending the job's processes that still hold its images; then the user's cleanup once more if
    // it failed (an image it could not unmount while busy is gone now: its record and lease go)
    if epilog && sys.euid() == 0 && helper_epilog(sys, je, env) && r.is_err() {
        return user_hook(sys, epilog, je, env);
    }
    r
}

fn user_hook(
    sys: &dyn crate::mount::Sys,
    epilog: bool,
    je: &JobEnv,
    env: &Environment,
) -> Result<(), HookError> {
    let kind = if epilog { "epilog" } else { "prolog" };
    if !user_has_state(sys, je.uid, env) {
        return Ok(()); // the job's user never used sw-pool on this node
    }
    // the Epilog: the job's references; the Prolog: the user's stale mounts
    let sel = crate::state::Selection {
        job: epilog.then(|| je.job_id.clone()),
        stale: !epilog,
        ..Default::default()
    };
    let euid = sys.euid();
    let node = crate::users::hostname();
    if euid == je.uid {
        crate::state::clean_all_stores(sys, euid, &sel, Some(&je.job_id), env)?;
        return Ok(());
    }
    if euid != 0 {
        return Err(HookError::WrongUser {
            kind,
            job: je.job_id.clone(),
            uid: je.uid,
        });
    }
    let st = crate::state::clean_as(
        je.uid,
        je.gid,
        &sel,
        &["-q"],
        &[(HostVar::SlurmJobId.name(), je.job_id.clone())],
        env,
    )?;
    if st != 0 {
        syslog(
            Level::Error,
            &format!(
                "job={} user={} node={node} {kind}: cleanup failed with status {st}",
                je.job_id,
                je.user.clone().unwrap_or_else(|| je.uid.to_string())
            ),
        );
        return Err(HookError::CleanupFailed {
            kind,
            node,
            job: je.job_id.clone(),
            uid: je.uid,
            status: st,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(mp: &str) -> JobPool {
        JobPool {
            name: "demo".into(),
            version: "1.0".into(),
            digest: "blake3:00ff".into(),
            src: "/shared/p:ools/demo@1.0%.sqfs".into(),
            mount_point: mp.into(),
            cache: Some("/local/sw-pool-0/cache/demo-1.0-00ff.pool".into()),
        }
    }

    #[test]
    fn spreads_only_from_a_multi_node_batch_shell() {
        let run = |pairs: &[(&str, &str)]| {
            spread_command(
                &Environment::from_vars(pairs.iter().copied()),
                std::path::Path::new("/usr/bin/sw-pool"),
                ["load".into(), "demo/1.0".into()],
            )
            .map(|c| c.cmdline())
        };
        let batch = [
            ("SLURM_JOB_ID", "7"),
            ("SLURM_JOB_NUM_NODES", "4"),
            ("SLURM_STEP_ID", "batch"),
        ];
        let line = run(&batch).expect("spreads");
        assert!(
            line.contains("--nodes=4") && line.contains("--ntasks=4"),
            "{line}"
        );
        assert!(
            line.contains("--mpi=pmix") && line.ends_with("load demo/1.0"),
            "{line}"
        );
        // one fence algorithm for Open MPI's two start-up fences, unless the user chose one
        assert!(
            line.contains("--export=ALL,SW_POOL_SPREAD=0,SLURM_PMIX_FENCE=tree"),
            "{line}"
        );
        let mut chosen = batch.to_vec();
        chosen.push(("SLURM_PMIX_FENCE", "ring"));
        let line = run(&chosen).expect("spreads");
        assert!(!line.contains("SLURM_PMIX_FENCE=tree"), "{line}");
        // an empty value chooses nothing (Slurm falls back to its default): tree is still set
        let mut empty = batch.to_vec();
        empty.push(("SLURM_PMIX_FENCE", ""));
        let line = run(&empty).expect("spreads");
        assert!(line.contains(",SLURM_PMIX_FENCE=tree"), "{line}");
        let mut pmi2 = batch.to_vec();
        pmi2.push(("SW_POOL_SRUN_MPI", "pmi2"));
        let line = run(&pmi2).expect("spreads");
        assert!(
            line.contains("--mpi=pmi2") && !line.contains("SLURM_PMIX_FENCE"),
            "{line}"
        );
        assert_eq!(
            run(&[("SLURM_JOB_ID", "7"), ("SLURM_JOB_NUM_NODES", "1")]),
            None
        );
        assert_eq!(run(&[("SLURM_JOB_NUM_NODES", "4")]), None);
        let mut step = batch.to_vec();
        step[2] = ("SLURM_STEP_ID", "3");
        assert_eq!(run(&step), None);
        let mut off = batch.to_vec();
        off.push(("SW_POOL_SPREAD", "0"));
        assert_eq!(run(&off), None);
        let mut mpi = batch.to_vec();
        mpi.push(("OMPI_COMM_WORLD_SIZE", "4"));
        assert_eq!(run(&mpi), None);
    }

    #[test]
    fn job_pools_round_trip_with_awkward_paths() {
        let a = pool("/tmp/m/demo/1.0");
        let b = pool("/local/x:y");
        let c1 = add_job_pool(None, &a);
        let Change::Set(_, v1) = &c1 else { panic!() };
        let c2 = add_job_pool(Some(v1), &b);
        let Change::Set(_, v2) = &c2 else { panic!() };
        assert_eq!(decode_job_pools(v2).unwrap(), vec![a.clone(), b.clone()]);
        // the same mount point replaces, not duplicates
        let Change::Set(_, v3) = add_job_pool(Some(v2), &a) else {
            panic!()
        };
        assert_eq!(decode_job_pools(&v3).unwrap(), vec![b.clone(), a.clone()]);
        let Some(Change::Set(_, v4)) = remove_job_pool(Some(&v3), &b.mount_point) else {
            panic!()
        };
        assert_eq!(decode_job_pools(&v4).unwrap(), vec![a.clone()]);
        assert_eq!(
            remove_job_pool(Some(&v4), &a.mount_point),
            Some(Change::Unset(JOB_POOLS_VAR))
        );
        assert_eq!(
            remove_job_pool(Some(&v4), std::path::Path::new("/nope")),
            None
        );
    }

    #[test]
    fn bad_job_pools_are_refused() {
        for bad in [
            "x",
            "a@b@c@d",
            "a@b@sha256:00@/p@/m",
            "a@b@blake3:00@rel@/m",
            "a@b@blake3:00@/p@/m%G1",
            "@b@blake3:00@/p@/m",
        ] {
            assert!(decode_job_pools(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn job_env_is_validated() {
        let env = Environment::from_vars([
            ("SLURM_JOB_ID", "123"),
            ("SLURM_JOB_UID", "1001"),
            ("SLURM_JOB_USER", "swuser"),
        ]);
        let j = JobEnv::from_env(&env, None, None).unwrap();
        assert_eq!((j.job_id.as_str(), j.uid), ("123", 1001));
        assert!(JobEnv::from_env(&env, Some("12;rm"), None).is_err());
        let none = Environment::default();
        assert!(JobEnv::from_env(&none, None, None).is_err());
        assert!(JobEnv::from_env(&none, Some("7"), None).is_err());
        assert_eq!(JobEnv::from_env(&none, Some("7"), Some(5)).unwrap().uid, 5);
        // an empty value is no value (as slurmd may pass one)
        let empty = Environment::from_vars([("SLURM_JOB_ID", "7"), ("SLURM_JOB_UID", "")]);
        let e = JobEnv::from_env(&empty, None, None).unwrap_err();
        assert!(e.contains("not set"), "{e}");
    }

    #[test]
    fn task_prolog_lines_are_literal() {
        let s = task_prolog_lines(&[
            Change::Set("MODULEPATH", "/a b/modulefiles:/x".into()),
            Change::Unset("X"),
        ])
        .unwrap();
        assert_eq!(s, "export MODULEPATH=/a b/modulefiles:/x\nunset X\n");
        assert!(task_prolog_lines(&[Change::Set("A", "x\ny".into())]).is_err());
    }

    #[test]
    fn load_var_splits_on_commas_and_space() {
        assert_eq!(parse_load_var(" demo/1.0, x/2 ,,"), vec!["demo/1.0", "x/2"]);
    }
}
