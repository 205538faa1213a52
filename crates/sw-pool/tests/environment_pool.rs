//! `sw-pool run --pool NAME/VERSION`: a pool for one environment only — resolved on the pool path,
//! checked against the trust policy, copied into the node-local cache (verified, once), mounted by
//! FUSE inside the environment at its usual mount point with its modules on MODULEPATH; nothing
//! mounted on the node, nothing left when the environment ends (real sw-pool-serve, squashfuse_ll
//! and fuse2fs, as uid 65534).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::env_fixture::*;
use common::*;

/// A pool tree: `install/NAME/1/bin/NAME` printing a line, and its modulefile.
fn tree(root: &Path, name: &str) {
    let bin = root.join(format!("install/{name}/1/bin"));
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(root.join(format!("modulefiles/{name}"))).unwrap();
    std::fs::write(
        bin.join(name),
        format!("#!/bin/sh\necho {name} from the pool\n"),
    )
    .unwrap();
    std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        root.join(format!("modulefiles/{name}/1.lua")),
        format!("prepend_path(\"PATH\", \"{name}\")\n"),
    )
    .unwrap();
}

/// Build `tree` as pool NAME/1 in FORMAT into `pools/` (readable by the test user).
fn build(f: &Fixture, name: &str, format: &str) -> PathBuf {
    let t = f.dir.path().join(format!("tree-{name}"));
    tree(&t, name);
    let ext = if format == "squashfs" { "sqfs" } else { format };
    let pool = f.dir.path().join(format!("pools/{name}-1.{ext}"));
    let mut c = sw();
    c.args([
        "build",
        "--format",
        format,
        "--name",
        name,
        "--version",
        "1",
    ]);
    if format != "squashfs" {
        c.args(["-s", "16MB"]);
    }
    let b = run(c.arg(&pool).arg(&t));
    assert_eq!(b.code, 0, "{}", b.stderr);
    std::fs::set_permissions(&pool, std::fs::Permissions::from_mode(0o644)).unwrap();
    pool
}

fn in_env(f: &Fixture, flags: &str, script: &str, extra: &[(&str, &str)]) -> Out {
    let mut a: Vec<&str> = vec!["run"];
    a.extend(flags.split_whitespace());
    a.extend(["--", "sh", "-c", script]);
    let mut c = f.cmd(&a);
    c.env("SW_POOL_MOUNT", f.dir.path().join("mnt"))
        .env("SW_POOL_CACHE", f.dir.path().join("cache"))
        .env("SW_POOL_PATH", f.dir.path().join("pools"))
        .env_remove("MODULEPATH")
        .env_remove("SW_POOL_REQUIRE_SIGNATURE");
    for (k, v) in extra {
        c.env(k, v);
    }
    run(&mut c)
}

/// Processes whose command line names `needle` (the test's own paths: its FUSE daemons).
fn processes_naming(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(needle) && !c.contains("cargo") {
                out.push(c);
            }
        }
    }
    out
}

#[test]
fn a_pool_is_mounted_for_one_environment_only_and_leaves_nothing() {
    if !ready() {
        return;
    }
    if !Path::new("/usr/bin/squashfuse_ll").exists() || !Path::new("/usr/bin/fuse2fs").exists() {
        skip("squashfuse and fuse2fs are needed (tools/setup-deps.sh installs them)");
        return;
    }
    let f = Fixture::new();
    std::fs::set_permissions(f.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for d in ["mnt", "cache", "pools"] {
        let p = f.dir.path().join(d);
        std::fs::create_dir(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let sq = build(&f, "tpool", "squashfs");
    let e2 = build(&f, "tpx", "ext2");
    let before = (sha256_file(&sq), sha256_file(&e2));
    let mnt = f.dir.path().join("mnt");

    // two pools, squashfs and ext2, at their usual places; their modules on MODULEPATH
    let o = in_env(
        &f,
        "-v --pool tpool/1 --pool tpx/1",
        "$SW_POOL_MOUNT/tpool/1/install/tpool/1/bin/tpool; \
         $SW_POOL_MOUNT/tpx/1/install/tpx/1/bin/tpx; echo \"MP=$MODULEPATH\"; \
         ls $SW_POOL_MOUNT/tpool/1/modulefiles/tpool; \
         touch $SW_POOL_MOUNT/tpool/1/x 2>/dev/null || echo pool read-only; \
         grep \" $SW_POOL_MOUNT/tpool/1 \" /proc/self/mountinfo | sed 's/.* - /FS=/'",
        &[],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let want_mp = format!(
        "MP={}:{}",
        mnt.join("tpx/1/modulefiles").display(),
        mnt.join("tpool/1/modulefiles").display()
    );
    for want in [
        "tpool from the pool",
        "tpx from the pool",
        &want_mp,
        "1.lua",
        "pool read-only",
    ] {
        assert!(o.stdout.contains(want), "{want:?} in {}", o.stdout);
    }
    assert!(
        o.stderr.contains("pool tpool/1 at") && o.stderr.contains("(this environment only)"),
        "{}",
        o.stderr
    );
    // the squashfs pool is served by sw-pool's own server (the default), in one hop; the ext
    // pool by fuse2fs
    // (type and source: `fuse sw-pool`, mounted directly by the namespace's root)
    let fs = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("FS="))
            .map(|t| t.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    let t = fs(&o.stdout);
    assert!(
        t.starts_with("fuse") && t.ends_with(" sw-pool"),
        "{t}: {}",
        o.stdout
    );
    assert!(
        o.stderr.contains("tpool/1 at") && o.stderr.contains("by sw-pool-serve"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("by fuse2fs"), "{}", o.stderr);
    // fuse_reader = squashfuse_ll: the fallback mounts it, as before
    let o = in_env(
        &f,
        "-v --pool tpool/1",
        "$SW_POOL_MOUNT/tpool/1/install/tpool/1/bin/tpool; \
         grep \" $SW_POOL_MOUNT/tpool/1 \" /proc/self/mountinfo | sed 's/.* - /FS=/'",
        &[("SW_POOL_FUSE_READER", "squashfuse_ll")],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("tpool from the pool"), "{}", o.stdout);
    let t = fs(&o.stdout);
    assert!(
        t.starts_with("fuse") && t.contains("squashfuse"),
        "{t}: {}",
        o.stdout
    );
    assert!(o.stderr.contains("by squashfuse_ll"), "{}", o.stderr);
    // nothing on the node: the mount points are empty, no daemon serves the copies, no record
    let cache = f.dir.path().join("cache");
    for p in ["tpool/1", "tpx/1"] {
        assert_eq!(std::fs::read_dir(mnt.join(p)).unwrap().count(), 0, "{p}");
    }
    assert!(
        processes_naming(&cache.to_string_lossy()).is_empty(),
        "{:?}",
        processes_naming(&cache.to_string_lossy())
    );
    let o = f.run(&["list", "--json"]);
    assert!(!o.stdout.contains("tpool"), "{}", o.stdout);
    // the copies are in the node's cache, verified; a second start moves nothing and works
    let entries: Vec<_> = walk(&cache)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "pool"))
        .collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let o = in_env(
        &f,
        "--pool tpool/1",
        "cat $SW_POOL_MOUNT/tpool/1/install/tpool/1/bin/tpool",
        &[],
    );
    assert!(o.stdout.contains("echo tpool"), "{}", o.stderr);
    // with a layer: the pool is there over the layer's root, and writes to it still fail
    assert_eq!(f.run(&["layer", "create", "dev"]).code, 0);
    let o = in_env(
        &f,
        "--layer dev --pool tpool/1",
        "echo t > /opt-t; $SW_POOL_MOUNT/tpool/1/install/tpool/1/bin/tpool; \
         echo x > $SW_POOL_MOUNT/tpool/1/y 2>/dev/null || echo pool read-only",
        &[],
    );
    assert_eq!(
        o.stdout, "tpool from the pool\npool read-only\n",
        "{}",
        o.stderr
    );

    // bad input: an unknown pool, an unsigned one where signatures are required, a corrupt one;
    // each named, exit 125, nothing half-copied
    let o = in_env(&f, "--pool nope/9", "true", &[]);
    assert_eq!(o.code, 125);
    assert!(o.stderr.contains("nope/9"), "{}", o.stderr);
    let o = in_env(
        &f,
        "--pool tpool/1",
        "true",
        &[("SW_POOL_REQUIRE_SIGNATURE", "1")],
    );
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("sign"), "{}", o.stderr);
    let bad = build(&f, "tbad", "squashfs");
    let mut bytes = std::fs::read(&bad).unwrap();
    bytes[200] ^= 0xff; // in the image's data, covered by the manifest's chunk hashes
    std::fs::write(&bad, &bytes).unwrap();
    let o = in_env(&f, "--pool tbad/1", "echo ran", &[]);
    assert_eq!(o.code, 125, "{}{}", o.stdout, o.stderr);
    assert!(!o.stdout.contains("ran"));
    assert!(o.stderr.contains("tbad"), "{}", o.stderr);
    let leftovers: Vec<_> = walk(&cache)
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("tbad"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // the pools themselves are unchanged
    assert_eq!((sha256_file(&sq), sha256_file(&e2)), before);
}
