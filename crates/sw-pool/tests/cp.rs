//! `sw-pool cp` / `scalable-fs-cp`: the single-node path (no launcher, no MPI), and the MPI path on
//! this machine with real Open MPI and `SW_POOL_FAKE_NODES=1` (every rank its own "node").
//! The real multi-node tests run on the virtual cluster: tests/cluster/t_10_cp.sh.

mod common;
use common::*;

use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn json(o: &Out) -> serde_json::Value {
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout))
}

fn random_file(p: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut v = vec![0u8; len];
    for b in v.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    std::fs::write(p, v).unwrap();
}

fn cp(src: &Path, dest: &Path, extra: &[&str]) -> Out {
    let mut args = vec!["cp", "--json"];
    args.extend_from_slice(extra);
    args.push(src.to_str().unwrap());
    args.push(dest.to_str().unwrap());
    sw_run(&args)
}

#[test]
fn files_of_every_shape_copy_identically() {
    let d = scratch();
    let chunk = 65536usize;
    for (name, len) in [
        ("zero", 0usize),
        ("one", 1),
        ("chunk-minus-1", chunk - 1),
        ("chunk", chunk),
        ("chunk-plus-1", chunk + 1),
        ("dense", 5 * chunk + 123),
    ] {
        let src = d.path().join(name);
        random_file(&src, len, len as u64 + 7);
        let dest = d.path().join(format!("{name}.out"));
        let o = cp(&src, &dest, &["--chunk", "64KiB"]);
        assert_eq!(o.code, 0, "{name}: {}", o.stderr);
        assert_eq!(sha256_file(&src), sha256_file(&dest), "{name}");
        let j = json(&o);
        assert_eq!(j["bytes_read_from_src"], len as u64, "{name}");
        assert_eq!(j["nodes"], 1);
        assert_nothing_left(d.path(), &format!("{name}.out.swpool-tmp"));
    }
}

#[test]
fn sparse_file_keeps_holes_and_zero_chunks_are_not_read_twice() {
    let d = scratch();
    let src = d.path().join("sparse");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    let mut f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(20 << 20)).unwrap();
    f.write_all(&vec![0xabu8; 3 << 20]).unwrap();
    // an explicitly written all-zero region: data for SEEK_DATA, but never sent or written
    f.seek(std::io::SeekFrom::Start(40 << 20)).unwrap();
    f.write_all(&vec![0u8; 4 << 20]).unwrap();
    drop(f);
    let dest = d.path().join("sparse.out");
    let o = cp(&src, &dest, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(sha256_file(&src), sha256_file(&dest));
    let m = std::fs::metadata(&dest).unwrap();
    assert_eq!(m.len(), 64 << 20);
    assert!(
        m.blocks() * 512 <= 4 << 20,
        "DEST should stay sparse: {} bytes allocated",
        m.blocks() * 512
    );
    let j = json(&o);
    assert_eq!(j["bytes_written"], 3u64 << 20, "{j}");
    assert!(j["bytes_read_from_src"].as_u64().unwrap() <= 8 << 20, "{j}");
}

#[test]
fn repeat_copy_reads_nothing_and_a_changed_dest_is_copied_again() {
    let d = scratch();
    let src = d.path().join("f");
    random_file(&src, 300_000, 3);
    let dest = d.path().join("f.out");
    assert_eq!(cp(&src, &dest, &[]).code, 0);
    let o = cp(&src, &dest, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = json(&o);
    assert_eq!(j["skipped_all"], true, "{j}");
    assert_eq!(j["bytes_read_from_src"], 0);
    // plain output says so too
    let o = sw_run(&["cp", src.to_str().unwrap(), dest.to_str().unwrap()]);
    assert!(o.stdout.contains("nothing copied"), "{}", o.stdout);
    // DEST modified: copied again
    std::fs::OpenOptions::new()
        .append(true)
        .open(&dest)
        .unwrap()
        .write_all(b"x")
        .unwrap();
    let j = json(&cp(&src, &dest, &[]));
    assert_eq!(j["skipped_all"], false);
    assert_eq!(sha256_file(&src), sha256_file(&dest));
    // SRC modified (same size, new mtime): copied again
    random_file(&src, 300_000, 4);
    let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .set_modified(t)
        .unwrap();
    let j = json(&cp(&src, &dest, &[]));
    assert_eq!(j["skipped_all"], false);
    assert_eq!(sha256_file(&src), sha256_file(&dest));
}

#[test]
fn directory_tree_keeps_modes_links_and_mtimes() {
    let d = scratch();
    let t = d.path().join("tree");
    std::fs::create_dir_all(t.join("a/b/c")).unwrap();
    random_file(&t.join("a/big"), 3_000_000, 9);
    std::fs::write(t.join("a/b/script.sh"), "#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(t.join("a/b/script.sh"), PermissionsExt::from_mode(0o751)).unwrap();
    std::fs::set_permissions(t.join("a/b/c"), PermissionsExt::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink("../big", t.join("a/b/link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/dangling", t.join("dangling")).unwrap();
    std::fs::hard_link(t.join("a/big"), t.join("a/b/c/hard")).unwrap();
    std::fs::write(t.join("empty"), "").unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(t.join("empty"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    std::fs::write(t.join("ns"), "nanoseconds").unwrap();
    std::fs::File::options()
        .write(true)
        .open(t.join("ns"))
        .unwrap()
        .set_modified(
            std::time::SystemTime::UNIX_EPOCH
                + std::time::Duration::new(1_500_000_000, 123_456_789),
        )
        .unwrap();
    std::fs::write(t.join("owned"), "x").unwrap();
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(t.join("owned"), Some(4321), Some(8765)).unwrap();
        std::os::unix::fs::lchown(t.join("a/b/link"), Some(4322), Some(8766)).unwrap();
    }
    // directory mtimes last (creating entries changed them), with a nanosecond part
    for (rel, ns) in [("a/b/c", 1u32), ("a/b", 22), ("a", 333)] {
        let ts = rustix::fs::Timespec {
            tv_sec: 1_600_000_000,
            tv_nsec: ns as _,
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            t.join(rel),
            &rustix::fs::Timestamps {
                last_access: ts,
                last_modification: ts,
            },
            rustix::fs::AtFlags::empty(),
        )
        .unwrap();
    }
    let dest = d.path().join("copy");
    let o = cp(&t, &dest, &["--chunk", "1MiB"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(json(&o)["kind"], "directory");
    for rel in ["a/big", "a/b/script.sh", "empty", "a/b/c/hard"] {
        assert_eq!(
            sha256_file(&t.join(rel)),
            sha256_file(&dest.join(rel)),
            "{rel}"
        );
    }
    let m = |p: &Path| std::fs::symlink_metadata(p).unwrap();
    assert_eq!(m(&dest.join("a/b/script.sh")).mode() & 0o7777, 0o751);
    assert_eq!(m(&dest.join("a/b/c")).mode() & 0o7777, 0o700);
    assert_eq!(
        std::fs::read_link(dest.join("a/b/link")).unwrap(),
        Path::new("../big")
    );
    assert_eq!(
        std::fs::read_link(dest.join("dangling")).unwrap(),
        Path::new("/nonexistent/dangling")
    );
    assert_eq!(
        m(&dest.join("a/big")).ino(),
        m(&dest.join("a/b/c/hard")).ino(),
        "hard link kept"
    );
    assert_eq!(m(&dest.join("empty")).mtime(), 1_000_000_000);
    // mtimes to the nanosecond (PAX extended headers): files, directories, symlinks
    for rel in [
        "a",
        "a/b",
        "a/b/c",
        "a/big",
        "a/b/script.sh",
        "a/b/link",
        "ns",
    ] {
        assert_eq!(
            (m(&dest.join(rel)).mtime(), m(&dest.join(rel)).mtime_nsec()),
            (m(&t.join(rel)).mtime(), m(&t.join(rel)).mtime_nsec()),
            "{rel}"
        );
    }
    assert_eq!(m(&dest.join("ns")).mtime_nsec(), 123_456_789);
    if rustix::process::geteuid().is_root() {
        // ownership kept when copying as root
        let o = m(&dest.join("owned"));
        assert_eq!((o.uid(), o.gid()), (4321, 8765));
        let l = m(&dest.join("a/b/link"));
        assert_eq!((l.uid(), l.gid()), (4322, 8766), "symlink owner");
    }
    assert_nothing_left(d.path(), "copy.swpool-tmp");
    // repeat: nothing read
    let j = json(&cp(&t, &dest, &[]));
    assert_eq!(j["skipped_all"], true, "{j}");
    // a non-empty directory that sw-pool did not make is never replaced
    let foreign = d.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("keep"), "x").unwrap();
    let o = cp(&t, &foreign, &[]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("not made by sw-pool cp"), "{}", o.stderr);
    assert!(foreign.join("keep").exists());
}

#[test]
fn pool_copy_is_verified_and_repeat_reads_nothing() {
    let d = scratch();
    let tree = d.path().join("demo");
    sample_tree(&tree);
    let pool = d.path().join("demo.sqfs");
    let o = sw_run(&["build", pool.to_str().unwrap(), tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let dest = d.path().join("cache.sqfs");
    let o = cp(&pool, &dest, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(json(&o)["kind"], "pool");
    assert_eq!(sha256_file(&pool), sha256_file(&dest));
    let o = sw_run(&["inspect", dest.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = json(&cp(&pool, &dest, &[]));
    assert_eq!(j["skipped_all"], true);
    assert_eq!(j["bytes_read_from_src"], 0);
    // a damaged source chunk is caught before anything is committed
    let dest2 = d.path().join("cache2.sqfs");
    let mut bytes = std::fs::read(&pool).unwrap();
    bytes[100] ^= 0xff;
    let bad = d.path().join("bad.sqfs");
    std::fs::write(&bad, &bytes).unwrap();
    let o = cp(&bad, &dest2, &[]);
    assert_eq!(o.code, 4, "{} {}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("does not match its manifest hash"),
        "{}",
        o.stderr
    );
    assert!(!dest2.exists());
    assert_nothing_left(d.path(), "cache2.sqfs.swpool-tmp");
}

#[test]
fn missing_src_and_missing_dest_dir_fail_cleanly() {
    let d = scratch();
    let src = d.path().join("f");
    random_file(&src, 1000, 1);
    let host = swpool_core::users::hostname();
    let o = cp(&d.path().join("nope"), &d.path().join("x"), &[]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stderr.contains(&host) && o.stderr.contains("cannot access SRC"),
        "{}",
        o.stderr
    );
    let o = cp(&src, &d.path().join("missing/dir/x"), &[]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stderr.contains(&host) && o.stderr.contains("create it on every node"),
        "{}",
        o.stderr
    );
    if !is_root() {
        std::fs::set_permissions(&src, PermissionsExt::from_mode(0o000)).unwrap();
        let o = cp(&src, &d.path().join("y"), &[]);
        assert_ne!(o.code, 0);
        assert!(o.stderr.contains("SRC"), "{}", o.stderr);
    } else {
        // as root permissions do not stop reads: run as nobody when possible
        let o = sw_as_nobody(&["cp", src.to_str().unwrap(), "/root/forbidden-x"]);
        if o.code == 127 {
            skip("the unreadable-SRC check needs setpriv to run as nobody");
        } else {
            assert_ne!(o.code, 0, "{}", o.stderr);
        }
    }
    assert_nothing_left(d.path(), ".x.swpool-tmp");
}

#[test]
fn multicall_name_scalable_fs_cp() {
    let d = scratch();
    let src = d.path().join("f");
    random_file(&src, 5000, 5);
    let link = d.path().join("scalable-fs-cp");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let dest = d.path().join("g");
    let o = run(std::process::Command::new(&link)
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .arg(&src)
        .arg(&dest));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(sha256_file(&src), sha256_file(&dest));
}

/// Open MPI's mpirun on this machine, if there is one.
fn mpirun() -> Option<&'static str> {
    ["mpirun.openmpi", "mpirun"].into_iter().find(|m| {
        std::process::Command::new(m)
            .arg("--version")
            .output()
            .is_ok()
    })
}

/// `mpirun -np NP … sw-pool cp --json --chunk 64KiB` with every rank its own "node"
/// (`SW_POOL_FAKE_NODES=1`) and `env` (`NAME=VALUE`) exported to the ranks; SRC and DEST follow.
/// Open MPI's session directory lies under `scratch`, not in the shared `/tmp/ompi.HOST.UID`: two
/// `mpirun`s of this file run side by side, and one that ends removes that shared directory while
/// the other creates its own in it (orte_session_dir: "mkdir … No such file or directory").
fn mpi_cp(mpirun: &str, np: usize, scratch: &Path, env: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(mpirun);
    c.arg("--mca")
        .arg("orte_tmpdir_base")
        .arg(scratch)
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .args([
            "--mca",
            "btl",
            "self,vader,tcp",
            "-x",
            "SW_POOL_FAKE_NODES=1",
        ]);
    for e in env {
        c.args(["-x", e]);
    }
    c.arg(bin()).args(["cp", "--json", "--chunk", "64KiB"]);
    c
}

/// The ring with many rounds on 5 "nodes" (an odd ring): dense, all-zero and short chunks, one
/// chunk of every reader per round and rounds capped at 2 and 1 chunks (`SW_POOL_BENCH_SLOTS`, where
/// most steps move nothing); every node gets the same bytes and every byte is read once.
#[test]
fn mpi_ring_rounds_of_every_shape() {
    let Some(mpirun) = mpirun() else {
        skip("no mpirun on this machine");
        return;
    };
    let d = scratch();
    let src = d.path().join("f");
    let chunk = 65536usize;
    let mut data = Vec::new();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for c in 0..37 {
        for _ in 0..chunk {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // every third chunk all zeros (read, not sent); chunk 36 is short (the tail)
            data.push(if c % 3 == 1 { 0 } else { x as u8 });
        }
    }
    data.truncate(36 * chunk + 1234);
    std::fs::write(&src, &data).unwrap();
    for cap in ["", "2", "1"] {
        let dest = d.path().join(format!("ring{cap}-%n"));
        let o = run(mpi_cp(
            mpirun,
            5,
            d.path(),
            &[
                "SW_POOL_CP_ALGORITHM=ring",
                &format!("SW_POOL_BENCH_SLOTS={cap}"),
            ],
        )
        .arg(&src)
        .arg(&dest));
        assert_eq!(o.code, 0, "cap {cap:?}: {}", o.stderr);
        let j = json(&o);
        assert_eq!(j["nodes_received"], 5);
        assert_eq!(j["bytes_read_from_src"], data.len() as u64, "cap {cap:?}");
        for i in 0..5 {
            assert_eq!(
                sha256_file(&src),
                sha256_file(&d.path().join(format!("ring{cap}-{i}"))),
                "cap {cap:?} node {i}"
            );
        }
    }
}

/// Real Open MPI on this machine: 4 ranks, each its own "node" (`SW_POOL_FAKE_NODES=1`, `%n` in
/// DEST = node index), every distribution algorithm, and a repeat that reads nothing.
#[test]
fn mpi_four_fake_nodes() {
    let Some(mpirun) = mpirun() else {
        skip("no mpirun on this machine");
        return;
    };
    let d = scratch();
    let src = d.path().join("f");
    random_file(&src, 5 * 65536 + 17, 11);
    for algo in ["bcast", "allgather", "ring"] {
        let dest = d.path().join(format!("{algo}-%n"));
        let o = run(mpi_cp(
            mpirun,
            4,
            d.path(),
            &[&format!("SW_POOL_CP_ALGORITHM={algo}")],
        )
        .arg(&src)
        .arg(&dest));
        assert_eq!(o.code, 0, "{algo}: {}", o.stderr);
        let j = json(&o);
        assert_eq!(j["nodes"], 4);
        assert_eq!(j["nodes_received"], 4);
        assert_eq!(j["algorithm"], algo);
        assert_eq!(
            j["bytes_read_from_src"],
            5 * 65536 + 17,
            "each byte read once"
        );
        for i in 0..4 {
            assert_eq!(
                sha256_file(&src),
                sha256_file(&d.path().join(format!("{algo}-{i}"))),
                "{algo} node {i}"
            );
        }
    }
}
