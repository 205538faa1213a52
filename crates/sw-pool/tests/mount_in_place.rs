//! `sw-pool mount --in-place` with sw-pool's tree server (`fuse_reader = "sw-pool"`), real FUSE:
//! one hop (the server reads the tree from chunks verified against the manifest and serves it at
//! the mount point; no served file, no helper), recorded, listed and unmounted like any mount; a
//! chunk corrupted on storage mid-run is EIO with a log line naming the pool, chunk, offset and
//! node, and no byte of it is served; after the server was killed what the kernel had cached may
//! still be read (the verified bytes) and every other read and listing fails at once; the mount
//! is stale in `list`, and `umount --force` or `cleanup --stale` remove it.

mod common;
use common::mount_fixture::*;
use common::*;

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BIG: usize = 12 << 20;

/// The sample pool plus a 12 MiB file of noise.
fn big_pool(t: &T) -> String {
    let tree = t.p("tree");
    sample_tree(&tree);
    fs::write(tree.join("big.dat"), noise(11, BIG)).unwrap();
    pool(t, "sqfs")
}

/// `sw-pool ARGS` with sw-pool's tree server as the FUSE reader.
fn sw(t: &T, args: &[&str]) -> Out {
    run(t.sw().env("SW_POOL_FUSE_READER", "sw-pool").args(args))
}

fn ok(t: &T, args: &[&str]) -> Out {
    let o = sw(t, args);
    assert_eq!(o.code, 0, "sw-pool {args:?}: {}{}", o.stdout, o.stderr);
    o
}

/// Mount `pool` in place at `mp`: its record (JSON).
fn mount_in_place(t: &T, pool: &str, mp: &str) -> serde_json::Value {
    let o = ok(t, &["mount", "--in-place", "--json", pool, mp]);
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", o.stdout))
}

/// A read of `p`, whose pages the kernel held when its server died: `want` or an error, in 2 s.
fn cached_is_verified_or_fails_at_once(p: &Path, want: &[u8]) {
    let start = std::time::Instant::now();
    match fs::read(p) {
        Ok(v) => assert!(v == want, "{}: other bytes than the pool's", p.display()),
        Err(e) => assert!(
            matches!(e.raw_os_error(), Some(5) | Some(103) | Some(107)),
            "{}: {e}",
            p.display()
        ),
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// A listing of `dir` (never listed before) after its server died: an error within 2 s.
fn listing_fails_at_once(dir: &Path) {
    let start = std::time::Instant::now();
    let r: std::io::Result<Vec<_>> = fs::read_dir(dir).and_then(|d| d.collect());
    let e = r.expect_err("a listing of a killed server's mount succeeded");
    assert!(
        matches!(e.raw_os_error(), Some(5) | Some(103) | Some(107)),
        "{}: {e}",
        dir.display()
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

fn kill9(pid: u64) {
    // the server sw-pool started for this test, by its recorded pid
    assert!(pid > 1);
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    for _ in 0..200 {
        if !pid_alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("pid {pid} still alive after SIGKILL");
}

#[test]
fn in_place_is_one_hop_from_verified_chunks_and_a_corrupted_chunk_is_eio_never_its_bytes() {
    let t = T::new();
    let pool = big_pool(&t);
    let mp = t.mkdir("mnt");
    let v = mount_in_place(&t, &pool, &mp);
    let rec = &v["record"];
    assert_eq!(rec["backend"], "sw_pool_tree", "{v}");
    assert_eq!(rec["serving"]["kind"], "chunk-server", "{v}");
    assert!(rec["serving"].get("dir").is_none(), "{v}");
    // one hop: the pool's mount is the server's own, and the only mount under the test's directory
    let line = mountinfo_line(&mp);
    assert!(
        line.contains(" - fuse.sw-pool ") || line.contains(" - fuse sw-pool "),
        "{line}"
    );
    let mpc = fs::canonicalize(&mp).unwrap();
    assert_eq!(t.mounts(), [mpc.display().to_string()]);
    let want = noise(11, BIG);
    let hello = Path::new(&mp).join("install/hello/1.0/bin/hello");
    assert_eq!(
        sha256_file(&hello),
        sha256_file(&t.p("tree/install/hello/1.0/bin/hello"))
    );
    let pid = rec["helper_pid"].as_u64().unwrap();
    let l = ok(&t, &["list"]).stdout;
    assert!(l.contains(&mp) && l.contains("ok"), "{l}");
    // corrupt the pool on storage, mid-run, 11 MiB into big.dat (stored as it is; not read yet)
    let probe = &want[11 << 20..(11 << 20) + 64];
    let bytes = fs::read(&pool).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == probe)
        .expect("big.dat's bytes are stored uncompressed in the pool");
    {
        let f = fs::OpenOptions::new().write(true).open(&pool).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[!bytes[at]], at as u64).unwrap();
        f.sync_all().unwrap();
    }
    drop_caches();
    // read big.dat in 128 KiB pieces: each is the original bytes or EIO, never anything else
    let mut f = fs::File::open(Path::new(&mp).join("big.dat")).unwrap();
    let (mut eio, mut good) = (0, 0);
    for off in (0..BIG).step_by(128 << 10) {
        let mut piece = vec![0u8; 128 << 10];
        f.seek(SeekFrom::Start(off as u64)).unwrap();
        match f.read_exact(&mut piece) {
            Ok(()) => {
                assert!(
                    piece == want[off..off + (128 << 10)],
                    "bytes at {off} of big.dat differ from the source: an unverified byte was served"
                );
                good += 1;
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(5), "at {off}: {e}");
                eio += 1;
            }
        }
    }
    assert!(eio >= 1 && good >= 64, "eio {eio}, good {good}");
    drop(f);
    // the rest of the tree still reads
    assert_eq!(
        sha256_file(&hello),
        sha256_file(&t.p("tree/install/hello/1.0/bin/hello"))
    );
    let log = fs::read_dir(t.state().join("mounts"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| fs::read_to_string(e.path()).unwrap())
        .collect::<String>();
    let chunk = at as u64 >> 20;
    let node = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        log.contains(&format!("chunk {chunk} at byte offset {}", chunk << 20))
            && log.contains(&format!("node {}", node.trim()))
            && log.contains(&pool),
        "the log names the pool {pool}, chunk {chunk}, its offset and the node: {log}"
    );
    assert!(pid_alive(pid));
    ok(&t, &["umount", &mp]);
    t.assert_clean();
}

#[test]
fn a_killed_one_hop_server_fails_uncached_reads_at_once_is_stale_and_is_removed() {
    let t = T::new();
    let pool = big_pool(&t);
    let mp = t.mkdir("mnt");
    // umount --force, then cleanup --stale
    for clean in [&["umount", "--force", &mp][..], &["cleanup", "--stale"][..]] {
        let v = mount_in_place(&t, &pool, &mp);
        assert_eq!(v["record"]["backend"], "sw_pool_tree", "{v}");
        let pid = v["record"]["helper_pid"].as_u64().unwrap();
        let big = Path::new(&mp).join("big.dat");
        assert!(fs::read(&big).unwrap() == noise(11, BIG));
        // an entry the kernel holds (the listing brought it), its pages never read
        let hello = Path::new(&mp).join("install/hello/1.0/bin/hello");
        assert!(fs::read_dir(hello.parent().unwrap()).unwrap().count() == 1);
        kill9(pid);
        // what the kernel cached of the verified pool may still be read: its bytes or an error,
        // at once; everything else fails at once
        cached_is_verified_or_fails_at_once(&big, &noise(11, BIG));
        read_fails_at_once(&hello);
        read_fails_at_once(&Path::new(&mp).join("source/cfact/cfact.c"));
        // a directory the kernel knows (looked up on the way to `bin`), never listed
        listing_fails_at_once(&Path::new(&mp).join("install/hello/1.0"));
        let lj = t.list_json();
        assert_eq!(lj["mounts"][0]["status"], "stale", "{lj}");
        let l = ok(&t, &["list"]).stdout;
        assert!(l.contains("stale") && l.contains(&mp), "{l}");
        // mounting again is refused with the fix
        let o = sw(&t, &["mount", "--in-place", &pool, &mp]);
        assert_ne!(o.code, 0);
        assert!(o.stderr.contains("stale"), "{}", o.stderr);
        let o = ok(&t, clean);
        assert!(
            o.stdout.contains("stale") || o.stdout.contains("unmounted"),
            "{clean:?}: {}",
            o.stdout
        );
        t.assert_clean();
    }
}
