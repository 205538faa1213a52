//! Hostile input, second round (issue 27): what a user with write access to a pool, a FIFO, a
//! squatted state directory or a changed cache entry can make sw-pool do. Each test failed on
//! 346bad4 (the main before the fixes) and passes now. The racing test of root's mount point
//! walk is `tests/cluster/t_47_parent_race.sh` (it needs two users on a node of the testbed).

mod common;
use common::mount_fixture::T;
use common::*;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `sw-pool ARGS` for the test `t`, killed after `secs` (a hang is a failure, not a stuck run).
fn run_within(t: &T, secs: u32, args: &[&str]) -> Out {
    let mut c = Command::new("timeout");
    c.args(["-s", "KILL", &secs.to_string()])
        .arg(bin())
        .args(args);
    c.env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env("SW_POOL_STATE_DIR", t.state())
        .env("SW_POOL_CACHE", t.d.path())
        .env("SW_POOL_SHELL_FUNCTION", "1");
    run(&mut c)
}

/// A pool `name` of a tree with one package; `size` ("" for squashfs) makes a sparse ext2 image.
fn pool_of(t: &T, name: &str, content: &str, size: &str) -> String {
    let tree = t.p(&format!("tree-{name}"));
    let o = sw_run(&[
        "init",
        "-q",
        "--name",
        "demo",
        "--version",
        "1.0",
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    std::fs::create_dir_all(tree.join("install/hello/1.0/bin")).unwrap();
    std::fs::write(tree.join("install/hello/1.0/bin/hello"), content).unwrap();
    let out = t.s(name);
    let mut args = vec!["build", "-q"];
    if !size.is_empty() {
        args.extend(["-s", size]);
    }
    args.extend([out.as_str(), tree.to_str().unwrap()]);
    let o = sw_run(&args);
    assert_eq!(o.code, 0, "{}", o.stderr);
    out
}

fn manifest(pool: &str) -> serde_json::Value {
    let o = sw_run(&["inspect", "--json", "--no-check", pool]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    serde_json::from_str::<serde_json::Value>(&o.stdout).unwrap()["manifest"].clone()
}

/// The offset of the first data chunk and of the first `null` chunk of a pool.
fn chunk_offsets(pool: &str) -> (u64, Option<u64>) {
    let m = manifest(pool);
    let cs = m["chunk_size"].as_u64().unwrap();
    let chunks = m["chunks"].as_array().unwrap();
    let data = chunks.iter().position(|c| !c.is_null()).unwrap() as u64;
    let null = chunks
        .iter()
        .position(|c| c.is_null())
        .map(|i| i as u64 * cs);
    (data * cs, null)
}

fn poke(path: &str, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

fn keys(t: &T) -> (String, String) {
    let o = sw_run(&["keygen", "--out", &t.s("adm")]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    (t.s("adm.pem"), t.s("adm.pub.pem"))
}

#[test]
fn sign_refuses_bytes_that_do_not_match_the_manifest() {
    let t = T::new();
    let (key, _) = keys(&t);
    // image A with a changed data byte: the manifest no longer vouches for it
    let pool = pool_of(&t, "a.sqfs", "benign\n", "");
    let before = std::fs::read(&pool).unwrap();
    let (data, _) = chunk_offsets(&pool);
    poke(&pool, data + 100, b"EVIL");
    let changed = std::fs::read(&pool).unwrap();
    let o = sw_run(&["sign", "--key", &key, &pool]);
    assert_eq!(o.code, 4, "sign of a mismatching image: {}", o.stderr);
    assert!(
        o.stderr.contains("refusing to sign") && o.stderr.contains("does not match its manifest"),
        "{}",
        o.stderr
    );
    assert_eq!(
        std::fs::read(&pool).unwrap(),
        changed,
        "the pool was rewritten"
    );
    assert!(
        !Path::new(&format!("{pool}.sig")).exists(),
        "a .sig was left"
    );
    assert_nothing_left(t.d.path(), "never");
    assert_ne!(before, changed);

    // a sparse ext2 pool with bytes written into a chunk its manifest calls null (a hole)
    let e = pool_of(&t, "e.ext2", "benign\n", "16MB");
    let (_, null) = chunk_offsets(&e);
    let null = null.expect("a 16 MB ext2 pool of one file has null chunks");
    poke(&e, null + 4096, b"not zero");
    let o = sw_run(&["sign", "--key", &key, &e]);
    assert_eq!(o.code, 4, "sign with a non-zero null chunk: {}", o.stderr);
    assert!(o.stderr.contains("refusing to sign"), "{}", o.stderr);
    assert!(!Path::new(&format!("{e}.sig")).exists());
}

#[test]
fn verify_load_and_mount_report_the_same_damage_the_same_way() {
    if !is_root() {
        return skip("mounts need /dev/fuse, usable by root only on this host");
    }
    let t = T::new();
    let (key, public) = keys(&t);
    let e = pool_of(&t, "e.ext2", "benign\n", "16MB");
    let o = sw_run(&["sign", "--key", &key, &e]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // after signing, bytes land in a hole the signed manifest calls all-zero
    let (_, null) = chunk_offsets(&e);
    poke(&e, null.unwrap() + 4096, b"not zero");
    let v = sw_run(&["verify", "--key", &public, &e]);
    std::fs::create_dir(t.p("mnt")).unwrap();
    let m = t.run(&["mount", &e, &t.s("mnt")]);
    let l = t.run(&["load", "-q", "-m", &t.s("mnt2"), &e]);
    for (what, o) in [("verify", &v), ("mount", &m), ("load", &l)] {
        assert_eq!(
            o.code, 4,
            "{what} of a pool with data in a null chunk: {}",
            o.stderr
        );
    }
    assert!(
        v.stderr.contains("does not match its signed manifest"),
        "{}",
        v.stderr
    );
    assert!(m.stderr.contains("damaged"), "{}", m.stderr);
    assert!(t.mounts().is_empty(), "left mounted: {:?}", t.mounts());

    // a data chunk changed after signing (the A/B swap): 4 everywhere, not "OK" or 7
    let a = pool_of(&t, "a.sqfs", "benign\n", "");
    assert_eq!(sw_run(&["sign", "--key", &key, &a]).code, 0);
    let (data, _) = chunk_offsets(&a);
    poke(&a, data + 100, b"EVIL");
    let v = sw_run(&["verify", "--key", &public, &a]);
    let m = t.run(&["mount", &a, &t.s("mnt")]);
    assert_eq!(v.code, 4, "verify: {}", v.stderr);
    assert_eq!(m.code, 4, "mount: {}", m.stderr);
    assert!(t.mounts().is_empty());
}

#[test]
fn a_fifo_or_a_device_is_refused_at_once_never_waited_on() {
    let t = T::new();
    let state = t.s("state");
    let fifo = t.s("f.sqfs");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    std::fs::create_dir(t.p("mnt")).unwrap();
    for args in [
        vec!["inspect", fifo.as_str()],
        vec!["verify", fifo.as_str()],
        vec!["mount", fifo.as_str(), &t.s("mnt")],
        vec!["load", "-q", "-m", &t.s("mnt"), fifo.as_str()],
        vec!["mount", "/dev/zero", &t.s("mnt")],
        vec!["mount", &state, &t.s("mnt")],
        vec!["inspect", "/dev/zero"],
    ] {
        let o = run_within(&t, 20, &args);
        assert_eq!(o.code, 4, "sw-pool {args:?} (137: it hung): {}", o.stderr);
        assert!(
            o.stderr.contains("not a regular file"),
            "{args:?}: {}",
            o.stderr
        );
    }
    assert!(t.mounts().is_empty());
}

#[test]
fn a_pool_that_lost_its_footer_is_damage_not_a_bare_image() {
    if !is_root() {
        return skip("mounts need /dev/fuse, usable by root only on this host");
    }
    let t = T::new();
    let pool = pool_of(&t, "p.sqfs", "hello\n", "");
    let b = std::fs::read(&pool).unwrap();
    std::fs::write(t.p("cut.sqfs"), &b[..b.len() - 100]).unwrap();
    std::fs::create_dir(t.p("mnt")).unwrap();
    for args in [
        vec!["mount", &t.s("cut.sqfs"), &t.s("mnt")],
        vec!["inspect", &t.s("cut.sqfs")],
        vec!["verify", &t.s("cut.sqfs")],
    ] {
        let o = t.run(&args);
        assert_eq!(o.code, 4, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains("damaged pool"), "{args:?}: {}", o.stderr);
    }
    assert!(t.mounts().is_empty());
    // a real bare image still mounts, with the warning SECURITY.md promises
    let st = Command::new("mksquashfs")
        .args([
            &t.s("tree-p.sqfs"),
            &t.s("bare.sqfs"),
            "-quiet",
            "-noappend",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let o = t.run(&["mount", &t.s("bare.sqfs"), &t.s("mnt")]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("sw-pool: warning:") && o.stderr.contains("is a bare image"),
        "{}",
        o.stderr
    );
    assert_eq!(t.run(&["umount", &t.s("mnt")]).code, 0);
}

#[test]
fn a_changed_cache_entry_is_checked_again_before_reuse() {
    if !is_root() {
        return skip("mounts need /dev/fuse, usable by root only on this host");
    }
    let t = T::new();
    let pool = pool_of(&t, "p.sqfs", "the real content\n", "");
    std::fs::create_dir(t.p("mnt")).unwrap();
    let hello = t.p("mnt/install/hello/1.0/bin/hello");
    assert_eq!(t.run(&["mount", &pool, &t.s("mnt")]).code, 0);
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "the real content\n"
    );
    assert_eq!(t.run(&["umount", &t.s("mnt")]).code, 0);
    // the owner makes the cached copy writable and changes it
    let entry = std::fs::read_dir(t.p("sw-pool-0/cache"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "pool"))
        .expect("a cache entry");
    std::fs::set_permissions(&entry, PermissionsExt::from_mode(0o644)).unwrap();
    let (data, _) = chunk_offsets(&pool);
    poke(entry.to_str().unwrap(), data + 10, b"CHANGED");
    // reused only after a check: it fails, the entry is dropped and copied again
    let o = t.run(&["mount", &pool, &t.s("mnt")]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("changed since it was verified"),
        "no word of the changed entry: {}",
        o.stderr
    );
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "the real content\n"
    );
    assert_eq!(t.run(&["umount", &t.s("mnt")]).code, 0);
    // an entry only touched (chmod back and forth changes its ctime) is checked, found intact and kept
    std::fs::set_permissions(&entry, PermissionsExt::from_mode(0o444)).unwrap();
    let ino = std::fs::metadata(&entry).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let o = t.run(&["mount", &pool, &t.s("mnt")]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains("changed since"), "{}", o.stderr);
    assert_eq!(
        std::fs::metadata(&entry)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .ok(),
        ino.ok(),
        "an intact entry was copied again"
    );
    assert_eq!(t.run(&["umount", &t.s("mnt")]).code, 0);
}

/// Run `sw-pool ARGS` as `uid` (no passwd entry needed) with a clean environment.
fn sw_as(uid: u32, env: &[(&str, &str)], args: &[&str]) -> Out {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        "--",
    ])
    .arg(bin())
    .args(args)
    .env_clear()
    .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    .env("SW_POOL_SYSTEM_CONFIG", "")
    .env("SW_POOL_USER_CONFIG", "")
    .env("HOME", "/nonexistent");
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

#[test]
fn squatted_and_world_writable_state_places_fall_back_instead_of_locking_out() {
    if !is_root() {
        return skip("needs root to act as two users");
    }
    // a uid of its own (no other test uses it): its /tmp names are this test's alone
    let uid = 61_727u32;
    let own = |p: &Path| {
        let _ = Command::new("chown")
            .arg(format!("{uid}:{uid}"))
            .arg(p)
            .status();
    };
    let cleanup = || {
        for e in std::fs::read_dir("/tmp").unwrap().flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("sw-pool-{uid}"))
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    };
    cleanup();
    let t = T::new();
    // (a) $XDG_RUNTIME_DIR the user's own but world-writable, another user's sw-pool planted in it
    let xdg = t.p("xdg");
    std::fs::create_dir(&xdg).unwrap();
    own(&xdg);
    std::fs::set_permissions(&xdg, PermissionsExt::from_mode(0o777)).unwrap();
    std::fs::create_dir(xdg.join("sw-pool")).unwrap(); // root's
    let o = sw_as(
        uid,
        &[("XDG_RUNTIME_DIR", xdg.to_str().unwrap())],
        &["list"],
    );
    assert_eq!(
        o.code, 0,
        "list with a world-writable XDG_RUNTIME_DIR: {}",
        o.stderr
    );
    assert!(o.stderr.contains("is writable by others"), "{}", o.stderr);
    cleanup();

    // (b) /tmp/sw-pool-<uid> squatted by another user, no private directory made yet
    let squat = PathBuf::from(format!("/tmp/sw-pool-{uid}"));
    std::fs::create_dir(&squat).unwrap(); // root's
    let o = sw_as(uid, &[], &["list"]);
    assert_eq!(
        o.code, 0,
        "list with a squatted /tmp/sw-pool-{uid}: {}",
        o.stderr
    );
    let warnings: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.contains("someone else took the name"))
        .collect();
    assert_eq!(warnings.len(), 1, "the squat warning once: {}", o.stderr);
    assert!(
        warnings[0].starts_with("sw-pool: warning: "),
        "{}",
        o.stderr
    );
    // and the next command finds the same private directory
    let o2 = sw_as(uid, &[], &["list", "--json"]);
    assert_eq!(o2.code, 0, "{}", o2.stderr);
    let _ = std::fs::remove_dir(&squat);
    cleanup();
}

#[test]
fn error_messages_escape_control_characters_in_paths() {
    let t = T::new();
    let evil = t.p("a\nFAKE: status 0\x1b[2J.sqfs");
    std::fs::write(&evil, b"not a pool").unwrap();
    let o = sw_run(&["inspect", evil.to_str().unwrap()]);
    assert_ne!(o.code, 0);
    assert_eq!(o.stderr.lines().count(), 1, "one line: {:?}", o.stderr);
    assert!(
        o.stderr.contains("a\\nFAKE") && !o.stderr.contains('\x1b'),
        "{:?}",
        o.stderr
    );
}
