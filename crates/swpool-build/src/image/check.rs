//! Quick consistency check of a pool's file system with the format's own tool.

use std::path::Path;

use super::ImageFormat;
use crate::exec::{ExecError, Tool, ToolCommand};

#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckReport {
    pub tool: String,
    pub ok: bool,
    /// The tool's summary (last lines of its output).
    pub summary: String,
}

/// `e2fsck -fn` for ext images, `unsquashfs -stat` for squashfs, `fsck.erofs` for EROFS; read-only, never repairs. The
/// tool is looked up in `path_var` (the value of `PATH`; see [`crate::exec::Tool::locate`]).
pub fn check(
    path: &Path,
    format: ImageFormat,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<CheckReport, ExecError> {
    let cmd = match format {
        ImageFormat::Squashfs => ToolCommand::new(Tool::Unsquashfs).arg("-stat").path(path),
        ImageFormat::Erofs => ToolCommand::new(Tool::FsckErofs).path(path),
        _ => ToolCommand::new(Tool::E2fsck)
            .arg("-fn")
            .end_of_options()
            .path(path),
    };
    let tool = cmd.cmdline();
    match cmd.run(path_var) {
        Ok(o) => Ok(CheckReport {
            tool,
            ok: true,
            summary: tail(&format!("{}{}", o.stdout, o.stderr), 3),
        }),
        Err(ExecError::Failed { stderr, .. }) => Ok(CheckReport {
            tool,
            ok: false,
            summary: tail(&stderr, 6),
        }),
        Err(e) => Err(e),
    }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.trim().lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
