//! `sw-pool mount/umount/list/env` with the real FUSE helpers (squashfuse_ll, fuse2fs), the real
//! Lmod, as root and as an unprivileged user. Every test has its own state directory and scratch
//! directory and unmounts what it mounted, even when it fails (the `Guard`).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

const LMOD_INIT: &str = "/usr/share/lmod/lmod/init/bash";

/// A scratch directory with its own state directory; on drop, unmounts whatever is still mounted
/// under it (by mount point, with fusermount3 -u -z) so a failing test leaves nothing behind.
struct T {
    d: tempfile::TempDir,
}

impl T {
    fn new() -> T {
        let t = T { d: scratch() };
        std::fs::create_dir(t.state()).unwrap();
        std::fs::set_permissions(
            t.state(),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        t
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.d.path().join(rel)
    }
    fn s(&self, rel: &str) -> String {
        self.p(rel).to_string_lossy().into_owned()
    }
    fn state(&self) -> PathBuf {
        self.d.path().join("state")
    }
    fn sw(&self) -> Command {
        let mut c = sw();
        c.env("SW_POOL_STATE_DIR", self.state())
            .env("SW_POOL_CACHE", self.d.path())
            .env_remove("SLURM_JOB_ID");
        c
    }
    fn run(&self, args: &[&str]) -> Out {
        run(self.sw().args(args))
    }
    fn ok(&self, args: &[&str]) -> Out {
        let o = self.run(args);
        assert_eq!(o.code, 0, "sw-pool {args:?}: {}{}", o.stdout, o.stderr);
        o
    }
    fn mkdir(&self, rel: &str) -> String {
        std::fs::create_dir_all(self.p(rel)).unwrap();
        self.s(rel)
    }
    /// Mount points under this test's directory, from the kernel's table.
    fn mounts(&self) -> Vec<String> {
        let root = std::fs::canonicalize(self.d.path()).unwrap();
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(String::from))
            .filter(|m| Path::new(m).starts_with(&root))
            .collect()
    }
    fn records(&self) -> usize {
        std::fs::read_dir(self.state().join("mounts"))
            .map(|r| r.count())
            .unwrap_or(0)
    }
    fn assert_clean(&self) {
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
    fn list_json(&self) -> serde_json::Value {
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

fn pool(t: &T, format: &str) -> String {
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

fn mountinfo_line(mp: &str) -> String {
    let mp = std::fs::canonicalize(mp).unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
        .unwrap_or_default()
        .to_string()
}

fn pid_alive(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

fn mount_and_check(t: &T, image: &str, helper: &str, label: &str) {
    let mp = t.mkdir("mnt");
    let o = t.ok(&["mount", "--json", image, &mp]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let pid = v["record"]["helper_pid"].as_u64().unwrap();
    assert!(pid_alive(pid));
    assert_eq!(v["record"]["backend"], helper);
    let line = mountinfo_line(&mp);
    assert!(
        line.contains(&format!(
            "fuse.{}",
            if helper == "fuse2fs" { "" } else { helper }
        )),
        "{line}"
    );
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

fn libc_erofs() -> i32 {
    30
}

/// `sw-pool mount IMG MP` as uid 65534 (no groups), with its own state directory.
fn mount_as_nobody(img: &str, mp: &str, state: &Path) -> Out {
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

fn need_root() -> bool {
    if !is_root() {
        skip("the host's /dev/fuse is usable by root only; run the suite as root");
    }
    is_root()
}

#[test]
fn squashfs_pool_mounts_read_only_and_unmounts() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    mount_and_check(&t, &img, "squashfuse_ll", "demo/1.0");
}

#[test]
fn ext4_pool_mounts_through_fuse2fs() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "ext4");
    mount_and_check(&t, &img, "fuse2fs", "demo/1.0");
}

#[test]
fn bare_images_mount_too_whatever_their_name() {
    if !need_root() {
        return;
    }
    let t = T::new();
    sample_tree(&t.p("tree"));
    // a squashfs image named .ext2 and an ext2 image named .img: the magic decides
    let sq = t.s("bare.ext2");
    let st = Command::new("mksquashfs")
        .args([t.s("tree").as_str(), &sq, "-quiet", "-noappend"])
        .status()
        .unwrap();
    assert!(st.success());
    mount_and_check(&t, &sq, "squashfuse_ll", "bare.ext2");
    let ext = t.s("bare.img");
    let st = Command::new("mke2fs")
        .args(["-q", "-t", "ext2", "-d", t.s("tree").as_str(), &ext, "32M"])
        .status()
        .unwrap();
    assert!(st.success());
    mount_and_check(&t, &ext, "fuse2fs", "bare.img");
}

#[test]
fn the_paper_tool_name_works() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "ext2");
    let link = t.p("scalable-fs-mount");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let mp = t.mkdir("mnt");
    let mut c = Command::new(&link);
    c.args([&img, &mp])
        .env("SW_POOL_STATE_DIR", t.state())
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "");
    let o = run(&mut c);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(Path::new(&mp).join("pool.toml").exists());
    t.ok(&["umount", &mp]);
    t.assert_clean();
}

#[test]
fn same_pool_twice_shares_one_fuse_mount() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    t.ok(&["mount", "--job-id", "101", &img, &mp]);
    let o = t.ok(&["mount", "--job-id", "102", &img, &mp]);
    assert!(o.stdout.contains("reference added (now 2)"), "{}", o.stdout);
    assert_eq!(t.mounts().len(), 1, "one FUSE mount");
    let v = t.list_json();
    let rec = &v["mounts"][0]["record"];
    assert_eq!(rec["refs"].as_array().unwrap().len(), 2);
    assert_eq!(rec["pool"]["name"], "demo");
    assert!(
        rec["pool"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
            || rec["pool"]["digest"].as_str().unwrap().contains(':')
    );
    let l = t.ok(&["list"]).stdout;
    assert!(l.contains("101,102") && l.contains("   2 "), "{l}");
    // a different pool cannot go on the same mount point
    let other = pool(&t, "ext4");
    let o = t.run(&["mount", &other, &mp]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("already has demo/1.0"), "{}", o.stderr);
    // first release keeps it, second unmounts
    let o = t.ok(&["umount", "--job-id", "101", &mp]);
    assert!(
        o.stdout.contains("still used (1 reference left)"),
        "{}",
        o.stdout
    );
    assert_eq!(t.mounts().len(), 1);
    t.ok(&["umount", &mp]);
    t.assert_clean();
}

#[test]
fn twenty_concurrent_mounts_and_umounts_of_one_pool() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    let n = 20;
    let kids: Vec<_> = (0..n)
        .map(|i| {
            t.sw()
                .args(["mount", "-q", "--job-id", &i.to_string(), &img, &mp])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    assert_eq!(t.mounts().len(), 1);
    assert_eq!(
        t.list_json()["mounts"][0]["record"]["refs"]
            .as_array()
            .unwrap()
            .len(),
        n
    );
    let kids: Vec<_> = (0..n)
        .map(|i| {
            t.sw()
                .args(["umount", "-q", "--job-id", &i.to_string(), &mp])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut k in kids {
        assert!(k.wait().unwrap().success());
    }
    t.assert_clean();
}

#[test]
fn bad_inputs_fail_clearly_and_leave_nothing_mounted() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    // not an image
    let junk = t.p("junk.sqfs");
    std::fs::write(&junk, vec![0x5au8; 100_000]).unwrap();
    let o = t.run(&["mount", junk.to_str().unwrap(), &mp]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("not a squashfs or ext2/3/4 image") && o.stderr.contains("junk.sqfs"),
        "{}",
        o.stderr
    );
    // a pool whose bytes no longer match its manifest: refused before anything is mounted
    let bad = t.p("bad.sqfs");
    let mut b = std::fs::read(&img).unwrap();
    b[4..96].fill(0);
    std::fs::write(&bad, &b).unwrap();
    let o = t.run(&["mount", bad.to_str().unwrap(), &mp]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("bad.sqfs is damaged")
            && o.stderr.contains("does not match its manifest"),
        "{}",
        o.stderr
    );
    // corrupt squashfs superblock of a bare image (magic kept, the rest zeroed): squashfuse_ll
    // refuses it
    sample_tree(&t.p("bare-tree"));
    let bad = t.p("bad-bare.sqfs");
    let st = Command::new("mksquashfs")
        .args([
            t.s("bare-tree").as_str(),
            bad.to_str().unwrap(),
            "-quiet",
            "-noappend",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let mut b = std::fs::read(&bad).unwrap();
    b[4..96].fill(0);
    std::fs::write(&bad, &b).unwrap();
    let o = t.run(&["mount", bad.to_str().unwrap(), &mp]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("squashfuse_ll could not mount") && o.stderr.contains("damaged"),
        "{}",
        o.stderr
    );
    // corrupt ext4 superblock of a bare image (checksum broken): fuse2fs refuses it
    let bad = t.p("bad-bare.ext4");
    let st = Command::new("mke2fs")
        .args([
            "-q",
            "-t",
            "ext4",
            "-d",
            t.s("bare-tree").as_str(),
            bad.to_str().unwrap(),
            "32M",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let mut b = std::fs::read(&bad).unwrap();
    for x in &mut b[1024 + 0x20..1024 + 0x28] {
        *x ^= 0xff;
    }
    std::fs::write(&bad, &b).unwrap();
    let o = t.run(&["mount", bad.to_str().unwrap(), &mp]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("fuse2fs could not mount") && o.stderr.contains("damaged"),
        "{}",
        o.stderr
    );
    // mount point: a file, not empty, a symlink, missing
    let f = t.p("file");
    std::fs::write(&f, "x").unwrap();
    let o = t.run(&["mount", &img, f.to_str().unwrap()]);
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("is not a directory"), "{}", o.stderr);
    let full = t.mkdir("full");
    std::fs::write(Path::new(&full).join("x"), "x").unwrap();
    let o = t.run(&["mount", &img, &full]);
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("is not empty"), "{}", o.stderr);
    let link = t.p("link");
    std::os::unix::fs::symlink(&mp, &link).unwrap();
    let o = t.run(&["mount", &img, link.to_str().unwrap()]);
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("symbolic link"), "{}", o.stderr);
    // a pool's missing mount point is created, like `load -m`, but only in an existing directory
    let o = t.run(&["mount", &img, &t.s("missing/deeper")]);
    assert_eq!(o.code, 3);
    assert!(
        o.stderr.contains("cannot create it") && o.stderr.contains("missing/deeper"),
        "{}",
        o.stderr
    );
    // -o rw is refused
    let o = t.run(&["mount", "-o", "rw", &img, &mp]);
    assert_eq!(o.code, 3);
    assert!(
        o.stderr.contains("writable mounts are not supported yet"),
        "{}",
        o.stderr
    );
    // unmount of something not mounted
    let o = t.run(&["umount", &mp]);
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("is not mounted"), "{}", o.stderr);
    // a bare image without a mount point
    let o = t.run(&["mount", junk.to_str().unwrap()]);
    assert_ne!(o.code, 0);
    t.assert_clean();
    // and no helper of ours is left running
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.contains(t.d.path().to_str().unwrap())
            && (l.contains("squashfuse") || l.contains("fuse2fs"))),
        "{ps}"
    );
}

#[test]
fn killed_helper_leaves_a_stale_mount_that_list_reports_and_force_cleans() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    let o = t.ok(&["mount", "--json", &img, &mp]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let pid = v["record"]["helper_pid"].as_u64().unwrap();
    // the helper sw-pool started for this test, by its recorded pid
    assert!(pid > 1 && pid_alive(pid));
    let st = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    for _ in 0..100 {
        if !pid_alive(pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let v = t.list_json();
    assert_eq!(v["mounts"][0]["status"], "stale", "{v}");
    let l = t.ok(&["list"]).stdout;
    assert!(l.contains("stale") && l.contains("umount --force"), "{l}");
    // mounting again is refused with the fix
    let o = t.run(&["mount", &img, &mp]);
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("stale") && o.stderr.contains("umount --force"),
        "{}",
        o.stderr
    );
    let o = t.ok(&["umount", "--force", &mp]);
    assert!(o.stdout.contains("stale"), "{}", o.stdout);
    t.assert_clean();
}

#[test]
fn busy_mount_names_its_holders_and_force_detaches_lazily() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    t.ok(&["mount", &img, &mp]);
    let mut holder = Command::new("sleep")
        .arg("60")
        .current_dir(Path::new(&mp).join("install"))
        .spawn()
        .unwrap();
    let o = t.run(&["umount", &mp]);
    assert_eq!(o.code, 6, "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!("pid {}", holder.id()))
            && o.stderr.contains("sleep 60")
            && o.stderr.contains("--force"),
        "{}",
        o.stderr
    );
    assert_eq!(t.mounts().len(), 1, "still mounted");
    let o = t.ok(&["umount", "--force", &mp]);
    assert!(
        o.stderr.contains("lazily") && o.stderr.contains(&format!("pid {}", holder.id())),
        "{}",
        o.stderr
    );
    assert!(t.mounts().is_empty());
    assert_eq!(t.records(), 0);
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn unprivileged_user_gets_fuse_or_a_clear_dev_fuse_error() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt-nobody");
    let state = t.p("state-nobody");
    std::fs::create_dir(&state).unwrap();
    let st = Command::new("chown")
        .args(["65534:65534", &mp, state.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let o = mount_as_nobody(&img, &mp, &state);
    let usable = std::fs::metadata("/dev/fuse")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o006 == 0o006)
        .unwrap_or(false);
    if usable {
        assert_eq!(o.code, 0, "{}", o.stderr);
        let line = mountinfo_line(&mp);
        assert!(line.contains("user_id=65534"), "{line}");
        let _ = Command::new("fusermount3").args(["-u", &mp]).status();
    } else {
        assert_eq!(o.code, 6, "{}", o.stderr);
        assert!(
            o.stderr.contains("/dev/fuse")
                && o.stderr.contains("uid 65534")
                && o.stderr.contains("0666"),
            "{}",
            o.stderr
        );
        assert!(t.mounts().is_empty());
        assert_eq!(std::fs::read_dir(state.join("mounts")).unwrap().count(), 0);
    }
    // the state directory must be the user's own: root's is refused
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["list"])
        .env("SW_POOL_STATE_DIR", t.state());
    let o = run(&mut c);
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("state directory") && o.stderr.contains("not to you"),
        "{}",
        o.stderr
    );
}

/// An unprivileged mount onto a root-owned directory the user cannot write is a permission
/// problem (status 6, a hint about the mount point), not "fuse2fs could not mount … check that
/// the image is intact" (status 5) as before.
#[test]
fn unprivileged_mount_on_a_directory_the_user_cannot_write() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let state = t.p("state-nobody2");
    std::fs::create_dir(&state).unwrap();
    let mp = t.mkdir("root-owned");
    std::fs::set_permissions(&mp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let st = Command::new("chown")
        .args(["65534:65534", state.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(st.success());
    for format in ["ext4", "sqfs"] {
        let img = pool(&t, format);
        let o = mount_as_nobody(&img, &mp, &state);
        assert_eq!(o.code, 6, "{format}: {}", o.stderr);
        assert!(
            o.stderr.contains("not writable by you") || o.stderr.contains("/dev/fuse"),
            "{format}: {}",
            o.stderr
        );
        assert!(
            !o.stderr.contains("image is intact"),
            "{format}: {}",
            o.stderr
        );
        assert!(t.mounts().is_empty());
    }
}

/// The module system a test drives: Lmod, or Environment Modules 5.2 (Tcl, the package unpacked
/// by `make setup` beside Lmod, which it conflicts with).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Modules {
    Lmod,
    Tcl,
}

impl Modules {
    fn init(self) -> String {
        match self {
            Modules::Lmod => format!("source {LMOD_INIT}"),
            Modules::Tcl => envmod_init(),
        }
    }
    /// The pool modulefile template and the name it is installed under for version `v`.
    fn pool_modulefile(self, v: &str) -> (&'static str, String) {
        match self {
            Modules::Lmod => ("etc/lmod/pool-modulefile.lua", format!("{v}.lua")),
            Modules::Tcl => ("etc/modules/pool-modulefile.tcl", v.to_string()),
        }
    }
}

fn modules(m: Modules, script: &str, t: &T, env: &[(&str, String)]) -> Out {
    let dir = bin().parent().unwrap().to_path_buf();
    let mut c = Command::new("bash");
    c.arg("-c").arg(format!(
        "set -e; {}; export MODULEPATH={}; {script}",
        m.init(),
        t.s("mf")
    ));
    c.env(
        "PATH",
        format!("{}:{}", dir.display(), std::env::var("PATH").unwrap()),
    )
    .env("SW_POOL_STATE_DIR", t.state())
    .env("SW_POOL_SYSTEM_CONFIG", "")
    .env("SW_POOL_USER_CONFIG", "")
    .env_remove("SW_POOL_MOUNT")
    .env_remove("GWDG_SW_MOUNT")
    .env_remove("SW_POOL_LOADED")
    .env_remove("SLURM_JOB_ID")
    .env_remove("LMOD_CMD")
    .env_remove("LOADEDMODULES")
    .env_remove("_LMFILES_");
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

#[test]
fn env_output_and_profile_function_drive_real_lmod() {
    env_output_and_profile_function(Modules::Lmod);
}

#[test]
fn env_output_and_profile_function_drive_environment_modules() {
    env_output_and_profile_function(Modules::Tcl);
}

fn env_output_and_profile_function(m: Modules) {
    if !need_root() {
        return;
    }
    let t = T::new();
    t.mkdir("mf");
    let tree = t.p("tree");
    sample_tree(&tree);
    std::fs::create_dir_all(t.p("pools/demo")).unwrap();
    let o = sw_run(&[
        "build",
        "-q",
        "--gen-modulefiles",
        &t.s("pools/demo/1.0.sqfs"),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../etc/profile.d/sw-pool.sh");
    let env = [("SW_POOL_PATH", t.s("pools")), ("SW_POOL_MOUNT", t.s("m"))];
    // mount by name/version at $SW_POOL_MOUNT/demo/1.0; the function evals `sw-pool env`
    let o = modules(
        m,
        &format!(
            r#"source {}
mp=$(sw-pool mount --print-mountpoint demo/1.0)
unset SW_POOL_MOUNT
sw-pool env "$mp"
echo "MP=$MODULEPATH"; echo "SPM=$SW_POOL_MOUNT"; echo "GW=$GWDG_SW_MOUNT"
module avail 2>&1
module load hello/1.0 cfact/2.0; hello; cfact 5
module purge
sw-pool env --unload "$mp"
echo "AFTER=$MODULEPATH|${{SW_POOL_MOUNT-unset}}|${{GWDG_SW_MOUNT-unset}}|${{SW_POOL_LOADED-unset}}"
sw-pool umount "$mp"
"#,
            profile.display()
        ),
        &t,
        &env,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let root = std::fs::canonicalize(t.p("m")).unwrap();
    assert!(
        o.stdout.contains(&format!(
            "MP={}/demo/1.0/modulefiles:{}",
            root.display(),
            t.s("mf")
        )),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains(&format!("SPM={}\n", root.display())),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains(&format!("GW={}\n", root.display())),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("hello/1.0") && o.stdout.contains("cfact/2.0"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("hello from") && o.stdout.contains("\n120\n"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains(&format!("AFTER={}|unset|unset|unset", t.s("mf"))),
        "{}",
        o.stdout
    );
    t.assert_clean();
}

#[test]
fn pool_modulefile_mounts_on_load_and_releases_on_unload() {
    pool_modulefile(Modules::Lmod);
}

#[test]
fn tcl_pool_modulefile_mounts_on_load_and_releases_on_unload() {
    pool_modulefile(Modules::Tcl);
}

fn pool_modulefile(m: Modules) {
    if !need_root() {
        return;
    }
    let t = T::new();
    t.mkdir("mf/pool/demo");
    let tree = t.p("tree");
    sample_tree(&tree);
    std::fs::create_dir_all(t.p("pools")).unwrap();
    let o = sw_run(&[
        "build",
        "-q",
        "--gen-modulefiles",
        &t.s("pools/demo-1.0.sqfs"),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let (template, name) = m.pool_modulefile("1.0");
    let template = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(template);
    std::os::unix::fs::symlink(
        std::fs::canonicalize(template).unwrap(),
        t.p(&format!("mf/pool/demo/{name}")),
    )
    .unwrap();
    let env = [("SW_POOL_PATH", t.s("pools")), ("SW_POOL_MOUNT", t.s("m"))];
    let spider = match m {
        Modules::Lmod => "module spider cfact 2>&1 | head -20",
        Modules::Tcl => "true",
    };
    let o = modules(
        m,
        &format!(
            r#"module load pool/demo/1.0
echo "MP=$MODULEPATH"
sw-pool list
module avail 2>&1
module load cfact/2.0; cfact 6
{spider}
module load pool/demo/1.0
module unload pool/demo/1.0
echo "AFTER=$MODULEPATH"
sw-pool list
module load nope/1 2>&1 || echo "missing module fails"
"#
        ),
        &t,
        &env,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let root = std::fs::canonicalize(t.p("m")).unwrap();
    assert!(
        o.stdout
            .contains(&format!("MP={}/demo/1.0/modulefiles:", root.display())),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("demo/1.0") && o.stdout.contains("hello/1.0"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("\n720\n"), "{}", o.stdout);
    assert!(
        o.stdout.contains(&format!("AFTER={}\n", t.s("mf"))),
        "{}",
        o.stdout
    );
    let after = o.stdout.split("AFTER=").nth(1).unwrap_or_default();
    assert!(
        !after.contains(&format!("{}/demo/1.0", root.display())),
        "still listed after unload: {after}"
    );
    // a pool that cannot be mounted is a module error, with sw-pool's reason, and changes nothing
    std::fs::create_dir_all(t.p("mf/pool/ghost")).unwrap();
    std::os::unix::fs::symlink(
        t.p(&format!("mf/pool/demo/{name}")),
        t.p(&format!("mf/pool/ghost/{}", m.pool_modulefile("9").1)),
    )
    .unwrap();
    let o = modules(
        m,
        "module load pool/ghost/9 2>&1 || echo \"FAILED MP=$MODULEPATH\"",
        &t,
        &env,
    );
    assert!(
        o.stdout.contains("no such pool")
            && o.stdout.contains(&format!("FAILED MP={}\n", t.s("mf"))),
        "{}{}",
        o.stdout,
        o.stderr
    );
    t.assert_clean();
}

#[test]
fn profile_function_evals_in_bash_and_zsh_and_passes_other_commands_through() {
    let t = T::new();
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../etc/profile.d/sw-pool.sh");
    let dir = bin().parent().unwrap().to_path_buf();
    for sh in ["bash", "zsh"] {
        let mut c = Command::new(sh);
        c.arg("-c")
            .arg(format!(
                r#"source {}
export MODULEPATH=/x/demo/1.0/modulefiles:/site
export SW_POOL_LOADED=/x/demo/1.0
sw-pool --log warn env --unload /x/demo/1.0
echo "MP=$MODULEPATH LOADED=${{SW_POOL_LOADED-unset}}"
sw-pool env --unload --json /x 2>/dev/null; echo "json-rc=$?"
sw-pool list | head -1
sw-pool env /var/tmp/no-pool-here; echo "rc=$?"
"#,
                profile.display()
            ))
            .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
            .env("SW_POOL_STATE_DIR", t.state())
            .env("SW_POOL_SYSTEM_CONFIG", "")
            .env("SW_POOL_USER_CONFIG", "");
        let o = run(&mut c);
        assert!(
            o.stdout.contains("MP=/site LOADED=unset"),
            "{sh}: {}{}",
            o.stdout,
            o.stderr
        );
        assert!(
            o.stdout.contains("json-rc=2"),
            "{sh}: --json is not evaluated: {}",
            o.stdout
        );
        // (other tests running in parallel may have mounts of their own)
        assert!(
            o.stdout.contains("no mounts on") || o.stdout.contains("STATUS"),
            "{sh}: list passes through: {}",
            o.stdout
        );
        assert!(
            o.stdout.contains("rc=3") && o.stderr.contains("no pool is mounted"),
            "{sh}: {}{}",
            o.stdout,
            o.stderr
        );
    }
}

#[test]
fn interrupted_mounts_leave_a_recorded_mount_or_nothing() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "ext4");
    let mp = t.mkdir("mnt");
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..30u64 {
        let mut c = t.sw().args(["mount", "-q", &img, &mp]).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_micros((i * 577) % 9000));
        let _ = Command::new("kill")
            .args(["-INT", &c.id().to_string()])
            .status();
        let code = c.wait().unwrap().code().unwrap_or(-1);
        let mounted = !t.mounts().is_empty();
        let recorded = t.records() > 0;
        assert_eq!(
            mounted, recorded,
            "run {i}: exit {code}, mounted {mounted}, recorded {recorded}"
        );
        *outcomes.entry((code, mounted)).or_insert(0) += 1;
        if mounted {
            t.ok(&["umount", "-q", &mp]);
        }
        t.assert_clean();
    }
    eprintln!("outcomes (exit status, mounted): {outcomes:?}");
}

/// `cleanup --job` keeps a mount another job uses; a killed helper is `list --stale`, `cleanup
/// --stale --dry-run` changes nothing, `cleanup --stale` removes it (real squashfuse_ll).
#[test]
fn cleanup_by_job_and_of_stale_mounts() {
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    t.ok(&["mount", "--job-id", "5", &img, &mp]);
    t.ok(&["mount", "--job-id", "6", &img, &mp]);
    let o = t.ok(&["cleanup", "--job", "5"]);
    assert!(o.stdout.contains("released"), "{}", o.stdout);
    let v = t.list_json();
    assert_eq!(
        v["mounts"][0]["record"]["refs"].as_array().unwrap().len(),
        1
    );
    assert_eq!(v["mounts"][0]["record"]["refs"][0]["job_id"], "6");
    assert_eq!(t.mounts().len(), 1);
    let o = t.ok(&["list", "--job", "5"]);
    assert!(o.stdout.contains("no mounts"), "{}", o.stdout);
    // the helper dies: a stale mount
    let pid = v["mounts"][0]["record"]["helper_pid"].as_u64().unwrap();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    for _ in 0..50 {
        if !pid_alive(pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = t.ok(&["list", "--stale"]);
    assert!(o.stdout.contains("stale"), "{}", o.stdout);
    let before = (t.mounts(), t.records());
    let o = t.ok(&["cleanup", "--stale", "--dry-run"]);
    assert!(o.stdout.contains("would: unmounted"), "{}", o.stdout);
    assert_eq!(before, (t.mounts(), t.records()));
    let o = t.ok(&["cleanup", "--stale", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(v["actions"].as_array().unwrap().len() >= 2, "{v}");
    t.assert_clean();
    // nothing left: twice is harmless
    assert!(t
        .ok(&["cleanup", "--stale"])
        .stdout
        .contains("nothing to clean"));
}

#[test]
fn slurm_hooks_do_nothing_for_jobs_without_sw_pool() {
    let t = T::new();
    // the TaskProlog: no pools asked for -> no output at all (slurmstepd parses it)
    let o = run(t.sw().args(["slurm", "task-prolog"]));
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    // the multi-call name Slurm runs (no arguments)
    let link = t.p("task-prolog");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let o = run(Command::new(&link)
        .env_remove("SW_POOL_JOB_POOLS")
        .env_remove("SW_POOL_LOAD"));
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    // the epilog for a user who never used sw-pool here: nothing
    let o = run(t
        .sw()
        .args(["slurm", "epilog"])
        .env_remove("SW_POOL_STATE_DIR")
        .env("SLURM_JOB_ID", "77")
        .env("SLURM_JOB_UID", "4242421"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    // outside Slurm: a usage error that says what is missing
    let o = run(t.sw().args(["slurm", "epilog"]).env_remove("SLURM_JOB_ID"));
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("SLURM_JOB_ID"), "{}", o.stderr);
    let o = run(t
        .sw()
        .args(["slurm", "epilog", "--job", "1;rm"])
        .env("SLURM_JOB_UID", "1"));
    assert_eq!(o.code, 2, "{}", o.stderr);
    // a TaskProlog given a damaged job environment fails loudly (a `print` line for the task)
    let o = run(t
        .sw()
        .args(["slurm", "task-prolog"])
        .env("SW_POOL_JOB_POOLS", "garbage"));
    assert_ne!(o.code, 0);
    assert!(o.stdout.starts_with("print sw-pool: error"), "{}", o.stdout);
    // cleanup needs to be told what to clean
    let o = t.run(&["cleanup"]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("--job JOB_ID, --stale or --all"),
        "{}",
        o.stderr
    );
}

/// A mounted signed pool serves only the bytes its manifest vouches for. A pool of a 5 MiB
/// random file, signed, then 4 bytes changed at offset 100000: refused when its signer is not
/// trusted and signatures are required (also under the paper's tool name), refused as damaged
/// when the signer is trusted; and a pool changed on disk *after* it was mounted still reads back
/// as signed (the mount serves the verified, read-only copy in the node-local cache). Before, the
/// mount ran the FUSE helper on the file where it lay: the changed bytes were served.
#[test]
fn a_mounted_signed_pool_never_serves_changed_bytes() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let tree = t.p("tree");
    assert_eq!(
        sw_run(&[
            "init",
            "-q",
            "--name",
            "q",
            "--version",
            "1",
            t.s("tree").as_str()
        ])
        .code,
        0
    );
    let mut data = vec![0u8; 5 << 20];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut data)
        .unwrap();
    std::fs::write(tree.join("data"), &data).unwrap();
    let want = sha256_file(&tree.join("data"));
    let q = t.s("q.sqfs");
    let o = sw_run(&["build", "-q", &q, tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(sw_run(&["keygen", "-q", "--out", &t.s("k")]).code, 0);
    let o = sw_run(&["sign", "-q", "--key", &t.s("k.pem"), &q]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let tamper = |p: &str| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(b"\xde\xad\xbe\xef", 100_000).unwrap();
    };
    let bad = t.s("bad.sqfs");
    std::fs::copy(&q, &bad).unwrap();
    tamper(&bad);
    let mp = t.mkdir("mnt");
    // the signer is in no trusted-keys directory and signatures are required: refused
    let o = run(t
        .sw()
        .env("SW_POOL_REQUIRE_SIGNATURE", "true")
        .args(["mount", &bad, &mp]));
    assert_eq!(o.code, 7, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("which is not trusted here"),
        "{}",
        o.stderr
    );
    let link = t.p("scalable-fs-mount");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let o = run(Command::new(&link)
        .args([&bad, &mp])
        .env("SW_POOL_STATE_DIR", t.state())
        .env("SW_POOL_CACHE", t.d.path())
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env("SW_POOL_REQUIRE_SIGNATURE", "true"));
    assert_eq!(o.code, 7, "{}{}", o.stdout, o.stderr);
    t.assert_clean();
    // the signer is trusted: the changed bytes are found before anything is mounted
    let keys = t.p("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::copy(t.p("k.pub.pem"), keys.join("k.pem")).unwrap();
    let trusted = || {
        let mut c = t.sw();
        c.env("SW_POOL_TRUSTED_KEYS", &keys);
        c
    };
    let o = run(trusted().args(["mount", &bad, &mp]));
    assert_eq!(o.code, 4, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("bad.sqfs is damaged") && o.stderr.contains("does not match"),
        "{}",
        o.stderr
    );
    t.assert_clean();
    // mounted intact, then the pool file is changed: the mount still serves the signed bytes
    let o = run(trusted().args(["mount", "--json", &q, &mp]));
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let image = v["record"]["image"].as_str().unwrap().to_string();
    assert_ne!(image, q, "mounted where it lies");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&image).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o222,
        0,
        "the verified copy {image} is writable: {mode:o}"
    );
    tamper(&q);
    assert_eq!(sha256_file(&Path::new(&mp).join("data")), want);
    t.ok(&["umount", &mp]);
    t.assert_clean();
}
