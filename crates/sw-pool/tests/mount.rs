//! `sw-pool mount/umount/list/env` with the real FUSE helpers (squashfuse_ll, fuse2fs), the real
//! Lmod, as root and as an unprivileged user. Every test has its own state directory and scratch
//! directory and unmounts what it mounted, even when it fails (the `Guard`).

mod common;
use common::cases::*;
use common::mount_fixture::*;
use common::*;

use std::path::Path;
use std::process::Command;

/// An image that mounts: how it is made, the FUSE helper that must serve it, its label in `list`.
struct Mountable {
    name: &'static str,
    image: fn(&T) -> String,
    helper: &'static str,
    label: &'static str,
}

/// Pools of both formats, and bare images whose name says the other format (the magic decides).
const MOUNTABLE: &[Mountable] = &[
    Mountable {
        name: "squashfs pool through sw-pool's tree server (the default)",
        image: |t| pool(t, "sqfs"),
        helper: "sw_pool_tree",
        label: "demo/1.0",
    },
    Mountable {
        name: "ext4 pool through fuse2fs",
        image: |t| pool(t, "ext4"),
        helper: "fuse2fs",
        label: "demo/1.0",
    },
    Mountable {
        name: "bare squashfs image named .ext2",
        image: |t| {
            sample_tree(&t.p("tree"));
            let sq = t.s("bare.ext2");
            let st = Command::new("mksquashfs")
                .args([t.s("tree").as_str(), &sq, "-quiet", "-noappend"])
                .status()
                .unwrap();
            assert!(st.success());
            sq
        },
        helper: "squashfuse_ll",
        label: "bare.ext2",
    },
    Mountable {
        name: "bare ext2 image named .img",
        image: |t| {
            sample_tree(&t.p("tree"));
            let ext = t.s("bare.img");
            let st = Command::new("mke2fs")
                .args(["-q", "-t", "ext2", "-d", t.s("tree").as_str(), &ext, "32M"])
                .status()
                .unwrap();
            assert!(st.success());
            ext
        },
        helper: "fuse2fs",
        label: "bare.img",
    },
];

/// Each image mounts read-only (nosuid, nodev) through its helper, shows in `list`, and unmounts
/// leaving no mount, no record and no helper (`mount_and_check`); each in its own scratch
/// directory.
#[test]
fn pools_and_bare_images_mount_read_only_and_unmount() {
    if !need_root() {
        return;
    }
    each_case(
        MOUNTABLE,
        |m| m.name.to_string(),
        |m| {
            let t = T::new();
            let img = (m.image)(&t);
            mount_and_check(&t, &img, m.helper, m.label);
        },
    );
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

/// 100,000 bytes that are no image.
fn junk(c: &Ctx) -> String {
    let junk = c.t.s("junk.sqfs");
    std::fs::write(&junk, vec![0x5au8; 100_000]).unwrap();
    junk
}

/// The tree of the bare images (made once per table).
fn bare_tree(c: &Ctx) -> String {
    let tree = c.t.p("bare-tree");
    if !tree.exists() {
        sample_tree(&tree);
    }
    c.t.s("bare-tree")
}

/// A bare image `name` of the sample tree made by `tool args…` (`{tree}` and `{out}` filled in),
/// then damaged by `damage`.
fn damaged_bare(c: &Ctx, name: &str, tool: &str, args: &[&str], damage: fn(&mut [u8])) -> String {
    let tree = bare_tree(c);
    let bad = c.t.s(name);
    let args: Vec<String> = args
        .iter()
        .map(|a| a.replace("{tree}", &tree).replace("{out}", &bad))
        .collect();
    let st = Command::new(tool).args(&args).status().unwrap();
    assert!(st.success(), "{tool} {args:?}");
    let mut b = std::fs::read(&bad).unwrap();
    damage(&mut b);
    std::fs::write(&bad, &b).unwrap();
    bad
}

/// Images and mount points that must be refused, with the exit status and the words that tell the
/// user why; after each, nothing is mounted or recorded. `{img}` is a good squashfs pool, `{mp}` an
/// empty directory.
const BAD_INPUTS: &[Case] = &[
    Case {
        name: "not an image",
        setup: junk,
        via: Via::Sw,
        args: &["mount", "{input}", "{mp}"],
        env: &[],
        expect_status: Status::Is(4),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["not a squashfs or ext2/3/4 image", "junk.sqfs"],
    },
    // refused before anything is mounted
    Case {
        name: "a pool whose bytes no longer match its manifest",
        setup: |c| {
            let bad = c.t.s("bad.sqfs");
            let mut b = std::fs::read(c.var("img")).unwrap();
            b[4..96].fill(0);
            std::fs::write(&bad, &b).unwrap();
            bad
        },
        via: Via::Sw,
        args: &["mount", "{input}", "{mp}"],
        env: &[],
        expect_status: Status::Is(4),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["bad.sqfs is damaged", "does not match its manifest"],
    },
    // magic kept, the rest zeroed: squashfuse_ll refuses it
    Case {
        name: "bare squashfs image with a corrupt superblock",
        setup: |c| {
            let args = ["{tree}", "{out}", "-quiet", "-noappend"];
            damaged_bare(c, "bad-bare.sqfs", "mksquashfs", &args, |b| {
                b[4..96].fill(0)
            })
        },
        via: Via::Sw,
        args: &["mount", "{input}", "{mp}"],
        env: &[],
        expect_status: Status::Is(4),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["squashfuse_ll could not mount", "damaged"],
    },
    // superblock checksum broken: fuse2fs refuses it
    Case {
        name: "bare ext4 image with a corrupt superblock",
        setup: |c| {
            let args = ["-q", "-t", "ext4", "-d", "{tree}", "{out}", "32M"];
            damaged_bare(c, "bad-bare.ext4", "mke2fs", &args, |b| {
                b[1024 + 0x20..1024 + 0x28]
                    .iter_mut()
                    .for_each(|x| *x ^= 0xff)
            })
        },
        via: Via::Sw,
        args: &["mount", "{input}", "{mp}"],
        env: &[],
        expect_status: Status::Is(4),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["fuse2fs could not mount", "damaged"],
    },
    Case {
        name: "mount point is a file",
        setup: |c| {
            let f = c.t.s("file");
            std::fs::write(&f, "x").unwrap();
            f
        },
        via: Via::Sw,
        args: &["mount", "{img}", "{input}"],
        env: &[],
        expect_status: Status::Is(3),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["is not a directory"],
    },
    Case {
        name: "mount point is not empty",
        setup: |c| {
            let full = c.t.mkdir("full");
            std::fs::write(Path::new(&full).join("x"), "x").unwrap();
            full
        },
        via: Via::Sw,
        args: &["mount", "{img}", "{input}"],
        env: &[],
        expect_status: Status::Is(3),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["is not empty"],
    },
    Case {
        name: "mount point is a symbolic link",
        setup: |c| {
            let link = c.t.s("link");
            std::os::unix::fs::symlink(c.var("mp"), &link).unwrap();
            link
        },
        via: Via::Sw,
        args: &["mount", "{img}", "{input}"],
        env: &[],
        expect_status: Status::Is(3),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["symbolic link"],
    },
    // a pool's missing mount point is created, like `load -m`, but only in an existing directory
    Case {
        name: "mount point missing, and its parent too",
        setup: |c| c.t.s("missing/deeper"),
        via: Via::Sw,
        args: &["mount", "{img}", "{input}"],
        env: &[],
        expect_status: Status::Is(3),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["cannot create it", "missing/deeper"],
    },
    Case {
        name: "-o rw",
        setup: no_input,
        via: Via::Sw,
        args: &["mount", "-o", "rw", "{img}", "{mp}"],
        env: &[],
        expect_status: Status::Is(4),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["a pool, which is mounted read-only"],
    },
    Case {
        name: "umount of what is not mounted",
        setup: no_input,
        via: Via::Sw,
        args: &["umount", "{mp}"],
        env: &[],
        expect_status: Status::Is(3),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["is not mounted"],
    },
    Case {
        name: "a bare image without a mount point",
        setup: junk,
        via: Via::Sw,
        args: &["mount", "{input}"],
        env: &[],
        expect_status: Status::Failure,
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &[],
    },
];

#[test]
fn bad_inputs_fail_clearly_and_leave_nothing_mounted() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    run_cases(&Ctx::new(&t, &[("img", &img), ("mp", &mp)]), BAD_INPUTS);
    t.assert_clean();
    // and no helper of ours is left running
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.contains(t.d.path().to_str().unwrap())
            && (l.contains("squashfuse") || l.contains("fuse2fs") || l.contains("sw-pool-serve"))),
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
    each_case(
        &["ext4", "sqfs"],
        |format| format.to_string(),
        |format| {
            let img = pool(&t, format);
            let o = mount_as_nobody(&img, &mp, &state);
            assert_eq!(o.code, 6, "{}", o.stderr);
            assert!(
                o.stderr.contains("not writable by you") || o.stderr.contains("/dev/fuse"),
                "{}",
                o.stderr
            );
            assert!(!o.stderr.contains("image is intact"), "{}", o.stderr);
            assert!(t.mounts().is_empty());
        },
    );
}
