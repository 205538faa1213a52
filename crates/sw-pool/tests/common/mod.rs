//! Helpers for the CLI tests: run the real binary with an isolated configuration.
#![allow(dead_code)]

pub mod cases;
pub mod env_fixture;
pub mod load_fixture;
pub mod mount_fixture;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `sw-pool` the tests run. Cargo's own when every user can reach it; else (a checkout under
/// a private directory, such as root's 0700 home) the workspace's programs linked or copied into
/// a 0755 directory under /var/tmp made for this test process and removed when it exits: the
/// tests also run sw-pool as uid 65534, and sw-pool finds its other programs beside itself.
pub fn bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        // $SWPOOL_TEST_BIN: the tests against another build's programs (an earlier commit's,
        // to see a new test fail there)
        let built = std::env::var_os("SWPOOL_TEST_BIN")
            .filter(|b| !b.is_empty())
            .map_or_else(
                || PathBuf::from(env!("CARGO_BIN_EXE_sw-pool")),
                PathBuf::from,
            );
        if reachable_by_all(&built) {
            built
        } else {
            reachable_copy(&built)
        }
    })
    .clone()
}

/// The programs beside `sw-pool` that it (or a test) runs from there.
const BESIDE: &[&str] = &[
    "sw-pool",
    "sw-pool-full",
    "sw-pool-enter",
    "sw-pool-serve",
    "sw-pool-view",
    "sw-pool-mount-helper",
    "mpi-selftest",
];

/// Can any user run `p`: every directory above it searchable by others, the file executable by
/// them?
pub fn reachable_by_all(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    mode(p) & 0o005 == 0o005 && p.ancestors().skip(1).all(|d| mode(d) & 0o001 != 0)
}

/// The directory [`reachable_copy`] made, removed at exit.
static COPY_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

extern "C" fn remove_copy_dir() {
    if let Some(d) = COPY_DIR.get() {
        let _ = std::fs::remove_dir_all(d);
    }
}

extern "C" {
    fn atexit(f: extern "C" fn()) -> i32;
}

/// `built` and the programs beside it ([`BESIDE`]) in a new 0755 directory under /var/tmp
/// (hard links where the file system allows, else copies); the copy of `built`.
fn reachable_copy(built: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("swpool-test-bin-")
        .tempdir_in("/var/tmp")
        .expect("a directory under /var/tmp for the programs under test")
        .keep();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    COPY_DIR.set(d.clone()).expect("made once");
    unsafe { atexit(remove_copy_dir) };
    let from = built.parent().expect("cargo's target directory");
    for name in BESIDE {
        let (src, dst) = (from.join(name), d.join(name));
        if src.is_file() && std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst)
                .unwrap_or_else(|e| panic!("copying {} to {}: {e}", src.display(), d.display()));
        }
    }
    d.join("sw-pool")
}

/// `sw-pool` with no system or user config file and no inherited SW_POOL_* settings.
pub fn sw() -> Command {
    let mut c = Command::new(bin());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SW_POOL_") || k == "SOURCE_DATE_EPOCH" {
            c.env_remove(k);
        }
    }
    c.env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "");
    c
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(c: &mut Command) -> Out {
    let o = c.output().expect("run sw-pool");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

pub fn sw_run(args: &[&str]) -> Out {
    run(sw().args(args))
}

/// A scratch directory under /var/tmp (not /tmp: large images, and reachable by other users).
pub fn scratch() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("swpool-test-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        d.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    d
}

/// Nothing named `name` and no temporary file of ours in `dir`.
pub fn assert_nothing_left(dir: &Path, name: &str) {
    for e in std::fs::read_dir(dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(n != name, "{name} was left in {}", dir.display());
        assert!(
            !n.contains("swpool-tmp"),
            "temporary file {n} was left in {}",
            dir.display()
        );
    }
}

pub fn sha256_file(p: &Path) -> String {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(p).unwrap();
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    hex::encode(h.finalize())
}

/// Report that the calling test cannot run here; the test returns right after. Prints
/// "SKIP <test>: <reason>" on the real stderr, which the test harness does not capture, so the
/// line shows in every run, and `make test-unit` counts such lines ("N skipped"): a skipped test
/// is never a silent pass. (Conditions known at compile time use `#[ignore = "reason"]` instead.)
pub fn skip(reason: &str) {
    use std::io::Write;
    let t = std::thread::current();
    let _ = writeln!(
        std::io::stderr(),
        "SKIP {}: {reason}",
        t.name().unwrap_or("(test)")
    );
}

pub fn is_root() -> bool {
    rustix_like_geteuid() == 0
}

fn rustix_like_geteuid() -> u32 {
    // read it from /proc to avoid a dependency just for tests
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse().ok())
        .unwrap()
}

/// Run sw-pool as an unprivileged user (nobody) when we are root, else as ourselves.
pub fn sw_as_nobody(args: &[&str]) -> Out {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin())
            .args(args);
        c.env("SW_POOL_SYSTEM_CONFIG", "")
            .env("SW_POOL_USER_CONFIG", "")
            .env("HOME", "/nonexistent");
        run(&mut c)
    } else {
        sw_run(args)
    }
}

/// A small pool tree with two packages (a script and a C program compiled here).
pub fn sample_tree(root: &Path) {
    let o = sw_run(&[
        "init",
        "--name",
        "demo",
        "--version",
        "1.0",
        root.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let bin = root.join("install/hello/1.0/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("hello");
    std::fs::write(&script, "#!/bin/sh\necho \"hello from $(hostname)\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cbin = root.join("install/cfact/2.0/bin");
    std::fs::create_dir_all(&cbin).unwrap();
    std::fs::create_dir_all(root.join("source/cfact")).unwrap();
    let src = root.join("source/cfact/cfact.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\nint main(int c,char**v){long n=c>1?atol(v[1]):10,f=1;for(long i=2;i<=n;i++)f*=i;printf(\"%ld\\n\",f);return 0;}\n",
    )
    .unwrap();
    let st = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(cbin.join("cfact"))
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "cc failed");
    std::fs::create_dir_all(root.join("install/cfact/2.0/share/man/man1")).unwrap();
    std::fs::write(
        root.join("install/cfact/2.0/share/man/man1/cfact.1"),
        ".TH CFACT 1\n",
    )
    .unwrap();
}

/// Environment Modules 5.2's command, from the Debian package `make setup` unpacks beside Lmod
/// (the package conflicts with lmod).
pub const MODULECMD_TCL: &str =
    "/opt/sw-pool-deps/environment-modules/usr/lib/x86_64-linux-gnu/modulecmd.tcl";

/// The shell code that defines Environment Modules' `module` function, as its init scripts do.
pub fn envmod_init() -> String {
    assert!(
        Path::new(MODULECMD_TCL).exists(),
        "Environment Modules is not unpacked (make setup)"
    );
    format!("module() {{ eval \"$(tclsh {MODULECMD_TCL} bash \"$@\")\"; }}")
}

/// Every entry below `d` (directories too), depth first; nothing for a missing directory.
pub fn walk(d: &Path) -> Vec<PathBuf> {
    let mut v = vec![];
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        v.push(e.path());
        if e.path().is_dir() {
            v.extend(walk(&e.path()));
        }
    }
    v
}
