//! **swpool-env**: isolated environments (seed 003, SDEE, without its root daemon, SUID or chroot).
//!
//! `sw-pool run` / `sw-pool shell` start a command in new user, mount and PID namespaces:
//! `/proc` is remounted (only the environment's processes are visible), the whole process tree ends
//! with its first process (pid 1, [`init`]), and every mount made for it belongs to its mount
//! namespace, so nothing outlives it — not even after `kill -9`. The network, devices, `$HOME`, the
//! job's environment and the node's loaded pools stay as they are (MPI and interconnects keep
//! working).
//!
//! With a **layer** ([`layer`]: a user's directory holding an overlay upper and work directory) the
//! host's `/` is the read-only lower and the layer the writable upper: writes anywhere (`/usr/local`,
//! `/opt`, `/etc`) land in the layer, never on the host or in a pool. The host's other mounts
//! (`/home`, `/dev`, `/tmp`, the pools' FUSE mounts, ...) are bound in as they are.
//!
//! How the overlay is made is decided by [`plan`] from what this node offers (measured facts:
//! `docs/architecture.md`, "Environments"): without privileges the kernel's overlay cannot write over
//! root-owned lowers (copy-up needs uid 0, which a user's namespace cannot map), so the rootless
//! path is `fuse-overlayfs` with every lower file shown as the namespace's root (= the user); with
//! the site's helper (read-only idmapped views of the trees the site lists, [`idmap`]) it is the
//! kernel's overlay, at full speed.
//!
//! The process structure: the caller ([`launch`]) clones pid 1 into the new namespaces and writes
//! its uid/gid maps (`0 → caller`); pid 1 re-executes the `sw-pool` binary as `__enter` ([`init`]),
//! a fresh single-threaded process that makes the mounts, moves the new root into place, starts the
//! command (the caller's own uid inside, through a nested user namespace, unless `--root`),
//! forwards signals to it, reaps every orphan, and exits with the command's status.

pub mod base;
pub mod idmap;
pub mod init;
pub(crate) mod kernel;
pub mod launch;
pub mod layer;
pub(crate) mod overlay;
pub mod plan;
pub mod pools;
pub mod probe;
pub mod reader;
pub mod rendezvous;
pub mod rootless_root;
pub mod sync;

use std::path::PathBuf;

pub use base::Base;
pub use launch::{run, RunOutcome, RunRequest, Synced};
pub use layer::{LayerStore, LayerSummary};
pub use plan::{Method, Plan};
pub use pools::EnvPool;

/// Exit status when the environment could not be set up (nothing ran), as `env(1)` and
/// `chroot(1)` use it.
pub const EXIT_SETUP: i32 = 125;
/// Exit status when the command was found but could not be executed.
pub const EXIT_CANNOT_EXEC: i32 = 126;
/// Exit status when the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// What went wrong; each names what failed, where, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("layer name {name:?} is not valid: use letters, digits, '.', '_' and '-' (not starting with '.'), at most 64 characters")]
    BadLayerName { name: String },
    #[error("layer {name:?} does not exist in {}: create it with `sw-pool layer create {name}`", root.display())]
    NoSuchLayer { name: String, root: PathBuf },
    #[error("layer {name:?} already exists in {}", root.display())]
    LayerExists { name: String, root: PathBuf },
    #[error("{}: {why}; a layer must be a real directory owned by you (uid {uid}) and writable by no one else", path.display())]
    NotYours {
        path: PathBuf,
        why: String,
        uid: u32,
    },
    #[error("layer {name:?} is in use by a running environment (pid {pid}); end it first")]
    LayerInUse { name: String, pid: i32 },
    #[error("{what}: {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("starting the environment failed: {what}: {source}")]
    Start {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl EnvError {
    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EnvError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

/// Write the id maps of the user namespace of `/proc/<who>` (`self` or a pid): setgroups denied
/// (`setgroups_may_fail`: a parent namespace denied it already), then one uid and one gid line. An
/// error names the file.
pub(crate) fn write_id_maps(
    who: &str,
    uid_line: &str,
    gid_line: &str,
    setgroups_may_fail: bool,
) -> std::io::Result<()> {
    let w = |f: &str, v: &str| {
        std::fs::write(format!("/proc/{who}/{f}"), v)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{f}: {e}")))
    };
    match w("setgroups", "deny") {
        Err(_) if setgroups_may_fail => {}
        r => r?,
    }
    w("uid_map", uid_line)?;
    w("gid_map", gid_line)
}

/// A finished process's status as a shell reports it: its exit code, or 128 + the signal that
/// ended it.
pub fn exit_code(es: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (es.code(), es.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => EXIT_CANNOT_EXEC,
    }
}
