//! Mounting as root onto the directory that was checked, never onto a path looked up again.
//!
//! A mount point checked by path and then mounted by path is a time-of-check/time-of-use race
//! whenever a user can write one of its parent directories: between the check and the helper's
//! `mount(2)` the user swaps the directory for a symlink (`renameat2(RENAME_EXCHANGE)`), and root's
//! mount lands on the symlink's target. Root's mounts therefore go through three steps:
//!
//! 1. [`Pinned::open`]: the mount point is opened once (`O_PATH|O_DIRECTORY`, resolved with
//!    `RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS`: no symlink anywhere in the path at that moment),
//!    and what the caller checked by path is compared with the opened directory (same device and
//!    inode, still empty);
//! 2. the FUSE helper mounts on a fresh [`Stage`] directory under `/run/sw-pool`, which only root
//!    can reach, so no path the helper resolves can be redirected;
//! 3. [`Pinned::attach`]: the staged mount is cloned (`open_tree(OPEN_TREE_CLONE)`) and moved onto
//!    the opened directory (`move_mount(MOVE_MOUNT_T_EMPTY_PATH)`), then the staging mount is
//!    detached. A clone is moved rather than the staged mount itself because the kernel refuses to
//!    move a mount whose parent is shared (`/run` usually is).
//!
//! The mount thus lands on the directory that was checked, or nowhere. An unprivileged caller
//! mounts through `fusermount3`, whose own checks apply. A privileged kernel-mount path can reuse
//! the same three steps with its own `mount(2)` on the stage.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
use rustix::mount::{MoveMountFlags, OpenTreeFlags, UnmountFlags};

/// Where staging directories live: root-owned, mode 0700 (as is its parent, root's state
/// directory), on a file system users cannot write.
pub const STAGE_ROOT: &str = "/run/sw-pool/stage";

/// A mount point opened once.
#[derive(Debug)]
pub struct Pinned {
    fd: OwnedFd,
    pub dev: u64,
    pub ino: u64,
    pub uid: u32,
    /// It had no entries when it was opened.
    pub empty: bool,
    /// The mount moved onto it (kept to detach it again when it must be undone).
    attached: std::sync::Mutex<Option<OwnedFd>>,
}

impl Pinned {
    /// Open `path` (absolute, no symlinks in it) as a directory, without following any symlink.
    /// `ELOOP`/`EXDEV` mean a symlink appeared somewhere in the path.
    pub fn open(path: &Path) -> io::Result<Pinned> {
        let fd = rustix::fs::openat2(
            CWD,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )?;
        Self::from_fd(fd)
    }

    fn from_fd(fd: OwnedFd) -> io::Result<Pinned> {
        let st = rustix::fs::fstat(&fd)?;
        let dir = rustix::fs::openat(
            &fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut entries = rustix::fs::Dir::read_from(&dir)?;
        let mut empty = true;
        while let Some(e) = entries.read() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                empty = false;
                break;
            }
        }
        Ok(Pinned {
            fd,
            dev: st.st_dev,
            ino: st.st_ino,
            uid: st.st_uid,
            empty,
            attached: std::sync::Mutex::new(None),
        })
    }

    /// Open `rel` (relative, no `..`, no symlink anywhere, not crossing a mount) beneath the
    /// directory `root` was opened on: the kernel refuses any resolution that would leave it
    /// (`RESOLVE_BENEATH`). For the privileged helper's configured mount roots.
    pub fn open_beneath(root: &OwnedFd, rel: &Path) -> io::Result<Pinned> {
        Self::from_fd(dir_beneath(root, rel)?)
    }

    /// Open `path` (absolute) with no symlink anywhere in it, as [`Pinned::open`], and return the
    /// bare descriptor: a root directory for [`Pinned::open_beneath`].
    pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
        Ok(rustix::fs::openat2(
            CWD,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )?)
    }

    /// The opened directory.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Move a detached mount (`fsmount`'s or `open_tree`'s descriptor) onto this directory; kept
    /// for [`Pinned::detach`].
    pub fn attach_tree(&self, tree: OwnedFd) -> io::Result<()> {
        rustix::mount::move_mount(
            tree.as_fd(),
            "",
            self.fd.as_fd(),
            "",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )?;
        *self.attached.lock().unwrap_or_else(|e| e.into_inner()) = Some(tree);
        Ok(())
    }

    /// Move the mount at `stage` onto this directory (see the module documentation); the ID of
    /// the mount that landed, read from its own descriptor (`statx` `STATX_MNT_ID`): what sits at
    /// the mount point's path afterwards may be another mount a user moved there.
    pub fn attach(&self, stage: &Path) -> io::Result<u32> {
        let tree = rustix::mount::open_tree(
            CWD,
            stage,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )?;
        rustix::mount::move_mount(
            tree.as_fd(),
            "",
            self.fd.as_fd(),
            "",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )?;
        let id = crate::kmount::mount_id(&tree);
        *self.attached.lock().unwrap_or_else(|e| e.into_inner()) = Some(tree);
        let id = id?;
        u32::try_from(id).map_err(|_| io::Error::other(format!("mount ID {id} out of range")))
    }

    /// Undo [`Pinned::attach`] wherever the directory is now (it may have been renamed since it
    /// was opened): a lazy unmount through the moved mount's own descriptor.
    pub fn detach(&self) -> io::Result<()> {
        let g = self.attached.lock().unwrap_or_else(|e| e.into_inner());
        match g.as_ref() {
            Some(t) => rustix::mount::unmount(
                format!("/proc/self/fd/{}", t.as_raw_fd()).as_str(),
                UnmountFlags::DETACH,
            )
            .map_err(io::Error::from),
            None => Ok(()),
        }
    }
}

/// A fresh staging directory only root can reach; removed (with whatever is still mounted on it
/// detached) by [`Stage::remove`].
#[derive(Debug)]
pub struct Stage {
    pub path: PathBuf,
}

impl Stage {
    /// Create `/run/sw-pool/stage/<pid>-<random>`, after checking that it and its parent are real
    /// directories of root's that no one else can enter.
    pub fn create() -> io::Result<Stage> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let root = Path::new(STAGE_ROOT);
        for d in [root.parent().unwrap_or(root), root] {
            match std::fs::DirBuilder::new().mode(0o700).create(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            let m = std::fs::symlink_metadata(d)?;
            if !m.is_dir() || m.uid() != 0 || m.mode() & 0o077 != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is not a directory of root's with mode 0700 (uid {}, mode {:o}); remove it",
                        d.display(),
                        m.uid(),
                        m.mode() & 0o7777
                    ),
                ));
            }
        }
        for _ in 0..16 {
            let path = root.join(format!(
                "{}-{}",
                std::process::id(),
                crate::userdir::random_suffix()
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Stage { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::from(io::ErrorKind::AlreadyExists))
    }

    /// Detach anything still mounted on the stage and remove it.
    pub fn remove(path: &Path) {
        let _ = rustix::mount::unmount(path, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW);
        let _ = std::fs::remove_dir(path);
    }
}

/// The directory `rel` beneath `root` as an `O_PATH` descriptor: relative, no `..`, no symlink
/// anywhere, not crossing into another mount (`RESOLVE_BENEATH|NO_SYMLINKS|NO_MAGICLINKS|NO_XDEV`).
pub fn dir_beneath(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH
            | ResolveFlags::NO_SYMLINKS
            | ResolveFlags::NO_MAGICLINKS
            | ResolveFlags::NO_XDEV,
    )?)
}
