use super::*;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Mutex;

use swpool_serve::Limits;

const CS: u64 = 4096;

/// Shared storage: counts the reads of every chunk, by anyone.
struct Storage {
    bytes: Vec<u8>,
    reads: Arc<Mutex<HashMap<u64, u64>>>,
    total: Arc<AtomicU64>,
}

impl ChunkSource for Storage {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        *self.reads.lock().unwrap().entry(offset / CS).or_default() += 1;
        self.total.fetch_add(1, Ordering::SeqCst);
        buf.copy_from_slice(&self.bytes[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn describe(&self) -> String {
        "storage".into()
    }
}

/// What each node read (chunk by chunk), and the storage reads per chunk.
type Outcome = (Vec<Vec<Result<Vec<u8>, String>>>, HashMap<u64, u64>);

fn image(chunks: u64) -> Vec<u8> {
    (0..chunks * CS + 123)
        .map(|i| (i * 13 % 251) as u8 + 1)
        .collect()
}

/// `n` nodes; node k reads `want(k)` (chunk indices) through its engine; returns what each read
/// and the storage reads per chunk.
fn run_nodes(
    n: usize,
    data: &[u8],
    bad_on_storage: Option<u64>,
    want: impl Fn(usize) -> Vec<u64> + Sync,
) -> Outcome {
    let m = swpool_format::pool::manifest::sample(data, CS);
    let mut stored = data.to_vec();
    if let Some(i) = bad_on_storage {
        stored[(i * CS) as usize + 1] ^= 0xff;
    }
    let reads = Arc::new(Mutex::new(HashMap::new()));
    let total = Arc::new(AtomicU64::new(0));
    let done = AtomicUsize::new(0);
    let planes = crate::plane::fake::group(n, Default::default());
    let out = std::thread::scope(|s| {
        let hs: Vec<_> = planes
            .into_iter()
            .enumerate()
            .map(|(k, plane)| {
                let (m, stored, reads, total, done, want) =
                    (&m, &stored, reads.clone(), total.clone(), &done, &want);
                s.spawn(move || {
                    let (tx, rx) = mpsc::channel();
                    let src = PeerSource {
                        me: k,
                        nodes: n,
                        chunk_size: CS,
                        storage: Box::new(Storage {
                            bytes: stored.clone(),
                            reads,
                            total,
                        }),
                        asks: tx,
                        stall: Duration::from_secs(10),
                        hosts: (0..n).map(|i| format!("node{}", i + 1)).collect(),
                    };
                    let engine = Arc::new(Chunks::new(
                        m,
                        Box::new(src),
                        None,
                        Limits::default(),
                        &format!("node{}", k + 1),
                    ));
                    let stop = AtomicBool::new(false);
                    std::thread::scope(|s2| {
                        let e = engine.clone();
                        let stop = &stop;
                        let reader = s2.spawn(move || {
                            let got: Vec<Result<Vec<u8>, String>> = want(k)
                                .into_iter()
                                .map(|i| e.read(i * CS, CS as u32).map_err(|e| e.to_string()))
                                .collect();
                            done.fetch_add(1, Ordering::SeqCst);
                            // every node keeps answering until all have read
                            while done.load(Ordering::SeqCst) < n {
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            stop.store(true, Ordering::SeqCst);
                            got
                        });
                        run(&plane, engine.clone(), rx, stop, 1 << 20, CS, None).unwrap();
                        reader.join().unwrap()
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let r = reads.lock().unwrap().clone();
    (out, r)
}

#[test]
fn four_nodes_reading_everything_read_each_chunk_from_storage_once() {
    let data = image(16);
    let (out, reads) = run_nodes(4, &data, None, |_| (0..16).collect());
    for (k, got) in out.iter().enumerate() {
        for (i, r) in got.iter().enumerate() {
            let want = &data[i * CS as usize..((i + 1) * CS as usize).min(data.len())];
            assert_eq!(r.as_deref().unwrap(), want, "node {k} chunk {i}");
        }
    }
    assert_eq!(reads.len(), 16);
    assert!(reads.values().all(|c| *c == 1), "{reads:?}");
}

#[test]
fn a_chunk_bad_on_storage_is_refused_on_every_node_that_asks_and_the_rest_reads() {
    let data = image(8);
    let (out, reads) = run_nodes(3, &data, Some(5), |_| (0..8).collect());
    for (k, got) in out.iter().enumerate() {
        let e = got[5].as_ref().unwrap_err();
        assert!(e.contains("chunk 5"), "node {k}: {e}");
        for (i, r) in got.iter().enumerate().filter(|(i, _)| *i != 5) {
            assert!(r.is_ok(), "node {k} chunk {i}: {r:?}");
        }
    }
    // the owner (node 3: 5 mod 3 = 2) read it once; the others were refused by it
    assert_eq!(reads[&5], 1);
}

#[test]
fn nodes_touching_the_same_few_chunks_cost_storage_one_read_each() {
    let data = image(40);
    // every node reads the same 4 chunks
    let (out, reads) = run_nodes(4, &data, None, |_| vec![3, 17, 18, 30]);
    assert!(out.iter().all(|g| g.iter().all(|r| r.is_ok())));
    assert_eq!(reads.values().sum::<u64>(), 4, "{reads:?}");
}

/// Answers nothing: the idle test asks for nothing.
struct Nothing;

impl Local for Nothing {
    fn answer_into(&self, index: u64, _: u32, _: &mut Vec<u8>) -> Result<(), String> {
        Err(format!("chunk {index}: nothing here"))
    }
}

#[test]
fn an_idle_exchange_tests_its_requests_at_most_every_2_ms_and_still_sends_asks_until_it_ends() {
    // Nothing wakes the exchange when a peer's message arrives, so an idle one tests its
    // requests again and again; each turn costs CPU (on MPI, a poll of every peer's socket).
    // 200 ms idle: at most 200 / 2 turns plus the first ones (50 µs doubling to 2 ms). The loop
    // that yielded 20 times and slept at most 1 ms took ~230 here. A slow machine takes fewer.
    let mut planes = crate::plane::fake::group(2, Default::default());
    let p1 = planes.pop().unwrap();
    let p0 = planes.pop().unwrap();
    let turns = p0.turns();
    let stop = AtomicBool::new(false);
    let (tx0, rx0) = mpsc::channel::<Ask>();
    let (_tx1, rx1) = mpsc::channel::<Ask>();
    let (turns_idle, asked) = std::thread::scope(|s| {
        let stop = &stop;
        let h1 = s.spawn(move || run(&p1, Arc::new(Nothing), rx1, stop, 8, CS, None).unwrap());
        let h0 = s.spawn(move || run(&p0, Arc::new(Nothing), rx0, stop, 8, CS, None).unwrap());
        std::thread::sleep(Duration::from_millis(200));
        let idle = turns.load(Ordering::Relaxed);
        // an ask of this node (chunk 1: node 1's) is sent and refused by its owner
        let r = ask_owner(&tx0, 1, CS as usize, Duration::from_secs(10), "node2");
        stop.store(true, Ordering::SeqCst);
        let (s0, _) = (h0.join().unwrap(), h1.join().unwrap());
        let e = r.unwrap_err();
        assert!(
            !e.late && e.message.contains("nothing here"),
            "{}",
            e.message
        );
        // the thread that forwarded this node's asks ends with the exchange, and with it the
        // asks' receiver, with no ask to wake it (one would end it: see below): the first ask
        // sent 1 s (10 of its checks) after the end finds nobody to take it
        std::thread::sleep(Duration::from_secs(1));
        let (reply, _keep) = mpsc::sync_channel(1);
        assert!(
            tx0.send(Ask {
                index: 1,
                len: 1,
                reply
            })
            .is_err(),
            "the forwarding thread outlives its exchange"
        );
        // an ask after the exchange ended fails at once, and says so
        let t = std::time::Instant::now();
        let e = ask_owner(&tx0, 1, CS as usize, Duration::from_secs(10), "node2").unwrap_err();
        assert!(!e.late && e.message.contains("has ended"), "{}", e.message);
        assert!(t.elapsed() < Duration::from_secs(5));
        (idle, s0.asked)
    });
    assert!(
        turns_idle >= 10,
        "{turns_idle} turns in 200 ms: is it running?"
    );
    assert!(turns_idle <= 130, "{turns_idle} turns in 200 ms idle");
    assert_eq!(asked, 1);
}
