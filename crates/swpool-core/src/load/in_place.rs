//! `load` on nodes without room for the pool's copy (seed 004's diskless nodes, a full
//! `$LOCAL_TMPDIR`): instead of failing, every node serves the pool from where it lies through the
//! verifying chunk server ([`crate::mount::serve`]), with a warning naming the nodes that had no
//! room; `--no-fallback` keeps the old behaviour (the copy's preflight fails, naming the node).
//! All nodes, not only the short ones, so that one job sees one kind of mount and the broadcast
//! (a collective over every node) is not half-run. [`InPlace`] is the mount stage's
//! implementation for it ([`super::mounter`]); [`short_nodes`] is what [`super::mounter::choose`]
//! asks.

use super::mounter::{Mounter, NodeMount};
use super::{Error, LoadRequest, NodeContext, Plan};
use crate::collective::Collective;
use crate::mount::serve::InPlace as Served;

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

/// The pool file where it lies, through the verifying chunk server, on every node: chosen when
/// some node has no room for the copy (`short`: each such node's reason).
pub struct InPlace {
    short: Vec<String>,
}

impl InPlace {
    pub fn new(short: Vec<String>) -> InPlace {
        InPlace { short }
    }
}

impl Mounter for InPlace {
    fn name(&self) -> &'static str {
        "in-place"
    }

    fn needs_copy(&self) -> bool {
        false
    }

    fn mount(
        &self,
        node: &NodeContext,
        req: &LoadRequest,
        plan: &Plan,
    ) -> Result<NodeMount, Error> {
        // the pool file itself, through the verifying chunk server (the authorized digest)
        let serve = Served {
            digest: plan.digest.clone(),
            keep: None,
            source: None,
        };
        super::cached::acquire(node, req, plan, plan.src.clone(), Some(serve))
    }

    /// As the cached copy's: the reference dropped, the last one unmounts; the chunk server's
    /// directory goes with the record.
    fn release(&self, node: &NodeContext, req: &LoadRequest, m: &NodeMount) {
        super::cached::release(node, req, m)
    }

    fn note(&self, plan: &Plan) -> Option<String> {
        Some(format!(
            "no room for a copy of {}/{} on {} node(s) ({}): it is served in place from {} on every \
             node, each chunk verified against its manifest on first read (reads go to shared \
             storage); free node-local space or choose another --cache-dir for a copy, or \
             --no-fallback to fail instead",
            plan.name,
            plan.version,
            self.short.len(),
            self.short.join("; "),
            plan.src.display()
        ))
    }
}
