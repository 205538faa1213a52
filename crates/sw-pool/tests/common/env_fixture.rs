//! The environments' fixture: a scratch directory with a usable FUSE device node and a layer
//! store owned by nobody; `sw-pool` run as nobody in a mount namespace of the test's own where
//! that node is bound over `/dev/fuse` (the machine itself is never changed).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

pub const NOBODY: u32 = 65534;

/// A scratch directory with a usable FUSE device node and a layer store owned by nobody.
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = scratch();
        let node = dir.path().join("fuse");
        let ok = Command::new("mknod")
            .arg("-m")
            .arg("666")
            .arg(&node)
            .args(["c", "10", "229"])
            .status()
            .unwrap()
            .success();
        assert!(ok, "mknod");
        for d in ["layers", "state"] {
            let p = dir.path().join(d);
            std::fs::create_dir(&p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        Fixture { dir }
    }

    pub fn layers(&self) -> PathBuf {
        self.dir.path().join("layers")
    }

    /// `sw-pool ARGS` as nobody, with the private /dev/fuse and this fixture's layer store.
    pub fn cmd(&self, args: &[&str]) -> Command {
        self.cmd_of(bin().as_os_str(), args)
    }

    /// `PROG ARGS` (an MPI launcher, say) as nobody, as [`Fixture::cmd`] runs sw-pool.
    pub fn cmd_of(&self, prog: &std::ffi::OsStr, args: &[&str]) -> Command {
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "--", "sh", "-c"])
            .arg(r#"mount --bind "$1" /dev/fuse && shift && exec setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@""#)
            .arg("sh")
            .arg(self.dir.path().join("fuse"))
            .arg(prog)
            .args(args)
            .env("SW_POOL_SYSTEM_CONFIG", "")
            .env("SW_POOL_USER_CONFIG", "")
            .env("SW_POOL_LAYER_DIR", self.layers())
            .env("SW_POOL_STATE_DIR", self.dir.path().join("state"))
            .env_remove("SLURM_JOB_ID")
            .env_remove("SLURM_STEP_ID")
            .env("HOME", "/nonexistent")
            .current_dir("/");
        c
    }

    pub fn run(&self, args: &[&str]) -> Out {
        run(&mut self.cmd(args))
    }
}

pub fn have_fuse_overlayfs() -> bool {
    ["/usr/bin/fuse-overlayfs", "/bin/fuse-overlayfs"]
        .iter()
        .any(|p| Path::new(p).exists())
}

pub fn ready() -> bool {
    if !is_root() {
        skip("needs root to give the test user a private /dev/fuse; run the suite as root");
        return false;
    }
    if !have_fuse_overlayfs() {
        skip("fuse-overlayfs is not installed (tools/setup-deps.sh installs it)");
        return false;
    }
    true
}
