//! Configuration, in one place.
//!
//! Precedence, highest first: command-line flags (applied by the binary), `SW_POOL_*` environment
//! variables, the user file (`$XDG_CONFIG_HOME/sw-pool/config.toml`, else `~/.config/sw-pool/config.toml`),
//! the system file (`/etc/sw-pool/config.toml`), built-in defaults. `SW_POOL_SYSTEM_CONFIG` and
//! `SW_POOL_USER_CONFIG` name other files (an empty value disables that file).
//!
//! | key | environment | default | meaning |
//! |---|---|---|---|
//! | `format` | `SW_POOL_FORMAT` | `squashfs` | image format when OUT's extension names none |
//! | `chunk_size` | `SW_POOL_CHUNK_SIZE` | `1MiB` | manifest chunk (and broadcast block) size |
//! | `squashfs_level` | `SW_POOL_SQUASHFS_LEVEL` | mksquashfs' default | zstd level for squashfs pools |
//! | `pool_path` | `SW_POOL_PATH` (`:`-separated) | none | directories searched for `name/version` |
//! | `cache_dir` | `SW_POOL_CACHE` | `$LOCAL_TMPDIR`, `$TMPDIR`, `/tmp` | node-local pool cache |
//! | `layer_dir` | `SW_POOL_LAYER_DIR` | `$XDG_DATA_HOME/sw-pool/layers`, `~/.local/share/sw-pool/layers` | a user's writable layers (`run`, `shell`, `layer`) |
//! | `mount_helper` | `SW_POOL_MOUNT_HELPER` | none | the site's `sw-pool-mount-helper` (through `sudo -n`) for site-signed pools |
//! | `shadow_root` | `SW_POOL_SHADOW_ROOT` | none | where the original software is (e.g. `/sw`): `install/<pkg>/<ver>` of a pool shadows `<shadow_root>/<pkg>/<ver>` (`run --shadow`, `mount --shadow`) |
//! | `mount_dir` | `SW_POOL_MOUNT` | `$XDG_RUNTIME_DIR/sw-pool/mnt` or `/run/sw-pool/mnt` | where pools are mounted |
//! | `fuse_reader` | `SW_POOL_FUSE_READER` | `sw-pool` | FUSE server of squashfs pools: `sw-pool` (`sw-pool-serve --tree`) or `squashfuse_ll` |
//! | `require_signature` | `SW_POOL_REQUIRE_SIGNATURE` | `false` | refuse unsigned pools |
//! | `cache_high_watermark` | `SW_POOL_CACHE_HIGH` | none | after a load, a cache above this is pruned … |
//! | `cache_low_watermark` | `SW_POOL_CACHE_LOW` | 80 % of high | … down to this (least recently used first) |
//!
//! Every other `SW_POOL_*` variable (options without a config key, state sw-pool writes into an
//! environment, benchmark and test switches) is listed in [`EnvVar`], and the other programs'
//! variables sw-pool reads (`PATH`, `HOME`, `SLURM_JOB_ID`, …) in [`HostVar`]. The process
//! environment is read once, into an [`Environment`] ([`Environment::capture`], the only read);
//! the library takes its values from that, passed down.

use std::path::{Path, PathBuf};

use serde::Deserialize;

mod environment;
mod reader;
mod vars;

pub use environment::Environment;
pub use reader::FuseReader;
pub use vars::{
    env_rows, is_read, EnvVar, HostVar, Var, VarKind, HOST_PREFIXES, SPANK_PREFIX, STEP_NAMES,
    STEP_PREFIXES,
};

use crate::image::ImageFormat;
use crate::pool::manifest::{DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE, MIN_CHUNK_SIZE};
use crate::size::parse_size;

pub const SYSTEM_CONFIG: &str = "/etc/sw-pool/config.toml";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source}", crate::exec::show(path))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {}: {reason}", crate::exec::show(path))]
    Parse { path: PathBuf, reason: String },
    #[error("environment variable {var}={value:?}: {reason}")]
    Env {
        var: &'static str,
        value: String,
        reason: String,
    },
}

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Default,
    File(PathBuf),
    Env(&'static str),
    Flag,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File(p) => write!(f, "{}", p.display()),
            Origin::Env(v) => write!(f, "${v}"),
            Origin::Flag => f.write_str("command line"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting<T> {
    pub value: T,
    pub origin: Origin,
}

impl<T> Setting<T> {
    fn default(value: T) -> Self {
        Setting {
            value,
            origin: Origin::Default,
        }
    }
    fn set(&mut self, value: T, origin: Origin) {
        *self = Setting { value, origin };
    }
    /// Apply a command-line flag, if given.
    pub fn flag(&mut self, v: Option<T>) {
        if let Some(v) = v {
            self.set(v, Origin::Flag);
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub format: Setting<ImageFormat>,
    pub chunk_size: Setting<u64>,
    pub squashfs_level: Setting<Option<u32>>,
    pub pool_path: Setting<Vec<PathBuf>>,
    pub cache_dir: Setting<Option<PathBuf>>,
    pub mount_dir: Setting<Option<PathBuf>>,
    pub layer_dir: Setting<Option<PathBuf>>,
    /// The site's privileged mount helper (`sw-pool-mount-helper`, run through `sudo -n`): `load`
    /// of a pool signed by a site key mounts it through the helper (one copy and one kernel mount
    /// per node, for every user) when set.
    pub mount_helper: Setting<Option<PathBuf>>,
    /// Where the site's original software is (`<shadow_root>/<pkg>/<ver>`, e.g. `/sw`): a pool's
    /// `install/<pkg>/<ver>` is mounted over it by `run --shadow` (privately) or the helper.
    pub shadow_root: Setting<Option<PathBuf>>,
    /// Which FUSE server reads squashfs pools mounted from a file (`squashfuse_ll`, or sw-pool's
    /// own tree server).
    pub fuse_reader: Setting<FuseReader>,
    pub require_signature: Setting<bool>,
    pub cache_high_watermark: Setting<Option<u64>>,
    pub cache_low_watermark: Setting<Option<u64>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    format: Option<String>,
    chunk_size: Option<toml::Value>,
    squashfs_level: Option<u32>,
    pool_path: Option<Vec<PathBuf>>,
    cache_dir: Option<PathBuf>,
    mount_dir: Option<PathBuf>,
    layer_dir: Option<PathBuf>,
    mount_helper: Option<PathBuf>,
    shadow_root: Option<PathBuf>,
    fuse_reader: Option<String>,
    require_signature: Option<bool>,
    cache_high_watermark: Option<String>,
    cache_low_watermark: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            format: Setting::default(ImageFormat::Squashfs),
            chunk_size: Setting::default(DEFAULT_CHUNK_SIZE),
            squashfs_level: Setting::default(None),
            pool_path: Setting::default(Vec::new()),
            cache_dir: Setting::default(None),
            mount_dir: Setting::default(None),
            layer_dir: Setting::default(None),
            mount_helper: Setting::default(None),
            shadow_root: Setting::default(None),
            fuse_reader: Setting::default(FuseReader::default()),
            require_signature: Setting::default(false),
            cache_high_watermark: Setting::default(None),
            cache_low_watermark: Setting::default(None),
        }
    }
}

fn check_chunk(n: u64) -> Result<u64, String> {
    if n.is_power_of_two() && (MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&n) {
        Ok(n)
    } else {
        Err(format!(
            "chunk size must be a power of two between 4KiB and 1GiB, not {n}"
        ))
    }
}

/// Parse a chunk size as users write it (`4MiB`, `1M`, `65536`).
/// A task the SPANK plugin's `--layer` started (it made the task's program `sw-pool` and put
/// `PID:PROGRAM` in `SW_POOL_SPANK_EXEC`, PID being the task's, which its exec keeps): the
/// arguments of `sw-pool run --layer LAYER -- PROGRAM ARGS...`, and `SW_POOL_SPANK_EXEC` removed
/// from this process's environment (the command and any `sw-pool` in it must not see it).
/// Otherwise (no such variable, or another process's: the TaskProlog runs with the task's
/// environment) `args` unchanged. Call first, single-threaded.
pub fn spank_task_args(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let Some(v) = std::env::var_os(EnvVar::SpankExec.name()) else {
        return args;
    };
    let b = v.as_bytes();
    let Some(colon) = b.iter().position(|c| *c == b':') else {
        return args;
    };
    if b[..colon] != *std::process::id().to_string().as_bytes() || colon + 1 == b.len() {
        return args;
    }
    let prog = std::ffi::OsString::from_vec(b[colon + 1..].to_vec());
    // SAFETY: called at the very start of `main`, before any other thread exists.
    unsafe { std::env::remove_var(EnvVar::SpankExec.name()) };
    let layer = std::env::var_os(EnvVar::SpankLayer.name()).unwrap_or_default();
    let mut out: Vec<std::ffi::OsString> = vec![
        "sw-pool".into(),
        "run".into(),
        "--layer".into(),
        layer,
        "--".into(),
        prog,
    ];
    out.extend(args.into_iter().skip(1));
    out
}

#[cfg(test)]
mod spank_tests {
    #[test]
    fn a_spank_task_becomes_run_layer_and_others_are_left_alone() {
        let var = super::EnvVar::SpankExec.name();
        let args = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        // SAFETY: this test is the only one touching these variables.
        unsafe {
            std::env::set_var(var, "1:/bin/true");
            std::env::set_var(super::EnvVar::SpankLayer.name(), "dev");
        }
        // another process's (the TaskProlog's view): unchanged, and the variable stays
        assert_eq!(super::spank_task_args(args(&["x", "a"])), args(&["x", "a"]));
        assert!(std::env::var_os(var).is_some());
        unsafe { std::env::set_var(var, format!("{}:/bin/prog", std::process::id())) };
        assert_eq!(
            super::spank_task_args(args(&["/usr/bin/sw-pool", "a", "b"])),
            args(&[
                "sw-pool",
                "run",
                "--layer",
                "dev",
                "--",
                "/bin/prog",
                "a",
                "b"
            ])
        );
        assert!(std::env::var_os(var).is_none(), "removed for the command");
        unsafe { std::env::remove_var(super::EnvVar::SpankLayer.name()) };
    }
}

pub fn parse_chunk_size(s: &str) -> Result<u64, String> {
    check_chunk(parse_size(s).map_err(|e| e.to_string())?)
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err("use true/false, yes/no, on/off or 1/0".into()),
    }
}

impl Config {
    /// Defaults, then the system file, the user file and the environment `env`.
    pub fn load(env: &Environment) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        for path in Self::files(env) {
            c.apply_file(&path)?;
        }
        c.apply_env(|k| env.var(k))?;
        Ok(c)
    }

    /// The config files read, lowest precedence first (only those that exist).
    pub fn files(env: &Environment) -> Vec<PathBuf> {
        let pick = |var: EnvVar, default: Option<PathBuf>| match env.get_os(var) {
            Some(v) if v.is_empty() => None,
            Some(v) => Some(PathBuf::from(v)),
            None => default,
        };
        let user_default = env.user_config_dir().map(|d| d.join("sw-pool/config.toml"));
        [
            pick(EnvVar::SystemConfig, Some(PathBuf::from(SYSTEM_CONFIG))),
            pick(EnvVar::UserConfig, user_default),
        ]
        .into_iter()
        .flatten()
        .filter(|p| p.exists())
        .collect()
    }

    pub fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.into(),
            source,
        })?;
        self.apply_toml(&text, path)
    }

    fn apply_toml(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let perr = |reason: String| ConfigError::Parse {
            path: path.into(),
            reason,
        };
        let f: FileConfig = toml::from_str(text).map_err(|e| perr(e.message().to_string()))?;
        let o = || Origin::File(path.into());
        if let Some(v) = f.format {
            self.format.set(
                v.parse()
                    .map_err(|e: String| perr(format!("format: {e}")))?,
                o(),
            );
        }
        if let Some(v) = f.chunk_size {
            let n = match v {
                toml::Value::Integer(i) if i > 0 => check_chunk(i as u64),
                toml::Value::String(s) => parse_chunk_size(&s),
                _ => Err("chunk_size must be a size like \"4MiB\" or a number of bytes".into()),
            }
            .map_err(|e| perr(format!("chunk_size: {e}")))?;
            self.chunk_size.set(n, o());
        }
        if let Some(v) = f.squashfs_level {
            self.squashfs_level.set(Some(v), o());
        }
        if let Some(v) = f.pool_path {
            self.pool_path.set(v, o());
        }
        if let Some(v) = f.cache_dir {
            self.cache_dir.set(Some(v), o());
        }
        if let Some(v) = f.mount_dir {
            self.mount_dir.set(Some(v), o());
        }
        if let Some(v) = f.layer_dir {
            self.layer_dir.set(Some(v), o());
        }
        if let Some(v) = f.mount_helper {
            self.mount_helper.set(Some(v), o());
        }
        if let Some(v) = f.shadow_root {
            self.shadow_root.set(Some(v), o());
        }
        if let Some(v) = f.fuse_reader {
            self.fuse_reader.set(
                v.parse()
                    .map_err(|e: String| perr(format!("fuse_reader: {e}")))?,
                o(),
            );
        }
        if let Some(v) = f.require_signature {
            self.require_signature.set(v, o());
        }
        if let Some(v) = f.cache_high_watermark {
            self.cache_high_watermark.set(
                Some(parse_size(&v).map_err(|e| perr(format!("cache_high_watermark: {e}")))?),
                o(),
            );
        }
        if let Some(v) = f.cache_low_watermark {
            self.cache_low_watermark.set(
                Some(parse_size(&v).map_err(|e| perr(format!("cache_low_watermark: {e}")))?),
                o(),
            );
        }
        Ok(())
    }

    /// Apply `SW_POOL_*` variables (`get` looks one up; tests pass a map).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        fn eerr(var: &'static str, value: &str, reason: String) -> ConfigError {
            ConfigError::Env {
                var,
                value: value.into(),
                reason,
            }
        }
        const F: &str = "SW_POOL_FORMAT";
        if let Some(v) = get(F) {
            self.format
                .set(v.parse().map_err(|e| eerr(F, &v, e))?, Origin::Env(F));
        }
        const C: &str = "SW_POOL_CHUNK_SIZE";
        if let Some(v) = get(C) {
            self.chunk_size.set(
                parse_chunk_size(&v).map_err(|e| eerr(C, &v, e))?,
                Origin::Env(C),
            );
        }
        const L: &str = "SW_POOL_SQUASHFS_LEVEL";
        if let Some(v) = get(L) {
            let n = v
                .parse::<u32>()
                .map_err(|_| eerr(L, &v, "not a number".into()))?;
            self.squashfs_level.set(Some(n), Origin::Env(L));
        }
        const P: &str = "SW_POOL_PATH";
        if let Some(v) = get(P) {
            let dirs = std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            self.pool_path.set(dirs, Origin::Env(P));
        }
        const CA: &str = "SW_POOL_CACHE";
        if let Some(v) = get(CA).filter(|v| !v.is_empty()) {
            self.cache_dir.set(Some(v.into()), Origin::Env(CA));
        }
        const LD: &str = "SW_POOL_LAYER_DIR";
        if let Some(v) = get(LD).filter(|v| !v.is_empty()) {
            self.layer_dir.set(Some(v.into()), Origin::Env(LD));
        }
        const M: &str = "SW_POOL_MOUNT";
        if let Some(v) = get(M).filter(|v| !v.is_empty()) {
            self.mount_dir.set(Some(v.into()), Origin::Env(M));
        }
        const MH: &str = "SW_POOL_MOUNT_HELPER";
        if let Some(v) = get(MH) {
            // empty: no helper (a test or a user turning the site's off)
            let v = (!v.is_empty()).then(|| PathBuf::from(v));
            self.mount_helper.set(v, Origin::Env(MH));
        }
        const SR: &str = "SW_POOL_SHADOW_ROOT";
        if let Some(v) = get(SR) {
            let v = (!v.is_empty()).then(|| PathBuf::from(v));
            self.shadow_root.set(v, Origin::Env(SR));
        }
        const FR: &str = "SW_POOL_FUSE_READER";
        if let Some(v) = get(FR).filter(|v| !v.is_empty()) {
            self.fuse_reader
                .set(v.parse().map_err(|e| eerr(FR, &v, e))?, Origin::Env(FR));
        }
        const R: &str = "SW_POOL_REQUIRE_SIGNATURE";
        if let Some(v) = get(R) {
            self.require_signature
                .set(parse_bool(&v).map_err(|e| eerr(R, &v, e))?, Origin::Env(R));
        }
        for (var, setting) in [
            ("SW_POOL_CACHE_HIGH", &mut self.cache_high_watermark),
            ("SW_POOL_CACHE_LOW", &mut self.cache_low_watermark),
        ] {
            if let Some(v) = get(var).filter(|v| !v.is_empty()) {
                let n = parse_size(&v).map_err(|e| eerr(var, &v, e.to_string()))?;
                setting.set(Some(n), Origin::Env(var));
            }
        }
        Ok(())
    }

    /// The size a cache above the high watermark is pruned to (`None`: no watermark configured).
    pub fn cache_prune_target(&self, total: u64) -> Option<u64> {
        let high = self.cache_high_watermark.value?;
        (total > high).then(|| {
            self.cache_low_watermark
                .value
                .unwrap_or(high / 10 * 8)
                .min(high)
        })
    }

    /// `(key, value, origin)` rows for `sw-pool config`.
    pub fn rows(&self) -> Vec<(&'static str, String, String)> {
        let paths = |v: &[PathBuf]| {
            v.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        };
        let opt = |v: &Option<PathBuf>, d: &str| {
            v.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| d.to_string())
        };
        vec![
            (
                "format",
                self.format.value.to_string(),
                self.format.origin.to_string(),
            ),
            (
                "chunk_size",
                self.chunk_size.value.to_string(),
                self.chunk_size.origin.to_string(),
            ),
            (
                "squashfs_level",
                self.squashfs_level
                    .value
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "(mksquashfs default)".into()),
                self.squashfs_level.origin.to_string(),
            ),
            (
                "pool_path",
                paths(&self.pool_path.value),
                self.pool_path.origin.to_string(),
            ),
            (
                "cache_dir",
                opt(&self.cache_dir.value, "($LOCAL_TMPDIR, $TMPDIR, /tmp)"),
                self.cache_dir.origin.to_string(),
            ),
            (
                "mount_dir",
                opt(&self.mount_dir.value, "(per-user runtime directory)"),
                self.mount_dir.origin.to_string(),
            ),
            (
                "layer_dir",
                opt(&self.layer_dir.value, "(~/.local/share/sw-pool/layers)"),
                self.layer_dir.origin.to_string(),
            ),
            (
                "mount_helper",
                opt(&self.mount_helper.value, "(none: FUSE mounts only)"),
                self.mount_helper.origin.to_string(),
            ),
            (
                "shadow_root",
                opt(&self.shadow_root.value, "(none: no shadow mounts)"),
                self.shadow_root.origin.to_string(),
            ),
            (
                "fuse_reader",
                self.fuse_reader.value.to_string(),
                self.fuse_reader.origin.to_string(),
            ),
            (
                "require_signature",
                self.require_signature.value.to_string(),
                self.require_signature.origin.to_string(),
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn precedence() {
        let mut c = Config::default();
        c.apply_toml(
            "format = \"ext4\"\nchunk_size = \"1MiB\"\n",
            Path::new("/etc/x.toml"),
        )
        .unwrap();
        c.apply_toml("chunk_size = 65536\n", Path::new("/home/u/x.toml"))
            .unwrap();
        assert_eq!(c.format.value, ImageFormat::Ext4);
        assert_eq!(c.chunk_size.value, 65536);
        assert_eq!(c.chunk_size.origin, Origin::File("/home/u/x.toml".into()));
        let env: HashMap<&str, &str> =
            [("SW_POOL_CHUNK_SIZE", "2M"), ("SW_POOL_PATH", "/a::/b")].into();
        c.apply_env(|k| env.get(k).map(|s| s.to_string())).unwrap();
        assert_eq!(c.chunk_size.value, 2 << 20);
        assert_eq!(
            c.pool_path.value,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        c.chunk_size.flag(Some(8192));
        assert_eq!(
            (c.chunk_size.value, c.chunk_size.origin.clone()),
            (8192, Origin::Flag)
        );
    }

    #[test]
    fn errors_name_the_source() {
        let mut c = Config::default();
        let e = c
            .apply_toml("colour = 1\n", Path::new("/etc/sw-pool/config.toml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc/sw-pool/config.toml") && e.contains("colour"),
            "{e}"
        );
        let e = c
            .apply_toml("chunk_size = \"3000\"\n", Path::new("/c"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("power of two"), "{e}");
        let e = c
            .apply_env(|k| (k == "SW_POOL_REQUIRE_SIGNATURE").then(|| "maybe".into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("SW_POOL_REQUIRE_SIGNATURE"), "{e}");
    }

    #[test]
    fn fuse_reader_from_file_and_environment() {
        use FuseReader;
        let mut c = Config::default();
        assert_eq!(c.fuse_reader.value, FuseReader::SwPool, "the default");
        c.apply_toml(
            "fuse_reader = \"squashfuse_ll\"\n",
            Path::new("/etc/c.toml"),
        )
        .unwrap();
        assert_eq!(c.fuse_reader.value, FuseReader::SquashfuseLl);
        let row = c.rows().into_iter().find(|r| r.0 == "fuse_reader").unwrap();
        assert_eq!(
            (row.1.as_str(), row.2.as_str()),
            ("squashfuse_ll", "/etc/c.toml")
        );
        c.apply_env(|k| (k == "SW_POOL_FUSE_READER").then(|| "sw-pool".into()))
            .unwrap();
        assert_eq!(
            (c.fuse_reader.value, c.fuse_reader.origin.clone()),
            (FuseReader::SwPool, Origin::Env("SW_POOL_FUSE_READER"))
        );
        let e = c
            .apply_toml("fuse_reader = \"fuse2fs\"\n", Path::new("/c"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fuse_reader") && e.contains("squashfuse_ll"),
            "{e}"
        );
    }
}
