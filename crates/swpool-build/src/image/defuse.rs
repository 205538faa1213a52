//! What an `all_root` build (`build --all-root`, `layer export`) does with setuid/setgid files
//! and device nodes: named in warnings, then defused by mksquashfs (bits cleared with a pseudo
//! file, devices left out with an exclude file); refused for formats that cannot.

use std::path::{Path, PathBuf};

use super::build::{BuildError, BuildOptions};
use super::tree::{self, TreeStats};
use super::ImageFormat;
use crate::exec::ToolCommand;

/// The entries an `all_root` build defuses (empty otherwise, and with root's `keep_special`): each
/// named in a warning. Squashfs builds clear the bits and leave the devices out (mksquashfs' `-pf`
/// and `-ef`); EROFS and ext builds cannot, and refuse such a tree.
pub(super) fn defuse_list(
    opts: &BuildOptions,
    src: &Path,
    format: ImageFormat,
    stats: &TreeStats,
    warnings: &mut Vec<String>,
) -> Result<Vec<tree::Special>, BuildError> {
    if opts.keep_special {
        let uid = rustix::process::geteuid();
        if !uid.is_root() {
            return Err(BuildError::KeepSpecialNotRoot { uid: uid.as_raw() });
        }
    }
    if !opts.all_root || opts.keep_special || stats.special.is_empty() {
        return Ok(Vec::new());
    }
    if format != ImageFormat::Squashfs {
        return Err(BuildError::SpecialUnsupported {
            src: opts.src.clone(),
            format,
            list: stats.special.iter().map(|s| s.describe()).collect(),
        });
    }
    for s in &stats.special {
        if s.path.as_os_str().as_encoded_bytes().contains(&b'\n') {
            return Err(BuildError::SpecialName {
                path: src.join(&s.path),
            });
        }
        warnings.push(if s.is_device() {
            format!(
                "left out {}: a device node would be root's in the pool (root may keep it with --keep-special)",
                s.describe()
            )
        } else {
            format!(
                "cleared the setuid/setgid bits of {} (now {:o}): it would run as root from the pool (root may keep them with --keep-special)",
                s.describe(),
                s.mode & 0o1777
            )
        });
    }
    Ok(stats.special.clone())
}

/// A file next to the temporary image, removed when dropped.
pub(super) struct SideFile(pub(super) PathBuf);

impl Drop for SideFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn side_file(tmp: &Path, ext: &str, text: &str) -> Result<SideFile, BuildError> {
    let mut p = tmp.as_os_str().to_owned();
    p.push(ext);
    let p = PathBuf::from(p);
    let io = |source| BuildError::Io {
        what: "cannot write",
        path: p.clone(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .map_err(io)?;
    let guard = SideFile(p.clone());
    std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io)?;
    Ok(guard)
}

/// A mksquashfs pseudo-file name: quoted, `"` and `\` escaped.
fn pseudo_name(p: &Path) -> String {
    let s = p.to_string_lossy();
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// `c` (mksquashfs) told to clear the bits of `defuse`'s setuid/setgid files (a pseudo-file `m`
/// line each) and to leave its device nodes out (`-ef`); the files, removed when dropped.
pub(super) fn mksquashfs_args(
    mut c: ToolCommand,
    tmp: &Path,
    defuse: &[tree::Special],
) -> Result<(ToolCommand, Vec<SideFile>), BuildError> {
    let mut sides = Vec::new();
    let (devices, setid): (Vec<_>, Vec<_>) = defuse.iter().partition(|s| s.is_device());
    if !setid.is_empty() {
        let text: String = setid
            .iter()
            .map(|s| format!("{} m {:o} 0 0\n", pseudo_name(&s.path), s.mode & 0o1777))
            .collect();
        let f = side_file(tmp, ".pseudo", &text)?;
        c = c.arg("-pf").path(&f.0);
        sides.push(f);
    }
    if !devices.is_empty() {
        let text: String = devices
            .iter()
            .map(|s| format!("{}\n", s.path.to_string_lossy()))
            .collect();
        let f = side_file(tmp, ".exclude", &text)?;
        c = c.arg("-ef").path(&f.0);
        sides.push(f);
    }
    Ok((c, sides))
}
