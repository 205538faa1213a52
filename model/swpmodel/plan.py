"""The engine's planning rules, ported from crates/swpool-transfer/src/transfer/plan.rs.

Kept literal so that the model moves chunks in the same rounds as the Rust engine does.
"""

ROUND_MEMORY_BUDGET = 160 << 20
MAX_ROUND_BUFS = 3
# writer threads per leader (engine/mod.rs `WRITERS`)
WRITERS = 2


def owner_range(count, owners, k):
    q, r = divmod(count, owners)
    start = k * q + min(k, r)
    return range(start, start + q + (1 if k < r else 0))


def slots_per_round(owners, chunk):
    chunks = ROUND_MEMORY_BUDGET // max(chunk, 1)
    return max(1, min(max(owners, 1), max(chunks - 3, 0) // 2))


def round_buffers(slots, chunk):
    chunks = ROUND_MEMORY_BUDGET // max(chunk, 1)
    return max(2, min(MAX_ROUND_BUFS, max(chunks - 1, 0) // (slots + 1)))


def send_buffers(round_bufs):
    return round_bufs + 1


def ring_slots(owners):
    """The ring's rounds carry one chunk of every reader (plan.rs `ring_slots`)."""
    return max(owners, 1)


def ring_rounds_in_flight(chunk):
    chunks = ROUND_MEMORY_BUDGET // max(chunk, 1)
    return max(1, min(MAX_ROUND_BUFS, max(chunks - 2, 0) // 3))


def ring_block_buffers(chunk):
    chunks = ROUND_MEMORY_BUDGET // max(chunk, 1)
    r = ring_rounds_in_flight(chunk)
    return max(2 * r + 1, chunks - send_buffers(r))


def plan_rounds(count, owners, slots):
    """Rounds as lists of (owner, chunk), sorted by owner (plan.rs `plan_rounds`)."""
    owners = max(owners, 1)
    slots = max(slots, 1)
    ranges = [owner_range(count, owners, k) for k in range(owners)]
    depth = max((len(r) for r in ranges), default=0)
    rounds, cur, seen = [], [], set()
    for s in range(depth):
        for k, r in enumerate(ranges):
            if s < len(r):
                if len(cur) == slots or k in seen:
                    rounds.append(cur)
                    cur, seen = [], set()
                cur.append((k, r.start + s))
                seen.add(k)
    if cur:
        rounds.append(cur)
    for r in rounds:
        r.sort()
    return rounds


TREE_CHUNKS_PER_LEADER = 4


def choose(n, count):
    """The engine's algorithm for `count` chunks on `n` leaders (transfer/mod.rs `Algorithm::choose`):
    the two trees from one reader for at most TREE_CHUNKS_PER_LEADER chunks per leader (from 3
    leaders on), else the ring."""
    return "two-tree" if n > 2 and count <= TREE_CHUNKS_PER_LEADER * n else "ring"
