//! The environment change for a mounted pool, as shell code to `eval` (pure functions).
//!
//! **Load** of a pool mounted at `M`:
//! * `MODULEPATH` gets `M/modulefiles` prepended (once per shell, even if loaded twice);
//! * `SW_POOL_LOADED` (colon-separated, one entry per load, like Lmod's `LOADEDMODULES`) gets `M`
//!   appended: it is how `unload` knows what this shell added;
//! * when `M` is `<root>/<name>/<version>` (the standard place: `$SW_POOL_MOUNT/<name>/<version>`),
//!   `SW_POOL_MOUNT` and `GWDG_SW_MOUNT` are set to `<root>` if they are unset (generated modulefiles and
//!   the paper's Figure 8 modulefile find their package at `$SW_POOL_MOUNT/<name>/<version>/install/…`),
//!   and `_SW_POOL_SET_MOUNT=<root>` / `_SW_POOL_SET_GWDG=<root>` remember that sw-pool set them. A value the user set is never
//!   changed. For a pool mounted elsewhere (`-m DIR`) or a bare image they are left alone: generated
//!   modulefiles then fall back to the pool that holds them.
//!
//! **Unload** reverses exactly that: it removes one `M` from `SW_POOL_LOADED`; when it was the last,
//! it removes the one `MODULEPATH` entry `M/modulefiles` (also when this shell did not add it: no
//! `MODULEPATH` entry may point into an unmounted directory), and unsets `SW_POOL_MOUNT`/`GWDG_SW_MOUNT`
//! when sw-pool set them and no loaded pool remains under that root. Empty variables are unset.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::config::{EnvVar, Environment, HostVar};

/// Which syntax to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shell {
    /// bash, zsh, sh, ksh, dash
    Sh,
    Fish,
    /// csh, tcsh
    Csh,
}

impl FromStr for Shell {
    type Err = String;
    fn from_str(s: &str) -> Result<Shell, String> {
        let base = s.rsplit('/').next().unwrap_or(s).trim_start_matches('-');
        match base {
            "sh" | "bash" | "zsh" | "ksh" | "dash" | "ash" => Ok(Shell::Sh),
            "fish" => Ok(Shell::Fish),
            "csh" | "tcsh" => Ok(Shell::Csh),
            _ => Err(format!(
                "unknown shell {s:?} (use sh, bash, zsh, fish, csh or tcsh)"
            )),
        }
    }
}

impl Shell {
    /// From `$SHELL` (in `env`), defaulting to sh.
    pub fn from_env(env: &Environment) -> Shell {
        env.get(HostVar::Shell)
            .and_then(|s| s.parse().ok())
            .unwrap_or(Shell::Sh)
    }
}

/// The variables involved, as they are now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub modulepath: Option<String>,
    pub sw_pool_mount: Option<String>,
    pub gwdg_sw_mount: Option<String>,
    pub loaded: Option<String>,
    pub set_mount: Option<String>,
    pub set_gwdg: Option<String>,
}

pub const LOADED_VAR: &str = EnvVar::Loaded.name();
pub const SET_MOUNT_VAR: &str = EnvVar::SetMount.name();
pub const SET_GWDG_VAR: &str = EnvVar::SetGwdg.name();

impl Snapshot {
    /// The variables as `env` has them.
    pub fn from_env(env: &Environment) -> Snapshot {
        Snapshot {
            modulepath: env.get(HostVar::Modulepath),
            sw_pool_mount: env.get(EnvVar::Mount),
            gwdg_sw_mount: env.get(HostVar::GwdgSwMount),
            loaded: env.get(EnvVar::Loaded),
            set_mount: env.get(EnvVar::SetMount),
            set_gwdg: env.get(EnvVar::SetGwdg),
        }
    }
}

impl Snapshot {
    /// The variables after `c` (what the shell ends up with); other variables leave it unchanged.
    pub fn apply(&mut self, c: &Change) {
        let (k, v) = match c {
            Change::Set(k, v) => (*k, Some(v.clone())),
            Change::Unset(k) => (*k, None),
        };
        match k {
            "MODULEPATH" => self.modulepath = v,
            "SW_POOL_MOUNT" => self.sw_pool_mount = v,
            "GWDG_SW_MOUNT" => self.gwdg_sw_mount = v,
            LOADED_VAR => self.loaded = v,
            SET_MOUNT_VAR => self.set_mount = v,
            SET_GWDG_VAR => self.set_gwdg = v,
            _ => {}
        }
    }
}

/// One variable change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Set(&'static str, String),
    Unset(&'static str),
}

/// A pool as mounted.
#[derive(Debug, Clone)]
pub struct PoolMount {
    pub mount_point: PathBuf,
    /// `(name, version)` of a pool; `None` for a bare image.
    pub pool: Option<(String, String)>,
}

impl PoolMount {
    pub fn modulefiles(&self) -> String {
        self.mount_point
            .join("modulefiles")
            .to_string_lossy()
            .into_owned()
    }
    /// `<root>` when mounted at `<root>/<name>/<version>`.
    pub fn root(&self) -> Option<String> {
        let (n, v) = self.pool.as_ref()?;
        let mp = &self.mount_point;
        if mp.file_name()? != v.as_str() || mp.parent()?.file_name()? != n.as_str() {
            return None;
        }
        Some(mp.parent()?.parent()?.to_string_lossy().into_owned())
    }
}

fn entries(v: &Option<String>) -> Vec<String> {
    v.as_deref()
        .unwrap_or("")
        .split(':')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn set_or_unset(var: &'static str, list: &[String]) -> Change {
    if list.is_empty() {
        Change::Unset(var)
    } else {
        Change::Set(var, list.join(":"))
    }
}

fn under(p: &str, root: &str) -> bool {
    Path::new(p).starts_with(root)
}

/// The changes that make a mounted pool's modules visible.
pub fn load_changes(now: &Snapshot, m: &PoolMount) -> Vec<Change> {
    let mp = m.mount_point.to_string_lossy().into_owned();
    let dir = m.modulefiles();
    let mut out = Vec::new();
    let mut loaded = entries(&now.loaded);
    let first = !loaded.contains(&mp);
    loaded.push(mp);
    let mut mpath = entries(&now.modulepath);
    if first || !mpath.contains(&dir) {
        mpath.insert(0, dir);
        out.push(set_or_unset("MODULEPATH", &mpath));
    }
    out.push(set_or_unset(LOADED_VAR, &loaded));
    if let Some(root) = m.root() {
        if now.sw_pool_mount.is_none() {
            out.push(Change::Set("SW_POOL_MOUNT", root.clone()));
            out.push(Change::Set(SET_MOUNT_VAR, root.clone()));
        }
        if now.gwdg_sw_mount.is_none() {
            out.push(Change::Set("GWDG_SW_MOUNT", root.clone()));
            out.push(Change::Set(SET_GWDG_VAR, root));
        }
    }
    out
}

/// The changes that undo [`load_changes`] for the same mount.
pub fn unload_changes(now: &Snapshot, m: &PoolMount) -> Vec<Change> {
    let mp = m.mount_point.to_string_lossy().into_owned();
    let dir = m.modulefiles();
    let mut out = Vec::new();
    let mut loaded = entries(&now.loaded);
    if let Some(i) = loaded.iter().rposition(|e| *e == mp) {
        loaded.remove(i);
        out.push(set_or_unset(LOADED_VAR, &loaded));
    }
    let last = !loaded.contains(&mp);
    if last {
        let mut mpath = entries(&now.modulepath);
        if let Some(i) = mpath.iter().position(|e| *e == dir) {
            mpath.remove(i);
            out.push(set_or_unset("MODULEPATH", &mpath));
        }
    }
    for (var, marker, value, set) in [
        (
            "SW_POOL_MOUNT",
            SET_MOUNT_VAR,
            &now.sw_pool_mount,
            &now.set_mount,
        ),
        (
            "GWDG_SW_MOUNT",
            SET_GWDG_VAR,
            &now.gwdg_sw_mount,
            &now.set_gwdg,
        ),
    ] {
        if let Some(root) = set {
            if !loaded.iter().any(|l| under(l, root)) {
                if value.as_deref() == Some(root) {
                    out.push(Change::Unset(var));
                }
                out.push(Change::Unset(marker));
            }
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} cannot be written for {shell}: {reason}")]
pub struct RenderError {
    pub shell: String,
    pub value: String,
    pub reason: &'static str,
}

impl fmt::Display for Shell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shell::Sh => "sh",
            Shell::Fish => "fish",
            Shell::Csh => "csh",
        })
    }
}

/// Quote a value for a shell: POSIX single quotes; fish single quotes with `\'` and `\\`; csh single
/// quotes with `'\''` for a quote and `\!` outside quotes for history expansion (a newline cannot be
/// written in csh).
pub fn quote(shell: Shell, v: &str) -> Result<String, RenderError> {
    Ok(match shell {
        Shell::Sh => format!("'{}'", v.replace('\'', r"'\''")),
        Shell::Fish => format!("'{}'", v.replace('\\', r"\\").replace('\'', r"\'")),
        Shell::Csh => {
            if v.contains('\n') {
                return Err(RenderError {
                    shell: shell.to_string(),
                    value: v.into(),
                    reason: "csh cannot quote a newline",
                });
            }
            format!("'{}'", v.replace('\'', r"'\''").replace('!', r"'\!'"))
        }
    })
}

/// Shell code for the changes, one statement per line.
pub fn render(shell: Shell, changes: &[Change]) -> Result<String, RenderError> {
    let mut s = String::new();
    for c in changes {
        let line = match (shell, c) {
            (Shell::Sh, Change::Set(k, v)) => format!("export {k}={};", quote(shell, v)?),
            (Shell::Sh, Change::Unset(k)) => format!("unset {k};"),
            (Shell::Fish, Change::Set(k, v)) => format!("set -gx {k} {};", quote(shell, v)?),
            (Shell::Fish, Change::Unset(k)) => format!("set -e {k};"),
            (Shell::Csh, Change::Set(k, v)) => format!("setenv {k} {};", quote(shell, v)?),
            (Shell::Csh, Change::Unset(k)) => format!("unsetenv {k};"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    Ok(s)
}

#[cfg(test)]
mod tests;
