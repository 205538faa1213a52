//! The site path of `load`: where the site configured its privileged mount helper (`mount_helper`,
//! `sw-pool-mount-helper` run through `sudo -n`), a pool signed by a key in the **system**
//! trusted-keys directory is mounted by the helper, once per node for every user and job, by the
//! kernel, from a copy in root's node cache that the helper verified chunk by chunk and nobody else
//! can change; the user's record of it (a [`Serving::Kernel`] record) holds the user's references,
//! and the last one asks the helper to drop the user's reference there.
//!
//! Each node leader first asks the helper for the node's cached copy by digest (`mount-pool
//! --digest D`): where every node has it, nothing is read from shared storage at all. Otherwise the
//! job's broadcast brings the pool into the users' caches as always (one read of shared storage
//! per job), and the helper copies from that local copy, verifying it again, into its own cache.
//! A pool that is not site-signed, a load with an explicit mount point (`-m`), or a node without
//! the helper takes the per-user FUSE path as before. [`SiteHelper`] is the mount stage's
//! implementation for it ([`super::mounter`]), chosen when [`helper_for`] answers on every node.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::Error;
use crate::mount::{Backend, PoolId, Sys};
use crate::state::{self, Record, Ref, Serving, StateDir};
use crate::trust::Verdict;

use super::mounter::{Mounter, NodeMount};
use super::{LoadRequest, NodeContext, Plan};

/// What the helper says it mounted.
#[derive(Debug, Clone, Deserialize)]
pub struct HelperMounted {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub mount_point: PathBuf,
    pub copied: bool,
    pub shared: bool,
    pub refs: usize,
    #[serde(default)]
    pub format: Option<swpool_format::format::ImageFormat>,
    #[serde(default)]
    pub loop_device: Option<String>,
}

/// The helper to use for this load on this node, if the site path applies: a helper is
/// configured, no mount point was asked for, and the pool is signed by a key from the system
/// trusted-keys directory (never only a user's own key: the helper would refuse it anyway).
pub fn helper_for(node: &NodeContext, req: &LoadRequest, plan: &Plan) -> Option<PathBuf> {
    let helper = node.cfg.mount_helper.value.clone()?;
    if req.mountpoint.is_some() {
        return None;
    }
    let Verdict::Trusted { fingerprint, .. } = &plan.verdict else {
        return None;
    };
    let key = node.policy.keys.find(fingerprint)?;
    key.path
        .starts_with(crate::trust::keys::SYSTEM_TRUSTED_KEYS)
        .then_some(helper)
}

/// What went wrong when the helper was asked: its own words (stderr, without its name in front),
/// else how running it failed; for `node` and the action `what`.
fn helper_error(node: &str, what: &str, e: crate::exec::ExecError) -> Error {
    let reason = e.helper_reason();
    Error::from(super::LoadError::Helper {
        node: node.to_string(),
        what: what.to_string(),
        reason,
    })
}

/// Ask the site's helper (`sudo -n HELPER ARGS…`) on `node` to do `what`, and read its JSON
/// answer: the one way sw-pool's unprivileged side calls it.
pub(super) fn ask<T: serde::de::DeserializeOwned>(
    sys: &dyn Sys,
    helper: &Path,
    node: &str,
    what: &str,
    args: &[&str],
) -> Result<T, Error> {
    let cmd = crate::state::helper_sudo(helper).args(args.iter().copied());
    let out = sys
        .run(&cmd)
        .map_err(|e| helper_error(node, what, e))?
        .stdout;
    serde_json::from_str(out.trim()).map_err(|e| {
        Error::from(super::LoadError::Helper {
            node: node.to_string(),
            what: what.to_string(),
            reason: format!("unreadable answer ({e}): {}", out.trim()),
        })
    })
}

impl HelperMounted {
    pub fn pool_id(&self) -> PoolId {
        PoolId {
            name: self.name.clone(),
            version: self.version.clone(),
            digest: self.digest.clone(),
        }
    }
}

/// The site's root helper's kernel mount ([`super::mounter::Mounter`]): the helper mounts the
/// pool from its own verified copy (the node's, by digest, before anything moves; else verified
/// from the node's placed copy), and the user's [`Serving::Kernel`] record holds this load's
/// reference. Released at the helper (`release-pool`, this job's references) with the record's
/// reference.
pub struct SiteHelper {
    helper: PathBuf,
}

impl SiteHelper {
    /// The helper to ask (`sudo -n HELPER`).
    pub fn new(helper: PathBuf) -> SiteHelper {
        SiteHelper { helper }
    }

    /// What the helper mounted, recorded as the user's reference; the helper's mount taken back
    /// when the record cannot be written.
    fn recorded(
        &self,
        node: &NodeContext,
        req: &LoadRequest,
        plan: &Plan,
        m: HelperMounted,
    ) -> Result<NodeMount, Error> {
        match record(&node.state, req, plan, &m, &self.helper, node.uid) {
            Ok((record, reused)) => Ok(NodeMount { record, reused }),
            Err(e) => {
                let job = req.job_id.as_deref();
                let _ = state::helper_release(node.sys, &self.helper, &m.pool_id(), job);
                Err(e)
            }
        }
    }
}

impl Mounter for SiteHelper {
    fn name(&self) -> &'static str {
        "site-helper"
    }

    /// `mount-pool --digest D`: the node's verified copy, when the helper has it.
    fn mount_held(
        &self,
        node: &NodeContext,
        req: &LoadRequest,
        plan: &Plan,
    ) -> Result<Option<NodeMount>, Error> {
        match mount_cached(node.sys, &self.helper, &plan.digest, req.job_id.as_deref())? {
            Some(m) => self.recorded(node, req, plan, m).map(Some),
            None => Ok(None),
        }
    }

    /// `mount-pool FILE`: the helper verifies the node's placed copy into its cache and mounts it.
    fn mount(
        &self,
        node: &NodeContext,
        req: &LoadRequest,
        plan: &Plan,
    ) -> Result<NodeMount, Error> {
        let m = mount_file(node.sys, &self.helper, &plan.dest, req.job_id.as_deref())?;
        self.recorded(node, req, plan, m)
    }

    fn release(&self, node: &NodeContext, req: &LoadRequest, m: &NodeMount) {
        let job = req.job_id.as_deref();
        if let Some(p) = &m.record.pool {
            let _ = state::helper_release(node.sys, &self.helper, p, job);
        }
        let _ = drop_ref(&node.state, &m.record, job);
    }
}

/// Take back the reference [`record`] added (another node failed).
fn drop_ref(dir: &StateDir, rec: &Record, job: Option<&str>) -> Result<(), Error> {
    let _lock = dir.lock()?;
    if let Some(mut r) = dir.read(&rec.mount_point)? {
        if let Some(i) = r.refs.iter().rposition(|x| x.job_id.as_deref() == job) {
            r.refs.remove(i);
        }
        if r.refs.is_empty() {
            dir.remove(&r.mount_point)?;
        } else {
            dir.write(&r)?;
        }
    }
    Ok(())
}

/// `mount-pool --digest D`: the node's cached copy, mounted (or referenced), if the node has it.
pub fn mount_cached(
    sys: &dyn Sys,
    helper: &Path,
    digest: &str,
    job: Option<&str>,
) -> Result<Option<HelperMounted>, Error> {
    let node = crate::users::hostname();
    let mut args = vec!["mount-pool", "--digest", digest];
    if let Some(j) = job {
        args.extend(["--job-id", j]);
    }
    let what = "mount the node's copy";
    let v: serde_json::Value = ask(sys, helper, &node, what, &args)?;
    if v.get("cached") == Some(&serde_json::Value::Bool(false)) {
        return Ok(None);
    }
    serde_json::from_value(v).map(Some).map_err(|e| {
        Error::from(super::LoadError::Helper {
            node,
            what: what.into(),
            reason: e.to_string(),
        })
    })
}

/// `mount-pool FILE`: the helper verifies the (local) pool file into its cache and mounts it.
pub fn mount_file(
    sys: &dyn Sys,
    helper: &Path,
    file: &Path,
    job: Option<&str>,
) -> Result<HelperMounted, Error> {
    let node = crate::users::hostname();
    let f = file.to_string_lossy();
    let mut args = vec!["mount-pool"];
    if let Some(j) = job {
        args.extend(["--job-id", j]);
    }
    args.push(&f);
    ask(sys, helper, &node, "verify and mount the pool", &args)
}

/// The user's record of a helper mount: one reference per load, like a FUSE mount's.
pub fn record(
    dir: &StateDir,
    req: &LoadRequest,
    plan: &Plan,
    m: &HelperMounted,
    helper: &Path,
    uid: u32,
) -> Result<(Record, bool), Error> {
    let _lock = dir.lock()?;
    let r = Ref {
        job_id: req.job_id.clone(),
        since: state::now(),
        pid: std::process::id(),
        shell: None,
    };
    if let Some(mut rec) = dir.read(&m.mount_point)? {
        if matches!(rec.serving, Some(Serving::Kernel { .. }))
            && rec.pool.as_ref().map(|p| &p.digest) == Some(&m.digest)
        {
            let has_job_ref =
                req.job_id.is_some() && rec.refs.iter().any(|x| x.job_id == req.job_id);
            if !(req.once_per_job && has_job_ref) {
                rec.refs.push(r);
                dir.write(&rec)?;
            }
            return Ok((rec, true));
        }
    }
    let format = m
        .format
        .unwrap_or(swpool_format::format::ImageFormat::Squashfs);
    let rec = Record {
        schema: state::SCHEMA,
        mount_point: m.mount_point.clone(),
        image: plan.dest.clone(),
        format,
        backend: Backend::for_format(format),
        pool: Some(PoolId {
            name: m.name.clone(),
            version: m.version.clone(),
            digest: m.digest.clone(),
        }),
        helper_pid: 0,
        uid,
        user: crate::users::name_of(uid),
        node: dir.node().to_string(),
        created: state::now(),
        refs: vec![r],
        pending: false,
        source: Some(plan.src.clone()),
        mount_id: None,
        serving: Some(Serving::Kernel {
            fstype: format.as_str().to_string(),
            loop_device: PathBuf::from(format!(
                "/dev/{}",
                m.loop_device.as_deref().unwrap_or("loop")
            )),
            helper: Some(helper.to_path_buf()),
        }),
        lease: None,
    };
    dir.write(&rec)?;
    Ok((rec, false))
}
