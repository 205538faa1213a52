//! Root's kernel mounts, with the new mount API: `fsopen` + `fsconfig` + `fsmount` make a mount
//! that is attached nowhere, and `move_mount` puts it on a [`Pinned`] directory. No path is looked
//! up between the check and the mount (the source is a device root resolves in `/dev`), the mount
//! flags are set on the mount itself (`nosuid,nodev` always), and the kernel's own words on a
//! refusal (the file system context's log) go into the error.
//!
//! [`unmount_id`] is the other half: a mount is found again by its mount ID, opened through its
//! mount point without following a symlink, checked to be that very mount, and unmounted through
//! the descriptor, so a path a user renamed or swapped since cannot redirect the unmount.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, StatxFlags, CWD};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, UnmountFlags};

use crate::pinned::Pinned;

/// What to mount.
#[derive(Debug, Clone)]
pub struct KernelMount<'a> {
    /// `squashfs`, `ext4`, `erofs`.
    pub fstype: &'a str,
    /// The block device (`/dev/loopN`).
    pub source: &'a str,
    /// File-system options: a flag (`None`) or a key and value.
    pub options: &'a [(&'a str, Option<&'a str>)],
    pub read_only: bool,
    /// `noexec` (`nosuid` and `nodev` are always set).
    pub noexec: bool,
}

/// Mount `m` onto `at`; returns the new mount's ID.
pub fn mount_on(at: &Pinned, m: &KernelMount<'_>) -> io::Result<u64> {
    let fs = rustix::mount::fsopen(m.fstype, FsOpenFlags::FSOPEN_CLOEXEC)?;
    let with_log = |e: rustix::io::Errno| -> io::Error {
        let log = context_log(&fs);
        let e = io::Error::from(e);
        if log.is_empty() {
            e
        } else {
            io::Error::new(e.kind(), format!("{e} (kernel: {log})"))
        }
    };
    rustix::mount::fsconfig_set_string(fs.as_fd(), "source", m.source).map_err(with_log)?;
    if m.read_only {
        rustix::mount::fsconfig_set_flag(fs.as_fd(), "ro").map_err(with_log)?;
    }
    for (k, v) in m.options {
        match v {
            None => rustix::mount::fsconfig_set_flag(fs.as_fd(), *k),
            Some(v) => rustix::mount::fsconfig_set_string(fs.as_fd(), *k, *v),
        }
        .map_err(with_log)?;
    }
    rustix::mount::fsconfig_create(fs.as_fd()).map_err(with_log)?;
    let mut attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    if m.read_only {
        attrs |= MountAttrFlags::MOUNT_ATTR_RDONLY;
    }
    if m.noexec {
        attrs |= MountAttrFlags::MOUNT_ATTR_NOEXEC;
    }
    let mnt = rustix::mount::fsmount(fs.as_fd(), FsMountFlags::FSMOUNT_CLOEXEC, attrs)
        .map_err(with_log)?;
    let id = mount_id(&mnt)?;
    at.attach_tree(mnt)?;
    Ok(id)
}

/// Bind `rel` beneath the directory `src_root` was opened on (no `..`, no symlink anywhere, not
/// crossing into another mount: `RESOLVE_BENEATH|NO_SYMLINKS|NO_XDEV`) onto `at`; returns the new
/// mount's ID. The bind is a clone of that one mount (not its submounts) and keeps its flags
/// (a read-only, `nosuid,nodev` pool mount's bind is the same). For shadow mounts.
pub fn bind_beneath(src_root: &OwnedFd, rel: &Path, at: &Pinned) -> io::Result<u64> {
    let src = crate::pinned::dir_beneath(src_root, rel)?;
    let tree = rustix::mount::open_tree(
        src.as_fd(),
        "",
        rustix::mount::OpenTreeFlags::OPEN_TREE_CLONE
            | rustix::mount::OpenTreeFlags::OPEN_TREE_CLOEXEC
            | rustix::mount::OpenTreeFlags::AT_EMPTY_PATH,
    )?;
    let id = mount_id(&tree)?;
    at.attach_tree(tree)?;
    Ok(id)
}

/// The mount ID of the mount `fd` is on (`statx` `STATX_MNT_ID`).
pub fn mount_id(fd: &OwnedFd) -> io::Result<u64> {
    let st = rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)?;
    Ok(st.stx_mnt_id)
}

/// The messages the kernel left in a file-system context (`e …`, `w …` lines), joined.
fn context_log(fs: &OwnedFd) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    for _ in 0..16 {
        match rustix::io::read(fs, &mut buf) {
            Ok(n) if n > 0 => out.push(String::from_utf8_lossy(&buf[..n]).trim().to_string()),
            _ => break,
        }
    }
    out.join("; ")
}

/// How [`unmount_id`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Unmounted {
    Done,
    /// No mount with that ID exists any more.
    Gone,
}

/// Unmount the mount with ID `id` (lazily when `lazy`), wherever its mount point is now. Its
/// parent directory (from the mount table) is opened without following any symlink and made the
/// working directory; the last component, looked up in that very directory without following a
/// symlink, must be the root of that very mount; then `umount2(NAME, UMOUNT_NOFOLLOW)` resolves
/// the same one component again. In between, the directory's owner can at most rename something
/// else there, which is not a mount (a mount point cannot be renamed in its own namespace, nor a
/// mount moved by rename), so the unmount then fails instead of hitting another mount. No
/// descriptor on the mount is held while it is unmounted (one would make it busy).
///
/// A user renaming a directory above the mount while this runs makes the path just read from the
/// mount table stale (`ENOENT`, or another directory at that path): the mount table is read again
/// and the walk retried, up to [`MOVED_RETRIES`] times (measured under a 10 s `RENAME_EXCHANGE`
/// race of ~70,000 exchanges a second, t_48: without retries ~1 in 2 umounts failed so).
pub fn unmount_id(id: u64, lazy: bool) -> io::Result<Unmounted> {
    unmount_id_if(id, lazy, &|_| true)
}

/// [`unmount_id`] for a mount that must also still be ours: mount IDs are reused, so the mount
/// table's entry for `id` must pass `ours` (its fstype, source, the FUSE user) before the mount's
/// current location is opened by descriptor, its ID checked there and it is unmounted through that
/// descriptor; checked again on every read of the table a retry makes. A user who moved the mount
/// (renamed a parent) does not hide it; a user who swapped something else in at its old path does
/// not get that unmounted.
pub fn unmount_id_if(
    id: u64,
    lazy: bool,
    ours: &dyn Fn(&crate::proc::MountEntry) -> bool,
) -> io::Result<Unmounted> {
    let mut last = None;
    for attempt in 0..MOVED_RETRIES {
        match unmount_id_once(id, lazy, ours) {
            Ok(u) => return Ok(u),
            Err(Attempt::Moved(e)) => {
                last = Some(e);
                if attempt >= 8 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                } else {
                    std::thread::yield_now();
                }
            }
            Err(Attempt::Failed(e)) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no attempt made")))
}

/// How many times [`unmount_id`] reads the mount table again when the mount moved under it.
pub const MOVED_RETRIES: u32 = 64;

enum Attempt {
    /// The path from the mount table no longer leads to the mount (it moved meanwhile).
    Moved(io::Error),
    Failed(io::Error),
}

fn unmount_id_once(
    id: u64,
    lazy: bool,
    ours: &dyn Fn(&crate::proc::MountEntry) -> bool,
) -> Result<Unmounted, Attempt> {
    let moved = |e: rustix::io::Errno| match e {
        rustix::io::Errno::NOENT
        | rustix::io::Errno::NOTDIR
        | rustix::io::Errno::LOOP
        | rustix::io::Errno::XDEV => Attempt::Moved(e.into()),
        e => Attempt::Failed(e.into()),
    };
    let mounts = crate::proc::read_mountinfo().map_err(Attempt::Failed)?;
    let Some(m) = mounts
        .iter()
        .find(|m| u64::from(m.mount_id) == id)
        .filter(|m| ours(m))
    else {
        return Ok(Unmounted::Gone);
    };
    let (Some(parent), Some(name)) = (m.mount_point.parent(), m.mount_point.file_name()) else {
        return Err(Attempt::Failed(io::Error::other("refusing to unmount /")));
    };
    let dir = rustix::fs::openat2(
        CWD,
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(moved)?;
    {
        let root = rustix::fs::openat(
            &dir,
            name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(moved)?;
        if mount_id(&root).map_err(Attempt::Failed)? != id {
            return Err(Attempt::Moved(io::Error::other(format!(
                "{} is no longer the root of mount {id} (something was mounted over it, or it moved); nothing was unmounted",
                m.mount_point.display()
            ))));
        }
    }
    let flags = if lazy {
        UnmountFlags::DETACH | UnmountFlags::NOFOLLOW
    } else {
        UnmountFlags::NOFOLLOW
    };
    rustix::process::fchdir(&dir).map_err(|e| Attempt::Failed(e.into()))?;
    let r = rustix::mount::unmount(name, flags);
    let _ = rustix::process::chdir("/");
    r.map_err(|e| Attempt::Failed(e.into()))?;
    Ok(Unmounted::Done)
}

/// The mount point of mount `id` now, if it still exists.
pub fn mount_point_of(id: u64) -> Option<std::path::PathBuf> {
    crate::proc::read_mountinfo()
        .ok()?
        .into_iter()
        .find(|m| u64::from(m.mount_id) == id)
        .map(|m| m.mount_point)
}

/// Create directory `name` in `dir` (mode `mode`, owned by `uid`:`gid` when given) if it is not
/// there, and open it without following a symlink: root's way to make a mount point in a tree it
/// owns.
pub fn mkdir_open(
    dir: &OwnedFd,
    name: &str,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> io::Result<OwnedFd> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a directory name"),
        ));
    }
    match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)) {
        Ok(()) => {
            if let Some((u, g)) = owner {
                // SAFETY: plain numeric ids from the caller's passwd entry; any value is valid.
                let (u, g) =
                    unsafe { (rustix::fs::Uid::from_raw(u), rustix::fs::Gid::from_raw(g)) };
                rustix::fs::chownat(dir, name, Some(u), Some(g), AtFlags::SYMLINK_NOFOLLOW)?;
            }
        }
        Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(rustix::fs::openat2(
        dir,
        name,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
    )?)
}

/// `fstat` of an opened directory: (uid, mode).
pub fn owner_mode(fd: &OwnedFd) -> io::Result<(u32, u32)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_uid, st.st_mode))
}

/// Path of an absolute directory, for messages and mountinfo.
pub fn is_absolute_clean(p: &Path) -> bool {
    p.is_absolute()
        && p.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        })
}
