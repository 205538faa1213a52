//! `--root` without the site's helper: what a one-uid mapping breaks, and what the layer is given
//! so that package managers work anyway (measured: kernel-facts.md, rootless `apt-get install`).
//!
//! Inside, uid 0 is the user; the host's root-only files stay unreadable (fuse-overlayfs runs as
//! the user and can neither read nor copy them up). The package managers' lock files are such
//! files, and they are empty: an empty file of the same mode in the layer's upper stands in for
//! each one without losing anything ([`seed`]). apt also drops privileges to its `_apt` user for
//! downloads, a uid the namespace does not map: the layer gets `APT::Sandbox::User "root";`.
//! Root-only files with content (`/etc/shadow`, debconf's `passwords.dat`) stay unreadable; the
//! help of `shell --root` says so.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Directories whose unreadable empty files get a stand-in.
const LOCK_DIRS: &[&str] = &[
    "var/lib/dpkg",
    "var/lib/dpkg/triggers",
    "var/lib/dpkg/updates",
    "var/cache/apt/archives",
    "var/cache/apt/archives/partial",
    "var/lib/apt/lists",
    "var/lib/apt/lists/partial",
];

/// The apt setting the layer gets (only where the host has apt).
const APT_CONF: &str = "etc/apt/apt.conf.d/00sw-pool-root";

/// Give `upper` (the layer's) a stand-in for each unreadable empty file of [`LOCK_DIRS`] on the
/// host and, where the host has apt, the sandbox setting. Best effort: what cannot be made is
/// logged and left (the package manager then says what it could not open).
pub fn seed(upper: &Path) {
    for d in LOCK_DIRS {
        let host = Path::new("/").join(d);
        let Ok(rd) = fs::read_dir(&host) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if !m.is_file() || m.len() != 0 || readable(&e.path()) {
                continue;
            }
            let dir = upper.join(d);
            let target = dir.join(e.file_name());
            if target.symlink_metadata().is_ok() {
                continue; // the layer has its own already
            }
            let made = make_dirs(upper, d).and_then(|()| {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(m.mode() & 0o7777)
                    .open(&target)
                    .map(drop)
            });
            if let Err(x) = made {
                tracing::debug!(
                    "no stand-in for {}: {x}",
                    host.join(e.file_name()).display()
                );
            }
        }
    }
    if Path::new("/etc/apt/apt.conf.d").is_dir() {
        let target = upper.join(APT_CONF);
        if target.symlink_metadata().is_err() {
            let made = make_dirs(upper, "etc/apt/apt.conf.d").and_then(|()| {
                fs::write(
                    &target,
                    "// sw-pool --root: apt's _apt user is not mapped in the environment\nAPT::Sandbox::User \"root\";\n",
                )
            });
            if let Err(x) = made {
                tracing::debug!("cannot write {}: {x}", target.display());
            }
        }
    }
}

fn readable(p: &Path) -> bool {
    rustix::fs::access(p, rustix::fs::Access::READ_OK).is_ok()
}

/// `upper/rel` and its parents, each with the host's mode for that directory (an overlay upper's
/// directories show their own modes).
fn make_dirs(upper: &Path, rel: &str) -> std::io::Result<()> {
    let mut cur = upper.to_path_buf();
    let mut host = Path::new("/").to_path_buf();
    for c in Path::new(rel).components() {
        cur.push(c);
        host.push(c);
        if cur.is_dir() {
            continue;
        }
        let mode = fs::metadata(&host)
            .map(|m| m.mode() & 0o7777)
            .unwrap_or(0o755);
        match fs::DirBuilder::new().mode(mode).create(&cur) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As root every file is readable: nothing to stand in for; the apt setting still comes.
    #[test]
    fn seeds_the_apt_setting_and_no_readable_file() {
        let t = tempfile::tempdir().unwrap();
        seed(t.path());
        if Path::new("/etc/apt/apt.conf.d").is_dir() {
            let c = fs::read_to_string(t.path().join(APT_CONF)).unwrap();
            assert!(c.contains("APT::Sandbox::User \"root\";"));
        }
        for d in LOCK_DIRS {
            if let Ok(rd) = fs::read_dir(t.path().join(d)) {
                for e in rd.flatten() {
                    let host = Path::new("/").join(d).join(e.file_name());
                    assert!(
                        !readable(&host),
                        "{} is readable: no stand-in needed",
                        host.display()
                    );
                }
            }
        }
    }
}
