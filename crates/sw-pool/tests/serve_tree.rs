//! `sw-pool-serve --tree`: the pool's squashfs tree served over FUSE in one hop, by an
//! unprivileged user, from a node-local copy (`--cached`) or in place through the verifying chunk
//! engine: the served tree is the source tree; a killed server fails reads at once; a chunk
//! corrupted on storage while mounted is EIO with a log line naming the pool, chunk, offset and
//! node, and the rest of the tree still reads.

mod common;
use common::mount_fixture::*;
use common::*;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIG: usize = 24 << 20;

/// The sample tree plus a 24 MiB file, links, a wide directory, an empty one.
fn tree(t: &T) -> PathBuf {
    let root = t.p("tree");
    sample_tree(&root);
    fs::write(root.join("big.dat"), noise(7, BIG)).unwrap();
    std::os::unix::fs::symlink("install/hello/1.0/bin/hello", root.join("hello-link")).unwrap();
    fs::hard_link(root.join("big.dat"), root.join("big-again")).unwrap();
    let wide = root.join("wide");
    fs::create_dir(&wide).unwrap();
    for i in 0..700 {
        fs::write(wide.join(format!("entry-{i:04}")), format!("{i}\n")).unwrap();
    }
    fs::create_dir(root.join("empty")).unwrap();
    fs::set_permissions(
        root.join("install/hello/1.0/bin/hello"),
        fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    root
}

fn build(t: &T, tree: &Path) -> (String, String) {
    let out = t.s("tree.sqfs");
    let o = sw_run(&["build", "-q", &out, tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = sw_run(&["inspect", &out]);
    let digest = o
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("digest"))
        .unwrap_or_else(|| panic!("no digest in `sw-pool inspect`: {}", o.stdout))
        .trim()
        .to_string();
    (out, digest)
}

fn serve_bin() -> PathBuf {
    bin().parent().unwrap().join("sw-pool-serve")
}

/// Whether any user may open /dev/fuse (else a root test serves as root).
fn fuse_for_all() -> bool {
    fs::metadata("/dev/fuse").is_ok_and(|m| m.mode() & 0o006 == 0o006)
}

/// Start `sw-pool-serve --tree` on `mp`, as nobody when root and /dev/fuse allows; its stderr
/// goes to `log`.
fn serve(pool: &str, digest: &str, mp: &Path, extra: &[&str], log: &Path) -> Child {
    let mut c = if is_root() && fuse_for_all() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(serve_bin());
        c
    } else {
        Command::new(serve_bin())
    };
    c.args(["--tree", "--pool", pool, "--digest", digest, "--dir"])
        .arg(mp)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(log).unwrap());
    let child = c.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mounted(mp) {
        assert!(
            Instant::now() < deadline,
            "not mounted at {} within 20 s: {}",
            mp.display(),
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn mounted(mp: &Path) -> bool {
    let mp = fs::canonicalize(mp).unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(mp.to_str().unwrap()))
}

fn mountpoint(t: &T, name: &str) -> PathBuf {
    let mp = t.p(name);
    fs::create_dir(&mp).unwrap();
    fs::set_permissions(&mp, fs::Permissions::from_mode(0o777)).unwrap();
    mp
}

/// Every entry of `src` is in `mp` with the same type, mode, owner, mtime, size, bytes, target,
/// listing; hard links share an inode number. Returns how many entries were compared.
fn same_tree(src: &Path, mp: &Path) -> usize {
    let mut n = 0;
    let mut inos = std::collections::HashMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let (a, b) = (src.join(&rel), mp.join(&rel));
        let (ma, mb) = (
            fs::symlink_metadata(&a).unwrap(),
            fs::symlink_metadata(&b).unwrap(),
        );
        let what = rel.display().to_string();
        assert_eq!(ma.mode(), mb.mode(), "{what}: mode");
        assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{what}: owner");
        if !rel.as_os_str().is_empty() {
            assert_eq!(ma.mtime(), mb.mtime(), "{what}: mtime");
        }
        if ma.is_file() {
            assert_eq!(ma.len(), mb.len(), "{what}: size");
            assert!(
                fs::read(&a).unwrap() == fs::read(&b).unwrap(),
                "{what}: bytes"
            );
            if let Some(other) = inos.insert(ma.ino(), mb.ino()) {
                assert_eq!(other, mb.ino(), "{what}: a hard link's inode");
            }
            assert_eq!(ma.nlink(), mb.nlink(), "{what}: links");
        } else if ma.file_type().is_symlink() {
            assert_eq!(
                fs::read_link(&a).unwrap(),
                fs::read_link(&b).unwrap(),
                "{what}"
            );
        } else if ma.is_dir() {
            let names = |d: &Path| {
                let mut v: Vec<_> = fs::read_dir(d)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                v.sort();
                v
            };
            let (la, lb) = (names(&a), names(&b));
            assert_eq!(la, lb, "{what}: listing");
            for e in la {
                stack.push(rel.join(e));
            }
        }
        n += 1;
    }
    n
}

fn stop(mut c: Child, mp: &Path) {
    // SAFETY-free: signal the child we started, by its pid
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(c.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            assert!(
                !mounted(mp),
                "{} still mounted after the server ended ({st})",
                mp.display()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not end on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn served_tree_is_the_source_tree_cached_and_in_place() {
    let t = T::new();
    let src = tree(&t);
    let (pool, digest) = build(&t, &src);
    for (name, extra) in [("cached", &["--cached"][..]), ("in-place", &[][..])] {
        let mp = mountpoint(&t, name);
        let log = t.p(&format!("{name}.log"));
        let c = serve(&pool, &digest, &mp, extra, &log);
        let n = same_tree(&src, &mp);
        assert!(n > 700, "{name}: {n} entries compared");
        // a missing name, twice (the second from the kernel's negative entry), and no writes
        for _ in 0..2 {
            let e = fs::metadata(mp.join("install/no-such")).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc_enoent()), "{name}: {e}");
        }
        let e = fs::File::create(mp.join("new")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(30), "{name}: creating a file: {e}"); // EROFS
                                                                                // programs run from it
        let o = Command::new(mp.join("install/cfact/2.0/bin/cfact"))
            .arg("5")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "120", "{name}");
        let opts = mountinfo_line(mp.to_str().unwrap());
        assert!(
            opts.contains("nosuid") && opts.contains("nodev") && opts.contains(" ro,"),
            "{opts}"
        );
        stop(c, &mp);
    }
}

fn libc_enoent() -> i32 {
    2
}

#[test]
fn a_killed_tree_server_fails_reads_at_once() {
    let t = T::new();
    let src = tree(&t);
    let (pool, digest) = build(&t, &src);
    let mp = mountpoint(&t, "mp");
    let mut c = serve(&pool, &digest, &mp, &[], &t.p("log"));
    assert!(fs::read(mp.join("wide/entry-0001")).is_ok());
    c.kill().unwrap();
    c.wait().unwrap();
    read_fails_at_once(&mp.join("big.dat"));
    let _ = Command::new("fusermount3")
        .args(["-u", "-z"])
        .arg(&mp)
        .status();
}

/// Read system calls a process has made (each FUSE request the server answers is one read of
/// its /dev/fuse connection; its reads of the pool file are few once the metadata is cached).
fn syscr(pid: u32) -> u64 {
    let io = fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix("syscr:"))
        .unwrap_or_else(|| panic!("no syscr in /proc/{pid}/io: {io}"))
        .trim()
        .parse()
        .unwrap()
}

/// The server built for the kernel: a listing brings its entries' attributes along (a stat walk
/// of 700 entries is not 700 lookups), and reading a cached file again costs no request (the
/// kernel opens it without asking and sends no flush and no release).
#[test]
fn a_stat_walk_and_reopened_files_cost_the_server_few_requests() {
    let t = T::new();
    let src = tree(&t);
    let (pool, digest) = build(&t, &src);
    let mp = mountpoint(&t, "mp");
    let c = serve(&pool, &digest, &mp, &["--cached"], &t.p("log"));
    let pid = c.id();
    let before = syscr(pid);
    let mut n = 0;
    for e in fs::read_dir(mp.join("wide")).unwrap() {
        let m = fs::symlink_metadata(e.unwrap().path()).unwrap();
        assert!(m.is_file());
        n += 1;
    }
    assert_eq!(n, 700);
    let walk = syscr(pid) - before;
    assert!(
        walk < 175,
        "a stat walk of 700 entries took {walk} requests (READDIRPLUS: a few per listing page)"
    );
    let files: Vec<PathBuf> = (0..200)
        .map(|i| mp.join(format!("wide/entry-{i:04}")))
        .collect();
    for f in &files {
        fs::read(f).unwrap();
    }
    let before = syscr(pid);
    for f in &files {
        assert!(!fs::read(f).unwrap().is_empty());
    }
    let again = syscr(pid) - before;
    // their pages are kept: no open, release, flush, read or getattr (a few reads of the
    // server's own are not requests)
    assert!(
        again <= 20,
        "reading 200 cached files again took {again} requests"
    );
    stop(c, &mp);
}

/// The kernel opens files and directories without asking (the first open and the first opendir
/// answer ENOSYS, which it takes as "never ask again"): those first opens and every later one
/// succeed and read right, and what the kernel checks still fails as it should: a write open is
/// EROFS, a file opened as a directory or walked through ENOTDIR, a directory opened for writing
/// or read as a file EISDIR; an ioctl is ENOTTY.
#[test]
fn opens_the_kernel_makes_alone_read_right_and_keep_its_checks() {
    let t = T::new();
    let src = tree(&t);
    let (pool, digest) = build(&t, &src);
    let mp = mountpoint(&t, "mp");
    let c = serve(&pool, &digest, &mp, &["--cached"], &t.p("log"));
    for i in [7, 8, 7] {
        let f = mp.join(format!("wide/entry-{i:04}"));
        assert_eq!(fs::read(&f).unwrap(), format!("{i}\n").as_bytes());
    }
    for _ in 0..2 {
        assert_eq!(fs::read_dir(mp.join("wide")).unwrap().count(), 700);
    }
    assert!(fs::read(mp.join("big.dat")).unwrap() == noise(7, BIG));
    let errno = |r: std::io::Result<fs::File>| r.map(drop).unwrap_err().raw_os_error();
    let f = mp.join("wide/entry-0007");
    let opts = |w: bool| {
        let mut o = fs::OpenOptions::new();
        o.read(!w).write(w);
        o
    };
    assert_eq!(errno(opts(true).open(&f)), Some(30), "write open: EROFS");
    assert_eq!(
        errno(opts(false).write(true).open(&f)),
        Some(30),
        "O_RDWR: EROFS"
    );
    let dir_flag = rustix::fs::OFlags::DIRECTORY.bits() as i32;
    assert_eq!(
        errno(std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts(false), dir_flag).open(&f)),
        Some(20),
        "a file opened as a directory: ENOTDIR"
    );
    assert_eq!(
        errno(fs::File::open(f.join("x"))),
        Some(20),
        "through a file: ENOTDIR"
    );
    assert_eq!(
        errno(opts(true).open(mp.join("wide"))),
        Some(21),
        "a directory for writing: EISDIR"
    );
    // a directory opened as a file opens (as on any file system) and does not read
    let mut d = fs::File::open(mp.join("wide")).unwrap();
    let e = std::io::Read::read(&mut d, &mut [0u8; 16]).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(21),
        "a directory read as a file: EISDIR"
    );
    // an ioctl (Python's isatty check of every file it opens) is ENOTTY, and logs nothing
    for _ in 0..3 {
        assert!(!std::io::IsTerminal::is_terminal(
            &fs::File::open(&f).unwrap()
        ));
    }
    stop(c, &mp);
    let log = fs::read_to_string(t.p("log")).unwrap();
    assert!(!log.contains("ioctl"), "{log}");
}

#[test]
fn a_chunk_corrupted_in_place_is_eio_and_named_in_the_log() {
    let t = T::new();
    let src = tree(&t);
    let (pool, digest) = build(&t, &src);
    let mp = mountpoint(&t, "mp");
    let log = t.p("log");
    let c = serve(&pool, &digest, &mp, &[], &log);
    assert_eq!(fs::read(mp.join("wide/entry-0042")).unwrap(), b"42\n");
    // corrupt the pool on storage, mid-run, inside big.dat 20 MiB in (stored as it is)
    let want = &noise(7, BIG)[20 << 20..(20 << 20) + 64];
    let bytes = fs::read(&pool).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == want)
        .expect("big.dat's bytes are stored uncompressed in the image");
    {
        let f = fs::OpenOptions::new().write(true).open(&pool).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[!bytes[at]], at as u64).unwrap();
        f.sync_all().unwrap();
    }
    // drop the kernel's cached pages of the pool file so the server reads storage
    drop_caches();
    let e = fs::read(mp.join("big.dat")).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(5),
        "reading across the bad chunk: {e}"
    );
    // the bytes before the bad chunk, and the rest of the tree, still read
    let mut f = fs::File::open(mp.join("big.dat")).unwrap();
    let mut head = vec![0u8; 1 << 20];
    std::io::Read::read_exact(&mut f, &mut head).unwrap();
    assert!(head == noise(7, BIG)[..1 << 20], "the first MiB");
    assert_eq!(fs::read(mp.join("wide/entry-0699")).unwrap(), b"699\n");
    stop(c, &mp);
    let log = fs::read_to_string(&log).unwrap();
    let chunk = at as u64 >> 20;
    let node = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert!(
        log.contains(&format!("chunk {chunk}"))
            && log.contains(node.trim())
            && log.contains("tree.sqfs"),
        "the log names the pool, chunk {chunk}, its offset and the node: {log}"
    );
}
