use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::*;

fn open_dir(p: &Path) -> OwnedFd {
    rustix::fs::open(
        p,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

/// A tree like a small Python prefix: bin/, lib/ with a library and a symlink to it, a package.
fn tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    fs::create_dir_all(r.join("bin")).unwrap();
    fs::create_dir_all(r.join("lib/python3/site-packages/pkg")).unwrap();
    fs::write(r.join("bin/tool"), b"#!/bin/sh\necho tool\n").unwrap();
    fs::set_permissions(r.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(r.join("lib/libx.so.1"), vec![7u8; 60_000]).unwrap();
    symlink("libx.so.1", r.join("lib/libx.so")).unwrap();
    fs::write(
        r.join("lib/python3/site-packages/pkg/__init__.py"),
        b"X = 1\n",
    )
    .unwrap();
    t
}

fn path_of(s: &Snapshot, p: &str) -> Option<u32> {
    let mut at = 0u32;
    for c in p.split('/').filter(|c| !c.is_empty()) {
        at = s.lookup(at, c.as_bytes()).ok()??;
    }
    Some(at)
}

#[test]
fn the_snapshot_lists_every_entry_and_answers_failed_lookups_too() {
    let t = tree();
    let s = Snapshot::walk(open_dir(t.path()).as_fd(), t.path()).unwrap();
    // root, bin, bin/tool, lib, libx.so, libx.so.1, python3, site-packages, pkg, __init__.py
    assert_eq!(s.nodes.len(), 10, "{:#?}", s.nodes);
    let tool = &s.nodes[path_of(&s, "bin/tool").unwrap() as usize];
    assert_eq!((tool.kind, tool.perm, tool.size), (Kind::File, 0o755, 20));
    let link = &s.nodes[path_of(&s, "lib/libx.so").unwrap() as usize];
    assert_eq!(
        (link.kind, link.target.as_slice()),
        (Kind::Symlink, &b"libx.so.1"[..])
    );
    let lib = path_of(&s, "lib").unwrap();
    // the loader's and Python's failed probes: answered from the listing, no storage call
    assert_eq!(s.lookup(lib, b"libx.so.2"), Ok(None));
    assert_eq!(s.lookup(lib, b"tls"), Ok(None));
    // a lookup below a file
    let so = path_of(&s, "lib/libx.so.1").unwrap();
    assert_eq!(s.lookup(so, b"x"), Err(Errno::ENOTDIR));
    // names sorted, parents right
    let names: Vec<&[u8]> = s.nodes[lib as usize]
        .children
        .iter()
        .map(|(n, _)| n.as_slice())
        .collect();
    assert_eq!(names, vec![&b"libx.so"[..], b"libx.so.1", b"python3"]);
    assert_eq!(s.nodes[so as usize].parent, lib);
    assert_eq!(s.files(), (3, 20 + 60_000 + 6));
    // an lstat per entry, a read per directory: what the walk cost storage, made once
    assert!(s.requests >= 10 + 6, "{}", s.requests);
}

#[test]
fn a_directory_the_walk_cannot_read_fails_its_lookups_with_eacces() {
    if rustix::process::geteuid().is_root() {
        eprintln!("skipped: root reads a mode-000 directory");
        return;
    }
    let t = tree();
    fs::create_dir(t.path().join("closed")).unwrap();
    fs::write(t.path().join("closed/f"), b"x").unwrap();
    fs::set_permissions(t.path().join("closed"), fs::Permissions::from_mode(0o0)).unwrap();
    let s = Snapshot::walk(open_dir(t.path()).as_fd(), t.path()).unwrap();
    fs::set_permissions(t.path().join("closed"), fs::Permissions::from_mode(0o755)).unwrap();
    let c = path_of(&s, "closed").unwrap();
    assert_eq!(s.lookup(c, b"f"), Err(Errno::EACCES));
}

/// A typed fake source: counts fetches, takes its time, answers a fixed content per path.
struct Slow {
    calls: AtomicU64,
}
impl FileBytes for Slow {
    fn fetch(&self, node: &Node) -> Result<Vec<u8>, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        if node.path.ends_with("bad") {
            return Err("gone".into());
        }
        Ok(node.path.to_string_lossy().repeat(1000).into_bytes())
    }
    fn describe(&self) -> String {
        "fake".into()
    }
}

fn fake_snapshot() -> Snapshot {
    let t = tree();
    fs::write(t.path().join("bad"), b"x").unwrap();
    Snapshot::walk(open_dir(t.path()).as_fd(), t.path()).unwrap()
}

#[test]
fn a_file_is_fetched_once_however_many_open_it_at_once() {
    let s = fake_snapshot();
    let lib = path_of(&s, "lib/libx.so.1").unwrap() as u64 + 1;
    let bad = path_of(&s, "bad").unwrap() as u64 + 1;
    let src = Arc::new(Slow {
        calls: AtomicU64::new(0),
    });
    struct Share(Arc<Slow>);
    impl FileBytes for Share {
        fn fetch(&self, n: &Node) -> Result<Vec<u8>, String> {
            self.0.fetch(n)
        }
        fn describe(&self) -> String {
            self.0.describe()
        }
    }
    let v = Arc::new(View::new(s, Box::new(Share(src.clone())), None, "test"));
    let hs: Vec<_> = (0..16)
        .map(|_| {
            let v = v.clone();
            std::thread::spawn(move || {
                v.open(lib).unwrap();
                v.read(lib, 3, 10).unwrap()
            })
        })
        .collect();
    let want = "lib/libx.so.1".repeat(1000).into_bytes();
    for h in hs {
        assert_eq!(h.join().unwrap(), want[3..13].to_vec());
    }
    assert_eq!(src.calls.load(Ordering::SeqCst), 1);
    // past the end: short, then empty
    assert_eq!(
        v.read(lib, want.len() as u64 - 2, 10).unwrap(),
        want[want.len() - 2..]
    );
    assert!(v.read(lib, want.len() as u64 + 5, 10).unwrap().is_empty());
    assert_eq!(v.read(lib, 0, want.len() as u32 + 1).unwrap(), want);
    // a failed fetch fails every open after it, without asking again
    assert_eq!(v.open(bad), Err(Errno::EIO));
    assert_eq!(v.read(bad, 0, 1), Err(Errno::EIO));
    assert_eq!(src.calls.load(Ordering::SeqCst), 2);
    assert_eq!(v.stats.failed.load(Ordering::SeqCst), 1);
    // directories and links are not opened as files
    assert_eq!(v.open(1), Err(Errno::EISDIR));
    assert_eq!(v.trace(), vec![PathBuf::from("lib/libx.so.1")]);
}

fn storage_view(t: &Path, store: Option<OwnedFd>) -> View {
    let fd = open_dir(t);
    let s = Snapshot::walk(fd.as_fd(), t).unwrap();
    View::new(s, Box::new(Storage::new(fd, t)), store, "test")
}

#[test]
fn a_file_read_once_is_served_as_read_after_storage_changes_or_goes() {
    let t = tree();
    let store = tempfile::tempdir().unwrap();
    let v = storage_view(t.path(), Some(open_dir(store.path())));
    let lib = path_of(&v.snap, "lib/libx.so.1").unwrap() as u64 + 1;
    let init = path_of(&v.snap, "lib/python3/site-packages/pkg/__init__.py").unwrap() as u64 + 1;
    v.open(init).unwrap();
    assert_eq!(v.read(init, 0, 100).unwrap(), b"X = 1\n");
    // the tree changes and then goes away
    fs::write(
        t.path().join("lib/python3/site-packages/pkg/__init__.py"),
        b"X = 22\n",
    )
    .unwrap();
    assert_eq!(v.read(init, 0, 100).unwrap(), b"X = 1\n");
    fs::rename(t.path().join("lib"), t.path().join("gone")).unwrap();
    fs::remove_file(t.path().join("gone/libx.so.1")).unwrap();
    assert_eq!(v.read(init, 0, 100).unwrap(), b"X = 1\n");
    // a file never read before it went: a clean EIO, not a hang, and the same ever after (a
    // directory the view opened before it was renamed is still the tree's: the view may find a
    // file in it, the one it listed, checked as any)
    assert_eq!(v.open(lib), Err(Errno::EIO));
    fs::rename(t.path().join("gone"), t.path().join("lib")).unwrap();
    fs::write(t.path().join("lib/libx.so.1"), vec![7u8; 60_000]).unwrap();
    assert_eq!(v.open(lib), Err(Errno::EIO));
    // the bytes were kept in unnamed files: nothing in the node-local directory
    assert_eq!(fs::read_dir(store.path()).unwrap().count(), 0);
    assert_eq!(v.stats.fetched.load(Ordering::SeqCst), 1);
}

#[test]
fn a_file_changed_since_the_snapshot_is_not_served_at_all() {
    let t = tree();
    let v = storage_view(t.path(), None);
    let tool = path_of(&v.snap, "bin/tool").unwrap() as u64 + 1;
    let init = path_of(&v.snap, "lib/python3/site-packages/pkg/__init__.py").unwrap() as u64 + 1;
    // same size, new mtime
    std::thread::sleep(Duration::from_millis(20));
    fs::write(t.path().join("bin/tool"), b"#!/bin/sh\necho TOOL\n").unwrap();
    assert_eq!(v.open(tool), Err(Errno::EIO));
    // replaced by rename: same content and size, a later mtime
    let p = t.path().join("lib/python3/site-packages/pkg/__init__.py");
    fs::write(t.path().join("new"), b"X = 1\n").unwrap();
    fs::rename(t.path().join("new"), &p).unwrap();
    assert_eq!(v.open(init), Err(Errno::EIO));
    assert_eq!(v.stats.failed.load(Ordering::SeqCst), 2);
}

#[test]
fn storage_reads_never_leave_the_tree_through_a_symlink_made_after_the_snapshot() {
    let t = tree();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("libx.so.1"), vec![7u8; 60_000]).unwrap();
    let v = storage_view(t.path(), None);
    let lib = path_of(&v.snap, "lib/libx.so.1").unwrap() as u64 + 1;
    fs::rename(t.path().join("lib"), t.path().join("lib.old")).unwrap();
    symlink(outside.path(), t.path().join("lib")).unwrap();
    assert_eq!(v.open(lib), Err(Errno::EIO));
}

#[test]
fn a_file_changed_since_the_jobs_start_is_refused_however_late_the_node_listed_it() {
    // a node whose view starts late lists the new version: with the job's start it refuses it,
    // as the nodes that listed the old one do
    let t = tree();
    let old = |p: &str| {
        let f = fs::File::options()
            .write(true)
            .open(t.path().join(p))
            .unwrap();
        f.set_modified(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
            .unwrap();
    };
    old("bin/tool");
    old("lib/libx.so.1");
    fs::write(
        t.path().join("lib/python3/site-packages/pkg/__init__.py"),
        b"X = 2\n",
    )
    .unwrap();
    let epoch = Epoch::parse("1700000100.5", "test").unwrap();
    assert_eq!(epoch.at, (1_700_000_100, 500_000_000));
    let v = storage_view(t.path(), None).with_epoch(Some(epoch));
    let tool = path_of(&v.snap, "bin/tool").unwrap() as u64 + 1;
    let init = path_of(&v.snap, "lib/python3/site-packages/pkg/__init__.py").unwrap() as u64 + 1;
    assert_eq!(v.open(tool), Ok(()));
    assert_eq!(v.read(tool, 0, 100).unwrap(), b"#!/bin/sh\necho tool\n");
    assert_eq!(v.open(init), Err(Errno::EIO));
    assert_eq!(v.stats.failed.load(Ordering::SeqCst), 1);
    // without the job's start (outside a job) the node's own snapshot is served
    let v = storage_view(t.path(), None);
    assert_eq!(v.open(init), Ok(()));
    // a file changed in the very second the job started counts as changed
    let e = Epoch::parse("1700000000", "test").unwrap();
    let v = storage_view(t.path(), None).with_epoch(Some(e));
    assert_eq!(v.open(tool), Err(Errno::EIO));
}

#[test]
fn the_jobs_start_is_seconds_since_1970_and_nothing_else() {
    assert_eq!(Epoch::parse("12", "X").unwrap().at, (12, 0));
    assert_eq!(Epoch::parse("12.000000001\n", "X").unwrap().at, (12, 1));
    for bad in ["", "-1", "1e9", "12.1234567891", "now", "1.2.3"] {
        let e = Epoch::parse(bad, "SW_POOL_VIEW_EPOCH").unwrap_err();
        assert!(
            e.contains("SW_POOL_VIEW_EPOCH") && e.contains("date +%s"),
            "{e}"
        );
    }
}

#[test]
fn a_large_file_is_read_from_storage_piece_by_piece_and_only_the_pieces_read() {
    for keep in ["memory", "disk"] {
        let t = tree();
        // 3.5 pieces, each byte its offset's low bits and piece number
        let big: Vec<u8> = (0..(PIECE * 7 / 2))
            .map(|i| (i as u8) ^ ((i / PIECE) as u8 * 17))
            .collect();
        fs::write(t.path().join("lib/libbig.so"), &big).unwrap();
        let store = tempfile::tempdir().unwrap();
        let fd = open_dir(t.path());
        let s = Snapshot::walk(fd.as_fd(), t.path()).unwrap();
        let storage = Arc::new(Storage::new(fd, t.path()));
        let v = Arc::new(View::new(
            s,
            Box::new(storage.clone()),
            (keep == "disk").then(|| open_dir(store.path())),
            "test",
        ));
        let ino = path_of(&v.snap, "lib/libbig.so").unwrap() as u64 + 1;
        // opening reads nothing
        v.open(ino).unwrap();
        assert_eq!(storage.bytes.load(Ordering::SeqCst), 0, "{keep}");
        // 16 readers of a span across the second and third pieces: those two read, once each
        let at = PIECE * 2 - 100;
        let hs: Vec<_> = (0..16)
            .map(|_| {
                let v = v.clone();
                std::thread::spawn(move || v.read(ino, at, 300).unwrap())
            })
            .collect();
        for h in hs {
            assert_eq!(
                h.join().unwrap(),
                big[at as usize..at as usize + 300],
                "{keep}"
            );
        }
        assert_eq!(storage.bytes.load(Ordering::SeqCst), 2 * PIECE, "{keep}");
        // one open: the file is kept open for its next piece
        assert_eq!(storage.opens.load(Ordering::SeqCst), 1, "{keep}");
        // the short last piece, read past the end
        let end = big.len() as u64;
        assert_eq!(v.read(ino, end - 10, 100).unwrap(), big[big.len() - 10..]);
        assert_eq!(
            storage.bytes.load(Ordering::SeqCst),
            2 * PIECE + PIECE / 2,
            "{keep}"
        );
        assert!(v.read(ino, end, 100).unwrap().is_empty());
        // the file changes on storage: the pieces read are served as read, the others refused
        fs::write(t.path().join("lib/libbig.so"), vec![0u8; 10]).unwrap();
        assert_eq!(v.read(ino, PIECE, 4).unwrap(), big[PIECE as usize..][..4]);
        assert_eq!(v.read(ino, 0, 4), Err(Errno::EIO));
        assert_eq!(v.read(ino, 0, 4), Err(Errno::EIO));
        assert_eq!(v.stats.failed.load(Ordering::SeqCst), 1, "{keep}");
        assert_eq!(v.trace(), vec![PathBuf::from("lib/libbig.so")]);
        assert_eq!(fs::read_dir(store.path()).unwrap().count(), 0);
    }
}

#[test]
fn the_missing_pieces_of_one_read_are_fetched_side_by_side() {
    // pieces that take 150 ms each to come, counted in flight; piece 2 fails
    struct Slow {
        now: AtomicU64,
        most: AtomicU64,
    }
    impl FileBytes for Slow {
        fn fetch(&self, _: &Node) -> Result<Vec<u8>, String> {
            Err("not asked whole".into())
        }
        fn fetch_piece(&self, _: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(n, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(150));
            self.now.fetch_sub(1, Ordering::SeqCst);
            if offset / PIECE == 2 {
                return Err("piece 2 is bad".into());
            }
            Ok(vec![(offset / PIECE) as u8; len as usize])
        }
        fn describe(&self) -> String {
            "slow".into()
        }
    }
    let t = tree();
    fs::write(
        t.path().join("lib/libbig.so"),
        vec![0u8; (PIECE * 6) as usize],
    )
    .unwrap();
    let fd = open_dir(t.path());
    let s = Snapshot::walk(fd.as_fd(), t.path()).unwrap();
    let src = Arc::new(Slow {
        now: AtomicU64::new(0),
        most: AtomicU64::new(0),
    });
    let v = View::new(s, Box::new(src.clone()), None, "test");
    let ino = path_of(&v.snap, "lib/libbig.so").unwrap() as u64 + 1;
    v.open(ino).unwrap();
    // one read of pieces 0 and 1: both fetched at once
    let got = v.read(ino, 0, (2 * PIECE) as u32).unwrap();
    assert_eq!(got.len() as u64, 2 * PIECE);
    assert!(got[..PIECE as usize].iter().all(|&b| b == 0));
    assert!(got[PIECE as usize..].iter().all(|&b| b == 1));
    assert_eq!(src.most.load(Ordering::SeqCst), 2);
    // a read of pieces 1 (held), 2 (fails), 3 and 4: the three missing ones at once; the read
    // fails as piece 2 does (EIO), and the pieces that came are kept
    assert_eq!(v.read(ino, PIECE, (4 * PIECE) as u32), Err(Errno::EIO));
    assert_eq!(src.most.load(Ordering::SeqCst), 3);
    assert_eq!(v.read(ino, 3 * PIECE, 8).unwrap(), vec![3u8; 8]);
    assert_eq!(v.read(ino, 4 * PIECE, 8).unwrap(), vec![4u8; 8]);
    assert_eq!(src.now.load(Ordering::SeqCst), 0);
}
