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
//! let dir = StateDir::open_default()?;                       // per user, per node
//! let mp = mount::paths::create_mountpoint(&mount::paths::default_mount_dir(cfg, uid), name, version, uid)?;
//! let a = state::acquire(&RealSys::new(), &dir, &AcquireRequest { image, mountpoint: mp, options, job_id, timeout })?;
//! // a.reused: already mounted here (refcount +1); a.mount_seconds: the -v timing
//! print!("{}", env::render(shell, &env::load_changes(&env::Snapshot::from_env(), &PoolMount { .. }))?);
//! ```
//! and `unload`: `dir.find_pool(name, version)` → `state::release(..)` → `env::unload_changes`.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, ExitStatus};
use crate::image::ImageFormat;
use crate::mount::{self, Backend, ImageInfo, MountError, MountState, PoolId, Sys, Unmounted};

pub mod clean;
pub use clean::{candidate_dirs, clean, Action, Selection};

pub const SCHEMA: u32 = 1;
const MAX_RECORD: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("state directory {}: {reason}", path.display())]
    Dir { path: PathBuf, reason: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("mount record {} is unreadable: {reason}; check that nothing is mounted at the path it names, then remove it", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{}: {reason}", mount_point.display())]
    Conflict {
        mount_point: PathBuf,
        reason: String,
    },
}

impl StateError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            StateError::Dir { .. } => ExitStatus::System,
            StateError::Io { source, .. } => crate::error::io_status(source),
            StateError::Corrupt { .. } => ExitStatus::System,
            StateError::Conflict { .. } => ExitStatus::BadInput,
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
}

/// A mount record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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

/// The record store of this node for the calling user.
#[derive(Debug, Clone)]
pub struct StateDir {
    path: PathBuf,
    uid: u32,
    /// This node's name: records are per node even if the directory is shared (a `/run` that is not
    /// node-local, as in the virtual cluster).
    node: String,
}

/// Held while the store is locked.
#[derive(Debug)]
pub struct StateLock {
    _f: std::fs::File,
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl StateDir {
    /// Where the store lives for `uid`: `$SW_POOL_STATE_DIR`, else `/run/sw-pool` (root), else
    /// `$XDG_RUNTIME_DIR/sw-pool` (when that directory exists and is ours), else `/tmp/sw-pool-<uid>`.
    pub fn default_path(uid: u32) -> PathBuf {
        if let Some(p) = crate::config::EnvVar::StateDir
            .get_os()
            .filter(|v| !v.is_empty())
        {
            return PathBuf::from(p);
        }
        if uid == 0 {
            return PathBuf::from("/run/sw-pool");
        }
        if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
            let x = PathBuf::from(x);
            if std::fs::symlink_metadata(&x).is_ok_and(|m| m.is_dir() && m.uid() == uid) {
                return x.join("sw-pool");
            }
        }
        // /tmp/sw-pool-<uid>, or the user's private fallback when someone squatted that name
        crate::userdir::resolve(Path::new("/tmp"), uid, false)
            .unwrap_or_else(|_| crate::userdir::predictable(Path::new("/tmp"), uid))
    }

    /// Open (creating if needed) the store for the effective user.
    pub fn open_default() -> Result<StateDir, StateError> {
        let uid = rustix::process::geteuid().as_raw();
        let p = Self::default_path(uid);
        if p.parent() == Some(Path::new("/tmp")) {
            // never stuck behind a name another user took first (see userdir)
            let p = crate::userdir::resolve(Path::new("/tmp"), uid, true).map_err(|e| {
                StateError::Dir {
                    path: p.clone(),
                    reason: format!(
                        "cannot create it: {e}; set SW_POOL_STATE_DIR to a private directory"
                    ),
                }
            })?;
            return StateDir::open(&p, uid);
        }
        StateDir::open(&p, uid)
    }

    /// Open (creating if needed) the store at `path` for `uid`.
    pub fn open(path: &Path, uid: u32) -> Result<StateDir, StateError> {
        let path = crate::exec::absolute(path);
        ensure_private_dir(&path, uid)?;
        ensure_private_dir(&path.join("mounts"), uid)?;
        Ok(StateDir {
            path,
            uid,
            node: hostname(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Take the store's exclusive lock (blocks until it is free).
    pub fn lock(&self) -> Result<StateLock, StateError> {
        let p = self.path.join("lock");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
            .map_err(|source| StateError::Io {
                path: p.clone(),
                source,
            })?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).map_err(|e| {
            StateError::Io {
                path: p.clone(),
                source: e.into(),
            }
        })?;
        Ok(StateLock { _f: f })
    }

    /// The first 32 hex digits of SHA-256(node NUL mount point).
    pub fn key(node: &str, mount_point: &Path) -> String {
        use sha2::Digest;
        use std::os::unix::ffi::OsStrExt;
        let mut h = sha2::Sha256::new();
        h.update(node.as_bytes());
        h.update([0u8]);
        h.update(mount_point.as_os_str().as_bytes());
        hex::encode(&h.finalize()[..16])
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    pub fn record_path(&self, mount_point: &Path) -> PathBuf {
        self.path
            .join("mounts")
            .join(format!("{}.json", Self::key(&self.node, mount_point)))
    }

    /// Where the FUSE helper's stderr goes for a mount at `mount_point`.
    pub fn log_path(&self, mount_point: &Path) -> PathBuf {
        self.path
            .join("mounts")
            .join(format!("{}.log", Self::key(&self.node, mount_point)))
    }

    /// The record for a mount point, if any.
    pub fn read(&self, mount_point: &Path) -> Result<Option<Record>, StateError> {
        let p = self.record_path(mount_point);
        match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            _ => {}
        }
        let r = self.read_file(&p)?;
        if r.mount_point != mount_point {
            return Err(StateError::Corrupt {
                path: p,
                reason: format!(
                    "it names mount point {} but its file name is for {}",
                    r.mount_point.display(),
                    mount_point.display()
                ),
            });
        }
        Ok(Some(r))
    }

    fn read_file(&self, p: &Path) -> Result<Record, StateError> {
        let corrupt = |reason: String| StateError::Corrupt {
            path: p.to_path_buf(),
            reason,
        };
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(p)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    corrupt("it is a symbolic link (never followed)".into())
                } else {
                    corrupt(e.to_string())
                }
            })?;
        let m = f.metadata().map_err(|e| corrupt(e.to_string()))?;
        if !m.is_file() {
            return Err(corrupt("not a regular file".into()));
        }
        if m.uid() != self.uid {
            return Err(corrupt(format!(
                "it belongs to uid {}, not uid {} (a foreign file)",
                m.uid(),
                self.uid
            )));
        }
        if m.len() > MAX_RECORD {
            return Err(corrupt(format!(
                "{} bytes is too large for a record",
                m.len()
            )));
        }
        let mut b = Vec::new();
        f.read_to_end(&mut b).map_err(|e| corrupt(e.to_string()))?;
        let r: Record = serde_json::from_slice(&b)
            .map_err(|e| corrupt(format!("not a sw-pool mount record ({e})")))?;
        if r.schema != SCHEMA {
            return Err(corrupt(format!(
                "schema {} (this sw-pool writes {SCHEMA})",
                r.schema
            )));
        }
        Ok(r)
    }

    /// Write a record atomically (temporary file, fsync, rename, fsync the directory).
    pub fn write(&self, r: &Record) -> Result<(), StateError> {
        let dest = self.record_path(&r.mount_point);
        let dir = self.path.join("mounts");
        let tmp = dir.join(format!(
            ".tmp-{}-{}",
            std::process::id(),
            TMP_SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let io = |source| StateError::Io {
            path: tmp.clone(),
            source,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io)?;
        let res = (|| {
            f.write_all(&serde_json::to_vec_pretty(r).expect("record json"))?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &dest)?;
            crate::atomic::sync_dir(&dir)
        })();
        if res.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        res.map_err(io)
    }

    /// Remove a mount point's record and helper log.
    pub fn remove(&self, mount_point: &Path) -> Result<(), StateError> {
        for p in [self.record_path(mount_point), self.log_path(mount_point)] {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(StateError::Io { path: p, source }),
            }
        }
        Ok(())
    }

    /// Every record file, parsed (or the reason it could not be).
    pub fn records(&self) -> Result<Vec<Result<Record, StateError>>, StateError> {
        let dir = self.path.join("mounts");
        let rd = std::fs::read_dir(&dir).map_err(|source| StateError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut v = Vec::new();
        let mut names: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        names.sort();
        for p in names {
            let r = self.read_file(&p);
            if let Ok(r) = &r {
                if r.node != self.node
                    && p.file_name()
                        == Some(std::ffi::OsStr::new(&format!(
                            "{}.json",
                            Self::key(&r.node, &r.mount_point)
                        )))
                {
                    continue; // another node's record in a shared directory
                }
            }
            v.push(r.and_then(|r| {
                if self.record_path(&r.mount_point) == p && r.node == self.node {
                    Ok(r)
                } else {
                    Err(StateError::Corrupt {
                        path: p.clone(),
                        reason: format!(
                            "its file name does not match its mount point {}",
                            r.mount_point.display()
                        ),
                    })
                }
            }));
        }
        Ok(v)
    }
}

impl StateDir {
    /// This node's readable records of the pool `name`/`version` (for `unload POOL`: the mount points
    /// it is mounted at), oldest first.
    pub fn find_pool(&self, name: &str, version: &str) -> Result<Vec<Record>, StateError> {
        let mut v: Vec<Record> = self
            .records()?
            .into_iter()
            .flatten()
            .filter(|r| {
                r.pool
                    .as_ref()
                    .is_some_and(|p| p.name == name && p.version == version)
            })
            .collect();
        v.sort_by_key(|r| r.created);
        Ok(v)
    }
}

/// Create `p` (mode 0700) if missing; then insist that it is a real directory owned by `uid` and
/// writable by nobody else.
fn ensure_private_dir(p: &Path, uid: u32) -> Result<(), StateError> {
    let err = |reason: String| StateError::Dir {
        path: p.to_path_buf(),
        reason,
    };
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::os::unix::fs::DirBuilderExt;
            match std::fs::DirBuilder::new().mode(0o700).create(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(err(format!(
                        "cannot create it: {e}; set SW_POOL_STATE_DIR to a private directory"
                    )))
                }
            }
        }
        Err(e) => return Err(err(e.to_string())),
        Ok(_) => {}
    }
    let m = std::fs::symlink_metadata(p).map_err(|e| err(e.to_string()))?;
    if m.file_type().is_symlink() {
        return Err(err(
            "is a symbolic link; refusing to use it (remove it)".into()
        ));
    }
    if !m.is_dir() {
        return Err(err("is not a directory".into()));
    }
    if m.uid() != uid {
        return Err(err(format!(
            "belongs to uid {}, not to you (uid {uid}); refusing to use it (someone may have planted it: remove it, or set SW_POOL_STATE_DIR)",
            m.uid()
        )));
    }
    if m.mode() & 0o022 != 0 {
        return Err(err(format!(
            "is writable by others (mode {:o}); refusing to use it (`chmod 700 {}`)",
            m.mode() & 0o7777,
            p.display()
        )));
    }
    Ok(())
}

/// Images mounted by this user on this node, from the records of `dir` (never evicted).
pub fn images_in_use(dir: &StateDir) -> Vec<PathBuf> {
    let node = dir.node().to_string();
    dir.records()
        .map(|v| {
            v.into_iter()
                .flatten()
                .filter(|r| r.node == node)
                .map(|r| r.image)
                .collect()
        })
        .unwrap_or_default()
}

/// What to mount where, for whom.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// Validated `-o` options (always read-only).
    pub options: mount::MountOptions,
    pub job_id: Option<String>,
    pub timeout: Duration,
    /// One reference per job: when the pool is already mounted there with a reference of
    /// `job_id`, nothing changes (the Slurm task prolog runs once per task).
    pub once_per_job: bool,
}

/// The result of [`acquire`].
#[derive(Debug, Clone, Serialize)]
pub struct Acquired {
    pub record: Record,
    /// The pool was already mounted there by this user: only the reference count went up.
    pub reused: bool,
    /// Time spent mounting (zero when reused).
    pub mount_seconds: f64,
    /// Things the user should know (a leftover record replaced, …).
    pub notes: Vec<String>,
}

/// The record of `mountpoint` when it is this user's live mount of the pool with manifest digest
/// `digest` (any image when `None`) and already carries a reference of `job_id`: what
/// [`acquire`] with `once_per_job` would leave unchanged. Reads the record and the mount table only
/// (no lock, no image), so that the Slurm task prolog of every task after the first on a node touches
/// neither the pool on shared storage nor the store's lock. `None` for anything else (no record, a
/// pending or stale one, another pool, another user, no reference of the job): the caller then takes
/// the full path.
pub fn held_by_job(
    sys: &dyn Sys,
    dir: &StateDir,
    mountpoint: &Path,
    digest: Option<&str>,
    job_id: &str,
) -> Result<Option<Record>, Error> {
    let Some(rec) = dir.read(mountpoint)? else {
        return Ok(None);
    };
    let pool_ok = match (digest, &rec.pool) {
        (None, _) => true,
        (Some(d), Some(p)) => p.digest == d,
        (Some(_), None) => false,
    };
    if rec.pending
        || rec.uid != sys.euid()
        || !pool_ok
        || !rec.refs.iter().any(|r| r.job_id.as_deref() == Some(job_id))
    {
        return Ok(None);
    }
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    Ok(match mount::state(sys, &mounts, &rec.mount_point) {
        MountState::Mounted => Some(rec),
        _ => None,
    })
}

/// Mount `req.image` at `req.mountpoint` and record it, or add a reference to the same pool already
/// mounted there. Everything happens under the store's lock.
pub fn acquire(sys: &dyn Sys, dir: &StateDir, req: &AcquireRequest) -> Result<Acquired, Error> {
    let image = ImageInfo::inspect(&req.image)?;
    let mp = mount::canonical_mountpoint(&req.mountpoint)?;
    let _lock = dir.lock()?;
    let mut notes = Vec::new();
    let me = sys.euid();
    if let Some(mut rec) = dir.read(&mp)? {
        let mounts = sys.mounts().map_err(MountError::MountTable)?;
        match mount::state(sys, &mounts, &mp) {
            MountState::Mounted if rec.pending => {
                // its writer held the lock and is gone: a mount whose record was never completed
                notes.push(format!(
                    "an interrupted mount of {} at {} (pid {} died while mounting) was undone",
                    rec.label(),
                    mp.display(),
                    rec.refs.first().map(|r| r.pid).unwrap_or(0)
                ));
                mount::unmount(sys, &mp, true)?;
                dir.remove(&mp)?;
            }
            MountState::Mounted => {
                if rec.uid != me {
                    return Err(StateError::Conflict {
                        mount_point: mp,
                        reason: format!("is mounted by uid {}, not by you", rec.uid),
                    }
                    .into());
                }
                if !rec.same_image(&image) {
                    return Err(StateError::Conflict {
                        mount_point: mp.clone(),
                        reason: format!(
                            "already has {} ({}) mounted; unmount it first or choose another mount point",
                            rec.label(),
                            rec.image.display()
                        ),
                    }
                    .into());
                }
                let has_job_ref =
                    req.job_id.is_some() && rec.refs.iter().any(|r| r.job_id == req.job_id);
                if !(req.once_per_job && has_job_ref) {
                    rec.refs.push(Ref {
                        job_id: req.job_id.clone(),
                        since: now(),
                        pid: std::process::id(),
                    });
                    dir.write(&rec)?;
                }
                return Ok(Acquired {
                    record: rec,
                    reused: true,
                    mount_seconds: 0.0,
                    notes,
                });
            }
            MountState::Stale if rec.pending => {
                notes.push(format!(
                    "a stale, interrupted mount of {} at {} was cleaned",
                    rec.label(),
                    mp.display()
                ));
                mount::unmount(sys, &mp, true)?;
                dir.remove(&mp)?;
            }
            MountState::Stale => {
                return Err(StateError::Conflict {
                    mount_point: mp.clone(),
                    reason: format!(
                        "holds a stale mount of {} (its FUSE helper, pid {}, died); clean it with `sw-pool umount --force {}`",
                        rec.label(),
                        rec.helper_pid,
                        mp.display()
                    ),
                }
                .into());
            }
            MountState::Absent => {
                notes.push(format!(
                    "a record said {} was mounted at {} but it was not (unmounted by hand?); record replaced",
                    rec.label(),
                    mp.display()
                ));
                dir.remove(&mp)?;
            }
        }
    }
    let log = dir.log_path(&mp);
    // from the helper's start until the record is written: an interrupt waits for this to finish
    let _critical = mount::critical_section();
    // write-ahead: the record exists (pending) before the helper starts, so that even a SIGKILL
    // between mount and record leaves something `cleanup` and the Slurm epilog can find
    let mut rec = Record {
        schema: SCHEMA,
        mount_point: mp.clone(),
        image: image.path.clone(),
        format: image.format,
        backend: image.backend,
        pool: image.pool.clone(),
        helper_pid: 0,
        uid: me,
        user: user_name(me),
        node: dir.node().to_string(),
        created: now(),
        refs: vec![Ref {
            job_id: req.job_id.clone(),
            since: now(),
            pid: std::process::id(),
        }],
        pending: true,
    };
    dir.write(&rec)?;
    let m = match mount::mount(sys, &image, &mp, &log, req.timeout) {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_file(&log);
            let _ = dir.remove(&mp);
            return Err(e.into());
        }
    };
    rec.pending = false;
    rec.helper_pid = m.helper_pid;
    if let Err(e) = dir.write(&rec) {
        // no record, no mount: undo it
        let _ = mount::unmount(sys, &mp, true);
        let _ = dir.remove(&mp);
        return Err(e.into());
    }
    Ok(Acquired {
        record: rec,
        reused: false,
        mount_seconds: m.elapsed.as_secs_f64(),
        notes,
    })
}

/// The result of [`release`].
#[derive(Debug, Clone, Serialize)]
pub struct Released {
    pub mount_point: PathBuf,
    /// The record as it was (none for a mount that had no record).
    pub record: Option<Record>,
    /// References left (0: unmounted).
    pub remaining: usize,
    /// Set when the mount was taken down.
    pub unmounted: Option<Unmounted>,
}

/// Drop one reference to the mount at `mountpoint` (the one of `job_id` if there is one); the last
/// reference unmounts it and removes the record. A FUSE mount without a record is unmounted; a record
/// whose mount is gone is removed. `force`: a busy mount is detached lazily.
pub fn release(
    sys: &dyn Sys,
    dir: &StateDir,
    mountpoint: &Path,
    force: bool,
    job_id: Option<&str>,
) -> Result<Released, Error> {
    let mp = mount::canonical_mountpoint(mountpoint)?;
    let _lock = dir.lock()?;
    let rec = match dir.read(&mp) {
        Ok(r) => r,
        Err(e @ StateError::Corrupt { .. }) if force => {
            tracing::warn!("{e}; removing it (--force)");
            dir.remove(&mp)?;
            None
        }
        Err(e) => return Err(e.into()),
    };
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    let st = mount::state(sys, &mounts, &mp);
    let Some(mut rec) = rec else {
        if st == MountState::Absent {
            return Err(MountError::NotMounted { path: mp }.into());
        }
        let u = mount::unmount(sys, &mp, force)?;
        return Ok(Released {
            mount_point: mp,
            record: None,
            remaining: 0,
            unmounted: Some(u),
        });
    };
    if st == MountState::Mounted && rec.refs.len() > 1 {
        let i = job_id
            .and_then(|j| {
                rec.refs
                    .iter()
                    .rposition(|r| r.job_id.as_deref() == Some(j))
            })
            .unwrap_or(rec.refs.len() - 1);
        let before = rec.clone();
        rec.refs.remove(i);
        dir.write(&rec)?;
        return Ok(Released {
            mount_point: mp,
            record: Some(before),
            remaining: rec.refs.len(),
            unmounted: None,
        });
    }
    let unmounted = match st {
        MountState::Absent => None,
        _ => Some(mount::unmount(sys, &mp, force)?),
    };
    dir.remove(&mp)?;
    Ok(Released {
        mount_point: mp,
        record: Some(rec),
        remaining: 0,
        unmounted,
    })
}

/// What [`list`] makes of a mount point (serialized lowercase, as `sw-pool list --json` prints it;
/// [`ListStatus::as_str`] gives the same name for the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListStatus {
    Ok,
    Mounting,
    Stale,
    Gone,
    Unrecorded,
    Corrupt,
}

impl ListStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ListStatus::Ok => "ok",
            ListStatus::Mounting => "mounting",
            ListStatus::Stale => "stale",
            ListStatus::Gone => "gone",
            ListStatus::Unrecorded => "unrecorded",
            ListStatus::Corrupt => "corrupt",
        }
    }
}

impl std::fmt::Display for ListStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One line of [`list`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListEntry {
    pub mount_point: PathBuf,
    pub record: Option<Record>,
    pub state: MountState,
    /// `ok`, `mounting` (being mounted right now), `stale` (FUSE process died, or the mount was
    /// interrupted), `gone` (record without mount), `unrecorded` (a mount of this user made by a FUSE
    /// helper sw-pool uses, without a record), `corrupt` (unreadable record).
    pub status: ListStatus,
    pub problem: Option<String>,
}

/// This node's mounts and records of the calling user.
pub fn list(sys: &dyn Sys, dir: &StateDir) -> Result<Vec<ListEntry>, Error> {
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in dir.records()? {
        match r {
            Ok(rec) => {
                let st = mount::state(sys, &mounts, &rec.mount_point);
                seen.insert(rec.mount_point.clone());
                let writer = rec.refs.first().map(|r| r.pid).unwrap_or(0);
                let (status, problem) = match st {
                    _ if rec.pending && clean::alive(writer) => (ListStatus::Mounting, None),
                    _ if rec.pending => (
                        ListStatus::Stale,
                        Some(format!(
                            "pid {writer} was killed while mounting it; clean it with `sw-pool cleanup --stale`"
                        )),
                    ),
                    MountState::Mounted => (ListStatus::Ok, None),
                    MountState::Stale => (
                        ListStatus::Stale,
                        Some(format!(
                            "its FUSE helper (pid {}) died; clean it with `sw-pool cleanup --stale` (or `sw-pool umount --force {}`)",
                            rec.helper_pid,
                            rec.mount_point.display()
                        )),
                    ),
                    MountState::Absent => (
                        ListStatus::Gone,
                        Some(format!(
                            "recorded but not mounted; remove the record with `sw-pool umount {}`",
                            rec.mount_point.display()
                        )),
                    ),
                };
                out.push(ListEntry {
                    mount_point: rec.mount_point.clone(),
                    record: Some(rec),
                    state: st,
                    status,
                    problem,
                });
            }
            Err(e) => {
                let path = match &e {
                    StateError::Corrupt { path, .. } => path.clone(),
                    _ => dir.path().to_path_buf(),
                };
                out.push(ListEntry {
                    mount_point: PathBuf::new(),
                    record: None,
                    state: MountState::Absent,
                    status: ListStatus::Corrupt,
                    problem: Some(format!("{e} ({})", path.display())),
                });
            }
        }
    }
    let me = sys.euid();
    for m in &mounts {
        if m.is_swpool_helper() && m.fuse_user_id() == Some(me) && !seen.contains(&m.mount_point) {
            seen.insert(m.mount_point.clone());
            let st = mount::state(sys, &mounts, &m.mount_point);
            out.push(ListEntry {
                mount_point: m.mount_point.clone(),
                record: None,
                state: st,
                status: if st == MountState::Stale {
                    ListStatus::Stale
                } else {
                    ListStatus::Unrecorded
                },
                problem: Some(format!(
                    "a {} mount of {} without a sw-pool record{}",
                    m.fstype,
                    m.source,
                    if st == MountState::Stale {
                        "; its FUSE process died: `sw-pool umount --force`"
                    } else {
                        ""
                    }
                )),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
