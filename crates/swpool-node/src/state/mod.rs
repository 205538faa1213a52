//! Mount records: per node, who mounted what, where, for which job, and how many users share it.
//!
//! The store is a directory: `/run/sw-pool` for root, `$XDG_RUNTIME_DIR/sw-pool` for users (else
//! `/tmp/sw-pool-<uid>`), `$SW_POOL_STATE_DIR` when set. It must be a real directory (not a symlink)
//! owned by the caller and writable by nobody else. Inside:
//!
//! * `lock` — every change happens under an exclusive `flock` on it (also across threads);
//! * `mounts/<key>.json` — one record per mount point (`key` = the first 32 hex digits of the SHA-256
//!   of the canonical mount point), written atomically (temporary file, fsync, rename);
//! * `mounts/<key>.log` — the FUSE helper's stderr, kept while mounted.
//!
//! [`acquire`] mounts or, when the same pool (same digest; same file for bare images) is already
//! mounted there by the same user, adds a reference; [`release`] drops one and unmounts on the last.
//! [`list`] reports records, stale mounts (`ENOTCONN`), records whose mount is gone, and sw-pool-type
//! FUSE mounts of this user that have no record.
//!
//! From `load` (on the node's leader, after the pool is in the cache):
//! ```text
//! let dir = StateDir::open_default(env)?;                    // per user, per node
//! let mp = mount::paths::create_mountpoint(&mount::paths::default_mount_dir(cfg, uid, env), name, version, uid)?;
//! let a = state::acquire(&RealSys::new(env.path_var()), &dir, &AcquireRequest { image, mountpoint: mp, options, job_id, timeout })?;
//! // a.reused: already mounted here (refcount +1); a.mount_seconds: the -v timing
//! print!("{}", env::render(shell, &env::load_changes(&env::Snapshot::from_env(env), &PoolMount { .. }))?);
//! ```
//! and `unload`: `dir.find_pool(name, version)` → `state::release(..)` → `env::unload_changes`.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::image::ImageFormat;
use crate::mount::{self, Backend, ImageInfo, MountError, MountState, PoolId, Sys, Unmounted};
use swpool_format::status::ExitStatus;

mod acquire;
pub mod clean;
mod list;
mod release;
mod store;
mod sweep;

pub use acquire::{acquire, held_by_job, AcquireRequest, Acquired};
pub use clean::{candidate_dirs, clean, clean_all_stores, clean_as, Action, Selection};
pub use list::{
    clean_helper, list, node_list, HelperRef, HelperUnreported, ListEntry, ListFilter, ListStatus,
    NodeList,
};
pub use release::{
    helper_release, helper_release_spec, helper_sudo, helper_umount, release, release_for, Released,
};
pub use store::{images_in_use, StateDir, StateLock, MAX_BASES};
pub use sweep::{clean_node, NodePlaces};

pub const SCHEMA: u32 = 1;
const MAX_RECORD: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory {}: {reason}", crate::exec::show(path))]
    Dir { path: PathBuf, reason: String },
    #[error("{}: {source}", crate::exec::show(path))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount record {} is unreadable: {reason}; check that nothing is mounted at the path it names, then remove it", crate::exec::show(path))]
    Corrupt { path: PathBuf, reason: String },
    #[error("{}: {reason}", crate::exec::show(mount_point))]
    Conflict {
        mount_point: PathBuf,
        reason: String,
    },
    /// A record of a newer sw-pool (a schema, or a kind of mount, this one does not know).
    #[error("mount record {} was written by a newer sw-pool ({what}): change it with that version, or upgrade this one; nothing was changed", crate::exec::show(path))]
    Newer { path: PathBuf, what: String },
    /// Mounting or unmounting what a record names failed.
    #[error(transparent)]
    Mount(#[from] MountError),
}

impl StateError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            StateError::Dir { .. } => ExitStatus::System,
            StateError::Io { source, .. } => swpool_format::status::io_status(source),
            StateError::Corrupt { .. } => ExitStatus::System,
            StateError::Conflict { .. } => ExitStatus::BadInput,
            StateError::Mount(e) => e.exit_status(),
            StateError::Newer { .. } => ExitStatus::System,
        }
    }
}

/// One user of a mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    /// `SLURM_JOB_ID` or `--job-id`; none for interactive use.
    pub job_id: Option<String>,
    /// Seconds since the epoch.
    pub since: u64,
    /// The process that asked (informational).
    pub pid: u32,
    /// The shell that loaded it through the shell function (its process id): one reference per
    /// shell ([`AcquireRequest::shell`]), the one its unload drops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<u32>,
}

/// What serves a mount. Every mount sw-pool makes today is served by a FUSE helper; the variants
/// for a kernel mount (the privileged helper), the on-demand chunk server, an overlay of layers and
/// a namespace holder (environments) let those be recorded in the same store. A kind written by a
/// newer sw-pool reads as [`Serving::Unknown`] and is never acted on by this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Serving {
    /// A FUSE helper process (squashfuse_ll, fuse2fs).
    Fuse { helper: Backend, pid: u32 },
    /// A kernel mount of the image through a loop device, made by the site's mount helper
    /// (`helper`: the one to ask to release it).
    Kernel {
        fstype: String,
        loop_device: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        helper: Option<PathBuf>,
    },
    /// sw-pool's verifying chunk server (`sw-pool-serve`, a FUSE server hashing each chunk before
    /// serving it) in front of the FUSE helper (`helper_pid` is the server: the helper is its child).
    ChunkServer {
        pid: u32,
        /// Where it serves the image (removed with the record).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dir: Option<PathBuf>,
    },
    /// An overlay of read-only layers and a writable upper directory.
    Overlay { lower: Vec<PathBuf>, upper: PathBuf },
    /// A process holding the namespaces of an environment.
    Namespace { pid: u32 },
    /// A kind this sw-pool does not know (written by a newer one).
    #[serde(other)]
    Unknown,
}

/// A mount record.
///
/// Fields a newer sw-pool adds are ignored when read (serde's default), so that records written by
/// one version stay readable by another on the same node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub schema: u32,
    pub mount_point: PathBuf,
    pub image: PathBuf,
    pub format: ImageFormat,
    pub backend: Backend,
    /// Name, version and manifest digest when the image is a pool.
    pub pool: Option<PoolId>,
    pub helper_pid: u32,
    pub uid: u32,
    pub user: String,
    pub node: String,
    /// Seconds since the epoch.
    pub created: u64,
    pub refs: Vec<Ref>,
    /// Written before the FUSE helper starts and cleared once it is up: a record that stays pending
    /// after its writer died (SIGKILL between mount and record) is found and undone by
    /// `sw-pool cleanup --stale` and the Slurm epilog (write-ahead, so no mount goes unrecorded).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// The pool file on shared storage a `load` copied it from (the Slurm TaskProlog finds a job's
    /// `SW_POOL_LOAD` pool here without reading shared storage); none for `sw-pool mount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
    /// The mount's ID in the mount table when it was made: a mount whose directory was renamed
    /// since (a user owns a parent) is still found, and unmounted, by it ([`Record::located`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_id: Option<u32>,
    /// What serves the mount (absent in records of earlier versions: a FUSE helper, `backend` and
    /// `helper_pid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<Serving>,
    /// The lease of a user image mounted read-write ([`crate::userimage::lease`]): given back
    /// when the record goes, after the helper has written everything out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<crate::userimage::lease::Holder>,
}

impl Record {
    pub fn refcount(&self) -> usize {
        self.refs.len()
    }
    pub fn job_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self.refs.iter().filter_map(|r| r.job_id.clone()).collect();
        v.dedup();
        v
    }
    /// `name/version` of a pool, else the image's file name.
    pub fn label(&self) -> String {
        match &self.pool {
            Some(p) => format!("{}/{}", p.name, p.version),
            None => self
                .image
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }
    /// Refuse to act on a record whose mount this sw-pool does not know how to serve or undo.
    pub fn check_known(&self) -> Result<(), StateError> {
        match self.serving {
            Some(Serving::Unknown) => Err(StateError::Newer {
                path: self.mount_point.clone(),
                what: "a kind of mount this version does not know".into(),
            }),
            _ => Ok(()),
        }
    }
    /// The recorded mount's [`mount::Identity`]: its ID and the uid that made it.
    pub fn identity(&self) -> Option<mount::Identity> {
        self.mount_id.map(|id| (id, self.uid))
    }
    /// Where the recorded mount is now. With a recorded ID: wherever the mount table shows that
    /// mount (its ID, a FUSE mount of sw-pool's helpers made by the record's user; IDs are reused),
    /// its mount point renamed or not; when no such mount exists, the recorded mount point (where
    /// the mount is then absent for the caller, whatever a user put there). Without an ID (records
    /// of earlier versions): the recorded mount point.
    pub fn located(&self, mounts: &[mount::proc::MountEntry]) -> PathBuf {
        match self.mount_id {
            Some(id) => mounts
                .iter()
                .find(|e| {
                    e.mount_id == id
                        && e.is_fuse()
                        && e.is_swpool_helper()
                        && e.fuse_user_id() == Some(self.uid)
                })
                .map(|e| e.mount_point.clone())
                .unwrap_or_else(|| self.mount_point.clone()),
            None => self.mount_point.clone(),
        }
    }
    /// [`mount::state`] of this record's mount at `at`; a mount whose chunk server died is stale
    /// too (its FUSE helper still answers, every read of data fails with `EIO`).
    pub fn mount_state(
        &self,
        sys: &dyn Sys,
        mounts: &[mount::proc::MountEntry],
        at: &Path,
    ) -> MountState {
        // a recorded mount that is not the mount at `at` (gone, or something else a user put
        // there) is absent for this record
        if let Some(id) = self.mount_id {
            let here = mounts.iter().any(|e| {
                e.mount_id == id
                    && e.mount_point == at
                    && e.is_fuse()
                    && e.is_swpool_helper()
                    && e.fuse_user_id() == Some(self.uid)
            });
            if !here {
                return MountState::Absent;
            }
        }
        let st = mount::state(sys, mounts, at);
        match (&self.serving, st) {
            (Some(Serving::ChunkServer { pid, .. }), MountState::Mounted) if !sys.running(*pid) => {
                MountState::Stale
            }
            _ => st,
        }
    }
    /// Once the mount is gone: the chunk server's directory (and a mount a killed server left
    /// there) goes too.
    pub fn release_server(&self, sys: &dyn Sys) {
        match &self.serving {
            Some(Serving::ChunkServer { pid, dir: Some(d) }) => {
                mount::serve::release_dir(sys, d, *pid)
            }
            // one hop: the tree server ends by itself once its mount is gone
            Some(Serving::ChunkServer { pid, dir: None }) => mount::serve::wait_ended(sys, *pid),
            _ => {}
        }
    }
    fn same_image(&self, img: &ImageInfo) -> bool {
        match (&self.pool, &img.pool) {
            (Some(a), Some(b)) => a.digest == b.digest,
            (None, None) => self.image == img.path,
            _ => false,
        }
    }
}

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

use crate::users::{hostname, name_of as user_name};

#[cfg(test)]
mod tests;
