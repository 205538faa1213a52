//! Setuid files and device nodes in pools a user builds: `layer export` and `build --all-root`
//! store every file as root's, so they clear setuid/setgid bits and leave device nodes out (each
//! named in a warning) unless root asks to keep them (`--keep-special`); overlay whiteouts
//! (character devices 0/0) stay. `inspect` lists what an image carries, read from the image.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::env_fixture::*;
use common::*;

fn mknod(p: &Path, kind: &str, major: u32, minor: u32) {
    let ok = Command::new("mknod")
        .arg(p)
        .args([kind, &major.to_string(), &minor.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "mknod {}", p.display());
}

/// A setuid+setgid file owned by nobody (mode 6755, as nobody's own `chmod` makes it) and a
/// character device 1,3 (`/dev/null`'s numbers: any device would do) that root put in `dir`.
fn plant(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let su = dir.join("bin/su-me");
    std::fs::copy("/bin/true", &su).unwrap();
    std::os::unix::fs::chown(&su, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&su, std::fs::Permissions::from_mode(0o6755)).unwrap();
    mknod(&dir.join("dev-null"), "c", 1, 3);
    mknod(&dir.join("loop-dev"), "b", 7, 0);
}

/// `unsquashfs -lln` of a pool: (mode string, name) per entry.
fn listing(pool: &Path) -> Vec<(String, String)> {
    let o = Command::new("unsquashfs")
        .args(["-lln", "-d", ""])
        .arg(pool)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let i = l.find(" /")?;
            Some((l[..10].to_string(), l[i + 2..].to_string()))
        })
        .collect()
}

fn mode_of<'a>(l: &'a [(String, String)], name: &str) -> Option<&'a str> {
    l.iter().find(|(_, n)| n == name).map(|(m, _)| m.as_str())
}

#[test]
fn a_users_exported_layer_carries_no_setuid_file_and_no_device_but_its_whiteouts() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let o = f.run(&["layer", "create", "dev"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // a whiteout, as an environment makes one: the deleted file is a character device 0/0
    let o = f.run(&["run", "--layer", "dev", "--", "rm", "-f", "/etc/hostname"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let upper = f.layers().join("dev/upper");
    assert!(upper.join("etc/hostname").symlink_metadata().is_ok());
    plant(&upper.join("usr/local"));
    let pool = f.dir.path().join("state/dev.sqfs");
    let o = f.run(&["layer", "export", "dev", pool.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for name in [
        "usr/local/bin/su-me",
        "usr/local/dev-null",
        "usr/local/loop-dev",
    ] {
        assert!(
            o.stderr.contains(name),
            "warning names {name}: {}",
            o.stderr
        );
    }
    let l = listing(&pool);
    assert_eq!(
        mode_of(&l, "usr/local/bin/su-me"),
        Some("-rwxr-xr-x"),
        "{l:?}"
    );
    assert_eq!(mode_of(&l, "usr/local/dev-null"), None, "{l:?}");
    assert_eq!(mode_of(&l, "usr/local/loop-dev"), None, "{l:?}");
    assert!(
        l.iter()
            .all(|(m, _)| !m.contains(['s', 'S']) && !m.starts_with('b')),
        "{l:?}"
    );
    assert_eq!(
        mode_of(&l, "etc/hostname").map(|m| &m[..1]),
        Some("c"),
        "the whiteout stays: {l:?}"
    );
    // inspect reads the image: nothing special in it (the whiteout is not a device to list)
    let i = sw_run(&["inspect", "--no-check", pool.to_str().unwrap()]);
    assert_eq!(i.code, 0, "{}", i.stderr);
    assert!(i.stdout.contains("special   none"), "inspect: {}", i.stdout);
    // asking to keep them is root's alone
    let o = f.run(&[
        "layer",
        "export",
        "--force",
        "--keep-special",
        "dev",
        pool.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stderr.contains("--keep-special") && o.stderr.contains("only root"),
        "{}",
        o.stderr
    );
    // an ext export cannot leave them out: refused, naming them, nothing written
    let ext = f.dir.path().join("state/dev.ext4");
    let o = f.run(&["layer", "export", "dev", ext.to_str().unwrap()]);
    assert_ne!(o.code, 0, "{}", o.stdout);
    assert!(
        o.stderr.contains("usr/local/bin/su-me") && o.stderr.contains("--format squashfs"),
        "{}",
        o.stderr
    );
    assert!(!ext.exists());
}

#[test]
fn build_all_root_defuses_a_users_tree_and_root_keeps_what_it_asks_for() {
    if !is_root() {
        skip("needs root to put a device node in the tree and to switch to uid 65534");
        return;
    }
    let d = scratch();
    let tree = d.path().join("tree");
    plant(&tree);
    std::os::unix::fs::chown(&tree, Some(NOBODY), Some(NOBODY)).unwrap();
    std::os::unix::fs::chown(tree.join("bin"), Some(NOBODY), Some(NOBODY)).unwrap();
    // a user's --all-root build: bits cleared, devices out, each named
    let user_pool = d.path().join("user.sqfs");
    let o = sw_as_nobody(&[
        "build",
        "--all-root",
        user_pool.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("bin/su-me") && o.stderr.contains("dev-null"),
        "{}",
        o.stderr
    );
    let l = listing(&user_pool);
    assert_eq!(mode_of(&l, "bin/su-me"), Some("-rwxr-xr-x"), "{l:?}");
    assert_eq!(mode_of(&l, "dev-null"), None, "{l:?}");
    let o = sw_as_nobody(&[
        "build",
        "--all-root",
        "--keep-special",
        "--force",
        user_pool.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("only root"), "{}", o.stderr);
    // root asks to keep them: kept, and inspect shows them
    let root_pool = d.path().join("root.sqfs");
    let o = sw_run(&[
        "build",
        "--all-root",
        "--keep-special",
        root_pool.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let l = listing(&root_pool);
    assert_eq!(mode_of(&l, "bin/su-me"), Some("-rwsr-sr-x"), "{l:?}");
    assert_eq!(mode_of(&l, "dev-null"), Some("crw-r--r--"), "{l:?}");
    let i = sw_run(&["inspect", "--no-check", root_pool.to_str().unwrap()]);
    assert_eq!(i.code, 0, "{}", i.stderr);
    for s in [
        "setuid+setgid file bin/su-me (mode 6755)",
        "character device dev-null (1,3)",
        "block device loop-dev (7,0)",
    ] {
        assert!(i.stdout.contains(s), "inspect shows {s}: {}", i.stdout);
    }
    // an ext pool (owners kept as in the tree): read from its inode tables
    let ext_pool = d.path().join("root.ext4");
    let o = sw_run(&["build", ext_pool.to_str().unwrap(), tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let i = sw_run(&["inspect", "--json", ext_pool.to_str().unwrap()]);
    assert_eq!(i.code, 0, "{}", i.stderr);
    let v: serde_json::Value = serde_json::from_str(&i.stdout).unwrap();
    let mut got: Vec<String> = v["special"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", i.stdout))
        .iter()
        .map(|s| format!("{} {} {}", s["path"], s["kind"], s["mode"]))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            r#""bin/su-me" "setid" "6755""#,
            r#""dev-null" "char-device" "644""#,
            r#""loop-dev" "block-device" "644""#,
        ],
        "{}",
        i.stdout
    );
}
