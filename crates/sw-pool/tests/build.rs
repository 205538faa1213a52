//! `sw-pool build`: the paper's call, reproducibility, and every bad input (clear error, no OUT left).

mod common;
use common::*;

use std::process::Command;

#[test]
fn paper_call_ext2_1gb_mounts_with_fuse2fs_and_squashfs_with_squashfuse_ll() {
    let d = scratch();
    let tree = d.path().join("test-pool");
    std::fs::create_dir(&tree).unwrap();
    // head -c 1GB /dev/urandom > test-pool/random.data
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "head -c 1GB /dev/urandom > {}/random.data",
            tree.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
    let want = sha256_file(&tree.join("random.data"));
    // sw-pool build -s 1020MB test-pool.ext2 test-pool   (run in the pool's directory, verbatim)
    let o = run(sw().current_dir(d.path()).args([
        "build",
        "-s",
        "1020MB",
        "test-pool.ext2",
        "test-pool",
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("no pool.toml"),
        "ad-hoc tree warning expected: {}",
        o.stderr
    );
    let img = d.path().join("test-pool.ext2");
    let inspect = sw_run(&["inspect", "--json", img.to_str().unwrap()]);
    assert_eq!(inspect.code, 0, "{}", inspect.stderr);
    let j: serde_json::Value = serde_json::from_str(&inspect.stdout).unwrap();
    assert_eq!(j["manifest"]["format"], "ext2");
    assert_eq!(j["manifest"]["image_size"], 1_020_000_000u64);
    assert_eq!(j["check"]["ok"], true);
    for (image, helper) in [
        (img.clone(), "fuse2fs"),
        (d.path().join("test-pool.sqfs"), "squashfuse_ll"),
    ] {
        if helper == "squashfuse_ll" {
            let o = run(sw()
                .current_dir(d.path())
                .args(["build", "test-pool.sqfs", "test-pool"]));
            assert_eq!(o.code, 0, "{}", o.stderr);
        }
        let mnt = d.path().join(format!("mnt-{helper}"));
        std::fs::create_dir(&mnt).unwrap();
        let mut c = Command::new(helper);
        if helper == "fuse2fs" {
            c.args(["-o", "ro,fakeroot"]);
        }
        let st = c.arg(&image).arg(&mnt).status().unwrap();
        assert!(st.success(), "{helper} could not mount {}", image.display());
        let got = sha256_file(&mnt.join("random.data"));
        let _ = Command::new("fusermount3").arg("-u").arg(&mnt).status();
        assert_eq!(got, want, "{helper}: content differs");
    }
}

fn reproducible(format: &str) {
    let d = scratch();
    let tree = d.path().join("tree");
    sample_tree(&tree);
    std::fs::write(tree.join("install/hello/1.0/data.bin"), vec![42u8; 3 << 20]).unwrap();
    let a = d.path().join(format!("a.{format}"));
    let b = d.path().join(format!("b.{format}"));
    let o = sw_run(&[
        "build",
        "--gen-modulefiles",
        a.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // a second build, at another time (the clock moved on; nothing in the tree changed)
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let o = sw_run(&["build", b.to_str().unwrap(), tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        sha256_file(&a),
        sha256_file(&b),
        "{format}: two builds of one tree differ"
    );
    // SOURCE_DATE_EPOCH is honoured: the recorded build time changes, the content stays comparable
    let c = d.path().join(format!("c.{format}"));
    let o = run(sw().env("SOURCE_DATE_EPOCH", "1700000000").args([
        "build",
        c.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: serde_json::Value =
        serde_json::from_str(&sw_run(&["inspect", "--json", c.to_str().unwrap()]).stdout).unwrap();
    assert_eq!(j["manifest"]["created"], 1700000000u64);
}

#[test]
fn two_builds_are_bit_identical_ext4() {
    reproducible("ext4");
}

#[test]
fn two_builds_are_bit_identical_squashfs() {
    reproducible("sqfs");
}

fn assert_fails(o: &Out, code: i32, needles: &[&str]) {
    assert_eq!(o.code, code, "exit status; stderr: {}", o.stderr);
    for n in needles {
        assert!(
            o.stderr.contains(n),
            "error should mention {n:?}: {}",
            o.stderr
        );
    }
    assert!(o.stderr.starts_with("sw-pool: error: "), "{}", o.stderr);
}

#[test]
fn bad_inputs_give_clear_errors_and_leave_no_output() {
    let d = scratch();
    let dir = d.path();
    let p = |n: &str| dir.join(n).to_string_lossy().into_owned();
    std::fs::create_dir(dir.join("tree")).unwrap();
    std::fs::write(dir.join("tree/file"), b"data").unwrap();

    // SRC missing
    let o = sw_run(&["build", &p("o1.sqfs"), &p("nope")]);
    assert_fails(&o, 3, &["nope", "does not exist"]);
    assert_nothing_left(dir, "o1.sqfs");
    // SRC not a directory
    let o = sw_run(&["build", &p("o2.ext4"), &p("tree/file")]);
    assert_fails(&o, 3, &["tree/file", "not a directory"]);
    assert_nothing_left(dir, "o2.ext4");
    // SRC is a symlink loop
    std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
    let o = sw_run(&["build", &p("o3.ext4"), &p("loop")]);
    assert_fails(&o, 3, &["loop", "symbolic link loop"]);
    assert_nothing_left(dir, "o3.ext4");
    // SIZE too small, found before anything is written
    let o = sw_run(&["build", "-s", "1KB", &p("o4.ext4"), &p("tree")]);
    assert_fails(&o, 3, &["too small", "-s", "omit -s"]);
    assert_nothing_left(dir, "o4.ext4");
    // a SIZE that is no size
    let o = sw_run(&["build", "-s", "12XB", &p("o5.ext4"), &p("tree")]);
    assert_fails(&o, 3, &["invalid size", "12XB"]);
    assert_nothing_left(dir, "o5.ext4");
    // OUT exists without --force: untouched; with --force: replaced
    std::fs::write(dir.join("exists.sqfs"), b"precious").unwrap();
    let o = sw_run(&["build", &p("exists.sqfs"), &p("tree")]);
    assert_fails(&o, 3, &["exists.sqfs", "already exists", "--force"]);
    assert_eq!(std::fs::read(dir.join("exists.sqfs")).unwrap(), b"precious");
    let o = sw_run(&["build", "--force", &p("exists.sqfs"), &p("tree")]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_ne!(std::fs::read(dir.join("exists.sqfs")).unwrap(), b"precious");
    // OUT's directory missing
    let o = sw_run(&["build", &p("no/such/dir/o6.sqfs"), &p("tree")]);
    assert_fails(&o, 3, &["no/such/dir", "cannot write"]);
    // OUT inside SRC
    let o = sw_run(&["build", &p("tree/self.sqfs"), &p("tree")]);
    assert_fails(&o, 3, &["inside the source tree"]);
    assert_nothing_left(&dir.join("tree"), "self.sqfs");
    // a name mke2fs cannot store: a root-level lost+found that is not a directory
    std::fs::create_dir(dir.join("lf")).unwrap();
    std::fs::write(dir.join("lf/lost+found"), b"x").unwrap();
    let o = sw_run(&["build", &p("o7.ext4"), &p("lf")]);
    assert_fails(&o, 3, &["lost+found", "rename it"]);
    assert_nothing_left(dir, "o7.ext4");
    // ... which squashfs can store
    assert_eq!(sw_run(&["build", &p("o7.sqfs"), &p("lf")]).code, 0);
}

#[test]
fn mke2fs_running_out_of_space_is_a_clear_error() {
    // sizes just above sw-pool's lower bound: mke2fs itself runs out of room for the metadata of
    // 3000 small files; that failure must read as "too small", not as a raw mke2fs message
    let d = scratch();
    let tree = d.path().join("many");
    std::fs::create_dir_all(tree.join("d")).unwrap();
    for i in 0..3000 {
        std::fs::write(tree.join(format!("d/f{i}")), format!("{i}\n")).unwrap();
    }
    let out = d.path().join("m.ext4");
    let o = sw_run(&[
        "build",
        "-s",
        "1",
        out.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    let needed: u64 = o
        .stderr
        .split("needs at least ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no lower bound in {}", o.stderr));
    let mut mapped = 0;
    let mut s = needed;
    loop {
        let o = sw_run(&[
            "build",
            "-s",
            &s.to_string(),
            out.to_str().unwrap(),
            tree.to_str().unwrap(),
        ]);
        if o.code == 0 {
            break;
        }
        assert_fails(&o, 3, &["too small", "ran out of space", "omit -s"]);
        assert_nothing_left(d.path(), "m.ext4");
        mapped += 1;
        s += 256 * 1024;
        assert!(s < needed * 2, "never succeeded: {}", o.stderr);
    }
    assert!(
        mapped > 0,
        "the lower bound {needed} was already enough; the mapping was not exercised"
    );
}

#[test]
fn unreadable_source_and_unwritable_output_dir() {
    let d = scratch();
    let dir = d.path();
    std::fs::create_dir(dir.join("tree")).unwrap();
    std::fs::write(dir.join("tree/ok"), b"x").unwrap();
    std::fs::write(dir.join("tree/secret"), b"x").unwrap();
    std::fs::set_permissions(
        dir.join("tree/secret"),
        std::os::unix::fs::PermissionsExt::from_mode(0o000),
    )
    .unwrap();
    let out = dir.join("u.sqfs");
    let o = sw_as_nobody(&[
        "build",
        out.to_str().unwrap(),
        dir.join("tree").to_str().unwrap(),
    ]);
    assert_fails(&o, 3, &["unreadable", "secret", "chmod"]);
    assert_nothing_left(dir, "u.sqfs");
    std::fs::remove_file(dir.join("tree/secret")).unwrap();
    std::fs::create_dir(dir.join("ro")).unwrap();
    std::fs::set_permissions(
        dir.join("ro"),
        std::os::unix::fs::PermissionsExt::from_mode(0o555),
    )
    .unwrap();
    let out = dir.join("ro/u.sqfs");
    let o = sw_as_nobody(&[
        "build",
        out.to_str().unwrap(),
        dir.join("tree").to_str().unwrap(),
    ]);
    assert!(o.code == 6 || o.code == 3, "{} {}", o.code, o.stderr);
    assert!(
        o.stderr.contains("cannot write the output in") && o.stderr.contains("/ro"),
        "{}",
        o.stderr
    );
    assert_nothing_left(&dir.join("ro"), "u.sqfs");
}

#[test]
fn interrupted_build_leaves_nothing() {
    let d = scratch();
    let tree = d.path().join("big");
    std::fs::create_dir(&tree).unwrap();
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!("head -c 300M /dev/urandom > {}/r", tree.display()))
        .status()
        .unwrap();
    assert!(st.success());
    let out = d.path().join("i.sqfs");
    let mut child = sw()
        .args(["build", out.to_str().unwrap(), tree.to_str().unwrap()])
        .spawn()
        .unwrap();
    // wait until the temporary file exists, then interrupt
    let start = std::time::Instant::now();
    loop {
        let found = std::fs::read_dir(d.path()).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .contains("swpool-tmp")
        });
        if found || start.elapsed().as_secs() > 20 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let st = child.wait().unwrap();
    assert!(!st.success());
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_nothing_left(d.path(), "i.sqfs");
}

/// `--no-compress`: squashfs keeps the data as it is (unsquashfs says so), EROFS is built without
/// a compressor; both are still checked by `inspect`.
#[test]
fn no_compress_stores_the_data_uncompressed() {
    let d = scratch();
    let tree = d.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    // compressible, and not zeros (squashfs stores zero blocks as holes either way)
    std::fs::write(tree.join("text"), "hello, pool\n".repeat(100_000)).unwrap();
    for (fmt, name) in [("squashfs", "a.sqfs"), ("erofs", "a.erofs")] {
        if fmt == "erofs" && Command::new("mkfs.erofs").arg("--help").output().is_err() {
            continue; // erofs-utils not installed (setup-deps installs it)
        }
        let out = d.path().join(name);
        let o = run(sw()
            .args(["build", "-q", "--no-compress", "--format", fmt])
            .arg(&out)
            .arg(&tree));
        assert_eq!(o.code, 0, "{fmt}: {}", o.stderr);
        // 1.2 MB of text stays that large: nothing compressed it
        let len = std::fs::metadata(&out).unwrap().len();
        assert!(len >= 1_200_000, "{fmt}: {len} bytes");
        let i = sw_run(&["inspect", out.to_str().unwrap()]);
        assert_eq!(i.code, 0, "{fmt}: {}", i.stderr);
    }
    let s = Command::new("unsquashfs")
        .arg("-s")
        .arg(d.path().join("a.sqfs"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&s.stdout);
    assert!(text.contains("Data is uncompressed"), "{text}");
}

/// `--all-root`: every file of a squashfs pool is root's whoever owned the tree (a base for
/// `sw-pool run --base`); ext images cannot do it and say so, leaving nothing.
#[test]
fn all_root_makes_every_file_roots() {
    if !is_root() {
        skip("needs root to give the tree another owner");
        return;
    }
    let d = scratch();
    let tree = d.path().join("t");
    std::fs::create_dir_all(tree.join("bin")).unwrap();
    std::fs::write(tree.join("bin/tool"), "#!/bin/sh\n").unwrap();
    for p in [tree.join("bin"), tree.join("bin/tool")] {
        std::os::unix::fs::chown(&p, Some(4321), Some(4321)).unwrap();
    }
    let list = |pool: &std::path::Path| {
        let s = Command::new("unsquashfs")
            .arg("-lln")
            .arg(pool)
            .output()
            .unwrap();
        String::from_utf8_lossy(&s.stdout).to_string()
    };
    let kept = d.path().join("kept.sqfs");
    let o = run(sw()
        .args(["build", "-q", "--format", "squashfs"])
        .arg(&kept)
        .arg(&tree));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(list(&kept).contains("4321/4321"), "{}", list(&kept));
    let all = d.path().join("all.sqfs");
    let o = run(sw()
        .args(["build", "-q", "--all-root", "--format", "squashfs"])
        .arg(&all)
        .arg(&tree));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let l = list(&all);
    assert!(l.contains("0/0") && !l.contains("4321"), "{l}");
    let ext = d.path().join("a.ext4");
    let o = run(sw()
        .args(["build", "-q", "--all-root", "--format", "ext4"])
        .arg(&ext)
        .arg(&tree));
    assert_fails(&o, 3, &["--all-root applies to squashfs and EROFS"]);
    assert_nothing_left(d.path(), "a.ext4");
}

/// What `build` says is true for the tree: one package is "1 package"; a tree without pool.toml
/// but with packages is not called a pool without packages; modulefiles that --gen-modulefiles
/// writes into the source tree are named.
#[test]
fn build_says_what_it_did_to_the_tree() {
    let d = scratch();
    let tree = d.path().join("t");
    std::fs::create_dir_all(tree.join("install/hello/1.0/bin")).unwrap();
    std::fs::write(tree.join("install/hello/1.0/bin/hello"), b"#!/bin/sh\n").unwrap();
    let out = d.path().join("t.sqfs");
    let o = sw_run(&["build", out.to_str().unwrap(), tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains(", 1 package\n"), "{}", o.stdout);
    assert!(
        o.stderr.contains("no pool.toml") && o.stderr.contains("1 package under install/"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("no packages"), "{}", o.stderr);
    std::fs::write(tree.join("pool.toml"), "name = \"t\"\nversion = \"1.0\"\n").unwrap();
    let o = sw_run(&[
        "build",
        "--force",
        "--gen-modulefiles",
        out.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let written = tree.join("modulefiles/hello/1.0.lua");
    assert!(written.is_file());
    assert!(
        o.stdout.contains("wrote 2 modulefiles into")
            && o.stdout.contains(written.to_str().unwrap()),
        "{}",
        o.stdout
    );
}
