//! The fixture of the mount tests (`tests/mount*.rs`): a scratch directory with its own state
//! directory that unmounts whatever is still mounted under it on drop, and helpers.

use super::*;

use std::path::{Path, PathBuf};
use std::process::Command;

pub const LMOD_INIT: &str = "/usr/share/lmod/lmod/init/bash";

/// A scratch directory with its own state directory; on drop, unmounts whatever is still mounted
/// under it (by mount point, with fusermount3 -u -z) so a failing test leaves nothing behind.
pub struct T {
    pub d: tempfile::TempDir,
}

impl T {
    pub fn new() -> T {
        let t = T { d: scratch() };
        std::fs::create_dir(t.state()).unwrap();
        std::fs::set_permissions(
            t.state(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        t
    }
    pub fn p(&self, rel: &str) -> PathBuf {
        self.d.path().join(rel)
    }
    pub fn s(&self, rel: &str) -> String {
        self.p(rel).to_string_lossy().into_owned()
    }
    pub fn state(&self) -> PathBuf {
        self.d.path().join("state")
    }
    pub fn sw(&self) -> Command {
        let mut c = sw();
        c.env("SW_POOL_STATE_DIR", self.state())
            .env("SW_POOL_CACHE", self.d.path())
            // the tests read `load`'s shell code themselves (else it refuses a pipe no shell reads)
            .env("SW_POOL_SHELL_FUNCTION", "1")
            .env_remove("SLURM_JOB_ID");
        c
    }
    pub fn run(&self, args: &[&str]) -> Out {
        run(self.sw().args(args))
    }
    pub fn ok(&self, args: &[&str]) -> Out {
        let o = self.run(args);
        assert_eq!(o.code, 0, "sw-pool {args:?}: {}{}", o.stdout, o.stderr);
        o
    }
    pub fn mkdir(&self, rel: &str) -> String {
        std::fs::create_dir_all(self.p(rel)).unwrap();
        self.s(rel)
    }
    /// Mount points under this test's directory, from the kernel's table.
    pub fn mounts(&self) -> Vec<String> {
        let root = std::fs::canonicalize(self.d.path()).unwrap();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(String::from))
            .filter(|m| Path::new(m).starts_with(&root))
            .collect()
    }
    pub fn records(&self) -> usize {
        std::fs::read_dir(self.state().join("mounts"))
            .map(|r| r.count())
            .unwrap_or(0)
    }
    pub fn assert_clean(&self) {
        assert!(
            self.mounts().is_empty(),
            "left mounted: {:?}",
            self.mounts()
        );
        assert_eq!(
            self.records(),
            0,
            "records or logs left in {}",
            self.state().display()
        );
    }
    pub fn list_json(&self) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["list", "--json"]).stdout).unwrap()
    }
}

impl Drop for T {
    fn drop(&mut self) {
        for m in self.mounts().into_iter().rev() {
            let _ = Command::new("fusermount3").args(["-u", "-z", &m]).status();
        }
    }
}

pub fn pool(t: &T, format: &str) -> String {
    let tree = t.p("tree");
    if !tree.exists() {
        sample_tree(&tree);
    }
    let out = t.s(&format!("demo-1.0.{format}"));
    let o = sw_run(&[
        "build",
        "-q",
        "--gen-modulefiles",
        &out,
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    out
}

pub fn mountinfo_line(mp: &str) -> String {
    let mp = std::fs::canonicalize(mp).unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
        .unwrap_or_default()
        .to_string()
}

pub fn pid_alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

pub fn mount_and_check(t: &T, image: &str, helper: &str, label: &str) {
    let mp = t.mkdir("mnt");
    let o = t.ok(&["mount", "--json", image, &mp]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let pid = v["record"]["helper_pid"].as_u64().unwrap();
    assert!(pid_alive(pid));
    assert_eq!(v["record"]["backend"], helper);
    let line = mountinfo_line(&mp);
    let kind = match helper {
        "fuse2fs" => "fuse.".to_string(),
        // `fuse.sw-pool sw-pool` through fusermount3, `fuse sw-pool` for root's own mount
        "sw_pool_tree" => " sw-pool ".to_string(),
        h => format!("fuse.{h}"),
    };
    assert!(line.contains(&kind), "{line}");
    for opt in ["nosuid", "nodev"] {
        assert!(
            line.split(' ').nth(5).unwrap().split(',').any(|o| o == opt),
            "{opt} missing: {line}"
        );
    }
    // the files are there, and nothing can be written
    let hello = Path::new(&mp).join("install/hello/1.0/bin/hello");
    assert!(std::fs::read_to_string(&hello)
        .unwrap()
        .contains("hello from"));
    let e = std::fs::write(Path::new(&mp).join("new"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc_erofs()), "{e}");
    // list shows it
    let l = t.ok(&["list"]).stdout;
    assert!(
        l.contains(label) && l.contains(&mp) && l.contains("ok"),
        "{l}"
    );
    // unmount: gone, helper gone, record gone
    let o = t.ok(&["umount", &mp]);
    assert!(o.stdout.contains("unmounted"), "{}", o.stdout);
    t.assert_clean();
    for _ in 0..100 {
        if !pid_alive(pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!pid_alive(pid), "helper {pid} still running after umount");
}

pub fn libc_erofs() -> i32 {
    30
}

/// `sw-pool mount IMG MP` as uid 65534 (no groups), with its own state directory.
pub fn mount_as_nobody(img: &str, mp: &str, state: &Path) -> Out {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["mount", img, mp])
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env("SW_POOL_STATE_DIR", state)
        .env("HOME", "/nonexistent");
    run(&mut c)
}

pub fn need_root() -> bool {
    if !is_root() {
        skip("the host's /dev/fuse is usable by root only; run the suite as root");
    }
    is_root()
}

/// Bytes that do not compress (xorshift): stored as they are, so they can be found in the image.
pub fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A read of `p` after its server died: it fails within 2 s, never hangs: EIO, ENOTCONN (the
/// kernel's answer once the connection is gone) or ECONNABORTED (a request the kernel had queued
/// when it noticed).
pub fn read_fails_at_once(p: &Path) {
    let start = std::time::Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    let p = p.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read(&p).map(|v| v.len()));
    });
    let r = rx
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("a read of a killed server's mount hung");
    let e = r.expect_err("a read of a killed server's mount succeeded");
    assert!(
        matches!(e.raw_os_error(), Some(5) | Some(103) | Some(107)),
        "EIO, ECONNABORTED or ENOTCONN, got {e}"
    );
    assert!(
        start.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// Drop the kernel's clean page cache, so that a server reads storage again (as root; else nothing).
pub fn drop_caches() {
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/sys/vm/drop_caches")
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"1"));
}
