//! `list` and `cleanup`: the helper's mounts on this node, and what is left when jobs end (the
//! Slurm epilog runs `cleanup --job-id J` as root) or something died.

use std::path::PathBuf;

use serde::Serialize;

use crate::caller::Caller;
use crate::config::HelperConfig;
use crate::error::{HelperError, Refusal, Result};
use crate::state::{Record, State};

#[derive(Debug, Default, Serialize)]
pub struct Cleaned {
    /// References of the job that were dropped.
    pub released: usize,
    /// Mount points unmounted (last reference gone, or the job's image).
    pub unmounted: Vec<PathBuf>,
    /// Records whose mount had already gone.
    pub forgotten: usize,
    /// Loop devices that backed no mount, freed.
    pub loops_freed: Vec<String>,
    /// `--kill`: processes of an image's owner that held it (pid and command), ended.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub killed: Vec<String>,
    /// What could not be done (each names the mount and why).
    pub errors: Vec<String>,
}

/// `list`: the helper's records on this node, and its loop devices that back no mount.
#[derive(Debug, Serialize)]
pub struct Listed {
    pub mounts: Vec<Record>,
    /// Loop devices of the helper's (backing a file in its cache, or an image it recorded) that
    /// back no mount here: `cleanup` frees them.
    pub orphan_loops: Vec<String>,
}

pub fn list(cfg: &HelperConfig) -> Result<Listed> {
    let st = State::open()?;
    let mounts = swpool_sys::proc::read_mountinfo()
        .map_err(|e| HelperError::system(std::path::Path::new("/proc/self/mountinfo"), e))?;
    let images: Vec<PathBuf> = st
        .records
        .mounts
        .iter()
        .filter_map(|r| match r {
            Record::Image { image, .. } => Some(image.clone()),
            _ => None,
        })
        .collect();
    let mut orphan_loops: Vec<String> = swpool_sys::loopdev::orphans(&mounts, &cfg.cache_dir)
        .into_iter()
        .map(|a| a.name)
        .collect();
    for a in swpool_sys::loopdev::attached() {
        if images.contains(&a.backing_file)
            && !mounts.iter().any(|m| m.dev == a.devno)
            && !orphan_loops.contains(&a.name)
        {
            orphan_loops.push(a.name);
        }
    }
    Ok(Listed {
        mounts: st.records.mounts,
        orphan_loops,
    })
}

/// Root only: drop `job`'s references and unmount its images; unmount pools nobody references;
/// forget records whose mounts are gone; free loop devices that back no mount and whose backing
/// file is the helper's (its cache, or an image it recorded).
pub fn cleanup<H: crate::host::Host>(
    h: &H,
    cfg: &HelperConfig,
    c: &Caller,
    job: Option<&str>,
    kill: bool,
) -> Result<Cleaned> {
    if !c.is_root() {
        return Err(HelperError::refused(Refusal::TurnedOff, "cleanup is for root (the Slurm epilog, an admin); release your own mounts with release-pool / umount"));
    }
    let mut st = State::open()?;
    let mut out = Cleaned::default();
    let mounts = swpool_sys::proc::read_mountinfo()
        .map_err(|e| HelperError::system(std::path::Path::new("/proc/self/mountinfo"), e))?;
    let here = crate::state::mount_namespace();
    let mut keep = Vec::new();
    let mut recorded_images = Vec::new();
    for mut r in std::mem::take(&mut st.records.mounts) {
        if !r.in_namespace(here) {
            keep.push(r);
            continue;
        }
        if !r.alive(&mounts, here) {
            out.forgotten += 1;
            // its shadows hold the pool's file system (and loop device) on their own
            if let Record::Pool { shadows, .. } = &mut r {
                let mut errs = Vec::new();
                out.unmounted
                    .extend(crate::shadow::remove(shadows, &mut errs));
                out.errors.extend(errs);
            }
            if let Record::Image {
                image,
                user,
                mount_point,
                ..
            } = &r
            {
                recorded_images.push(image.clone());
                crate::image::remove_mount_dirs(h, cfg, user, mount_point);
            }
            continue;
        }
        let drop_it = match &mut r {
            Record::Pool { refs, shadows, .. } => {
                if let Some(j) = job {
                    let before = refs.len();
                    refs.retain(|x| x.job.as_deref() != Some(j));
                    out.released += before - refs.len();
                }
                if !refs.iter().any(|x| x.shadow) {
                    let mut errs = Vec::new();
                    out.unmounted
                        .extend(crate::shadow::remove(shadows, &mut errs));
                    out.errors.extend(errs);
                }
                refs.is_empty() && shadows.is_empty()
            }
            Record::Image { job: ij, .. } => job.is_some() && ij.as_deref() == job,
        };
        if drop_it {
            // a pool is read-only and shared: detached lazily, it goes when its last user lets go;
            // a user's image may be written: never detached while a process holds it (a detached
            // writer would go on writing after the lease is given back), ended with --kill
            let res = match &r {
                Record::Pool { .. } => h.unmount_id(r.mount_id(), true),
                Record::Image { owner, .. } => unmount_image(
                    h,
                    r.mount_id(),
                    r.mount_point(),
                    *owner,
                    kill,
                    &mut out.killed,
                ),
            };
            match res {
                Ok(()) => {
                    if let Record::Image { user, .. } = &r {
                        crate::image::remove_mount_dirs(h, cfg, user, r.mount_point());
                    }
                    out.unmounted.push(r.mount_point().to_path_buf())
                }
                Err(e) => {
                    out.errors
                        .push(format!("{}: {e}", r.mount_point().display()));
                    keep.push(r);
                }
            }
        } else {
            keep.push(r);
        }
    }
    st.records.mounts = keep;
    st.save()?;
    let mounts = swpool_sys::proc::read_mountinfo().unwrap_or_default();
    let mut orphans = swpool_sys::loopdev::orphans(&mounts, &cfg.cache_dir);
    for a in swpool_sys::loopdev::attached() {
        if recorded_images.contains(&a.backing_file)
            && !mounts.iter().any(|m| m.dev == a.devno)
            && !orphans.contains(&a)
        {
            orphans.push(a);
        }
    }
    for a in orphans {
        match swpool_sys::loopdev::clear(&a.name) {
            Ok(()) => out.loops_freed.push(a.name),
            Err(e) => out.errors.push(format!("/dev/{}: {e}", a.name)),
        }
    }
    Ok(out)
}

/// Unmount a user's image (not lazily). Busy: with `kill`, end the processes of its `owner` **in
/// this mount namespace** that hold it (the testbed's nodes, like containers, share one PID space:
/// a process elsewhere with the same path is not ours), SIGTERM then SIGKILL, and try again.
pub(crate) fn unmount_image<H: crate::host::Host>(
    h: &H,
    id: u64,
    mp: &std::path::Path,
    owner: u32,
    kill: bool,
    killed: &mut Vec<String>,
) -> std::io::Result<()> {
    use swpool_sys::sys::{Clock, Processes};
    match h.unmount_id(id, false) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) && kill => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            return Err(std::io::Error::new(
                e.kind(),
                format!("{e}: a process still uses it; left mounted (cleanup --kill ends the owner's processes that hold it)"),
            ))
        }
        r => return r,
    }
    // only the owner's processes, in the helper's own mount namespace (another namespace's view
    // of the path may be something else), never PID 1 or below
    for hd in h.holders(mp) {
        if hd.uid != Some(owner) || !hd.same_ns || hd.pid <= 1 {
            continue;
        }
        if h.sys()
            .terminate(hd.pid, std::time::Duration::from_secs(2))
            .is_ok()
        {
            killed.push(format!("{} ({})", hd.pid, hd.command));
        }
    }
    let mut last = None;
    for _ in 0..50 {
        match h.unmount_id(id, false) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                last = Some(e);
                h.sys().sleep(std::time::Duration::from_millis(100));
            }
            r => return r,
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("busy")))
}
