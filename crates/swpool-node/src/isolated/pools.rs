//! `run|shell --pool SPEC`: the pool's verified node-local copy, made by the full program (`sw-pool
//! cache fetch`: resolve, trust, the broadcast into the cache, as `load` does it), mounted inside
//! the environment at its usual mount point ([`swpool_env::pools`]), its modules on `MODULEPATH`.
//!
//! Outside a job step the front runs `cache fetch` on this node. In a step the step's first task
//! runs it once for all the step's nodes (`srun --overlap`, one task per node, collective: the pool
//! is read once from shared storage) and every task reads its node's outcome from the mark each
//! node's fetch leaves ([`crate::cache::step_mark`]).

use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cache::Placement;
use crate::config::{Config, Environment, HostVar};
use crate::ExitStatus;

use super::{full_program, Failed};

/// How much `cache fetch` says: the front's own `-q` / `-v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Voice {
    Quiet,
    #[default]
    Normal,
    Verbose,
}

impl Voice {
    /// The front's `-q` and `-v` count.
    pub fn of(quiet: bool, verbose: u8) -> Voice {
        match (quiet, verbose) {
            (true, _) => Voice::Quiet,
            (false, 0) => Voice::Normal,
            _ => Voice::Verbose,
        }
    }

    /// `cache fetch`'s arguments, the front's `-q` / `-v` first.
    fn args(self, rest: &[&str]) -> Vec<OsString> {
        let flag = match self {
            Voice::Quiet => Some("-q"),
            Voice::Normal => None,
            Voice::Verbose => Some("-v"),
        };
        flag.into_iter()
            .chain(rest.iter().copied())
            .map(OsString::from)
            .collect()
    }
}

/// The pools of `--pool SPEC...`, each placed on this node; their environment changes are made in
/// this process's environment (the command inherits it).
pub fn pools(
    specs: &[String],
    cfg: &Config,
    env: &Environment,
    voice: Voice,
) -> Result<Vec<swpool_env::EnvPool>, Failed> {
    let mut out = Vec::new();
    let uid = rustix::process::getuid().as_raw();
    let mount_root =
        crate::mount::paths::default_mount_dir(cfg.mount_dir.value.as_deref(), uid, env);
    for spec in specs {
        let pl = placement(spec, cfg, env, voice)?;
        let label = format!("{}/{}", pl.name, pl.version);
        let ext = pl.format.is_ext();
        if !ext && pl.format != crate::image::ImageFormat::Squashfs {
            return Err(Failed::new(
                ExitStatus::BadInput,
                format!(
                    "--pool {spec}: {label} is a {} pool; an environment mounts its pools with \
                     FUSE (sw-pool-serve or squashfuse_ll, fuse2fs): use a squashfs or ext pool, or `sw-pool load` \
                     it on the node",
                    pl.format.as_str()
                ),
            ));
        }
        let at = crate::mount::paths::create_mountpoint(&mount_root, &pl.name, &pl.version, uid)
            .map_err(|e| Failed::new(ExitStatus::BadInput, format!("--pool {spec}: {e}")))?;
        // as changed by the pools before this one
        let now = crate::env::Snapshot::from_env(&Environment::capture());
        let pm = crate::env::PoolMount {
            mount_point: at.clone(),
            pool: Some((pl.name.clone(), pl.version.clone())),
        };
        for c in crate::env::load_changes(&now, &pm) {
            // the front is single-threaded (nothing reads the environment concurrently)
            match c {
                crate::env::Change::Set(k, v) => std::env::set_var(k, v),
                crate::env::Change::Unset(k) => std::env::remove_var(k),
            }
        }
        out.push(swpool_env::EnvPool {
            label,
            image: pl.image,
            at,
            ext,
            digest: Some(pl.digest),
            view: None,
            view_args: Vec::new(),
        });
    }
    Ok(out)
}

/// `cache fetch` as a child on this node only: not spread over the job's nodes, without the
/// task's MPI and step variables (it is not one of the step's ranks).
fn local_fetch(args: &[OsString], env: &Environment) -> Result<std::process::Command, Failed> {
    let mut cmd = std::process::Command::new(full_program()?);
    cmd.args(args).env("SW_POOL_SPREAD", "0");
    for k in env.step_task_names() {
        cmd.env_remove(k);
    }
    Ok(cmd)
}

/// This node's copy of the pool `spec`.
fn placement(
    spec: &str,
    cfg: &Config,
    env: &Environment,
    voice: Voice,
) -> Result<Placement, Failed> {
    let in_step = env.get(HostVar::SlurmJobId).is_some()
        && env.get(HostVar::SlurmStepId).is_some()
        && env.get(HostVar::SlurmProcid).is_some();
    if in_step {
        return step_placement(spec, cfg, env, voice);
    }
    let args = voice.args(&["cache", "fetch", "--json", "--no-progress", spec]);
    let out = local_fetch(&args, env)?
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| {
            Failed::new(
                ExitStatus::BadInput,
                format!("--pool {spec}: cannot run sw-pool cache fetch: {e}"),
            )
        })?;
    if !out.status.success() {
        // its error is on standard error already
        return Err(Failed::new(
            ExitStatus::BadInput,
            format!("--pool {spec}: the pool could not be placed on this node (above)"),
        ));
    }
    from_report(spec, &out.stdout)
}

/// The placement in `cache fetch --json`'s report (its `placement`, the form the step marks carry).
fn from_report(spec: &str, json: &[u8]) -> Result<Placement, Failed> {
    #[derive(serde::Deserialize)]
    struct Report {
        placement: Placement,
    }
    serde_json::from_slice::<Report>(json)
        .map(|r| r.placement)
        .map_err(|e| {
            Failed::new(
                ExitStatus::BadInput,
                format!("--pool {spec}: sw-pool cache fetch gave no report: {e}"),
            )
        })
}

/// In a job step: the first task places the pool on every node of the step; every task waits for
/// its node's mark.
fn step_placement(
    spec: &str,
    cfg: &Config,
    env: &Environment,
    voice: Voice,
) -> Result<Placement, Failed> {
    let fail = |m: String| Failed::new(ExitStatus::Collective, m);
    let job = env.get(HostVar::SlurmJobId).unwrap_or_default();
    let step = format!(
        "{job}.{}",
        env.get(HostVar::SlurmStepId).unwrap_or_default()
    );
    let uid = rustix::process::getuid().as_raw();
    let base = crate::cache::base_dir(None, cfg.cache_dir.value.as_deref(), env);
    let cache = crate::cache::dir(&base, uid, true)
        .map_err(|e| Failed::new(ExitStatus::BadInput, format!("--pool {spec}: {e}")))?;
    let mark = crate::cache::step_mark(&cache, &step, spec).ok_or_else(|| {
        fail(format!(
            "--pool {spec}: job step {step:?} is not a Slurm step id"
        ))
    })?;
    if env.get(HostVar::SlurmProcid).as_deref() == Some("0")
        && crate::cache::read_step_mark(&mark).is_none()
    {
        let nodes: u64 = env
            .get(HostVar::SlurmStepNumNodes)
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        // (a trust warning is shown once, by the fetch's first rank; not with -q)
        let args = voice.args(&["cache", "fetch", "--no-progress", "--for-step", &step, spec]);
        let mut cmd = if nodes > 1 {
            let nodelist = env.get(HostVar::SlurmStepNodelist).ok_or_else(|| {
                fail(format!("--pool {spec}: SLURM_STEP_NODELIST is not set: cannot place the pool on the step's nodes; run `sw-pool cache fetch {spec}` in the batch script first"))
            })?;
            super::nested_step(env, &full_program()?, args, nodes, &nodelist, "").map_err(|e| {
                fail(format!(
                    "--pool {spec}: cannot place it on the step's nodes: {e}"
                ))
            })?
        } else {
            local_fetch(&args, env)?
        };
        tracing::debug!("placing pool {spec} on the step's nodes: {cmd:?}");
        let st = cmd.status().map_err(|e| {
            fail(format!(
                "--pool {spec}: cannot run sw-pool cache fetch: {e}"
            ))
        })?;
        if !st.success() && crate::cache::read_step_mark(&mark).is_none() {
            return Err(fail(format!(
                "--pool {spec}: placing the pool on the step's {nodes} node(s) failed (exit {}); run `sw-pool cache fetch {spec}` in the job to see why",
                swpool_env::exit_code(st)
            )));
        }
    }
    wait_for(spec, &mark, Duration::from_secs(600))
}

/// This node's mark: the placement, or the fetch's failure, or a timeout naming what to do.
fn wait_for(spec: &str, mark: &Path, limit: Duration) -> Result<Placement, Failed> {
    let deadline = Instant::now() + limit;
    loop {
        match crate::cache::read_step_mark(mark) {
            Some(Ok(b)) => {
                return serde_json::from_slice(&b).map_err(|e| {
                    Failed::new(
                        ExitStatus::BadInput,
                        format!("--pool {spec}: {}: {e}", mark.display()),
                    )
                })
            }
            Some(Err(why)) => {
                return Err(Failed::new(
                    ExitStatus::Collective,
                    format!("--pool {spec}: {why}"),
                ))
            }
            None if Instant::now() > deadline => {
                return Err(Failed::new(
                    ExitStatus::Collective,
                    format!(
                        "--pool {spec}: it reached no copy on {} within {} s (the step's first \
                         task places it): run `sw-pool cache fetch {spec}` in the job first",
                        crate::users::hostname(),
                        limit.as_secs()
                    ),
                ))
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn the_fronts_voice_goes_first() {
        let a = |v: Voice| -> Vec<String> {
            v.args(&["cache", "fetch", "x/1"])
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect()
        };
        assert_eq!(a(Voice::Quiet), ["-q", "cache", "fetch", "x/1"]);
        assert_eq!(a(Voice::Normal), ["cache", "fetch", "x/1"]);
        assert_eq!(a(Voice::Verbose), ["-v", "cache", "fetch", "x/1"]);
    }

    #[test]
    fn a_fetch_report_gives_the_placement() {
        let r = br#"{"pool":{"name":"gcc","version":"12"},"cache":"/c/gcc-12-ab.pool","nodes":1,
                    "placement":{"name":"gcc","version":"12","digest":"blake3:ab","src":"/s/gcc.pool",
                                 "image":"/c/gcc-12-ab.pool","format":"squashfs","trust":"signed"}}"#;
        let p = from_report("gcc/12", r).unwrap();
        assert_eq!((p.name.as_str(), p.version.as_str()), ("gcc", "12"));
        assert_eq!(p.image, PathBuf::from("/c/gcc-12-ab.pool"));
        assert_eq!(p.format, crate::image::ImageFormat::Squashfs);
        let e = from_report("gcc/12", br#"{"pool":{}}"#).unwrap_err();
        assert!(e.message.contains("--pool gcc/12"), "{e}");
        assert!(from_report("x/1", b"not json").is_err());
    }

    #[test]
    fn a_mark_is_read_or_times_out_naming_the_node_and_what_to_do() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("sw-pool-1/cache"); // the marks go beside it
        let mark = crate::cache::step_mark(&cache, "7.0", "gcc/12").unwrap();
        let e = wait_for("gcc/12", &mark, Duration::from_millis(1)).unwrap_err();
        assert!(e.message.contains("cache fetch gcc/12"), "{e}");
        crate::cache::write_step_mark(&mark, Err("node2: no room")).unwrap();
        let e = wait_for("gcc/12", &mark, Duration::from_secs(1)).unwrap_err();
        assert!(e.message.contains("node2: no room"), "{e}");
        let other = crate::cache::step_mark(&cache, "7.0", "gcc/13").unwrap();
        let pl = Placement {
            name: "gcc".into(),
            version: "13".into(),
            digest: "blake3:cd".into(),
            src: "/s/g.pool".into(),
            image: "/c/g.pool".into(),
            format: crate::image::ImageFormat::Ext4,
            trust: "unsigned".into(),
        };
        let b = serde_json::to_vec(&pl).unwrap();
        crate::cache::write_step_mark(&other, Ok(&b)).unwrap();
        assert_eq!(
            wait_for("gcc/13", &other, Duration::from_secs(1)).unwrap(),
            pl
        );
        assert!(crate::cache::step_mark(&cache, "../x", "a").is_none());
    }
}
