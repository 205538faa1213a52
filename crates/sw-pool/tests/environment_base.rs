//! `sw-pool run --base POOL`: a pool holding a root file system in place of the host's `/`,
//! mounted again inside the environment by sw-pool's own server (squashfuse_ll the fallback; real FUSE, real kernel overlay, as
//! uid 65534); an exported layer stacked on it; a layer over both written through the kernel's
//! overlay without privileges.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::env_fixture::*;
use common::*;

/// A tiny root file system: dash as /bin/sh, a few programs and their libraries, the directories
/// the host's mounts are bound onto, and two marker files.
fn root_tree(root: &Path) {
    for d in [
        "bin",
        "etc",
        "proc",
        "dev",
        "sys",
        "tmp",
        "run",
        "home",
        "root",
        "var/tmp",
        "usr/local/bin",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let progs = [
        ("/bin/dash", "bin/sh"),
        ("/bin/cat", "bin/cat"),
        ("/bin/ls", "bin/ls"),
        ("/bin/rm", "bin/rm"),
        ("/usr/bin/id", "bin/id"),
    ];
    for (from, to) in progs {
        std::fs::copy(from, root.join(to)).unwrap();
        let ldd = Command::new("ldd").arg(from).output().unwrap();
        for lib in String::from_utf8_lossy(&ldd.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let dest = root.join(&lib[1..]);
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            if !dest.exists() {
                std::fs::copy(lib, &dest).unwrap();
            }
        }
    }
    std::fs::write(root.join("etc/os-release"), "NAME=\"sw-pool test base\"\n").unwrap();
    std::fs::write(root.join("etc/motd"), "from the base\n").unwrap();
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
}

/// Unloads what the test loaded, also when it fails.
struct Loaded<'a>(&'a Fixture, Vec<&'static str>);

impl Drop for Loaded<'_> {
    fn drop(&mut self) {
        for p in &self.1 {
            let _ = run(&mut base_cmd(self.0, &["unload", p]));
        }
    }
}

fn base_cmd(f: &Fixture, args: &[&str]) -> Command {
    let mut c = f.cmd(args);
    c.env("SW_POOL_MOUNT", f.dir.path().join("mnt"))
        .env("SW_POOL_CACHE", f.dir.path().join("cache"))
        // the test reads `load`'s shell code itself (else it refuses a pipe no shell reads)
        .env("SW_POOL_SHELL_FUNCTION", "1");
    c
}

/// `sw-pool build` (as root, the test) of `tree` as the squashfs pool NAME/1 beside it, readable
/// by the test user.
fn build_pool(tree: &Path, name: &str) -> std::path::PathBuf {
    let pool = tree.with_file_name(format!("{name}.pool"));
    let b = run(sw()
        .args([
            "build",
            "--format",
            "squashfs",
            "--name",
            name,
            "--version",
            "1",
        ])
        .arg(&pool)
        .arg(tree));
    assert_eq!(b.code, 0, "{}", b.stderr);
    std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o644)).unwrap();
    pool
}

/// `sw-pool run FLAGS -- sh -c SCRIPT` (FLAGS split at spaces) as nobody with the fixture's
/// directories.
fn in_env(f: &Fixture, flags: &str, script: &str) -> Out {
    let mut a: Vec<&str> = vec!["run"];
    a.extend(flags.split_whitespace());
    a.extend(["--", "sh", "-c", script]);
    run(&mut base_cmd(f, &a))
}

#[test]
fn a_base_pool_is_the_root_an_exported_layer_stacks_on_it_and_a_layer_writes_over_both() {
    if !ready() {
        return;
    }
    if !Path::new("/usr/bin/squashfuse_ll").exists() {
        skip("squashfuse is not installed (tools/setup-deps.sh installs it)");
        return;
    }
    let f = Fixture::new();
    std::fs::set_permissions(f.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for d in ["mnt", "cache", "out"] {
        let p = f.dir.path().join(d);
        std::fs::create_dir(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let sh = |args: &str| {
        run(&mut base_cmd(
            &f,
            &args.split_whitespace().collect::<Vec<_>>(),
        ))
    };
    // not loaded: refused, saying what to do
    let o = in_env(&f, "--base tbase/1", "true");
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("sw-pool load tbase/1"), "{}", o.stderr);

    // built by root from a root file system, loaded by the user
    let tree = f.dir.path().join("tree");
    root_tree(&tree);
    let pool = build_pool(&tree, "tbase");
    let before = sha256_file(&pool);
    let mut loaded = Loaded(&f, Vec::new());
    let o = sh(&format!("load {}", pool.display()));
    assert_eq!(o.code, 0, "{}", o.stderr);
    loaded.1.push("tbase/1");

    // the base is the root (read-only without a layer); the host's /tmp is bound in
    let o = in_env(
        &f,
        "-v --base tbase/1",
        "cat /etc/os-release; ls /usr/bin 2>&1; id -u; ls -d /tmp/* | cat >/dev/null; \
         rm /etc/motd 2>/dev/null || echo rm refused; cat /etc/motd; cat /proc/self/mountinfo",
    );
    let all = format!("{}{}", o.stdout, o.stderr);
    // the root is the base, served by sw-pool's server (the default), in one hop: its mount's
    // type and source (`fuse sw-pool`, mounted directly by the namespace's root)
    let root_fs = |out: &str| {
        out.lines()
            .find(|l| l.split(' ').nth(4) == Some("/"))
            .and_then(|l| l.split(" - ").nth(1))
            .map(|t| t.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    let fs = root_fs(&o.stdout);
    assert!(
        fs.starts_with("fuse") && fs.ends_with(" sw-pool"),
        "{fs}: {all}"
    );
    for want in [
        "sw-pool test base",
        "No such file", // the host's /usr/bin is not there
        "65534",
        "rm refused\nfrom the base",
        "the base pool as a read-only root",
    ] {
        assert!(all.contains(want), "{want:?} in {all}");
    }

    // with a layer: writes anywhere land in the layer through the kernel's overlay, rootless
    assert_eq!(sh("layer create dev").code, 0);
    let o = in_env(
        &f,
        "-v --base tbase/1 --layer dev",
        "echo tool > /usr/local/bin/t && rm /etc/motd && echo changed > /etc/os-release",
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr
            .contains("rootless kernel overlay over the base pool"),
        "{}",
        o.stderr
    );
    assert!(
        !o.stderr.contains("not root's"),
        "a root-built base is not warned about: {}",
        o.stderr
    );
    let upper = f.layers().join("dev/upper");
    assert_eq!(
        std::fs::read_to_string(upper.join("usr/local/bin/t")).unwrap(),
        "tool\n"
    );
    let wh = std::fs::symlink_metadata(upper.join("etc/motd")).unwrap();
    assert!(
        std::os::unix::fs::FileTypeExt::is_char_device(&wh.file_type()),
        "the deletion is a kernel whiteout"
    );
    let read = "cat /usr/local/bin/t /etc/os-release; ls /etc";
    let o = in_env(&f, "--base tbase/1 --layer dev", read);
    assert_eq!(o.stdout, "tool\nchanged\nos-release\n", "{}", o.stderr);
    // --root: uid 0 inside owns what the base's root owns
    let o = in_env(
        &f,
        "--root --base tbase/1 --layer dev",
        "id -u; echo r > /root/x; ls -ln /root/x",
    );
    assert!(
        o.stdout.starts_with("0\n") && o.stdout.contains(" 0 0 "),
        "{}{}",
        o.stdout,
        o.stderr
    );

    // the layer exported as a pool, stacked on the base: a read-only stack, then a layer on top
    let out = f.dir.path().join("out/dev.pool");
    let o = sh(&format!("layer export --version 1 dev {}", out.display()));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = sh(&format!("load {}", out.display()));
    assert_eq!(o.code, 0, "{}", o.stderr);
    loaded.1.push("dev/1");
    let o = in_env(&f, "--base tbase/1 --base dev/1", &format!("{read}; id -u"));
    assert_eq!(
        o.stdout, "tool\nchanged\nos-release\n65534\n",
        "{}",
        o.stderr
    );
    assert_eq!(sh("layer create top").code, 0);
    let o = in_env(
        &f,
        "--base tbase/1 --base dev/1 --layer top",
        "echo more >> /usr/local/bin/t && rm /etc/os-release && cat /usr/local/bin/t && ls /etc",
    );
    assert_eq!(o.stdout, "tool\nmore\n", "{}", o.stderr);
    // a base whose files are not root's in its image (built from a tree of uid 4321 without
    // --all-root): writing over it is named before the command fails on it
    let t2 = f.dir.path().join("tree2");
    root_tree(&t2);
    let chown = Command::new("chown")
        .arg("-R")
        .arg("4321:4321")
        .arg(&t2)
        .status()
        .unwrap();
    assert!(chown.success());
    let pool2 = build_pool(&t2, "ubase");
    assert_eq!(sh(&format!("load {}", pool2.display())).code, 0);
    loaded.1.push("ubase/1");
    assert_eq!(sh("layer create u").code, 0);
    let o = in_env(&f, "--base ubase/1 --layer u", "echo x >> /etc/motd");
    assert_ne!(o.code, 0, "{}", o.stdout);
    assert!(
        o.stderr.contains("base pool ubase/1 are not root's")
            && o.stderr.contains("sw-pool build --all-root"),
        "{}",
        o.stderr
    );
    // fuse_reader = squashfuse_ll: the fallback serves the base, as before
    let mut c = base_cmd(
        &f,
        &[
            "run",
            "--base",
            "tbase/1",
            "--",
            "sh",
            "-c",
            "cat /etc/motd /proc/self/mountinfo",
        ],
    );
    let o = run(c.env("SW_POOL_FUSE_READER", "squashfuse_ll"));
    assert!(
        o.stdout.starts_with("from the base\n"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    let fs = root_fs(&o.stdout);
    assert!(
        fs.starts_with("fuse") && fs.contains("squashfuse"),
        "{fs}: {}",
        o.stdout
    );
    // nothing written into a pool or the host
    assert_eq!(sha256_file(&pool), before);
    let o = in_env(&f, "--base tbase/1 --base dev/1", "cat /usr/local/bin/t");
    assert_eq!(o.stdout, "tool\n", "{}", o.stderr);
    assert!(!Path::new("/usr/local/bin/t").exists());
    drop(loaded);
}
