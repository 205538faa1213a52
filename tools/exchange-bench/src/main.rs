//! exchange-bench: the on-demand mode's peer transport measured two ways on the testbed (issue 30's
//! design point "measure one-sided against two-sided request/response"), one rank per node:
//!
//! - `two-sided`: what `load --lazy` ships — `swpool_core::ondemand::exchange::run` (requests and
//!   answers with tags, one MPI thread) under `swpool_serve::Chunks` engines, read by DEPTH reader
//!   threads per node through the node's engine (every chunk hashed against the manifest);
//! - `one-sided`: the OSR seed's design — each node exposes the chunks it owns in an MPI window
//!   (`MPI_Win_create`), every node `MPI_Win_lock_all`s it once and fetches with `MPI_Get` DEPTH
//!   chunks at a time, then `MPI_Win_flush_all`, and hashes each chunk against the same manifest;
//! - `one-sided-quiet`: node 0 alone fetches with `MPI_Get` while every other node computes for
//!   QUIET seconds without calling MPI (passive target: does a get progress while its target is
//!   outside MPI?).
//!
//! Chunk i (1 MiB) is owned by node `i mod N`, as in `load --lazy`. Every node fetches every chunk
//! it does not own (the OSR test: every node reads the whole file), all nodes at once except in
//! `one-sided-quiet`. Chunks come from memory, not from storage: this measures the transport and
//! the verification, nothing else. Each rank prints one line:
//!   `exchange-bench MODE rank R/N host H depth D chunks C bytes B seconds T mbps X p50_ms Y p99_ms Z ok|BAD`
//!
//!   exchange-bench MODE [CHUNKS_PER_NODE (16)] [DEPTH (1)] [QUIET_SECONDS (3)]

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::traits::*;
use swpool_core::ondemand::exchange::{self, Gate, PeerSource};
use swpool_format::pool::manifest::{self, Manifest};
use swpool_mpi::plane::MpiPlane;
use swpool_serve::{ChunkSource, Chunks, Limits};

const CS: u64 = 1 << 20;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Chunk `i`'s bytes: a xorshift stream seeded by `i` (no chunk is all zeros, none equals another).
fn fill(i: u64, buf: &mut [u8]) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (i + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

/// The whole image in memory (the manifest needs every chunk's hash).
fn image(chunks: u64) -> Vec<u8> {
    let mut v = vec![0u8; (chunks * CS) as usize];
    for (i, c) in v.chunks_mut(CS as usize).enumerate() {
        fill(i as u64, c);
    }
    v
}

/// "Shared storage" for the two-sided mode: the image in memory.
struct Mem(Arc<Vec<u8>>);

impl ChunkSource for Mem {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let s = offset as usize;
        let src = self
            .0
            .get(s..s + buf.len())
            .ok_or_else(|| std::io::Error::other("past the end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

struct Outcome {
    chunks: usize,
    secs: f64,
    lat: Vec<f64>,
    ok: bool,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The chunks node `me` of `n` does not own, in order.
fn wanted(me: usize, n: usize, total: u64) -> Vec<u64> {
    (0..total)
        .filter(|i| exchange::owner(*i, n) != me)
        .collect()
}

fn two_sided(
    world: &mpi::topology::SimpleCommunicator,
    m: &Manifest,
    img: Arc<Vec<u8>>,
    depth: usize,
) -> Outcome {
    let (me, n) = (world.rank() as usize, world.size() as usize);
    let total = m.chunks.len() as u64;
    let host = hostname();
    let (tx, rx) = mpsc::channel();
    let src = PeerSource {
        me,
        nodes: n,
        chunk_size: CS,
        storage: Box::new(Mem(img)),
        asks: tx,
        stall: Duration::from_secs(120),
        hosts: (0..n).map(|i| format!("rank {i}")).collect(),
    };
    // room for every chunk: nothing is evicted and fetched again
    let limits = Limits {
        memory: (total + 8) * CS,
        readahead: 0,
    };
    let engine = Arc::new(Chunks::new(m, Box::new(src), None, limits, &host));
    let want = wanted(me, n, total);
    let next = AtomicUsize::new(0);
    let lat = Mutex::new(Vec::new());
    let ok = AtomicBool::new(true);
    let stop = AtomicBool::new(false);
    let plane = MpiPlane::new(world.duplicate());
    world.barrier();
    let t0 = Instant::now();
    let secs = std::thread::scope(|s| {
        let (done_tx, done_rx) = mpsc::channel::<Vec<u8>>();
        let (engine2, want, next, lat, ok) = (&engine, &want, &next, &lat, &ok);
        let readers: Vec<_> = (0..depth)
            .map(|_| {
                s.spawn(move || loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&i) = want.get(k) else { return };
                    let t = Instant::now();
                    match engine2.read(i * CS, CS as u32) {
                        Ok(b) if b.len() == CS as usize => {}
                        Ok(_) => ok.store(false, Ordering::Relaxed),
                        Err(e) => {
                            eprintln!("exchange-bench: chunk {i}: {e}");
                            ok.store(false, Ordering::Relaxed);
                        }
                    }
                    lat.lock().unwrap().push(t.elapsed().as_secs_f64());
                })
            })
            .collect();
        let mine_done = Arc::new(Mutex::new(None::<f64>));
        let md = mine_done.clone();
        s.spawn(move || {
            for r in readers {
                let _ = r.join();
            }
            *md.lock().unwrap() = Some(t0.elapsed().as_secs_f64());
            let _ = done_tx.send(vec![1]);
        });
        // the node keeps answering its peers until every node has read all it wanted
        let stop = &stop;
        let mut all = |_: Vec<u8>| stop.store(true, Ordering::Relaxed);
        let gate = Gate {
            mine: done_rx,
            all: &mut all,
        };
        if let Err(e) = exchange::run(&plane, engine.clone(), rx, stop, total, CS, Some(gate)) {
            eprintln!("exchange-bench: {e}");
            ok.store(false, Ordering::Relaxed);
        }
        let v = *mine_done.lock().unwrap();
        v.unwrap_or(f64::NAN)
    });
    Outcome {
        chunks: want.len(),
        secs,
        lat: lat.into_inner().unwrap(),
        ok: ok.into_inner(),
    }
}

fn check(rc: c_int, what: &str) {
    if rc != 0 {
        eprintln!("exchange-bench: {what} failed with MPI error {rc}");
        std::process::exit(1);
    }
}

fn spin(secs: f64) -> u64 {
    let t = Instant::now();
    let mut x = 1u64;
    while t.elapsed().as_secs_f64() < secs {
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
        }
    }
    x
}

fn one_sided(
    world: &mpi::topology::SimpleCommunicator,
    m: &Manifest,
    img: &[u8],
    depth: usize,
    quiet: Option<f64>,
) -> Outcome {
    let (me, n) = (world.rank() as usize, world.size() as usize);
    let total = m.chunks.len() as u64;
    // this node's window: the chunks it owns, local chunk j = chunk j * n + me
    let mut local: Vec<u8> = Vec::new();
    for i in (0..total).filter(|i| exchange::owner(*i, n) == me) {
        local.extend_from_slice(&img[(i * CS) as usize..((i + 1) * CS) as usize]);
    }
    let hashes: Vec<Option<[u8; 32]>> = m
        .chunks
        .iter()
        .map(|h| h.as_deref().and_then(manifest::decode_hash))
        .collect();
    let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
    // SAFETY: `local` outlives the window (freed below, before `local` is dropped); MPI writes
    // `win` during the call.
    let win = unsafe {
        check(
            ffi::MPI_Win_create(
                local.as_mut_ptr() as *mut c_void,
                local.len() as ffi::MPI_Aint,
                1,
                ffi::RSMPI_INFO_NULL,
                world.as_raw(),
                win.as_mut_ptr(),
            ),
            "MPI_Win_create",
        );
        win.assume_init()
    };
    // SAFETY: a valid window; every rank locks it once for the whole run.
    check(unsafe { ffi::MPI_Win_lock_all(0, win) }, "MPI_Win_lock_all");
    let fetching = quiet.is_none() || me == 0;
    let want = if fetching {
        wanted(me, n, total)
    } else {
        Vec::new()
    };
    let mut bufs: Vec<Vec<u8>> = (0..depth).map(|_| vec![0u8; CS as usize]).collect();
    let mut lat = Vec::new();
    let mut ok = true;
    world.barrier();
    let t0 = Instant::now();
    if let (Some(q), false) = (quiet, fetching) {
        std::hint::black_box(spin(q));
    }
    for batch in want.chunks(depth) {
        let t = Instant::now();
        for (b, &i) in bufs.iter_mut().zip(batch) {
            let owner = exchange::owner(i, n);
            let disp = (i / n as u64) * CS;
            // SAFETY: `b` (CS bytes) is neither read nor moved until the flush below completes
            // the get; the target range lies in the owner's window (its chunk i / n).
            check(
                unsafe {
                    ffi::MPI_Get(
                        b.as_mut_ptr() as *mut c_void,
                        CS as c_int,
                        ffi::RSMPI_UINT8_T,
                        owner as c_int,
                        disp as ffi::MPI_Aint,
                        CS as c_int,
                        ffi::RSMPI_UINT8_T,
                        win,
                    )
                },
                "MPI_Get",
            );
        }
        // SAFETY: a valid, locked window.
        check(unsafe { ffi::MPI_Win_flush_all(win) }, "MPI_Win_flush_all");
        for (b, &i) in bufs.iter().zip(batch) {
            if hashes.get(i as usize).copied().flatten() != Some(manifest::hash_chunk(b)) {
                eprintln!(
                    "exchange-bench: chunk {i} from rank {} is wrong",
                    i % n as u64
                );
                ok = false;
            }
        }
        let d = t.elapsed().as_secs_f64();
        lat.extend(vec![d; batch.len()]);
    }
    let secs = t0.elapsed().as_secs_f64();
    // SAFETY: locked above; the window is freed collectively once every rank is done with it.
    check(
        unsafe { ffi::MPI_Win_unlock_all(win) },
        "MPI_Win_unlock_all",
    );
    let mut win = win;
    // SAFETY: every rank calls it; `local` is still alive.
    check(unsafe { ffi::MPI_Win_free(&mut win) }, "MPI_Win_free");
    drop(local);
    Outcome {
        chunks: want.len(),
        secs,
        lat,
        ok,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = || -> ! {
        eprintln!(
            "usage: exchange-bench two-sided|one-sided|one-sided-quiet [CHUNKS_PER_NODE] [DEPTH] [QUIET_SECONDS]"
        );
        std::process::exit(2)
    };
    let mode = args.get(1).cloned().unwrap_or_else(|| usage());
    let num = |i: usize, d: f64| -> f64 {
        match args.get(i) {
            None => d,
            Some(s) => match s.parse::<f64>() {
                Ok(v) if v > 0.0 => v,
                _ => usage(),
            },
        }
    };
    let per = num(2, 16.0) as u64;
    let depth = num(3, 1.0) as usize;
    let quiet = num(4, 3.0);
    let threading = if mode == "two-sided" {
        mpi::Threading::Funneled
    } else {
        mpi::Threading::Single
    };
    let Some((universe, _)) = mpi::initialize_with_threading(threading) else {
        eprintln!("exchange-bench: MPI was already initialised");
        std::process::exit(1);
    };
    let world = universe.world();
    let n = world.size() as u64;
    let total = per * n;
    let img = Arc::new(image(total));
    let m = manifest::sample(&img, CS);
    let o = match mode.as_str() {
        "two-sided" => two_sided(&world, &m, img.clone(), depth),
        "one-sided" => one_sided(&world, &m, &img, depth, None),
        "one-sided-quiet" => one_sided(&world, &m, &img, depth, Some(quiet)),
        _ => usage(),
    };
    world.barrier();
    let mut lat: Vec<f64> = o.lat;
    let bytes = o.chunks as u64 * CS;
    let mbps = if o.secs > 0.0 {
        bytes as f64 / o.secs / 1e6
    } else {
        0.0
    };
    println!(
        "exchange-bench {mode} rank {}/{n} host {} depth {depth} chunks {} bytes {bytes} seconds {:.4} mbps {:.1} p50_ms {:.2} p99_ms {:.2} {}",
        world.rank(),
        hostname(),
        o.chunks,
        o.secs,
        mbps,
        percentile(&mut lat, 0.5) * 1e3,
        percentile(&mut lat, 0.99) * 1e3,
        if o.ok { "ok" } else { "BAD" }
    );
}
