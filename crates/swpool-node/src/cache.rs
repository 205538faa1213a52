//! The node-local pool cache: `<base>/sw-pool-<uid>/cache/<name>-<version>-<digest>.pool`, one
//! verified copy per pool digest, private to its user. Entries are used least-recently first out
//! (`load` marks an entry used by setting its access time), never while a mount of this user uses
//! them, and pruned to a size on demand (`sw-pool cache prune`) or by the configured watermarks.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{Environment, HostVar};
use crate::pool::Pool;
use swpool_format::status::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(
        "node-local cache {}: {reason}; choose another with --cache-dir",
        crate::exec::show(path)
    )]
    Dir { path: PathBuf, reason: String },
    #[error("cannot {what} {}: {source}", crate::exec::show(path))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl CacheError {
    pub fn exit_status(&self) -> ExitStatus {
        ExitStatus::System
    }
}

/// The base directory for caches: `flag`, the configured `cache_dir` (`$SW_POOL_CACHE`),
/// `$LOCAL_TMPDIR`, `$TMPDIR` (from `env`), `/tmp`.
pub fn base_dir(flag: Option<&Path>, configured: Option<&Path>, env: &Environment) -> PathBuf {
    base_dir_from(flag, configured, env).0
}

/// [`base_dir`] and what chose it: `flag`, `configured`, `$LOCAL_TMPDIR`, `$TMPDIR` or `/tmp`.
pub fn base_dir_from(
    flag: Option<&Path>,
    configured: Option<&Path>,
    env: &Environment,
) -> (PathBuf, &'static str) {
    let var = |v: HostVar| env.get_os(v).filter(|v| !v.is_empty()).map(PathBuf::from);
    flag.map(|p| (p.to_path_buf(), "flag"))
        .or_else(|| configured.map(|p| (p.to_path_buf(), "configured")))
        .or_else(|| var(HostVar::LocalTmpdir).map(|p| (p, "$LOCAL_TMPDIR")))
        .or_else(|| var(HostVar::Tmpdir).map(|p| (p, "$TMPDIR")))
        .unwrap_or_else(|| (PathBuf::from("/tmp"), "/tmp"))
}

/// The user's cache directory under `base` (created 0700 when `create`), checked: a directory, not
/// a symlink, owned by `uid`, writable by nobody else (a shared cache would let one user plant a
/// file that another user's load then trusts).
pub fn dir(base: &Path, uid: u32, create: bool) -> Result<PathBuf, CacheError> {
    let bad = |p: &Path, reason: String| CacheError::Dir {
        path: p.to_path_buf(),
        reason,
    };
    if !base.is_dir() {
        return Err(bad(base, "does not exist or is not a directory".into()));
    }
    // <base>/sw-pool-<uid>, or the user's private fallback when someone squatted that name
    let top = crate::userdir::resolve(base, uid, create).map_err(|e| {
        bad(
            base,
            format!("cannot create the user's cache directory: {e}"),
        )
    })?;
    let cache = top.join("cache");
    for d in [&top, &cache] {
        if create {
            match std::fs::DirBuilder::new().mode(0o700).create(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(bad(d, format!("cannot create it: {e}"))),
            }
        }
        let m = std::fs::symlink_metadata(d).map_err(|e| bad(d, e.to_string()))?;
        if !m.is_dir() || m.uid() != uid || m.mode() & 0o022 != 0 {
            return Err(bad(d, format!("must be a directory (not a symlink) owned by uid {uid} and writable only by it")));
        }
    }
    Ok(cache)
}

/// The user's node-local copies of layers ([`swpool_env::sync`]), beside the cache directory
/// `cache` ([`dir`]): `<base>/sw-pool-<uid>/layers`.
pub fn layers_dir(cache: &Path) -> PathBuf {
    crate::atomic::parent_dir(cache).join("layers")
}

/// The user's warm starts of `run --cache` views (`sw-pool-view --warm`), beside the cache
/// directory `cache` ([`dir`]): `<base>/sw-pool-<uid>/views/<key>`, one directory per viewed tree
/// ([`view_key`]).
pub fn views_dir(cache: &Path) -> PathBuf {
    crate::atomic::parent_dir(cache).join("views")
}

/// The name of a viewed tree's warm start in [`views_dir`]: its canonical path, hashed.
pub fn view_key(tree: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    blake3::hash(tree.as_os_str().as_bytes()).to_hex()[..32].to_string()
}

/// Where the nodes of a job step leave the outcome of placing the pool `spec` for the step's
/// tasks (`run --pool` in a step: task 0 places it on every node with `cache fetch --for-step`,
/// each task reads its node's outcome): `<base>/sw-pool-<uid>/steps/<JOB.STEP>/<key>`, `key` a
/// hash of the spec. `None` for a step id that is not `DIGITS.DIGITS` (or `DIGITS`).
pub fn step_mark(cache: &Path, step: &str, spec: &str) -> Option<PathBuf> {
    let ok = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    let valid = match step.split_once('.') {
        Some((j, s)) => ok(j) && ok(s),
        None => ok(step),
    };
    if !valid {
        return None;
    }
    let key = blake3::hash(spec.as_bytes()).to_hex();
    Some(steps_dir(cache).join(step).join(&key.as_str()[..24]))
}

/// The job steps' marks ([`step_mark`]), beside the cache directory `cache` as [`layers_dir`]:
/// `<base>/sw-pool-<uid>/steps`.
fn steps_dir(cache: &Path) -> PathBuf {
    crate::atomic::parent_dir(cache).join("steps")
}

/// Record at `mark` ([`step_mark`]) what placing gave on this node: the placement (JSON) or why it
/// failed; written whole under a temporary name and renamed. Steps' marks older than
/// [`swpool_env::sync::MARK_MAX_AGE`] go first (the epilog removes a job's marks where the site's
/// cache base is, [`remove_step_marks`]; a `--cache-dir` elsewhere would gather them for ever).
pub fn write_step_mark(mark: &Path, outcome: Result<&[u8], &str>) -> std::io::Result<()> {
    let dir = crate::atomic::parent_dir(mark);
    swpool_env::sync::prune_old_marks(
        crate::atomic::parent_dir(dir),
        swpool_env::sync::MARK_MAX_AGE,
    );
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let (path, bytes) = match outcome {
        Ok(b) => (mark.with_extension("ok"), b),
        Err(why) => (mark.with_extension("failed"), why.as_bytes()),
    };
    crate::atomic::write_file(&path, bytes, true)
}

/// What [`write_step_mark`] left at `mark`, if anything yet: `Ok(bytes)` or `Err(why)`.
pub fn read_step_mark(mark: &Path) -> Option<Result<Vec<u8>, String>> {
    if let Ok(b) = std::fs::read(mark.with_extension("ok")) {
        return Some(Ok(b));
    }
    std::fs::read_to_string(mark.with_extension("failed"))
        .ok()
        .map(Err)
}

/// Remove the marks of job `job`'s steps (the epilog; marks are a few hundred bytes each).
pub fn remove_step_marks(cache: &Path, job: &str) {
    let steps = steps_dir(cache);
    let Ok(rd) = std::fs::read_dir(&steps) else {
        return;
    };
    for e in rd.flatten() {
        if swpool_env::sync::of_job(&e.file_name().to_string_lossy(), job) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The user's cache directory under `base` when it exists (`None`: no pool was ever cached there),
/// checked like [`dir`].
pub fn existing_dir(base: &Path, uid: u32) -> Result<Option<PathBuf>, CacheError> {
    let top = crate::userdir::resolve(base, uid, false).unwrap_or_else(|_| base.join("-"));
    for d in [top.clone(), top.join("cache")] {
        if std::fs::symlink_metadata(&d).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
            return Ok(None);
        }
    }
    dir(base, uid, false).map(Some)
}

/// The cache file for a pool.
pub fn entry_path(cache: &Path, name: &str, version: &str, digest: &str) -> PathBuf {
    let hex = digest.split_once(':').map(|(_, h)| h).unwrap_or(digest);
    cache.join(format!("{name}-{version}-{hex}.pool"))
}

/// Whether `path` has the shape of `uid`'s cache entry for this pool (`…/sw-pool-<uid>/cache/<name>-
/// <version>-<hex>.pool`) under any base directory. For callers that hold a mount record made in
/// another environment (the Slurm task prolog does not see the job's `$LOCAL_TMPDIR`), so that
/// bookkeeping such as [`touch`] goes to a cache entry and never to an image elsewhere.
pub fn is_entry_of(path: &Path, uid: u32, name: &str, version: &str, digest: &str) -> bool {
    let want = entry_path(Path::new(""), name, version, digest);
    let cache = path.parent();
    let top = cache.and_then(Path::parent);
    path.file_name() == want.file_name()
        && cache.and_then(Path::file_name) == Some("cache".as_ref())
        && top
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .is_some_and(|n| {
                let own = format!("sw-pool-{uid}");
                n == own
                    || n.strip_prefix(&own)
                        .is_some_and(|r| r.len() > 1 && r.starts_with('.'))
            })
}

/// What an entry's file was when it was last verified: a file changed since (its size, mtime,
/// ctime or inode differ; `chmod u+w` and a write change the ctime, which no user can set back) is
/// checked against its manifest again before it is used ([`revalidate`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Verified {
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    dev: u64,
}

impl Verified {
    fn of(m: &std::fs::Metadata) -> Verified {
        Verified {
            len: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
            ctime_ns: m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128,
            ino: m.ino(),
            dev: m.dev(),
        }
    }
}

/// Where an entry's [`Verified`] stamp is kept: `.<entry>.verified` beside it (a dot name, so not
/// an entry itself).
fn stamp_path(entry: &Path) -> Option<PathBuf> {
    let name = entry.file_name()?.to_str()?;
    Some(entry.with_file_name(format!(".{name}.verified")))
}

fn read_stamp(entry: &Path) -> Option<Verified> {
    let p = stamp_path(entry)?;
    let f = crate::pool::open_regular(&p).ok()?;
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(f, 4096), &mut b).ok()?;
    serde_json::from_slice(&b).ok()
}

/// Is `entry` exactly the file that was verified last (its stamp matches)?
pub fn unchanged_since_verified(entry: &Path) -> bool {
    let Ok(m) = std::fs::symlink_metadata(entry) else {
        return false;
    };
    m.is_file() && read_stamp(entry).is_some_and(|s| s == Verified::of(&m))
}

/// Record that `entry`, as it is now, was verified against its manifest (called after a copy that
/// verified every chunk committed it, or after [`revalidate`] checked it).
pub fn record_verified(entry: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(entry)?;
    let Some(p) = stamp_path(entry) else {
        return Ok(());
    };
    if read_stamp(entry).is_some_and(|s| s == Verified::of(&m)) {
        return Ok(()); // already says so: no rewrite (and no fsync) on a load from the cache
    }
    let (tmp, mut f) = crate::atomic::TempOutput::create(&p)?;
    std::io::Write::write_all(
        &mut f,
        &serde_json::to_vec(&Verified::of(&m)).expect("json"),
    )?;
    tmp.commit(f)
}

/// Before an existing entry is reused: if its file changed since it was verified (or it was never
/// stamped), check it against its own manifest again (one pass, holes not read, `null` chunks must
/// be all zeros); a mismatch, a damaged trailer or a manifest of another pool drops it, and the
/// copy that follows makes it anew. Returns whether it was dropped.
pub fn revalidate(entry: &Path, digest: &str) -> bool {
    if std::fs::symlink_metadata(entry).is_err() || unchanged_since_verified(entry) {
        return false;
    }
    let good = Pool::open(entry).ok().is_some_and(|p| {
        p.manifest.digest == digest
            && p.file.as_ref().is_some_and(|f| {
                matches!(
                    crate::pool::chunks::verify_image(f, &p.manifest, None),
                    Ok(None)
                )
            })
    });
    if good {
        let _ = record_verified(entry);
        tracing::info!(path = %entry.display(), "cache entry changed since it was verified; checked again: intact");
        return false;
    }
    crate::userdir::warn_once(&format!(
        "cache entry {} changed since it was verified and no longer matches its manifest; dropped, copying it again",
        crate::exec::show(entry)
    ));
    let _ = remove_entry(entry);
    true
}

/// Remove a cache entry and its [`Verified`] stamp (a partial copy: and its record).
pub fn remove_entry(entry: &Path) -> std::io::Result<()> {
    std::fs::remove_file(entry)?;
    if let Some(p) = stamp_path(entry) {
        let _ = std::fs::remove_file(p);
    }
    if is_partial(entry) {
        let _ = std::fs::remove_file(swpool_serve::store::record_path(entry));
    }
    Ok(())
}

/// The partial copy beside a cache entry: the chunks on-demand runs fetched (`<entry>.part`, with
/// its record, [`swpool_serve::store`]).
pub fn partial_path(entry: &Path) -> PathBuf {
    let mut s = entry.as_os_str().to_os_string();
    s.push(PARTIAL_SUFFIX);
    PathBuf::from(s)
}

const PARTIAL_SUFFIX: &str = ".part";

/// A partial copy ([`partial_path`] of an entry), not an entry.
fn is_partial(p: &Path) -> bool {
    p.file_name().is_some_and(|n| {
        n.to_string_lossy()
            .strip_suffix(PARTIAL_SUFFIX)
            .is_some_and(|e| e.ends_with(".pool"))
    })
}

/// Mark an entry used now (its access time), for least-recently-used eviction. Setting the access
/// time changes the ctime: an entry that was unchanged since verified stays stamped as verified.
pub fn touch(path: &Path) -> std::io::Result<()> {
    let was_verified = unchanged_since_verified(path);
    touch_atime(path)?;
    if was_verified {
        record_verified(path)?;
    }
    Ok(())
}

fn touch_atime(path: &Path) -> std::io::Result<()> {
    use rustix::fs::{utimensat, AtFlags, Timespec, Timestamps, CWD, UTIME_NOW, UTIME_OMIT};
    let t = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
        last_modification: Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
    };
    utimensat(CWD, path, &t, AtFlags::SYMLINK_NOFOLLOW).map_err(std::io::Error::from)
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub path: PathBuf,
    /// `name/version` from the entry's manifest, or `None` for a damaged file.
    pub pool: Option<String>,
    pub digest: Option<String>,
    /// Bytes on disk (holes not counted).
    pub disk_bytes: u64,
    /// Last use (seconds since the epoch).
    pub last_used: i64,
    /// Mounted by this user on this node right now.
    pub in_use: bool,
    /// A partial copy (the chunks on-demand runs fetched; its record beside it), not a whole pool.
    #[serde(default)]
    pub partial: bool,
}

/// Every entry of the cache, least recently used first. `in_use` names images that are mounted.
pub fn list(cache: &Path, in_use: &[PathBuf]) -> Result<Vec<Entry>, CacheError> {
    let rd = std::fs::read_dir(cache).map_err(|source| CacheError::Io {
        what: "read",
        path: cache.into(),
        source,
    })?;
    let mut v = Vec::new();
    for e in rd.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        let partial = is_partial(&path);
        if !(name.ends_with(".pool") || partial) || name.starts_with('.') {
            continue; // temporaries of copies under way are not entries
        }
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !m.is_file() {
            continue;
        }
        // a partial copy has no trailer (the pool's name is in its file name)
        let opened = (!partial).then(|| Pool::open(&path).ok()).flatten();
        let (pool, digest) = match opened {
            Some(p) => (
                Some(format!("{}/{}", p.manifest.name, p.manifest.version)),
                Some(p.manifest.digest),
            ),
            None => (None, None),
        };
        v.push(Entry {
            in_use: in_use.iter().any(|u| u == &path),
            path,
            pool,
            digest,
            disk_bytes: m.blocks() * 512,
            last_used: m.atime().max(m.mtime()),
            partial,
        });
    }
    v.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.path.cmp(&b.path)));
    Ok(v)
}

/// Which entries to evict so that the cache holds at most `target` bytes: least recently used
/// first, never one in use. Returns the victims (in eviction order) and the size left after them.
pub fn plan_prune(entries: &[Entry], target: u64) -> (Vec<&Entry>, u64) {
    let mut total: u64 = entries.iter().map(|e| e.disk_bytes).sum();
    let mut victims = Vec::new();
    for e in entries {
        if total <= target {
            break;
        }
        if e.in_use {
            continue;
        }
        total -= e.disk_bytes;
        victims.push(e);
    }
    (victims, total)
}

/// After a load: a cache above the high watermark is pruned to the low one (least recently used
/// first, never an image in `in_use`, never `keep`). Problems are logged, never fatal to the load.
pub fn prune_to_watermarks(cfg: &crate::config::Config, keep: &Path, uid: u32, in_use: &[PathBuf]) {
    let Some(cache) = keep.parent() else { return };
    let mut in_use = in_use.to_vec();
    in_use.push(keep.to_path_buf());
    let Ok(entries) = list(cache, &in_use) else {
        return;
    };
    let total = entries.iter().map(|e| e.disk_bytes).sum();
    if let Some(target) = cfg.cache_prune_target(total) {
        let (victims, _) = plan_prune(&entries, target);
        for v in victims {
            match remove_entry(&v.path) {
                Ok(()) => {
                    tracing::info!(uid, path = %v.path.display(), "evicted from the node-local cache")
                }
                Err(e) => tracing::warn!(path = %v.path.display(), "cannot evict: {e}"),
            }
        }
    }
}

/// A pool in a node's cache, verified: what `cache fetch` reports and `run --pool` mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub name: String,
    pub version: String,
    pub digest: String,
    /// The pool file it came from.
    pub src: PathBuf,
    /// The node-local copy (this node's cache entry).
    pub image: PathBuf,
    pub format: crate::image::ImageFormat,
    /// What vouched for it (the trust verdict, as `load` says it).
    pub trust: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_marks_are_per_step_and_spec_and_go_with_their_job() {
        let d = tempfile::tempdir().unwrap();
        let cache = d.path().join("sw-pool-7/cache");
        let m = step_mark(&cache, "42.0", "gcc/12").unwrap();
        assert!(
            m.starts_with(d.path().join("sw-pool-7/steps/42.0")),
            "{}",
            m.display()
        );
        assert_ne!(m, step_mark(&cache, "42.0", "gcc/13").unwrap());
        assert_ne!(m, step_mark(&cache, "42.1", "gcc/12").unwrap());
        for bad in ["", "../1", "4.2.0", "42.x", "/abs", "1; rm"] {
            assert!(step_mark(&cache, bad, "gcc/12").is_none(), "{bad}");
        }
        assert!(read_step_mark(&m).is_none());
        write_step_mark(&m, Ok(b"{}")).unwrap();
        assert_eq!(read_step_mark(&m), Some(Ok(b"{}".to_vec())));
        let f = step_mark(&cache, "420.3", "x").unwrap();
        write_step_mark(&f, Err("node2: no room")).unwrap();
        assert_eq!(read_step_mark(&f), Some(Err("node2: no room".into())));
        // job 42's steps go, job 420's stay
        remove_step_marks(&cache, "42");
        assert!(read_step_mark(&m).is_none());
        assert!(read_step_mark(&f).is_some());
        // marks no epilog removed (a --cache-dir elsewhere) go when older than MARK_MAX_AGE and
        // another step writes its marks
        let old_step = d.path().join("sw-pool-7/steps/420.3");
        let day = 24 * 3600 * 1_000_000_000i128;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        swpool_sys::atomic::set_mtime(&old_step, now - 29 * day).unwrap();
        write_step_mark(&step_mark(&cache, "43.0", "x").unwrap(), Ok(b"{}")).unwrap();
        assert!(read_step_mark(&f).is_some(), "29 days: kept");
        swpool_sys::atomic::set_mtime(&old_step, now - 31 * day).unwrap();
        write_step_mark(&step_mark(&cache, "44.0", "x").unwrap(), Ok(b"{}")).unwrap();
        assert!(read_step_mark(&f).is_none(), "31 days: removed");
        assert!(read_step_mark(&step_mark(&cache, "43.0", "x").unwrap()).is_some());
    }

    #[test]
    fn is_entry_of_accepts_only_this_users_entry_for_this_pool() {
        let d = "blake3:00ff";
        let ok = Path::new("/l/sw-pool-7/cache/demo-1.0-00ff.pool");
        assert!(is_entry_of(ok, 7, "demo", "1.0", d));
        assert_eq!(
            entry_path(Path::new("/l/sw-pool-7/cache"), "demo", "1.0", d),
            ok
        );
        assert!(
            !is_entry_of(ok, 8, "demo", "1.0", d),
            "another user's cache"
        );
        assert!(!is_entry_of(ok, 7, "demo", "1.1", d), "another version");
        assert!(
            !is_entry_of(ok, 7, "demo", "1.0", "blake3:00fe"),
            "another digest"
        );
        for p in [
            "/scratch/pools/demo-1.0-00ff.pool",
            "/l/sw-pool-7/mnt/demo-1.0-00ff.pool",
            "/l/sw-pool-77/cache/demo-1.0-00ff.pool",
            "sw-pool-7/cache/demo-1.0-00ff.pool/x",
            "demo-1.0-00ff.pool",
            "/",
            "",
        ] {
            assert!(!is_entry_of(Path::new(p), 7, "demo", "1.0", d), "{p}");
        }
    }

    fn e(name: &str, bytes: u64, used: i64, in_use: bool) -> Entry {
        Entry {
            path: name.into(),
            pool: None,
            digest: None,
            partial: false,
            disk_bytes: bytes,
            last_used: used,
            in_use,
        }
    }

    #[test]
    fn lru_never_in_use() {
        let v = vec![
            e("a", 100, 1, false),
            e("b", 100, 2, true),
            e("c", 100, 3, false),
            e("d", 100, 4, false),
        ];
        let (victims, left) = plan_prune(&v, 200);
        assert_eq!(
            victims
                .iter()
                .map(|e| e.path.to_str().unwrap())
                .collect::<Vec<_>>(),
            vec!["a", "c"]
        );
        assert_eq!(left, 200);
        let (victims, left) = plan_prune(&v, 0);
        assert_eq!(victims.len(), 3);
        assert_eq!(left, 100, "the entry in use stays");
        assert!(plan_prune(&v, 1000).0.is_empty());
    }

    #[test]
    fn private_dir_checks() {
        let d = tempfile::tempdir().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        let c = dir(d.path(), uid, true).unwrap();
        assert!(c.ends_with("cache"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(c.parent().unwrap(), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        // a top directory others can write is not used: the user gets a private one beside it
        let c2 = dir(d.path(), uid, true).unwrap();
        assert_ne!(c2, c);
        assert!(c2
            .parent()
            .unwrap()
            .to_str()
            .unwrap()
            .contains(&format!("sw-pool-{uid}.")));
        assert!(is_entry_of(
            &entry_path(&c2, "demo", "1.0", "blake3:ab"),
            uid,
            "demo",
            "1.0",
            "blake3:ab"
        ));
        assert!(dir(&d.path().join("nope"), uid, true).is_err());
    }

    #[test]
    fn partial_copies_are_listed_and_pruned_with_their_record() {
        let d = tempfile::tempdir().unwrap();
        let part = d.path().join("demo-1.0-ab.pool.part");
        let (st, _) = swpool_serve::LocalStore::open(&part, "blake3:ab", 8192, 4096).unwrap();
        st.write_chunk(0, &[1u8; 4096]).unwrap();
        st.flush().unwrap();
        drop(st);
        let v = list(d.path(), &[]).unwrap();
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(
            v[0].partial && v[0].pool.is_none() && v[0].disk_bytes >= 4096,
            "{v:?}"
        );
        remove_entry(&v[0].path).unwrap();
        assert!(!part.exists());
        assert!(!swpool_serve::store::record_path(&part).exists());
        assert!(list(d.path(), &[]).unwrap().is_empty());
    }
}
