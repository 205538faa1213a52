//! `sw-pool mount/umount/list/env` with the real FUSE helpers (squashfuse_ll, fuse2fs), the real
//! Lmod, as root and as an unprivileged user. Every test has its own state directory and scratch
//! directory and unmounts what it mounted, even when it fails (the `Guard`).

mod common;
use common::mount_fixture::*;
use common::*;

use std::path::Path;
use std::process::Command;

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
