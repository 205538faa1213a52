//! Preflight on every receiving leader: SRC readable, DEST's directory usable, enough free space,
//! a temporary output; and the removal of temporaries left by a copy that was killed.

use std::path::Path;

use super::source::{read_stamp, Kind, SrcInfo};
use super::{bad, dir};
use crate::atomic::TempOutput;
use crate::collective::Local;
use std::fs::File;
use swpool_format::status::ExitStatus;

#[cfg(any(test, feature = "testkit"))]
thread_local! {
    /// Unit tests: the free space this thread's "node" reports (a full disk on one fake node).
    pub static TEST_FREE_BYTES: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// What a receiving leader prepared in preflight.
pub(super) enum Prepared {
    /// `src`: SRC, open on a leader that reads it.
    File {
        tmp: Box<TempOutput>,
        out: File,
        src: Option<File>,
    },
    Dir(dir::TempDir),
}

pub(super) fn preflight(
    info: &SrcInfo,
    src: &Path,
    opened: Option<File>,
    target: &Path,
    reader: bool,
    read_only: bool,
) -> Local<Prepared> {
    // a reader opens SRC here, once (leader 0 kept the file it inspected: `opened`); the transfer
    // reads from this very file
    let mut src_file = None;
    if reader {
        let r = if info.kind == Kind::Directory {
            std::fs::read_dir(src).map(|_| ())
        } else if let Some(f) = opened {
            src_file = Some(f);
            Ok(())
        } else {
            File::open(src).map(|f| src_file = Some(f))
        };
        r.map_err(|e| {
            bad(
                swpool_format::status::io_status(&e),
                format!(
                    "cannot read SRC {}: {e}; the leaders that read it are on several nodes: make it readable on every node",
                    src.display()
                ),
            )
        })?;
    }
    let parent = crate::atomic::parent_dir(target);
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(bad(
                ExitStatus::BadInput,
                format!("DEST's parent {} is not a directory", parent.display()),
            ))
        }
        Err(e) => {
            return Err(bad(
                ExitStatus::BadInput,
                format!(
                    "DEST's directory {} is not usable: {e}; create it on every node first (or choose another DEST)",
                    parent.display()
                ),
            ))
        }
    }
    if let Ok(m) = std::fs::symlink_metadata(target) {
        let ours = read_stamp(target).is_some();
        if info.kind == Kind::Directory && m.is_dir() {
            let empty = std::fs::read_dir(target)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            if !ours && !empty {
                return Err(bad(
                    ExitStatus::BadInput,
                    format!(
                        "DEST {} exists, is not empty and was not made by sw-pool cp: remove it or choose another DEST",
                        target.display()
                    ),
                ));
            }
        } else if info.kind != Kind::Directory && m.is_dir() {
            return Err(bad(
                ExitStatus::BadInput,
                format!("DEST {} is a directory", target.display()),
            ));
        } else if info.kind == Kind::Directory && !m.is_dir() {
            return Err(bad(
                ExitStatus::BadInput,
                format!("DEST {} exists and is not a directory", target.display()),
            ));
        }
    }
    remove_stale_temporaries(parent, target);
    let free = free_bytes(parent).map_err(|e| {
        bad(
            ExitStatus::System,
            format!("cannot query free space of {}: {e}", parent.display()),
        )
    })?;
    let need = space_needed(info.data_bytes);
    if free < need {
        return Err(bad(
            ExitStatus::System,
            format!(
                "not enough space in {}: need {}, {} free; free space on this node or {}",
                parent.display(),
                crate::size::Bytes(need),
                crate::size::Bytes(free),
                super::ANOTHER_DEST
            ),
        ));
    }
    let tmp_err = |e: std::io::Error| {
        bad(
            swpool_format::status::io_status(&e),
            format!(
                "cannot create a temporary file in {}: {e}; make DEST's directory writable",
                parent.display()
            ),
        )
    };
    match info.kind {
        Kind::Directory => Ok(Prepared::Dir(
            dir::TempDir::create(target).map_err(tmp_err)?,
        )),
        _ => {
            let (tmp, out) = TempOutput::create(target).map_err(tmp_err)?;
            // SRC's permission bits (without set-id bits), like cp; a verified pool copy (the
            // node-local cache) without write bits: what is mounted from it was checked on arrival
            use std::os::unix::fs::PermissionsExt;
            let mode = info.mode & if read_only { 0o555 } else { 0o777 };
            let _ = out.set_permissions(std::fs::Permissions::from_mode(mode));
            out.set_len(info.len).map_err(|e| {
                bad(
                    ExitStatus::System,
                    format!("cannot size {}: {e}", tmp.path().display()),
                )
            })?;
            Ok(Prepared::File {
                tmp: Box::new(tmp),
                out,
                src: src_file,
            })
        }
    }
}

/// Remove `.<name>.swpool-tmp-<pid>` left by a copy whose process died without cleaning up
/// (SIGKILL): only when no process with that pid exists on this node.
pub(super) fn remove_stale_temporaries(parent: &Path, target: &Path) {
    let Some(name) = target.file_name() else {
        return;
    };
    let prefix = format!(".{}.swpool-tmp-", name.to_string_lossy());
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = n.strip_prefix(&prefix).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let p = e.path();
            tracing::info!(path = %p.display(), "removing a stale temporary of a dead copy");
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
        }
    }
}

/// Bytes a user may still write in `dir`'s file system (a unit test may fake a full disk).
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    #[allow(unused_mut)]
    let mut free = st.f_bavail.saturating_mul(st.f_frsize);
    #[cfg(any(test, feature = "testkit"))]
    if let Some(f) = TEST_FREE_BYTES.with(|c| c.get()) {
        free = f; // a full disk on one node of a fake cluster (unit tests only)
    }
    Ok(free)
}

/// What a copy of `data` bytes needs on the node: the data and a little slack for metadata blocks.
pub fn space_needed(data: u64) -> u64 {
    data + data / 64 + (1 << 20)
}
