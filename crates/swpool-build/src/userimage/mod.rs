//! Writable user images (seed 002, the Oslo disk-image tools): a sparse ext4 file a user keeps on
//! the parallel file system for a data set of many small files, made (`create`, filled from a
//! directory), grown or shrunk offline (`resize`) and checked (`check`) with e2fsprogs, and mounted
//! read-write on one node at a time or read-only on any number, under a [`lease`] beside the image.

pub use swpool_node::lease::{self, end_lease};

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::exec::{ExecError, Tool, ToolCommand};
use crate::image::ImageFormat;
use swpool_format::status::ExitStatus;

use lease::{Holder, LeaseError, Liveness, Mode};

/// The smallest image `create` makes (mke2fs' own floor for a useful ext4 with a journal).
pub const MIN_SIZE: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum UserImageError {
    #[error("{} exists; use --force to replace it", path.display())]
    Exists { path: PathBuf },
    #[error("{}: {reason}", path.display())]
    BadInput { path: PathBuf, reason: String },
    #[error("{} is not an ext4 user image ({reason}); `sw-pool image create` makes one", path.display())]
    NotImage { path: PathBuf, reason: String },
    #[error("{} has file-system errors e2fsck did not repair:\n{report}\n  hint: run `sw-pool image check --repair {}` (nothing may use it meanwhile)", path.display(), path.display())]
    Damaged { path: PathBuf, report: String },
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Tree(#[from] crate::image::TreeError),
}

impl UserImageError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            UserImageError::Exists { .. } | UserImageError::BadInput { .. } => ExitStatus::BadInput,
            UserImageError::NotImage { .. } | UserImageError::Damaged { .. } => {
                ExitStatus::InvalidPool
            }
            UserImageError::Io { source, .. } => swpool_format::status::io_status(source),
            UserImageError::Lease(LeaseError::Io { source, .. }) => {
                swpool_format::status::io_status(source)
            }
            UserImageError::Lease(LeaseError::Corrupt { .. }) => ExitStatus::InvalidPool,
            UserImageError::Lease(_) => ExitStatus::BadInput,
            UserImageError::Exec(e) => e.exit_status(),
            UserImageError::Tree(_) => ExitStatus::BadInput,
        }
    }
}

/// What `sw-pool image create` makes.
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    pub image: PathBuf,
    /// The image's size; without it, SRC's need times `oversize`.
    pub size: Option<u64>,
    /// How much larger than SRC's contents the image is made (default 2: room to grow).
    pub oversize: Option<f64>,
    /// The number of inodes (`mke2fs -N`).
    pub inodes: Option<u64>,
    /// Tuned for many small files (`mke2fs -T small`: 1 KiB blocks, an inode per 4 KiB), as Oslo.
    pub small_files: bool,
    /// Fill it from this directory (`mke2fs -d`).
    pub src: Option<PathBuf>,
    pub force: bool,
    /// `PATH` for e2fsprogs.
    pub path_var: Option<std::ffi::OsString>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Created {
    pub image: PathBuf,
    pub size: u64,
    pub files: u64,
    pub data_bytes: u64,
}

/// `sw-pool image create`: a sparse ext4 image, written to a temporary name beside IMG, checked
/// with `e2fsck -fn`, and renamed only then. Its root directory belongs to the caller.
pub fn create(o: &CreateOptions) -> Result<Created, UserImageError> {
    let image = crate::exec::absolute(&o.image);
    if !o.force && std::fs::symlink_metadata(&image).is_ok() {
        return Err(UserImageError::Exists { path: image });
    }
    let stats = match &o.src {
        Some(src) => {
            if !src.is_dir() {
                return Err(UserImageError::BadInput {
                    path: src.clone(),
                    reason: "is not a directory (SRC fills the image)".into(),
                });
            }
            Some(crate::image::scan_tree(src, true)?)
        }
        None => None,
    };
    let need = stats
        .as_ref()
        .map(|s| crate::image::ext_min_size(ImageFormat::Ext4, s))
        .unwrap_or(0);
    let size = match (o.size, o.oversize) {
        (Some(_), Some(_)) => {
            return Err(UserImageError::BadInput {
                path: image,
                reason: "give --size or --oversize, not both".into(),
            })
        }
        (Some(s), None) => {
            if s < need.max(MIN_SIZE) {
                return Err(UserImageError::BadInput {
                    path: image,
                    reason: format!(
                        "--size {} is too small: {} needs at least {} (or leave --size out: the size then comes from SRC)",
                        crate::size::Bytes(s),
                        o.src.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "an ext4 image".into()),
                        crate::size::Bytes(need.max(MIN_SIZE))
                    ),
                });
            }
            s
        }
        (None, f) => {
            let f = f.unwrap_or(2.0);
            if stats.is_none() {
                return Err(UserImageError::BadInput {
                    path: image,
                    reason: "give --size SIZE (or a SRC directory to size it from)".into(),
                });
            }
            if !(1.0..=1000.0).contains(&f) {
                return Err(UserImageError::BadInput {
                    path: image,
                    reason: format!("--oversize {f}: must be between 1 and 1000"),
                });
            }
            // the small-file layout spends more on metadata: its need is measured in 1 KiB blocks
            let need = if o.small_files { need + need / 2 } else { need };
            (((need as f64) * f) as u64 + (4 << 20))
                .div_ceil(1 << 20)
                .max(MIN_SIZE >> 20)
                << 20
        }
    };
    let (tmp, file) =
        crate::atomic::TempOutput::create(&image).map_err(|source| UserImageError::Io {
            what: "create a temporary file beside",
            path: image.clone(),
            source,
        })?;
    file.set_len(size).map_err(|source| UserImageError::Io {
        what: "size",
        path: tmp.path().to_path_buf(),
        source,
    })?;
    drop(file);
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let mut cmd = ToolCommand::new(Tool::Mke2fs)
        .args(["-q", "-F", "-t", "ext4", "-L", "sw-pool-data"])
        .arg("-E")
        .arg(format!("root_owner={uid}:{gid}"));
    if o.small_files {
        cmd = cmd.args(["-T", "small"]);
    }
    if let Some(n) = o.inodes {
        cmd = cmd.arg("-N").arg(n.to_string());
    }
    if let Some(src) = &o.src {
        cmd = cmd.arg("-d").path(src);
    }
    cmd.path(tmp.path()).run(o.path_var.as_deref())?;
    fsck(tmp.path(), false, o.path_var.as_deref())?;
    let out = std::fs::OpenOptions::new()
        .write(true)
        .open(tmp.path())
        .map_err(|source| UserImageError::Io {
            what: "reopen",
            path: tmp.path().to_path_buf(),
            source,
        })?;
    tmp.commit(out).map_err(|source| UserImageError::Io {
        what: "rename the finished image to",
        path: image.clone(),
        source,
    })?;
    Ok(Created {
        image,
        size,
        files: stats.as_ref().map(|s| s.files).unwrap_or(0),
        data_bytes: stats.as_ref().map(|s| s.bytes).unwrap_or(0),
    })
}

/// `e2fsck -f -n` (check only) or `-f -p` (repair what is safe to repair, replay the journal).
/// Clean (or repaired): `Ok(report)`; errors left: [`UserImageError::Damaged`].
pub fn fsck(
    image: &Path,
    repair: bool,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<String, UserImageError> {
    let cmd = ToolCommand::new(Tool::E2fsck)
        .args(["-f", if repair { "-p" } else { "-n" }])
        .path(image);
    let cmdline = cmd.cmdline();
    tracing::debug!(command = %cmdline, "running");
    // e2fsck reports on stdout and says what it found in its exit status (a bit mask)
    let out = cmd
        .command(path_var)?
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| ExecError::Spawn {
            cmdline: cmdline.clone(),
            source,
        })?;
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match out.status.code() {
        // 0: clean; 1: errors corrected (-p), clean now
        Some(0) => Ok(report),
        Some(1) if repair => Ok(report),
        Some(c) if c & 8 != 0 || c & 16 != 0 || c < 0 => Err(ExecError::Failed {
            tool: Tool::E2fsck,
            cmdline,
            status: out.status.to_string(),
            stderr: report,
        }
        .into()),
        _ => Err(UserImageError::Damaged {
            path: image.to_path_buf(),
            report: report.trim().to_string(),
        }),
    }
}

/// A user image: a regular file (not a symlink) with ext4 magic.
pub fn check_image(image: &Path) -> Result<(), UserImageError> {
    let m = std::fs::symlink_metadata(image).map_err(|source| UserImageError::Io {
        what: "read",
        path: image.to_path_buf(),
        source,
    })?;
    if !m.file_type().is_file() {
        return Err(UserImageError::NotImage {
            path: image.to_path_buf(),
            reason: "not a regular file".into(),
        });
    }
    // a pool (an image with a manifest trailer) is read-only: its manifest vouches for its bytes
    if crate::pool::Pool::open(image).is_ok() {
        return Err(UserImageError::NotImage {
            path: image.to_path_buf(),
            reason: "a pool, which is mounted read-only (its manifest vouches for every byte)"
                .into(),
        });
    }
    match crate::image::detect(image) {
        Ok(f) if f.is_ext() => Ok(()),
        Ok(f) => Err(UserImageError::NotImage {
            path: image.to_path_buf(),
            reason: format!("a {} image, which is read-only", f.as_str()),
        }),
        Err(e) => Err(UserImageError::NotImage {
            path: image.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// Run `f` with the image held in `mode` by this process (an offline operation: resize, check),
/// refused while a node has it mounted in a conflicting way; the lease is given back whatever `f`
/// returns (its error first).
fn offline<T>(
    image: &Path,
    mode: Mode,
    live: &dyn Liveness,
    f: impl FnOnce() -> Result<T, UserImageError>,
) -> Result<T, UserImageError> {
    check_image(image)?;
    let me = Holder::here(mode, image, None);
    lease::take(image, &me, live)?;
    let r = f();
    let released = lease::release(image, &me);
    let r = r?;
    released?;
    Ok(r)
}

/// `sw-pool image resize IMG SIZE`: offline, under an exclusive lease (refused while any node
/// has it mounted): `e2fsck -f -p`, then `resize2fs` to SIZE (the file grows, or is cut after the
/// file system shrank).
pub fn resize(
    image: &Path,
    size: u64,
    live: &dyn Liveness,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<u64, UserImageError> {
    let io = |what: &'static str| {
        move |source| UserImageError::Io {
            what,
            path: image.to_path_buf(),
            source,
        }
    };
    offline(image, Mode::Rw, live, || {
        fsck(image, true, path_var)?;
        let kib = size / 1024;
        ToolCommand::new(Tool::Resize2fs)
            .path(image)
            .arg(format!("{kib}K"))
            .run(path_var)?;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(image)
            .map_err(io("open"))?;
        if f.metadata().map(|m| m.len()).unwrap_or(0) > kib * 1024 {
            f.set_len(kib * 1024).map_err(io("cut"))?;
        }
        f.sync_all().map_err(io("sync"))?;
        fsck(image, false, path_var)?;
        Ok(kib * 1024)
    })
}

/// `sw-pool image check IMG [--repair]`: under a lease (read-only for a check, exclusive for a
/// repair), so that no node writes it meanwhile.
pub fn check(
    image: &Path,
    repair: bool,
    live: &dyn Liveness,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<String, UserImageError> {
    let mode = if repair { Mode::Rw } else { Mode::Ro };
    offline(image, mode, live, || fsck(image, repair, path_var))
}
