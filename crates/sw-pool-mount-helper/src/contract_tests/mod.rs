//! The refusals of the helper's contract (SECURITY.md, "The mount helper": one test or more per
//! row of its table, named after the row) and the order of the calls on the granted paths, driven
//! through the recording fake of the `Host` seam: no root, no loop device, no mount. Each refusal
//! checks the rule that refused it, the exit status, and that nothing was mounted or left (no
//! mount, no loop device, no directory, no record).

pub(super) use std::ffi::OsString;
pub(super) use std::path::{Path, PathBuf};
pub(super) use std::time::Duration;

pub(super) use swpool_format::status::ExitStatus;
pub(super) use swpool_sys::sys::FileKind;

pub(super) use crate::caller::Caller;
pub(super) use crate::config::HelperConfig;
pub(super) use crate::error::{HelperError, Refusal};
pub(super) use crate::host::fake::{Call, FakeHost, UserFile};
pub(super) use crate::host::Holder;
pub(super) use crate::image::{mount_image, umount};
pub(super) use crate::state::Record;

pub(super) const UID: u32 = 1000;
pub(super) const HOME: &str = "/run/u/ann";

pub(super) fn cfg(extra: &str) -> HelperConfig {
    toml::from_str(&format!(
        "user_mount_root = \"/run/u\"\nfile_timeout_secs = 2\ntool_timeout_secs = 30\n{extra}"
    ))
    .unwrap()
}

pub(super) fn ann() -> Caller {
    Caller::fake(UID, "ann")
}

/// A fake node with ann's image `/home/ann/a.img` (ino 10) on ext4.
pub(super) fn node() -> FakeHost {
    let h = FakeHost::new();
    h.f.files
        .borrow_mut()
        .insert("/home/ann/a.img".into(), UserFile::own(UID, 10));
    h
}

pub(super) fn refused(
    r: Result<impl std::fmt::Debug, HelperError>,
    rule: Refusal,
    text: &str,
) -> String {
    let e = r.expect_err("refused");
    assert_eq!(e.rule(), Some(rule), "{e}");
    assert_eq!(e.status(), ExitStatus::BadInput, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(text), "{msg:?} lacks {text:?}");
    msg
}

/// Nothing mounted, no loop device, no directory under the caller's, no record.
pub(super) fn nothing_left(h: &FakeHost) {
    let calls = h.calls();
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Mount { .. })) || h.mounted().is_empty(),
        "{calls:?}"
    );
    assert!(h.mounted().is_empty(), "left mounted: {:?}", h.mounted());
    assert_eq!(h.loops_left(), 0, "a loop device left: {calls:?}");
    let left: Vec<_> = h
        .beneath(HOME)
        .into_iter()
        .filter(|p| !p.starts_with(format!("{HOME}/old")))
        .collect();
    assert!(left.is_empty(), "directories left: {left:?}");
    assert!(h.f.records.borrow().mounts.is_empty());
}

pub(super) fn mount(
    h: &FakeHost,
    cfg: &HelperConfig,
    img: &str,
    mp: &str,
    rw: bool,
) -> crate::error::Result<crate::image::ImageMounted> {
    mount_image(h, cfg, &ann(), Path::new(img), Path::new(mp), rw, None)
}

mod files;
mod paths;
mod pools;
mod requests;
