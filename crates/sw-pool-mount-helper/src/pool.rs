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
use swpool_sys::loopdev::LoopDevice;
use swpool_sys::pinned::Pinned;

use crate::caller::Caller;
use crate::config::HelperConfig;
use crate::error::{HelperError, Result};
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

/// The site's trust policy: a signature by a key in `trusted_keys`, required.
fn site_verdict(cfg: &HelperConfig, pool: &Pool) -> Result<String> {
    let keys = swpool_trust::TrustedKeys::load(std::slice::from_ref(&cfg.trusted_keys));
    if keys.keys.is_empty() {
        return Err(HelperError::trust(format!(
            "no site key in {}: the helper mounts only pools signed by a site key",
            cfg.trusted_keys.display()
        )));
    }
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

fn cache_name(pool: &Pool) -> String {
    let m = &pool.manifest;
    let d = m.digest.trim_start_matches("blake3:");
    format!("{}-{}-{}.pool", m.name, m.version, &d[..d.len().min(32)])
}

/// Stream the image from `src` into `dest` (a temporary name first), each chunk checked.
fn copy_verified(pool: &Pool, src: &File, dest: &Path) -> Result<()> {
    let m = &pool.manifest;
    let (tmp, out) = swpool_sys::atomic::TempOutput::create_private(dest)
        .map_err(|e| HelperError::system(dest, e))?;
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
    }
    out.write_all_at(&pool.tail(), m.image_size)
        .map_err(|e| HelperError::system(dest, e))?;
    out.set_len(pool.file_len)
        .map_err(|e| HelperError::system(dest, e))?;
    use std::os::unix::fs::PermissionsExt;
    out.set_permissions(std::fs::Permissions::from_mode(0o644))
        .map_err(|e| HelperError::system(dest, e))?;
    tmp.commit(out).map_err(|e| HelperError::system(dest, e))
}

fn ensure_root_dir(p: &Path, mode: u32) -> Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(p)
        .map_err(|e| HelperError::system(p, e))?;
    let fd = Pinned::open_root(p).map_err(|e| HelperError::system(p, e))?;
    let (uid, m) = kmount::owner_mode(&fd).map_err(|e| HelperError::system(p, e))?;
    if uid != 0 || m & 0o022 != 0 {
        return Err(HelperError::refused(format!(
            "{} must be a directory of root's that only root can write (uid {uid}, mode {:o})",
            p.display(),
            m & 0o7777
        )));
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
pub fn mount_cached(
    cfg: &HelperConfig,
    c: &Caller,
    digest: &str,
    job: Option<&str>,
    shadow: bool,
) -> Result<Option<PoolMounted>> {
    let hex = digest.strip_prefix("blake3:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HelperError::refused(format!(
            "{digest:?} is not a pool digest (blake3:<64 hex digits>)"
        )));
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
    let _cache_fd = ensure_root_dir(&cfg.cache_dir, 0o755)?;
    let pool = Pool::open(&cache_file).map_err(|e| HelperError::invalid(e.to_string()))?;
    if pool.manifest.digest != digest {
        return Ok(None);
    }
    // the site's keys of today decide, not those of the day it was cached
    let signer = site_verdict(cfg, &pool)?;
    mount_verified(cfg, c, &pool, signer, (job, shadow), None).map(Some)
}

/// `mount-pool POOL`: check the pool the caller gave (their credentials), then mount it.
pub fn mount_pool(
    cfg: &HelperConfig,
    c: &Caller,
    path: &Path,
    job: Option<&str>,
    shadow: bool,
) -> Result<PoolMounted> {
    crate::caller::check_path("pool", path)?;
    let file = c
        .open_as(path, false)
        .map_err(|e| HelperError::system(path, e))?;
    let pool = Pool::open_file(path, file).map_err(|e| HelperError::invalid(e.to_string()))?;
    swpool_format::pool::fs_size::check_fits(&pool)
        .map_err(|e| HelperError::invalid(e.to_string()))?;
    let signer = site_verdict(cfg, &pool)?;
    let src = pool.file.as_ref().expect("opened from a file");
    mount_verified(cfg, c, &pool, signer, (job, shadow), Some(src))
}

/// Add a reference (for `job`; a shadow reference when the flag is set) to the node's mount of
/// `pool`, or make the one verified copy (from `src`, when the cache has none) and the one mount.
fn mount_verified(
    cfg: &HelperConfig,
    c: &Caller,
    pool: &Pool,
    signer: String,
    (job, shadow): (Option<&str>, bool),
    src: Option<&File>,
) -> Result<PoolMounted> {
    let m = &pool.manifest;
    let (mut st, here) = State::open_live()?;
    let new_ref = Ref {
        uid: c.uid,
        user: c.name.clone(),
        job: job.map(str::to_string),
        shadow,
    };

    // already mounted on this node?
    for r in st.records.mounts.iter_mut() {
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
                return Err(HelperError::refused(format!(
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

    // one verified copy in the root-owned cache
    let _cache_fd = ensure_root_dir(&cfg.cache_dir, 0o755)?;
    let cache_file = cfg.cache_dir.join(cache_name(pool));
    let copied = if cache_file.is_file() {
        false
    } else {
        let Some(src) = src else {
            return Err(HelperError::refused(format!(
                "{} is not cached on this node",
                m.digest
            )));
        };
        copy_verified(pool, src, &cache_file)?;
        true
    };

    // mount it once
    let root = ensure_root_dir(&cfg.pool_mount_root, 0o755)?;
    let name_dir = kmount::mkdir_open(&root, &m.name, 0o755, None)
        .map_err(|e| HelperError::system(&cfg.pool_mount_root.join(&m.name), e))?;
    let mp = cfg.pool_mount_root.join(&m.name).join(&m.version);
    kmount::mkdir_open(&name_dir, &m.version, 0o755, None)
        .map_err(|e| HelperError::system(&mp, e))?;
    let pinned = Pinned::open_beneath(&name_dir, Path::new(&m.version))
        .map_err(|e| HelperError::system(&mp, e))?;
    let backing = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nofollow()
        .open(&cache_file)
        .map_err(|e| HelperError::system(&cache_file, e))?;
    let dev = LoopDevice::attach(
        std::os::fd::AsFd::as_fd(&backing),
        m.image_size,
        false,
        &cache_file.to_string_lossy(),
    )
    .map_err(|e| HelperError::system(Path::new("/dev/loop-control"), e))?;
    let (fstype, opts) = fs_options(m.format);
    let devpath = dev.path.to_string_lossy().into_owned();
    let id = match kmount::mount_on(
        &pinned,
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
            dev.detach();
            return Err(HelperError::system(&mp, e));
        }
    };
    let loop_device = dev
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    drop(dev); // the mount holds the device now; autoclear frees it with the mount
    st.records.mounts.push(Record::Pool {
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
        let _ = kmount::unmount_id(id, true);
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

trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}
impl NoFollow for std::fs::OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
    }
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
    let (n, v) = spec
        .split_once('/')
        .ok_or_else(|| HelperError::refused(format!("{spec:?} is not NAME/VERSION")))?;
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
            HelperError::refused(format!("{spec} is not mounted by the helper on this node"))
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
        return Err(HelperError::refused(format!(
            "you hold no {}reference to {spec} on this node{}",
            if shadow_only { "shadow " } else { "" },
            job.map(|j| format!(" for job {j}")).unwrap_or_default()
        )));
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
