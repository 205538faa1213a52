//! A user's own image (an ext4 file made by `sw-pool image create`), mounted by the kernel under
//! `<user_mount_root>/<user>/`.
//!
//! The image is opened with the caller's ids (on a thread of its own that takes them as its
//! file-system ids), `O_NOFOLLOW|O_NONBLOCK`, within `file_timeout_secs`, and everything is checked
//! on the opened descriptor (`fstat`: a regular file, owned by the caller; `fstatfs`: not on FUSE,
//! whose daemon the kernel would wait on through the loop device), which then backs the loop
//! device: no path is looked up again. Before the kernel sees it, `e2fsck -fn` reads it through
//! that same descriptor (killed after `tool_timeout_secs`); an image with errors is refused. The
//! node-wide records (`state.rs`) are locked only to check them (already mounted? the caller's
//! `max_images_per_user`?) before, and to check them again and record the mount after: never
//! while the image is read.
//!
//! The mount point is the helper's own: `<user_mount_root>/<user>` is root's (0755), and each
//! directory of `DIR` under it is made by root (`mkdirat` on descriptors, 0755), so the caller can
//! rename none of them nor anything in them: the mount lands under `<user_mount_root>/<user>/` and
//! stays there. It gets the mount by descriptor (`fsmount` + `move_mount`); `umount`/`cleanup`
//! remove the directories again. `nosuid,nodev` always, `noexec` unless the admin allows programs
//! in users' images.
//!
//! What this cannot prevent (SECURITY.md): the owner can rewrite the image file after the check,
//! so a crafted image can reach the kernel's ext4; sites that do not accept that set
//! `user_images = false`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use swpool_sys::kmount::KernelMount;
use swpool_sys::sys::FileKind;

use crate::caller::{check_path, Caller};
use crate::config::HelperConfig;
use crate::error::{HelperError, Refusal, Result};
use crate::host::{Host, Locked, Target};
use crate::state::Record;

#[derive(Debug, Serialize)]
pub struct ImageMounted {
    pub image: PathBuf,
    pub mount_point: PathBuf,
    pub rw: bool,
    pub loop_device: String,
}

/// `<user_mount_root>/<user>`, root's and 0755, opened (made when missing). One made by an older
/// version of the helper (the user's own) is taken over: its owner becomes root and its mode 0755,
/// through the descriptor of that very directory (`<user_mount_root>` is root's, so its entry
/// cannot be swapped meanwhile; a mount on it — the user's FUSE — is refused, never entered).
fn user_dir<H: Host>(h: &H, cfg: &HelperConfig, c: &Caller) -> Result<H::Dir> {
    let top = &cfg.user_mount_root;
    h.make_root_dir(top, 0o755)
        .map_err(|e| HelperError::system(top, e))?;
    let root = h.open_root(top).map_err(|e| HelperError::system(top, e))?;
    let rm = h.meta(&root).map_err(|e| HelperError::system(top, e))?;
    if rm.uid != 0 || rm.mode & 0o022 != 0 {
        return Err(HelperError::refused(
            Refusal::MountPoint,
            format!(
                "{} must be a directory of root's that only root can write",
                top.display()
            ),
        ));
    }
    let home = top.join(&c.name);
    let mine = h.mkdir_open(&root, &c.name).map_err(|e| {
        HelperError::refused(Refusal::MountPoint, format!(
            "{}: {e} (something of yours mounted on it, or not a directory?); nothing was mounted: unmount it (`fusermount3 -u {}`) and ask again",
            home.display(),
            home.display()
        ))
    })?;
    let hm = h.meta(&mine).map_err(|e| HelperError::system(&home, e))?;
    match rooted(hm.uid, hm.mode) {
        Ownership::Root => {}
        Ownership::Caller if hm.uid == c.uid => {
            h.adopt(&mine).map_err(|e| HelperError::system(&home, e))?;
        }
        _ => {
            return Err(HelperError::refused(
                Refusal::MountPoint,
                format!(
                    "{} belongs to uid {} (mode {:o}), not to root: an admin removes it; nothing was mounted",
                    home.display(),
                    hm.uid,
                    hm.mode & 0o7777
                ),
            ))
        }
    }
    Ok(mine)
}

/// Who may change a directory of the mount tree: root only, or someone else too.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ownership {
    Root,
    Caller,
}

/// A directory the mount tree may go through: root's, writable by root only.
pub(crate) fn rooted(uid: u32, mode: u32) -> Ownership {
    if uid == 0 && mode & 0o022 == 0 {
        Ownership::Root
    } else {
        Ownership::Caller
    }
}

/// The mount point `mp` (`<user_mount_root>/<user>/REL`) as the helper makes it: each component
/// of REL opened beneath the one before (no symlink, no `..`, no other mount) or made there by
/// root (`mkdirat`, 0755), each root's and writable by root only, so the caller can rename none of
/// them nor anything in them: the mount lands under `<user_mount_root>/<user>/` and stays there.
/// A directory of the caller's left in the tree by an older version is removed when empty (it is
/// in a directory of root's: nothing can be swapped); a symlink too; anything else is refused.
/// Returns the opened mount point (empty, not a mount).
fn make_mount_point<H: Host>(
    h: &H,
    cfg: &HelperConfig,
    c: &Caller,
    mp: &Path,
) -> Result<Target<H::Target>> {
    check_path("mount point", mp)?;
    let home = cfg.user_mount_root.join(&c.name);
    let rel = mp
        .strip_prefix(&home)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .ok_or_else(|| {
            HelperError::refused(
                Refusal::OutsideRoot,
                format!(
                    "mount point {} is not under {}/ (the only place the helper mounts your images)",
                    mp.display(),
                    home.display()
                ),
            )
        })?;
    let mut dir = user_dir(h, cfg, c)?;
    let refuse = |at: &Path, why: String| {
        HelperError::refused(
            Refusal::MountPoint,
            format!(
                "mount point {}: {} {why}; nothing was mounted",
                mp.display(),
                at.display()
            ),
        )
    };
    let mut at = home.clone();
    let parts: Vec<_> = rel.components().collect();
    for (i, part) in parts.iter().enumerate() {
        let name = part.as_os_str().to_string_lossy().into_owned();
        at.push(&name);
        clear_legacy(h, &dir, &name).map_err(|why| refuse(&at, why))?;
        let next = h.mkdir_open(&dir, &name).map_err(|e| {
            let why = match e.raw_os_error() {
                Some(libc::EXDEV) => "is a mount point already (refused)".to_string(),
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => "is not a directory (refused)".into(),
                _ => e.to_string(),
            };
            refuse(&at, why)
        })?;
        let m = h.meta(&next).map_err(|e| HelperError::system(&at, e))?;
        if rooted(m.uid, m.mode) != Ownership::Root {
            return Err(refuse(
                &at,
                format!(
                    "belongs to uid {} (mode {:o}), not to root (refused)",
                    m.uid,
                    m.mode & 0o7777
                ),
            ));
        }
        if i + 1 == parts.len() {
            let target = h
                .open_target(&dir, &name)
                .map_err(|e| refuse(&at, e.to_string()))?;
            if (target.dev, target.ino) != (m.dev, m.ino) {
                return Err(refuse(&at, "changed while it was opened (refused)".into()));
            }
            if !target.empty {
                return Err(HelperError::refused(
                    Refusal::MountPoint,
                    format!(
                        "mount point {} is not empty; nothing was mounted",
                        mp.display()
                    ),
                ));
            }
            return Ok(target);
        }
        dir = next;
    }
    unreachable!("REL has at least one component")
}

/// An entry `name` in the root-owned directory `dir` that an older version let the caller make
/// (a symlink, an empty directory of theirs): removed. `Err`: why it cannot be used.
fn clear_legacy<H: Host>(h: &H, dir: &H::Dir, name: &str) -> std::result::Result<(), String> {
    let st = match h.entry(dir, name) {
        Ok(Some(st)) => st,
        Ok(None) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    match st.kind {
        FileKind::Symlink => h
            .unlink(dir, name, false)
            .map_err(|e| format!("is a symlink that could not be removed: {e}")),
        FileKind::Dir if rooted(st.uid, st.mode) == Ownership::Root => Ok(()),
        FileKind::Dir => match h.unlink(dir, name, true) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) => Err(format!(
                "is a directory of uid {} (made before the helper kept these directories its own) and not empty: its owner empties it, then the helper removes it",
                st.uid
            )),
            Err(e) => Err(format!("could not be removed: {e}")),
        },
        _ => Err("is not a directory (refused)".into()),
    }
}

/// After an unmount: remove the mount point and its parents up to `<user_mount_root>/<user>`
/// (kept), each only while empty and root's — the directories [`make_mount_point`] made.
pub fn remove_mount_dirs<H: Host>(h: &H, cfg: &HelperConfig, user: &str, mp: &Path) {
    let home = cfg.user_mount_root.join(user);
    let Ok(rel) = mp.strip_prefix(&home) else {
        return;
    };
    let Ok(home_fd) = h.open_root(&home) else {
        return;
    };
    if h.meta(&home_fd).map(|m| rooted(m.uid, m.mode)).ok() != Some(Ownership::Root) {
        return;
    }
    let mut rel = rel.to_path_buf();
    while let (Some(parent), Some(name)) = (rel.parent().map(Path::to_path_buf), rel.file_name()) {
        let Ok(dir) = h.dir_beneath(&home_fd, &parent) else {
            return;
        };
        let name = name.to_string_lossy();
        let owned = h.entry(&dir, &name).ok().flatten().is_some_and(|st| {
            st.kind == FileKind::Dir && rooted(st.uid, st.mode) == Ownership::Root
        });
        if !owned || h.unlink(&dir, &name, true).is_err() {
            return;
        }
        rel = parent;
    }
}

/// `e2fsck -fn` of the opened image, through the helper's own descriptor.
fn fsck<H: Host>(
    h: &H,
    fd: &std::fs::File,
    image: &Path,
    limit: std::time::Duration,
) -> Result<()> {
    use std::os::fd::AsRawFd;
    let p = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
    let out = match h.run_tool("e2fsck", &["-fn".into(), p.into()], &[], limit)? {
        crate::bounded::ToolEnd::Done(out) => out,
        crate::bounded::ToolEnd::Killed(d) => {
            return Err(HelperError::refused(Refusal::Stalled, format!(
                "{}: e2fsck -fn did not finish within {:.0} s and was killed (an image this slow to check, or a file system that does not answer); nothing was mounted (helper.toml: tool_timeout_secs)",
                image.display(),
                d.as_secs_f64()
            )))
        }
    };
    match out.status.code() {
        Some(0) => Ok(()),
        Some(8)
            if String::from_utf8_lossy(&out.stderr).contains("Bad magic number")
                || String::from_utf8_lossy(&out.stdout).contains("Bad magic number") =>
        {
            Err(HelperError::invalid(format!(
                "{} is not an ext2/3/4 image (e2fsck: bad magic number); nothing was mounted",
                image.display()
            )))
        }
        c => {
            let text = String::from_utf8_lossy(&out.stdout);
            let first: Vec<&str> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .skip(1)
                .take(2)
                .collect();
            Err(HelperError::invalid(format!(
                "{} has file-system errors (e2fsck -fn: status {}; {}); the kernel is not handed a damaged image: repair it with `sw-pool image check --repair {}`",
                image.display(), c.map(|c| c.to_string()).unwrap_or_else(|| "signal".into()), first.join(" "), image.display()
            )))
        }
    }
}

pub fn mount_image<H: Host>(
    h: &H,
    cfg: &HelperConfig,
    c: &Caller,
    image: &Path,
    mp: &Path,
    rw: bool,
    job: Option<&str>,
) -> Result<ImageMounted> {
    if !cfg.user_images {
        return Err(HelperError::refused(Refusal::TurnedOff, "kernel mounts of users' images are turned off on this node (helper.toml: user_images = false); use `sw-pool mount` (FUSE)"));
    }
    if rw && !cfg.user_images_rw {
        return Err(HelperError::refused(Refusal::TurnedOff, "read-write kernel mounts of users' images are turned off on this node (helper.toml: user_images_rw = false)"));
    }
    check_path("image", image)?;
    check_path("mount point", mp)?;
    // the caller's file: opened as the caller, on a thread of its own, within file_timeout_secs
    let opened = c.open_bounded(h, "image", image, rw, cfg.file_timeout())?;
    let (file, meta) = (opened.file, opened.meta);
    if meta.kind != FileKind::File {
        return Err(HelperError::refused(
            Refusal::NotOwnImage,
            format!(
                "image {} is not a regular file (a FIFO, a device or a directory); nothing was mounted",
                image.display()
            ),
        ));
    }
    if meta.uid != c.uid {
        return Err(HelperError::refused(Refusal::NotOwnImage, format!(
            "image {} belongs to uid {}, not to you ({}, uid {}): the helper mounts only your own images; nothing was mounted",
            image.display(), meta.uid, c.name, c.uid
        )));
    }
    if opened.fs_type == crate::bounded::FUSE_SUPER_MAGIC {
        return Err(HelperError::refused(Refusal::OnFuse, format!(
            "image {} is on a FUSE file system: its bytes come from a process (which may stop), and the kernel would wait on it without end through the loop device; copy it to a local or network disk, or mount it with `sw-pool mount` (FUSE); nothing was mounted",
            image.display()
        )));
    }
    let ids = (meta.dev, meta.ino);
    // the records: only to check, never while the image is read or a tool runs
    {
        let (mut st, _) = h.records()?;
        admit_ids(st.records(), c, ids, image, rw, cfg.max_images_per_user)?;
    }
    fsck(h, &file, image, cfg.tool_timeout())?;
    let target = make_mount_point(h, cfg, c, mp)?;
    let undo_dirs = || remove_mount_dirs(h, cfg, &c.name, mp);
    let dev = h
        .attach_loop(
            std::os::fd::AsFd::as_fd(&file),
            0,
            rw,
            &image.to_string_lossy(),
        )
        .map_err(|e| {
            undo_dirs();
            HelperError::system(Path::new("/dev/loop-control"), e)
        })?;
    let devpath = format!("/dev/{}", h.loop_name(&dev));
    let opts: &[(&str, Option<&str>)] = if rw { &[] } else { &[("norecovery", None)] };
    let id = match h.mount_on(
        &target.handle,
        &KernelMount {
            fstype: "ext4",
            source: &devpath,
            options: opts,
            read_only: !rw,
            noexec: !cfg.user_images_exec,
        },
    ) {
        Ok(id) => id,
        Err(e) => {
            h.free_loop(dev);
            undo_dirs();
            return Err(HelperError::step(
                format!("mounting {} on {}", image.display(), mp.display()),
                format!("{e}; nothing was mounted"),
            ));
        }
    };
    let loop_device = h.loop_name(&dev);
    h.hand_over_loop(dev);
    // the records again: another call may have mounted this image, or the caller's last allowed
    // one, meanwhile
    let undo = |e: HelperError| {
        h.detach(&target.handle);
        undo_dirs();
        e
    };
    let (mut st, here) = h.records().map_err(undo)?;
    if let Err(e) = admit_ids(st.records(), c, ids, image, rw, cfg.max_images_per_user) {
        drop(st);
        return Err(undo(e));
    }
    st.records().mounts.push(Record::Image {
        image: image.to_path_buf(),
        dev: meta.dev,
        ino: meta.ino,
        owner: c.uid,
        user: c.name.clone(),
        rw,
        job: job.map(str::to_string),
        mount_point: mp.to_path_buf(),
        mount_id: id,
        loop_device: loop_device.clone(),
        mnt_ns: here,
    });
    if let Err(e) = st.save() {
        drop(st);
        return Err(undo(e));
    }
    Ok(ImageMounted {
        image: image.to_path_buf(),
        mount_point: mp.to_path_buf(),
        rw,
        loop_device,
    })
}

/// May `c` mount the image with these (dev, ino) (read-write when `rw`) now? Not when it is
/// mounted by the helper already (read-write, or at all for a read-write mount), nor when the
/// caller has `max` images mounted on this node.
fn admit_ids(
    records: &crate::state::Records,
    c: &Caller,
    (d, i): (u64, u64),
    image: &Path,
    rw: bool,
    max: usize,
) -> Result<()> {
    if records.mounts.iter().any(|r| matches!(r, Record::Image { dev, ino, rw: w, .. } if *dev == d && *ino == i && (*w || rw))) {
        return Err(HelperError::refused(Refusal::Limit, format!("image {} is already mounted on this node by the helper{}; unmount it first", image.display(), if rw { "" } else { " read-write" })));
    }
    let mine: Vec<&Path> = records
        .mounts
        .iter()
        .filter_map(|r| match r {
            Record::Image {
                owner, mount_point, ..
            } if *owner == c.uid => Some(mount_point.as_path()),
            _ => None,
        })
        .collect();
    if mine.len() >= max {
        return Err(HelperError::refused(Refusal::Limit, format!(
            "you ({}) have {} images mounted by the helper on this node, the most it allows (helper.toml: max_images_per_user = {max}); unmount one first (`sw-pool umount DIR` or `sudo sw-pool-mount-helper umount DIR`; yours: {}); nothing was mounted",
            c.name,
            mine.len(),
            mine.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )));
    }
    Ok(())
}

#[derive(Debug, Serialize)]
pub struct Unmounted {
    pub mount_point: PathBuf,
}

/// Unmount the caller's image mounted at `mp` (root: anyone's), by its mount ID, wherever it is.
pub fn umount<H: Host>(h: &H, cfg: &HelperConfig, c: &Caller, mp: &Path) -> Result<Unmounted> {
    check_path("mount point", mp)?;
    let (mut st, here) = h.records()?;
    let idx = st
        .records()
        .mounts
        .iter()
        .position(|r| {
            r.in_namespace(here)
                && match r {
                    Record::Image {
                        mount_point,
                        mount_id,
                        ..
                    } => mount_point == mp || h.mount_point_of(*mount_id).as_deref() == Some(mp),
                    _ => false,
                }
        })
        .ok_or_else(|| {
            HelperError::refused(
                Refusal::NotMounted,
                format!("nothing the helper mounted is at {}", mp.display()),
            )
        })?;
    let Record::Image {
        owner,
        mount_id,
        user,
        mount_point,
        ..
    } = &st.records().mounts[idx]
    else {
        unreachable!()
    };
    let (owner, mount_id, user, recorded) = (*owner, *mount_id, user.clone(), mount_point.clone());
    if owner != c.uid && !c.is_root() {
        return Err(HelperError::refused(
            Refusal::NotMounted,
            format!("the mount at {} is not yours", mp.display()),
        ));
    }
    match h.unmount_id(mount_id, false) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(HelperError::step(
                format!("{} is busy", mp.display()),
                format!(
                    "a process still uses it (see `fuser -vm {}`); nothing was unmounted",
                    mp.display()
                ),
            ));
        }
        Err(e) => return Err(HelperError::system(mp, e)),
    }
    st.records().mounts.remove(idx);
    st.save()?;
    remove_mount_dirs(h, cfg, &user, &recorded);
    Ok(Unmounted {
        mount_point: mp.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::RealHost;
    use crate::state::Records;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::fs::PermissionsExt;

    fn image_record(owner: u32, ino: u64, rw: bool, mp: &str) -> Record {
        Record::Image {
            image: format!("/home/u/{ino}.img").into(),
            dev: 1,
            ino,
            owner,
            user: "u".into(),
            rw,
            job: None,
            mount_point: mp.into(),
            mount_id: ino,
            loop_device: format!("loop{ino}"),
            mnt_ns: 1,
        }
    }

    #[test]
    fn a_user_at_the_limit_is_refused_with_the_limit_and_their_mounts() {
        let u = Caller::fake(1000, "u");
        let mut r = Records::default();
        r.mounts
            .push(image_record(1000, 10, false, "/run/sw-pool-user/u/a"));
        r.mounts
            .push(image_record(1000, 11, true, "/run/sw-pool-user/u/b"));
        r.mounts
            .push(image_record(2000, 12, false, "/run/sw-pool-user/v/a"));
        let img = Path::new("/home/u/new.img");
        assert!(admit_ids(&r, &u, (1, 99), img, false, 3).is_ok());
        let e = admit_ids(&r, &u, (1, 99), img, false, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_images_per_user = 2"), "{e}");
        assert!(e.contains("have 2 images"), "{e}");
        assert!(
            e.contains("/run/sw-pool-user/u/a") && e.contains("/run/sw-pool-user/u/b"),
            "{e}"
        );
        assert!(e.contains("unmount one first"), "{e}");
        // another user's mounts do not count against this one
        assert!(admit_ids(&r, &Caller::fake(3000, "w"), (1, 99), img, false, 1).is_ok());
        // the same image: read-only beside read-only is fine, anything beside read-write is not
        assert!(admit_ids(&r, &u, (1, 10), img, false, 8).is_ok());
        let e = admit_ids(&r, &u, (1, 10), img, true, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already mounted"), "{e}");
        let e = admit_ids(&r, &u, (1, 11), img, false, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already mounted"), "{e}");
    }

    #[test]
    fn site_pools_do_not_count_against_a_users_images() {
        let u = Caller::fake(1000, "u");
        let mut r = Records::default();
        for i in 0..4 {
            r.mounts.push(Record::Pool {
                name: format!("p{i}"),
                version: "1".into(),
                digest: "blake3:00".into(),
                signer: "site".into(),
                cache_file: "/c".into(),
                mount_point: format!("/run/sw-pool-site/p{i}/1").into(),
                mount_id: i,
                loop_device: "loop0".into(),
                mnt_ns: 1,
                refs: vec![crate::state::Ref {
                    uid: 1000,
                    user: "u".into(),
                    job: None,
                    shadow: false,
                }],
                shadows: vec![],
            });
        }
        assert!(admit_ids(&r, &u, (1, 99), Path::new("/i"), false, 1).is_ok());
    }

    fn cfg(root: &Path) -> HelperConfig {
        toml::from_str(&format!(
            "user_mount_root = {:?}",
            root.display().to_string()
        ))
        .unwrap()
    }

    fn owner_mode(p: &Path) -> (u32, u32) {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.mode() & 0o7777)
    }

    #[test]
    fn mount_points_are_roots_and_go_again_after() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root (directories of root's for another user)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("users");
        let cfg = cfg(&root);
        let u = Caller::fake(4242, "u");
        let mp = root.join("u/a/b/c");
        let pinned = make_mount_point(&RealHost::new(), &cfg, &u, &mp).unwrap();
        assert!(pinned.empty);
        for p in [
            root.join("u"),
            root.join("u/a"),
            root.join("u/a/b"),
            mp.clone(),
        ] {
            assert_eq!(owner_mode(&p), (0, 0o755), "{}", p.display());
        }
        drop(pinned);
        // again: the same directories serve
        assert!(make_mount_point(&RealHost::new(), &cfg, &u, &mp).is_ok());
        remove_mount_dirs(&RealHost::new(), &cfg, "u", &mp);
        assert!(!root.join("u/a").exists());
        assert!(root.join("u").is_dir(), "the user's directory stays");
        // outside the caller's directory, or not empty: refused, nothing made
        for bad in [root.join("v/x"), root.join("u"), d.path().join("elsewhere")] {
            let e = make_mount_point(&RealHost::new(), &cfg, &u, &bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("is not under"), "{e}");
        }
        std::fs::create_dir_all(root.join("u/full")).unwrap();
        std::fs::write(root.join("u/full/f"), b"x").unwrap();
        let e = make_mount_point(&RealHost::new(), &cfg, &u, &root.join("u/full"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not empty"), "{e}");
        assert!(!root.join("v").exists());
    }

    #[test]
    fn what_an_older_version_left_to_the_user_is_taken_back_or_refused() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("users");
        let cfg = cfg(&root);
        let u = Caller::fake(4242, "u");
        let home = root.join("u");
        std::fs::create_dir_all(home.join("empty")).unwrap();
        std::fs::create_dir_all(home.join("full")).unwrap();
        std::fs::write(home.join("full/f"), b"x").unwrap();
        std::os::unix::fs::symlink("/etc", home.join("to-etc")).unwrap();
        for p in [&home, &home.join("empty"), &home.join("full")] {
            std::os::unix::fs::chown(p, Some(4242), Some(4242)).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // the user's empty directory: removed, made again as root's
        let p = make_mount_point(&RealHost::new(), &cfg, &u, &home.join("empty")).unwrap();
        drop(p);
        assert_eq!(
            owner_mode(&home),
            (0, 0o755),
            "the user's directory is root's now"
        );
        assert_eq!(owner_mode(&home.join("empty")), (0, 0o755));
        // the user's symlink: removed, never followed
        let p = make_mount_point(&RealHost::new(), &cfg, &u, &home.join("to-etc/x")).unwrap();
        drop(p);
        assert!(home.join("to-etc").is_dir() && !Path::new("/etc/x").exists());
        assert_eq!(owner_mode(&home.join("to-etc")), (0, 0o755));
        // the user's directory with their files in it: refused, left as it is
        let e = make_mount_point(&RealHost::new(), &cfg, &u, &home.join("full/x"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not empty") && e.contains("uid 4242"), "{e}");
        assert_eq!(owner_mode(&home.join("full")).0, 4242);
        // another user's directory in the user's place: refused
        std::fs::create_dir_all(root.join("w")).unwrap();
        std::os::unix::fs::chown(root.join("w"), Some(777), Some(777)).unwrap();
        let e = make_mount_point(
            &RealHost::new(),
            &cfg,
            &Caller::fake(4343, "w"),
            &root.join("w/x"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("belongs to uid 777"), "{e}");
    }
}
