//! Idmapped mounts for environments (`sw-pool run --layer` with the site's helper): root clones
//! one mount of a tree the site lists (`open_tree(OPEN_TREE_CLONE)`, without its submounts) and
//! gives it the id mapping of a user's namespace (`mount_setattr(MOUNT_ATTR_IDMAP)`), read-only,
//! `nosuid`, `nodev`. In that namespace the tree's root-owned files then belong to its root (the
//! user), so the kernel's overlay, mounted there by the user, can copy them up into the user's
//! layer. Unprivileged, `MOUNT_ATTR_IDMAP` is refused (`EPERM`): it needs `CAP_SYS_ADMIN` over the
//! file system's own namespace.
//!
//! Also: who owns a user namespace (`NS_GET_OWNER_UID`), for the helper's checks.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use rustix::mount::{MountAttrFlags, OpenTreeFlags};

/// `struct mount_attr` (linux/mount.h).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached clone of the mount at `tree` (that one mount, not its submounts), read-only,
/// `nosuid`, `nodev`, idmapped through the user namespace `userns`. Attach it with
/// [`crate::pinned::Pinned::attach_tree`].
pub fn idmapped_clone(tree: &OwnedFd, userns: &OwnedFd) -> io::Result<OwnedFd> {
    let clone = rustix::mount::open_tree(
        tree.as_fd(),
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH,
    )?;
    let set = MountAttrFlags::MOUNT_ATTR_IDMAP
        | MountAttrFlags::MOUNT_ATTR_RDONLY
        | MountAttrFlags::MOUNT_ATTR_NOSUID
        | MountAttrFlags::MOUNT_ATTR_NODEV;
    let attr = MountAttr {
        attr_set: u64::from(set.bits()),
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr(2) with a valid descriptor, an empty path, AT_EMPTY_PATH and a
    // `struct mount_attr` of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            clone.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(clone)
}

/// `NS_GET_OWNER_UID` (linux/nsfs.h): `_IO(0xb7, 0x4)`.
const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;

/// The uid (in this process's user namespace) that created the user namespace `ns`.
pub fn userns_owner(ns: &OwnedFd) -> io::Result<u32> {
    let mut uid: libc::uid_t = 0;
    // SAFETY: the ioctl writes one uid_t.
    let r = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_OWNER_UID as _, &mut uid) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(uid)
}

/// Device and inode of a namespace file (what identifies the namespace).
pub fn ns_id(p: &Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::stat(p)?;
    Ok((st.st_dev, st.st_ino))
}

/// Device and inode of an opened namespace.
pub fn ns_id_fd(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}
