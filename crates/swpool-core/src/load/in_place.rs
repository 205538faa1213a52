//! `load` on nodes without room for the pool's copy (seed 004's diskless nodes, a full
//! `$LOCAL_TMPDIR`): instead of failing, every node serves the pool from where it lies through the
//! verifying chunk server ([`crate::mount::serve`]), with a warning naming the nodes that had no
//! room; `--no-fallback` keeps the old behaviour (the copy's preflight fails, naming the node).
//! All nodes, not only the short ones, so that one job sees one kind of mount and the broadcast
//! (a collective over every node) is not half-run.

use std::time::{Duration, Instant};

use super::{leader_value, mount_here, outcome, Error, LoadRequest, Loaded, NodeContext, Plan};
use crate::collective::Collective;
use crate::state;
use crate::transfer::CopyReport;

/// Why this node cannot hold the copy; `None` when it can (or holds it already).
pub(super) fn no_room(plan: &Plan, host: &str) -> Option<String> {
    if plan.dest.is_file() {
        return None; // an entry is there: revalidated and reused (or replaced in place)
    }
    let dir = plan.dest.parent()?;
    let free = crate::transfer::free_bytes(dir).ok()?;
    // what the copy's preflight asks for
    let need = crate::transfer::space_needed(plan.data_size);
    (free < need).then(|| {
        format!(
            "{host}: {} free in {}, the copy needs {}",
            crate::size::Bytes(free),
            dir.display(),
            crate::size::Bytes(need)
        )
    })
}

/// Whether any node has no room (collective over every rank): the nodes' reasons, empty when
/// every node has room.
pub(super) fn short_nodes(
    job: &dyn Collective,
    plan: &Plan,
) -> Result<Vec<String>, crate::collective::Agreed> {
    // never an empty part: a first byte says whether a reason follows (MPI's all-gather of
    // varying counts refuses a gather of nothing at all)
    let mut mine = vec![b'-'];
    if job.is_leader() {
        if let Some(r) = no_room(plan, job.hostname()) {
            mine = std::iter::once(b'!').chain(r.into_bytes()).collect();
        }
    }
    Ok(job
        .all_gather(&mine)?
        .into_iter()
        .filter_map(|v| match v.split_first() {
            Some((b'!', r)) => Some(String::from_utf8_lossy(r).into_owned()),
            _ => None,
        })
        .collect())
}

/// Mount in place on every node (all or nothing, like the copy's mount).
pub(super) fn load_in_place(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    plan: Plan,
    short: Vec<String>,
    t0: Instant,
    resolve_trust: Duration,
) -> Result<Loaded, Error> {
    let tm = Instant::now();
    let mounted = job.is_leader().then(|| mount_here(node, req, &plan, true));
    if let Err(e) = job.agree(outcome(&mounted)) {
        if let Some(Ok((rec, _))) = &mounted {
            let mp = &rec.mount_point;
            let _ = state::release(node.sys, &node.state, mp, true, req.job_id.as_deref());
        }
        return Err(e.into());
    }
    let own = mounted.and_then(Result::ok);
    let (record, reused): (state::Record, bool) = leader_value(job, own.as_ref())?;
    let warning = format!(
        "no room for a copy of {}/{} on {} node(s) ({}): it is served in place from {} on every \
         node, each chunk verified against its manifest on first read (reads go to shared \
         storage); free node-local space or choose another --cache-dir for a copy, or \
         --no-fallback to fail instead",
        plan.name,
        plan.version,
        short.len(),
        short.join("; "),
        plan.src.display()
    );
    Ok(Loaded {
        mount_point: record.mount_point.clone(),
        plan,
        reused,
        record,
        copy: CopyReport {
            nodes: job.nodes(),
            ..CopyReport::default()
        },
        timings: super::Timings {
            resolve_trust,
            mount: tm.elapsed(),
            total: t0.elapsed(),
        },
        in_place: Some(warning),
    })
}
