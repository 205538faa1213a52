//! Byte-compiling a staged environment (docs/architecture.md, "Python environments as pools").

use std::ffi::OsStr;
use std::path::Path;

use crate::exec::{Tool, ToolCommand};

/// Byte-compile every module of the staged package with the environment's own interpreter, as
/// unchecked-hash `.pyc` files (PEP 552): the copy gives the sources new modification times, so
/// the environment's own timestamp `.pyc` files no longer match them, and a `.pyc` cannot be
/// written into the read-only pool; without this every import would compile its source again.
/// Unchecked pycs are used without looking at the source. Returns the `.pyc` files now in the
/// package; a module that does not compile (a template, Python 2 code) is left to its source.
pub(super) fn byte_compile(
    python: &Path,
    pkg: &Path,
    path_var: Option<&OsStr>,
    warnings: &mut Vec<String>,
) -> u64 {
    let r = ToolCommand::new(Tool::Python3)
        .program(python)
        .args(["-I", "-m", "compileall", "-q", "-f", "-j", "0"])
        .args(["--invalidation-mode", "unchecked-hash"])
        .arg(pkg)
        .env("SOURCE_DATE_EPOCH", "0")
        .timeout(std::time::Duration::from_secs(1800))
        .run(path_var);
    if let Err(e) = r {
        let first: String = e
            .stderr()
            .unwrap_or("")
            .lines()
            .chain(e.to_string().lines())
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .collect::<Vec<_>>()
            .join(" | ");
        warnings.push(format!(
            "byte-compiling the environment ({} -m compileall) left some modules to their \
             source (they are compiled at each import): {first}",
            python.display()
        ));
    }
    count_ext(pkg, "pyc")
}

fn count_ext(dir: &Path, ext: &str) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        let p = e.path();
        match p.symlink_metadata() {
            Ok(m) if m.is_dir() => n += count_ext(&p, ext),
            Ok(m) if m.is_file() && p.extension() == Some(OsStr::new(ext)) => n += 1,
            _ => {}
        }
    }
    n
}
