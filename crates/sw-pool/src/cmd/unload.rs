//! `sw-pool unload POOL`: drop this user's reference to a loaded pool on every node (the last one
//! unmounts it; the cache entry stays) and print the shell code that undoes `load`.

use std::path::PathBuf;

use swpool_core::env::{self, PoolMount, Snapshot};
use swpool_core::mount::{self, paths, RealSys};
use swpool_core::pool::Pool;
use swpool_core::state::{self, StateDir};
use swpool_core::transfer::Job;
use swpool_core::{Error, ExitStatus};

use super::load::{agree, shell};
use crate::cli::{GlobalArgs, UnloadArgs};

pub fn run(g: &GlobalArgs, a: UnloadArgs) -> Result<(), Error> {
    super::load::spread_over_allocation()?;
    let job = Job::init()?;
    let r = unload(g, &a, &job);
    super::finish_collective(job, r)
}

/// The mount point of what `spec` names: a directory is the mount point itself; a pool file or
/// NAME/VERSION is looked up at `$SW_POOL_MOUNT/NAME/VERSION`.
fn mountpoint_of(
    spec: &std::path::Path,
    mount_dir: Option<&std::path::Path>,
    pool_path: &[PathBuf],
    uid: u32,
) -> Result<(PathBuf, Option<(String, String)>), Error> {
    if spec.is_dir() {
        return Ok((mount::canonical_mountpoint(spec)?, None));
    }
    let s = spec.to_string_lossy();
    let (name, version) = if spec.is_file() {
        let p = Pool::open(spec)?;
        (p.manifest.name, p.manifest.version)
    } else if paths::is_pool_spec(&s) {
        let (n, v) = s.split_once('/').expect("NAME/VERSION");
        (n.to_string(), v.to_string())
    } else {
        let _ = pool_path;
        return Err(Error::other(
            ExitStatus::BadInput,
            format!(
                "{} is neither a mount point, a pool file nor NAME/VERSION (see `sw-pool list`)",
                spec.display()
            ),
        ));
    };
    let root = paths::default_mount_dir(mount_dir, uid);
    let mp = root.join(&name).join(&version);
    if !mp.is_dir() {
        return Err(Error::other(
            ExitStatus::BadInput,
            format!("pool {name}/{version} is not loaded on this node (nothing at {}; see `sw-pool list`)", mp.display()),
        ));
    }
    Ok((mount::canonical_mountpoint(&mp)?, Some((name, version))))
}

fn unload(_g: &GlobalArgs, a: &UnloadArgs, job: &Job) -> Result<(), Error> {
    let uid = rustix::process::geteuid().as_raw();
    let cfg = super::config()?;
    let shell = shell(a.shell.as_deref())?;
    let leader = job.is_leader();
    let job_id = super::mount::job_id(a.job_id.clone());
    let released = if leader {
        (|| {
            let (mp, pool) = mountpoint_of(
                &a.pool,
                cfg.mount_dir.value.as_deref(),
                &cfg.pool_path.value,
                uid,
            )?;
            let dir = StateDir::open_default()?;
            let r = state::release(&RealSys::new(), &dir, &mp, a.force, job_id.as_deref())?;
            let pool = pool.or_else(|| {
                r.record
                    .as_ref()
                    .and_then(|r| r.pool.as_ref())
                    .map(|p| (p.name.clone(), p.version.clone()))
            });
            if r.remaining > 0 && job.world_rank() == 0 {
                eprintln!(
                    "sw-pool: {} stays mounted: {} other reference(s)",
                    mp.display(),
                    r.remaining
                );
            }
            Ok((mp, pool))
        })()
    } else {
        Ok((PathBuf::new(), None))
    };
    let (mp, pool) = agree(job, released)?;
    if job.world_rank() != 0 {
        return Ok(());
    }
    let mut changes = env::unload_changes(
        &Snapshot::from_env(),
        &PoolMount {
            mount_point: mp.clone(),
            pool,
        },
    );
    if let Some(c) = swpool_core::slurm::remove_job_pool(
        swpool_core::config::EnvVar::JobPools.get().as_deref(),
        &mp,
    ) {
        changes.push(c);
    }
    let code = env::render(shell, &changes).map_err(|e| Error::other(ExitStatus::BadInput, e))?;
    print!("{code}");
    Ok(())
}
