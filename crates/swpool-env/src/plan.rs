//! What an environment will be made of, decided from what the node offers ([`Facts`], gathered by
//! [`crate::probe`]): pure logic, unit-tested.
//!
//! Measured on the kernels sw-pool runs on (`docs/architecture.md`, "Environments"):
//! - the kernel's overlay, mounted in a user's namespace over the host's root-owned `/usr`, mounts
//!   but fails every write (copy-up must create files owned by uid 0, which the namespace cannot
//!   map): without privileges it is only usable over lowers the user's namespace maps;
//! - `fuse-overlayfs -o squash_to_root` works over the host's tree rootless (create, modify, rm,
//!   rename), at a cost on cold reads and many small writes, and cannot read root-only files
//!   (0600/0640);
//! - a site's privileged helper can give the kernel's overlay idmapped lowers (full speed):
//!   [`Method::KernelOverlay`] is chosen when the site configured one ([`crate::idmap`]); if it
//!   refuses, the environment takes the rootless path and says why.

use std::path::{Path, PathBuf};

use crate::EnvError;

/// How the environment's root is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Method {
    /// No layer: new namespaces and `/proc` only; the host's tree as it is (writes go where they
    /// would go outside).
    Plain,
    /// Rootless: `fuse-overlayfs` with the host's `/` as the lower and the layer as the upper, every
    /// lower file shown as the namespace's root (the user).
    FuseOverlay,
    /// The kernel's overlay over idmapped lowers made by the site's helper.
    KernelOverlay,
    /// `--base` without a layer: the base pools (mounted in the environment) as its read-only
    /// root.
    Base,
    /// `--base` with a layer: the kernel's overlay over the base pools, rootless (squashfuse
    /// mounts them inside the environment, where their root-owned files are its root's).
    BaseOverlay,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Plain => "namespaces only (no layer)",
            Method::FuseOverlay => "rootless: fuse-overlayfs over the host's tree",
            Method::KernelOverlay => "kernel overlay over idmapped lowers (site helper)",
            Method::Base => "the base pool as a read-only root (no layer)",
            Method::BaseOverlay => "rootless kernel overlay over the base pool",
        }
    }
}

/// What the node offers, as [`crate::probe`] found it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Facts {
    /// `None` when unprivileged user namespaces are allowed; else why not and what to change.
    pub userns_blocked: Option<String>,
    /// `None` when this user can open `/dev/fuse` read-write; else why not.
    pub dev_fuse_blocked: Option<String>,
    /// Where `fuse-overlayfs` is, if installed.
    pub fuse_overlayfs: Option<PathBuf>,
    /// The site's helper is configured (it may offer idmapped lowers: asked at the start).
    pub helper_idmap: bool,
    /// The job's copy of the layer holds deletions (`.wh.NAME`), which only fuse-overlayfs reads.
    pub copy_has_whiteouts: bool,
    /// Where `squashfuse_ll` is, if installed (looked for only with `--base` or a squashfs `--pool`).
    pub squashfuse: Option<PathBuf>,
    /// sw-pool's tree server is there and picked (it mounts squashfs pools; squashfuse_ll is then
    /// only the fallback).
    pub tree_server: bool,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub method: Method,
    /// Why this method (for `-v`).
    pub why: String,
}

/// Choose how to make the environment (`base`: `--base` pools were given).
pub fn choose(layer: bool, base: bool, facts: &Facts) -> Result<Plan, EnvError> {
    if let Some(why) = &facts.userns_blocked {
        return Err(EnvError::Unsupported(why.clone()));
    }
    if base {
        return choose_base(layer, facts);
    }
    if !layer {
        return Ok(Plan {
            method: Method::Plain,
            why: "no --layer: new user, mount and PID namespaces over the host's tree".into(),
        });
    }
    if facts.helper_idmap && !facts.copy_has_whiteouts {
        return Ok(Plan {
            method: Method::KernelOverlay,
            why: "the site's helper makes idmapped lowers: the kernel's overlay, at full speed"
                .into(),
        });
    }
    if let Some(why) = &facts.dev_fuse_blocked {
        return Err(EnvError::Unsupported(format!(
            "a writable layer without the site's helper needs FUSE, but {why}"
        )));
    }
    match &facts.fuse_overlayfs {
        Some(p) if facts.helper_idmap => Ok(Plan {
            method: Method::FuseOverlay,
            why: format!(
                "the job's copy of the layer deletes files (whiteouts in the .wh.NAME form), which \
                 only fuse-overlayfs reads: rootless {}",
                p.display()
            ),
        }),
        Some(p) => Ok(Plan {
            method: Method::FuseOverlay,
            why: format!(
                "no site helper for idmapped lowers, and the kernel's overlay cannot write over the \
                 host's root-owned tree without one: rootless {}",
                p.display()
            ),
        }),
        None => Err(EnvError::Unsupported(
            "a writable layer without the site's helper needs fuse-overlayfs, which is not \
             installed: install the Debian package fuse-overlayfs (or ask the site to install \
             sw-pool's helper)"
                .into(),
        )),
    }
}

/// With `--base`: the pools are mounted by FUSE inside the environment (sw-pool's tree server,
/// else squashfuse_ll), so FUSE must be usable; with a layer the kernel's overlay goes over them rootless (their files are the
/// environment's root's), unless the job's copy holds `.wh.NAME` deletions (fuse-overlayfs).
fn choose_base(layer: bool, facts: &Facts) -> Result<Plan, EnvError> {
    if let Some(why) = &facts.dev_fuse_blocked {
        return Err(EnvError::Unsupported(format!(
            "--base mounts the pool inside the environment with FUSE, but {why}"
        )));
    }
    if facts.squashfuse.is_none() && !facts.tree_server {
        return Err(EnvError::Unsupported(
            "--base mounts the pool inside the environment with squashfuse_ll, which is not \
             installed: install the Debian package squashfuse"
                .into(),
        ));
    }
    if !layer {
        return Ok(Plan {
            method: Method::Base,
            why: "--base without --layer: the base pool, mounted inside the environment, is its \
                  read-only root"
                .into(),
        });
    }
    if !facts.copy_has_whiteouts {
        return Ok(Plan {
            method: Method::BaseOverlay,
            why: "--base: the pool is mounted inside the environment, where its root-owned files \
                  are the environment's root's, so the kernel's overlay writes over it without \
                  privileges, at full speed"
                .into(),
        });
    }
    match &facts.fuse_overlayfs {
        Some(p) => Ok(Plan {
            method: Method::FuseOverlay,
            why: format!(
                "--base, and the job's copy of the layer deletes files (whiteouts in the .wh.NAME \
                 form), which only fuse-overlayfs reads: rootless {} over the base pool",
                p.display()
            ),
        }),
        None => Err(EnvError::Unsupported(
            "the job's copy of the layer deletes files in the .wh.NAME form, which only \
             fuse-overlayfs reads, and it is not installed: install the Debian package \
             fuse-overlayfs"
                .into(),
        )),
    }
}

/// The host's directories that stay the host's in an environment with a layer, mount points or
/// not: scratch space shared with the job and other processes, and the runtime directory (sockets).
/// The user's `$HOME` is added by the caller.
pub const HOST_DIRS: &[&str] = &["/tmp", "/var/tmp", "/run"];

/// The host's mounts to bind into the new root: the top-most of the mount points below `/` and
/// the `keep` directories (a bind is recursive, so mounts below them come along), except `/proc`
/// (the environment gets its own) and anything at or below `exclude` (the layer's merged
/// directory).
pub fn binds(mount_points: &[PathBuf], keep: &[PathBuf], exclude: &Path) -> Vec<PathBuf> {
    let mut v: Vec<&PathBuf> = mount_points
        .iter()
        .chain(keep.iter())
        .filter(|p| p.is_absolute() && p.as_path() != Path::new("/"))
        .filter(|p| !p.starts_with("/proc") && !p.starts_with(exclude))
        .collect();
    v.sort();
    v.dedup();
    let mut out: Vec<PathBuf> = Vec::new();
    for p in v {
        if !out.iter().any(|q| p.starts_with(q)) {
            out.push(p.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            fuse_overlayfs: Some("/usr/bin/fuse-overlayfs".into()),
            ..Facts::default()
        }
    }

    #[test]
    fn no_layer_is_plain() {
        let mut f = facts();
        f.fuse_overlayfs = None;
        f.dev_fuse_blocked = Some("x".into());
        assert_eq!(choose(false, false, &f).unwrap().method, Method::Plain);
    }

    #[test]
    fn layer_rootless_is_fuse_overlayfs() {
        assert_eq!(
            choose(true, false, &facts()).unwrap().method,
            Method::FuseOverlay
        );
    }

    #[test]
    fn helper_wins() {
        let mut f = facts();
        f.helper_idmap = true;
        f.dev_fuse_blocked = Some("no".into());
        assert_eq!(
            choose(true, false, &f).unwrap().method,
            Method::KernelOverlay
        );
    }

    #[test]
    fn whiteouts_in_the_copy_take_the_rootless_path() {
        let mut f = facts();
        f.helper_idmap = true;
        f.copy_has_whiteouts = true;
        let p = choose(true, false, &f).unwrap();
        assert_eq!(p.method, Method::FuseOverlay);
        assert!(p.why.contains(".wh.NAME"), "{}", p.why);
    }

    #[test]
    fn a_base_is_the_root_or_the_kernel_overlays_lower() {
        let mut f = facts();
        f.squashfuse = Some("/usr/bin/squashfuse_ll".into());
        f.helper_idmap = true; // no helper needed: the base's files are the namespace's
        assert_eq!(choose(false, true, &f).unwrap().method, Method::Base);
        assert_eq!(choose(true, true, &f).unwrap().method, Method::BaseOverlay);
        f.copy_has_whiteouts = true;
        assert_eq!(choose(true, true, &f).unwrap().method, Method::FuseOverlay);
        f.fuse_overlayfs = None;
        let e = choose(true, true, &f).unwrap_err().to_string();
        assert!(e.contains("package fuse-overlayfs"), "{e}");
        f.squashfuse = None;
        let e = choose(false, true, &f).unwrap_err().to_string();
        assert!(e.contains("package squashfuse"), "{e}");
        // sw-pool's tree server alone is enough
        f.tree_server = true;
        assert_eq!(choose(false, true, &f).unwrap().method, Method::Base);
        f.tree_server = false;
        f.dev_fuse_blocked = Some("/dev/fuse is mode 0600".into());
        let e = choose(false, true, &f).unwrap_err().to_string();
        assert!(e.contains("--base") && e.contains("0600"), "{e}");
    }

    #[test]
    fn what_is_missing_is_named() {
        let mut f = facts();
        f.fuse_overlayfs = None;
        let e = choose(true, false, &f).unwrap_err().to_string();
        assert!(
            e.contains("install the Debian package fuse-overlayfs"),
            "{e}"
        );
        let mut f = facts();
        f.dev_fuse_blocked = Some("/dev/fuse is mode 0600".into());
        let e = choose(true, false, &f).unwrap_err().to_string();
        assert!(e.contains("/dev/fuse is mode 0600"), "{e}");
        let mut f = facts();
        f.userns_blocked = Some("user.max_user_namespaces is 0".into());
        let e = choose(false, false, &f).unwrap_err().to_string();
        assert!(e.contains("max_user_namespaces"), "{e}");
    }

    #[test]
    fn binds_are_top_level_and_skip_proc_and_the_layer() {
        let mp: Vec<PathBuf> = [
            "/",
            "/proc",
            "/proc/sys/fs/binfmt_misc",
            "/dev",
            "/dev/pts",
            "/dev/shm",
            "/sys",
            "/home",
            "/home/u/layers/dev/merged",
            "/tmp",
            "/tmp/sw-pool-1000/mnt/demo-1.0",
            "/dev",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        let keep: Vec<PathBuf> = ["/run", "/home/u", "/tmp"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let b = binds(&mp, &keep, Path::new("/home/u/layers/dev/merged"));
        let want: Vec<PathBuf> = ["/dev", "/home", "/run", "/sys", "/tmp"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(b, want);
        // a prefix that is not a path ancestor does not swallow a mount
        let mp: Vec<PathBuf> = ["/", "/data", "/data2"].iter().map(PathBuf::from).collect();
        assert_eq!(binds(&mp, &[], Path::new("/x")).len(), 2);
    }
}
