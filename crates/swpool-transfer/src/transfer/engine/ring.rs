//! The pipelined ring ([`super::super::Algorithm::Ring`]): in step `s` of a round every leader sends
//! block `me − s` to its right neighbour and receives block `me − s − 1` from its left one; block
//! `k` is reader `k`'s chunk, and every reader has one in every round ([`plan::ring_slots`]). One
//! TCP stream per neighbour instead of one per peer; measured the fastest of the three on the
//! testbed.
//!
//! A leader holds two blocks of a round at a time: the one it sends (its own chunk in step 0, then
//! the block it received in the step before) and the one it receives. A block goes to the writer as
//! soon as it has been forwarded (the right neighbour's own block, which is not forwarded, as soon as
//! it arrived) and comes back to the [`BlockPool`] once verified and written. So a round's memory
//! does not grow with the number of nodes, and every round can carry one chunk of every reader:
//! every link carries a chunk in every step, at 1,024 nodes as at 2.

use std::sync::mpsc::{Receiver, Sender};

use super::flight::{Landed, Reqs};
use super::LocalResult;
use crate::plane::DataPlane;
use crate::transfer::plan::{self, SlotHeader};
use swpool_format::status::ExitStatus;

/// Buffers of one size, allocated on demand up to `cap`, given back by the writer.
pub(super) struct BlockPool {
    free: Vec<Vec<u8>>,
    allocated: usize,
    cap: usize,
    size: usize,
    /// Buffers the writer is done with.
    pub(super) back: Receiver<Vec<u8>>,
}

impl BlockPool {
    pub(super) fn new(size: usize, cap: usize, back: Receiver<Vec<u8>>) -> BlockPool {
        BlockPool {
            free: Vec::new(),
            allocated: 0,
            cap,
            size,
            back,
        }
    }
    /// A free buffer, or `None` while all `cap` of them are in use.
    pub(super) fn get(&mut self) -> Option<Vec<u8>> {
        while let Ok(b) = self.back.try_recv() {
            self.put(b);
        }
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        if self.allocated < self.cap {
            self.allocated += 1;
            return Some(vec![0u8; self.size]);
        }
        None
    }
    /// Give a buffer back (an empty one, of a block that carried no bytes, is dropped).
    pub(super) fn put(&mut self, b: Vec<u8>) {
        if b.len() == self.size {
            self.free.push(b);
        }
    }
}

/// What a ring needs from the MPI thread while it moves.
pub(super) struct Ctx<'a> {
    pub(super) pool: &'a mut BlockPool,
    /// The writer; `None` once the leaders stopped (blocks then go straight back to the pool).
    pub(super) land: Option<&'a Sender<Landed>>,
}

/// A block of a round on this leader: reader `owner`'s chunk.
struct Block {
    owner: usize,
    buf: Vec<u8>,
}

/// What [`Ring::advance`] did.
pub(super) enum Advance {
    /// A step's messages are on their way.
    Started,
    /// The next step needs a block buffer; the writer has them all.
    Waiting,
    /// The round's last step is done and every block of it went to the writer.
    Done,
}

/// State of a pipelined ring for one round.
pub(super) struct Ring {
    /// The next step to start (steps `0 ..= n − 2`).
    step: usize,
    tag: i32,
    me: usize,
    n: usize,
    /// Per reader: the chunk it contributes to this round and its header (`None`: nothing).
    blocks: Vec<Option<(usize, SlotHeader)>>,
    /// The block to send in the next step.
    next: Option<Block>,
    /// The current step's blocks while its messages move.
    sending: Option<Block>,
    receiving: Option<Block>,
}

impl Ring {
    /// A round whose headers every leader has: `own` is this leader's chunk (when it sends bytes).
    /// Blocks that carry no bytes (all-zero chunks) go to the writer at once.
    pub(super) fn start(
        tag: i32,
        plane: &dyn DataPlane,
        blocks: Vec<Option<(usize, SlotHeader)>>,
        own: Option<Vec<u8>>,
        ctx: &mut Ctx,
    ) -> Ring {
        let mut r = Ring {
            step: 0,
            tag,
            me: plane.rank(),
            n: plane.size(),
            blocks,
            next: None,
            sending: None,
            receiving: None,
        };
        for k in 0..r.blocks.len() {
            if matches!(r.blocks[k], Some((_, h)) if h.sent == 0) {
                r.land(
                    ctx,
                    Block {
                        owner: k,
                        buf: Vec::new(),
                    },
                );
            }
        }
        if let Some(buf) = own {
            r.next = Some(Block { owner: r.me, buf });
        }
        r
    }

    fn count(&self, k: usize) -> usize {
        self.blocks[k].map_or(0, |(_, h)| h.sent as usize)
    }

    fn land(&self, ctx: &mut Ctx, b: Block) {
        let Some((ci, h)) = self.blocks[b.owner] else {
            ctx.pool.put(b.buf);
            return;
        };
        match ctx.land {
            Some(tx) => {
                let _ = tx.send(Landed {
                    buf: b.buf,
                    slots: vec![(ci, h, 0, b.owner)],
                });
            }
            None => ctx.pool.put(b.buf),
        }
    }

    /// Call when the requests of the previous step (if any) completed: hand its blocks on and start
    /// the next step that moves bytes.
    pub(super) fn advance(
        &mut self,
        reqs: &mut Reqs,
        plane: &dyn DataPlane,
        ctx: &mut Ctx,
    ) -> LocalResult<Advance> {
        let n = self.n;
        if let Some(b) = self.sending.take() {
            self.land(ctx, b);
        }
        if let Some(b) = self.receiving.take() {
            // received in step `step − 1`: sent on in step `step`, unless it started on the right
            if self.step < n - 1 {
                self.next = Some(b);
            } else {
                self.land(ctx, b);
            }
        }
        let me = self.me;
        loop {
            if self.step + 1 >= n {
                if let Some(b) = self.next.take() {
                    // one leader alone: its own block
                    self.land(ctx, b);
                }
                return Ok(Advance::Done);
            }
            let s = self.step;
            // s <= n - 2 here
            let send = (me + n - s) % n;
            let recv = (me + 2 * n - s - 1) % n;
            let (cs, cr) = (self.count(send), self.count(recv));
            if cs == 0 && cr == 0 {
                self.step += 1;
                continue;
            }
            let rbuf = if cr > 0 {
                match ctx.pool.get() {
                    Some(b) => Some(b),
                    None => return Ok(Advance::Waiting),
                }
            } else {
                None
            };
            let sblock = if cs > 0 {
                match self.next.take() {
                    Some(b) if b.owner == send && b.buf.len() >= cs => Some(b),
                    other => {
                        if let Some(b) = rbuf {
                            ctx.pool.put(b);
                        }
                        return Err((
                            ExitStatus::Internal,
                            format!(
                                "ring step {s}: block {send} ({cs} bytes) is not here to send (have {:?})",
                                other.map(|b| (b.owner, b.buf.len()))
                            ),
                        ));
                    }
                }
            } else {
                None
            };
            self.step += 1;
            let right = (me + 1) % n;
            let left = (me + n - 1) % n;
            if let Some(mut buf) = rbuf {
                debug_assert!(cr <= buf.len() && cr <= plan::MAX_TRANSFER_CHUNK as usize);
                // SAFETY: `buf` holds at least `cr` bytes (a pool buffer of one chunk; `cr` is
                // this round's length of a chunk); it moves into `self.receiving` below, whose
                // heap storage stays put and is neither read nor dropped until `reqs` completes
                // (the flight keeps the ring until then).
                let posted = unsafe { plane.irecv(buf.as_mut_ptr(), cr, left, self.tag) };
                let ok = reqs.add(posted);
                self.receiving = Some(Block { owner: recv, buf });
                ok?;
            }
            if let Some(b) = sblock {
                // SAFETY: `b.buf` holds at least `cs` bytes (checked above); it moves into
                // `self.sending`, whose heap storage is neither written, moved nor dropped
                // until `reqs` completes.
                let posted = unsafe { plane.isend(b.buf.as_ptr(), cs, right, self.tag) };
                let ok = reqs.add(posted);
                self.sending = Some(b);
                ok?;
            }
            return Ok(Advance::Started);
        }
    }
}
