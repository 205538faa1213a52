//! The Slurm TaskProlog's part of a load: every pool a task's environment names is mounted on the
//! task's node, from the node's records when it already is.

use super::*;
use crate::config::EnvVar;

/// The Slurm TaskProlog's step: make sure the job's pool `p` is cached (verified) and mounted at
/// its mount point on this node, with one reference of this job. Every task after the first on a
/// node answers from the node's record alone (no read of the pool on shared storage, no signature
/// check again, no lock); the first one runs the pipeline, under a lock so that one task per node
/// copies and the others then find the entry complete.
pub fn ensure(node: &NodeContext, p: &JobPool, job_id: Option<&str>) -> Result<PathBuf, Error> {
    if let Some(job) = job_id {
        if let Ok(mp) = mount::canonical_mountpoint(&p.mount_point) {
            if let Ok(Some(rec)) =
                state::held_by_job(node.sys, &node.state, &mp, Some(&p.digest), job)
            {
                // LRU bookkeeping sees the latest task, not only the first: a utimensat on the
                // node-local cache entry, only when the mount is of such an entry (never a write
                // to an image elsewhere, e.g. one `sw-pool mount` took from shared storage)
                if cache::is_entry_of(&rec.image, node.uid, &p.name, &p.version, &p.digest) {
                    let _ = cache::touch(&rec.image);
                }
                return Ok(rec.mount_point);
            }
        }
    }
    // the cache directory the job's load used, when this node has it (a task's environment may
    // name another $LOCAL_TMPDIR than the batch script's: one copy per node, not two)
    let cache_dir = p
        .cache
        .as_deref()
        .filter(|c| cache::is_entry_of(c, node.uid, &p.name, &p.version, &p.digest))
        .and_then(|c| c.parent()?.parent()?.parent())
        .filter(|b| b.is_dir())
        .map(Path::to_path_buf);
    let base = cache::base_dir(
        cache_dir.as_deref(),
        node.cfg.cache_dir.value.as_deref(),
        node.env,
    );
    let cdir = cache::dir(&base, node.uid, true)?;
    let lock = cdir.join(".fill.lock");
    let _fill = crate::lock::FileLock::exclusive(&lock).map_err(|source| LoadError::Lock {
        what: "lock",
        path: lock.clone(),
        source,
    })?;
    let root = node.mount_root();
    let default_mp = root.join(&p.name).join(&p.version);
    let req = LoadRequest {
        pool: p.src.clone(),
        mountpoint: (p.mount_point != default_mp).then(|| p.mount_point.clone()),
        cache_dir: Some(base),
        job_id: job_id.map(String::from),
        timeout: Duration::from_secs(30),
        once_per_job: true,
        expect_digest: Some(p.digest.clone()),
        progress: None,
        no_fallback: false,
        shell: None,
    };
    let l = load(&crate::Job::single(), node, &req, &Quiet)?;
    if !l.reused {
        slurm::syslog(
            slurm::Level::Notice,
            &format!(
                "job={} user={} node={} task-prolog mounted {}/{} at {}",
                job_id.unwrap_or("-"),
                crate::users::name_of(node.uid),
                crate::users::hostname(),
                p.name,
                p.version,
                l.mount_point.display()
            ),
        );
    }
    Ok(l.mount_point)
}

/// The pools a task's environment asks for (`SW_POOL_JOB_POOLS` from a load in the job,
/// `SW_POOL_LOAD` given at submission), each with whether it came from `SW_POOL_LOAD`. A
/// `SW_POOL_LOAD` pool this job already has mounted on the node is taken from the node's record
/// ([`loaded_by_job`]): every task of every step starts without a request to shared storage.
fn requested(node: &NodeContext, job_id: Option<&str>) -> Result<Vec<(JobPool, bool)>, Error> {
    let bad = |var: &str, reason: String| -> Error {
        LoadError::JobEnv {
            var: var.to_string(),
            reason,
        }
        .into()
    };
    let mut out: Vec<(JobPool, bool)> = Vec::new();
    if let Some(v) = node.env.get_nonempty(EnvVar::JobPools) {
        let pools =
            slurm::decode_job_pools(&v).map_err(|e| bad(slurm::JOB_POOLS_VAR, e.to_string()))?;
        out.extend(pools.into_iter().map(|p| (p, false)));
    }
    if let Some(v) = node.env.get_nonempty(EnvVar::Load) {
        for spec in slurm::parse_load_var(&v) {
            if let Some(p) = job_id.and_then(|j| loaded_by_job(node, &spec, j)) {
                if !out.iter().any(|(q, _)| q.src == p.src) {
                    out.push((p, true));
                }
                continue;
            }
            let ctx = |e: Error| bad(&format!("{}={spec}", slurm::LOAD_VAR), e.to_string());
            let src = resolve(Path::new(&spec), &node.cfg.pool_path.value).map_err(ctx)?;
            if out.iter().any(|(p, _)| p.src == src) {
                continue; // loaded by an earlier step or prolog of this job
            }
            let pool = Pool::open(&src).map_err(|e| ctx(e.into()))?;
            let m = &pool.manifest;
            let root = node.mount_root();
            out.push((
                JobPool {
                    name: m.name.clone(),
                    version: m.version.clone(),
                    digest: m.digest.clone(),
                    src,
                    mount_point: root.join(&m.name).join(&m.version),
                    cache: None,
                },
                true,
            ));
        }
    }
    Ok(out)
}

/// The pool `spec` (NAME/VERSION at the default mount point, or the pool file a load copied) when
/// the job `job_id`'s load mounted it on this node: a live mount of this user's with a reference of
/// the job, recorded with the pool file it came from. Reads the node's records and mount table
/// only, never the pool on shared storage.
fn loaded_by_job(node: &NodeContext, spec: &str, job_id: &str) -> Option<JobPool> {
    let by_name = crate::pool::spec::is_pool_spec(spec)
        .then(|| spec.split_once('/'))
        .flatten();
    let candidates: Vec<state::Record> = match by_name {
        Some((n, v)) => {
            let root = node.mount_root();
            let at = mount::canonical_mountpoint(&root.join(n).join(v)).ok()?;
            let mut r = node.state.find_pool(n, v).ok()?;
            r.retain(|r| r.mount_point == at);
            r
        }
        None => {
            let file = crate::exec::absolute(Path::new(spec));
            let mut r: Vec<state::Record> =
                node.state.records().ok()?.into_iter().flatten().collect();
            r.retain(|r| r.source.as_deref() == Some(file.as_path()));
            r
        }
    };
    candidates.into_iter().find_map(|rec| {
        let (Some(pool), Some(src)) = (&rec.pool, &rec.source) else {
            return None;
        };
        let live = state::held_by_job(
            node.sys,
            &node.state,
            &rec.mount_point,
            Some(&pool.digest),
            job_id,
        )
        .ok()
        .flatten()?;
        Some(JobPool {
            name: pool.name.clone(),
            version: pool.version.clone(),
            digest: pool.digest.clone(),
            src: src.clone(),
            mount_point: live.mount_point,
            cache: Some(live.image),
        })
    })
}

pub(super) fn last_set(changes: &[Change], var: &str) -> Option<String> {
    changes.iter().rev().find_map(|c| match c {
        Change::Set(k, v) if *k == var => Some(v.clone()),
        _ => None,
    })
}

/// The Slurm TaskProlog, for one task: every pool the task's environment (`node.env`) names is
/// mounted on this node ([`ensure`]), and the environment change the task still lacks (its
/// `MODULEPATH`, and for pools from `SW_POOL_LOAD` the job's pool list) is returned.
pub fn task_prolog(node: &NodeContext, job_id: Option<&str>) -> Result<Vec<Change>, Error> {
    let want = requested(node, job_id)?;
    let mut snap = Snapshot::from_env(node.env);
    let mut changes: Vec<Change> = Vec::new();
    for (p, from_load_var) in &want {
        let mp = ensure(node, p, job_id)?;
        // the task already has it (from `sw-pool load` or `module load pool/…` in the job)
        let modulefiles = mp.join("modulefiles");
        let listed = |v: &Option<String>, p: &Path| {
            v.as_deref()
                .unwrap_or("")
                .split(':')
                .any(|e| Path::new(e) == p)
        };
        let loaded = listed(&snap.loaded, &mp) || listed(&snap.modulepath, &modulefiles);
        let mut c = Vec::new();
        if !loaded {
            c = env::load_changes(
                &snap,
                &PoolMount {
                    mount_point: mp.clone(),
                    pool: Some((p.name.clone(), p.version.clone())),
                },
            );
        }
        if *from_load_var {
            c.push(slurm::add_job_pool(
                last_set(&changes, slurm::JOB_POOLS_VAR)
                    .or_else(|| node.env.get_nonempty(EnvVar::JobPools))
                    .as_deref(),
                &JobPool {
                    mount_point: mp.clone(),
                    ..p.clone()
                },
            ));
        }
        for ch in &c {
            snap.apply(ch);
        }
        changes.extend(c);
    }
    Ok(changes)
}
