//! Gather the [`Facts`] [`crate::plan::choose`] decides from: each check names the sysctl, device
//! permission or package that is missing.

use std::ffi::OsStr;
use std::path::Path;

use crate::plan::Facts;
use swpool_sys::exec::Tool;

/// Look at this node (cheap: a few reads and one `access`); what only a layer needs (FUSE,
/// fuse-overlayfs) only when `layer`, what only `--base` needs (FUSE, squashfuse_ll) only when
/// `base`, and what `--pool` needs (FUSE; squashfuse_ll for a squashfs pool) only for `pools`.
pub fn facts(
    path_var: Option<&OsStr>,
    layer: bool,
    base: bool,
    pools: &[crate::pools::EnvPool],
    helper: Option<&Path>,
) -> Facts {
    let squashfs_pool = pools.iter().any(|p| !p.ext && p.view.is_none());
    Facts {
        userns_blocked: userns_blocked(),
        dev_fuse_blocked: (layer || base || !pools.is_empty())
            .then(|| dev_fuse_blocked(Path::new("/dev/fuse")))
            .flatten(),
        fuse_overlayfs: layer
            .then(|| Tool::FuseOverlayfs.locate(path_var).ok())
            .flatten(),
        helper_idmap: layer && helper.is_some_and(|h| h.is_file()),
        copy_has_whiteouts: false,
        squashfuse: (base || squashfs_pool)
            .then(|| Tool::SquashfuseLl.locate(path_var).ok())
            .flatten(),
        // the launcher's request says (it knows the config)
        tree_server: false,
    }
}

fn read_num(p: &str) -> Option<i64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Why unprivileged user namespaces are not available, if they are not.
pub fn userns_blocked() -> Option<String> {
    if !Path::new("/proc/self/ns/user").exists() {
        return Some(
            "this kernel has no user namespaces (CONFIG_USER_NS): environments need them".into(),
        );
    }
    if read_num("/proc/sys/user/max_user_namespaces") == Some(0) {
        return Some(
            "user namespaces are disabled (sysctl user.max_user_namespaces = 0): ask the admin to \
             set it above 0 (e.g. `sysctl -w user.max_user_namespaces=65536`)"
                .into(),
        );
    }
    if read_num("/proc/sys/kernel/unprivileged_userns_clone") == Some(0) {
        return Some(
            "unprivileged user namespaces are disabled (sysctl kernel.unprivileged_userns_clone = \
             0): ask the admin to set it to 1"
                .into(),
        );
    }
    if read_num("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        return Some(
            "AppArmor restricts unprivileged user namespaces (sysctl \
             kernel.apparmor_restrict_unprivileged_userns = 1): ask the admin for a profile for \
             sw-pool or to set it to 0"
                .into(),
        );
    }
    None
}

/// Why this user cannot use `dev` (normally `/dev/fuse`) read-write, if not.
pub fn dev_fuse_blocked(dev: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = match std::fs::metadata(dev) {
        Ok(m) => m,
        Err(e) => {
            return Some(format!(
                "{} is missing ({e}): the kernel needs FUSE (CONFIG_FUSE_FS) and the node a \
                 device node for it",
                dev.display()
            ))
        }
    };
    match rustix::fs::access(
        dev,
        rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
    ) {
        Ok(()) => None,
        Err(_) => Some(format!(
            "{} is not usable by uid {} (mode {:o}, owner uid {}): the admin makes it 0666, as \
             udev does on most systems (`chmod 0666 {}`)",
            dev.display(),
            rustix::process::getuid().as_raw(),
            m.mode() & 0o7777,
            m.uid(),
            dev.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_device_is_named() {
        let why = dev_fuse_blocked(Path::new("/nonexistent/fuse")).unwrap();
        assert!(why.contains("/nonexistent/fuse is missing"), "{why}");
    }
}
