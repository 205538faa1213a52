//! Pure planning logic of the broadcast engine: which chunks move, who reads them, in which round,
//! how much memory the rounds take, and the per-round header every reader sends.
//!
//! Everything here is deterministic and computed identically on every leader from the same inputs,
//! so that no extra agreement is needed about the plan itself.

use std::ops::Range;

/// Upper bound on the memory the pipeline's buffers of one leader may take: round buffers of
/// `slots` chunks (rounds in flight or being verified and written, at least two) and one send buffer
/// per round buffer plus one the reader thread reads ahead into. Together with the hash state, the
/// file descriptors and the MPI library's own buffers a leader stays well under 256 MiB.
pub const ROUND_MEMORY_BUDGET: u64 = 160 << 20;
/// Round buffers at most (rounds in flight plus rounds being verified and written).
pub const MAX_ROUND_BUFS: usize = 3;
/// Largest chunk the bounded-memory pipeline accepts: two round buffers of one chunk and three
/// send buffers must fit in [`ROUND_MEMORY_BUDGET`] (32 MiB).
pub const MAX_TRANSFER_CHUNK: u64 = ROUND_MEMORY_BUDGET / 5;
/// Smallest chunk.
pub const MIN_TRANSFER_CHUNK: u64 = 4096;
/// Size of one slot of the per-round header (see [`SlotHeader`]).
pub const SLOT_HEADER_LEN: usize = 40;
/// Size of the per-leader status word that leads each leader's header block.
pub const STATUS_LEN: usize = 8;

/// One piece of the file that has to move: `[offset, offset + len)`, with the hash it must have when
/// the source describes it (a pool manifest); otherwise the reader's hash (sent in the header) is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u64,
    pub len: u32,
    pub expect: Option<[u8; 32]>,
}

/// `chunk_size` pieces of `range` (the last one may be shorter), with no expected hash.
pub fn grid(range: Range<u64>, chunk_size: u64) -> impl Iterator<Item = Chunk> {
    let end = range.end;
    (range.start..end)
        .step_by(chunk_size.max(1) as usize)
        .map(move |off| Chunk {
            offset: off,
            len: ((off + chunk_size).min(end) - off) as u32,
            expect: None,
        })
}

/// The chunk grid of a plain file: `chunk_size`-aligned pieces of `[0, len)` that overlap a data
/// range (holes reported by SEEK_HOLE are skipped; all-zero chunks are found later, when read).
pub fn plain_chunks(len: u64, chunk_size: u64, data: &[Range<u64>]) -> Vec<Chunk> {
    let mut hint = 0usize;
    grid(0..len, chunk_size)
        .filter(|c| {
            crate::sparse::overlaps_data(data, &(c.offset..c.offset + c.len as u64), &mut hint)
        })
        .collect()
}

/// Split `count` chunks among `owners` readers in contiguous, balanced blocks (the first
/// `count % owners` readers get one more): reader `k` reads `owner_range(count, owners, k)`.
/// Contiguous blocks keep every reader's accesses sequential on shared storage.
pub fn owner_range(count: usize, owners: usize, k: usize) -> Range<usize> {
    let q = count / owners;
    let r = count % owners;
    let start = k * q + k.min(r);
    let len = q + usize::from(k < r);
    start..start + len
}

/// How many chunk slots one round may carry for `owners` readers with chunks of `chunk_size`, within
/// [`ROUND_MEMORY_BUDGET`]: two round buffers of `slots` chunks plus three send buffers. At least 1;
/// at most `owners` (one chunk per reader per round).
pub fn slots_per_round(owners: usize, chunk_size: u64) -> usize {
    let chunks = (ROUND_MEMORY_BUDGET / chunk_size.max(1)) as usize;
    (chunks.saturating_sub(3) / 2).clamp(1, owners.max(1))
}

/// How many round buffers (of `slots` chunks, each with a send buffer) the pipeline may use, beside
/// the reader's spare send buffer: at least 2 (one moving while one is written), at most
/// [`MAX_ROUND_BUFS`].
pub fn round_buffers(slots: usize, chunk_size: u64) -> usize {
    let chunks = (ROUND_MEMORY_BUDGET / chunk_size.max(1)) as usize;
    (chunks.saturating_sub(1) / (slots + 1)).clamp(2, MAX_ROUND_BUFS)
}

/// Send buffers of the reader thread for `round_bufs` round buffers: one per round in flight and
/// one to read ahead into.
pub fn send_buffers(round_bufs: usize) -> usize {
    round_bufs + 1
}

/// Peak bytes of the pipeline's buffers for a plan (what [`slots_per_round`] and [`round_buffers`]
/// bound).
pub fn round_buffer_bytes(slots: usize, chunk_size: u64) -> u64 {
    let rb = round_buffers(slots, chunk_size);
    (rb * slots + send_buffers(rb)) as u64 * chunk_size
}

/// The ring's rounds carry one chunk of every reader (`owners` slots): a ring round holds at most
/// two chunks per leader at a time (the block it sends and the block it receives in the current
/// step; each received block goes to the writer once forwarded), not the whole round, so its memory
/// does not grow with the number of nodes. With fewer slots than readers a round's chunks would
/// still travel all `owners − 1` hops while most links idle: about `N + S` steps for `S` chunks.
pub fn ring_slots(owners: usize) -> usize {
    owners.max(1)
}

/// Rounds of the ring in flight at once: up to [`MAX_ROUND_BUFS`], while their send buffers, two
/// blocks each and one block for the writer fit in [`ROUND_MEMORY_BUDGET`] (`3R + 2` chunks).
pub fn ring_rounds_in_flight(chunk_size: u64) -> usize {
    let chunks = (ROUND_MEMORY_BUDGET / chunk_size.max(1)) as usize;
    (chunks.saturating_sub(2) / 3).clamp(1, MAX_ROUND_BUFS)
}

/// Block buffers of the ring (each one chunk): what the budget leaves after the reader's send
/// buffers; at least two per round in flight and one for the writer. The writer gives each back
/// once the block is verified and written, so the surplus only lets the writer fall behind the
/// network for a while.
pub fn ring_block_buffers(chunk_size: u64) -> usize {
    let chunks = (ROUND_MEMORY_BUDGET / chunk_size.max(1)) as usize;
    let r = ring_rounds_in_flight(chunk_size);
    chunks.saturating_sub(send_buffers(r)).max(2 * r + 1)
}

/// Peak bytes of the ring's buffers (send buffers and block buffers).
pub fn ring_buffer_bytes(chunk_size: u64) -> u64 {
    let r = ring_rounds_in_flight(chunk_size);
    (send_buffers(r) + ring_block_buffers(chunk_size)) as u64 * chunk_size
}

/// The two binary trees of [`super::Algorithm::TwoTree`] over transfer ranks `0..n`: rank 0 (the
/// only reader) feeds both; chunk `c` goes down tree `c % 2`. Tree 0 is a binary heap over ranks
/// `1, 2, …, n − 1` in that order, tree 1 over the same ranks in reverse order, so a rank that
/// forwards in one tree is (with an even count of ranks below the root) a leaf in the other: every
/// rank sends about as many bytes as it receives, and every chunk reaches every rank in
/// ⌈log2 n⌉ + 1 hops.
fn tree_order_index(n: usize, tree: usize, rank: usize) -> usize {
    // position of `rank` (1..n) in the tree's heap order
    if tree == 0 {
        rank - 1
    } else {
        n - 1 - rank
    }
}

fn tree_order_rank(n: usize, tree: usize, idx: usize) -> usize {
    if tree == 0 {
        idx + 1
    } else {
        n - 1 - idx
    }
}

/// The rank `me` receives tree `tree`'s chunks from (`None` for rank 0, the reader).
pub fn tree_parent(n: usize, tree: usize, me: usize) -> Option<usize> {
    if me == 0 || me >= n {
        return None;
    }
    let idx = tree_order_index(n, tree, me);
    Some(if idx == 0 {
        0
    } else {
        tree_order_rank(n, tree, (idx - 1) / 2)
    })
}

/// The ranks `me` forwards tree `tree`'s chunks to (at most two; rank 0: the tree's top).
pub fn tree_children(n: usize, tree: usize, me: usize) -> Vec<usize> {
    if n < 2 || me >= n {
        return Vec::new();
    }
    if me == 0 {
        return vec![tree_order_rank(n, tree, 0)];
    }
    let idx = tree_order_index(n, tree, me);
    [2 * idx + 1, 2 * idx + 2]
        .into_iter()
        .filter(|&j| j < n - 1)
        .map(|j| tree_order_rank(n, tree, j))
        .collect()
}

/// Chunks of at most this many per leader go down [`super::Algorithm::TwoTree`] from one reader
/// instead of the ring (see [`super::Algorithm::choose`]).
pub const TREE_CHUNKS_PER_LEADER: usize = 4;

/// One entry of a round: chunk `chunk` (index into the chunk list), read and sent by `owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub owner: usize,
    pub chunk: usize,
}

/// The rounds: in each, every reader contributes at most one chunk; a round carries at most
/// `slots` chunks. Readers take turns (chunk s of every reader, then chunk s+1, …), so that every
/// round keeps as many readers busy as memory allows and each reader reads sequentially.
/// Within a round slots are ordered by owner (the layout of the gathered buffer).
pub fn plan_rounds(count: usize, owners: usize, slots: usize) -> Vec<Vec<Slot>> {
    let owners = owners.max(1);
    let slots = slots.max(1);
    let ranges: Vec<Range<usize>> = (0..owners).map(|k| owner_range(count, owners, k)).collect();
    let depth = ranges.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut seq = Vec::with_capacity(count);
    for s in 0..depth {
        for (k, r) in ranges.iter().enumerate() {
            if s < r.len() {
                seq.push(Slot {
                    owner: k,
                    chunk: r.start + s,
                });
            }
        }
    }
    let mut rounds: Vec<Vec<Slot>> = Vec::new();
    let mut cur: Vec<Slot> = Vec::new();
    for slot in seq {
        // a reader contributes at most one chunk per round
        if cur.len() == slots || cur.iter().any(|s| s.owner == slot.owner) {
            rounds.push(std::mem::take(&mut cur));
        }
        cur.push(slot);
    }
    if !cur.is_empty() {
        rounds.push(cur);
    }
    for r in &mut rounds {
        r.sort_by_key(|s| s.owner);
    }
    rounds
}

/// What a reader says about one chunk it read in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlotHeader {
    /// Bytes sent for this chunk (0 when it is all zeros, or when the slot is unused).
    pub sent: u32,
    /// The chunk is all zeros: receivers leave a hole.
    pub zero: bool,
    /// BLAKE3 hash of the chunk's bytes (as read by the reader; the manifest's chunk hash).
    pub hash: [u8; 32],
}

impl SlotHeader {
    pub fn encode(&self, out: &mut [u8]) {
        out[..4].copy_from_slice(&self.sent.to_le_bytes());
        out[4..8].copy_from_slice(&u32::from(self.zero).to_le_bytes());
        out[8..40].copy_from_slice(&self.hash);
    }
    pub fn decode(b: &[u8]) -> SlotHeader {
        let mut hash = [0u8; 32];
        hash.copy_from_slice(&b[8..40]);
        SlotHeader {
            sent: u32::from_le_bytes(b[..4].try_into().unwrap()),
            zero: u32::from_le_bytes(b[4..8].try_into().unwrap()) & 1 == 1,
            hash,
        }
    }
}

/// A reader's header block for one round: its status (0 = fine, else it failed and everyone stops
/// after this round) and one [`SlotHeader`] (it contributes at most one chunk per round).
pub const BLOCK_LEN: usize = STATUS_LEN + SLOT_HEADER_LEN;

pub fn encode_block(status: u64, slot: &SlotHeader) -> [u8; BLOCK_LEN] {
    let mut b = [0u8; BLOCK_LEN];
    b[..8].copy_from_slice(&status.to_le_bytes());
    slot.encode(&mut b[8..]);
    b
}

pub fn decode_block(b: &[u8]) -> (u64, SlotHeader) {
    (
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        SlotHeader::decode(&b[8..BLOCK_LEN]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ranges_cover_everything_once() {
        for count in [0usize, 1, 2, 7, 8, 9, 100, 257] {
            for owners in 1..=9 {
                let mut next = 0;
                for k in 0..owners {
                    let r = owner_range(count, owners, k);
                    assert_eq!(r.start, next, "count {count} owners {owners} k {k}");
                    next = r.end;
                    let q = count / owners;
                    assert!(r.len() == q || r.len() == q + 1);
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn rounds_cover_every_chunk_once_one_per_owner() {
        for count in [0usize, 1, 3, 8, 9, 31, 100] {
            for owners in 1..=9 {
                for slots in [1usize, 2, 3, owners, 16] {
                    let rounds = plan_rounds(count, owners, slots);
                    let mut seen = vec![0u32; count];
                    for r in &rounds {
                        assert!(!r.is_empty() && r.len() <= slots.max(1));
                        for w in r.windows(2) {
                            assert!(
                                w[0].owner < w[1].owner,
                                "one chunk per owner, sorted: {r:?}"
                            );
                        }
                        for s in r {
                            assert!(owner_range(count, owners, s.owner).contains(&s.chunk));
                            seen[s.chunk] += 1;
                        }
                    }
                    assert!(seen.iter().all(|&n| n == 1), "{count} {owners} {slots}");
                    // each owner's chunks come in increasing order (sequential reads)
                    for k in 0..owners {
                        let mine: Vec<usize> = rounds
                            .iter()
                            .flat_map(|r| r.iter().filter(|s| s.owner == k).map(|s| s.chunk))
                            .collect();
                        assert!(mine.windows(2).all(|w| w[0] < w[1]));
                    }
                    // with enough slots the number of rounds is the deepest owner's share
                    if slots >= owners && count > 0 {
                        assert_eq!(rounds.len(), count.div_ceil(owners));
                    }
                }
            }
        }
    }

    #[test]
    fn memory_bound_holds_for_any_node_count() {
        let mut chunk = MIN_TRANSFER_CHUNK;
        while chunk <= MAX_TRANSFER_CHUNK {
            for owners in [1usize, 2, 3, 8, 64, 1000, 100_000] {
                let slots = slots_per_round(owners, chunk);
                assert!(slots >= 1 && slots <= owners);
                assert!(round_buffers(slots, chunk) >= 2);
                let bytes = round_buffer_bytes(slots, chunk);
                assert!(
                    bytes <= ROUND_MEMORY_BUDGET,
                    "chunk {chunk} owners {owners}: {bytes} bytes"
                );
            }
            chunk *= 2;
        }
        // 4 MiB chunks: 8 nodes fit in one round each
        assert_eq!(slots_per_round(8, 4 << 20), 8);
        assert_eq!(round_buffers(8, 4 << 20), 3);
        assert_eq!(round_buffer_bytes(8, 4 << 20), 112 << 20);
        assert_eq!(slots_per_round(100, 4 << 20), 18);
        assert_eq!(round_buffers(18, 4 << 20), 2);
        assert_eq!(slots_per_round(100, MAX_TRANSFER_CHUNK), 1);
    }

    #[test]
    fn ring_memory_is_bounded_and_independent_of_the_node_count() {
        let mut chunk = MIN_TRANSFER_CHUNK;
        while chunk <= MAX_TRANSFER_CHUNK {
            let r = ring_rounds_in_flight(chunk);
            assert!((1..=MAX_ROUND_BUFS).contains(&r));
            assert!(ring_block_buffers(chunk) > 2 * r, "chunk {chunk}");
            let bytes = ring_buffer_bytes(chunk);
            assert!(bytes <= ROUND_MEMORY_BUDGET, "chunk {chunk}: {bytes} bytes");
            chunk *= 2;
        }
        for owners in [1usize, 8, 1024, 100_000] {
            assert_eq!(ring_slots(owners), owners);
        }
        assert_eq!(ring_rounds_in_flight(1 << 20), 3);
        assert_eq!(ring_block_buffers(1 << 20), 156);
        assert_eq!(ring_rounds_in_flight(MAX_TRANSFER_CHUNK), 1);
        assert_eq!(ring_block_buffers(MAX_TRANSFER_CHUNK), 3);
    }

    #[test]
    fn two_trees_span_every_rank_and_share_the_forwarding() {
        for n in 1..70usize {
            let mut sends = vec![0usize; n];
            for tree in 0..2 {
                // every rank but 0 has one parent; following parents reaches 0 within log2 hops
                let depth_max = (usize::BITS - n.leading_zeros()) as usize + 1;
                for me in 1..n {
                    let mut r = me;
                    let mut hops = 0;
                    while let Some(p) = tree_parent(n, tree, r) {
                        assert!(
                            tree_children(n, tree, p).contains(&r),
                            "n {n} tree {tree} {p}->{r}"
                        );
                        r = p;
                        hops += 1;
                        assert!(
                            hops <= depth_max,
                            "n {n} tree {tree} rank {me}: {hops} hops"
                        );
                    }
                    assert_eq!(r, 0);
                }
                assert_eq!(tree_parent(n, tree, 0), None);
                // the children lists cover every rank but 0 exactly once
                let mut all: Vec<usize> = (0..n).flat_map(|m| tree_children(n, tree, m)).collect();
                all.sort();
                assert_eq!(all, (1..n).collect::<Vec<_>>(), "n {n} tree {tree}");
                for (m, s) in sends.iter_mut().enumerate() {
                    let k = tree_children(n, tree, m).len();
                    assert!(k <= 2);
                    *s += k;
                }
            }
            // over both trees (one chunk each) a rank other than 0 sends at most 2 chunks, and
            // with an even count of ranks below the root it forwards in one tree only
            for (m, &s) in sends.iter().enumerate().skip(1) {
                assert!(s <= 2, "n {n} rank {m} sends {s}");
                if (n - 1) % 2 == 0 {
                    let a = tree_children(n, 0, m).is_empty();
                    let b = tree_children(n, 1, m).is_empty();
                    assert!(a || b, "n {n}: rank {m} forwards in both trees");
                }
            }
        }
        assert_eq!(tree_children(8, 0, 0), vec![1]);
        assert_eq!(tree_children(8, 1, 0), vec![7]);
        assert_eq!(tree_children(8, 0, 1), vec![2, 3]);
        assert_eq!(tree_children(8, 1, 7), vec![6, 5]);
        assert_eq!(tree_parent(2, 0, 1), Some(0));
        assert_eq!(tree_parent(2, 1, 1), Some(0));
    }

    #[test]
    fn header_round_trip() {
        let h = SlotHeader {
            sent: 4 << 20,
            zero: false,
            hash: [7u8; 32],
        };
        let b = encode_block(1, &h);
        assert_eq!(decode_block(&b), (1, h));
        let z = SlotHeader {
            sent: 0,
            zero: true,
            hash: [0u8; 32],
        };
        assert_eq!(decode_block(&encode_block(0, &z)), (0, z));
    }

    #[test]
    fn plain_grid_skips_holes() {
        let mib = 1u64 << 20;
        let c = plain_chunks(10 * mib + 1, 4 * mib, &[0..10, 9 * mib..9 * mib + 5]);
        let offs: Vec<u64> = c.iter().map(|c| c.offset).collect();
        assert_eq!(offs, vec![0, 8 * mib]);
        assert_eq!(c[1].len as u64, 2 * mib + 1);
        let whole: Vec<Range<u64>> = std::iter::once(0..10 * mib + 1).collect();
        let c = plain_chunks(10 * mib + 1, 4 * mib, &whole);
        assert_eq!(c.len(), 3);
        assert_eq!(c[2].len, (2 * mib + 1) as u32);
        assert!(plain_chunks(0, 4096, &[]).is_empty());
    }
}
