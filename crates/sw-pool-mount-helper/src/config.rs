//! `/etc/sw-pool/helper.toml`: what the helper may do on this node. The file must be a regular
//! file of root's that no one else can write (checked on the opened descriptor); without it the
//! helper refuses everything. Its path is fixed: nothing from the caller chooses it.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{HelperError, Refusal};

pub const CONFIG_PATH: &str = "/etc/sw-pool/helper.toml";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HelperConfig {
    /// Site pools are mounted once per node at `<pool_mount_root>/<NAME>/<VERSION>`.
    #[serde(default = "default_pool_mount_root")]
    pub pool_mount_root: PathBuf,
    /// The root-owned cache of verified site pools (one copy per node, whoever loads it).
    #[serde(default = "default_cache_dir")]
    pub cache_dir: PathBuf,
    /// The site's trusted keys: the only keys the helper accepts (never a user's own).
    #[serde(default = "default_trusted_keys")]
    pub trusted_keys: PathBuf,
    /// A user's own images are mounted only under `<user_mount_root>/<username>/`.
    #[serde(default = "default_user_mount_root")]
    pub user_mount_root: PathBuf,
    /// Kernel mounts of users' own images at all (`false`: pools only).
    #[serde(default = "yes")]
    pub user_images: bool,
    /// Read-write kernel mounts of users' images.
    #[serde(default = "yes")]
    pub user_images_rw: bool,
    /// Programs may run from users' images (`noexec` otherwise); never setuid either way.
    #[serde(default)]
    pub user_images_exec: bool,
    /// Shadow mounts: a site pool's `install/<pkg>/<ver>` is bound over `<shadow_root>/<pkg>/<ver>`
    /// where that directory exists (the original software, e.g. under `/sw`). Unset: no shadows.
    #[serde(default)]
    pub shadow_root: Option<PathBuf>,
    /// Environments (`sw-pool run --layer`): the trees of which a user's environment gets a
    /// read-only idmapped view (`idmap`), so that its kernel overlay can write over them at full
    /// speed. **Every root-owned file in them becomes readable in the user's environment** (the
    /// user is their owner there): list trees without secrets (`/usr`, `/opt`), never `/etc`
    /// or `/` on a node with secrets in them. Empty: environments take the rootless path.
    #[serde(default)]
    pub environment_trees: Vec<PathBuf>,
    /// `SLURM_CONF` for `squeue` when Slurm's configuration is not at its default path.
    #[serde(default)]
    pub slurm_conf: Option<PathBuf>,
    /// Seconds a step on a file the caller named may take (opening it, `fstat`, one read of
    /// the copy of a site pool): a file system that does not answer (e.g. the caller's own stopped
    /// FUSE daemon) gets the request refused after this, never a helper that waits.
    #[serde(default = "default_file_timeout")]
    pub file_timeout_secs: f64,
    /// Seconds a tool may run on a caller's file (`e2fsck -fn` of an image) before it is killed
    /// and the request refused.
    #[serde(default = "default_tool_timeout")]
    pub tool_timeout_secs: f64,
    /// The most images one user may have mounted by the helper on this node at once (site pools
    /// do not count: each is mounted once for everyone).
    #[serde(default = "default_max_images")]
    pub max_images_per_user: usize,
}

fn default_pool_mount_root() -> PathBuf {
    "/run/sw-pool-site".into()
}
fn default_cache_dir() -> PathBuf {
    "/var/cache/sw-pool/site".into()
}
fn default_trusted_keys() -> PathBuf {
    "/etc/sw-pool/trusted-keys".into()
}
fn default_user_mount_root() -> PathBuf {
    "/run/sw-pool-user".into()
}
fn default_file_timeout() -> f64 {
    10.0
}
fn default_tool_timeout() -> f64 {
    300.0
}
fn default_max_images() -> usize {
    8
}
fn yes() -> bool {
    true
}

impl HelperConfig {
    pub fn file_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.file_timeout_secs)
    }
    pub fn tool_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.tool_timeout_secs)
    }

    /// A timeout that is no number of seconds in (0, 86400], or a cap of 0 images.
    fn bad_limit(&self) -> Option<String> {
        for (what, v) in [
            ("file_timeout_secs", self.file_timeout_secs),
            ("tool_timeout_secs", self.tool_timeout_secs),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= 86400.0) {
                return Some(format!(
                    "{what} = {v} must be a number of seconds above 0 and at most 86400"
                ));
            }
        }
        None
    }

    pub fn load() -> Result<HelperConfig, HelperError> {
        Self::load_from(Path::new(CONFIG_PATH))
    }

    pub fn load_from(path: &Path) -> Result<HelperConfig, HelperError> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| {
                HelperError::refused(Refusal::Config, format!(
                    "the mount helper is not configured on this node: {}: {e}; an admin writes it (see `sw-pool-mount-helper --help`)",
                    path.display()
                ))
            })?;
        let m = f.metadata().map_err(|e| HelperError::system(path, e))?;
        if !m.is_file() || m.uid() != 0 || m.mode() & 0o022 != 0 {
            return Err(HelperError::refused(Refusal::Config, format!(
                "{} must be a regular file of root's that only root can write (uid {}, mode {:o}); nothing was done",
                path.display(),
                m.uid(),
                m.mode() & 0o7777
            )));
        }
        let mut s = String::new();
        f.by_ref()
            .take(64 * 1024)
            .read_to_string(&mut s)
            .map_err(|e| HelperError::system(path, e))?;
        let c: HelperConfig = toml::from_str(&s).map_err(|e| {
            HelperError::refused(
                Refusal::Config,
                format!("{}: {}", path.display(), e.message()),
            )
        })?;
        for (what, p) in [
            ("pool_mount_root", &c.pool_mount_root),
            ("cache_dir", &c.cache_dir),
            ("trusted_keys", &c.trusted_keys),
            ("user_mount_root", &c.user_mount_root),
        ]
        .into_iter()
        .chain(c.shadow_root.as_ref().map(|p| ("shadow_root", p)))
        {
            if !swpool_sys::kmount::is_absolute_clean(p) || p == Path::new("/") {
                return Err(HelperError::refused(
                    Refusal::Config,
                    format!(
                        "{}: {what} = {} must be an absolute path without '.' or '..', and not /",
                        path.display(),
                        p.display()
                    ),
                ));
            }
        }
        if let Some(why) = c.bad_limit() {
            return Err(HelperError::refused(
                Refusal::Config,
                format!("{}: {why}", path.display()),
            ));
        }
        for t in &c.environment_trees {
            if !swpool_sys::kmount::is_absolute_clean(t) {
                return Err(HelperError::refused(
                    Refusal::Config,
                    format!(
                        "{}: environment_trees: {} must be an absolute path without '.' or '..'",
                        path.display(),
                        t.display()
                    ),
                ));
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let c: HelperConfig = toml::from_str("").unwrap();
        assert_eq!(c.pool_mount_root, Path::new("/run/sw-pool-site"));
        assert!(c.user_images && c.user_images_rw && !c.user_images_exec);
        assert_eq!(c.max_images_per_user, 8);
        assert_eq!(c.file_timeout().as_secs(), 10);
        assert_eq!(c.tool_timeout().as_secs(), 300);
        assert!(toml::from_str::<HelperConfig>("surprise = 1").is_err());
    }

    #[test]
    fn a_file_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("helper.toml");
        std::fs::write(&p, "user_images = false\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = HelperConfig::load_from(&p).unwrap_err().to_string();
        assert!(
            e.contains("only root can write") || e.contains("uid"),
            "{e}"
        );
        std::os::unix::fs::symlink(&p, d.path().join("link")).unwrap();
        assert!(HelperConfig::load_from(&d.path().join("link")).is_err());
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    #[test]
    fn timeouts_out_of_range_are_refused() {
        for bad in [
            "file_timeout_secs = 0",
            "tool_timeout_secs = -1",
            "file_timeout_secs = 1e9",
            "tool_timeout_secs = nan",
        ] {
            let c: HelperConfig = toml::from_str(bad).unwrap();
            let why = c.bad_limit().unwrap_or_default();
            assert!(
                why.contains("must be a number of seconds"),
                "{bad}: {why:?}"
            );
        }
        let c: HelperConfig =
            toml::from_str("file_timeout_secs = 0.5\nmax_images_per_user = 2").unwrap();
        assert_eq!(c.bad_limit(), None);
        assert_eq!(c.file_timeout().as_millis(), 500);
    }
}
