//! How a load, an unload or the TaskProlog's step fails on its own account (the pipeline's other
//! failures are the errors of trust, transfer, cache, mount and state).

use std::path::PathBuf;

use swpool_format::show::show;
use swpool_format::status::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(
        "pool {} does not exist (give a pool file, or NAME/VERSION found on $SW_POOL_PATH)",
        show(pool)
    )]
    NoPool { pool: PathBuf },
    #[error("{} changed on shared storage since the job loaded it ({want} → {got}); every node of a job must use the same pool: load it again", show(pool))]
    ChangedSinceJob {
        pool: PathBuf,
        want: String,
        got: String,
    },
    #[error("node 0's plan for {} does not match its trailer", show(pool))]
    PlanMismatch { pool: PathBuf },
    #[error("cannot decode node 0's plan: {0}")]
    PlanDecode(String),
    #[error("{} is a bare image without a sw-pool manifest, so no signature can vouch for it, and the trust policy requires one ({origin}); build and sign it as a pool", show(image))]
    BareRefused { image: PathBuf, origin: String },
    #[error(
        "{} is neither a mount point, a pool file nor NAME/VERSION (see `sw-pool list`)",
        show(spec)
    )]
    UnknownSpec { spec: PathBuf },
    #[error(
        "pool {name}/{version} is not loaded on this node (nothing at {}; see `sw-pool list`)",
        show(at)
    )]
    NotLoaded {
        name: String,
        version: String,
        at: PathBuf,
    },
    #[error("cannot {what} {}: {source}", show(path))]
    Lock {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A pool the task's environment names (`SW_POOL_JOB_POOLS`, `SW_POOL_LOAD`) is not usable.
    #[error("{var}: {reason}")]
    JobEnv { var: String, reason: String },
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
            LoadError::BareRefused { .. } => ExitStatus::Trust,
            LoadError::Lock { .. } => ExitStatus::System,
        }
    }
}
