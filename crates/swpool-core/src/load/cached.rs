//! The mount stage's default [`Mounter`]: the pool's verified node-local cache copy, mounted by the
//! user through its FUSE helper (`state::acquire` → `mount::mount`: squashfuse_ll or fuse2fs, the
//! [`crate::mount::Backend`] of the image's format), one reference per load; released by
//! `state::release` (the last reference unmounts it by its mount ID), as `unload` and `umount` do.

use super::mounter::{mountpoint, Mounter, NodeMount};
use super::{Error, LoadRequest, NodeContext, Plan};
use crate::cache;
use crate::mount::serve::InPlace as Served;
use crate::mount::MountOptions;
use crate::state::{self, AcquireRequest};

/// The node's cache copy through its FUSE helper.
pub struct CachedCopy;

impl Mounter for CachedCopy {
    fn name(&self) -> &'static str {
        "cached-copy"
    }

    fn mount(
        &self,
        node: &NodeContext,
        req: &LoadRequest,
        plan: &Plan,
    ) -> Result<NodeMount, Error> {
        acquire(node, req, plan, plan.dest.clone(), None)
    }

    fn release(&self, node: &NodeContext, req: &LoadRequest, m: &NodeMount) {
        release(node, req, m)
    }

    /// Least-recently-used bookkeeping of the copy, then the cache's watermarks.
    fn upkeep(&self, node: &NodeContext, plan: &Plan) {
        let _ = cache::touch(&plan.dest);
        cache::prune_to_watermarks(
            node.cfg,
            &plan.dest,
            node.uid,
            &state::images_in_use(&node.state),
        );
    }
}

/// A FUSE mount of `image` (served through the chunk server when `serve` is set) at the load's
/// mount point, with the user's record: a new mount or one more reference.
pub(super) fn acquire(
    node: &NodeContext,
    req: &LoadRequest,
    plan: &Plan,
    image: std::path::PathBuf,
    serve: Option<Served>,
) -> Result<NodeMount, Error> {
    let mp = mountpoint(node, req, plan)?;
    let r = state::acquire(
        node.sys,
        &node.state,
        &AcquireRequest {
            image,
            mountpoint: mp,
            options: MountOptions::parse(None)?,
            job_id: req.job_id.clone(),
            timeout: req.timeout,
            once_per_job: req.once_per_job,
            shell: req.shell,
            source: Some(plan.src.clone()),
            lease: None,
            serve,
            reader: node.cfg.fuse_reader.value,
        },
    )?;
    Ok(NodeMount {
        record: r.record,
        reused: r.reused,
    })
}

/// This load's reference to a FUSE mount dropped (the mount goes with the last one): the very
/// release `unload` and `umount` make.
pub(super) fn release(node: &NodeContext, req: &LoadRequest, m: &NodeMount) {
    let mp = &m.record.mount_point;
    let _ = state::release(node.sys, &node.state, mp, true, req.job_id.as_deref());
}
