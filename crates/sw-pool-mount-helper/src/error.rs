//! The helper's errors: one variant per kind of failure, each with the exit status sw-pool gives
//! it (3 refused input, 4 a bad pool or image, 5 a tool failed, 6 the system refused, 7 trust) and
//! a message for the caller (and syslog) that names what failed, where, and what to do. A refusal
//! also carries *which* rule of the helper's contract (SECURITY.md, "The mount helper") refused
//! it, so tests check the rule, not the wording.

use std::path::{Path, PathBuf};

use swpool_format::status::ExitStatus;

/// The rules of the helper's contract a request can break (status 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not run as root, or a caller sudo does not name (`SUDO_UID`, passwd).
    Caller,
    /// `/etc/sw-pool/helper.toml` missing, not root's, or not valid.
    Config,
    /// A path with `.`/`..`, a control character, relative, or too long.
    Path,
    /// A mount point outside `<user_mount_root>/<caller>/`.
    OutsideRoot,
    /// A mount point (or a directory on the way) that is a symlink, a mount, not root's, or not
    /// empty; a tree root (`user_mount_root`, `cache_dir`, the records) not root's alone.
    MountPoint,
    /// The caller's file could not be opened as the caller (a symlink, no permission, missing).
    FileOpen,
    /// An image that is not a regular file, or not the caller's.
    NotOwnImage,
    /// An image on FUSE.
    OnFuse,
    /// A step on a user's file (open, read, `e2fsck`) past its time.
    Stalled,
    /// Already mounted, or the caller's `max_images_per_user` reached.
    Limit,
    /// A feature the site turned off (`user_images`, `user_images_rw`, `shadow_root`,
    /// `environment_trees`) or one for root only (`cleanup`).
    TurnedOff,
    /// `--job-id` not a Slurm job id, or not the caller's running job.
    Job,
    /// Nothing of the helper's (of the caller's) at that place, or of that name.
    NotMounted,
    /// Another build of the same pool mounted; a cache that went meanwhile.
    Conflict,
    /// `idmap --pid P`: P is not the caller's environment.
    Process,
}

#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// A request the helper's contract does not allow (status 3); nothing was done.
    #[error("{msg}")]
    Refused { rule: Refusal, msg: String },
    /// A bad pool or image (status 4): the message names the file and how to repair it.
    #[error("{msg}")]
    Invalid { msg: String },
    /// A tool (`e2fsck`, `squeue`) is missing or failed (status 5).
    #[error("{tool}: {msg}")]
    Tool { tool: String, msg: String },
    /// The system refused a call on `at` (status 6, or 3 for a missing file).
    #[error("{}: {source}", at.display())]
    System {
        at: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A step the system refused or could not finish (status 6): `what` names the step and the
    /// place, `msg` why and what to do.
    #[error("{what}: {msg}")]
    Step { what: String, msg: String },
    /// A pool not signed by a site key (status 7).
    #[error("{msg}")]
    Trust { msg: String },
}

impl HelperError {
    /// A request the helper's contract does not allow, by the rule it breaks.
    pub fn refused(rule: Refusal, msg: impl Into<String>) -> Self {
        HelperError::Refused {
            rule,
            msg: msg.into(),
        }
    }
    pub fn system(path: &Path, e: std::io::Error) -> Self {
        HelperError::System {
            at: path.to_path_buf(),
            source: e,
        }
    }
    pub fn trust(msg: impl Into<String>) -> Self {
        HelperError::Trust { msg: msg.into() }
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        HelperError::Invalid { msg: msg.into() }
    }
    pub fn tool(tool: &str, msg: impl Into<String>) -> Self {
        HelperError::Tool {
            tool: tool.into(),
            msg: msg.into(),
        }
    }
    /// A step the system refused (status 6).
    pub fn step(what: impl Into<String>, msg: impl Into<String>) -> Self {
        HelperError::Step {
            what: what.into(),
            msg: msg.into(),
        }
    }
    /// The exit status (sw-pool's table).
    pub fn status(&self) -> ExitStatus {
        match self {
            HelperError::Refused { .. } => ExitStatus::BadInput,
            HelperError::Invalid { .. } => ExitStatus::InvalidPool,
            HelperError::Tool { .. } => ExitStatus::Tool,
            HelperError::System { source, .. } => swpool_format::status::io_status(source),
            HelperError::Step { .. } => ExitStatus::System,
            HelperError::Trust { .. } => ExitStatus::Trust,
        }
    }
    /// The rule a refusal broke (`None`: not a refusal).
    #[cfg(test)]
    pub fn rule(&self) -> Option<Refusal> {
        match self {
            HelperError::Refused { rule, .. } => Some(*rule),
            _ => None,
        }
    }
}

pub type Result<T> = std::result::Result<T, HelperError>;
