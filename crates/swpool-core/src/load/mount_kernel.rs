//! `sw-pool mount --rw --kernel IMG DIR`: a user image mounted read-write **by the kernel**, through
//! the site's mount helper (`mount-image --rw`), under the same lease as the FUSE path: taken by
//! sw-pool (the user's own file beside the image) before the helper is asked, given back when the
//! record goes (`umount`, `cleanup --job`, the Slurm epilog), after the helper unmounted it.
//!
//! A kernel mount has no process whose life is the lease's: the holder names no pid, so on this
//! node it counts as alive until the node reboots or its job ends (`lease::RealLiveness`), and
//! the record (this user's, on this node) is what gives it back.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::exec::{Tool, ToolCommand};
use crate::mount::{Backend, Sys};
use crate::state::{self, Acquired, Record, Ref, Serving, StateDir};
use crate::userimage::{self, lease, lease::Liveness, lease::Mode};

use super::{LoadError, MountRw};

#[derive(Debug, Deserialize)]
struct HelperImage {
    mount_point: PathBuf,
    loop_device: String,
}

fn helper_failed(what: &str, e: crate::exec::ExecError) -> crate::Error {
    let reason = e
        .stderr()
        .map(|s| {
            s.trim()
                .trim_start_matches("sw-pool-mount-helper: ")
                .to_string()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| e.to_string());
    LoadError::Helper {
        node: crate::users::hostname(),
        what: what.to_string(),
        reason,
    }
    .into()
}

/// Mount `req.image` read-write by the kernel at `req.mountpoint` (which the helper accepts only
/// under `<user_mount_root>/<user>/`), under the image's lease.
pub fn mount_rw_kernel(
    sys: &dyn Sys,
    dir: &StateDir,
    req: &MountRw,
    helper: &Path,
    live: &dyn Liveness,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<(Acquired, lease::Taken, String), crate::Error> {
    let image = crate::exec::absolute(&req.image);
    userimage::check_image(&image)?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&image)
        .map_err(|source| userimage::UserImageError::Io {
            what: "open for writing",
            path: image.clone(),
            source,
        })?;
    let mp = crate::mount::canonical_mountpoint(&req.mountpoint)?;
    let _lock = dir.lock()?;
    if let Some(r) = dir.read(&mp)? {
        if r.image == image && matches!(r.serving, Some(Serving::Kernel { .. })) {
            return Err(crate::Error::other(
                crate::ExitStatus::BadInput,
                format!(
                    "{} is already mounted at {} by the kernel; `sw-pool umount {}` first",
                    image.display(),
                    mp.display(),
                    mp.display()
                ),
            ));
        }
    }
    let mut me = lease::Holder::here(Mode::Rw, &mp, req.job_id.clone());
    me.pid = 0; // no process: the mount itself (see the module documentation)
    let taken = lease::take(&image, &me, live).map_err(userimage::UserImageError::from)?;
    let give_back = |e: crate::Error| {
        let _ = lease::release(&image, &me);
        e
    };
    let report = userimage::fsck(&image, true, path_var).map_err(|e| give_back(e.into()))?;
    let format =
        swpool_format::format::detect(&image).unwrap_or(swpool_format::format::ImageFormat::Ext4);
    let t = std::time::Instant::now();
    let img = image.to_string_lossy().into_owned();
    let mps = mp.to_string_lossy().into_owned();
    let mut cmd = ToolCommand::new(Tool::Sudo)
        .arg("-n")
        .path(helper)
        .arg("mount-image")
        .arg("--rw");
    if let Some(j) = &req.job_id {
        cmd = cmd.arg("--job-id").arg(j);
    }
    let out = sys
        .run(&cmd.arg(&img).arg(&mps))
        .map_err(|e| give_back(helper_failed(&format!("mount {img} read-write"), e)))?;
    let m: HelperImage = serde_json::from_str(out.stdout.trim()).map_err(|e| {
        give_back(
            LoadError::Helper {
                node: crate::users::hostname(),
                what: format!("mount {img} read-write"),
                reason: format!("unreadable answer ({e}): {}", out.stdout.trim()),
            }
            .into(),
        )
    })?;
    let uid = sys.euid();
    let rec = Record {
        schema: state::SCHEMA,
        mount_point: m.mount_point.clone(),
        image: image.clone(),
        format,
        backend: Backend::for_format(format),
        pool: None,
        helper_pid: 0,
        uid,
        user: crate::users::name_of(uid),
        node: dir.node().to_string(),
        created: state::now(),
        refs: vec![Ref {
            job_id: req.job_id.clone(),
            since: state::now(),
            pid: std::process::id(),
        }],
        pending: false,
        source: None,
        mount_id: None,
        serving: Some(Serving::Kernel {
            fstype: "ext4".into(),
            loop_device: PathBuf::from("/dev").join(&m.loop_device),
            helper: Some(helper.to_path_buf()),
        }),
        lease: Some(me.clone()),
    };
    if let Err(e) = dir.write(&rec) {
        let _ = state::helper_umount(sys, helper, &m.mount_point);
        return Err(give_back(e.into()));
    }
    Ok((
        Acquired {
            record: rec,
            reused: false,
            mount_seconds: t.elapsed().as_secs_f64(),
            notes: Vec::new(),
        },
        taken,
        report,
    ))
}
