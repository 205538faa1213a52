//! The engine on the in-process data plane ([`crate::plane::fake`]): every algorithm on
//! 1, 2, 5 and 8 "nodes" (one thread each, with its reader and writer threads), real files, and
//! the faults a job meets — a failed read on one node, a chunk damaged in transit or on storage,
//! a node that dies. What must hold, whatever happens: every node ends with the same verdict
//! (all `Ok`, or all `Err`), no node writes a byte that differs from SRC, nothing hangs.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::plane::fake::{group, Faults};
use swpool_format::pool::manifest::hash_chunk;

/// Chunk size of the fixtures (small, so that a file has many rounds).
const CHUNK: u64 = 64 << 10;
/// Longest a scenario may take before the test calls it a hang.
const HANG: Duration = Duration::from_secs(50);

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    src: PathBuf,
    data: Vec<u8>,
    chunks: Vec<Chunk>,
}

/// SRC of `count` chunks (the last one shorter, chunk 3 all zeros), with manifest hashes when
/// `pool`.
fn fixture(count: usize, pool: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let len = count as u64 * CHUNK - 1000;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    if count > 3 {
        data[3 * CHUNK as usize..4 * CHUNK as usize].fill(0);
    }
    let src = root.join("src");
    std::fs::write(&src, &data).unwrap();
    let chunks = plan::grid(0..len, CHUNK)
        .map(|c| Chunk {
            expect: pool
                .then(|| hash_chunk(&data[c.offset as usize..(c.offset + c.len as u64) as usize])),
            ..c
        })
        .collect();
    Fixture {
        _dir: dir,
        root,
        src,
        data,
        chunks,
    }
}

/// What one node does differently.
#[derive(Clone, Default)]
struct Node {
    /// Read SRC from this file instead (a shorter or damaged copy: this node's storage fails it).
    src: Option<PathBuf>,
}

/// One node's outcome and what its DEST holds.
struct Outcome {
    result: LocalResult<()>,
    out: Vec<u8>,
    stats: Stats,
}

/// Run `algo` on `n` nodes (`n == 1`: the single-node copy) and return every node's outcome; fails
/// the test when the scenario does not end within [`HANG`].
fn run(
    fx: &Fixture,
    n: usize,
    algo: Algorithm,
    faults: Faults,
    node: impl Fn(usize) -> Node + Send + Sync + 'static,
    verify_source: bool,
) -> Vec<Outcome> {
    let src = fx.src.clone();
    let root = fx.root.clone();
    let chunks = Arc::new(fx.chunks.clone());
    let len = fx.data.len() as u64;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let hosts: Vec<String> = (0..n).map(|k| format!("fake{k}")).collect();
        let planes = group(n, faults);
        let outs: Vec<Outcome> = std::thread::scope(|s| {
            let hs: Vec<_> = planes
                .into_iter()
                .enumerate()
                .map(|(k, plane)| {
                    let (src, root, chunks, hosts, node) = (&src, &root, &chunks, &hosts, &node);
                    s.spawn(move || {
                        let spec = node(k);
                        let srcf = std::fs::File::open(spec.src.as_deref().unwrap_or(src)).unwrap();
                        let out_path = root.join(format!("out-{k}"));
                        let out = std::fs::File::create(&out_path).unwrap();
                        out.set_len(len).unwrap();
                        let job = FileJob {
                            src: Some(&srcf),
                            src_path: Path::new("SRC"),
                            out: &out,
                            out_path: &out_path,
                            chunks,
                            chunk_size: CHUNK,
                            verify_source,
                            verify: true,
                            hosts,
                            progress: &|_| {},
                            watch: &Default::default(),
                            bench_slots: None,
                        };
                        let mut stats = Stats::default();
                        let result = match n {
                            1 => local(&job, &mut stats),
                            _ => distribute(&plane, &job, algo, &mut stats),
                        };
                        Outcome {
                            result,
                            out: std::fs::read(&out_path).unwrap(),
                            stats,
                        }
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("a node panicked"))
                .collect()
        });
        let _ = tx.send(outs);
    });
    rx.recv_timeout(HANG).unwrap_or_else(|_| {
        panic!("{algo:?} on {n} nodes did not finish within {HANG:?}: the engine hangs")
    })
}

/// No node holds a byte that differs from SRC: every chunk of every DEST is SRC's or all zeros
/// (never written).
fn never_wrong(fx: &Fixture, outs: &[Outcome]) {
    for (k, o) in outs.iter().enumerate() {
        for c in &fx.chunks {
            let r = c.offset as usize..(c.offset + c.len as u64) as usize;
            let got = &o.out[r.clone()];
            assert!(
                got == &fx.data[r] || got.iter().all(|&b| b == 0),
                "node {k} wrote wrong bytes at offset {}",
                c.offset
            );
        }
    }
}

fn all_ok(fx: &Fixture, outs: &[Outcome], what: &str) {
    for (k, o) in outs.iter().enumerate() {
        assert!(o.result.is_ok(), "{what}: node {k}: {:?}", o.result);
        assert!(o.out == fx.data, "{what}: node {k}'s DEST differs from SRC");
    }
}

fn errors(outs: &[Outcome]) -> Vec<(ExitStatus, String)> {
    outs.iter().filter_map(|o| o.result.clone().err()).collect()
}

const ALGOS: [Algorithm; 4] = [
    Algorithm::Ring,
    Algorithm::TwoTree,
    Algorithm::Allgather,
    Algorithm::Bcast,
];

#[test]
fn every_algorithm_copies_on_1_2_5_and_8_nodes_reading_each_chunk_once() {
    for pool in [false, true] {
        let fx = fixture(23, pool);
        for algo in ALGOS {
            for n in [1, 2, 5, 8] {
                let what = format!("{algo:?}, {n} nodes, pool {pool}");
                let outs = run(&fx, n, algo, Faults::default(), |_| Node::default(), pool);
                all_ok(&fx, &outs, &what);
                // storage is read once: the chunk that is all zeros is read too (it is not known
                // to be zero before), and only by one node
                let read: u64 = outs.iter().map(|o| o.stats.bytes_read).sum();
                assert_eq!(read, fx.data.len() as u64, "{what}: bytes read from SRC");
                if algo == Algorithm::TwoTree {
                    assert_eq!(outs[0].stats.bytes_read, read, "{what}: one reader");
                }
                // the zero chunk travels as a header only
                let sent: u64 = outs.iter().map(|o| o.stats.bytes_sent).sum();
                if n > 1 {
                    assert_eq!(sent, read - CHUNK, "{what}: bytes sent");
                }
            }
        }
    }
}

#[test]
fn a_failed_read_on_one_node_fails_every_node_and_writes_nothing_wrong() {
    let fx = fixture(23, false);
    let short = fx.root.join("short");
    std::fs::write(&short, &fx.data[..fx.data.len() / 2]).unwrap();
    for algo in ALGOS {
        // the two trees read on node 0 only
        let bad = if algo == Algorithm::TwoTree { 0 } else { 3 };
        let s = short.clone();
        let outs = run(
            &fx,
            5,
            algo,
            Faults::default(),
            move |k| Node {
                src: (k == bad).then(|| s.clone()),
            },
            false,
        );
        let what = format!("{algo:?}");
        let errs = errors(&outs);
        assert_eq!(errs.len(), 5, "{what}: every node fails: {errs:?}");
        let own = outs[bad].result.as_ref().unwrap_err();
        assert_eq!(own.0, ExitStatus::BadInput, "{what}: {own:?}");
        assert!(
            own.1.contains("shrank while being copied"),
            "{what}: {own:?}"
        );
        for (k, o) in outs.iter().enumerate().filter(|(k, _)| *k != bad) {
            let e = o.result.as_ref().unwrap_err();
            assert_eq!(e.0, ExitStatus::Collective, "{what}: node {k}: {e:?}");
            assert!(
                e.1.contains(&format!("fake{bad}")),
                "{what}: node {k}: {e:?}"
            );
        }
        never_wrong(&fx, &outs);
    }
}

#[test]
fn a_chunk_damaged_in_transit_is_never_written() {
    let fx = fixture(23, false);
    for algo in ALGOS {
        // damage a payload sent by node 0 (the two trees' reader; a reader in the others)
        let f = Faults {
            damage_from: Some(0),
            ..Faults::default()
        };
        let outs = run(&fx, 5, algo, f, |_| Node::default(), false);
        let what = format!("{algo:?}");
        let errs = errors(&outs);
        assert!(
            errs.iter().any(|e| e.0 == ExitStatus::System
                && e.1.contains("verification failed")
                && e.1.contains("sent by fake0")),
            "{what}: a receiver reports the damaged chunk: {errs:?}"
        );
        never_wrong(&fx, &outs);
        // the nodes that report no error hold SRC exactly
        for o in outs.iter().filter(|o| o.result.is_ok()) {
            assert!(o.out == fx.data, "{what}");
        }
    }
}

#[test]
fn a_pool_chunk_damaged_on_storage_stops_every_node() {
    let fx = fixture(23, true);
    let mut damaged = fx.data.clone();
    damaged[5 * CHUNK as usize + 17] ^= 0x40;
    let bad_src = fx.root.join("damaged");
    std::fs::write(&bad_src, &damaged).unwrap();
    for algo in [Algorithm::Ring, Algorithm::TwoTree] {
        let b = bad_src.clone();
        let outs = run(
            &fx,
            5,
            algo,
            Faults::default(),
            move |_| Node {
                src: Some(b.clone()),
            },
            true,
        );
        let what = format!("{algo:?}");
        let errs = errors(&outs);
        assert_eq!(errs.len(), 5, "{what}: every node fails: {errs:?}");
        assert!(
            errs.iter().any(|e| e.0 == ExitStatus::InvalidPool
                && e.1.contains(&format!("offset {}", 5 * CHUNK))),
            "{what}: the reader names the damaged chunk: {errs:?}"
        );
        never_wrong(&fx, &outs);
    }
}

#[test]
fn a_dead_node_fails_every_node_without_hanging() {
    let fx = fixture(23, false);
    for algo in ALGOS {
        for (who, after) in [(2, 0), (2, 3), (4, 8)] {
            let f = Faults {
                die: Some((who, after)),
                ..Faults::default()
            };
            let outs = run(&fx, 5, algo, f, |_| Node::default(), false);
            let what = format!("{algo:?}, node {who} dies after {after} operations");
            let errs = errors(&outs);
            assert!(outs[who].result.is_err(), "{what}: the dead node fails");
            // every round starts with an exchange of all nodes' headers, so every node learns of
            // it; in the two trees a node whose chunks all arrived before finishes (the leaders'
            // agreement before the commit then fails it with the others)
            if algo != Algorithm::TwoTree {
                assert_eq!(errs.len(), 5, "{what}: every node fails: {errs:?}");
            }
            for e in &errs {
                assert_eq!(e.0, ExitStatus::Collective, "{what}: {e:?}");
                assert!(e.1.contains(&format!("member {who} died")), "{what}: {e:?}");
            }
            for o in outs.iter().filter(|o| o.result.is_ok()) {
                assert!(
                    o.out == fx.data,
                    "{what}: a node that did not fail holds SRC"
                );
            }
            never_wrong(&fx, &outs);
        }
    }
}

/// A forwarding rank whose later receive completes first must still forward in chunk order: a
/// message names no chunk, so the child would take chunk 3's bytes for chunk 1 (with a plain file,
/// whose hash comes in the same header, unnoticed). Found by this fake plane, which completes a
/// receive whenever any request is tested, as MPI's progress engine may.
#[test]
fn the_two_trees_forward_in_order_whatever_completes_first() {
    for pool in [false, true] {
        let fx = fixture(23, pool);
        for i in 0..10 {
            let outs = run(
                &fx,
                8,
                Algorithm::TwoTree,
                Faults::default(),
                |_| Node::default(),
                pool,
            );
            all_ok(&fx, &outs, &format!("try {i}, pool {pool}"));
        }
    }
}
