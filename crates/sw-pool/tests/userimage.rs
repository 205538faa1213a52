//! Writable user images (issue 31): `image create|resize|check`, `mount --rw` under the lease
//! beside the image, read-only mounts as lease holders, and an image whose helper was killed
//! (SIGKILL) taken back and found clean (the fixture: `common/mount_fixture.rs`).

mod common;
use common::mount_fixture::*;
use common::*;

fn lease_holders(img: &str) -> Vec<serde_json::Value> {
    match std::fs::read(format!("{img}.lease")) {
        Ok(b) => serde_json::from_slice::<serde_json::Value>(&b).unwrap()["holders"]
            .as_array()
            .unwrap()
            .clone(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn create_fills_and_sizes_from_a_directory() {
    let t = T::new();
    let src = t.p("ds");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..500 {
        std::fs::write(src.join("sub").join(format!("f{i}")), format!("{i}\n")).unwrap();
    }
    let img = t.s("data.img");
    let o = t.ok(&[
        "image",
        "create",
        "--small-files",
        &img,
        src.to_str().unwrap(),
    ]);
    assert!(o.stdout.contains("500 files"), "{}", o.stdout);
    let meta = std::fs::metadata(&img).unwrap();
    assert!(meta.len() >= 16 << 20, "{}", meta.len());
    // sparse: far fewer blocks than its size
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < meta.len() / 2,
        "not sparse"
    );
    assert_eq!(t.run(&["image", "check", &img]).code, 0);
    // exists without --force; a size too small; nothing left behind by a refusal
    assert_eq!(
        t.run(&["image", "create", &img, src.to_str().unwrap()])
            .code,
        3
    );
    let small = t.s("small.img");
    let o = t.run(&["image", "create", "--size", "1M", &small]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("too small"), "{}", o.stderr);
    assert!(!std::path::Path::new(&small).exists());
    assert_nothing_left(t.d.path(), "small.img");
    // an empty image of a given size
    let empty = t.s("empty.img");
    t.ok(&["image", "create", "--size", "32MiB", &empty]);
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 32 << 20);
}

#[test]
fn one_writer_or_many_readers_and_the_lease_follows_the_mounts() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let src = t.p("ds");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"first\n").unwrap();
    let img = t.s("data.img");
    t.ok(&["image", "create", &img, src.to_str().unwrap()]);
    let (rw, ro1, ro2) = (t.mkdir("rw"), t.mkdir("ro1"), t.mkdir("ro2"));
    t.ok(&["mount", "--rw", &img, &rw]);
    let h = lease_holders(&img);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0]["mode"], "rw");
    // `list` says the image is held read-write here
    let o = t.ok(&["list"]);
    assert!(o.stdout.contains("data.img (rw)"), "{}", o.stdout);
    std::fs::write(format!("{rw}/b"), b"written\n").unwrap();
    // a second writer and a reader are refused, naming the holder
    for args in [vec!["mount", "--rw", &img, &ro1], vec!["mount", &img, &ro1]] {
        let o = t.run(&args);
        assert_eq!(o.code, 3, "{args:?}: {}", o.stderr);
        assert!(
            o.stderr.contains("is in use: read-write on") && o.stderr.contains(&rw),
            "{}",
            o.stderr
        );
    }
    // offline operations are refused while it is mounted
    assert_eq!(t.run(&["image", "resize", &img, "64M"]).code, 3);
    t.ok(&["umount", &rw]);
    assert!(
        lease_holders(&img).is_empty(),
        "the last unmount gives the lease back"
    );
    // readers share; a writer is refused while one holds
    t.ok(&["mount", &img, &ro1]);
    t.ok(&["mount", &img, &ro2]);
    assert_eq!(lease_holders(&img).len(), 2);
    assert_eq!(
        std::fs::read_to_string(format!("{ro2}/b")).unwrap(),
        "written\n"
    );
    let o = t.run(&["mount", "--rw", &img, &rw]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("read-only on"), "{}", o.stderr);
    t.ok(&["umount", &ro1]);
    t.ok(&["umount", &ro2]);
    // offline: grow, then it is still clean and keeps its files
    t.ok(&["image", "resize", &img, "64M"]);
    assert_eq!(std::fs::metadata(&img).unwrap().len(), 64 << 20);
    t.ok(&["image", "check", &img]);
    t.ok(&["mount", "--rw", &img, &rw]);
    assert_eq!(
        std::fs::read_to_string(format!("{rw}/a")).unwrap(),
        "first\n"
    );
    t.ok(&["umount", &rw]);
    assert!(!std::path::Path::new(&format!("{img}.lease")).exists());
    // a pool cannot be mounted read-write
    let pool = pool(&t, "squashfs");
    let o = t.run(&["mount", "--rw", &pool, &rw]);
    assert_ne!(o.code, 0);
    t.assert_clean();
}

/// The helper serving a read-write mount is killed (SIGKILL, as when a job is killed): the stale
/// mount is cleaned, its lease given back, and the image mounts read-write again (e2fsck -p first:
/// it repairs what the kill left, as a journal replay would), with every file that was fsynced
/// before the kill, and is fsck-clean after the unmount.
#[test]
fn a_killed_writer_leaves_a_clean_image_and_a_free_lease() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = t.s("data.img");
    t.ok(&["image", "create", "--size", "64M", &img]);
    let rw = t.mkdir("rw");
    t.ok(&["mount", "--rw", &img, &rw]);
    for i in 0..200 {
        let p = format!("{rw}/f{i}");
        std::fs::write(&p, format!("{i}\n")).unwrap();
        std::fs::File::open(&p).unwrap().sync_all().unwrap(); // what a program that must keep it does
    }
    let pid = lease_holders(&img)[0]["pid"].as_u64().unwrap();
    assert!(pid > 1);
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::Kill,
    )
    .unwrap();
    // the stale mount is named; cleanup takes it down and gives the lease back
    let o = t.run(&["mount", "--rw", &img, &rw]);
    assert_ne!(o.code, 0);
    t.ok(&["cleanup", "--stale"]);
    assert!(lease_holders(&img).is_empty());
    t.ok(&["mount", "--rw", &img, &rw]);
    assert_eq!(
        std::fs::read_to_string(format!("{rw}/f199")).unwrap(),
        "199\n"
    );
    t.ok(&["umount", &rw]);
    t.ok(&["image", "check", &img]);
    t.assert_clean();
}

/// The trust policy covers pools, not the caller's own data (SECURITY.md, "What the trust policy
/// covers"): with a trusted key installed (signatures required, as after the README's quick start)
/// the caller's own ext4 image mounts read-only as `mount --rw` mounts it read-write; the same
/// image is refused when someone else may write it (group-writable), when it is someone else's, or
/// when it lies in a `pool_path` directory (where pools are published for others).
#[test]
fn own_data_images_mount_read_only_under_a_trust_policy() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let keys = t.mkdir("keys");
    t.ok(&["keygen", "--out", &t.s("k")]);
    std::fs::copy(t.p("k.pub.pem"), format!("{keys}/k.pem")).unwrap();
    let src = t.p("ds");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"mine\n").unwrap();
    let shared = t.mkdir("shared");
    let img = t.s("data.img");
    t.ok(&["image", "create", &img, src.to_str().unwrap()]);
    let mp = t.mkdir("ro");
    let sw = |args: &[&str], path: &str| {
        run(t
            .sw()
            .env("SW_POOL_TRUSTED_KEYS", &keys)
            .env_remove("SW_POOL_REQUIRE_SIGNATURE")
            .env("SW_POOL_PATH", path)
            .args(args))
    };
    let o = sw(&["config"], "");
    assert!(o.stdout.contains("require_signature"), "{}", o.stdout);
    // yours: mounted read-only, with a note that says why the policy does not apply
    let o = sw(&["mount", &img, &mp], "");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("bare image of yours"), "{}", o.stderr);
    assert_eq!(
        std::fs::read_to_string(format!("{mp}/a")).unwrap(),
        "mine\n"
    );
    t.ok(&["umount", &mp]);
    let set_mode = |m: u32| {
        std::fs::set_permissions(&img, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    // refused: writable by the group; someone else's; published on pool_path
    let refused = |o: Out, what: &str| {
        assert_eq!(o.code, 7, "{what}: {}", o.stderr);
        assert!(
            o.stderr.contains("trust policy requires one"),
            "{what}: {}",
            o.stderr
        );
    };
    set_mode(0o664);
    refused(sw(&["mount", &img, &mp], ""), "group-writable");
    set_mode(0o644);
    let st = std::process::Command::new("chown")
        .args(["nobody", &img])
        .status()
        .unwrap();
    assert!(st.success());
    refused(sw(&["mount", &img, &mp], ""), "someone else's");
    std::fs::remove_file(&img).unwrap();
    let _ = std::fs::remove_file(format!("{img}.lease"));
    let published = format!("{shared}/data.img");
    t.ok(&["image", "create", &published, src.to_str().unwrap()]);
    refused(sw(&["mount", &published, &mp], &shared), "on pool_path");
    // the same image off pool_path is the caller's again
    let o = sw(&["mount", &published, &mp], "");
    assert_eq!(o.code, 0, "{}", o.stderr);
    t.ok(&["umount", &mp]);
    t.assert_clean();
}
