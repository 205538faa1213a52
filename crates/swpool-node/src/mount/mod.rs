//! Mounting pools and images with FUSE, supervised.
//!
//! * The format comes from the image's magic ([`crate::image::detect`]), never from its name:
//!   squashfs → `squashfuse_ll`, ext2/3/4 → `fuse2fs` ([`Backend`]); a squashfs pool goes to
//!   sw-pool's own tree server (`sw-pool-serve --tree`: `--cached` for a node-local copy, through
//!   the verifying chunk engine in place and on demand, in one hop) when the config key
//!   `fuse_reader` says `sw-pool` ([`FuseReader`], [`ImageInfo::with_reader`]); an image that
//!   server does not read (exit status 3) falls back to `squashfuse_ll` (in place: on the chunk
//!   server's file, two hops).
//! * Always `nosuid,nodev` ([`MountOptions`]); read-only, except a user image mounted `rw` under its
//!   lease ([`crate::userimage`]).
//! * The mount point is validated first ([`check_mountpoint`]): it exists, is a directory and not a
//!   symlink (`lstat`, opened with `O_NOFOLLOW`), belongs to the caller or root, is empty and is not
//!   already a mount point. The path used is the canonical one, as the kernel reports it.
//! * The helper runs in the foreground as our child; we wait until the mount really appears in
//!   `/proc/self/mountinfo`, with a timeout. On any failure we end the helper we started (by its
//!   pid, never by name), unmount what may have appeared, and report its stderr with a hint.
//! * Unmounting is `fusermount3 -u` (root without fusermount3: `umount`); a busy mount names the
//!   processes holding it and is lazily unmounted (`-z`) only when forced. A mount whose FUSE process
//!   died answers `ENOTCONN` ([`MountState::Stale`]); it is unmounted the same way.
//!
//! All system calls and process operations go through [`sys::Sys`] so the order of steps and the
//! clean-up after failures are unit-tested with [`sys::FakeSys`].

mod backend;
pub mod paths;
mod point;
pub mod serve;
mod unmount;
pub use crate::config::FuseReader;
pub use backend::Backend;
use backend::TREE_UNSUPPORTED;
pub use point::{canonical_mountpoint, check_mountpoint, create_leaf};
pub use swpool_sys::{pinned, proc, sys, walk};
use unmount::run_unmount;
pub use unmount::{unmount, unmount_identified, Identity, Unmounted};

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::exec::{ExecError, Tool, ToolCommand};
use crate::image::{self, ImageFormat};
use crate::pool::{ManifestError, Pool};
use swpool_format::status::ExitStatus;

pub use proc::{Holder, MountEntry};
pub use sys::{RealSys, Sys};

/// How long to wait for a mount to appear by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(10);
/// How long root's mount waits before it checks again that the mount is still where the path says
/// (see [`mount_pinned`]).
const SETTLE: Duration = Duration::from_millis(20);

/// Mount options as sw-pool accepts them: never setuid, never devices; read-only unless `rw` (a
/// user image, under its lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MountOptions {
    writable: bool,
}

impl MountOptions {
    /// The options every sw-pool mount gets.
    pub const FIXED: &'static str = "ro,nosuid,nodev";

    /// The options of a writable mount of a user image.
    pub const WRITABLE: &'static str = "rw,nosuid,nodev";

    /// A read-write mount (`rw`): a user image, under its lease.
    pub fn writable(self) -> bool {
        self.writable
    }

    /// `rw` (the lease of a user image decides whether it may be).
    pub fn read_write() -> MountOptions {
        MountOptions { writable: true }
    }

    /// Parse `-o OPTS`: `ro`, `nosuid`, `nodev` (the defaults) and `rw` (user images only) are
    /// accepted; everything else is refused with a reason.
    pub fn parse(opts: Option<&str>) -> Result<MountOptions, MountError> {
        let mut writable = false;
        for o in opts
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|o| !o.is_empty())
        {
            match o {
                "ro" => writable = false,
                "nosuid" | "nodev" => {}
                "rw" => writable = true,
                "suid" | "dev" => {
                    return Err(MountError::Options(format!(
                        "-o {o}: refused; sw-pool mounts are always nosuid,nodev"
                    )))
                }
                other => {
                    return Err(MountError::Options(format!(
                        "-o {other}: unknown option; sw-pool accepts only ro, rw (user images), nosuid and nodev (always applied)"
                    )))
                }
            }
        }
        Ok(MountOptions { writable })
    }
}

/// What is being mounted: format from the magic, and the manifest when the file is a pool.
#[derive(Debug, Clone, Serialize)]
pub struct ImageInfo {
    /// Absolute path, not a symlink.
    pub path: PathBuf,
    pub format: ImageFormat,
    pub backend: Backend,
    /// `name`, `version` and `digest` of a pool; `None` for a bare image.
    pub pool: Option<PoolId>,
    /// Mounted read-write (a user image under its lease).
    pub writable: bool,
    /// Served from where it lies through the verifying chunk server ([`serve`]).
    pub serve: Option<serve::Serve>,
}

impl ImageInfo {
    /// The helper's command line for this image at `mountpoint`.
    fn helper_command(&self, mountpoint: &Path) -> ToolCommand {
        if let (Backend::SwPoolTree, Some(p)) = (self.backend, &self.pool) {
            return Backend::tree_command(&self.path, &p.digest, self.serve.as_ref(), mountpoint);
        }
        if let Some(s) = &self.serve {
            return s.wrap(&self.path, self.backend.command(&s.image(), mountpoint));
        }
        if self.writable {
            self.backend.command_rw(&self.path, mountpoint)
        } else {
            self.backend.command(&self.path, mountpoint)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolId {
    pub name: String,
    pub version: String,
    pub digest: String,
}

impl ImageInfo {
    /// Look at the image: it must be a regular file (not a symlink) with squashfs or ext magic; a
    /// pool trailer, if present, must be intact.
    pub fn inspect(path: &Path) -> Result<ImageInfo, MountError> {
        let path = crate::exec::absolute(path);
        let meta = std::fs::symlink_metadata(&path).map_err(|source| MountError::Image {
            path: path.clone(),
            reason: source.to_string(),
            status: swpool_format::status::io_status(&source),
        })?;
        if meta.file_type().is_symlink() {
            return Err(MountError::Image {
                path: path.clone(),
                reason: format!(
                    "is a symbolic link; images are never mounted through symlinks, give the real path ({})",
                    std::fs::canonicalize(&path)
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|_| "dangling".into())
                ),
                status: ExitStatus::BadInput,
            });
        }
        if !meta.is_file() {
            // the same status as `inspect`, `verify` and `load` give (not a pool)
            return Err(MountError::Image {
                path,
                reason:
                    "is not a regular file (a FIFO, a device or a directory); give an image file"
                        .into(),
                status: ExitStatus::InvalidPool,
            });
        }
        // the directory part may contain symlinks ($SCRATCH often does): resolve it
        let path = match (path.parent(), path.file_name()) {
            (Some(d), Some(n)) => std::fs::canonicalize(d).map(|d| d.join(n)).unwrap_or(path),
            _ => path,
        };
        let format = image::detect(&path).map_err(|e| match e {
            image::DetectError::Unknown { .. } => MountError::Image {
                path: path.clone(),
                reason: "is not a squashfs or ext2/3/4 image (no file-system magic found; a damaged \
                         superblock or not an image at all): rebuild it with `sw-pool build` or copy it again"
                    .into(),
                status: ExitStatus::InvalidPool,
            },
            image::DetectError::Io { source, .. } => MountError::Image {
                path: path.clone(),
                reason: source.to_string(),
                status: swpool_format::status::io_status(&source),
            },
        })?;
        // a pool's file system must fit inside the image its manifest (and signature) covers
        let pool =
            match Pool::open(&path).and_then(|p| crate::pool::fs_size::check_fits(&p).map(|_| p)) {
                Ok(p) => Some(PoolId {
                    name: p.manifest.name,
                    version: p.manifest.version,
                    digest: p.manifest.digest,
                }),
                Err(ManifestError::NotAPool { .. } | ManifestError::NoTrailer { .. }) => None,
                Err(e) => {
                    return Err(MountError::Image {
                        path: path.clone(),
                        reason: e.to_string(),
                        status: e.exit_status(),
                    })
                }
            };
        Ok(ImageInfo {
            path,
            format,
            backend: Backend::for_format(format),
            pool,
            writable: false,
            serve: None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{0}")]
    Options(String),
    #[error("image {}: {reason}", crate::exec::show(path))]
    Image {
        path: PathBuf,
        reason: String,
        status: ExitStatus,
    },
    #[error("mount point {} on {}: {reason}", crate::exec::show(path), node())]
    MountPoint { path: PathBuf, reason: String },
    /// The caller may not mount there (a permission problem, not a damaged image).
    #[error("mount point {} on {}: {reason}", crate::exec::show(path), node())]
    MountPointDenied { path: PathBuf, reason: String },
    #[error("FUSE is not usable on {}: {reason}", node())]
    Fuse { reason: String },
    #[error("cannot mount {}: {source}", crate::exec::show(image))]
    Tool { image: PathBuf, source: ExecError },
    /// The helper exited without mounting, or did not mount in time.
    #[error("{0}")]
    Helper(Box<HelperFailure>),
    #[error(
        "{} is not mounted on {}; nothing to unmount (see `sw-pool list`)",
        crate::exec::show(path),
        node()
    )]
    NotMounted { path: PathBuf },
    #[error(
        "{} is a {fstype} mount, not a FUSE mount made by sw-pool; refusing to unmount it",
        crate::exec::show(path)
    )]
    NotOurs { path: PathBuf, fstype: String },
    #[error("{} is busy on {}: {}\n  hint: end these processes or leave the directory, or use `sw-pool umount --force` for a lazy unmount (it disappears when the last user lets go)",
        path.display(), node(), describe_holders(holders, *hidden))]
    Busy {
        path: PathBuf,
        holders: Vec<Holder>,
        hidden: usize,
    },
    #[error("could not unmount {}: {source}", crate::exec::show(path))]
    Unmount { path: PathBuf, source: ExecError },
    #[error("cannot read the mount table: {0}")]
    MountTable(std::io::Error),
    #[error(
        "mounting at {} was interrupted; nothing was mounted",
        crate::exec::show(path)
    )]
    Interrupted { path: PathBuf },
    /// Root's mount point was replaced between its check and the mount (a symlink swapped in by
    /// someone who can write a parent directory): nothing was mounted.
    #[error("mount point {} on {}: the mount point changed while it was being mounted ({reason}); nothing was mounted. Someone who can write one of its parent directories replaced or moved it: mount as root only on directories whose parents only root can change", crate::exec::show(path), node())]
    Raced { path: PathBuf, reason: String },
    /// Root's private staging directory is not usable.
    #[error("cannot prepare a mount on {}: {reason}", node())]
    Staging { reason: String },
}

/// What went wrong with a FUSE helper.
#[derive(Debug, Clone)]
pub struct HelperFailure {
    pub helper: Backend,
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// Its exit status; `None` when it timed out (and was stopped).
    pub status: Option<String>,
    pub timeout: Duration,
    pub stderr: String,
    pub hint: String,
    pub cmdline: String,
}

impl fmt::Display for HelperFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.status {
            Some(st) => write!(
                f,
                "{} could not mount {} at {} on {} ({st}): {}",
                self.helper,
                self.image.display(),
                self.mountpoint.display(),
                node(),
                indent(&self.stderr)
            )?,
            None => write!(
                f,
                "{} did not mount {} at {} on {} within {:.1}s; it was stopped. Its output: {}",
                self.helper,
                self.image.display(),
                self.mountpoint.display(),
                node(),
                self.timeout.as_secs_f32(),
                indent(&self.stderr)
            )?,
        }
        write!(f, "\n  hint: {}\n  command: {}", self.hint, self.cmdline)
    }
}

/// The node an error happened on (errors are printed where they happen).
fn node() -> String {
    format!("node {}", crate::users::hostname())
}

fn indent(s: &str) -> String {
    let t = s.trim();
    if t.is_empty() {
        "(no output)".into()
    } else {
        format!("\n    {}", t.lines().collect::<Vec<_>>().join("\n    "))
    }
}

/// `pid 123 (uid 1000) bash: cwd; pid 456 …`
pub fn describe_holders(h: &[Holder], hidden: usize) -> String {
    describe_holders_as(h, hidden, rustix::process::geteuid().is_root())
}

/// [`describe_holders`] for a caller that is root (`as_root`) or not: only a user is told that
/// root could see more.
fn describe_holders_as(h: &[Holder], hidden: usize, as_root: bool) -> String {
    let mut parts: Vec<String> = h
        .iter()
        .map(|h| {
            format!(
                "pid {}{} `{}` ({})",
                h.pid,
                h.uid.map(|u| format!(" uid {u}")).unwrap_or_default(),
                h.command,
                h.what.join(", ")
            )
        })
        .collect();
    if hidden > 0 {
        parts.push(if as_root {
            format!(
                "{hidden} process(es) could not be inspected (their /proc entries were unreadable)"
            )
        } else {
            format!(
                "{hidden} process(es) of other users could not be inspected (root can see them)"
            )
        });
    }
    if parts.is_empty() {
        "no process found holding it (a process may have just exited, or another mount namespace uses it)".into()
    } else {
        format!("held by {}", parts.join("; "))
    }
}

impl MountError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            MountError::Options(_) => ExitStatus::BadInput,
            MountError::Image { status, .. } => *status,
            MountError::MountPoint { .. } => ExitStatus::BadInput,
            MountError::MountPointDenied { .. } => ExitStatus::System,
            MountError::Fuse { .. } => ExitStatus::System,
            MountError::Tool { source, .. } => source.exit_status(),
            MountError::Helper(h) if h.hint.contains("damaged") => ExitStatus::InvalidPool,
            MountError::Helper(_) => ExitStatus::Tool,
            MountError::NotMounted { .. } | MountError::NotOurs { .. } => ExitStatus::BadInput,
            MountError::Busy { .. } => ExitStatus::System,
            MountError::Unmount { source, .. } => source.exit_status(),
            MountError::MountTable(_) => ExitStatus::System,
            MountError::Interrupted { .. } => ExitStatus::System,
            MountError::Raced { .. } | MountError::Staging { .. } => ExitStatus::System,
        }
    }
}

/// A hint for a helper's failure, from its stderr.
pub fn hint_for(stderr: &str, backend: Backend, euid: u32) -> String {
    let s = stderr.to_ascii_lowercase();
    if s.contains("/dev/fuse") && (s.contains("no such file") || s.contains("not found"))
        || s.contains("fuse: device not found")
    {
        "/dev/fuse is missing: load the kernel module (`modprobe fuse`), or in a container start it with `--device /dev/fuse`".into()
    } else if s.contains("/dev/fuse") && s.contains("permission denied") {
        format!("/dev/fuse is not usable by uid {euid}: an administrator must make it mode 0666 (`chmod 0666 /dev/fuse`, persistently with a udev rule)")
    } else if s.contains("fusermount")
        && (s.contains("not found") || s.contains("no such file") || s.contains("failed to exec"))
    {
        "fusermount3 is not installed: install the Debian package 'fuse3' (`apt-get install fuse3`)"
            .into()
    } else if s.contains("superblock")
        || s.contains("bad magic")
        || s.contains("version 0.0 detected")
        || s.contains("only version 4.0 supported")
        || s.contains("corrupt")
        || s.contains("can't open squashfs")
        || s.contains("not a squashfs")
        || s.contains("e2fsck")
    {
        "the image is damaged (corrupt superblock): rebuild it with `sw-pool build` or copy it again from its source".into()
    } else if s.contains("operation not permitted") || s.contains("mount failed") {
        "the kernel refused the mount: FUSE mounts may be disabled for users here (check /etc/fuse.conf, `mount_max`, and that fusermount3 is setuid root)".into()
    } else if s.contains("mountpoint is not empty") || s.contains("not empty") {
        "the mount point is not empty".into()
    } else {
        format!("see {backend}'s message above; check that the image is intact (`sw-pool inspect IMAGE`)")
    }
}

/// The state of a mount point now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountState {
    /// Mounted and answering.
    Mounted,
    /// Mounted, but its FUSE process died (`ENOTCONN`).
    Stale,
    /// Not a mount point.
    Absent,
}

/// Is `mountpoint` (canonical) mounted, and does it answer?
pub fn state(sys: &dyn Sys, mounts: &[MountEntry], mountpoint: &Path) -> MountState {
    if proc::mount_at(mounts, mountpoint).is_none() {
        return MountState::Absent;
    }
    match sys.probe(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => MountState::Stale,
        _ => MountState::Mounted,
    }
}

static CRITICAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Held from starting a helper until its mount is recorded (or cleaned up after a failure): see
/// [`finish_pending`].
pub fn critical_section() -> std::sync::MutexGuard<'static, ()> {
    CRITICAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// For the signal handler, after [`crate::exec::terminate_children`] stopped any helper still being
/// supervised (so the mount fails fast and is cleaned up by the code that started it): wait until
/// the mount in progress is either recorded or undone, and keep any other from starting. An
/// interrupted `sw-pool mount` thus leaves a recorded mount or nothing, never an unrecorded one.
/// Returns the guard: hold it until the process exits.
pub fn finish_pending() -> std::sync::MutexGuard<'static, ()> {
    critical_section()
}

/// A mount that appeared.
#[derive(Debug, Clone, Serialize)]
pub struct Mounted {
    pub mount_point: PathBuf,
    pub backend: Backend,
    pub helper_pid: u32,
    /// Its ID in the mount table (`None` from the unit tests' fake).
    pub mount_id: Option<u32>,
    pub elapsed: Duration,
}

/// Mount `image` at the canonical mount point `mp`, supervised. `log` receives the helper's stderr
/// (it stays there while mounted).
pub fn mount(
    sys: &dyn Sys,
    image: &ImageInfo,
    mp: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<Mounted, MountError> {
    match mount_with(sys, image, mp, log, timeout) {
        Err(MountError::Helper(h))
            if h.helper == Backend::SwPoolTree && h.status.as_deref() == Some(TREE_UNSUPPORTED) =>
        {
            tracing::warn!(
                image = %image.path.display(),
                "sw-pool's FUSE server does not read this image ({}); mounting it with squashfuse_ll",
                h.stderr.trim()
            );
            let fallback = ImageInfo {
                backend: Backend::SquashfuseLl,
                ..image.clone()
            };
            mount_with(sys, &fallback, mp, log, timeout)
        }
        // the default server is not installed beside sw-pool (nor on the search path): the helper
        Err(MountError::Tool {
            source: ExecError::NotFound { .. },
            ..
        }) if image.backend == Backend::SwPoolTree && image.serve.is_none() => {
            tracing::warn!(
                image = %image.path.display(),
                "sw-pool-serve is not installed beside sw-pool; mounting with squashfuse_ll (install sw-pool-serve, or set fuse_reader = \"squashfuse_ll\")"
            );
            let fallback = ImageInfo {
                backend: Backend::SquashfuseLl,
                ..image.clone()
            };
            mount_with(sys, &fallback, mp, log, timeout)
        }
        r => r,
    }
}

/// [`mount`] with `image`'s backend, no fallback.
fn mount_with(
    sys: &dyn Sys,
    image: &ImageInfo,
    mp: &Path,
    log: &Path,
    timeout: Duration,
) -> Result<Mounted, MountError> {
    let start = sys.now();
    if image.format == ImageFormat::Erofs {
        return Err(MountError::Image {
            path: image.path.clone(),
            reason: "is an EROFS image, which only the kernel mounts here (there is no FUSE server for EROFS on this system): load it where the site's mount helper is configured (`mount_helper`), or build the pool as squashfs for FUSE".into(),
            status: ExitStatus::BadInput,
        });
    }
    let checked = check_mountpoint(sys, mp)?;
    if let Err(e) = sys.open_fuse_device() {
        let uid = sys.euid();
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "/dev/fuse does not exist on this node; load the kernel module (`modprobe fuse`), or in a container start it with `--device /dev/fuse`".to_string(),
            std::io::ErrorKind::PermissionDenied => format!("/dev/fuse cannot be opened by uid {uid} (permission denied); an administrator must make it mode 0666 (`chmod 0666 /dev/fuse`, persistently with a udev rule or the fuse package's defaults)"),
            _ => format!("/dev/fuse cannot be opened: {e}"),
        };
        return Err(MountError::Fuse { reason });
    }
    if sys.euid() != 0 {
        // fusermount3 mounts for us, with its own checks of the mount point
        let cmd = image.helper_command(mp);
        return supervise(sys, image, mp, mp, log, timeout, start, cmd);
    }
    mount_pinned(sys, image, mp, &checked, log, timeout, start)
}

/// Root's mount: onto the directory that was checked, or nowhere ([`pinned`]).
fn mount_pinned(
    sys: &dyn Sys,
    image: &ImageInfo,
    mp: &Path,
    checked: &sys::FileMeta,
    log: &Path,
    timeout: Duration,
    start: Instant,
) -> Result<Mounted, MountError> {
    let raced = |reason: String| MountError::Raced {
        path: mp.to_path_buf(),
        reason,
    };
    let pin = sys.pin(mp).map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::EXDEV) => {
            raced("a symbolic link appeared on its path".into())
        }
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => raced("it disappeared".into()),
        _ => MountError::MountPoint {
            path: mp.to_path_buf(),
            reason: format!("cannot be opened: {e}"),
        },
    })?;
    if (pin.dev, pin.ino) != (checked.dev, checked.ino) {
        return Err(raced("another directory took its place".into()));
    }
    if !pin.empty {
        return Err(raced("it is no longer empty".into()));
    }
    let stage = sys.stage().map_err(|e| MountError::Staging {
        reason: format!("{}: {e}", pinned::STAGE_ROOT),
    })?;
    let cmd = image.helper_command(&stage);
    let m = match supervise(sys, image, &stage, mp, log, timeout, start, cmd) {
        Ok(m) => m,
        Err(e) => {
            sys.remove_stage(&stage);
            return Err(e);
        }
    };
    let attached = sys.attach(&stage, &pin);
    // the staged mount goes; without a mount left, the released helper ends by itself
    sys.remove_stage(&stage);
    let id = match attached {
        Ok(id) => id,
        Err(e) => return Err(raced(format!("moving the mount onto it failed: {e}"))),
    };
    // It landed on the checked directory; is that directory still where the path says? Looked up
    // by the ID of the mount that landed: the mount at the path may be another one (an older
    // mount of root's that a user moved there), which must not be recorded for this one.
    let ours = |t: &[proc::MountEntry]| {
        t.iter()
            .find(|e| e.mount_id == id)
            .filter(|e| e.is_fuse() && e.mount_point == mp)
            .map(|e| e.mount_id)
    };
    if sys.mounts().ok().and_then(|t| ours(&t)).is_none() {
        sys.detach(&pin);
        return Err(raced(
            "it was moved away before the mount was complete".into(),
        ));
    };
    // A rename that found the directory not yet a mount point can still complete after the move
    // (`RENAME_EXCHANGE` of two directories locks neither, and checks for a mount point before it
    // swaps them): measured on the testbed, ~1 in 15 runs of t_46 left root's mount on the
    // directory under the attacker's other name while `sw-pool` reported it at MOUNTPOINT. Such a
    // rename completes within microseconds; look again after a moment, the same mount by its ID.
    sys.sleep(SETTLE);
    if sys.mounts().ok().and_then(|t| ours(&t)) != Some(id) {
        sys.detach(&pin);
        return Err(raced(
            "it was moved away right after the mount was made".into(),
        ));
    }
    tracing::debug!(mountpoint = %mp.display(), "root mount attached to the checked directory");
    Ok(Mounted {
        mount_point: mp.to_path_buf(),
        mount_id: Some(id),
        ..m
    })
}

/// Start the helper and wait for its mount at `at` (see [`mount`]); errors name `mp`, the mount
/// point the caller asked for.
#[allow(clippy::too_many_arguments)]
fn supervise(
    sys: &dyn Sys,
    image: &ImageInfo,
    at: &Path,
    mp: &Path,
    log: &Path,
    timeout: Duration,
    start: Instant,
    cmd: ToolCommand,
) -> Result<Mounted, MountError> {
    let cmdline = cmd.cmdline();
    let pid = sys
        .spawn_helper(&cmd, log)
        .map_err(|source| MountError::Tool {
            image: image.path.clone(),
            source,
        })?;
    let deadline = start + timeout;
    loop {
        let mounts = match sys.mounts() {
            Ok(m) => m,
            Err(e) => {
                sys.kill_helper(pid);
                return Err(MountError::MountTable(e));
            }
        };
        if let Some(e) = proc::mount_at(&mounts, at) {
            if e.is_fuse() {
                if !sys.release_helper(pid) {
                    // an interrupt arrived and signalled the helper: undo, record nothing
                    let _ = unmount(sys, at, true);
                    sys.kill_helper(pid);
                    return Err(MountError::Interrupted {
                        path: mp.to_path_buf(),
                    });
                }
                tracing::debug!(mountpoint = %mp.display(), pid, "mounted");
                return Ok(Mounted {
                    mount_point: mp.to_path_buf(),
                    backend: image.backend,
                    helper_pid: pid,
                    mount_id: Some(e.mount_id),
                    elapsed: sys.now() - start,
                });
            }
        }
        match sys.helper_exited(pid) {
            Ok(Some(status)) => {
                let stderr = sys.read_log(log);
                sys.kill_helper(pid); // reaps it; a no-op signal-wise
                cleanup_partial(sys, at);
                return Err(MountError::Helper(Box::new(HelperFailure {
                    helper: image.backend,
                    image: image.path.clone(),
                    mountpoint: mp.to_path_buf(),
                    status: Some(status),
                    timeout,
                    hint: hint_for(&stderr, image.backend, sys.euid()),
                    stderr,
                    cmdline,
                })));
            }
            Ok(None) => {}
            Err(_) => {}
        }
        if sys.now() >= deadline {
            sys.kill_helper(pid);
            cleanup_partial(sys, at);
            return Err(MountError::Helper(Box::new(HelperFailure {
                helper: image.backend,
                image: image.path.clone(),
                mountpoint: mp.to_path_buf(),
                status: None,
                timeout,
                stderr: sys.read_log(log),
                hint: "the image may be on slow or hung storage: copy it to node-local disk first, or raise --timeout".into(),
                cmdline,
            })));
        }
        sys.sleep(POLL);
    }
}

/// After a failed mount: if something did get mounted at `mp` (a helper killed right after mounting),
/// unmount it.
fn cleanup_partial(sys: &dyn Sys, mp: &Path) {
    if let Ok(m) = sys.mounts() {
        if proc::mount_at(&m, mp).is_some_and(|e| e.is_fuse()) {
            let _ = run_unmount(sys, mp, true);
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod busy_text_tests {
    /// Issue 32, point 8: root is never told to run as root.
    #[test]
    fn busy_text_tells_only_users_about_root() {
        let as_root = super::describe_holders_as(&[], 2, true);
        assert!(!as_root.contains("root"), "{as_root}");
        let as_user = super::describe_holders_as(&[], 2, false);
        assert!(as_user.contains("root can see them"), "{as_user}");
    }
}
