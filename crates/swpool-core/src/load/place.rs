//! Steps 1–6 of the pipeline without the mount: agree on the pool (resolve, open once, authorize)
//! and place it in every node's cache, verified. `load` mounts what this placed; `sw-pool cache
//! fetch` (and `run --pool`, which mounts the copy inside one environment) stop here.

use std::fs::File;
use std::time::{Duration, Instant};

use super::{
    cache_entry, open_authorized, outcome, resolve, LoadError, LoadRequest, NodeContext, Observer,
    Plan,
};
use crate::cache;
use crate::collective::{leader_value, Collective};
use crate::error::Error;
use crate::image::ImageFormat;
use crate::pool::Pool;
use crate::transfer::{copy, Authorized, CopyOptions, CopyReport};
use crate::trust::authorize;

/// Step 1, collective: node 0's leader resolves the pool, opens it once and authorizes it; the
/// other leaders authorize the very trailer bytes it read, each against its own trust policy: one
/// trailer read from shared storage per job, not one per node. (Every reader's open file must
/// still end in these bytes, and every chunk is hashed against this manifest as it lands.)
/// Returns the plan every rank agreed on, this leader's authorization, and in `src_file` node 0's
/// open pool file (its copy reads the very file the policy checked).
pub(super) fn agree_plan(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    observer: &dyn Observer,
    src_file: &mut Option<File>,
) -> Result<(Plan, Option<Authorized>), Error> {
    let leader = job.is_leader();
    let first = leader && job.node_index() == 0;
    let planned = first.then(|| {
        plan(node, req).map(|(p, a, f)| {
            *src_file = f;
            (p, a)
        })
    });
    job.agree(outcome(&planned))?;
    let planned = if leader {
        let mine = planned.map(|r| {
            let (p, a) = r.expect("agreed: node 0's plan succeeded");
            serde_json::to_vec(&(&p, &a)).expect("json")
        });
        let got = job.leaders_bcast(0, mine.as_deref())?;
        let r: Result<(Plan, Authorized), Error> = serde_json::from_slice(&got)
            .map_err(|e| Error::from(LoadError::PlanDecode(e.to_string())))
            .and_then(|(p, a): (Plan, Authorized)| {
                if first {
                    Ok((p, a))
                } else {
                    plan_from(node, req, p, a)
                }
            });
        if r.is_ok() {
            observer.authorized(job.node_index(), &req.pool);
        }
        Some(r)
    } else {
        None
    };
    job.agree(outcome(&planned))?;
    let (own_plan, authorized) = match planned {
        Some(Ok((p, a))) => (Some(p), Some(a)),
        _ => (None, None),
    };
    let plan: Plan = leader_value(job, own_plan.as_ref())?;
    Ok((plan, authorized))
}

/// Steps 2–6, collective: the broadcast into every node's cache entry, bound to the authorized
/// bytes (nothing moves to a node whose entry holds them already, verified).
pub(super) fn copy_into_cache(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    plan: &Plan,
    authorized: Option<Authorized>,
    src_file: Option<File>,
) -> Result<CopyReport, Error> {
    let leader = job.is_leader();
    let opts = CopyOptions {
        progress: req.progress.is_some(),
        progress_sink: req.progress.clone(),
        authorized,
        src_file: src_file.map(std::sync::Arc::new),
        // what an on-demand run of this pool left on a node is not moved again
        reuse_partial: true,
        ..CopyOptions::from_env(node.env)
    };
    if leader {
        // an entry changed since it was verified is checked again (or dropped and copied anew)
        cache::revalidate(&plan.dest, &plan.digest);
    }
    let report: CopyReport = copy(job, &plan.src, &plan.dest, &opts)
        .map_err(crate::transfer::TransferError::for_cache)?;
    if leader {
        // every chunk of it was verified (as it landed, or just now)
        let _ = cache::record_verified(&plan.dest);
    }
    Ok(report)
}

pub use swpool_node::cache::Placement;

/// What [`place`] did.
#[derive(Debug)]
pub struct Placed {
    pub plan: Plan,
    pub placement: Placement,
    pub copy: CopyReport,
    pub total: Duration,
}

/// Place a pool in the cache of every node of the job, verified, without mounting it. Collective
/// like [`super::load`]: a failure anywhere (trust, no room, a chunk that does not verify) fails
/// every rank the same way and leaves no partial entry. No site path and no serving in place: the
/// caller wants the node-local copy itself.
pub fn place(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    observer: &dyn Observer,
) -> Result<Placed, Error> {
    let t0 = Instant::now();
    let req = &LoadRequest {
        cache_dir: req.cache_dir.as_deref().map(|p| job.node_path(p)),
        ..req.clone()
    };
    let mut src_file = None;
    let (plan, authorized) = agree_plan(job, node, req, observer, &mut src_file)?;
    let copy = copy_into_cache(job, node, req, &plan, authorized, src_file)?;
    let fmt = job
        .is_leader()
        .then(|| swpool_format::format::detect(&plan.dest).map_err(Error::from));
    job.agree(outcome(&fmt))?;
    let format: ImageFormat = leader_value(job, fmt.and_then(Result::ok).as_ref())?;
    if job.is_leader() {
        let _ = cache::touch(&plan.dest);
    }
    let placement = Placement {
        name: plan.name.clone(),
        version: plan.version.clone(),
        digest: plan.digest.clone(),
        src: plan.src.clone(),
        image: plan.dest.clone(),
        format,
        trust: plan.verdict.to_string(),
    };
    Ok(Placed {
        plan,
        placement,
        copy,
        total: t0.elapsed(),
    })
}

/// Step 1 on a node leader: resolve, open once, authorize, choose the cache entry.
/// Also returns the pool's open file: node 0's copy reads the very file the trust policy checked
/// (and shared storage sees one open of the pool on node 0).
fn plan(node: &NodeContext, req: &LoadRequest) -> Result<(Plan, Authorized, Option<File>), Error> {
    let src = resolve(&req.pool, &node.cfg.pool_path.value)?;
    let (mut pool, verdict) = open_authorized(node, &src)?;
    let m = &pool.manifest;
    if let Some(want) = &req.expect_digest {
        if &m.digest != want {
            return Err(LoadError::ChangedSinceJob {
                pool: src.clone(),
                want: want.clone(),
                got: m.digest.clone(),
            }
            .into());
        }
    }
    let dest = cache_entry(node, req.cache_dir.as_deref(), m)?;
    let authorized = Authorized::of(&pool);
    let plan = Plan {
        src,
        dest,
        name: m.name.clone(),
        version: m.version.clone(),
        digest: m.digest.clone(),
        verdict,
        data_size: m.data_size,
    };
    Ok((plan, authorized, pool.file.take()))
}

/// Step 1 on the other node leaders: node 0's plan, authorized here from the trailer bytes node
/// 0 read (this node's trust policy, this node's cache entry).
fn plan_from(
    node: &NodeContext,
    req: &LoadRequest,
    first: Plan,
    authorized: Authorized,
) -> Result<(Plan, Authorized), Error> {
    let pool = Pool::from_tail(&first.src, authorized.len, &authorized.tail)?;
    if pool.manifest.digest != first.digest || pool.manifest.image_size != authorized.image_size {
        return Err(LoadError::PlanMismatch {
            pool: first.src.clone(),
        }
        .into());
    }
    let verdict = authorize(&pool, &node.policy)?;
    let m = &pool.manifest;
    let dest = cache_entry(node, req.cache_dir.as_deref(), m)?;
    Ok((
        Plan {
            dest,
            verdict,
            ..first
        },
        authorized,
    ))
}
