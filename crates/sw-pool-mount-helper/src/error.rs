//! The helper's one error: a message for the caller (and syslog) and an exit status with
//! sw-pool's meanings (3 refused input, 4 a bad pool or image, 5 a tool failed, 6 the system
//! refused, 7 trust).

use std::path::Path;

use swpool_format::status::ExitStatus;

#[derive(Debug, thiserror::Error)]
#[error("{msg}")]
pub struct HelperError {
    pub status: ExitStatus,
    pub msg: String,
}

impl HelperError {
    pub fn new(status: ExitStatus, msg: impl Into<String>) -> Self {
        HelperError {
            status,
            msg: msg.into(),
        }
    }
    /// A request the helper's contract does not allow.
    pub fn refused(msg: impl Into<String>) -> Self {
        Self::new(ExitStatus::BadInput, msg)
    }
    pub fn system(path: &Path, e: std::io::Error) -> Self {
        Self::new(
            swpool_format::status::io_status(&e),
            format!("{}: {e}", path.display()),
        )
    }
    pub fn trust(msg: impl Into<String>) -> Self {
        Self::new(ExitStatus::Trust, msg)
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::new(ExitStatus::InvalidPool, msg)
    }
}

pub type Result<T> = std::result::Result<T, HelperError>;
