//! The top-level error type and the exit-status table.
//!
//! Library modules return their own error enums (`ExecError`, `BuildError`, …); they convert into
//! [`Error`] with `?`. The binary prints the error once, with its chain of causes, and exits with
//! [`Error::exit_status`].

use std::fmt;

pub use swpool_format::status::{io_status, ExitStatus};

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
    #[error(transparent)]
    User(#[from] crate::users::UserError),
    #[error(transparent)]
    Load(#[from] crate::load::LoadError),
    #[error(transparent)]
    Hook(#[from] crate::slurm::HookError),
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
            Error::User(e) => e.exit_status(),
            Error::Load(e) => e.exit_status(),
            Error::Hook(e) => e.exit_status(),
            Error::Other { status, .. } => *status,
        }
    }
}
