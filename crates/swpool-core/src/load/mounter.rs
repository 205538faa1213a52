//! The mount stage of [`super::load`], one seam: a [`Mounter`] turns the placed pool into a mount
//! on its node, with the user's record of it, and takes it back. [`choose`] picks one per load from
//! every node's context; `load` then asks it and never looks at which one it is.
//!
//! The implementations:
//! - [`CachedCopy`] (`cached.rs`): the node-local cache copy through its FUSE helper
//!   (`state::acquire` → `mount::mount`, squashfuse_ll or fuse2fs, [`crate::mount::Backend`]);
//! - [`InPlace`] (`in_place.rs`): the pool file where it lies, through the verifying chunk server
//!   (`sw-pool-serve`) in front of the FUSE helper, when a node has no room for the copy;
//! - [`SiteHelper`] (`site.rs`): the site's root helper's kernel mount of a site-signed pool, from
//!   its own verified copy.
//!
//! Each releases what it mounted its own way ([`Mounter::release`]). A new read path is one more
//! implementation and one more arm in [`choose`]; `load` does not change.

use std::path::PathBuf;

use super::{outcome, Error, LoadRequest, NodeContext, Plan};
use crate::collective::Collective;
use crate::state::Record;

pub use super::cached::CachedCopy;
pub use super::in_place::InPlace;
pub use super::site::SiteHelper;

/// What a node leader's mount stage left on its node: the user's record of the mount, with the
/// reference this load added.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct NodeMount {
    pub record: Record,
    /// It was mounted there already: only a reference was added.
    pub reused: bool,
}

/// One way to mount a placed pool on a node (see the module's text). Called on node leaders only;
/// every method acts on this node alone, the agreement among nodes is [`mount_everywhere`]'s.
pub trait Mounter: Sync {
    /// Its name (logs, tests).
    fn name(&self) -> &'static str;

    /// Whether it mounts the node's cache copy, so that the broadcast must place the pool first
    /// (in place: no).
    fn needs_copy(&self) -> bool {
        true
    }

    /// Before anything moves: mount from what the node holds already (the site helper's verified
    /// copy, by digest). `None`: this node needs the placed copy, [`Mounter::mount`] comes later.
    fn mount_held(
        &self,
        _node: &NodeContext,
        _req: &LoadRequest,
        _plan: &Plan,
    ) -> Result<Option<NodeMount>, Error> {
        Ok(None)
    }

    /// Mount the placed pool on this node (or add a reference to its mount there) and record it.
    /// On an error nothing of it is left on this node.
    fn mount(&self, node: &NodeContext, req: &LoadRequest, plan: &Plan)
        -> Result<NodeMount, Error>;

    /// Take back what [`Mounter::mount`] or [`Mounter::mount_held`] did on this node (another
    /// node failed): this load's reference, and the mount with the last one. Best effort: the
    /// load fails with the other node's error whatever this finds.
    fn release(&self, node: &NodeContext, req: &LoadRequest, m: &NodeMount);

    /// Once every node mounted: upkeep of the node's cache (default: nothing).
    fn upkeep(&self, _node: &NodeContext, _plan: &Plan) {}

    /// What the user is told with the load (default: nothing).
    fn note(&self, _plan: &Plan) -> Option<String> {
        None
    }
}

/// How a load chooses its mount stage ([`choose`], or a caller's own: [`super::load_with`]).
pub type Choose =
    dyn Fn(&dyn Collective, &NodeContext, &LoadRequest, &Plan) -> Result<Box<dyn Mounter>, Error>;

/// Choose the load's mount stage from every node's context, once (collective; every rank gets the
/// same kind):
/// 1. [`SiteHelper`]: every node leader has the site's mount helper and the pool is signed by a
///    key of the system's trusted-keys directory, no `-m` ([`super::site::helper_for`]);
/// 2. [`InPlace`]: some node has no room for the copy and `--no-fallback` was not given;
/// 3. [`CachedCopy`] otherwise.
pub fn choose(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    plan: &Plan,
) -> Result<Box<dyn Mounter>, Error> {
    let leader = job.is_leader();
    let mine = leader
        .then(|| super::site::helper_for(node, req, plan))
        .flatten();
    let vote = if leader { u8::from(mine.is_some()) } else { 2 };
    let site_all = job
        .all_gather(&[vote])?
        .iter()
        .all(|v| v.first() != Some(&0));
    if site_all {
        // (the other ranks of a node never ask it)
        return Ok(Box::new(SiteHelper::new(mine.unwrap_or_default())));
    }
    let short = super::in_place::short_nodes(job, plan)?;
    if !short.is_empty() && !req.no_fallback {
        return Ok(Box::new(InPlace::new(short)));
    }
    Ok(Box::new(CachedCopy))
}

/// What [`mount_held`] found.
pub struct Held {
    /// This leader's mount, when its node held the pool.
    pub mine: Option<NodeMount>,
    /// Every node held it: nothing needs to move.
    pub everywhere: bool,
}

/// Before the broadcast, collective: each leader mounts what its node holds already
/// ([`Mounter::mount_held`]); all agree (a failure anywhere takes back every node's mount).
pub fn mount_held(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    plan: &Plan,
    mounter: &dyn Mounter,
) -> Result<Held, Error> {
    let leader = job.is_leader();
    let held = leader.then(|| mounter.mount_held(node, req, plan));
    if let Err(e) = job.agree(outcome(&held)) {
        if let Some(Ok(Some(m))) = &held {
            mounter.release(node, req, m);
        }
        return Err(e.into());
    }
    let mine = held.and_then(Result::ok).flatten();
    let needs = leader && mine.is_none();
    let everywhere = match job.all_gather(&[u8::from(needs)]) {
        Ok(all) => !all.iter().any(|v| v.first() == Some(&1)),
        Err(e) => return Err(take_back(node, req, mounter, mine.as_ref(), e.into())),
    };
    Ok(Held { mine, everywhere })
}

/// The mount stage on every node, all or nothing (collective): each leader whose node did not
/// mount already (`held`) asks the mounter; all agree; on a failure anywhere every node that
/// mounted (here or before) takes its mount back. Returns this leader's mount.
pub fn mount_everywhere(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LoadRequest,
    plan: &Plan,
    mounter: &dyn Mounter,
    held: Option<NodeMount>,
) -> Result<Option<NodeMount>, Error> {
    let mounted = match held {
        Some(m) => Some(Ok(m)),
        None => job.is_leader().then(|| mounter.mount(node, req, plan)),
    };
    if let Err(e) = job.agree(outcome(&mounted)) {
        if let Some(Ok(m)) = &mounted {
            mounter.release(node, req, m);
        }
        return Err(e.into());
    }
    Ok(mounted.and_then(Result::ok))
}

/// A later step failed: take back this node's mount (if any) and return the error.
pub fn take_back(
    node: &NodeContext,
    req: &LoadRequest,
    mounter: &dyn Mounter,
    mine: Option<&NodeMount>,
    e: Error,
) -> Error {
    if let Some(m) = mine {
        mounter.release(node, req, m);
    }
    e
}

/// The mount point the request names (created if missing), else the pool's default one: where the
/// FUSE mounters mount.
pub(super) fn mountpoint(
    node: &NodeContext,
    req: &LoadRequest,
    plan: &Plan,
) -> Result<PathBuf, Error> {
    match &req.mountpoint {
        Some(m) => super::explicit_mountpoint(m),
        None => node.default_mountpoint(&plan.name, &plan.version),
    }
}
