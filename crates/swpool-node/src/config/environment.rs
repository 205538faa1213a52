//! The process environment, read once.
//!
//! [`Environment::capture`] is the one place in sw-pool's libraries and binary that reads the
//! process environment (`tools/lint-structure.py` fails on any other). It keeps the variables of
//! the tables ([`super::EnvVar`], [`super::HostVar`]) and nothing else; the library then takes
//! what it needs from that value, passed down (or as plain parameters: `swpool-sys`, options such
//! as `BuildOptions::path_var`). So a long-lived process reads its environment at start and is not
//! changed by later `setenv`s, a privileged helper decides which values it takes from its caller
//! (an [`Environment::empty`] holds none), and a test sets the values it needs without touching
//! the test process's environment.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use super::vars::{is_read, HostVar, Var};

/// The variables sw-pool reads, as they were when the environment was read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    vars: BTreeMap<String, OsString>,
}

impl Environment {
    /// No variable set (what a privileged helper starts from, and most tests).
    pub const fn empty() -> Environment {
        Environment {
            vars: BTreeMap::new(),
        }
    }

    /// Read the process environment (every variable sw-pool reads: [`super::EnvVar`],
    /// [`super::HostVar`], [`super::HOST_PREFIXES`]).
    pub fn capture() -> Environment {
        Environment::from_vars(std::env::vars_os())
    }

    /// The variables of `vars` that sw-pool reads; the others (and names that are not UTF-8) are
    /// dropped.
    pub fn from_vars<K, V>(vars: impl IntoIterator<Item = (K, V)>) -> Environment
    where
        K: Into<OsString>,
        V: Into<OsString>,
    {
        let vars = vars
            .into_iter()
            .filter_map(|(k, v)| {
                let k = k.into().into_string().ok()?;
                is_read(&k).then(|| (k, v.into()))
            })
            .collect();
        Environment { vars }
    }

    /// Set a variable (tests; a caller that decides a value for the code it calls).
    pub fn set(&mut self, v: impl Var, value: impl Into<OsString>) {
        self.vars.insert(v.var_name().to_string(), value.into());
    }

    /// With a variable set (see [`Environment::set`]).
    pub fn with(mut self, v: impl Var, value: impl Into<OsString>) -> Environment {
        self.set(v, value);
        self
    }

    pub fn remove(&mut self, v: impl Var) {
        self.vars.remove(v.var_name());
    }

    /// Keep only the variables `keep` accepts (by name and value).
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &OsStr) -> bool) {
        self.vars.retain(|k, v| keep(k, v));
    }

    /// The raw value, if set (possibly empty, possibly not UTF-8).
    pub fn get_os(&self, v: impl Var) -> Option<&OsStr> {
        self.vars.get(v.var_name()).map(OsString::as_os_str)
    }

    /// The value, if set (possibly empty) and UTF-8 (as `std::env::var(..).ok()`).
    pub fn get(&self, v: impl Var) -> Option<String> {
        self.get_os(v)?.to_str().map(String::from)
    }

    /// The value, if set, UTF-8 and not empty.
    pub fn get_nonempty(&self, v: impl Var) -> Option<String> {
        self.get(v).filter(|v| !v.is_empty())
    }

    /// Is it set to exactly `1`?
    pub fn is_one(&self, v: impl Var) -> bool {
        self.get_os(v).is_some_and(|v| v == "1")
    }

    /// A value by name, for code that takes a lookup function (`None` also for a name that is not
    /// in the tables: such a variable is never read).
    pub fn var(&self, name: &str) -> Option<String> {
        self.vars.get(name)?.to_str().map(String::from)
    }

    /// The names of the set variables that start with `prefix` (one of [`super::HOST_PREFIXES`]).
    pub fn names_with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = &'a str> {
        self.vars
            .keys()
            .map(String::as_str)
            .filter(move |k| k.starts_with(prefix))
    }

    /// The names of this task's variables that a step (or a program) started from it must not
    /// inherit: its MPI and step variables ([`super::STEP_PREFIXES`], [`super::STEP_NAMES`]).
    pub fn step_task_names(&self) -> impl Iterator<Item = &str> {
        super::STEP_PREFIXES
            .iter()
            .flat_map(move |p| self.names_with_prefix(p))
            .chain(super::STEP_NAMES.iter().map(|v| v.name()))
    }

    /// The value of `PATH`, for looking up tools ([`crate::exec::Tool::locate`]).
    pub fn path_var(&self) -> Option<&OsStr> {
        self.get_os(HostVar::Path)
    }

    /// The value of `XDG_RUNTIME_DIR` ([`crate::userdir::runtime_dir`]).
    pub fn xdg_runtime_dir(&self) -> Option<&OsStr> {
        self.get_os(HostVar::XdgRuntimeDir)
    }

    /// The user's configuration directory: `$XDG_CONFIG_HOME` if set and not empty, else
    /// `$HOME/.config`.
    pub fn user_config_dir(&self) -> Option<PathBuf> {
        self.get_os(HostVar::XdgConfigHome)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                self.get_os(HostVar::Home)
                    .map(|h| Path::new(h).join(".config"))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EnvVar;

    #[test]
    fn keeps_only_what_is_read() {
        let e = Environment::from_vars([
            ("PATH", "/bin"),
            ("SW_POOL_SPREAD", "0"),
            ("LD_PRELOAD", "/evil.so"),
            ("SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_pool", "a/1"),
        ]);
        assert_eq!(e.path_var(), Some(OsStr::new("/bin")));
        assert_eq!(e.get(EnvVar::Spread).as_deref(), Some("0"));
        assert_eq!(e.var("LD_PRELOAD"), None);
        assert_eq!(
            e.names_with_prefix("SLURM_SPANK__").collect::<Vec<_>>(),
            ["SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_pool"]
        );
    }

    #[test]
    fn values_as_std_env_gives_them() {
        use std::os::unix::ffi::OsStringExt;
        let e = Environment::default()
            .with(EnvVar::FakeNodes, "1")
            .with(EnvVar::BenchNoVerify, "yes")
            .with(EnvVar::Shell, "")
            .with(EnvVar::Log, OsString::from_vec(vec![0xff]));
        assert!(e.is_one(EnvVar::FakeNodes) && !e.is_one(EnvVar::BenchNoVerify));
        assert_eq!(e.get(EnvVar::Shell).as_deref(), Some(""));
        assert_eq!(e.get_nonempty(EnvVar::Shell), None);
        assert_eq!(e.get(EnvVar::Log), None, "not UTF-8");
        assert!(e.get_os(EnvVar::Log).is_some());
    }

    #[test]
    fn user_config_dir() {
        let e = Environment::default().with(HostVar::Home, "/home/u");
        assert_eq!(e.user_config_dir(), Some(PathBuf::from("/home/u/.config")));
        let e = e.with(HostVar::XdgConfigHome, "");
        assert_eq!(e.user_config_dir(), Some(PathBuf::from("/home/u/.config")));
        let e = e.with(HostVar::XdgConfigHome, "/x");
        assert_eq!(e.user_config_dir(), Some(PathBuf::from("/x")));
        assert_eq!(Environment::default().user_config_dir(), None);
    }
}
