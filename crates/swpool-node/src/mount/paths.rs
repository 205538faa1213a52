//! Where pools are mounted by default, creating mount points safely, and finding `name/version`.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::MountError;

/// The directory under which pools are mounted as `<name>/<version>`: the configured `mount_dir`
/// (`$SW_POOL_MOUNT`), else `/run/sw-pool/mnt` for root, else `$XDG_RUNTIME_DIR/sw-pool/mnt` (from
/// `env`), else `/tmp/sw-pool-<uid>/mnt`.
pub fn default_mount_dir(
    configured: Option<&Path>,
    uid: u32,
    env: &crate::config::Environment,
) -> PathBuf {
    if let Some(p) = configured {
        return crate::exec::absolute(p);
    }
    if uid == 0 {
        return PathBuf::from("/run/sw-pool/mnt");
    }
    if let Some(x) = crate::userdir::runtime_dir(env.xdg_runtime_dir(), uid) {
        return x.join("sw-pool/mnt");
    }
    crate::userdir::resolve(Path::new("/tmp"), uid, true)
        .unwrap_or_else(|_| crate::userdir::predictable(Path::new("/tmp"), uid))
        .join("mnt")
}

/// Create `root/<name>/<version>` (mode 0755 for each component made), checking every component
/// from `root` down with `lstat`: no symlinks, directories only, and each component we create or
/// descend into below `root` must belong to us or root. Returns the canonical path.
pub fn create_mountpoint(
    root: &Path,
    name: &str,
    version: &str,
    uid: u32,
) -> Result<PathBuf, MountError> {
    for part in [name, version] {
        crate::pool::manifest::check_name("pool name/version", part).map_err(|reason| {
            MountError::MountPoint {
                path: root.join(name).join(version),
                reason,
            }
        })?;
    }
    let err = |p: &Path, reason: String| MountError::MountPoint {
        path: p.to_path_buf(),
        reason,
    };
    if uid == 0 && rustix::process::geteuid().is_root() {
        return create_as_root(root, name, version);
    }
    // the mount root itself: create its parents as needed (like mkdir -p), then check it
    if std::fs::symlink_metadata(root).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(root)
            .map_err(|e| err(root, format!("cannot create it: {e}")))?;
    }
    let mut cur = super::canonical_mountpoint(root)?;
    for (i, part) in [None, Some(name), Some(version)].into_iter().enumerate() {
        if let Some(p) = part {
            cur = cur.join(p);
            match std::fs::DirBuilder::new().mode(0o755).create(&cur) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(err(&cur, format!("cannot create it: {e}"))),
            }
        }
        let m = match std::fs::symlink_metadata(&cur) {
            Ok(m) => m,
            // a stale FUSE mount at the mount point itself: the caller reports it (with its record)
            Err(e) if i == 2 && e.raw_os_error() == Some(libc::ENOTCONN) => return Ok(cur),
            Err(e) => return Err(err(&cur, e.to_string())),
        };
        if m.file_type().is_symlink() {
            return Err(err(
                &cur,
                "is a symbolic link; refusing to mount through it".into(),
            ));
        }
        if !m.is_dir() {
            return Err(err(&cur, "is not a directory".into()));
        }
        if i > 0 && m.uid() != uid && m.uid() != 0 {
            return Err(err(
                &cur,
                format!("belongs to uid {}, not to you (uid {uid})", m.uid()),
            ));
        }
    }
    Ok(cur)
}

/// Root's [`create_mountpoint`]: the mount root walked (and made) from `/` by descriptor, then
/// `<name>` and `<version>` made with `mkdirat` and opened without following a symlink; each must
/// be a directory of root's.
fn create_as_root(root: &Path, name: &str, version: &str) -> Result<PathBuf, MountError> {
    use rustix::fs::{FileType, Mode, OFlags};
    let w = super::walk::walk_dir(root, Some(0o755)).map_err(|e| MountError::MountPoint {
        path: root.to_path_buf(),
        reason: format!("cannot be reached or created: {e}"),
    })?;
    let mut fd = w.fd;
    let mut cur = w.path;
    for (i, part) in [name, version].into_iter().enumerate() {
        cur = cur.join(part);
        let err = |reason: String| MountError::MountPoint {
            path: cur.clone(),
            reason,
        };
        match rustix::fs::mkdirat(&fd, part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(err(format!("cannot create it: {e}"))),
        }
        let next = rustix::fs::openat(
            &fd,
            part,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(format!("cannot open it: {e}")))?;
        let st = match rustix::fs::fstat(&next) {
            Ok(st) => st,
            // a stale FUSE mount at the mount point itself: the caller reports it (with its record)
            Err(rustix::io::Errno::NOTCONN) if i == 1 => return Ok(cur),
            Err(e) => return Err(err(e.to_string())),
        };
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => {}
            FileType::Symlink => {
                return Err(err(
                    "is a symbolic link; refusing to mount through it".into()
                ))
            }
            _ => return Err(err("is not a directory".into())),
        }
        if st.st_uid != 0 {
            return Err(err(format!("belongs to uid {}, not to root", st.st_uid)));
        }
        fd = next;
    }
    Ok(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_checked_components_and_refuses_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        let root = d.path().join("a/mnt");
        let p = create_mountpoint(&root, "demo", "1.0", uid).unwrap();
        assert!(p.ends_with("a/mnt/demo/1.0") && p.is_dir());
        // again: fine
        assert_eq!(create_mountpoint(&root, "demo", "1.0", uid).unwrap(), p);
        // a symlink planted at <name>
        std::fs::create_dir(d.path().join("evil")).unwrap();
        std::os::unix::fs::symlink(d.path().join("evil"), root.join("other")).unwrap();
        let e = create_mountpoint(&root, "other", "1.0", uid)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!d.path().join("evil/1.0").exists());
        assert!(create_mountpoint(&root, "..", "1.0", uid).is_err());
    }
}
