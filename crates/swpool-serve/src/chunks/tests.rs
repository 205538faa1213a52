use super::*;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use swpool_format::pool::manifest::Manifest;

const CS: u64 = 4096;

/// An in-memory source that counts reads and can be slow (to make readers meet).
struct Fake {
    bytes: Mutex<Vec<u8>>,
    reads: Arc<AtomicUsize>,
    delay: Duration,
}

impl ChunkSource for Fake {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        let b = self.bytes.lock().unwrap();
        let end = offset as usize + buf.len();
        if end > b.len() {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        buf.copy_from_slice(&b[offset as usize..end]);
        Ok(())
    }
    fn describe(&self) -> String {
        "fake:pool".into()
    }
}

fn manifest_of(data: &[u8]) -> Manifest {
    let m = swpool_format::pool::manifest::sample(data, CS);
    m.validate().expect("a valid manifest");
    m
}

fn image(chunks: u64, tail: u64) -> Vec<u8> {
    let mut v: Vec<u8> = (0..chunks * CS + tail)
        .map(|i| (i * 7 % 251) as u8 + 1)
        .collect();
    // chunk 2 all zeros: a null chunk in the manifest
    v[2 * CS as usize..3 * CS as usize].fill(0);
    v
}

fn serve(data: &[u8], delay: Duration, limits: Limits) -> (Chunks, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let src = Fake {
        bytes: Mutex::new(data.to_vec()),
        reads: reads.clone(),
        delay,
    };
    let m = manifest_of(data);
    (Chunks::new(&m, Box::new(src), None, limits, "node7"), reads)
}

#[test]
fn reads_across_chunks_are_the_image_and_each_chunk_is_fetched_once() {
    let data = image(5, 100);
    let (c, reads) = serve(&data, Duration::ZERO, Limits::default());
    for (off, len) in [
        (0u64, 10u32),
        (CS - 3, 10),
        (0, 5 * CS as u32 + 100),
        (5 * CS, 4096),
    ] {
        let got = c.read(off, len).unwrap();
        let end = (off + len as u64).min(data.len() as u64);
        assert_eq!(got, &data[off as usize..end as usize], "{off}+{len}");
    }
    // 6 chunks, one of them null: 5 fetches, however often they were read
    assert_eq!(reads.load(Ordering::SeqCst), 5);
    assert_eq!(c.read(data.len() as u64, 10).unwrap(), Vec::<u8>::new());
    assert!(matches!(
        c.read(data.len() as u64 + 1, 10),
        Err(ChunkError::PastEnd { .. })
    ));
}

/// A 32-task job on one node: 32 readers asking for the same chunk at the same moment make one
/// fetch, and 32 readers of 32 different chunks are served in parallel (not one after another).
#[test]
fn thirty_two_readers_one_fetch_of_a_hot_chunk_and_different_chunks_in_parallel() {
    let data = image(40, 0);
    let delay = Duration::from_millis(100);
    let (c, reads) = serve(&data, delay, Limits::default());
    let barrier = std::sync::Barrier::new(32);
    std::thread::scope(|s| {
        for _ in 0..32 {
            s.spawn(|| {
                barrier.wait();
                let got = c.read(5 * CS + 17, 1000).unwrap();
                assert_eq!(got, &data[5 * CS as usize + 17..5 * CS as usize + 1017]);
            });
        }
    });
    assert_eq!(reads.load(Ordering::SeqCst), 1, "one fetch for 32 readers");
    let t = std::time::Instant::now();
    std::thread::scope(|s| {
        for k in 0..32u64 {
            let (c, data, barrier) = (&c, &data, &barrier);
            s.spawn(move || {
                let i = 6 + k; // chunks 6..37 (not the null chunk 2, not chunk 5)
                barrier.wait();
                let got = c.read(i * CS, CS as u32).unwrap();
                assert_eq!(got, &data[(i * CS) as usize..((i + 1) * CS) as usize]);
            });
        }
    });
    let took = t.elapsed();
    assert_eq!(reads.load(Ordering::SeqCst), 33);
    // one after another: 32 x 100 ms; in parallel: about one delay
    assert!(took < delay * 8, "32 different chunks took {took:?}");
}

#[test]
fn a_changed_chunk_is_eio_naming_pool_chunk_offset_and_node_and_the_rest_stays_readable() {
    let data = image(4, 0);
    let m = manifest_of(&data);
    let mut changed = data.clone();
    changed[3 * CS as usize + 17] ^= 0xff;
    let reads = Arc::new(AtomicUsize::new(0));
    let src = Fake {
        bytes: Mutex::new(changed),
        reads: reads.clone(),
        delay: Duration::ZERO,
    };
    let c = Chunks::new(&m, Box::new(src), None, Limits::default(), "node7");
    let e = c.read(3 * CS + 5, 10).unwrap_err();
    let msg = e.to_string();
    for want in [
        "chunk 3",
        "offset 12288",
        "node7",
        "fake:pool",
        "signed manifest",
    ] {
        assert!(msg.contains(want), "{want} in {msg}");
    }
    assert_eq!(c.read(0, 100).unwrap(), &data[..100]);
    // again: still refused, not fetched again
    let before = reads.load(Ordering::SeqCst);
    assert!(c.read(3 * CS, 1).is_err());
    assert_eq!(reads.load(Ordering::SeqCst), before);
    assert_eq!(c.stats.bad.load(Ordering::SeqCst), 1);
}

#[test]
fn a_hot_chunk_is_fetched_once_when_32_readers_ask_at_the_same_moment() {
    let data = image(3, 0);
    let (c, reads) = serve(&data, Duration::from_millis(50), Limits::default());
    let c = Arc::new(c);
    let hs: Vec<_> = (0..32)
        .map(|k| {
            let c = c.clone();
            std::thread::spawn(move || c.read(CS + k, 100).unwrap())
        })
        .collect();
    for (k, h) in hs.into_iter().enumerate() {
        let k = k as u64;
        assert_eq!(
            h.join().unwrap(),
            &data[(CS + k) as usize..(CS + k + 100) as usize]
        );
    }
    assert_eq!(reads.load(Ordering::SeqCst), 1);
}

#[test]
fn memory_stays_within_its_bound() {
    let data = image(10, 0);
    let (c, reads) = serve(
        &data,
        Duration::ZERO,
        Limits {
            memory: 2 * CS,
            ..Limits::default()
        },
    );
    for i in 0..10 {
        c.read(i * CS, 1).unwrap();
    }
    assert!(c.lock().lru_bytes <= 2 * CS);
    let before = reads.load(Ordering::SeqCst);
    c.read(9 * CS, 1).unwrap(); // still held
    assert_eq!(reads.load(Ordering::SeqCst), before);
    c.read(0, 1).unwrap(); // evicted: fetched again
    assert_eq!(reads.load(Ordering::SeqCst), before + 1);
}

#[test]
fn a_local_store_keeps_chunks_across_servers_and_a_damaged_copy_is_fetched_again() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("pool.part");
    let data = image(6, 10);
    let m = manifest_of(&data);
    let open = || {
        let (s, present) = LocalStore::open(&p, &m.digest, m.image_size, m.chunk_size).unwrap();
        Some((s, present))
    };
    let reads = Arc::new(AtomicUsize::new(0));
    let src = || Fake {
        bytes: Mutex::new(data.clone()),
        reads: reads.clone(),
        delay: Duration::ZERO,
    };
    let c = Chunks::new(&m, Box::new(src()), open(), Limits::default(), "n");
    c.read(0, 2 * CS as u32).unwrap(); // chunks 0, 1
    c.read(4 * CS, 1).unwrap(); // chunk 4
    assert_eq!(
        c.read(4 * CS + 1, 7).unwrap(),
        &data[4 * CS as usize + 1..4 * CS as usize + 8]
    );
    assert_eq!(c.local().unwrap().flush().unwrap(), 3);
    drop(c);
    assert_eq!(reads.load(Ordering::SeqCst), 3);
    // tamper with chunk 1 of the copy
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(b"XX", CS + 10).unwrap();
    }
    let c = Chunks::new(&m, Box::new(src()), open(), Limits::default(), "n");
    assert_eq!(c.present(), (3, 7));
    assert_eq!(c.read(0, 6 * CS as u32 + 10).unwrap(), data);
    // chunks 3 and 5 and 6, and the damaged 1: four reads from the source; 0 and 4 came from disk
    assert_eq!(reads.load(Ordering::SeqCst), 3 + 4);
}

#[test]
fn a_sequential_reader_has_the_next_chunks_fetched_ahead_and_a_random_one_does_not() {
    let data = image(40, 0);
    let (c, reads) = serve(
        &data,
        Duration::from_millis(20),
        Limits {
            memory: 64 * CS,
            readahead: 4,
        },
    );
    let c = Arc::new(c);
    c.start_readahead();
    // random: chunks 10, 30, 20: three fetches and nothing ahead
    for i in [10u64, 30, 20] {
        c.read(i * CS, 10).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(reads.load(Ordering::SeqCst), 3);
    // one boundary crossed: 0 then 1 (in two reads each): nothing ahead
    for i in [0u64, 1] {
        c.read(i * CS, 100).unwrap();
        c.read(i * CS + 100, 100).unwrap();
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(reads.load(Ordering::SeqCst), 3 + 2);
    // the second crossing, into 2 (null: never fetched): 2 chunks ahead, 3 and 4, in the
    // background
    c.read(2 * CS, 100).unwrap();
    let want = 3 + 2 + 2;
    for _ in 0..100 {
        if reads.load(Ordering::SeqCst) >= want {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(reads.load(Ordering::SeqCst), want);
    // reading on to 5: the image's bytes; the window doubles with each crossing (4 ahead of 3,
    // then the window, 4, ahead of 4 and of 5): 5 to 9 fetched, never more than the window past
    // the reader
    let got = c.read(2 * CS, 4 * CS as u32).unwrap();
    assert_eq!(got, &data[2 * CS as usize..6 * CS as usize]);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(reads.load(Ordering::SeqCst), want + 5);
}

/// Chunks of 256 KiB (8 pieces of [`outline::PIECE`]), one kept in memory: a random read of a
/// chunk verified before and dropped from memory fetches the pieces it needs, not the chunk.
fn serve_large(data: &[u8]) -> (Chunks, Arc<Mutex<Vec<u8>>>, Arc<AtomicUsize>) {
    const LCS: u64 = 256 << 10;
    let reads = Arc::new(AtomicUsize::new(0));
    let bytes = Arc::new(Mutex::new(data.to_vec()));
    struct Shared(Arc<Mutex<Vec<u8>>>, Arc<AtomicUsize>);
    impl ChunkSource for Shared {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
            self.1.fetch_add(1, Ordering::SeqCst);
            let b = self.0.lock().unwrap();
            buf.copy_from_slice(&b[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn describe(&self) -> String {
            "fake:pool".into()
        }
    }
    let m = swpool_format::pool::manifest::sample(data, LCS);
    m.validate().unwrap();
    let limits = Limits {
        memory: LCS,
        readahead: 0,
    };
    let src = Shared(bytes.clone(), reads.clone());
    let c = Chunks::new(&m, Box::new(src), None, limits, "node7");
    (c, bytes, reads)
}

#[test]
fn a_chunk_read_again_after_it_left_memory_fetches_only_the_pieces_a_read_needs() {
    let data: Vec<u8> = (0..(3u64 << 18) + 5000)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let (c, _, reads) = serve_large(&data);
    let p = outline::PIECE;
    // chunk 0 whole (verified, its outline kept), then chunk 1 pushes it out of memory
    assert_eq!(c.read(100, 10).unwrap(), &data[100..110]);
    assert_eq!(
        c.read((256 << 10) + 1, 10).unwrap(),
        &data[(256 << 10) + 1..(256 << 10) + 11]
    );
    let (fetched, n) = (
        c.stats.fetched.load(Ordering::SeqCst),
        reads.load(Ordering::SeqCst),
    );
    assert_eq!((fetched, n), (512 << 10, 2));
    // 4 KiB within one piece, and 8 KiB across two pieces of chunk 0: 1 and 2 pieces fetched
    let at = 3 * p + 100;
    assert_eq!(
        c.read(at, 4096).unwrap(),
        &data[at as usize..at as usize + 4096]
    );
    let at = 5 * p - 4096;
    assert_eq!(
        c.read(at, 8192).unwrap(),
        &data[at as usize..at as usize + 8192]
    );
    assert_eq!(c.stats.fetched.load(Ordering::SeqCst) - fetched, 3 * p);
    assert_eq!(c.stats.piece_reads.load(Ordering::SeqCst), 2);
    // the short last chunk (5000 bytes: one piece) is read whole; a read across chunks 1 and 2
    let end = data.len() as u64;
    assert_eq!(c.read(end - 10, 10).unwrap(), &data[end as usize - 10..]);
    let at = (2 << 18) - 300;
    assert_eq!(
        c.read(at, 600).unwrap(),
        &data[at as usize..at as usize + 600]
    );
    assert_eq!(c.stats.bad.load(Ordering::SeqCst), 0);
}

#[test]
fn a_piece_changed_on_the_source_after_its_chunk_was_verified_is_eio_and_never_served() {
    let data: Vec<u8> = (0..2u64 << 18).map(|i| (i * 13 % 253) as u8).collect();
    let (c, bytes, _) = serve_large(&data);
    let p = outline::PIECE as usize;
    c.read(0, 10).unwrap();
    c.read(256 << 10, 10).unwrap(); // chunk 0 out of memory, its outline kept
                                    // one byte of piece 6 of chunk 0 changed on storage after it was verified
    bytes.lock().unwrap()[6 * p + 77] ^= 0x40;
    // pieces other than 6 still verify and are served
    assert_eq!(
        c.read(2 * p as u64, 4096).unwrap(),
        &data[2 * p..2 * p + 4096]
    );
    let e = c.read(6 * p as u64 + 4000, 4096).unwrap_err();
    assert!(
        matches!(e, ChunkError::Mismatch { index: 0, offset: 0, ref node, .. } if node == "node7"),
        "{e:?}"
    );
    assert!(e.to_string().contains("does not match"), "{e}");
    assert_eq!(c.stats.bad.load(Ordering::SeqCst), 1);
    // the chunk is bad from now on, whichever piece is asked; chunk 1 stays readable
    assert!(c.read(0, 10).is_err());
    assert_eq!(c.stats.bad.load(Ordering::SeqCst), 1);
    assert_eq!(
        c.read((256 << 10) + 5, 5).unwrap(),
        &data[(256 << 10) + 5..(256 << 10) + 10]
    );
}

/// A read across four chunks not yet fetched (a file-system block of a pool with small chunks)
/// waits for about one fetch, not four one after another; each chunk is still fetched once.
#[test]
fn a_read_across_chunks_fetches_them_at_once() {
    let data = image(12, 0);
    let delay = Duration::from_millis(200);
    let (c, reads) = serve(&data, delay, Limits::default());
    let t = std::time::Instant::now();
    let got = c.read(4 * CS + 100, 3 * CS as u32).unwrap();
    let took = t.elapsed();
    assert_eq!(got, &data[4 * CS as usize + 100..7 * CS as usize + 100]);
    assert_eq!(reads.load(Ordering::SeqCst), 4);
    assert!(took < delay * 2, "4 chunks of one read took {took:?}");
    // read again: from memory, no fetch
    assert_eq!(
        c.read(4 * CS, 4 * CS as u32).unwrap(),
        &data[4 * CS as usize..8 * CS as usize]
    );
    assert_eq!(reads.load(Ordering::SeqCst), 4);
}
