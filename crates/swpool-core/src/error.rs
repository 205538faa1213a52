//! The top-level error type and the exit-status table.
//!
//! Library modules return their own error enums (`ExecError`, `BuildError`, …); they convert into
//! [`Error`] with `?`. The binary prints the error once, with its chain of causes, and exits with
//! [`Error::exit_status`].

use std::fmt;
use std::path::PathBuf;

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
    PyEnv(#[from] crate::pyenv::PyEnvError),
    #[error(transparent)]
    User(#[from] crate::users::UserError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Hook(#[from] crate::slurm::HookError),
    #[error(transparent)]
    UserImage(#[from] crate::userimage::UserImageError),
    /// A free-form error with an exit status, for the binary's edge code.
    #[error("{message}")]
    Other { message: String, status: ExitStatus },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A step's result as this rank's part in the agreement on it (`None`: this rank does not do the
/// step, e.g. a rank that is not its node's leader).
pub fn step_part<T>(step: Option<&Result<T>>) -> crate::collective::Local<()> {
    match step {
        Some(Err(e)) => Err((e.exit_status(), e.to_string())),
        _ => Ok(()),
    }
}

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
            Error::PyEnv(e) => e.exit_status(),
            Error::User(e) => e.exit_status(),
            Error::Load(e) => e.exit_status(),
            Error::Hook(e) => e.exit_status(),
            Error::UserImage(e) => e.exit_status(),
            Error::Other { status, .. } => *status,
        }
    }
}

/// How a load, an unload or the TaskProlog's step fails on its own account (the pipeline's other
/// failures are the errors of trust, transfer, cache, mount and state). It lives here, with the
/// error that gathers the others, so that `load` depends on `error` and not the reverse.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "pool {} does not exist (give a pool file, or NAME/VERSION found on $SW_POOL_PATH)",
        swpool_format::show::show(pool)
    )]
    NoPool { pool: PathBuf },
    #[error("{} changed on shared storage since the job loaded it ({want} → {got}); every node of a job must use the same pool: load it again", swpool_format::show::show(pool))]
    ChangedSinceJob {
        pool: PathBuf,
        want: String,
        got: String,
    },
    #[error(
        "node 0's plan for {} does not match its trailer",
        swpool_format::show::show(pool)
    )]
    PlanMismatch { pool: PathBuf },
    #[error("cannot decode node 0's plan: {0}")]
    PlanDecode(String),
    #[error("{node}: the site's mount helper could not {what}: {reason}")]
    Helper {
        node: String,
        what: String,
        reason: String,
    },
    #[error("{} is a bare image without a sw-pool manifest, so no signature can vouch for it, and the trust policy requires one ({origin}); build and sign it as a pool (an image of your own, owned by you, writable by no one else and not on pool_path, is mounted as your data without one)", swpool_format::show::show(image))]
    BareRefused { image: PathBuf, origin: String },
    #[error(
        "{} is neither a mount point, a pool file nor NAME/VERSION (see `sw-pool list`)",
        swpool_format::show::show(spec)
    )]
    UnknownSpec { spec: PathBuf },
    #[error(
        "pool {name}/{version} is not loaded on this node (nothing at {}; see `sw-pool list`)",
        swpool_format::show::show(at)
    )]
    NotLoaded {
        name: String,
        version: String,
        at: PathBuf,
    },
    #[error("cannot {what} {}: {source}", swpool_format::show::show(path))]
    Lock {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A pool the task's environment names (`SW_POOL_JOB_POOLS`, `SW_POOL_LOAD`) is not usable.
    #[error("{var}: {reason}")]
    JobEnv { var: String, reason: String },
    #[error(
        "{} is a bare image without a sw-pool manifest: give a MOUNTPOINT",
        swpool_format::show::show(image)
    )]
    BareNeedsMountpoint { image: PathBuf },
    #[error("--pool: give NAME/VERSION[,NAME/VERSION...]")]
    NoPoolsGiven,
    /// One entry of `--pool LIST` is not usable.
    #[error("--pool={spec}: {source}")]
    PoolEntry { spec: String, source: Box<Error> },
    /// Modules of the pool are loaded in the calling shell: unloading the pool under them would
    /// leave their changes (PATH, ...) behind.
    #[error(
        "module(s) {} from {} are loaded in this shell: unload them first (`module unload {}`); nothing was unloaded",
        modules.join(", "),
        swpool_format::show::show(mountpoint),
        modules.join(" ")
    )]
    ModulesLoaded {
        mountpoint: PathBuf,
        modules: Vec<String>,
    },
}

impl LoadError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            LoadError::NoPool { .. }
            | LoadError::UnknownSpec { .. }
            | LoadError::NotLoaded { .. }
            | LoadError::JobEnv { .. } => ExitStatus::BadInput,
            LoadError::ChangedSinceJob { .. } => ExitStatus::InvalidPool,
            LoadError::PlanMismatch { .. } | LoadError::PlanDecode(_) => ExitStatus::Internal,
            LoadError::Helper { .. } => ExitStatus::System,
            LoadError::BareRefused { .. } => ExitStatus::Trust,
            LoadError::Lock { .. } => ExitStatus::System,
            LoadError::BareNeedsMountpoint { .. } => ExitStatus::BadInput,
            LoadError::NoPoolsGiven => ExitStatus::Usage,
            LoadError::ModulesLoaded { .. } => ExitStatus::BadInput,
            LoadError::PoolEntry { source, .. } => source.exit_status(),
        }
    }
}
