//! The file pipeline: split reading, double-buffered non-blocking distribution among the leaders
//! that need the file, verification of every chunk as it lands, sparse `pwrite` into the temporary.
//!
//! Round `r` (see [`plan::plan_rounds`]): every reader with a chunk in the round reads it, hashes it,
//! checks it for zeros, and all leaders exchange a small header block (status + length + zero flag
//! and SHA-256) with `MPI_Iallgather`; then the data moves, either with one `MPI_Iallgatherv` per round
//! ([`Algorithm::Allgather`]) or with one `MPI_Ibcast` per reader ([`Algorithm::Bcast`]). Two rounds
//! are in flight: while round `r` moves, round `r + 1` is read; while round `r + 1` moves, round `r`
//! is verified and written. A failure anywhere sets the status in the next header block, and every
//! leader stops after that round, so the leaders never take different branches.

use std::fs::File;
use std::os::raw::c_void;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::plan::{self, Chunk, SlotHeader, BLOCK_LEN};
use super::watchdog;
use super::{Algorithm, Stats};
use crate::error::ExitStatus;
use crate::pool::manifest::ZeroHashes;

/// Piece size for reads, hashing and writes between two MPI progress polls.
const PIECE: usize = 1 << 20;
/// Granularity of hole detection when writing.
const SPARSE_BLOCK: usize = 64 << 10;

pub(crate) type LocalResult<T> = Result<T, (ExitStatus, String)>;

fn io_err(what: &str, e: &std::io::Error) -> (ExitStatus, String) {
    let hint = match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => {
            "; free space on this node or choose another DEST"
        }
        Some(libc::EACCES) | Some(libc::EPERM) => "; check the permissions",
        Some(libc::EIO) => "; the storage reported an I/O error",
        _ => "",
    };
    (crate::error::io_status(e), format!("{what}: {e}{hint}"))
}

/// Pending non-blocking MPI requests.
struct Reqs(Vec<ffi::MPI_Request>);

impl Reqs {
    fn new() -> Reqs {
        Reqs(Vec::new())
    }
    fn push(&mut self) -> *mut ffi::MPI_Request {
        self.0.push(unsafe { ffi::RSMPI_REQUEST_NULL });
        self.0.last_mut().unwrap() as *mut _
    }
    /// Test every request once; true when none is pending.
    fn poll(&mut self) -> bool {
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut pending = false;
        for r in &mut self.0 {
            if *r == null {
                continue;
            }
            let mut flag = 0;
            unsafe { ffi::MPI_Test(r, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if flag != 0 {
                watchdog::touch();
            } else {
                pending = true;
            }
        }
        if !pending {
            self.0.clear();
        }
        !pending
    }
    fn wait(&mut self) {
        let mut spins = 0u32;
        while !self.poll() {
            spins += 1;
            if spins < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}

fn check(rc: i32, what: &str) -> LocalResult<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err((
            ExitStatus::Internal,
            format!("{what} failed with MPI error {rc}"),
        ))
    }
}

/// One round's buffers.
struct RoundBuf {
    send: Vec<u8>,
    recv: Vec<u8>,
    hdr_send: [u8; BLOCK_LEN],
    hdr_recv: Vec<u8>,
    counts: Vec<i32>,
    displs: Vec<i32>,
    reqs: Reqs,
    /// This leader's chunk in the round, with its header.
    mine: Option<(usize, SlotHeader)>,
}

/// What the pipeline needs to know.
pub(crate) struct FileJob<'a> {
    pub src: &'a File,
    pub src_path: &'a std::path::Path,
    pub out: &'a File,
    pub out_path: &'a std::path::Path,
    pub chunks: &'a [Chunk],
    pub chunk_size: u64,
    pub verify_source: bool,
    /// Hostname per transfer rank (for messages).
    pub hosts: &'a [String],
    pub progress: &'a dyn Fn(u64),
}

struct Ctx<'a> {
    job: &'a FileJob<'a>,
    stats: &'a mut Stats,
    zero: ZeroHashes,
    /// The first local failure; reported in the next header and at the end.
    err: Option<(ExitStatus, String)>,
    done: u64,
}

impl Ctx<'_> {
    fn me(&self, comm: Option<&SimpleCommunicator>) -> String {
        let k = comm.map_or(0, |c| c.rank() as usize);
        self.job.hosts.get(k).cloned().unwrap_or_default()
    }

    /// Read chunk `c` into `buf`, polling `other` between pieces; returns its header.
    fn read_chunk(
        &mut self,
        c: &Chunk,
        buf: &mut [u8],
        other: &mut Reqs,
    ) -> LocalResult<SlotHeader> {
        let t = Instant::now();
        let len = c.len as usize;
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(PIECE);
            let off = c.offset + done as u64;
            match self.job.src.read_at(&mut buf[done..done + n], off) {
                Ok(0) => {
                    return Err((
                        ExitStatus::BadInput,
                        format!(
                            "{} shrank while being copied (nothing at offset {off}); do not modify SRC during a copy",
                            self.job.src_path.display()
                        ),
                    ))
                }
                Ok(k) => done += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(io_err(
                        &format!("cannot read {} at offset {off}", self.job.src_path.display()),
                        &e,
                    ))
                }
            }
            watchdog::touch();
            other.poll();
        }
        self.stats.bytes_read += len as u64;
        self.stats.read += t.elapsed();
        let data = &buf[..len];
        let zero = crate::sparse::is_all_zero(data);
        let tv = Instant::now();
        let hash = if zero {
            if c.expect.is_some() {
                self.zero.get(len as u64)
            } else {
                [0u8; 32]
            }
        } else {
            hash_polling(data, other)
        };
        self.stats.verify += tv.elapsed();
        if self.job.verify_source {
            if let Some(e) = c.expect {
                if e != hash {
                    return Err((
                        ExitStatus::InvalidPool,
                        format!(
                            "{} is damaged: the chunk at offset {} does not match its manifest hash; \
                             rebuild the pool or restore it",
                            self.job.src_path.display(),
                            c.offset
                        ),
                    ));
                }
            }
        }
        Ok(SlotHeader {
            sent: if zero { 0 } else { c.len },
            zero,
            hash,
        })
    }

    /// Verify (unless `own`) and write one chunk's received bytes.
    fn land(
        &mut self,
        c: &Chunk,
        h: &SlotHeader,
        data: &[u8],
        own: bool,
        from: &str,
        other: &mut Reqs,
    ) -> LocalResult<()> {
        let tv = Instant::now();
        if h.zero {
            if let Some(e) = c.expect {
                if self.zero.get(c.len as u64) != e {
                    return Err((
                        ExitStatus::InvalidPool,
                        format!(
                            "the chunk at offset {} read by {from} is all zeros but the manifest says it holds data: \
                             SRC {} is damaged",
                            c.offset,
                            self.job.src_path.display()
                        ),
                    ));
                }
            }
            self.done += c.len as u64;
            return Ok(());
        }
        if data.len() != c.len as usize {
            return Err((
                ExitStatus::Internal,
                format!(
                    "the chunk at offset {} from {from} has {} bytes, expected {}",
                    c.offset,
                    data.len(),
                    c.len
                ),
            ));
        }
        if !own {
            let got = hash_polling(data, other);
            let want = c.expect.unwrap_or(h.hash);
            if got != want || (c.expect.is_some() && h.hash != want) {
                return Err((
                    ExitStatus::System,
                    format!(
                        "verification failed for the chunk at offset {} (sent by {from}): its SHA-256 \
                         does not match the {}; the data was damaged in transit or in memory",
                        c.offset,
                        if c.expect.is_some() { "pool manifest" } else { "reader's hash" }
                    ),
                ));
            }
        }
        self.stats.verify += tv.elapsed();
        let tw = Instant::now();
        // write runs of non-zero blocks; all-zero blocks stay holes (the file was sized up front)
        let mut pos = 0usize;
        while pos < data.len() {
            let blk = |p: usize| &data[p..(p + SPARSE_BLOCK).min(data.len())];
            if crate::sparse::is_all_zero(blk(pos)) {
                pos += blk(pos).len();
                continue;
            }
            let mut end = pos;
            while end < data.len() && end - pos < PIECE && !crate::sparse::is_all_zero(blk(end)) {
                end += blk(end).len();
            }
            let off = c.offset + pos as u64;
            self.job
                .out
                .write_all_at(&data[pos..end], off)
                .map_err(|e| {
                    io_err(
                        &format!(
                            "cannot write {} at offset {off}",
                            self.job.out_path.display()
                        ),
                        &e,
                    )
                })?;
            self.stats.bytes_written += (end - pos) as u64;
            pos = end;
            watchdog::touch();
            other.poll();
        }
        self.stats.write += tw.elapsed();
        self.done += c.len as u64;
        (self.job.progress)(self.done);
        Ok(())
    }
}

/// The chunk hash of the manifest (BLAKE3), computed in pieces so that pending requests keep moving.
fn hash_polling(data: &[u8], other: &mut Reqs) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    for p in data.chunks(PIECE) {
        h.update(p);
        other.poll();
    }
    *h.finalize().as_bytes()
}

/// Copy on one node: read every chunk, verify it against the manifest (pools), write it sparse.
pub(crate) fn local(job: &FileJob, stats: &mut Stats) -> LocalResult<()> {
    let mut ctx = Ctx {
        job,
        stats,
        zero: ZeroHashes::default(),
        err: None,
        done: 0,
    };
    let mut buf = vec![0u8; job.chunk_size as usize];
    let mut none = Reqs::new();
    for c in job.chunks {
        let h = ctx.read_chunk(c, &mut buf, &mut none)?;
        // our own bytes: verified at read (pools), nothing travelled
        ctx.land(c, &h, &buf[..h.sent as usize], true, "", &mut none)?;
    }
    Ok(())
}

/// Distribute among the leaders of `comm` (every one of them needs the file).
pub(crate) fn distribute(
    comm: &SimpleCommunicator,
    job: &FileJob,
    algo: Algorithm,
    stats: &mut Stats,
) -> LocalResult<()> {
    let n = comm.size() as usize;
    let me = comm.rank() as usize;
    let slots = plan::slots_per_round(n, job.chunk_size);
    let rounds = plan::plan_rounds(job.chunks.len(), n, slots);
    let round_bytes =
        |r: &Vec<plan::Slot>| -> usize { r.iter().map(|s| job.chunks[s.chunk].len as usize).sum() };
    let max_round = rounds.iter().map(round_bytes).max().unwrap_or(0);
    let mk = || RoundBuf {
        send: vec![0u8; job.chunk_size as usize],
        recv: vec![0u8; max_round],
        hdr_send: [0u8; BLOCK_LEN],
        hdr_recv: vec![0u8; BLOCK_LEN * n],
        counts: vec![0; n],
        displs: vec![0; n],
        reqs: Reqs::new(),
        mine: None,
    };
    let mut bufs = [mk(), mk()];
    let mut ctx = Ctx {
        job,
        stats,
        zero: ZeroHashes::default(),
        err: None,
        done: 0,
    };
    let host = ctx.me(Some(comm));
    tracing::debug!(
        nodes = n,
        slots,
        rounds = rounds.len(),
        ?algo,
        "distribution plan"
    );
    let u8t = unsafe { ffi::RSMPI_UINT8_T };

    // read my chunk of round r (polling the other buffer) and start the header exchange
    let prepare =
        |ctx: &mut Ctx, r: usize, b: &mut RoundBuf, other: &mut Reqs| -> LocalResult<()> {
            b.mine = None;
            let mut hdr = SlotHeader::default();
            if ctx.err.is_none() {
                if let Some(s) = rounds[r].iter().find(|s| s.owner == me) {
                    let c = &job.chunks[s.chunk];
                    match ctx.read_chunk(c, &mut b.send, other) {
                        Ok(h) => {
                            ctx.stats.bytes_sent += h.sent as u64;
                            hdr = h;
                            b.mine = Some((s.chunk, h));
                        }
                        Err(e) => ctx.err = Some(e),
                    }
                }
            }
            b.hdr_send = plan::encode_block(u64::from(ctx.err.is_some()), &hdr);
            let req = b.reqs.push();
            check(
                unsafe {
                    ffi::MPI_Iallgather(
                        b.hdr_send.as_ptr() as *const c_void,
                        BLOCK_LEN as i32,
                        u8t,
                        b.hdr_recv.as_mut_ptr() as *mut c_void,
                        BLOCK_LEN as i32,
                        u8t,
                        comm.as_raw(),
                        req,
                    )
                },
                "MPI_Iallgather",
            )
        };
    // wait for round r's headers; unless someone failed, start its data movement
    let start = |ctx: &mut Ctx, b: &mut RoundBuf| -> LocalResult<bool> {
        b.reqs.wait();
        let mut failed = Vec::new();
        let mut off = 0i32;
        for k in 0..n {
            let (status, h) = plan::decode_block(&b.hdr_recv[k * BLOCK_LEN..]);
            if status != 0 {
                failed.push(job.hosts.get(k).cloned().unwrap_or_default());
            }
            b.counts[k] = h.sent as i32;
            b.displs[k] = off;
            off += h.sent as i32;
        }
        if !failed.is_empty() {
            if ctx.err.is_none() {
                ctx.err = Some((
                    ExitStatus::Collective,
                    format!("stopped: failed on {}", failed.join(", ")),
                ));
            }
            return Ok(false);
        }
        match algo {
            Algorithm::Allgather => {
                let req = b.reqs.push();
                check(
                    unsafe {
                        ffi::MPI_Iallgatherv(
                            b.send.as_ptr() as *const c_void,
                            b.counts[me],
                            u8t,
                            b.recv.as_mut_ptr() as *mut c_void,
                            b.counts.as_ptr(),
                            b.displs.as_ptr(),
                            u8t,
                            comm.as_raw(),
                            req,
                        )
                    },
                    "MPI_Iallgatherv",
                )?;
            }
            Algorithm::Bcast => {
                let mine = b.counts[me] as usize;
                let d = b.displs[me] as usize;
                b.recv[d..d + mine].copy_from_slice(&b.send[..mine]);
                for k in 0..n {
                    if b.counts[k] == 0 {
                        continue;
                    }
                    let req = b.reqs.push();
                    check(
                        unsafe {
                            ffi::MPI_Ibcast(
                                b.recv.as_mut_ptr().add(b.displs[k] as usize) as *mut c_void,
                                b.counts[k],
                                u8t,
                                k as i32,
                                comm.as_raw(),
                                req,
                            )
                        },
                        "MPI_Ibcast",
                    )?;
                }
            }
        }
        Ok(true)
    };
    // verify and write round r (polling the other buffer)
    let finish = |ctx: &mut Ctx, r: usize, b: &mut RoundBuf, other: &mut Reqs| {
        if ctx.err.is_some() {
            return;
        }
        for s in &rounds[r] {
            let c = &job.chunks[s.chunk];
            let (_, h) = plan::decode_block(&b.hdr_recv[s.owner * BLOCK_LEN..]);
            let d = b.displs[s.owner] as usize;
            let from = job.hosts.get(s.owner).cloned().unwrap_or_default();
            let own = s.owner == me;
            let data = &b.recv[d..d + b.counts[s.owner] as usize];
            if let Err(e) = ctx.land(c, &h, data, own, &from, other) {
                ctx.err = Some(e);
                return;
            }
        }
    };

    if !rounds.is_empty() {
        let (a, rest) = bufs.split_at_mut(1);
        let (b0, b1) = (&mut a[0], &mut rest[0]);
        prepare(&mut ctx, 0, b0, &mut b1.reqs)?;
        let mut go = start(&mut ctx, b0)?;
        let mut r = 0usize;
        while go {
            let (cur, next) = if r & 1 == 0 {
                (&mut *b0, &mut *b1)
            } else {
                (&mut *b1, &mut *b0)
            };
            let more = r + 1 < rounds.len();
            if more {
                prepare(&mut ctx, r + 1, next, &mut cur.reqs)?;
            }
            {
                let _p = watchdog::phase("distribution");
                cur.reqs.wait();
            }
            if more {
                go = start(&mut ctx, next)?;
                if !go {
                    break;
                }
            } else {
                go = false;
            }
            finish(&mut ctx, r, cur, &mut next.reqs);
            r += 1;
        }
        b0.reqs.wait();
        b1.reqs.wait();
    }
    tracing::debug!(host, "distribution done");
    match ctx.err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
