use std::sync::Arc;

use super::*;

/// The files of a fake storage, counting what it is asked.
struct Counted {
    bytes: Vec<u8>,
    asked: Arc<AtomicU64>,
}

impl FileBytes for Counted {
    fn fetch(&self, _node: &Node) -> Result<Vec<u8>, String> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        Ok(self.bytes.clone())
    }
    fn describe(&self) -> String {
        "fake storage".into()
    }
}

fn file(path: &str, size: u64, mtime: i64) -> Node {
    Node {
        mtime: (mtime, 5),
        ino: 42,
        ..Node::test_file(path, size, 0)
    }
}

fn warm(dir: &Path, bytes: &[u8], asked: &Arc<AtomicU64>, limit: u64) -> Warm {
    Warm::new(
        Box::new(Counted {
            bytes: bytes.to_vec(),
            asked: asked.clone(),
        }),
        open_dir(dir, limit).unwrap(),
    )
}

#[test]
fn a_next_job_reads_from_storage_only_what_changed() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("views");
    let asked = Arc::new(AtomicU64::new(0));
    let lib = file("lib/libx.so.1", 6, 100);
    // the first job: fetched from storage, kept
    let w = warm(&dir, b"abcdef", &asked, u64::MAX);
    assert_eq!(w.fetch(&lib).unwrap(), b"abcdef");
    assert_eq!(
        (
            asked.load(Ordering::Relaxed),
            w.misses.load(Ordering::Relaxed)
        ),
        (1, 1)
    );
    // the next job on the node: served from the cache, storage untouched
    let w = warm(&dir, b"abcdef", &asked, u64::MAX);
    assert_eq!(w.fetch(&lib).unwrap(), b"abcdef");
    assert_eq!(
        (
            asked.load(Ordering::Relaxed),
            w.hits.load(Ordering::Relaxed)
        ),
        (1, 1)
    );
    // the file changed on storage (another mtime, or size): fetched again
    let newer = file("lib/libx.so.1", 6, 101);
    let w = warm(&dir, b"ABCDEF", &asked, u64::MAX);
    assert_eq!(w.fetch(&newer).unwrap(), b"ABCDEF");
    assert_eq!(asked.load(Ordering::Relaxed), 2);
    // another file of the same size and mtime is another entry
    let other = file("lib/liby.so.1", 6, 100);
    assert_eq!(w.fetch(&other).unwrap(), b"ABCDEF");
    assert_eq!(asked.load(Ordering::Relaxed), 3);
}

#[test]
fn a_damaged_entry_is_never_served_and_is_written_anew() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("views");
    let asked = Arc::new(AtomicU64::new(0));
    let f = file("a/b.py", 4, 7);
    warm(&dir, b"good", &asked, u64::MAX).fetch(&f).unwrap();
    let entry = dir.join(entry_name(&f, 0));
    // one byte of the content flipped: its hash does not match
    let mut e = std::fs::read(&entry).unwrap();
    *e.last_mut().unwrap() ^= 1;
    std::fs::write(&entry, &e).unwrap();
    let w = warm(&dir, b"good", &asked, u64::MAX);
    assert_eq!(w.fetch(&f).unwrap(), b"good");
    assert_eq!(
        (
            asked.load(Ordering::Relaxed),
            w.hits.load(Ordering::Relaxed)
        ),
        (2, 0)
    );
    // torn (shorter than its head says), then garbage: fetched from storage each time
    for bad in [&e[..e.len() - 2], &b"not an entry"[..]] {
        std::fs::write(&entry, bad).unwrap();
        assert_eq!(
            warm(&dir, b"good", &asked, u64::MAX).fetch(&f).unwrap(),
            b"good"
        );
    }
    assert_eq!(asked.load(Ordering::Relaxed), 4);
    // and it is good again for the next job
    warm(&dir, b"good", &asked, u64::MAX).fetch(&f).unwrap();
    assert_eq!(asked.load(Ordering::Relaxed), 4);
}

#[test]
fn the_cache_keeps_to_its_limit_least_recently_used_first() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("views");
    let asked = Arc::new(AtomicU64::new(0));
    let data = vec![9u8; 10_000];
    let w = warm(&dir, &data, &asked, u64::MAX);
    let files: Vec<Node> = (0..5).map(|i| file(&format!("f{i}"), 10_000, 1)).collect();
    for (i, f) in files.iter().enumerate() {
        w.fetch(f).unwrap();
        // entries older by a second each, f0 the oldest
        let old = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 1000 + i as i64,
                tv_nsec: 0,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: 1000 + i as i64,
                tv_nsec: 0,
            },
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            dir.join(entry_name(f, 0)),
            &old,
            AtFlags::empty(),
        )
        .unwrap();
    }
    // a writer's leftover temporary file goes too
    std::fs::write(dir.join(".leftover.1"), b"x").unwrap();
    // room for three entries: f0 and f1 go
    let entry_len = (HEAD + 2 + 10_000) as u64;
    let _ = warm(&dir, &data, &asked, 3 * entry_len);
    let left: Vec<bool> = files
        .iter()
        .map(|f| dir.join(entry_name(f, 0)).exists())
        .collect();
    assert_eq!(left, [false, false, true, true, true]);
    assert!(!dir.join(".leftover.1").exists());
}

#[test]
fn a_cache_directory_not_private_to_the_user_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("views");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let e = open_dir(&dir, u64::MAX).expect_err("refused");
    assert!(e.contains("not a private directory"), "{e}");
}

/// A fake storage whose file is `bytes`, counting the pieces it is asked.
struct Pieces {
    bytes: Vec<u8>,
    asked: Arc<AtomicU64>,
}

impl FileBytes for Pieces {
    fn fetch(&self, _node: &Node) -> Result<Vec<u8>, String> {
        panic!("a large file is asked piece by piece");
    }
    fn fetch_piece(&self, _node: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        self.asked.fetch_add(1, Ordering::Relaxed);
        Ok(self.bytes[offset as usize..][..len as usize].to_vec())
    }
    fn describe(&self) -> String {
        "fake storage".into()
    }
}

#[test]
fn the_pieces_of_a_large_file_a_job_read_are_kept_each_under_its_own_key() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("views");
    let asked = Arc::new(AtomicU64::new(0));
    let bytes: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let big = file("lib/libbig.so", 1000, 100);
    let w = |asked: &Arc<AtomicU64>| {
        Warm::new(
            Box::new(Pieces {
                bytes: bytes.clone(),
                asked: asked.clone(),
            }),
            open_dir(&dir, u64::MAX).unwrap(),
        )
    };
    let first = w(&asked);
    assert_eq!(first.fetch_piece(&big, 0, 400).unwrap(), bytes[..400]);
    assert_eq!(first.fetch_piece(&big, 400, 400).unwrap(), bytes[400..800]);
    assert_eq!(asked.load(Ordering::Relaxed), 2);
    // the next job: both pieces from the cache, a third one from storage
    let next = w(&asked);
    assert_eq!(next.fetch_piece(&big, 400, 400).unwrap(), bytes[400..800]);
    assert_eq!(next.fetch_piece(&big, 0, 400).unwrap(), bytes[..400]);
    assert_eq!(asked.load(Ordering::Relaxed), 2);
    assert_eq!(next.fetch_piece(&big, 800, 200).unwrap(), bytes[800..]);
    assert_eq!(
        (
            next.hits.load(Ordering::Relaxed),
            asked.load(Ordering::Relaxed)
        ),
        (2, 3)
    );
    // an entry renamed to another piece's name is not served as that piece
    let (a, b) = (entry_name(&big, 0), entry_name(&big, 400));
    std::fs::rename(dir.join(&a), dir.join(&b)).unwrap();
    assert_eq!(next.fetch_piece(&big, 400, 400).unwrap(), bytes[400..800]);
    assert_eq!(asked.load(Ordering::Relaxed), 4);
}

#[test]
fn the_files_jobs_read_are_listed_from_the_cache_one_each() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("views");
    let asked = Arc::new(AtomicU64::new(0));
    let w = warm(&dir, b"abcdef", &asked, u64::MAX);
    w.fetch(&file("lib/libx.so.1", 6, 100)).unwrap();
    w.fetch(&file("bin/tool", 6, 100)).unwrap();
    // a large file's two pieces: one file
    let p = Warm::new(
        Box::new(Pieces {
            bytes: vec![1; 1000],
            asked: asked.clone(),
        }),
        open_dir(&dir, u64::MAX).unwrap(),
    );
    let big = file("lib/libbig.so", 1000, 100);
    p.fetch_piece(&big, 0, 400).unwrap();
    p.fetch_piece(&big, 800, 200).unwrap();
    // no entry: skipped
    std::fs::write(dir.join("junk"), b"not an entry").unwrap();
    let l = list(&dir).unwrap();
    let got: Vec<(&str, u64, u64)> = l
        .iter()
        .map(|k| (k.path.to_str().unwrap(), k.size, k.held))
        .collect();
    assert_eq!(
        got,
        vec![
            ("bin/tool", 6, 6),
            ("lib/libbig.so", 1000, 600),
            ("lib/libx.so.1", 6, 6)
        ]
    );
    assert!(list(&t.path().join("none")).unwrap().is_empty());
}
