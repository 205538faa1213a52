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

use crate::mount::{Backend, Sys};
use crate::state::{self, Acquired, Record, Ref, Serving, StateDir};
use crate::userimage::{lease, lease::Liveness, lease::Mode};

use super::MountRw;

#[derive(Debug, Deserialize)]
struct HelperImage {
    mount_point: PathBuf,
    loop_device: String,
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
    let (image, mp) = super::mount_rw::writable_image(req, true)?;
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
    let (taken, report) = super::mount_rw::lease_and_fsck(&image, &me, live, path_var)?;
    let give_back = |e: crate::Error| {
        let _ = lease::release(&image, &me);
        e
    };
    let format =
        swpool_format::format::detect(&image).unwrap_or(swpool_format::format::ImageFormat::Ext4);
    let t = std::time::Instant::now();
    let img = image.to_string_lossy().into_owned();
    let mps = mp.to_string_lossy().into_owned();
    let mut args = vec!["mount-image", "--rw"];
    if let Some(j) = &req.job_id {
        args.extend(["--job-id", j]);
    }
    args.extend([img.as_str(), mps.as_str()]);
    let m: HelperImage = super::site::ask(
        sys,
        helper,
        &crate::users::hostname(),
        &format!("mount {img} read-write"),
        &args,
    )
    .map_err(give_back)?;
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
            shell: None,
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
