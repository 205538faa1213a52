//! Mount points: their canonical form (root's walked by descriptor), creating one, and the checks
//! before a mount.

use super::*;

/// The canonical form of a mount point path: its parent resolved, its last component kept as
/// given (checked not to be a symlink by [`check_mountpoint`]). As a user, symlinks in the parent
/// are resolved the way the kernel shows them (`fusermount3` makes its own checks). As root, the
/// parent is walked from `/` by descriptor ([`walk`]): a symlink in a directory a user can write is
/// refused, never followed, so a user cannot send root's mount (or `mkdir`) elsewhere.
pub fn canonical_mountpoint(p: &Path) -> Result<PathBuf, MountError> {
    let abs = crate::exec::absolute(p);
    let err = |reason: String| MountError::MountPoint {
        path: abs.clone(),
        reason,
    };
    let name = match abs.file_name() {
        Some(n) if n != ".." && n != "." => n.to_os_string(),
        _ => return Err(err("give a directory path that ends in a name".into())),
    };
    let parent = abs.parent().unwrap_or(Path::new("/"));
    if rustix::process::geteuid().is_root() {
        let w = walk::walk_dir(parent, None).map_err(|e| {
            err(format!(
                "its parent directory {} is not usable: {e}",
                crate::exec::show(parent)
            ))
        })?;
        return Ok(w.path.join(name));
    }
    let parent = std::fs::canonicalize(parent).map_err(|e| {
        err(format!(
            "its parent directory {} is not usable: {e}",
            crate::exec::show(parent)
        ))
    })?;
    Ok(parent.join(name))
}

/// Create the directory `mp` if it is missing (its parent must exist), as `mkdir` would but, as
/// root, with `mkdirat` on the descriptor of its parent reached by [`walk::walk_dir`]; then its
/// canonical form ([`canonical_mountpoint`]).
pub fn create_leaf(mp: &Path, mode: u32) -> Result<PathBuf, MountError> {
    let abs = crate::exec::absolute(mp);
    let err = |reason: String| MountError::MountPoint {
        path: abs.clone(),
        reason,
    };
    if !rustix::process::geteuid().is_root() {
        use std::os::unix::fs::DirBuilderExt;
        if std::fs::symlink_metadata(&abs).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(&abs)
                .map_err(|e| err(format!("cannot create it: {e}")))?;
        }
        return canonical_mountpoint(&abs);
    }
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else {
        return Err(err("give a directory path that ends in a name".into()));
    };
    let w = walk::walk_dir(parent, None).map_err(|e| {
        err(format!(
            "cannot create it: its parent directory {} is not usable: {e}",
            crate::exec::show(parent)
        ))
    })?;
    match rustix::fs::mkdirat(&w.fd, name, rustix::fs::Mode::from_raw_mode(mode)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(err(format!("cannot create it: {e}"))),
    }
    Ok(w.path.join(name))
}

/// Why `mp`'s parent no longer walks as root ([`walk::walk_dir`]), if it does not.
pub(super) fn parent_changed(mp: &Path) -> Option<String> {
    let parent = mp.parent()?;
    walk::walk_dir(parent, None)
        .err()
        .map(|e| format!("its parent changed while it was being checked: {e}"))
}

/// Check a (canonical) mount point before mounting on it; what `lstat` said of it.
pub fn check_mountpoint(sys: &dyn Sys, mp: &Path) -> Result<sys::FileMeta, MountError> {
    let err = |reason: String| MountError::MountPoint {
        path: mp.to_path_buf(),
        reason,
    };
    let m = sys.lstat(mp).map_err(|e| match e.kind() {
        _ if e.raw_os_error() == Some(libc::ENOTCONN) => err(
            "is a stale FUSE mount (its FUSE process died); clean it with `sw-pool umount --force`"
                .into(),
        ),
        // as root: a parent that no longer walks (a user swapped in a symlink since) is a race
        _ if walk::is_refused_symlink(&e) => MountError::Raced {
            path: mp.to_path_buf(),
            reason: format!("its parent changed while it was being checked: {e}"),
        },
        std::io::ErrorKind::NotFound => match (sys.euid() == 0).then(|| parent_changed(mp)) {
            Some(Some(reason)) => MountError::Raced {
                path: mp.to_path_buf(),
                reason,
            },
            _ => err("does not exist; create an empty directory first (`mkdir -p`)".into()),
        },
        _ => err(e.to_string()),
    })?;
    match m.kind {
        sys::FileKind::Dir => {}
        sys::FileKind::Symlink => {
            return Err(err(
                "is a symbolic link; mount points must be real directories (symlinks could redirect the mount)".into(),
            ))
        }
        _ => return Err(err("is not a directory".into())),
    }
    let uid = sys.euid();
    if m.uid != uid && m.uid != 0 {
        return Err(err(format!(
            "belongs to uid {}, not to you (uid {uid}) or root",
            m.uid
        )));
    }
    // an unprivileged FUSE mount needs write access to the mount point (fusermount3 refuses
    // otherwise, and the helper's failure would look like a damaged image)
    if uid != 0 && m.uid != uid && rustix::fs::access(mp, rustix::fs::Access::WRITE_OK).is_err() {
        return Err(MountError::MountPointDenied {
            path: mp.to_path_buf(),
            reason: format!(
                "belongs to uid {} and is not writable by you (uid {uid}): an unprivileged FUSE \
                 mount needs a mount point you can write; use an empty directory you own (the \
                 default $SW_POOL_MOUNT/NAME/VERSION is one)",
                m.uid
            ),
        });
    }
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    if let Some(e) = proc::mount_at(&mounts, mp) {
        let stale = matches!(state(sys, &mounts, mp), MountState::Stale);
        return Err(err(format!(
            "is already a mount point ({} from {}){}",
            e.fstype,
            e.source,
            if stale {
                "; its FUSE process died (stale): clean it with `sw-pool umount --force`"
            } else {
                "; unmount it first or choose another directory"
            }
        )));
    }
    if let Some(parent) = mp.parent() {
        if let Ok(pm) = sys.lstat(parent) {
            if pm.dev != m.dev {
                return Err(err(
                    "is already a mount point (another file system is mounted there)".into(),
                ));
            }
        }
    }
    match sys.dir_is_empty(mp) {
        Ok(true) => Ok(m),
        Ok(false) => Err(err("is not empty; mount on an empty directory".into())),
        // a directory a moment ago: someone replaced it (or, as root, a parent) while it was
        // being checked
        Err(e)
            if walk::is_refused_symlink(&e)
                || matches!(
                    e.raw_os_error(),
                    Some(libc::ENOTDIR | libc::ELOOP | libc::ENOENT)
                ) =>
        {
            Err(MountError::Raced {
                path: mp.to_path_buf(),
                reason: format!("it was replaced while it was being checked: {e}"),
            })
        }
        Err(e) => Err(err(format!("cannot be read: {e}"))),
    }
}
