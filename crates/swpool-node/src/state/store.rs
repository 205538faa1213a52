//! The record store: a private directory per user and node, its lock, reading and writing records.

use super::*;
use crate::config::{EnvVar, Environment};

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
    _l: crate::lock::FileLock,
}

impl StateDir {
    /// Where the store lives for `uid`: `$SW_POOL_STATE_DIR`, else `/run/sw-pool` (root), else
    /// `$XDG_RUNTIME_DIR/sw-pool` (when that directory exists and is ours), else `/tmp/sw-pool-<uid>`
    /// (the variables from `env`).
    pub fn default_path(uid: u32, env: &Environment) -> PathBuf {
        if let Some(p) = env.get_os(EnvVar::StateDir).filter(|v| !v.is_empty()) {
            return PathBuf::from(p);
        }
        if uid == 0 {
            return PathBuf::from("/run/sw-pool");
        }
        if let Some(x) = crate::userdir::runtime_dir(env.xdg_runtime_dir(), uid) {
            return x.join("sw-pool");
        }
        // /tmp/sw-pool-<uid>, or the user's private fallback when someone squatted that name
        crate::userdir::resolve(Path::new("/tmp"), uid, false)
            .unwrap_or_else(|_| crate::userdir::predictable(Path::new("/tmp"), uid))
    }

    /// Open (creating if needed) the store for the effective user.
    pub fn open_default(env: &Environment) -> Result<StateDir, StateError> {
        let uid = rustix::process::geteuid().as_raw();
        let p = Self::default_path(uid, env);
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

    /// The socket of this user's on-demand server with process id `pid` on this node
    /// (`lazy-<pid>.sock`, [`crate::ondemand::serve`]).
    pub fn server_socket(&self, pid: u32) -> PathBuf {
        self.path.join(format!("lazy-{pid}.sock"))
    }

    /// The process id in a file name of [`StateDir::server_socket`]'s making.
    pub fn server_socket_pid(name: &str) -> Option<u32> {
        name.strip_prefix("lazy-")?
            .strip_suffix(".sock")?
            .parse()
            .ok()
    }

    /// Whether the long warning named `key` (a pool's digest and what is wrong with it) is due on
    /// this node: not given in the last `period`. Marks it given now. When the store cannot say,
    /// it is due (a warning is repeated rather than lost).
    pub fn warning_due(&self, key: &str, period: std::time::Duration) -> bool {
        let dir = self.path.join("warned");
        if ensure_private_dir(&dir, self.uid).is_err() {
            return true;
        }
        let name = file_safe(&format!("{}-{key}", self.node));
        let stamp = dir.join(name);
        let recent = std::fs::symlink_metadata(&stamp)
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age < period);
        if !recent {
            let _ = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .custom_flags(libc_nofollow())
                .open(&stamp)
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        }
        !recent
    }

    /// Remember that a job put what only lives as long as it (step marks, layer marks,
    /// environments' uppers) under the cache base `base` on this node, so that the epilog's
    /// `cleanup --job` looks there too: it runs without the tasks' environment, and a base that
    /// came from `$LOCAL_TMPDIR` set by a TaskProlog, or from `--cache-dir`, is unknown to it
    /// otherwise. Best effort; at most [`MAX_BASES`] are remembered.
    pub fn remember_base(&self, base: &Path) {
        let base = crate::exec::absolute(base);
        let Some(line) = base.to_str().filter(|b| !b.contains('\n')) else {
            return;
        };
        let known = self.remembered_bases();
        if known.contains(&base) || known.len() >= MAX_BASES {
            return;
        }
        use std::io::Write;
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc_nofollow())
            .open(bases_file(&self.path, &self.node))
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    }

    /// [`Self::remember_base`] in the effective user's default store (opened, made if needed);
    /// nothing when there is none to be had (best effort, as the remembering itself).
    pub fn remember_job_base(env: &Environment, base: &Path) {
        if let Ok(st) = Self::open_default(env) {
            st.remember_base(base);
        }
    }

    /// The cache bases [`Self::remember_base`] noted on this node (absolute paths, each once).
    pub fn remembered_bases(&self) -> Vec<PathBuf> {
        Self::remembered_bases_in(&self.path)
    }

    /// [`Self::remembered_bases`] of the store at `dir`, which is only read (`cleanup --dry-run`
    /// changes nothing).
    pub fn remembered_bases_in(dir: &Path) -> Vec<PathBuf> {
        let Ok(f) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_nofollow())
            .open(bases_file(dir, &hostname()))
        else {
            return Vec::new();
        };
        use std::io::Read;
        let mut text = String::new();
        if f.take(64 * 1024).read_to_string(&mut text).is_err() {
            return Vec::new();
        }
        let mut out: Vec<PathBuf> = Vec::new();
        for l in text.lines().map(PathBuf::from) {
            if l.is_absolute() && !out.contains(&l) && out.len() < MAX_BASES {
                out.push(l);
            }
        }
        out
    }

    /// Take the store's exclusive lock (blocks until it is free).
    pub fn lock(&self) -> Result<StateLock, StateError> {
        let p = self.path.join("lock");
        let l = crate::lock::FileLock::exclusive(&p).map_err(|source| StateError::Io {
            path: p.clone(),
            source,
        })?;
        Ok(StateLock { _l: l })
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

    /// Where the chunk server of the mount at `mount_point` serves its image (`mount --in-place`).
    pub fn serve_path(&self, mount_point: &Path) -> PathBuf {
        self.path
            .join("mounts")
            .join(format!("{}.serve", Self::key(&self.node, mount_point)))
    }

    /// The sidecar holding a record's mount ID (see [`StateDir::write`]).
    fn mount_id_path(&self, mount_point: &Path) -> PathBuf {
        self.path
            .join("mounts")
            .join(format!("{}.mid", Self::key(&self.node, mount_point)))
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
        // the schema first: a newer one is not damage, and its fields may not parse here
        #[derive(serde::Deserialize)]
        struct Probe {
            schema: u32,
        }
        if let Ok(Probe { schema }) = serde_json::from_slice::<Probe>(&b) {
            if schema > SCHEMA {
                return Err(StateError::Newer {
                    path: p.to_path_buf(),
                    what: format!("record schema {schema}; this one reads schema {SCHEMA}"),
                });
            }
        }
        let r: Record = serde_json::from_slice(&b)
            .map_err(|e| corrupt(format!("not a sw-pool mount record ({e})")))?;
        if r.schema != SCHEMA {
            return Err(corrupt(format!(
                "schema {} (this sw-pool writes {SCHEMA})",
                r.schema
            )));
        }
        Ok(self.with_sidecar(r))
    }

    /// A record without `mount_id` in its JSON takes it from its sidecar, when the sidecar was
    /// written with this very record (`ID HELPER_PID CREATED`: a sidecar left behind by an earlier
    /// sw-pool's clean-up never lends its ID to a later mount; anything else is ignored — the ID
    /// only helps find a renamed mount).
    fn with_sidecar(&self, mut r: Record) -> Record {
        if r.mount_id.is_none() {
            let side = self.mount_id_path(&r.mount_point);
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open(&side);
            if let Ok(mut f) = opened {
                let mut s = String::new();
                let small = f.metadata().is_ok_and(|m| m.is_file() && m.len() < 64);
                if small && f.read_to_string(&mut s).is_ok() {
                    let v: Vec<u64> = s
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    if let [id, pid, created] = v[..] {
                        if pid == u64::from(r.helper_pid) && created == r.created {
                            r.mount_id = u32::try_from(id).ok();
                        }
                    }
                }
            }
        }
        r
    }

    /// Write a record atomically (a private temporary, fsync, rename, fsync the directory:
    /// [`crate::atomic::write_file`]).
    ///
    /// A mount served by a FUSE helper is written in the shape sw-pool wrote before records named
    /// what serves them (no `serving`: `backend` and `helper_pid` say it; the mount ID in a sidecar
    /// `<key>.mid`, which earlier versions do not list), so that an earlier sw-pool on the same node
    /// (whose reader refused unknown fields) still reads, lists and cleans it up. Other kinds are
    /// written whole.
    pub fn write(&self, r: &Record) -> Result<(), StateError> {
        let dest = self.record_path(&r.mount_point);
        let side = self.mount_id_path(&r.mount_point);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| StateError::Io { path, source }
        };
        let fuse = match &r.serving {
            None => true,
            Some(Serving::Fuse { helper, pid }) => *helper == r.backend && *pid == r.helper_pid,
            Some(_) => false,
        };
        let mut shaped = r.clone();
        if fuse {
            shaped.serving = None;
            match shaped.mount_id.take() {
                Some(id) => {
                    let line = format!("{id} {} {}\n", r.helper_pid, r.created);
                    crate::atomic::write_file(&side, line.as_bytes(), true).map_err(io(&side))?
                }
                None => remove_if_there(&side)?,
            }
        }
        let mut bytes = serde_json::to_vec_pretty(&shaped).expect("record json");
        bytes.push(b'\n');
        crate::atomic::write_file(&dest, &bytes, true).map_err(io(&dest))
    }

    /// Remove a mount point's record and helper log.
    pub fn remove(&self, mount_point: &Path) -> Result<(), StateError> {
        // a user image's lease goes with its record, once its helper has written everything out
        if let Ok(Some(rec)) = self.read(mount_point) {
            if let Some(h) = &rec.lease {
                crate::userimage::end_lease(&rec.image, h, rec.helper_pid);
            }
        }
        for p in [
            self.record_path(mount_point),
            self.log_path(mount_point),
            self.mount_id_path(mount_point),
        ] {
            remove_if_there(&p)?;
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

fn remove_if_there(p: &Path) -> Result<(), StateError> {
    match std::fs::remove_file(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StateError::Io {
            path: p.to_path_buf(),
            source,
        }),
    }
}

/// Most cache bases remembered per node ([`StateDir::remember_base`]).
pub const MAX_BASES: usize = 64;

/// Where [`StateDir::remember_base`] keeps node `node`'s bases in the store at `dir` (per node: a
/// store may be on shared storage).
fn bases_file(dir: &Path, node: &str) -> PathBuf {
    dir.join(format!("cache-bases.{}", file_safe(node)))
}

/// `s` with every character but ASCII letters, digits and `-_.` made `_` (a file name part).
fn file_safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// `O_NOFOLLOW`: a stamp in the private store is never reached through a symlink.
fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}
