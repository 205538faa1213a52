//! `bundle --python[=PYTHON]`: where the interpreter finds modules, so that traced module files
//! can be laid out under `python/` with their import paths intact (one `PYTHONPATH` entry).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::place::{canon, Plan, Planned};
use crate::exec::{ExecError, Tool, ToolCommand};

#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
pub struct PythonInfo {
    pub executable: PathBuf,
    pub version: String,
    /// `sys.path` entries that are directories (zip files and the script directory left out).
    pub path: Vec<PathBuf>,
    /// The standard library directories (`stdlib`, `platstdlib`).
    pub stdlib: Vec<PathBuf>,
}

const PROBE: &str = "import json, os, sys, sysconfig\n\
p = sysconfig.get_paths()\n\
print(json.dumps({'executable': sys.executable, 'version': '%d.%d' % sys.version_info[:2],\n\
 'path': [os.path.abspath(x) for x in sys.path if x and os.path.isdir(x)],\n\
 'stdlib': sorted({p['stdlib'], p['platstdlib']})}))";

/// Ask the interpreter (`python3` on the search path `path_var`, or `python`) for its module search
/// path; the directories of `pythonpath` (the caller's `PYTHONPATH`) come first.
pub fn probe(
    python: Option<&Path>,
    pythonpath: Option<&OsStr>,
    path_var: Option<&OsStr>,
) -> Result<PythonInfo, ExecError> {
    let mut c = ToolCommand::new(Tool::Python3).args(["-I", "-c", PROBE]);
    if let Some(p) = python {
        c = c.program(p);
    }
    // -I ignores PYTHONPATH: add it back by hand so its entries count as module directories
    let out = c.run(path_var)?;
    let mut info: PythonInfo =
        serde_json::from_str(out.stdout.trim()).map_err(|e| ExecError::Failed {
            tool: Tool::Python3,
            cmdline: "python3 -I -c <probe>".into(),
            status: "unreadable answer".into(),
            stderr: format!("{e}: {}", out.stdout),
        })?;
    if let Some(pp) = pythonpath {
        let mut extra: Vec<PathBuf> = std::env::split_paths(pp)
            .filter(|p| p.is_dir())
            .map(|p| crate::exec::absolute(&p))
            .collect();
        extra.append(&mut info.path);
        info.path = extra;
    }
    Ok(info)
}

impl PythonInfo {
    /// The module directory holding `f` (the longest `sys.path` entry that contains it) and the
    /// path relative to it.
    pub fn locate<'a>(&'a self, f: &'a Path) -> Option<(&'a Path, &'a Path)> {
        self.path
            .iter()
            .filter_map(|d| f.strip_prefix(d).ok().map(|r| (d.as_path(), r)))
            .max_by_key(|(d, _)| d.as_os_str().len())
    }

    /// Whether `f` is part of the interpreter's standard library (outside site-/dist-packages).
    pub fn is_stdlib(&self, f: &Path) -> bool {
        let s = f.to_string_lossy();
        if s.contains("/site-packages/") || s.contains("/dist-packages/") {
            return false;
        }
        self.stdlib.iter().any(|d| f.starts_with(d))
    }
}

impl PythonInfo {
    /// Add each module's other half: Python opens only `__pycache__/m.cpython-XY.pyc` when it is
    /// valid (it merely stats `m.py`), but a `.pyc` in `__pycache__` is ignored without its
    /// source; and a `.py` without its `.pyc` would be compiled on every import from a read-only
    /// pool. So a traced `.pyc` brings its `.py` and a traced `.py` its `.pyc`, where they exist.
    pub fn with_companions(&self, files: Vec<PathBuf>) -> Vec<PathBuf> {
        let tag = format!("cpython-{}", self.version.replace('.', ""));
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for f in files {
            let mut extra = None;
            let name = f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let dir = f.parent().map(Path::to_path_buf).unwrap_or_default();
            if let Some(stem) = name.strip_suffix(".py") {
                extra = Some(dir.join("__pycache__").join(format!("{stem}.{tag}.pyc")));
            } else if name.ends_with(".pyc")
                && dir.file_name().map(|d| d == "__pycache__").unwrap_or(false)
            {
                let stem = name.split('.').next().unwrap_or_default();
                if let Some(pkg) = dir.parent() {
                    extra = Some(pkg.join(format!("{stem}.py")));
                }
            }
            if seen.insert(f.clone()) {
                out.push(f);
            }
            if let Some(e) = extra {
                if e.is_file() && seen.insert(e.clone()) {
                    out.push(e);
                }
            }
        }
        out
    }
}

/// A bundled interpreter's standard library: by the rule `build --from-env` follows
/// ([`crate::pyenv::stdlib_beside`]), `lib/pythonX.Y` two levels above the interpreter in the package.
impl PythonInfo {
    /// Where the interpreter lies in the package, when it is bundled (named on the command line).
    pub(super) fn bundled_at(&self, plan: &Plan) -> Option<PathBuf> {
        let i = *plan.by_source.get(&canon(&self.executable))?;
        Some(plan.files[i].dest.clone())
    }

    /// Where the standard-library file `f` (real path `c`) goes beside the bundled interpreter;
    /// `None` without one, or for a file outside the standard library.
    pub(super) fn stdlib_dest(&self, plan: &Plan, f: &Path, c: &Path) -> Option<PathBuf> {
        if !(self.is_stdlib(f) || self.is_stdlib(c)) {
            return None;
        }
        let exe = self.bundled_at(plan)?;
        let rel = self
            .stdlib
            .iter()
            .find_map(|d| f.strip_prefix(d).ok().or_else(|| c.strip_prefix(d).ok()))?;
        Some(crate::pyenv::stdlib_beside(&exe, &self.version).join(rel))
    }

    /// The landmark by which a bundled CPython finds its standard library, `os.py` (never opened
    /// by a traced command: `os` is frozen, getpath only looks for the file).
    pub(super) fn landmark(&self, plan: &Plan) -> Option<Planned> {
        let exe = self.bundled_at(plan)?;
        let l = self
            .stdlib
            .iter()
            .map(|d| d.join("os.py"))
            .find(|l| l.is_file())?;
        let dest = crate::pyenv::stdlib_beside(&exe, &self.version).join("os.py");
        Some(self.planned(
            l,
            dest,
            "where the bundled interpreter finds its standard library (CPython's landmark)",
        ))
    }

    /// `lib/pythonX.Y/lib-dynload` beside a bundled interpreter (CPython's exec-prefix landmark:
    /// without it the interpreter warns at start).
    pub(super) fn lib_dynload(&self, plan: &Plan) -> Option<PathBuf> {
        let exe = self.bundled_at(plan)?;
        Some(crate::pyenv::stdlib_beside(&exe, &self.version).join("lib-dynload"))
    }

    pub(super) fn planned(&self, source: PathBuf, dest: PathBuf, reason: &str) -> Planned {
        Planned {
            source,
            dest,
            kind: "python",
            reason: reason.into(),
            elf: None,
            symlink: None,
        }
    }
}
