//! The tools the helper runs (`e2fsck`, `squeue`): found only in the system directories, started
//! with an empty environment plus a fixed `PATH`, never through a shell.

use std::path::PathBuf;
use std::process::Command;

use crate::error::{HelperError, Result};

pub const SAFE_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// `Command` for `name` from [`SAFE_PATH`], environment cleared.
pub fn command(name: &str) -> Result<Command> {
    let path = SAFE_PATH
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            HelperError::tool(
                name,
                format!("not installed in {SAFE_PATH}; nothing was done (an admin installs it)"),
            )
        })?;
    let mut c = Command::new(path);
    c.env_clear().env("PATH", SAFE_PATH).env("LC_ALL", "C");
    c.stdin(std::process::Stdio::null());
    Ok(c)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_helpers_path_is_the_system_directories_every_root_caller_searches() {
        assert_eq!(super::SAFE_PATH, swpool_sys::exec::SYSTEM_DIRS.join(":"));
    }
}
