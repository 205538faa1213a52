//! Two binary trees from one reader ([`super::super::Algorithm::TwoTree`]): transfer rank 0 alone
//! reads SRC and sends chunk `c` down tree `c % 2` ([`plan::tree_children`]); every other rank
//! receives each chunk from its parent in that chunk's tree, forwards it to its (at most two)
//! children and hands it to the writers. A chunk reaches every leader in ⌈log2 N⌉ + 1 hops instead
//! of the ring's N − 1, and shared storage sees one reader whatever the job's size — which is what
//! a small pool on many nodes needs (the ring's fill, N − 1 hops of a chunk, dominates there).
//!
//! Every message is one chunk: its header block (status, length, zero flag, hash: the reader's
//! [`SlotHeader`]) followed by its bytes. Each rank keeps up to [`WINDOW`] receives posted per tree
//! (messages between two ranks on one tag arrive in order), forwards a chunk as soon as it has
//! arrived, and gives the buffer to the writers once forwarded. Buffers come from a pool bounded
//! by [`plan::ROUND_MEMORY_BUDGET`].
//!
//! A read failure on rank 0 travels as a header with a non-zero status down the failing chunk's
//! tree: every rank then finishes the chunks before it (they were sent), cancels the receives it
//! posted for later ones (never sent) and fails. A failure to verify or write on any rank does not
//! stop the forwarding (the rank's children need the chunks); the rank fails at the end, and the
//! leaders' agreement before the commit fails the copy on every node alike.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, TryRecvError};
use std::time::Instant;

use super::flight::{Backoff, Landed, Reqs};
use super::ring::BlockPool;
use super::{finish, spawn_reader, spawn_writers, FileJob, LocalResult, Read, Written, WRITERS};
use crate::plane::DataPlane;
use crate::transfer::plan::{self, SlotHeader, BLOCK_LEN};
use crate::transfer::Stats;
use swpool_format::status::ExitStatus;

/// Receives a rank keeps posted per tree (and chunks rank 0 keeps in flight per tree).
const WINDOW: usize = 4;
/// The trees' MPI tags (nothing else moves on the transfer communicator meanwhile).
const TAGS: [i32; 2] = [31001, 31002];

/// A chunk on this rank while its messages move.
struct Entry {
    chunk: usize,
    buf: Vec<u8>,
    reqs: Reqs,
    /// Its receive completed (or rank 0 read it) and its sends are under way.
    sending: bool,
    /// Its receive was cancelled (a chunk after a failed one, never sent).
    cancelled: bool,
    header: Option<(u64, SlotHeader)>,
}

/// Distribute the file among the leaders of `comm` down two trees from rank 0.
pub(crate) fn distribute(
    plane: &dyn DataPlane,
    job: &FileJob,
    stats: &mut Stats,
) -> LocalResult<()> {
    let n = plane.size();
    let me = plane.rank();
    let count = job.chunks.len();
    let size = job.chunk_size as usize + BLOCK_LEN;
    // send buffers of the reader, receives and sends in flight, the writers' queue: the budget
    let cap = ((plan::ROUND_MEMORY_BUDGET / job.chunk_size.max(1)) as usize).max(4 * WINDOW + 4);
    let send_bufs = plan::send_buffers(WINDOW);
    let parents = [plan::tree_parent(n, 0, me), plan::tree_parent(n, 1, me)];
    let children = [plan::tree_children(n, 0, me), plan::tree_children(n, 1, me)];
    let reader_host = job.hosts.first().map(String::as_str).unwrap_or("");
    tracing::debug!(
        nodes = n,
        chunks = count,
        ?parents,
        ?children,
        "two-tree plan"
    );
    let t_all = Instant::now();

    let w = Written::default();
    let stop = AtomicBool::new(false);
    let mut reader_stats = Stats::default();
    let mut writer_stats: Vec<Stats> = (0..WRITERS).map(|_| Stats::default()).collect();
    let mut err: Option<(ExitStatus, String)> = None;
    // rank 0 reads every chunk, in order
    let all: Vec<usize> = if me == 0 {
        (0..count).collect()
    } else {
        Vec::new()
    };

    std::thread::scope(|scope| {
        // rank 0: the reader thread reads every chunk in order, behind the header block
        let (free_tx, free_rx) = channel::<Vec<u8>>();
        let (ready_tx, ready_rx) = sync_channel::<Read>(send_bufs);
        spawn_reader(
            scope,
            job,
            &all,
            BLOCK_LEN,
            free_rx,
            ready_tx,
            &stop,
            &mut reader_stats,
        );
        // the writers
        let (land_tx, land_rx) = channel::<Landed>();
        let (back_tx, back_rx) = channel::<Vec<u8>>();
        spawn_writers(scope, job, me, land_rx, &back_tx, &mut writer_stats, &w);
        drop(back_tx);
        let mut pool = BlockPool::new(size, cap, back_rx);
        let mut m = Mover {
            plane,
            job,
            count,
            size,
            parents,
            children: &children,
            queues: [VecDeque::new(), VecDeque::new()],
            next: [0, 1],
            end: count,
            bo: Backoff(0),
            reported: 0,
            written: &w.done,
            land_tx: Some(land_tx),
            err: None,
            reader_host,
        };
        let result = if me == 0 {
            m.root(&mut pool, &free_tx, &ready_rx, stats)
        } else {
            m.forwarder(&mut pool, stats)
        };
        // every posted receive and every send completes (or is cancelled) before the buffers go
        let drained = m.drain(&mut pool);
        stop.store(true, Ordering::Relaxed);
        drop(free_tx);
        drop(ready_rx);
        drop(m.land_tx.take());
        let tw = Instant::now();
        while pool.back.recv().is_ok() {}
        stats.wait_dest += tw.elapsed();
        err = m.err.take();
        if let Err(e) = result.and(drained) {
            err.get_or_insert(e);
        }
    });
    finish(
        job,
        stats,
        err,
        w,
        std::iter::once(&reader_stats).chain(&writer_stats),
        t_all,
    )
}

/// The MPI thread's state.
struct Mover<'a, 'j> {
    plane: &'a dyn DataPlane,
    job: &'a FileJob<'j>,
    count: usize,
    /// Bytes of a message buffer (header block + one chunk).
    size: usize,
    parents: [Option<usize>; 2],
    children: &'a [Vec<usize>; 2],
    /// Per tree, the chunks on this rank in chunk order.
    queues: [VecDeque<Entry>; 2],
    /// Per tree, the next chunk to receive (or, on rank 0, `next[0]` is the next chunk to send).
    next: [usize; 2],
    /// Chunks at or beyond this index are not sent (a failed read stops the copy there).
    end: usize,
    bo: Backoff,
    reported: u64,
    written: &'a AtomicU64,
    land_tx: Option<Sender<Landed>>,
    /// This rank's failure (the first).
    err: Option<(ExitStatus, String)>,
    reader_host: &'a str,
}

impl Mover<'_, '_> {
    /// Start sending `e` (whose header block is filled) to this rank's children in its tree.
    fn forward(&self, e: &mut Entry, tree: usize, sent: usize) -> LocalResult<()> {
        let len = BLOCK_LEN + sent;
        for &child in &self.children[tree] {
            // SAFETY: `e.buf` holds at least `len` bytes (checked by the callers); the entry stays
            // in its queue, its buffer neither written, moved out nor dropped, until `e.reqs`
            // completes.
            let posted = unsafe { self.plane.isend(e.buf.as_ptr(), len, child, TAGS[tree]) };
            e.reqs.add(posted)?;
        }
        e.sending = true;
        Ok(())
    }

    /// Poll every entry; hand the ones whose sends completed to the writers (in any order); start
    /// forwarding the ones whose receive completed. True when something moved.
    fn pump(&mut self, pool: &mut BlockPool) -> LocalResult<bool> {
        let mut moved = false;
        for tree in 0..2 {
            let mut i = 0;
            // chunks are forwarded in the order they were received: the child's receives match
            // this rank's messages in order, and a message names no chunk. So once a receive is
            // still pending, the later ones of the tree wait (tested, a later receive can complete
            // before an earlier one: MPI progresses all of them).
            let mut waiting = false;
            while i < self.queues[tree].len() {
                let e = &mut self.queues[tree][i];
                let receiving = !e.sending && !e.cancelled;
                if receiving && waiting {
                    i += 1;
                    continue;
                }
                if !e.reqs.poll(self.plane, self.job.watch)? {
                    waiting |= receiving;
                    i += 1;
                    continue;
                }
                moved = true;
                if e.cancelled {
                    let e = self.queues[tree].remove(i).unwrap();
                    pool.put(e.buf);
                    continue;
                }
                if !e.sending {
                    // received: its header says what follows
                    let (status, h) = plan::decode_block(&e.buf[..BLOCK_LEN]);
                    let sent = h.sent as usize;
                    let c = &self.job.chunks[e.chunk];
                    if status == 0 && (sent > c.len as usize || BLOCK_LEN + sent > e.buf.len()) {
                        return Err((
                            ExitStatus::Internal,
                            format!(
                                "the chunk at offset {} arrived with {sent} bytes, at most {} expected",
                                c.offset, c.len
                            ),
                        ));
                    }
                    e.header = Some((status, h));
                    let chunk = e.chunk;
                    let mut e = self.queues[tree].remove(i).unwrap();
                    self.forward(&mut e, tree, if status == 0 { sent } else { 0 })?;
                    self.queues[tree].insert(i, e);
                    if status != 0 {
                        self.stop_at(chunk);
                    }
                    continue;
                }
                // forwarded: to the writers (a failed chunk's buffer goes back to the pool)
                let e = self.queues[tree].remove(i).unwrap();
                match (e.header, &self.land_tx) {
                    (Some((0, h)), Some(tx)) if e.chunk < self.end => {
                        // read by rank 0 (the writers verify it unless they are rank 0's)
                        let _ = tx.send(Landed {
                            buf: e.buf,
                            slots: vec![(e.chunk, h, BLOCK_LEN, 0)],
                        });
                    }
                    _ => pool.put(e.buf),
                }
            }
        }
        let done = self.written.load(Ordering::Relaxed);
        if done != self.reported {
            self.reported = done;
            (self.job.progress)(done);
        }
        Ok(moved)
    }

    /// A failed read at chunk `c`: nothing at or beyond it is sent, so the receives posted for
    /// later chunks are cancelled.
    fn stop_at(&mut self, c: usize) {
        if c >= self.end {
            return;
        }
        self.end = c;
        self.err.get_or_insert_with(|| {
            (
                ExitStatus::Collective,
                format!("stopped: failed on {}", self.reader_host),
            )
        });
        for q in &mut self.queues {
            for e in q.iter_mut().filter(|e| e.chunk > c && !e.sending) {
                e.reqs.cancel(self.plane);
                e.cancelled = true;
            }
        }
    }

    /// Rank 0: send every chunk the reader hands over down its tree.
    fn root(
        &mut self,
        pool: &mut BlockPool,
        free_tx: &Sender<Vec<u8>>,
        ready_rx: &Receiver<Read>,
        stats: &mut Stats,
    ) -> LocalResult<()> {
        let _p = self.job.watch.phase("distribution");
        // the reader's send buffers
        let mut owed = plan::send_buffers(WINDOW).min(self.count);
        let mut c = 0usize;
        while c < self.end {
            let tree = c % 2;
            // room in the tree's window, and buffers for the reader
            while owed > 0 {
                match pool.get() {
                    Some(b) => {
                        let _ = free_tx.send(b);
                        owed -= 1;
                    }
                    None => break,
                }
            }
            if self.queues[tree].len() >= WINDOW {
                let tw = Instant::now();
                let moved = self.pump(pool)?;
                self.bo.after(moved);
                stats.wait_dest += tw.elapsed();
                continue;
            }
            let tr = Instant::now();
            let got = loop {
                match ready_rx.try_recv() {
                    Ok(x) => break Some(x),
                    Err(TryRecvError::Empty) => {
                        let moved = self.pump(pool)?;
                        self.bo.after(moved);
                    }
                    Err(TryRecvError::Disconnected) => break None,
                }
            };
            stats.wait_src += tr.elapsed();
            if c + 1 < self.count {
                owed += 1;
            }
            let (mut buf, status, h) = match got {
                Some((buf, Ok(h))) => (buf, 0u64, h),
                Some((buf, Err(e))) => {
                    self.err.get_or_insert(e);
                    (buf, 1, SlotHeader::default())
                }
                None => {
                    self.err
                        .get_or_insert((ExitStatus::Internal, "the reader thread stopped".into()));
                    match pool.get() {
                        Some(b) => (b, 1, SlotHeader::default()),
                        None => (vec![0u8; self.size], 1, SlotHeader::default()),
                    }
                }
            };
            buf[..BLOCK_LEN].copy_from_slice(&plan::encode_block(status, &h));
            let mut e = Entry {
                chunk: c,
                buf,
                reqs: Reqs::new(),
                sending: false,
                cancelled: false,
                header: Some((status, h)),
            };
            let sent = if status == 0 { h.sent as usize } else { 0 };
            self.forward(&mut e, tree, sent)?;
            stats.bytes_sent += sent as u64;
            self.queues[tree].push_back(e);
            if status != 0 {
                // the failing chunk goes down its tree; nothing after it
                self.end = c;
                break;
            }
            c += 1;
            self.pump(pool)?;
        }
        Ok(())
    }

    /// Every other rank: keep receives posted, forward, write.
    fn forwarder(&mut self, pool: &mut BlockPool, stats: &mut Stats) -> LocalResult<()> {
        let _p = self.job.watch.phase("distribution");
        loop {
            // post receives for the next chunks of each tree
            for (tree, &tag) in TAGS.iter().enumerate() {
                let Some(parent) = self.parents[tree] else {
                    continue;
                };
                while self.queues[tree].len() < WINDOW && self.next[tree] < self.end.min(self.count)
                {
                    let Some(mut buf) = pool.get() else { break };
                    let mut reqs = Reqs::new();
                    // SAFETY: `buf` holds `self.size` bytes; it moves into an entry of the tree's
                    // queue, whose heap storage is neither read, moved out nor dropped until the
                    // receive completes or is cancelled (`drain`).
                    let posted =
                        unsafe { self.plane.irecv(buf.as_mut_ptr(), self.size, parent, tag) };
                    if let Err(e) = reqs.add(posted) {
                        pool.put(buf);
                        return Err(e);
                    }
                    self.queues[tree].push_back(Entry {
                        chunk: self.next[tree],
                        buf,
                        reqs,
                        sending: false,
                        cancelled: false,
                        header: None,
                    });
                    self.next[tree] += 2;
                }
            }
            let all_posted = (0..2).all(|t| self.next[t] >= self.end.min(self.count));
            let pending_recv = self.queues.iter().flatten().any(|e| !e.sending);
            if all_posted && !pending_recv {
                return Ok(());
            }
            let tw = Instant::now();
            let moved = self.pump(pool)?;
            if !moved && self.queues.iter().all(|q| q.is_empty()) {
                // every buffer is with the writers
                stats.wait_dest += tw.elapsed();
            }
            self.bo.after(moved);
        }
    }

    /// Complete every send and every receive (cancelled ones included) still in flight.
    fn drain(&mut self, pool: &mut BlockPool) -> LocalResult<()> {
        let _p = self.job.watch.phase("distribution");
        while self.queues.iter().any(|q| !q.is_empty()) {
            let moved = self.pump(pool)?;
            self.bo.after(moved);
        }
        Ok(())
    }
}
