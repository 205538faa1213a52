use super::*;
use std::os::fd::AsFd;

fn tree() -> (tempfile::TempDir, Snapshot) {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    std::fs::create_dir_all(r.join("lib/python/pkg")).unwrap();
    std::fs::write(r.join("lib/python/pkg/__init__.py"), b"x = 1\n").unwrap();
    std::fs::write(r.join("lib/big.so"), vec![7u8; 3 * 4096 + 5]).unwrap();
    std::fs::write(r.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("lib/big.so", r.join("link")).unwrap();
    let root = std::fs::File::open(r).unwrap();
    let s = Snapshot::walk(root.as_fd(), r).unwrap();
    (t, s)
}

fn index_of(s: &Snapshot, p: &str) -> u32 {
    s.nodes.iter().position(|n| n.path == Path::new(p)).unwrap() as u32
}

#[test]
fn a_snapshot_crosses_as_bytes_unchanged() {
    let (_t, s) = tree();
    let d = decode(&encode(&s)).unwrap();
    assert_eq!(d, s);
}

#[test]
fn a_bad_encoding_is_refused_never_a_panic() {
    let (_t, s) = tree();
    let e = encode(&s);
    // every cut fails; every byte changed decodes or fails cleanly
    for n in 0..e.len() {
        assert!(decode(&e[..n]).is_err(), "cut at {n}");
    }
    for i in 0..e.len() {
        let mut b = e.clone();
        b[i] ^= 0xff;
        let _ = decode(&b);
    }
    // too many entries, a name with a slash, a name twice: refused by name
    let mut big = e[..8].to_vec();
    big.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(decode(&big).unwrap_err().contains("entries"));
    let mut bad = s.clone();
    let i = index_of(&s, "empty") as usize;
    bad.nodes[i].path = PathBuf::from("a/b");
    // (encode takes the last component: make it one with a slash by hand)
    let enc = encode(&bad);
    assert!(decode(&enc).is_ok());
    let name = b"empty";
    let pos = e.windows(5).position(|w| w == name).unwrap();
    let mut slash = e.clone();
    slash[pos + 2] = b'/';
    assert!(
        decode(&slash).unwrap_err().contains("name"),
        "{:?}",
        decode(&slash)
    );
    let mut twice = s.clone();
    let j = index_of(&s, "link") as usize;
    twice.nodes[j].path = PathBuf::from("empty");
    assert!(decode(&encode(&twice)).unwrap_err().contains("twice"));
}

#[test]
fn each_chunk_of_the_image_holds_one_files_bytes() {
    let (_t, s) = tree();
    let l = Layout::new(&s, 100, 4096);
    assert_eq!(l.head, 4096);
    let big = index_of(&s, "lib/big.so");
    let init = index_of(&s, "lib/python/pkg/__init__.py");
    let sb = l.start(big).unwrap();
    assert_eq!(sb % 4096, 0);
    assert_eq!(l.piece(&s, sb / 4096), Some((big, 0, 4096)));
    assert_eq!(l.piece(&s, sb / 4096 + 3), Some((big, 3 * 4096, 5)));
    let si = l.start(init).unwrap();
    assert_eq!(l.piece(&s, si / 4096), Some((init, 0, 6)));
    // an empty file has no chunk; the head and past the end hold no file
    assert_eq!(l.start(index_of(&s, "empty")), None);
    assert_eq!(l.piece(&s, 0), None);
    assert_eq!(l.piece(&s, l.chunks()), None);
    assert_eq!(l.piece(&s, u64::MAX), None);
    assert_eq!(l.chunks(), 1 + 4 + 1);
}

#[test]
fn an_owner_reads_a_chunk_once_and_refuses_a_changed_file() {
    let (t, s) = tree();
    let root: std::os::fd::OwnedFd = std::fs::File::open(t.path()).unwrap().into();
    let l = Layout::new(&s, 100, 4096);
    let first = l.start(index_of(&s, "lib/big.so")).unwrap() / 4096;
    let o = Owned::new(Storage::new(root, t.path()), Arc::new(s), l, 1 << 30);
    assert_eq!(*o.chunk(first).unwrap(), vec![7u8; 4096]);
    assert_eq!(*o.chunk(first).unwrap(), vec![7u8; 4096]);
    assert_eq!(o.storage.opens.load(Ordering::SeqCst), 1);
    // changed on storage: the chunks not yet read are refused, the one read is kept
    std::fs::write(t.path().join("lib/big.so"), vec![8u8; 10]).unwrap();
    let e = o.chunk(first + 1).unwrap_err();
    assert!(e.contains("lib/big.so") && e.contains("changed"), "{e}");
    assert_eq!(*o.chunk(first).unwrap(), vec![7u8; 4096]);
    assert!(o.chunk(0).unwrap_err().contains("no file"));
}

#[test]
fn past_its_bound_an_owner_reads_again_rather_than_keep() {
    let (t, s) = tree();
    let root: std::os::fd::OwnedFd = std::fs::File::open(t.path()).unwrap().into();
    let l = Layout::new(&s, 100, 4096);
    let first = l.start(index_of(&s, "lib/big.so")).unwrap() / 4096;
    let o = Owned::new(Storage::new(root, t.path()), Arc::new(s), l, 4096);
    o.chunk(first).unwrap();
    o.chunk(first + 1).unwrap();
    o.chunk(first + 1).unwrap();
    o.chunk(first).unwrap();
    // three reads (the file kept open for them)
    assert_eq!(o.storage.bytes.load(Ordering::SeqCst), 3 * 4096);
}

#[test]
fn small_files_are_chosen_alike() {
    let (_t, s) = tree();
    let l = Layout::new(&s, 100, 4096);
    let init = l.start(index_of(&s, "lib/python/pkg/__init__.py")).unwrap() / 4096;
    // the big file is not small; the empty one has no chunk
    let pkg = index_of(&s, "lib/python/pkg/__init__.py");
    assert_eq!(small_chunks(&s, &l, 4096, 1 << 20), vec![(init, pkg)]);
    assert!(small_chunks(&s, &l, 4096, 3).is_empty());
}

#[test]
fn a_python_source_with_its_compiled_module_beside_it_is_not_read_at_the_start() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    std::fs::create_dir_all(r.join("pkg/__pycache__")).unwrap();
    for f in [
        "pkg/a.py",
        "pkg/b.py",
        "pkg/ab.py",
        "pkg/__pycache__/a.cpython-311.pyc",
        "pkg/__pycache__/abc.cpython-311.pyc",
    ] {
        std::fs::write(r.join(f), b"x").unwrap();
    }
    let root = std::fs::File::open(r).unwrap();
    let s = Snapshot::walk(root.as_fd(), r).unwrap();
    let l = Layout::new(&s, 100, 4096);
    let chosen: Vec<PathBuf> = small_chunks(&s, &l, 4096, 1 << 20)
        .into_iter()
        .map(|(c, idx)| {
            assert_eq!(l.piece(&s, c).unwrap().0, idx);
            s.nodes[idx as usize].path.clone()
        })
        .collect();
    // a.py has a.cpython-311.pyc; b.py and ab.py none (abc.* is not ab.*)
    let mut want: Vec<PathBuf> = [
        "pkg/__pycache__/a.cpython-311.pyc",
        "pkg/__pycache__/abc.cpython-311.pyc",
        "pkg/ab.py",
        "pkg/b.py",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    let mut got = chosen.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

/// `nodes` nodes walking `root` together, each in its own thread, their gather a shared table
/// and a barrier (what node `me` sends at level `round`, 1 first: `tamper(me, round, its reads)`):
/// every node's snapshot.
fn walk_on(
    root: &Path,
    nodes: usize,
    tamper: &(dyn Fn(usize, usize, Vec<u8>) -> Vec<u8> + Sync),
) -> Vec<Result<Snapshot, String>> {
    let table = Mutex::new(vec![Vec::new(); nodes]);
    let barrier = std::sync::Barrier::new(nodes);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..nodes)
            .map(|me| {
                let (table, barrier) = (&table, &barrier);
                s.spawn(move || {
                    let fd = std::fs::File::open(root).unwrap();
                    let mut round = 0;
                    walk_shared(fd.as_fd(), root, me, nodes, &mut |mine| {
                        round += 1;
                        table.lock().unwrap()[me] = tamper(me, round, mine);
                        barrier.wait();
                        let all = table.lock().unwrap().clone();
                        barrier.wait();
                        Ok(all)
                    })
                    .map(|(snap, _)| snap)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn nodes_that_list_a_tree_together_make_the_one_snapshot_one_node_makes() {
    let t = tempfile::tempdir().unwrap();
    for d in 0..9 {
        let dir = t.path().join(format!("d{d}/sub/deeper"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..d {
            std::fs::write(dir.join(format!("f{f}")), vec![b'x'; f]).unwrap();
        }
        std::os::unix::fs::symlink("sub", t.path().join(format!("d{d}/link"))).unwrap();
    }
    let one = Snapshot::walk(std::fs::File::open(t.path()).unwrap().as_fd(), t.path()).unwrap();
    for nodes in [1, 2, 3, 8] {
        for s in walk_on(t.path(), nodes, &|_, _, mine| mine) {
            assert_eq!(s.as_ref(), Ok(&one), "{nodes} nodes");
        }
    }
}

#[test]
fn a_level_from_another_node_is_checked_never_trusted() {
    let (t, _) = tree();
    let fd = std::fs::File::open(t.path()).unwrap();
    let dirs = vec![PathBuf::new(), PathBuf::from("lib")];
    let reads = crate::view::walk::read_level(fd.as_fd(), t.path(), &dirs, &|_| true, 2);
    let packed = pack_level(&reads);
    let mut out: Vec<Option<(Read, u64)>> = vec![None, None];
    unpack_level(&packed, &dirs, &|_| true, &mut out).unwrap();
    let names = |r: &Option<(Read, u64)>| -> Vec<PathBuf> {
        match r {
            Some((Ok(Some(e)), _)) => e.iter().map(|n| n.path.clone()).collect(),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(names(&out[1]), names(&reads[1]));
    // every cut fails or stops cleanly; every changed byte decodes or fails, never a panic
    for n in 0..packed.len() {
        let mut o: Vec<Option<(Read, u64)>> = vec![None, None];
        let _ = unpack_level(&packed[..n], &dirs, &|_| true, &mut o);
    }
    for i in 0..packed.len() {
        let mut b = packed.clone();
        b[i] ^= 0xff;
        let mut o: Vec<Option<(Read, u64)>> = vec![None, None];
        let _ = unpack_level(&b, &dirs, &|_| true, &mut o);
    }
    // a directory not that node's to read, or sent twice
    let mut o: Vec<Option<(Read, u64)>> = vec![None, None];
    assert!(unpack_level(&packed, &dirs, &|k| k == 0, &mut o)
        .unwrap_err()
        .contains("may send"));
    let mut twice = packed.clone();
    twice.extend_from_slice(&packed);
    let mut o: Vec<Option<(Read, u64)>> = vec![None, None];
    assert!(unpack_level(&twice, &dirs, &|_| true, &mut o).is_err());
    // a name with a slash
    let pos = packed
        .windows(10)
        .position(|w| w == b"\x06\0\0\0big.so")
        .unwrap();
    let mut slash = packed.clone();
    slash[pos + 5] = b'/';
    let mut o: Vec<Option<(Read, u64)>> = vec![None, None];
    assert!(unpack_level(&slash, &dirs, &|_| true, &mut o)
        .unwrap_err()
        .contains("name"));
}

#[test]
fn a_directory_one_node_cannot_read_fails_the_walk_on_every_node() {
    let t = tempfile::tempdir().unwrap();
    for d in 0..8 {
        std::fs::create_dir_all(t.path().join(format!("d{d}/sub"))).unwrap();
    }
    // node 1's storage fails on d5 (the second level's 8 directories go in 2 runs of 4
    // (`Readers`): node 1 reads d4 to d7)
    let results = walk_on(t.path(), 2, &|me, round, mine| match (me, round) {
        (1, 2) => {
            let mut reads: Vec<Option<(Read, u64)>> = vec![None; 4];
            reads.push(Some((Ok(Some(Vec::new())), 2)));
            reads.push(Some((Err("d5: Input/output error".into()), 2)));
            reads.push(Some((Ok(Some(Vec::new())), 2)));
            reads.push(Some((Ok(Some(Vec::new())), 2)));
            pack_level(&reads)
        }
        _ => mine,
    });
    for r in results {
        assert_eq!(r.unwrap_err(), "d5: Input/output error");
    }
}

#[test]
fn a_directory_is_listed_by_the_node_that_listed_its_parent() {
    let mut r = Readers::new(8);
    assert_eq!(r.level(&[PathBuf::new()]), vec![0]);
    // the root's 3 subdirectories: one run, the root's lister's; 9 below a: 3 runs from a's
    let top: Vec<PathBuf> = ["a", "b", "c"].iter().map(PathBuf::from).collect();
    assert_eq!(r.level(&top), vec![0, 0, 0]);
    let mut below: Vec<PathBuf> = (0..9).map(|k| PathBuf::from(format!("a/{k}"))).collect();
    below.push(PathBuf::from("c/x"));
    assert_eq!(r.level(&below), vec![0, 0, 0, 1, 1, 1, 2, 2, 2, 0]);
    // a/5's children stay on node 1, a/8's on node 2
    let deeper = [PathBuf::from("a/5/y"), PathBuf::from("a/8/z")];
    assert_eq!(r.level(&deeper), vec![1, 2]);
    // one node: all node 0's
    let mut one = Readers::new(1);
    assert_eq!(one.level(&below), vec![0; 10]);
}

#[test]
fn test_suites_stubs_sources_and_documents_are_not_read_at_the_start() {
    for (p, skip) in [
        ("numpy/_core/tests/test_api.py", true),
        (
            "numpy/_core/tests/__pycache__/test_api.cpython-311.pyc",
            true,
        ),
        ("pkg/test/data.bin", true),
        ("numpy/__init__.pyi", true),
        ("include/numpy/ndarraytypes.h", true),
        ("lib/libfoo.a", true),
        ("README.md", true),
        ("numpy/__init__.py", false),
        ("numpy/testing/__init__.py", false),
        (
            "numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so",
            false,
        ),
        ("lib/libt85.so.1", false),
        ("bin/tests", false),
        ("data/version", false),
    ] {
        assert_eq!(not_run(Path::new(p)), skip, "{p}");
    }
}

/// The listers a shared walk on `nodes` nodes chooses for these levels of directories.
fn listers(levels: &[&[&str]], nodes: usize) -> Readers {
    let mut r = Readers::new(nodes);
    for level in levels {
        r.level(&level.iter().map(PathBuf::from).collect::<Vec<_>>());
    }
    r
}

#[test]
fn a_directorys_files_go_to_few_nodes() {
    let (_t, s) = tree();
    let l = Layout::new(&s, 100, 4096);
    // no owners yet: by chunk
    let big = index_of(&s, "lib/big.so");
    let c = l.start(big).unwrap() / 4096;
    assert_eq!(l.owner(c + 1, 3), ((c + 1) % 3) as usize);
    for n in [1usize, 2, 3, 8] {
        let levels: &[&[&str]] = &[&[""], &["lib"], &["lib/python"], &["lib/python/pkg"]];
        let l = l.clone().with_owners(&s, &listers(levels, n));
        // every chunk of a file has its file's owner, a node of the job
        let o = l.owner(c, n);
        assert!(o < n);
        for k in 0..4 {
            assert_eq!(l.owner(c + k, n), o);
        }
        // the head and past the end: by chunk, as before
        assert_eq!(l.owner(0, n), 0);
        assert_eq!(l.owner(u64::MAX, n), (u64::MAX % n as u64) as usize);
    }
}

#[test]
fn owners_by_directory_follow_the_lister_and_cut_a_large_one_in_runs() {
    // a synthetic listing: the root with 100 files and 10 directories of 3 files each
    use crate::view::Node;
    let file = |path: &str, parent: u32| Node::test_file(path, 10, parent);
    let mut nodes = vec![Node {
        kind: Kind::Dir,
        ..file("", 0)
    }];
    for k in 0..100 {
        nodes.push(file(&format!("f{k:03}"), 0));
    }
    for d in 0..10u32 {
        let di = nodes.len() as u32;
        nodes.push(Node {
            kind: Kind::Dir,
            ..file(&format!("d{d}"), 0)
        });
        for k in 0..3 {
            nodes.push(file(&format!("d{d}/g{k}"), di));
        }
    }
    let s = Snapshot { nodes, requests: 0 };
    let dirs: Vec<String> = (0..10).map(|d| format!("d{d}")).collect();
    let dirs: Vec<&str> = dirs.iter().map(String::as_str).collect();
    let levels: &[&[&str]] = &[&[""], &dirs];
    let l = Layout::new(&s, 100, 4096).with_owners(&s, &listers(levels, 8));
    let owner_of = |path: &str| l.owner(l.start(index_of(&s, path)).unwrap() / 4096, 8);
    // the root's 100 files: 4 runs (of at least RUN = 32), on nodes 0..3, in order
    let root: Vec<usize> = (0..100).map(|k| owner_of(&format!("f{k:03}"))).collect();
    assert_eq!(root[0], 0);
    assert_eq!(root[99], 3);
    assert!(root.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
    for n in 0..4 {
        let c = root.iter().filter(|o| **o == n).count();
        assert_eq!(c, 25, "node {n}");
    }
    // each small directory's files on the node that lists it: the root's 10 subdirectories in
    // runs of at least RUN_DIRS (3 runs), from the root's lister (node 0) on
    let dirs: Vec<usize> = (0..10)
        .map(|d| {
            let o = owner_of(&format!("d{d}/g0"));
            assert_eq!(owner_of(&format!("d{d}/g2")), o);
            o
        })
        .collect();
    assert_eq!(dirs, vec![0, 0, 0, 0, 1, 1, 1, 2, 2, 2]);
    let r = listers(levels, 8);
    assert_eq!(r.lister(Path::new("")), Some(0));
    assert_eq!(r.lister(Path::new("d9")), Some(2));
    assert_eq!(r.lister(Path::new("d9/g0")), None);
    // on one node, everything is node 0's
    let one = Layout::new(&s, 100, 4096).with_owners(&s, &listers(levels, 1));
    assert!((0..one.chunks()).all(|i| one.owner(i, 1) == 0));
}

#[test]
fn a_large_files_chunks_are_read_in_runs_by_several_nodes() {
    use crate::view::Node;
    let mut nodes = vec![Node {
        kind: Kind::Dir,
        ..Node::test_file("", 0, 0)
    }];
    nodes.push(Node::test_file("small", 3 * 4096, 0));
    nodes.push(Node::test_file("large", 40 * 4096 - 1, 0));
    nodes.push(Node::test_file("nine", 9 * 4096, 0));
    let s = Snapshot { nodes, requests: 0 };
    let levels: &[&[&str]] = &[&[""]];
    for n in [1usize, 2, 3, 8] {
        let l = Layout::new(&s, 100, 4096).with_owners(&s, &listers(levels, n));
        let chunks_of = |p: &str, k: u64| {
            let c = l.start(index_of(&s, p)).unwrap() / 4096;
            (0..k).map(|j| l.owner(c + j, n)).collect::<Vec<_>>()
        };
        // a file of at most RUN_CHUNKS chunks: its owner's, the directory's lister
        assert!(chunks_of("small", 3).iter().all(|o| *o == 0));
        // 40 chunks: 5 runs of 8 (at most one per node), in order from the owner on
        let large = chunks_of("large", 40);
        let runs = 5.min(n);
        for (j, o) in large.iter().enumerate() {
            assert_eq!(*o, j * runs / 40 % n, "chunk {j} of 40 on {n} nodes");
        }
        let mut used: Vec<usize> = large.clone();
        used.dedup();
        assert_eq!(used.len(), runs);
        // 9 chunks: 2 runs where there are 2 nodes
        let nine = chunks_of("nine", 9);
        assert_eq!(nine[0], 0);
        assert_eq!(nine[8], 1 % n);
    }
}

#[test]
fn a_servers_failure_is_written_whole_beside_its_socket_and_nothing_else() {
    let t = tempfile::tempdir().unwrap();
    let sock = t.path().join("view-7.0-k.sock");
    write_failed(&sock, "no nodes").unwrap();
    write_failed(&sock, "the second word").unwrap();
    assert_eq!(
        std::fs::read_to_string(failed_path(&sock)).unwrap(),
        "the second word"
    );
    let names: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("view-7.0-k.sock.failed")]
    );
    // a directory it cannot write into: an error, nothing left
    let gone = t.path().join("gone/s.sock");
    assert!(write_failed(&gone, "x").is_err());
}
