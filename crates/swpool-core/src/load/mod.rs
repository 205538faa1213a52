//! The per-node load pipeline, once, for every command that brings a pool onto a node:
//! `sw-pool load` (collective, under MPI), the Slurm TaskProlog (one node), `sw-pool mount
//! NAME/VERSION`.
//!
//! resolve → open once → authorize (a typed [`Verdict`]) → place (broadcast into the node-local
//! cache, bound to the authorized bytes) → mount → cache upkeep → the environment change, as data.
//!
//! Every step that can fail on one node ends in an agreement ([`Collective`]): a failure anywhere
//! fails every rank with the same error naming the node, and leaves no temporary file and no mount
//! anywhere (the nodes that mounted take their mount back). See `docs/architecture.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache;
use crate::collective::{leader_value, Collective, Local};
use crate::config::{Config, Environment};
use crate::env::{self, Change, PoolMount, Snapshot};
use crate::error::Error;
use crate::mount::{self, paths, Sys};
use crate::pool::{Manifest, Pool};
use crate::slurm::{self, JobPool};
use crate::state::{self, StateDir};
use crate::transfer::{CopyReport, ProgressSink};
use crate::trust::{authorize, TrustPolicy, TrustedKeys, Verdict};

/// What to load, and where.
#[derive(Clone, Default)]
pub struct LoadRequest {
    /// A pool file, or `NAME/VERSION` found on the pool path.
    pub pool: PathBuf,
    /// Mount here (created if missing; its parent must exist); default
    /// `<mount dir>/NAME/VERSION`.
    pub mountpoint: Option<PathBuf>,
    /// The node-local cache's base directory (`--cache-dir`), before the configured one.
    pub cache_dir: Option<PathBuf>,
    /// The job the mount's reference belongs to.
    pub job_id: Option<String>,
    /// How long a mount may take to appear.
    pub timeout: Duration,
    /// One reference per job (the TaskProlog runs once per task).
    pub once_per_job: bool,
    /// The pool must have this manifest digest (a job's later steps mount the very pool the job
    /// loaded).
    pub expect_digest: Option<String>,
    /// Progress of the broadcast (world rank 0).
    pub progress: Option<ProgressSink>,
    /// Fail when a node has no room for the copy, instead of serving the pool in place there.
    pub no_fallback: bool,
    /// The calling shell (through the shell function): one reference per shell
    /// ([`AcquireRequest::shell`]).
    pub shell: Option<u32>,
}

/// Everything a node needs that is not the request: configuration, the environment, trust, the
/// system.
pub struct NodeContext<'a> {
    pub cfg: &'a Config,
    /// The process environment, read once (the default cache and mount directories, a task's pools).
    pub env: &'a Environment,
    pub policy: TrustPolicy,
    pub uid: u32,
    pub sys: &'a dyn Sys,
    /// The mount-record store.
    pub state: StateDir,
}

impl<'a> NodeContext<'a> {
    /// The real node: the trust policy from the configuration and the trusted-keys directories,
    /// the default record store.
    pub fn real(
        cfg: &'a Config,
        env: &'a Environment,
        sys: &'a dyn Sys,
    ) -> Result<NodeContext<'a>, Error> {
        Ok(NodeContext {
            cfg,
            env,
            policy: crate::trust::policy_from_config(
                cfg,
                TrustedKeys::load(&crate::trust::default_dirs(env)),
            ),
            uid: sys.euid(),
            sys,
            state: StateDir::open_default(env)?,
        })
    }

    /// This user's mount root on this node (`mount_dir`, else the default: one place computes it).
    pub fn mount_root(&self) -> PathBuf {
        paths::default_mount_dir(self.cfg.mount_dir.value.as_deref(), self.uid, self.env)
    }

    /// A pool's default mount point, `<mount root>/NAME/VERSION`, created (by descriptor, for
    /// root) if missing.
    pub fn default_mountpoint(&self, name: &str, version: &str) -> Result<PathBuf, Error> {
        Ok(paths::create_mountpoint(
            &self.mount_root(),
            name,
            version,
            self.uid,
        )?)
    }
}

/// Observes the pipeline's steps (progress output; tests force races between them).
pub trait Observer: Sync {
    /// The pool was opened and authorized on this node, nothing moved yet.
    fn authorized(&self, _node: usize, _pool: &Path) {}
}

/// No observer.
pub struct Quiet;
impl Observer for Quiet {}

/// What a node leader decided in the first step, sent to the ranks of its node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// The pool file.
    pub src: PathBuf,
    /// Its node-local cache entry.
    pub dest: PathBuf,
    pub name: String,
    pub version: String,
    pub digest: String,
    pub verdict: Verdict,
    /// Bytes of the image's data chunks: what a copy needs on the node.
    #[serde(default)]
    pub data_size: u64,
}

/// Wall time of the pipeline's steps (world rank 0's figures).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    pub resolve_trust: Duration,
    pub mount: Duration,
    pub total: Duration,
}

/// A loaded pool.
#[derive(Debug, Clone, Serialize)]
pub struct Loaded {
    pub plan: Plan,
    pub mount_point: PathBuf,
    /// It was mounted there already (on rank 0's node): only a reference was added.
    pub reused: bool,
    /// The mount record on rank 0's node (helper, references).
    pub record: state::Record,
    /// The broadcast's report (nothing moved when `skipped_all`).
    pub copy: CopyReport,
    pub timings: Timings,
    /// Served in place (a node had no room for the copy: [`in_place`]): the warning to show.
    pub in_place: Option<String>,
}

/// This rank's part in the agreement on a step only node leaders do (`None` on the others).
fn outcome<T>(step: &Option<Result<T, Error>>) -> Local<()> {
    crate::error::step_part(step.as_ref())
}

/// Resolve a pool spec: an existing path (a regular file), or `NAME/VERSION` on the pool path.
/// The same input gives the same message and status everywhere.
pub fn resolve(spec: &Path, pool_path: &[PathBuf]) -> Result<PathBuf, Error> {
    let s = spec.to_string_lossy();
    if std::fs::symlink_metadata(spec).is_err() && crate::pool::spec::is_pool_spec(&s) {
        return Ok(crate::pool::spec::resolve_pool(&s, pool_path)?);
    }
    match std::fs::metadata(spec) {
        Err(_) => Err(LoadError::NoPool {
            pool: spec.to_path_buf(),
        }
        .into()),
        // the same message and status as `inspect` and `verify` (Pool::open) give
        Ok(m) if !m.is_file() => Err(crate::pool::ManifestError::NotRegular {
            path: spec.to_path_buf(),
        }
        .into()),
        Ok(_) => Ok(crate::exec::absolute(spec)),
    }
}

/// Create `-m DIR` if it is missing (its parent must exist), like `sw-pool load -m $LOCAL_TMPDIR/mnt`
/// in the paper; as root on the walked parent's descriptor ([`mount::create_leaf`]). A stale FUSE
/// mount there (ENOTCONN) is reported by the mount-point check.
pub fn explicit_mountpoint(mp: &Path) -> Result<PathBuf, Error> {
    Ok(mount::create_leaf(mp, 0o755)?)
}

/// This node's cache entry for the pool with manifest `m` (`cache_dir`, the request's, first; the
/// cache directory is created if missing).
pub(crate) fn cache_entry(
    node: &NodeContext,
    cache_dir: Option<&Path>,
    m: &Manifest,
) -> Result<PathBuf, Error> {
    let base = cache::base_dir(cache_dir, node.cfg.cache_dir.value.as_deref(), node.env);
    Ok(cache::entry_path(
        &cache::dir(&base, node.uid, true)?,
        &m.name,
        &m.version,
        &m.digest,
    ))
}

/// Load a pool on every node of the job. Collective: every rank calls it; node leaders do the
/// work; every rank returns the same outcome.
pub fn load(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    observer: &dyn Observer,
) -> Result<Loaded, Error> {
    load_with(job, node, req, observer, &mounter::choose)
}

/// [`load`] with the mount stage chosen by `choose` instead of [`mounter::choose`] (collective
/// like it: the same kind on every rank).
pub fn load_with(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    observer: &dyn Observer,
    choose: &mounter::Choose,
) -> Result<Loaded, Error> {
    let t0 = Instant::now();
    let leader = job.is_leader();
    // several "nodes" on one machine (tests): `%n` in the node-local paths is the node index
    let req = &LoadRequest {
        mountpoint: req.mountpoint.as_deref().map(|p| job.node_path(p)),
        cache_dir: req.cache_dir.as_deref().map(|p| job.node_path(p)),
        ..req.clone()
    };

    // 1. resolve, open once, authorize: before any byte moves (place.rs)
    let mut src_file = None;
    let (plan, authorized) = place::agree_plan(job, node, req, observer, &mut src_file)?;
    let resolve_trust = t0.elapsed();

    // 2. the mount stage, chosen once from every node's context (mounter.rs): the site's helper,
    // the pool served in place, or the node's cached copy
    let mounter = choose(job, node, req, &plan)?;

    // 3. what every node holds already is mounted before anything moves
    let held = mounter::mount_held(job, node, req, &plan, &*mounter)?;

    // 4. place: the broadcast into the node-local cache, bound to the authorized bytes, unless
    // every node mounted already or the mount reads the pool where it lies
    let copy = if held.everywhere {
        CopyReport::default()
    } else if !mounter.needs_copy() {
        CopyReport {
            nodes: job.nodes(),
            ..CopyReport::default()
        }
    } else {
        place::copy_into_cache(job, node, req, &plan, authorized, src_file)
            .map_err(|e| mounter::take_back(node, req, &*mounter, held.mine.as_ref(), e))?
    };

    // 5. mount on every node, all or nothing
    let tm = Instant::now();
    let own = mounter::mount_everywhere(job, node, req, &plan, &*mounter, held.mine)?;

    // 6. cache upkeep
    if leader {
        mounter.upkeep(node, &plan);
    }
    let mounted: mounter::NodeMount = leader_value(job, own.as_ref())?;
    let mount = tm.elapsed();
    Ok(Loaded {
        mount_point: mounted.record.mount_point.clone(),
        reused: mounted.reused,
        record: mounted.record,
        copy,
        timings: Timings {
            resolve_trust,
            mount,
            total: t0.elapsed(),
        },
        in_place: mounter.note(&plan),
        plan,
    })
}

impl Loaded {
    /// The `--json` report (stable field names; `ranks`: the job's world size).
    pub fn report(&self, ranks: usize) -> serde_json::Value {
        let (r, ph, p) = (&self.copy, &self.copy.phases, &self.plan);
        serde_json::json!({
            "pool": {"name": p.name, "version": p.version, "digest": p.digest, "src": p.src,
                     "trust": p.verdict.to_string(), "verdict": p.verdict},
            "cache": p.dest,
            "mountpoint": self.mount_point,
            "nodes": r.nodes,
            "nodes_received": r.nodes_received,
            "ranks": ranks,
            "skipped_all": r.skipped_all,
            "in_place": self.in_place,
            "bytes_read_from_src": r.bytes_read_from_src,
            "bytes_sent": r.bytes_sent,
            "bytes_written": r.bytes_written,
            "phases": {
                "resolve_trust": self.timings.resolve_trust.as_secs_f64(),
                "preflight": ph.preflight.as_secs_f64(),
                "read": ph.read.as_secs_f64(),
                "distribute": ph.distribute.as_secs_f64(),
                "write": ph.write.as_secs_f64(),
                "verify": ph.verify.as_secs_f64(),
                "commit": ph.commit.as_secs_f64(),
                "copy": ph.total.as_secs_f64(),
                "mount": self.timings.mount.as_secs_f64(),
                "total": self.timings.total.as_secs_f64(),
            },
        })
    }
}

/// The environment change of a load: `MODULEPATH`, `SW_POOL_MOUNT`, …, and in a Slurm job the
/// pool added to `SW_POOL_JOB_POOLS` so that the job's later steps mount it on their nodes.
pub fn environment(
    l: &Loaded,
    now: &Snapshot,
    job_pools: Option<&str>,
    in_job: bool,
) -> Vec<Change> {
    let pm = PoolMount {
        mount_point: l.mount_point.clone(),
        pool: Some((l.plan.name.clone(), l.plan.version.clone())),
    };
    let mut changes = env::load_changes(now, &pm);
    if in_job {
        changes.push(slurm::add_job_pool(
            job_pools,
            &JobPool {
                name: l.plan.name.clone(),
                version: l.plan.version.clone(),
                digest: l.plan.digest.clone(),
                src: l.plan.src.clone(),
                mount_point: l.mount_point.clone(),
                cache: Some(l.plan.dest.clone()),
            },
        ));
    }
    changes
}

/// Open the pool file `src` (its trailer, once) and apply the trust policy: its file system must
/// fit the image its manifest covers, and the policy must accept it (`load`, `mount --in-place`,
/// `load --lazy` and each of its servers).
pub fn open_authorized(node: &NodeContext, src: &Path) -> Result<(Pool, Verdict), Error> {
    let pool = Pool::open(src)?;
    let verdict = authorized(node, &pool)?;
    Ok((pool, verdict))
}

pub(crate) fn authorized(node: &NodeContext, pool: &Pool) -> Result<Verdict, Error> {
    crate::pool::fs_size::check_fits(pool)?;
    Ok(authorize(pool, &node.policy)?)
}

/// `sw-pool mount FILE`: the trust policy for an image mounted where it lies. A pool gets the
/// same verdict (and the same refusals) as `load`; a bare image (no manifest) carries nothing that
/// could vouch for it, so it is refused when signatures are required.
pub fn authorize_in_place(node: &NodeContext, image: &Path) -> Result<Option<Verdict>, Error> {
    match Pool::open(image) {
        Ok(pool) => Ok(Some(authorized(node, &pool)?)),
        Err(
            crate::pool::ManifestError::NotAPool { .. }
            | crate::pool::ManifestError::NoTrailer { .. },
        ) if !node.policy.require_signature => Ok(None),
        Err(
            crate::pool::ManifestError::NotAPool { .. }
            | crate::pool::ManifestError::NoTrailer { .. },
        ) => Err(LoadError::BareRefused {
            image: image.to_path_buf(),
            origin: node.policy.origin.to_string(),
        }
        .into()),
        Err(e) => Err(e.into()),
    }
}

/// What `umount` and `env` were given, as a mount point: a pool file, or NAME/VERSION where no such
/// path exists, is the pool's default mount point ([`mountpoint_of`]); anything else is taken as
/// the mount point itself (also one that is gone or stale). `mount_dir` (the configured mount
/// directory) is asked for only when `spec` names a pool.
pub fn named_mountpoint(
    spec: &Path,
    mount_dir: impl FnOnce() -> Result<Option<PathBuf>, Error>,
    uid: u32,
    env: &Environment,
) -> Result<PathBuf, Error> {
    let named = spec.is_file()
        || (!spec.exists() && crate::pool::spec::is_pool_spec(&spec.to_string_lossy()));
    if named {
        Ok(mountpoint_of(spec, mount_dir()?.as_deref(), uid, env)?.0)
    } else {
        Ok(spec.to_path_buf())
    }
}

/// The mount point of what `spec` names: a directory is the mount point itself; a pool file or
/// NAME/VERSION is looked up at `<mount dir>/NAME/VERSION` (`umount`, `env` and `unload` take all
/// three).
pub fn mountpoint_of(
    spec: &Path,
    mount_dir: Option<&Path>,
    uid: u32,
    env: &Environment,
) -> Result<(PathBuf, Option<(String, String)>), Error> {
    use swpool_node::locate::Unplaced;
    swpool_node::locate::mountpoint_of(spec, mount_dir, uid, env).map_err(|e| match e {
        Unplaced::Mount(e) => e.into(),
        Unplaced::Pool(e) => e.into(),
        Unplaced::UnknownSpec { spec } => LoadError::UnknownSpec { spec }.into(),
        Unplaced::NotLoaded { name, version, at } => {
            LoadError::NotLoaded { name, version, at }.into()
        }
    })
}

/// What [`unload`] did (world rank 0's node).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Unloaded {
    pub mount_point: PathBuf,
    pub pool: Option<(String, String)>,
    /// References other jobs or loads still hold on rank 0's node (it stays mounted then).
    pub remaining: usize,
    /// Nothing was loaded there (unloading twice is not an error): why, for a note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_loaded: Option<String>,
}

/// Drop this user's reference to a loaded pool on every node (the last one unmounts it; the
/// cache entry stays). Collective like [`load`].
pub fn unload(
    job: &dyn Collective,
    node: &NodeContext,
    spec: &Path,
    force: bool,
    job_id: Option<&str>,
    shell: Option<u32>,
) -> Result<Unloaded, Error> {
    let released = job.is_leader().then(|| -> Result<Unloaded, Error> {
        let (mp, pool) = match mountpoint_of(
            spec,
            node.cfg.mount_dir.value.as_deref(),
            node.uid,
            node.env,
        ) {
            Ok(x) => x,
            // unloading what is not loaded leaves it as asked: a note, not an error
            Err(Error::Load(LoadError::NotLoaded { name, version, at })) => {
                return Ok(Unloaded {
                    not_loaded: Some(format!(
                        "pool {name}/{version} is not loaded on this node (nothing at {}; see `sw-pool list`)",
                        at.display()
                    )),
                    mount_point: at,
                    pool: Some((name, version)),
                    remaining: 0,
                });
            }
            Err(e) => return Err(e),
        };
        // modules of the pool still loaded in the calling shell: nothing is released
        check_no_modules_loaded(&mp, node.env)?;
        let r = match state::release_for(node.sys, &node.state, &mp, force, job_id, shell) {
            Ok(r) => r,
            Err(state::StateError::Mount(crate::mount::MountError::NotMounted { path })) => {
                return Ok(Unloaded {
                    not_loaded: Some(format!(
                        "nothing is mounted at {} on this node (see `sw-pool list`)",
                        path.display()
                    )),
                    mount_point: path,
                    pool,
                    remaining: 0,
                })
            }
            Err(e) => return Err(e.into()),
        };
        let pool = pool.or_else(|| {
            r.record
                .as_ref()
                .and_then(|r| r.pool.as_ref())
                .map(|p| (p.name.clone(), p.version.clone()))
        });
        Ok(Unloaded {
            mount_point: mp,
            pool,
            remaining: r.remaining,
            not_loaded: None,
        })
    });
    job.agree(outcome(&released))?;
    Ok(leader_value(job, released.and_then(Result::ok).as_ref())?)
}

/// The modules loaded in the calling shell (`_LMFILES_`, `LOADEDMODULES`: Lmod and Environment
/// Modules keep both, in the same order) whose modulefile is in `mountpoint`'s `modulefiles/`.
pub fn modules_loaded_from(mountpoint: &Path, env: &crate::config::Environment) -> Vec<String> {
    use crate::config::HostVar;
    let Some(files) = env.get(HostVar::Lmfiles) else {
        return Vec::new();
    };
    let names: Vec<String> = env
        .get(HostVar::LoadedModules)
        .map(|n| n.split(':').map(String::from).collect())
        .unwrap_or_default();
    let dir = mountpoint.join("modulefiles");
    files
        .split(':')
        .enumerate()
        .filter_map(|(i, f)| {
            let rel = Path::new(f).strip_prefix(&dir).ok()?;
            Some(
                names
                    .get(i)
                    .filter(|n| !n.is_empty())
                    .cloned()
                    .unwrap_or_else(|| {
                        let r = rel.to_string_lossy();
                        r.strip_suffix(".lua").unwrap_or(&r).to_string()
                    }),
            )
        })
        .collect()
}

/// Refuse to unload a pool whose modules the calling shell still has loaded.
pub fn check_no_modules_loaded(
    mountpoint: &Path,
    env: &crate::config::Environment,
) -> Result<(), LoadError> {
    let modules = modules_loaded_from(mountpoint, env);
    if modules.is_empty() {
        Ok(())
    } else {
        Err(LoadError::ModulesLoaded {
            mountpoint: mountpoint.to_path_buf(),
            modules,
        })
    }
}

/// The environment change of an unload.
pub fn unload_environment(u: &Unloaded, now: &Snapshot, job_pools: Option<&str>) -> Vec<Change> {
    let mut changes = env::unload_changes(
        now,
        &PoolMount {
            mount_point: u.mount_point.clone(),
            pool: u.pool.clone(),
        },
    );
    if let Some(c) = slurm::remove_job_pool(job_pools, &u.mount_point) {
        changes.push(c);
    }
    changes
}

mod cached;
mod in_place;
pub mod mounter;
mod place;
pub use place::{place, Placed, Placement};
mod mount_image;
mod mount_kernel;
mod mount_rw;
mod task;
pub use crate::error::LoadError;
pub mod shadow;
pub mod site;
pub use mount_image::{check_pools, mount_image, MountOutcome, MountRequest};
pub use mount_kernel::mount_rw_kernel;
pub use mount_rw::{mount_rw, MountRw};
#[cfg(test)]
use task::last_set;
pub use task::{ensure, task_prolog};

#[cfg(test)]
mod stage_tests;
#[cfg(test)]
mod tests;
