//! The file pipeline: split reading, pipelined non-blocking distribution among the leaders that
//! need the file, verification of every chunk as it lands, sparse `pwrite` into the temporary.
//!
//! Three threads per leader, so that reading, moving and writing overlap all the time:
//! - a **reader** thread reads this leader's chunks (in round order, sequentially on SRC) into a
//!   small pool of send buffers, checks them for zeros, hashes them (BLAKE3; pools: checked against
//!   the manifest) and hands them over; it runs up to `plan::send_buffers` chunks ahead of the network;
//! - the **main** thread alone calls MPI (`MPI_THREAD_FUNNELED`): for round `r` it takes its own
//!   chunk, exchanges the small header block (status, length, zero flag and hash; `MPI_Iallgather`),
//!   starts the round's data movement ([`Algorithm::Allgather`]: one `MPI_Iallgatherv` straight from
//!   the reader's buffer; [`Algorithm::Bcast`]: one `MPI_Ibcast` per reader; [`Algorithm::Ring`]: a
//!   pipelined ring of point-to-point messages, one chunk of every reader per round, see
//!   [`ring`]), and keeps polling every round in flight — several rounds move at once, bounded by
//!   the round buffers (allgather, bcast) or by the ring's rounds in flight and its block pool;
//! - two **writer** threads verify every received chunk against the manifest (pools) or the
//!   reader's hash from the header (plain files) and writes it sparse, then returns the buffer
//!   (a round buffer, or one block of the ring).
//!
//! So while round `r` moves, round `r + 1` and later are being read from storage, and round
//! `r − 1` and earlier are being verified and written: a node's link carries its storage reads
//! and its peers' data at the same time. Each byte is hashed once by its reader and once by each
//! receiver (never twice on one node).
//!
//! A failure anywhere (read, verify, write) sets the status in this leader's next header block; the
//! headers of a round reach every leader, so all leaders stop after the same round and the rounds
//! already in flight are completed on all of them — the leaders never take different branches.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender, TryRecvError};
use std::sync::Mutex;
use std::time::Instant;

mod allgather;
mod bcast;
mod chunk;
mod flight;
mod ring;
#[cfg(test)]
mod tests;
mod tree;

pub(crate) use chunk::local;
use chunk::{fetch_ahead, land, read_chunk, read_only_the_range};
pub(crate) use flight::plane_err;

use flight::{Backoff, Flight, Landed, Reqs};
use ring::{BlockPool, Ctx, Ring};

use super::plan::{self, Chunk, Slot, SlotHeader, BLOCK_LEN};
use super::{Algorithm, Stats};
use crate::plane::DataPlane;
use crate::pool::manifest::ZeroHashes;
use crate::watchdog::Watchdog;
use swpool_format::status::ExitStatus;

/// Piece size for reads and writes.
const PIECE: usize = 1 << 20;
/// Writer threads per leader: verifying (BLAKE3) and copying every received chunk on one core
/// runs at about 2.4 GB/s, below an NVMe drive; two keep up with one (the scale model's finding).
const WRITERS: usize = 2;
/// Granularity of hole detection when writing.
const SPARSE_BLOCK: usize = 64 << 10;

pub(crate) type LocalResult<T> = Result<T, (ExitStatus, String)>;

pub(super) fn io_err(what: &str, e: &std::io::Error) -> (ExitStatus, String) {
    let hint = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            "; free space on this node or choose another DEST"
        }
        Some(libc::EACCES) | Some(libc::EPERM) => "; check the permissions",
        Some(libc::EIO) => "; the storage reported an I/O error",
        _ => "",
    };
    (
        swpool_format::status::io_status(e),
        format!("{what}: {e}{hint}"),
    )
}

/// What the pipeline needs to know.
/// Where a copy's bytes come from: a file (`cp`, `load`), or the files of a layer one after the
/// other (`layer sync`, [`super::layer`]).
pub(crate) trait Source: Sync {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize>;
    /// A hint for the kernel's read-ahead (`posix_fadvise`); none by default.
    fn advise(&self, _off: u64, _len: u64, _advice: rustix::fs::Advice) {}
}

impl Source for File {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        FileExt::read_at(self, buf, off)
    }
    fn advise(&self, off: u64, len: u64, advice: rustix::fs::Advice) {
        let _ = rustix::fs::fadvise(self, off, len, advice);
    }
}

/// Where a copy's bytes go: the temporary file (`cp`, `load`), or the files of a layer's new
/// state (`layer sync`).
pub(crate) trait Sink: Sync {
    fn write_all_at(&self, buf: &[u8], off: u64) -> std::io::Result<()>;
    /// Start writing `off .. off + len` back (asynchronously; errors surface at the fsync).
    fn start_writeback(&self, _off: u64, _len: u64) {}
}

impl Sink for File {
    fn write_all_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        FileExt::write_all_at(self, buf, off)
    }
    fn start_writeback(&self, off: u64, len: u64) {
        // SAFETY: the fd is open for writing for the whole call; sync_file_range only starts
        // writeback of the given range and touches no memory of ours.
        unsafe {
            libc::sync_file_range(
                self.as_raw_fd(),
                off as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
    }
}

pub(crate) struct FileJob<'a> {
    /// SRC, open on a leader that reads chunks of it (`None` on a leader that only receives).
    pub src: Option<&'a dyn Source>,
    pub src_path: &'a std::path::Path,
    pub out: &'a dyn Sink,
    pub out_path: &'a std::path::Path,
    pub chunks: &'a [Chunk],
    pub chunk_size: u64,
    pub verify_source: bool,
    /// Hash and check chunks at all (false only under the benchmark switch
    /// `SW_POOL_BENCH_NO_VERIFY=1`, see [`super::bench_no_verify`]).
    pub verify: bool,
    /// Hostname per transfer rank (for messages).
    pub hosts: &'a [String],
    pub progress: &'a (dyn Fn(u64) + Sync),
    /// The benchmark switch `SW_POOL_BENCH_SLOTS` on this leader ([`super::CopyOptions`]).
    pub bench_slots: Option<u64>,
    /// The job's stall watchdog: touched whenever something moves.
    pub watch: &'a Watchdog,
}

/// The benchmark switch `SW_POOL_BENCH_SLOTS=K` (`job.bench_slots`): at most K chunks per round, so
/// that the testbed's few nodes show what rounds with fewer chunks than readers cost (the regime of
/// a round-buffer ring at many nodes). The smallest value among the leaders counts, so that all
/// plan the same rounds.
fn bench_slots_cap(plane: &dyn DataPlane, job: &FileJob, slots: usize) -> LocalResult<usize> {
    let mine = job.bench_slots.unwrap_or(u64::MAX);
    let all = plane.min_u64(mine).map_err(plane_err)?;
    Ok(slots.min(usize::try_from(all).unwrap_or(usize::MAX)).max(1))
}

/// A chunk read by the reader thread, with its send buffer.
type Read = (Vec<u8>, LocalResult<SlotHeader>);

/// What the writer threads share with the MPI thread.
#[derive(Default)]
struct Written {
    /// Bytes verified and written so far.
    done: AtomicU64,
    /// The first write or verification failure.
    err: Mutex<Option<(ExitStatus, String)>>,
    failed: AtomicBool,
}

/// The reader thread: reads the chunks `mine` (indices into `job.chunks`, in that order), each into
/// a buffer from `free` at `at` bytes in, and hands them over with their headers; stops after a
/// failure, or when `stop` is set.
#[allow(clippy::too_many_arguments)]
fn spawn_reader<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    job: &'scope FileJob<'scope>,
    mine: &'scope [usize],
    at: usize,
    free: Receiver<Vec<u8>>,
    ready: SyncSender<Read>,
    stop: &'scope AtomicBool,
    stats: &'scope mut Stats,
) {
    scope.spawn(move || {
        let mut zero = ZeroHashes::default();
        read_only_the_range(job);
        for (i, &ci) in mine.iter().enumerate() {
            let Ok(mut buf) = free.recv() else { return };
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if let Some(&next) = mine.get(i + 1) {
                fetch_ahead(job, &job.chunks[next]);
            }
            let h = read_chunk(job, &mut zero, stats, &job.chunks[ci], &mut buf[at..]);
            let failed = h.is_err();
            if ready.send((buf, h)).is_err() || failed {
                return;
            }
        }
    });
}

/// The writer threads (one per `stats`): verify (unless the chunk is this leader's own) and write
/// every chunk landed on `landed`, then give its buffer back on `back`. After a failure they only
/// give buffers back.
fn spawn_writers<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    job: &'scope FileJob<'scope>,
    me: usize,
    landed: Receiver<Landed>,
    back: &Sender<Vec<u8>>,
    stats: &'scope mut [Stats],
    w: &'scope Written,
) {
    let landed = std::sync::Arc::new(Mutex::new(landed));
    for wstats in stats.iter_mut() {
        let landed = landed.clone();
        let back = back.clone();
        scope.spawn(move || {
            let mut zero = ZeroHashes::default();
            loop {
                // one writer at a time waits for the next landing; verifying and writing it
                // happens outside the lock (pwrite at the chunk's offset)
                let Ok(l) = landed.lock().unwrap().recv() else {
                    return;
                };
                if !w.failed.load(Ordering::Relaxed) {
                    for &(ci, h, off, owner) in &l.slots {
                        let c = &job.chunks[ci];
                        let from = job.hosts.get(owner).map(String::as_str).unwrap_or("");
                        let data = &l.buf[off..off + h.sent as usize];
                        if let Err(e) = land(job, &mut zero, wstats, c, &h, data, owner == me, from)
                        {
                            w.err.lock().unwrap().get_or_insert(e);
                            w.failed.store(true, Ordering::Relaxed);
                            break;
                        }
                        w.done.fetch_add(c.len as u64, Ordering::Relaxed);
                    }
                }
                if back.send(l.buf).is_err() {
                    return;
                }
            }
        });
    }
}

/// After the threads: the first failure (this leader's, else its writers'), the last progress
/// report, and the threads' figures added to `stats`.
fn finish<'a>(
    job: &FileJob,
    stats: &mut Stats,
    err: Option<(ExitStatus, String)>,
    w: Written,
    threads: impl IntoIterator<Item = &'a Stats>,
    t_all: Instant,
) -> LocalResult<()> {
    let err = err.or_else(|| w.err.into_inner().unwrap());
    (job.progress)(w.done.load(Ordering::Relaxed));
    for s in threads {
        stats.bytes_read += s.bytes_read;
        stats.bytes_written += s.bytes_written;
        stats.read += s.read;
        stats.write += s.write;
        stats.verify += s.verify;
    }
    stats.pipeline = Some(t_all.elapsed());
    err.map_or(Ok(()), Err)
}

/// Distribute among the members of `plane` (every one of them needs the file).
pub(crate) fn distribute(
    plane: &dyn DataPlane,
    job: &FileJob,
    algo: Algorithm,
    stats: &mut Stats,
) -> LocalResult<()> {
    if algo == Algorithm::TwoTree {
        return tree::distribute(plane, job, stats);
    }
    let p = Plan::new(plane, job, algo)?;
    let t_all = Instant::now();
    tracing::debug!(
        nodes = p.n,
        slots = p.slots,
        rounds = p.rounds.len(),
        recv_bufs = p.recv_bufs,
        ?algo,
        "distribution plan"
    );
    let chunk = p.chunk;

    let stop = AtomicBool::new(false);
    let w = Written::default();
    let mut reader_stats = Stats::default();
    let mut writer_stats: Vec<Stats> = (0..WRITERS).map(|_| Stats::default()).collect();
    let mut err: Option<(ExitStatus, String)> = None;

    std::thread::scope(|scope| {
        // reader thread
        let (free_tx, free_rx) = channel::<Vec<u8>>();
        let (ready_tx, ready_rx) = sync_channel::<Read>(p.send_bufs);
        for _ in 0..p.send_bufs.min(p.mine.len()) {
            let _ = free_tx.send(vec![0u8; chunk]);
        }
        spawn_reader(
            scope,
            job,
            &p.mine,
            0,
            free_rx,
            ready_tx,
            &stop,
            &mut reader_stats,
        );
        // writer thread
        let (land_tx, land_rx) = channel::<Landed>();
        let (back_tx, back_rx) = channel::<Vec<u8>>();
        let pool = if p.ring {
            BlockPool::new(chunk, plan::ring_block_buffers(job.chunk_size), back_rx)
        } else {
            BlockPool::new(p.slots * chunk, p.recv_bufs, back_rx)
        };
        spawn_writers(scope, job, p.me, land_rx, &back_tx, &mut writer_stats, &w);
        drop(back_tx);

        // the main thread: the data plane only
        let mut d = Rounds {
            plane,
            job,
            algo,
            p: &p,
            w: &w,
            flights: VecDeque::new(),
            pool,
            bo: Backoff(0),
            reported: 0,
            ready_rx: Some(ready_rx),
            free_tx: Some(free_tx),
            land_tx: Some(land_tx),
            stopped: false,
            err: None,
        };
        let result = d.run(stats);
        // every leader completes the rounds it started (all of them started the same ones)
        let drained = d.drain();
        // let the threads finish: the writer drains what it has, the reader stops
        stop.store(true, Ordering::Relaxed);
        drop(d.free_tx.take());
        drop(d.ready_rx.take());
        drop(d.land_tx.take());
        let tw = Instant::now();
        while d.pool.back.recv().is_ok() {}
        stats.wait_dest += tw.elapsed();
        err = d.err.take();
        if let Err(e) = result.and(drained) {
            if err.is_none() {
                err = Some(e);
            }
        }
    });
    tracing::debug!(
        host = job.hosts.get(p.me).map(String::as_str),
        "distribution done"
    );
    finish(
        job,
        stats,
        err,
        w,
        std::iter::once(&reader_stats).chain(&writer_stats),
        t_all,
    )
}

/// How a file moves among the members of a plane: the chunks of each round and the buffers.
struct Plan {
    /// Members of the plane, and this leader's rank among them.
    n: usize,
    me: usize,
    ring: bool,
    /// Chunks per round.
    slots: usize,
    rounds: Vec<Vec<Slot>>,
    /// Rounds in flight at once (allgather, bcast: each with a round buffer of `slots` chunks).
    recv_bufs: usize,
    /// Chunks the reader thread runs ahead of the network.
    send_bufs: usize,
    chunk: usize,
    /// This leader's chunks (indices into the job's chunks), in round order.
    mine: Vec<usize>,
}

impl Plan {
    /// The plan for `job` on `plane` with `algo` (not the two trees). Collective: every member
    /// agrees on the benchmark's cap of chunks per round.
    fn new(plane: &dyn DataPlane, job: &FileJob, algo: Algorithm) -> LocalResult<Plan> {
        let n = plane.size();
        let me = plane.rank();
        let ring = algo == Algorithm::Ring;
        let slots = if ring {
            plan::ring_slots(n)
        } else {
            plan::slots_per_round(n, job.chunk_size)
        };
        let slots = bench_slots_cap(plane, job, slots)?;
        let rounds = plan::plan_rounds(job.chunks.len(), n, slots);
        // rounds in flight at once (allgather, bcast: each with a round buffer of `slots` chunks)
        let recv_bufs = if ring {
            plan::ring_rounds_in_flight(job.chunk_size)
        } else {
            plan::round_buffers(slots, job.chunk_size)
        };
        let send_bufs = plan::send_buffers(recv_bufs);
        let mine: Vec<usize> = rounds
            .iter()
            .filter_map(|r| r.iter().find(|s| s.owner == me).map(|s| s.chunk))
            .collect();
        Ok(Plan {
            n,
            me,
            ring,
            slots,
            rounds,
            recv_bufs,
            send_bufs,
            chunk: job.chunk_size as usize,
            mine,
        })
    }
}

/// Where owner `k`'s chunk sits in a round's buffer: its position in the round.
fn position(round: &[Slot], k: usize) -> Option<usize> {
    round.iter().position(|s| s.owner == k)
}

/// This leader's chunk of a round, as the round takes it.
struct OwnChunk {
    /// Its header (the default when this leader has no chunk in the round, or its read failed).
    hdr: SlotHeader,
    /// The send buffer (allgather).
    send: Option<Vec<u8>>,
    /// This leader's block (ring).
    own: Option<Vec<u8>>,
}

/// The main thread's side of a distribution, the only one that calls the data plane: the rounds
/// in flight, the channels to the reader and the writers, and this leader's first failure.
struct Rounds<'a> {
    plane: &'a dyn DataPlane,
    job: &'a FileJob<'a>,
    algo: Algorithm,
    p: &'a Plan,
    w: &'a Written,
    flights: VecDeque<Flight>,
    pool: BlockPool,
    bo: Backoff,
    /// The bytes last reported as progress.
    reported: u64,
    /// The reader's chunks; `None` once the threads are told to finish.
    ready_rx: Option<Receiver<Read>>,
    /// Send buffers back to the reader.
    free_tx: Option<Sender<Vec<u8>>>,
    /// Completed rounds to the writers.
    land_tx: Option<Sender<Landed>>,
    /// A round's headers named a failure: nothing more goes to the writers.
    stopped: bool,
    err: Option<(ExitStatus, String)>,
}

impl Rounds<'_> {
    /// Poll everything in flight; hand completed rounds (in order) to the writers. Whether a round
    /// completed.
    fn pump(&mut self) -> LocalResult<bool> {
        let mut moved = false;
        let mut ctx = Ctx {
            pool: &mut self.pool,
            land: self.land_tx.as_ref().filter(|_| !self.stopped),
        };
        for f in self.flights.iter_mut() {
            f.progress(self.plane, self.job.watch, &mut ctx)?;
        }
        while let Some(f) = self.flights.front_mut() {
            if !f.progress(self.plane, self.job.watch, &mut ctx)? {
                break;
            }
            let mut f = self.flights.pop_front().unwrap();
            moved = true;
            if let (Some(s), Some(tx)) = (f.send.take(), &self.free_tx) {
                let _ = tx.send(s);
            }
            if f.ring.is_some() {
                // its blocks went to the writer one by one
                continue;
            }
            let slots = self.p.rounds[f.round]
                .iter()
                .map(|s| {
                    let (_, h) = plan::decode_block(&f.hdr[s.owner * BLOCK_LEN..]);
                    (s.chunk, h, f.displs[s.owner] as usize, s.owner)
                })
                .collect();
            match (&self.land_tx, self.stopped) {
                (Some(tx), false) => {
                    let _ = tx.send(Landed { buf: f.buf, slots });
                }
                _ => ctx.pool.put(f.buf),
            }
        }
        Ok(moved)
    }

    /// [`Self::pump`], then back off when nothing completed.
    fn pump_or_wait(&mut self) -> LocalResult<()> {
        let moved = self.pump()?;
        self.bo.after(moved);
        Ok(())
    }

    /// Report the bytes verified and written so far, when they changed.
    fn report_progress(&mut self) {
        let done = self.w.done.load(Ordering::Relaxed);
        if done != self.reported {
            self.reported = done;
            (self.job.progress)(done);
        }
    }

    /// Every round of the plan in turn: a buffer, this leader's chunk, the header exchange, the
    /// data started. Stops after a round whose headers name a failure on some leader.
    fn run(&mut self, stats: &mut Stats) -> LocalResult<()> {
        let p = self.p;
        for (r, round) in p.rounds.iter().enumerate() {
            let mut buf = self.round_buffer(stats)?;
            let OwnChunk { hdr, send, mut own } = self.own_chunk(round, &mut buf, stats)?;
            if self.w.failed.load(Ordering::Relaxed) && self.err.is_none() {
                self.err = self.w.err.lock().unwrap().take();
            }
            let mut f = self.exchange_headers(r, buf, send, &hdr)?;
            let failed = self.read_headers(&mut f, round);
            if !failed.is_empty() {
                if self.err.is_none() {
                    self.err = Some((
                        ExitStatus::Collective,
                        format!("stopped: failed on {}", failed.join(", ")),
                    ));
                }
                self.stopped = true;
                if let Some(b) = own.take() {
                    self.pool.put(b);
                }
                self.pool.put(std::mem::take(&mut f.buf));
                break;
            }
            self.start_data(&mut f, r, round, own.take())?;
            self.flights.push_back(f);
            self.pump()?;
            self.report_progress();
        }
        Ok(())
    }

    /// A round buffer (the ring: a place among the rounds in flight); while every one of them is
    /// with the writer, the MPI thread waits for verify + write (while some are in flight, for the
    /// network).
    fn round_buffer(&mut self, stats: &mut Stats) -> LocalResult<Vec<u8>> {
        loop {
            if self.p.ring && self.flights.len() < self.p.recv_bufs {
                return Ok(Vec::new());
            }
            let tw = Instant::now();
            let behind = self.flights.is_empty();
            if !self.p.ring {
                if let Some(b) = self.pool.get() {
                    return Ok(b);
                }
            }
            self.pump_or_wait()?;
            if behind {
                stats.wait_dest += tw.elapsed();
            }
        }
    }

    /// This leader's chunk of `round`, from the reader: placed into the round buffer `buf`
    /// (bcast), or kept as the send buffer (allgather) or as this leader's block (ring). A failure
    /// of the reader is recorded.
    fn own_chunk(
        &mut self,
        round: &[Slot],
        buf: &mut [u8],
        stats: &mut Stats,
    ) -> LocalResult<OwnChunk> {
        let mut hdr = SlotHeader::default();
        let mut send = None;
        let mut own = None;
        let Some(p) = position(round, self.p.me) else {
            return Ok(OwnChunk { hdr, send, own });
        };
        let tr = Instant::now();
        let got = loop {
            match self.ready_rx.as_ref().map(|r| r.try_recv()) {
                Some(Ok(x)) => break Some(x),
                Some(Err(TryRecvError::Empty)) => self.pump_or_wait()?,
                _ => break None,
            }
        };
        stats.wait_src += tr.elapsed();
        match got {
            Some((sbuf, Ok(h))) => {
                if self.algo == Algorithm::Allgather {
                    // MPI_Iallgatherv copies it into place
                    send = Some(sbuf);
                } else if self.p.ring {
                    // the reader's buffer becomes the round's block; the reader gets one of the
                    // pool's in exchange (no copy; memory stays bounded)
                    let back = if h.sent == 0 {
                        sbuf // all zeros: nothing to send
                    } else {
                        let spare = loop {
                            if let Some(b) = self.pool.get() {
                                break b;
                            }
                            self.pump_or_wait()?;
                        };
                        own = Some(sbuf);
                        spare
                    };
                    if let Some(tx) = &self.free_tx {
                        let _ = tx.send(back);
                    }
                } else {
                    let d = p * self.p.chunk;
                    buf[d..d + h.sent as usize].copy_from_slice(&sbuf[..h.sent as usize]);
                    if let Some(tx) = &self.free_tx {
                        let _ = tx.send(sbuf);
                    }
                }
                stats.bytes_sent += h.sent as u64;
                hdr = h;
            }
            Some((_, Err(e))) => {
                if self.err.is_none() {
                    self.err = Some(e);
                }
            }
            None => {
                if self.err.is_none() {
                    self.err = Some((ExitStatus::Internal, "the reader thread stopped".into()));
                }
            }
        }
        Ok(OwnChunk { hdr, send, own })
    }

    /// The header exchange of round `r`: this leader's status (whether it failed) and the header
    /// `hdr` of its chunk to every member, polled (moving the earlier rounds) until complete.
    /// Returns the round's flight, holding `buf` and `send`.
    fn exchange_headers(
        &mut self,
        r: usize,
        buf: Vec<u8>,
        send: Option<Vec<u8>>,
        hdr: &SlotHeader,
    ) -> LocalResult<Flight> {
        let n = self.p.n;
        let block = plan::encode_block(u64::from(self.err.is_some()), hdr);
        let mut f = Flight {
            round: r,
            buf,
            send,
            hdr: vec![0u8; BLOCK_LEN * n],
            counts: vec![0; n],
            displs: vec![0; n],
            reqs: Reqs::new(),
            ring: None,
        };
        // SAFETY: `block` lives until the loop below completed the request; `f.hdr` holds
        // BLOCK_LEN bytes per member and belongs to the flight `f`, not moved or dropped
        // before then.
        let posted = unsafe {
            self.plane
                .iallgather(block.as_ptr(), BLOCK_LEN, f.hdr.as_mut_ptr())
        };
        f.reqs.add(posted)?;
        {
            let _p = self.job.watch.phase("distribution");
            while !f.reqs.poll(self.plane, self.job.watch)? {
                self.pump_or_wait()?;
            }
        }
        Ok(f)
    }

    /// The exchanged headers of `round` read into `f`: each member's length and place in the round
    /// buffer. Returns the hosts whose status says they failed.
    fn read_headers(&self, f: &mut Flight, round: &[Slot]) -> Vec<String> {
        let mut failed = Vec::new();
        for k in 0..self.p.n {
            let (status, h) = plan::decode_block(&f.hdr[k * BLOCK_LEN..]);
            if status != 0 {
                failed.push(self.job.hosts.get(k).cloned().unwrap_or_default());
            }
            f.counts[k] = h.sent as i32;
            f.displs[k] = (position(round, k).unwrap_or(0) * self.p.chunk) as i32;
        }
        failed
    }

    /// Start moving the data of round `r` (`f`, its headers read) by the algorithm; the ring
    /// sends this leader's block `own`.
    fn start_data(
        &mut self,
        f: &mut Flight,
        r: usize,
        round: &[Slot],
        own: Option<Vec<u8>>,
    ) -> LocalResult<()> {
        match self.algo {
            Algorithm::Allgather => allgather::start(f, self.plane)?,
            Algorithm::Bcast => bcast::start(f, self.plane)?,
            Algorithm::TwoTree => unreachable!("the two trees have their own loop"),
            Algorithm::Ring => {
                let mut blocks = vec![None; self.p.n];
                for s in round {
                    let (_, h) = plan::decode_block(&f.hdr[s.owner * BLOCK_LEN..]);
                    blocks[s.owner] = Some((s.chunk, h));
                }
                let mut ctx = Ctx {
                    pool: &mut self.pool,
                    land: self.land_tx.as_ref(),
                };
                f.ring = Some(Ring::start(
                    (r % 30000) as i32,
                    self.plane,
                    blocks,
                    own,
                    &mut ctx,
                ));
            }
        }
        Ok(())
    }

    /// Complete every round in flight, reporting progress.
    fn drain(&mut self) -> LocalResult<()> {
        let _p = self.job.watch.phase("distribution");
        while !self.flights.is_empty() {
            if !self.pump()? {
                self.bo.snooze();
            }
            self.report_progress();
        }
        Ok(())
    }
}
