//! Site pools: one verified root-owned copy and one kernel mount per node, whoever loads them.
//!
//! `mount-pool POOL`: the pool file is opened with the caller's credentials; its trailer is read
//! and checked; the manifest signature must verify with a key in the **site's** trusted-keys
//! directory (never a user's). If the node's root-owned cache has no copy of that digest, the
//! image is streamed from the opened file into a temporary name in the cache, every chunk hashed
//! against the signed manifest before it is written, and renamed when complete; a chunk that does
//! not match fails the copy and leaves nothing. Only root can change the cache, so the kernel is
//! handed only bytes that were verified and cannot change after (this kernel has no dm-verity).
//! The copy is mounted read-only, `nosuid,nodev`, through a read-only autoclear loop device, at
//! `<pool_mount_root>/<NAME>/<VERSION>` (directories root creates by descriptor), once: a second
//! load adds a reference (user, job) and reads nothing. `release-pool` drops a reference; the last
//! one unmounts, and the loop device goes with the mount.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use swpool_format::format::ImageFormat;
use swpool_format::pool::manifest::{hash_chunk, ZeroHashes};
use swpool_format::pool::Pool;
use swpool_sys::kmount::{self, KernelMount};
use swpool_sys::pinned::Pinned;

use crate::caller::Caller;
use crate::config::HelperConfig;
use crate::error::{HelperError, Refusal, Result};
use crate::host::{Host, Locked};
use crate::state::{Record, Ref, State};

#[derive(Debug, Serialize)]
pub struct PoolMounted {
    pub name: String,
    pub version: String,
    pub digest: String,
    pub signer: String,
    pub mount_point: PathBuf,
    /// The copy was made now (read from the file given); `false`: the node's copy was used.
    pub copied: bool,
    /// The pool was already mounted on this node; this call added a reference.
    pub shared: bool,
    pub refs: usize,
    pub format: ImageFormat,
    pub loop_device: String,
}

/// The site's keys (`trusted_keys`); none: no pool is mounted.
pub(crate) fn site_keys(cfg: &HelperConfig) -> Result<swpool_trust::TrustedKeys> {
    let keys = swpool_trust::TrustedKeys::load(std::slice::from_ref(&cfg.trusted_keys));
    if keys.keys.is_empty() {
        return Err(HelperError::trust(format!(
            "no site key in {}: the helper mounts only pools signed by a site key",
            cfg.trusted_keys.display()
        )));
    }
    Ok(keys)
}

/// The site's trust policy: a signature by a key in `trusted_keys`, required.
pub(crate) fn site_verdict(cfg: &HelperConfig, pool: &Pool) -> Result<String> {
    let keys = site_keys(cfg)?;
    let policy = swpool_trust::TrustPolicy::new(Some((true, "helper.toml".into())), keys);
    match swpool_trust::authorize(pool, &policy) {
        Ok(swpool_trust::Verdict::Trusted { name, fingerprint }) => {
            Ok(format!("{name} ({fingerprint})"))
        }
        Ok(v) => Err(HelperError::trust(format!(
            "{}: {v}; the helper mounts only pools signed by a key in {}",
            pool.path.display(),
            cfg.trusted_keys.display()
        ))),
        Err(e) => Err(HelperError::trust(format!(
            "{e} (the helper trusts only the site's keys in {})",
            cfg.trusted_keys.display()
        ))),
    }
}

pub(crate) fn cache_name(pool: &Pool) -> String {
    let m = &pool.manifest;
    let d = m.digest.trim_start_matches("blake3:");
    format!("{}-{}-{}.pool", m.name, m.version, &d[..d.len().min(32)])
}

/// Stream the image from the pool's own file into `out`, each chunk checked against the signed
/// manifest before it is written; `progress` is called after each chunk.
fn copy_verified(pool: &Pool, out: &File, progress: &dyn Fn()) -> Result<()> {
    let m = &pool.manifest;
    let src = pool.file.as_ref().expect("opened from a file");
    let dest = Path::new("(the cache's temporary file)");
    let mut zero = ZeroHashes::default();
    let mut buf = vec![0u8; m.chunk_size as usize];
    for i in 0..m.chunks.len() {
        let r = m.chunk_range(i as u64);
        let len = (r.end - r.start) as usize;
        src.read_exact_at(&mut buf[..len], r.start)
            .map_err(|e| HelperError::system(&pool.path, e))?;
        let want = m.chunk_hash(i, &mut zero);
        if want != Some(hash_chunk(&buf[..len])) {
            return Err(HelperError::invalid(format!(
                "{}: chunk {i} (bytes {}..{}) does not match the signed manifest; nothing was cached or mounted: copy the pool again from its source",
                pool.path.display(),
                r.start,
                r.end
            )));
        }
        if m.chunks[i].is_some() {
            out.write_all_at(&buf[..len], r.start)
                .map_err(|e| HelperError::system(dest, e))?;
        }
        progress();
    }
    out.write_all_at(&pool.tail(), m.image_size)
        .map_err(|e| HelperError::system(dest, e))?;
    out.set_len(pool.file_len)
        .map_err(|e| HelperError::system(dest, e))
}

fn stalled(path: &Path, limit: std::time::Duration) -> HelperError {
    HelperError::refused(Refusal::Stalled, format!(
        "pool {}: reading it did not finish within {:.1} s (its file system does not answer: a stopped FUSE daemon?); nothing was cached or mounted (helper.toml: file_timeout_secs)",
        path.display(),
        limit.as_secs_f64()
    ))
}

/// The one verified copy at `dest`: written by a thread of its own into an unnamed file in the
/// cache directory (`O_TMPFILE`), given its name (`linkat`) only when complete. The copy is given
/// up when no chunk arrives for `limit` (a file system that does not answer): the unnamed file
/// goes with the process, nothing is left. Two calls copying at once: the first name wins, the
/// other's copy (the same verified bytes) is dropped.
pub(crate) fn copy_bounded(
    pool: std::sync::Arc<Pool>,
    dest: &Path,
    limit: std::time::Duration,
) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let dir_path = dest.parent().unwrap_or(Path::new("/"));
    let name = dest.file_name().unwrap_or_default();
    let dir = Pinned::open_root(dir_path).map_err(|e| HelperError::system(dir_path, e))?;
    let tmp: File = rustix::fs::openat(
        &dir,
        ".",
        rustix::fs::OFlags::TMPFILE | rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .map(File::from)
    .map_err(|e| HelperError::system(dir_path, e.into()))?;
    let out = tmp
        .try_clone()
        .map_err(|e| HelperError::system(dir_path, e))?;
    let start = std::time::Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel();
    {
        let last = last.clone();
        let pool = pool.clone();
        std::thread::Builder::new()
            .name("pool-copy".into())
            .spawn(move || {
                let progress = || last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                let _ = tx.send(copy_verified(&pool, &out, &progress));
            })
            .map_err(|e| HelperError::system(dir_path, e))?;
    }
    loop {
        match rx.recv_timeout(std::time::Duration::from_millis(100)) {
            Ok(r) => {
                r?;
                break;
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(HelperError::system(
                    dir_path,
                    std::io::Error::other("the copy ended without an answer"),
                ))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let quiet = start.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
                if quiet > limit.as_millis() as u64 {
                    return Err(stalled(&pool.path, limit));
                }
            }
        }
    }
    use std::os::unix::fs::PermissionsExt;
    tmp.set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| HelperError::system(dest, e))?;
    tmp.sync_all().map_err(|e| HelperError::system(dest, e))?;
    match rustix::fs::linkat(
        rustix::fs::CWD,
        format!("/proc/self/fd/{}", tmp.as_raw_fd()).as_str(),
        &dir,
        name,
        rustix::fs::AtFlags::SYMLINK_FOLLOW,
    ) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => Ok(()),
        Err(e) => Err(HelperError::system(dest, e.into())),
    }
}

fn ensure_root_dir<H: Host>(h: &H, p: &Path, mode: u32) -> Result<H::Dir> {
    h.make_root_dir(p, mode)
        .map_err(|e| HelperError::system(p, e))?;
    let fd = h.open_root(p).map_err(|e| HelperError::system(p, e))?;
    let m = h.meta(&fd).map_err(|e| HelperError::system(p, e))?;
    if m.uid != 0 || m.mode & 0o022 != 0 {
        return Err(HelperError::refused(
            Refusal::MountPoint,
            format!(
                "{} must be a directory of root's that only root can write (uid {}, mode {:o})",
                p.display(),
                m.uid,
                m.mode & 0o7777
            ),
        ));
    }
    Ok(fd)
}

pub fn fs_options(
    format: ImageFormat,
) -> (
    &'static str,
    &'static [(&'static str, Option<&'static str>)],
) {
    match format {
        ImageFormat::Squashfs => ("squashfs", &[]),
        ImageFormat::Erofs => ("erofs", &[]),
        // never replay a journal in a pool: it is read-only and verified as it is
        ImageFormat::Ext2 | ImageFormat::Ext3 | ImageFormat::Ext4 => {
            ("ext4", &[("norecovery", None)])
        }
    }
}

/// `mount-pool --digest D` (no pool file): mount the node's cached copy of that digest, or say
/// it has none (`Ok(None)`: the caller brings the pool and asks again with the file).
pub fn mount_cached<H: Host>(
    h: &H,
    cfg: &HelperConfig,
    c: &Caller,
    digest: &str,
    job: Option<&str>,
    shadow: bool,
) -> Result<Option<PoolMounted>> {
    let hex = digest.strip_prefix("blake3:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HelperError::refused(
            Refusal::Path,
            format!("{digest:?} is not a pool digest (blake3:<64 hex digits>)"),
        ));
    }
    let suffix = format!("-{}.pool", &hex[..32]);
    let Ok(rd) = std::fs::read_dir(&cfg.cache_dir) else {
        return Ok(None);
    };
    let found = rd.flatten().map(|e| e.path()).find(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.ends_with(&suffix) && !n.starts_with('.'))
    });
    let Some(cache_file) = found else {
        return Ok(None);
    };
    let _cache_fd = ensure_root_dir(h, &cfg.cache_dir, 0o755)?;
    let pool = Pool::open(&cache_file).map_err(|e| HelperError::invalid(e.to_string()))?;
    if pool.manifest.digest != digest {
        return Ok(None);
    }
    // the site's keys of today decide, not those of the day it was cached
    let signer = site_verdict(cfg, &pool)?;
    mount_verified(h, cfg, c, &pool, signer, (job, shadow), false).map(Some)
}

/// `mount-pool POOL`: check the pool the caller gave (their credentials), then mount it.
pub fn mount_pool<H: Host>(
    h: &H,
    cfg: &HelperConfig,
    c: &Caller,
    path: &Path,
    job: Option<&str>,
    shadow: bool,
) -> Result<PoolMounted> {
    crate::caller::check_path("pool", path)?;
    let limit = cfg.file_timeout();
    let opened = c.open_bounded(h, "pool", path, false, limit)?;
    // its trailer and manifest: the caller's bytes, read within the bound, no lock held
    let p = path.to_path_buf();
    let pool = crate::bounded::within(limit, move || Pool::open_file(&p, opened.file))
        .ok_or_else(|| stalled(path, limit))?
        .map_err(|e| HelperError::invalid(e.to_string()))?;
    swpool_format::pool::fs_size::check_fits(&pool)
        .map_err(|e| HelperError::invalid(e.to_string()))?;
    let signer = site_verdict(cfg, &pool)?;
    // the one verified copy, made before the records are locked
    let _cache_fd = ensure_root_dir(h, &cfg.cache_dir, 0o755)?;
    let cache_file = cfg.cache_dir.join(cache_name(&pool));
    let copied = if cache_file.is_file() {
        false
    } else {
        let pool = std::sync::Arc::new(pool);
        copy_bounded(pool.clone(), &cache_file, limit)?;
        return mount_verified(h, cfg, c, &pool, signer, (job, shadow), true);
    };
    mount_verified(h, cfg, c, &pool, signer, (job, shadow), copied)
}

/// Add a reference (for `job`; a shadow reference when the flag is set) to the node's mount of
/// `pool`, or make the one mount of the node's verified copy (`copied`: made by this call).
pub(crate) fn mount_verified<H: Host>(
    h: &H,
    cfg: &HelperConfig,
    c: &Caller,
    pool: &Pool,
    signer: String,
    (job, shadow): (Option<&str>, bool),
    copied: bool,
) -> Result<PoolMounted> {
    let m = &pool.manifest;
    let (mut st, here) = h.records()?;
    let new_ref = Ref {
        uid: c.uid,
        user: c.name.clone(),
        job: job.map(str::to_string),
        shadow,
    };

    // already mounted on this node?
    for r in st.records().mounts.iter_mut() {
        if !r.in_namespace(here) {
            continue;
        }
        if let Record::Pool {
            name,
            version,
            digest,
            mount_point,
            refs,
            loop_device,
            ..
        } = r
        {
            if *name != m.name || *version != m.version {
                continue;
            }
            if *digest != m.digest {
                return Err(HelperError::refused(Refusal::Conflict, format!(
                    "another build of {}/{} ({digest}) is mounted on this node at {} for {} job(s); it stays until they end (or ask the admin to run `sw-pool-mount-helper cleanup`)",
                    m.name, m.version, mount_point.display(), refs.len()
                )));
            }
            if !refs.contains(&new_ref) {
                refs.push(new_ref.clone());
            }
            let out = PoolMounted {
                name: m.name.clone(),
                version: m.version.clone(),
                digest: m.digest.clone(),
                signer,
                mount_point: mount_point.clone(),
                copied: false,
                shared: true,
                refs: refs.len(),
                format: m.format,
                loop_device: loop_device.clone(),
            };
            st.save()?;
            return Ok(out);
        }
    }

    // the one verified copy in the root-owned cache (made before, without the lock)
    let _cache_fd = ensure_root_dir(h, &cfg.cache_dir, 0o755)?;
    let cache_file = cfg.cache_dir.join(cache_name(pool));
    if !h.is_file(&cache_file) {
        return Err(HelperError::refused(
            Refusal::Conflict,
            format!(
                "{} is not cached on this node (its copy went meanwhile?); ask again",
                m.digest
            ),
        ));
    }

    // mount it once
    let root = ensure_root_dir(h, &cfg.pool_mount_root, 0o755)?;
    let name_dir = h
        .mkdir_open(&root, &m.name)
        .map_err(|e| HelperError::system(&cfg.pool_mount_root.join(&m.name), e))?;
    let mp = cfg.pool_mount_root.join(&m.name).join(&m.version);
    h.mkdir_open(&name_dir, &m.version)
        .map_err(|e| HelperError::system(&mp, e))?;
    let pinned = h
        .open_target(&name_dir, &m.version)
        .map_err(|e| HelperError::system(&mp, e))?;
    let backing = h
        .open_root_file(&cache_file)
        .map_err(|e| HelperError::system(&cache_file, e))?;
    let dev = h
        .attach_loop(
            std::os::fd::AsFd::as_fd(&backing),
            m.image_size,
            false,
            &cache_file.to_string_lossy(),
        )
        .map_err(|e| HelperError::system(Path::new("/dev/loop-control"), e))?;
    let (fstype, opts) = fs_options(m.format);
    let devpath = format!("/dev/{}", h.loop_name(&dev));
    let id = match h.mount_on(
        &pinned.handle,
        &KernelMount {
            fstype,
            source: &devpath,
            options: opts,
            read_only: true,
            noexec: false,
        },
    ) {
        Ok(id) => id,
        Err(e) => {
            h.free_loop(dev);
            return Err(HelperError::system(&mp, e));
        }
    };
    let loop_device = h.loop_name(&dev);
    h.hand_over_loop(dev); // the mount holds the device now; autoclear frees it with the mount
    st.records().mounts.push(Record::Pool {
        name: m.name.clone(),
        version: m.version.clone(),
        digest: m.digest.clone(),
        signer: signer.clone(),
        cache_file,
        mount_point: mp.clone(),
        mount_id: id,
        loop_device: loop_device.clone(),
        mnt_ns: here,
        refs: vec![new_ref],
        shadows: Vec::new(),
    });
    if let Err(e) = st.save() {
        let _ = h.unmount_id(id, true);
        return Err(e);
    }
    Ok(PoolMounted {
        name: m.name.clone(),
        version: m.version.clone(),
        digest: m.digest.clone(),
        signer,
        mount_point: mp,
        copied,
        shared: false,
        refs: 1,
        format: m.format,
        loop_device,
    })
}

#[derive(Debug, Serialize)]
pub struct PoolReleased {
    pub mount_point: PathBuf,
    pub refs: usize,
    pub unmounted: bool,
    /// Shadow mounts removed (the last shadow reference went).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unshadowed: Vec<PathBuf>,
}

/// Drop the caller's references (with `job`: that job's; with `shadow_only`: only those a
/// `shadow` took) to NAME/VERSION; the shadows go with the last shadow reference, the mount with
/// the last reference.
pub fn release_pool(
    c: &Caller,
    spec: &str,
    job: Option<&str>,
    shadow_only: bool,
) -> Result<PoolReleased> {
    let (n, v) = spec.split_once('/').ok_or_else(|| {
        HelperError::refused(Refusal::Path, format!("{spec:?} is not NAME/VERSION"))
    })?;
    let mut st = State::open()?;
    let here = crate::state::mount_namespace();
    let idx = st
        .records
        .mounts
        .iter()
        .position(|r| {
            r.in_namespace(here)
                && matches!(r, Record::Pool { name, version, .. } if name == n && version == v)
        })
        .ok_or_else(|| {
            HelperError::refused(
                Refusal::NotMounted,
                format!("{spec} is not mounted by the helper on this node"),
            )
        })?;
    let Record::Pool {
        refs,
        mount_point,
        mount_id,
        shadows,
        ..
    } = &mut st.records.mounts[idx]
    else {
        unreachable!()
    };
    let before = refs.len();
    refs.retain(|r| {
        !(r.uid == c.uid
            && (job.is_none() || r.job.as_deref() == job)
            && (!shadow_only || r.shadow))
    });
    if refs.len() == before {
        return Err(HelperError::refused(
            Refusal::NotMounted,
            format!(
                "you hold no {}reference to {spec} on this node{}",
                if shadow_only { "shadow " } else { "" },
                job.map(|j| format!(" for job {j}")).unwrap_or_default()
            ),
        ));
    }
    let mut errors = Vec::new();
    let unshadowed = if refs.iter().any(|r| r.shadow) {
        Vec::new()
    } else {
        crate::shadow::remove(shadows, &mut errors)
    };
    let out = PoolReleased {
        mount_point: mount_point.clone(),
        refs: refs.len(),
        unmounted: refs.is_empty(),
        unshadowed,
    };
    if refs.is_empty() && shadows.is_empty() {
        let id = *mount_id;
        kmount::unmount_id(id, true).map_err(|e| HelperError::system(&out.mount_point, e))?;
        st.records.mounts.remove(idx);
    }
    st.save()?;
    match errors.is_empty() {
        true => Ok(out),
        false => Err(HelperError::system(
            &out.mount_point,
            std::io::Error::other(format!(
                "shadow mounts could not be removed: {}",
                errors.join("; ")
            )),
        )),
    }
}
