//! The top-level error type and the exit-status table.
//!
//! Library modules return their own error enums (`ExecError`, `BuildError`, …); they convert into
//! [`Error`] with `?`. The binary prints the error once, with its chain of causes, and exits with
//! [`Error::exit_status`].

use std::fmt;

/// Documented exit statuses of `sw-pool` (also in the README and the man page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitStatus {
    /// Everything worked.
    Success = 0,
    /// An unexpected internal error (a bug: please report it).
    Internal = 1,
    /// The command line could not be parsed (clap's own status).
    Usage = 2,
    /// Bad input from the user: a missing or wrong path, a bad size, an existing output without `--force`.
    BadInput = 3,
    /// The file is not a valid pool or image: wrong magic, corrupt manifest, failed consistency check.
    InvalidPool = 4,
    /// An external tool (mke2fs, mksquashfs, squashfuse_ll, …) is missing or failed.
    Tool = 5,
    /// The system refused: permission denied, no space left, I/O error.
    System = 6,
    /// A signature is missing, invalid or made by an untrusted key.
    Trust = 7,
    /// A collective operation failed on another node; the message names it.
    Collective = 8,
}

impl ExitStatus {
    pub fn code(self) -> i32 {
        self as i32
    }
    /// The status of a code (as carried between ranks); unknown codes are internal errors.
    pub fn from_code(code: u8) -> ExitStatus {
        match code {
            0 => ExitStatus::Success,
            2 => ExitStatus::Usage,
            3 => ExitStatus::BadInput,
            4 => ExitStatus::InvalidPool,
            5 => ExitStatus::Tool,
            6 => ExitStatus::System,
            7 => ExitStatus::Trust,
            8 => ExitStatus::Collective,
            _ => ExitStatus::Internal,
        }
    }
}

/// Any error sw-pool can report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Exec(#[from] crate::exec::ExecError),
    #[error(transparent)]
    Build(#[from] crate::image::BuildError),
    #[error(transparent)]
    Detect(#[from] crate::image::DetectError),
    #[error(transparent)]
    Manifest(#[from] crate::pool::ManifestError),
    #[error(transparent)]
    Layout(#[from] crate::pool::LayoutError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Size(#[from] crate::size::SizeError),
    #[error(transparent)]
    Trust(#[from] crate::trust::TrustError),
    #[error(transparent)]
    Key(#[from] crate::trust::KeyError),
    #[error(transparent)]
    Transfer(#[from] crate::transfer::TransferError),
    #[error(transparent)]
    Cache(#[from] crate::cache::CacheError),
    #[error(transparent)]
    Mount(#[from] crate::mount::MountError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// A collective step failed on one or more nodes (the same error on every rank).
    #[error(transparent)]
    Agreed(#[from] crate::collective::Agreed),
    #[error(transparent)]
    PoolSpec(#[from] crate::pool::spec::SpecError),
    #[error(transparent)]
    Bundle(#[from] crate::bundle::BundleError),
    /// A free-form error with an exit status, for the binary's edge code.
    #[error("{message}")]
    Other { message: String, status: ExitStatus },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn other(status: ExitStatus, message: impl fmt::Display) -> Self {
        Error::Other {
            message: message.to_string(),
            status,
        }
    }

    /// The exit status this error maps to (see [`ExitStatus`]).
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            Error::Exec(e) => e.exit_status(),
            Error::Build(e) => e.exit_status(),
            Error::Detect(e) => e.exit_status(),
            Error::Manifest(e) => e.exit_status(),
            Error::Layout(_) => ExitStatus::BadInput,
            Error::Config(_) => ExitStatus::BadInput,
            Error::Size(_) => ExitStatus::BadInput,
            Error::Trust(e) => e.exit_status(),
            Error::Key(e) => e.exit_status(),
            Error::Transfer(e) => e.exit_status(),
            Error::Cache(e) => e.exit_status(),
            Error::Mount(e) => e.exit_status(),
            Error::State(e) => e.exit_status(),
            Error::Agreed(e) => e.exit_status(),
            Error::PoolSpec(_) => ExitStatus::BadInput,
            Error::Bundle(e) => e.exit_status(),
            Error::Other { status, .. } => *status,
        }
    }
}

/// Exit status for an I/O error: permission and space problems are the system's, the rest too.
pub fn io_status(e: &std::io::Error) -> ExitStatus {
    match e.kind() {
        std::io::ErrorKind::NotFound => ExitStatus::BadInput,
        _ => ExitStatus::System,
    }
}
