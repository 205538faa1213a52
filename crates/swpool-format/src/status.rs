//! The exit-status table every sw-pool command and library error maps to (README, man page).

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

/// Exit status for an I/O error: permission and space problems are the system's, the rest too.
pub fn io_status(e: &std::io::Error) -> ExitStatus {
    match e.kind() {
        std::io::ErrorKind::NotFound => ExitStatus::BadInput,
        _ => ExitStatus::System,
    }
}
