//! A user's own image (an ext4 file made by `sw-pool image create`), mounted by the kernel under
//! `<user_mount_root>/<user>/`.
//!
//! The image is opened with the caller's credentials, `O_NOFOLLOW|O_NONBLOCK`, and everything is
//! checked on the opened descriptor (`fstat`: a regular file, owned by the caller), which then
//! backs the loop device: no path is looked up again. Before the kernel sees it, `e2fsck -fn` reads
//! it through that same descriptor; an image with errors is refused. The mount point is opened
//! beneath the caller's directory with `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV` (a
//! symlink, `..` or another mount anywhere on the way is refused by the kernel), must be an empty
//! directory of the caller's, and gets the mount by descriptor (`fsmount` + `move_mount`).
//! `nosuid,nodev` always, `noexec` unless the admin allows programs in users' images.
//!
//! What this cannot prevent (SECURITY.md): the owner can rewrite the image file after the check,
//! so a crafted image can reach the kernel's ext4; sites that do not accept that set
//! `user_images = false`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use swpool_sys::kmount::{self, KernelMount};
use swpool_sys::loopdev::LoopDevice;
use swpool_sys::pinned::Pinned;

use crate::caller::{check_path, Caller};
use crate::config::HelperConfig;
use crate::error::{HelperError, Result};
use crate::state::{Record, State};

#[derive(Debug, Serialize)]
pub struct ImageMounted {
    pub image: PathBuf,
    pub mount_point: PathBuf,
    pub rw: bool,
    pub loop_device: String,
}

/// The caller's directory `<user_mount_root>/<user>` (created for them, theirs, 0755) and the
/// mount point `mp` opened beneath it.
fn pin_user_mount_point(cfg: &HelperConfig, c: &Caller, mp: &Path) -> Result<Pinned> {
    check_path("mount point", mp)?;
    let home = cfg.user_mount_root.join(&c.name);
    let rel = mp
        .strip_prefix(&home)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .ok_or_else(|| {
            HelperError::refused(format!(
                "mount point {} is not under {}/ (the only place the helper mounts your images)",
                mp.display(),
                home.display()
            ))
        })?;
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&cfg.user_mount_root)
        .map_err(|e| HelperError::system(&cfg.user_mount_root, e))?;
    let root = Pinned::open_root(&cfg.user_mount_root)
        .map_err(|e| HelperError::system(&cfg.user_mount_root, e))?;
    let (ru, rm) =
        kmount::owner_mode(&root).map_err(|e| HelperError::system(&cfg.user_mount_root, e))?;
    if ru != 0 || rm & 0o022 != 0 {
        return Err(HelperError::refused(format!(
            "{} must be a directory of root's that only root can write",
            cfg.user_mount_root.display()
        )));
    }
    let mine = kmount::mkdir_open(&root, &c.name, 0o755, Some((c.uid, c.gid)))
        .map_err(|e| HelperError::system(&home, e))?;
    let (hu, _) = kmount::owner_mode(&mine).map_err(|e| HelperError::system(&home, e))?;
    if hu != c.uid {
        return Err(HelperError::refused(format!(
            "{} is not yours (uid {hu})",
            home.display()
        )));
    }
    let pinned = Pinned::open_beneath(&mine, rel).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::ELOOP) => "a symlink on the way (refused)".to_string(),
            Some(libc::EXDEV) => {
                "it leaves your directory or crosses a mount (refused)".to_string()
            }
            Some(libc::ENOENT) => "no such directory; create it first".to_string(),
            Some(libc::ENOTDIR) => "not a directory (a symlink? refused)".to_string(),
            _ => e.to_string(),
        };
        HelperError::refused(format!(
            "mount point {}: {why}; nothing was mounted",
            mp.display()
        ))
    })?;
    if pinned.uid != c.uid && !c.is_root() {
        return Err(HelperError::refused(format!(
            "mount point {} is not your directory",
            mp.display()
        )));
    }
    if !pinned.empty {
        return Err(HelperError::refused(format!(
            "mount point {} is not empty",
            mp.display()
        )));
    }
    Ok(pinned)
}

/// `e2fsck -fn` of the opened image, through the helper's own descriptor.
fn fsck(fd: &std::fs::File, image: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let p = format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd());
    let out = crate::tools::command("e2fsck")?
        .args(["-fn", &p])
        .output()
        .map_err(|e| {
            HelperError::new(
                swpool_format::status::ExitStatus::Tool,
                format!("e2fsck: {e}"),
            )
        })?;
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

pub fn mount_image(
    cfg: &HelperConfig,
    c: &Caller,
    image: &Path,
    mp: &Path,
    rw: bool,
    job: Option<&str>,
) -> Result<ImageMounted> {
    if !cfg.user_images {
        return Err(HelperError::refused("kernel mounts of users' images are turned off on this node (helper.toml: user_images = false); use `sw-pool mount` (FUSE)"));
    }
    if rw && !cfg.user_images_rw {
        return Err(HelperError::refused("read-write kernel mounts of users' images are turned off on this node (helper.toml: user_images_rw = false)"));
    }
    check_path("image", image)?;
    let pinned = pin_user_mount_point(cfg, c, mp)?;
    let file = c.open_as(image, rw).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::ELOOP) => "it is a symlink (refused: give the file itself)".to_string(),
            Some(libc::EACCES) => "you cannot open it (permission denied)".to_string(),
            _ => e.to_string(),
        };
        HelperError::refused(format!(
            "image {}: {why}; nothing was mounted",
            image.display()
        ))
    })?;
    let meta = file.metadata().map_err(|e| HelperError::system(image, e))?;
    if !meta.file_type().is_file() {
        return Err(HelperError::refused(format!(
            "image {} is not a regular file (a FIFO, a device or a directory); nothing was mounted",
            image.display()
        )));
    }
    if meta.uid() != c.uid {
        return Err(HelperError::refused(format!(
            "image {} belongs to uid {}, not to you ({}, uid {}): the helper mounts only your own images; nothing was mounted",
            image.display(), meta.uid(), c.name, c.uid
        )));
    }
    let (mut st, here) = State::open_live()?;
    if st.records.mounts.iter().any(|r| matches!(r, Record::Image { dev, ino, rw: w, .. } if *dev == meta.dev() && *ino == meta.ino() && (*w || rw))) {
        return Err(HelperError::refused(format!("image {} is already mounted on this node by the helper{}; unmount it first", image.display(), if rw { "" } else { " read-write" })));
    }
    fsck(&file, image)?;
    let dev = LoopDevice::attach(
        std::os::fd::AsFd::as_fd(&file),
        0,
        rw,
        &image.to_string_lossy(),
    )
    .map_err(|e| HelperError::system(Path::new("/dev/loop-control"), e))?;
    let devpath = dev.path.to_string_lossy().into_owned();
    let opts: &[(&str, Option<&str>)] = if rw { &[] } else { &[("norecovery", None)] };
    let id = match kmount::mount_on(
        &pinned,
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
            dev.detach();
            return Err(HelperError::new(
                swpool_format::status::ExitStatus::System,
                format!(
                    "mounting {} on {}: {e}; nothing was mounted",
                    image.display(),
                    mp.display()
                ),
            ));
        }
    };
    let loop_device = dev
        .path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    drop(dev);
    st.records.mounts.push(Record::Image {
        image: image.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
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
        let _ = kmount::unmount_id(id, true);
        return Err(e);
    }
    Ok(ImageMounted {
        image: image.to_path_buf(),
        mount_point: mp.to_path_buf(),
        rw,
        loop_device,
    })
}

#[derive(Debug, Serialize)]
pub struct Unmounted {
    pub mount_point: PathBuf,
}

/// Unmount the caller's image mounted at `mp` (root: anyone's), by its mount ID, wherever it is.
pub fn umount(c: &Caller, mp: &Path) -> Result<Unmounted> {
    check_path("mount point", mp)?;
    let (mut st, here) = State::open_live()?;
    let idx = st
        .records
        .mounts
        .iter()
        .position(|r| {
            r.in_namespace(here)
                && match r {
                    Record::Image {
                        mount_point,
                        mount_id,
                        ..
                    } => {
                        mount_point == mp
                            || kmount::mount_point_of(*mount_id).as_deref() == Some(mp)
                    }
                    _ => false,
                }
        })
        .ok_or_else(|| {
            HelperError::refused(format!("nothing the helper mounted is at {}", mp.display()))
        })?;
    let Record::Image {
        owner, mount_id, ..
    } = &st.records.mounts[idx]
    else {
        unreachable!()
    };
    if *owner != c.uid && !c.is_root() {
        return Err(HelperError::refused(format!(
            "the mount at {} is not yours",
            mp.display()
        )));
    }
    match kmount::unmount_id(*mount_id, false) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(HelperError::new(swpool_format::status::ExitStatus::System, format!(
                "{} is busy: a process still uses it (see `fuser -vm {}`); nothing was unmounted", mp.display(), mp.display())));
        }
        Err(e) => return Err(HelperError::system(mp, e)),
    }
    st.records.mounts.remove(idx);
    st.save()?;
    Ok(Unmounted {
        mount_point: mp.to_path_buf(),
    })
}
