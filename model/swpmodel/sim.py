"""One SimGrid (S4U, python3-simgrid 3.32) simulation of one file broadcast.

`simulate(platform, algo, n, nbytes, chunk)` runs in a fresh process (SimGrid's engine is a
process-wide singleton) and returns a dict of simulated seconds. See model/README.md for what is
modelled and what is not.

Units: a host "flop" is one nanosecond of one core (host speed 1e9), so CPU work is given as
bytes x ns-per-byte. Bandwidths are payload bytes/s, latencies seconds.
"""

import math
from collections import deque

from . import plan

ALGORITHMS = ["ring", "bcast", "binomial", "scatter-allgather", "two-tree", "sbcast", "every-node-reads"]
# the engine before its ring took one chunk of every reader per round: rounds of at most
# slots_per_round chunks held in round buffers (see run_engine)
BEFORE = ["ring-round-buffers"]


def log2c(n):
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def startup(p, n):
    table = p.get("startup_table")
    if table and str(n) in table:
        return float(table[str(n)])
    return p["startup_s"] + p["startup_log2_s"] * log2c(n)


class World:
    """The platform: hosts, links, disks, and where each kind of actor runs."""

    def __init__(self, p, n):
        import simgrid as sg
        self.sg = sg
        self.p = p
        self.n = n
        self.e = sg.Engine(["swpmodel", "--log=root.thres:critical",
                            "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0"])
        z = sg.NetZone.create_star_zone("cluster")
        up = sg.LinkInRoute.Direction.UP
        self.nodes = []
        slow = int(p.get("slow_node", -1)) % n if "slow_node" in p else -1
        for i in range(n):
            h = z.create_host(f"node{i}", 1e9)
            h.core_count = max(1, int(p.get("node_cores", 4)))
            bw = p["node_link_bw"] * (p.get("slow_node_factor", 1.0) if i == slow else 1.0)
            link = z.create_split_duplex_link(f"link{i}", bw).set_latency(p["node_link_lat"])
            z.add_route(h.netpoint, None, None, None, [sg.LinkInRoute(link, up)], True)
            self.nodes.append(h)
        self.storage = z.create_host("storage", 1e9)
        sl = z.create_split_duplex_link("storage_link", p["storage_bw"]).set_latency(p["storage_lat"])
        z.add_route(self.storage.netpoint, None, None, None, [sg.LinkInRoute(sl, up)], True)
        shared = int(p.get("shared_cpu_cores", 0))
        if shared:
            # the virtual cluster: every node's reader, writer and writeback run on one 2-core host,
            # together with the kernel work (TCP, sshfs, page cache) charged to them per byte
            cpu = z.create_host("shared_cpu", 1e9)
            cpu.core_count = shared
            self.cpu_hosts = [cpu] * n
        else:
            self.cpu_hosts = self.nodes
        z.seal()
        if p.get("disk_shared"):
            d = self.cpu_hosts[0].create_disk("disk", 1e12, p["disk_write_bw"]).seal()
            self.disks = [d] * n
        else:
            self.disks = [h.create_disk(f"disk{i}", 1e12, p["disk_write_bw"]).seal()
                          for i, h in enumerate(self.nodes)]
        self.done = [0.0] * n
        self._agreement = None

    def agreement(self):
        """The final agreement's collective, shared by every node's commit."""
        if self._agreement is None:
            self._agreement = Collective(self)
        return self._agreement

    # -- helpers used by actors --
    def now(self):
        return self.sg.Engine.clock

    def storage_read(self, i, nbytes, cpu_ns_per_byte=0.0):
        """Read from shared storage into node i; the kernel's per-byte work (cpu_ns_per_byte, run by
        the calling actor) overlaps the transfer."""
        t0 = self.now()
        c = self.sg.Comm.sendto_async(self.storage, self.nodes[i], int(nbytes))
        if cpu_ns_per_byte > 0:
            self.sg.this_actor.exec_async(nbytes * cpu_ns_per_byte).wait()
        c.wait()
        # one client's read rate from the file system (Comm.set_rate() is refused on these comms by
        # SimGrid 3.32's bindings): the read takes at least nbytes / storage_client_bw
        cap = self.p.get("storage_client_bw")
        if cap:
            rest = t0 + nbytes / cap - self.now()
            if rest > 0:
                self.sg.this_actor.sleep_for(rest)

    def work(self, nbytes, ns_per_byte):
        flops = nbytes * ns_per_byte
        if flops > 0:
            self.sg.this_actor.execute(flops)

    def work_on(self, i, nbytes, ns_per_byte):
        """CPU work charged to node i from an actor that must stay on the node's host (to send)."""
        if self.cpu_hosts[i] is self.nodes[i]:
            return self.work(nbytes, ns_per_byte)
        if nbytes * ns_per_byte > 0:
            self.sg.Actor.create("work", self.cpu_hosts[i], self.work, nbytes, ns_per_byte).join()

    def mpi_wait(self, comms, t0):
        """Wait for MPI requests the way the engine's MPI thread does: it polls, and after a short
        spin it sleeps between polls (engine/flight.rs `Backoff`), so a completion is seen late."""
        self.sg.Comm.wait_all(comms)
        if self.now() - t0 > self.p["poll_spin"]:
            self.sg.this_actor.sleep_for(self.p["poll_period"] / 2)

    def overhead(self, k=1):
        o = self.p["mpi_overhead"] * k
        if o > 0:
            self.sg.this_actor.sleep_for(o)


class Collective:
    """A small collective (header allgather, agreement): completes for everyone at the last
    arrival plus a latency of ceil(log2 n) message steps."""

    def __init__(self, w):
        self.w = w
        self.count = {}
        self.sem = {}

    def arrive(self, key):
        sg, w = self.w.sg, self.w
        n = w.n
        if n == 1:
            return
        c = self.count.get(key, 0) + 1
        self.count[key] = c
        if key not in self.sem:
            self.sem[key] = sg.Semaphore(0)
        s = self.sem[key]
        if c == n:
            lat = log2c(n) * (2 * w.p["node_link_lat"] + w.p["mpi_overhead"])
            if lat > 0:
                sg.this_actor.sleep_for(lat)
            for _ in range(n - 1):
                s.release()
            del self.count[key]
        else:
            s.acquire()


class Node:
    """Per-node queues between the reader, the MPI thread, the writer and the writeback."""

    def __init__(self, w, i):
        sg = w.sg
        self.i = i
        self.ready = deque()          # chunks read (bytes sent, chunk bytes)
        self.ready_sem = sg.Semaphore(0)
        self.land = deque()           # (list of (bytes, own), release-callback)
        self.land_sem = sg.Semaphore(0)
        self.wb = deque()
        self.wb_sem = sg.Semaphore(0)
        self.wb_done = sg.Semaphore(0)


def writeback_actor(w, nd, total):
    """Device writeback of one node's file (page cache -> disk); the commit's fsync waits for it."""
    done = 0
    while done < total:
        nd.wb_sem.acquire()
        b = nd.wb.popleft()
        if b > 0:
            w.disks[nd.i].write(int(b))
        done += b
    nd.wb_done.release()


def writer_actor(w, nd, nrounds, verify=True, writers=None):
    """Verify (BLAKE3) every chunk that came from another node, copy it into the page cache, queue
    its writeback; then give the block or round buffer back (engine/mod.rs: `WRITERS` writer threads,
    each taking the next landing). This actor and writers - 1 more run the same loop."""
    writers = writers or plan.WRITERS
    nd.taken = 0
    host = w.sg.this_actor.get_host()
    for k in range(1, writers):
        w.sg.Actor.create(f"writer{nd.i}.{k}", host, _writer_loop, w, nd, nrounds, verify, writers)
    _writer_loop(w, nd, nrounds, verify, writers)


def _writer_loop(w, nd, nrounds, verify, writers):
    p = w.p
    if nrounds == 0:
        return
    while True:
        nd.land_sem.acquire()
        item = nd.land.popleft()
        if item is None:
            return
        nd.taken += 1
        last = nd.taken == nrounds
        if last:
            # the last landing: the other writers stop
            for _ in range(writers - 1):
                nd.land.append(None)
                nd.land_sem.release()
        items, give_back = item
        for b, own in items:
            if b <= 0:
                continue
            ns = p["copy_ns_per_byte"]
            if not own:
                ns += p["recv_cpu_ns_per_byte"] + (p["blake3_ns_per_byte"] if verify else 0)
            w.work(b, ns)
            nd.wb.append(b)
            nd.wb_sem.release()
        if give_back:
            give_back()
        if last:
            return


def reader_actor(w, nd, chunks, sendbuf_sem, hash_it=True):
    """Read this node's chunks from shared storage, in order, hash them (engine/mod.rs reader thread)."""
    p = w.p
    for (sent, length) in chunks:
        if sendbuf_sem is not None:
            sendbuf_sem.acquire()
        w.storage_read(nd.i, length, p["recv_cpu_ns_per_byte"])
        w.work(length, p["blake3_ns_per_byte"] if hash_it else 0)
        nd.ready.append((sent, length))
        nd.ready_sem.release()


def chunk_list(nbytes, chunk, zero_fraction=0.0):
    """(bytes sent, bytes read) per chunk; every 1/zero_fraction-th chunk is all zeros (read, not sent)."""
    count = math.ceil(nbytes / chunk)
    out = []
    acc = 0.0
    for c in range(count):
        length = min(chunk, nbytes - c * chunk)
        acc += zero_fraction
        if acc >= 1.0:
            acc -= 1.0
            out.append((0, length))
        else:
            out.append((length, length))
    return out


# --------------------------------------------------------------------------------------------
# sw-pool's engine: split reads by owner, rounds, header allgather, pipelined ring (or one Ibcast
# per reader), B round buffers in flight, writer thread verifying and writing.
# --------------------------------------------------------------------------------------------

def run_engine(w, chunks, chunk, mode, opts):
    """mode "ring": the engine's ring (one chunk of every reader per round, `ring_rounds_in_flight`
    rounds at once, blocks from a pool of `ring_block_buffers` chunks that the writer gives back one
    by one); "ring-round-buffers": the ring as it was (rounds of `slots_per_round` chunks, each held
    in a round buffer until written); "bcast": one Ibcast per reader, round buffers.
    opts: "slots" caps the chunks per round (SW_POOL_BENCH_SLOTS)."""
    sg = w.sg
    n = w.n
    if mode == "ring":
        slots = min(plan.ring_slots(n), opts.get("slots") or n)
        nb = opts.get("round_bufs") or plan.ring_rounds_in_flight(chunk)
    else:
        slots = opts.get("slots") or plan.slots_per_round(n, chunk)
        nb = opts.get("round_bufs") or plan.round_buffers(slots, chunk)
    rounds = plan.plan_rounds(len(chunks), n, slots)
    hdr = Collective(w)
    nodes = [Node(w, i) for i in range(n)]
    for i in range(n):
        nd = nodes[i]
        mine = [chunks[c] for r in rounds for (k, c) in r if k == i]
        sendbufs = sg.Semaphore(plan.send_buffers(nb))
        total = sum(s for (s, _) in chunks)
        nd.sendbufs = sendbufs
        nd.turn = [sg.Semaphore(1 if k == 0 else 0) for k in range(nb)]
        nd.bufsem = [sg.Semaphore(1) for _ in range(nb)]
        nd.blocks = sg.Semaphore(plan.ring_block_buffers(chunk))
        sg.Actor.create(f"reader{i}", w.cpu_hosts[i], reader_actor, w, nd, mine, sendbufs)
        # the ring lands every chunk on its own; the others a round at a time
        landings = len(chunks) if mode == "ring" else len(rounds)
        sg.Actor.create(f"writer{i}", w.cpu_hosts[i], writer_actor, w, nd, landings)
        sg.Actor.create(f"wb{i}", w.cpu_hosts[i], writeback_actor, w, nd, total)
        for k in range(nb):
            sg.Actor.create(f"flight{i}.{k}", w.nodes[i], flight_actor, w, nodes, i, k, nb, rounds, chunks,
                            hdr, mode)
        sg.Actor.create(f"commit{i}", w.nodes[i], commit_actor, w, nd, hdr)


def commit_actor(w, nd, coll):
    nd.wb_done.acquire()                 # fsync
    coll.arrive(("agree",))              # all leaders agree before the rename
    w.done[nd.i] = w.now()


def flight_actor(w, nodes, me, k, nb, rounds, chunks, hdr, mode):
    """Drives rounds k, k+nb, ...: one round buffer of the engine's MPI thread."""
    sg = w.sg
    n = w.n
    nd = nodes[me]
    right, left = (me + 1) % n, (me - 1) % n
    for r in range(k, len(rounds), nb):
        if mode != "ring":
            nd.bufsem[k].acquire()       # a free round buffer (the writer gives it back)
        nd.turn[k].acquire()             # the MPI thread starts rounds in order
        rnd = rounds[r]
        owners = {}
        for (o, c) in rnd:
            owners[o] = chunks[c][0]
        if me in owners:
            nd.ready_sem.acquire()       # my chunk from the reader
            nd.ready.popleft()
            if mode == "ring" and owners[me] > 0:
                nd.blocks.acquire()      # the reader gets a pool buffer for its own
            nd.sendbufs.release()        # (else: copied into the round buffer)
        hdr.arrive(("hdr", r))
        nd.turn[(k + 1) % nb].release()  # the next round may start its header now
        active = {o: b for o, b in owners.items() if b > 0}
        if mode == "ring":
            for o, b in owners.items():
                if b <= 0:               # all zeros: nothing moves, the writer checks it at once
                    nd.land.append(([(0, o == me)], None))
                    nd.land_sem.release()
            ring_round(w, me, right, left, r % nb, active, nd)
            continue
        if n > 1 and active:
            if mode == "ring-round-buffers":
                ring_round(w, me, right, left, r % nb, active)
            else:
                bcast_round(w, me, r % nb, active)
        items = [(b, o == me) for o, b in owners.items()]
        bs = nd.bufsem[k]
        nd.land.append((items, bs.release))
        nd.land_sem.release()


def ring_round(w, me, right, left, tag, active, nd=None):
    """engine/ring.rs for Algorithm::Ring: in step s send block me-s to the right and receive block
    me-s-1 from the left; a step starts when this node's previous one completed; steps that move
    nothing are skipped. With `nd` (the engine now, `Ring::advance`) a block is received into a pool
    block (waiting for the writer when it has them all) and goes to the writer once forwarded, the
    right neighbour's own block once it arrived, this node's own after step 0; without it (the ring
    with round buffers) the round is landed as a whole by the caller."""
    sg = w.sg
    n = w.n

    def land(b):
        nd.land.append(([(active[b], b == me)], nd.blocks.release))
        nd.land_sem.release()

    if n == 1:
        if nd is not None and me in active:
            land(me)
        return
    steps = set()
    for b in active:
        s = (me - b) % n
        if s <= n - 2:
            steps.add(s)
        s = (me - 1 - b) % n
        if s <= n - 2:
            steps.add(s)
    mb_right = sg.Mailbox.by_name(f"ring{right}.{tag}")
    mb_me = sg.Mailbox.by_name(f"ring{me}.{tag}")
    for s in sorted(steps):
        sb = (me - s) % n
        rb = (me - s - 1) % n
        comms = []
        t0 = w.now()
        if nd is not None and rb in active:
            nd.blocks.acquire()
        w.overhead()
        if rb in active:
            c, _ = mb_me.get_async()
            comms.append(c)
        if sb in active:
            comms.append(mb_right.put_async(sb, int(active[sb])))
        w.mpi_wait(comms, t0)
        if nd is not None:
            if sb in active:
                land(sb)
            if rb in active and s == n - 2:
                land(rb)


def binomial_children(rel, n):
    """Children (relative ranks) of `rel` in a binomial tree of n rooted at 0, biggest subtree first."""
    kids = []
    mask = 1
    while mask < n:
        if rel & mask:
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if rel + mask < n:
            kids.append(rel + mask)
        mask >>= 1
    return kids


def bcast_round(w, me, tag, active):
    """Algorithm::Bcast: one MPI_Ibcast per reader, all started at once, binomial trees; a node
    forwards a reader's chunk as soon as it has it (progress only when the MPI thread polls)."""
    sg = w.sg
    n = w.n
    pending = []      # (comm, kind, owner)
    for o in active:
        rel = (me - o) % n
        if rel != 0:
            c, keep = sg.Mailbox.by_name(f"bc{me}.{o}.{tag}").get_async()
            pending.append((c, "recv", o, keep))
        else:
            for ch in binomial_children(0, n):
                dst = (ch + o) % n
                pending.append((sg.Mailbox.by_name(f"bc{dst}.{o}.{tag}").put_async(o, int(active[o])), "send", o, None))
    while pending:
        t0 = w.now()
        i = sg.Comm.wait_any([x[0] for x in pending])
        if w.now() - t0 > w.p["poll_spin"]:
            sg.this_actor.sleep_for(w.p["poll_period"] / 2)
        c, kind, o, _keep = pending.pop(i)
        if kind == "recv":
            rel = (me - o) % n
            for ch in binomial_children(rel, n):
                dst = (ch + o) % n
                pending.append((sg.Mailbox.by_name(f"bc{dst}.{o}.{tag}").put_async(o, int(active[o])), "send", o, None))


# --------------------------------------------------------------------------------------------
# The alternatives: one reader (node 0) and a tree / scatter+allgather, Slurm sbcast, every node
# reading. They share the reader, writer and writeback of the engine (verification on, except sbcast).
# --------------------------------------------------------------------------------------------

def heap_tree(order):
    """Binary heap over `order`: parent/children maps."""
    parent, kids = {}, {}
    for idx, node in enumerate(order):
        kids[node] = [order[j] for j in (2 * idx + 1, 2 * idx + 2) if j < len(order)]
        if idx > 0:
            parent[node] = order[(idx - 1) // 2]
    return parent, kids


def run_tree(w, chunks, algo, opts):
    """binomial / two-tree: node 0 reads everything (reader thread ahead by `sendbufs` chunks) and
    feeds a chunk-pipelined tree; every node forwards a chunk as soon as it has it."""
    sg = w.sg
    n = w.n
    nodes = [Node(w, i) for i in range(n)]
    total = sum(s for (s, _) in chunks)
    if algo == "binomial":
        trees = [{m: [c for c in binomial_children(m, n)] for m in range(n)}]
    else:  # two-tree: chunks alternate between two complementary binary trees below node 0
        rest = list(range(1, n))
        _, ka = heap_tree(rest)
        _, kb = heap_tree(list(reversed(rest)))
        ta = {0: [rest[0]] if rest else []}
        ta.update(ka)
        tb = {0: [rest[-1]] if rest else []}
        tb.update(kb)
        trees = [ta, tb]
    sendbufs = sg.Semaphore(opts.get("sendbufs", 4))
    nodes[0].sendbufs = sendbufs
    sg.Actor.create("reader0", w.cpu_hosts[0], reader_actor, w, nodes[0], chunks, sendbufs)
    for i in range(n):
        sg.Actor.create(f"writer{i}", w.cpu_hosts[i], writer_actor, w, nodes[i], len(chunks))
        sg.Actor.create(f"wb{i}", w.cpu_hosts[i], writeback_actor, w, nodes[i], total)
        for t in range(len(trees)):
            sg.Actor.create(f"fwd{i}.{t}", w.nodes[i], tree_forwarder, w, nodes[i], chunks, trees, t, len(trees))
        sg.Actor.create(f"commit{i}", w.nodes[i], commit_actor, w, nodes[i], w.agreement())


def tree_forwarder(w, nd, chunks, trees, t, ntrees):
    """Forward the chunks of tree t (chunk c goes down tree c % ntrees) in order."""
    sg = w.sg
    me = nd.i
    sends = deque()
    window = 4
    for c in range(t, len(chunks), ntrees):
        sent = chunks[c][0]
        if me == 0:
            nd.ready_sem.acquire()
            nd.ready.popleft()
        elif sent > 0:
            t0 = w.now()
            rc, keep = sg.Mailbox.by_name(f"t{me}.{t}").get_async()
            w.mpi_wait([rc], t0)
        if sent > 0:
            w.overhead()
            for ch in trees[t].get(me, []):
                sends.append(sg.Mailbox.by_name(f"t{ch}.{t}").put_async(c, int(sent)))
            while len(sends) > window:
                sends.popleft().wait()
        if me == 0:
            nd.sendbufs.release()
        nd.land.append(([(sent, me == 0)], None))
        nd.land_sem.release()
    while sends:
        sends.popleft().wait()


def run_scatter_allgather(w, chunks, opts):
    """MPI_Bcast's large-message algorithm from one reader: per segment of n chunks, node 0 scatters
    one chunk to each node, then a ring allgather of the segment (segments back to back, blocking)."""
    sg = w.sg
    n = w.n
    nodes = [Node(w, i) for i in range(n)]
    total = sum(s for (s, _) in chunks)
    segs = [list(range(s, min(s + n, len(chunks)))) for s in range(0, len(chunks), n)]
    sendbufs = sg.Semaphore(opts.get("sendbufs", 2 * n))
    nodes[0].sendbufs = sendbufs
    sg.Actor.create("reader0", w.cpu_hosts[0], reader_actor, w, nodes[0], chunks, sendbufs)
    for i in range(n):
        sg.Actor.create(f"writer{i}", w.cpu_hosts[i], writer_actor, w, nodes[i], len(segs))
        sg.Actor.create(f"wb{i}", w.cpu_hosts[i], writeback_actor, w, nodes[i], total)
        sg.Actor.create(f"sag{i}", w.nodes[i], sag_actor, w, nodes[i], chunks, segs)
        sg.Actor.create(f"commit{i}", w.nodes[i], commit_actor, w, nodes[i], w.agreement())


def sag_actor(w, nd, chunks, segs):
    sg = w.sg
    n = w.n
    me = nd.i
    right = (me + 1) % n
    for si, seg in enumerate(segs):
        blocks = {j: chunks[c][0] for j, c in enumerate(seg)}
        # scatter
        t0 = w.now()
        if me == 0:
            for _ in seg:
                nd.ready_sem.acquire()
                nd.ready.popleft()
            comms = [sg.Mailbox.by_name(f"sc{j}").put_async(si, int(b)) for j, b in blocks.items() if j != 0 and b > 0]
            w.mpi_wait(comms, t0)
            for _ in seg:
                nd.sendbufs.release()
        elif blocks.get(me, 0) > 0:
            c, keep = sg.Mailbox.by_name(f"sc{me}").get_async()
            w.mpi_wait([c], t0)
        # ring allgather of the segment's blocks
        for s in range(n - 1):
            sb = (me - s) % n
            rb = (me - s - 1) % n
            comms = []
            t0 = w.now()
            keep = None
            if blocks.get(rb, 0) > 0:
                c, keep = sg.Mailbox.by_name(f"ag{me}").get_async()
                comms.append(c)
            if blocks.get(sb, 0) > 0:
                comms.append(sg.Mailbox.by_name(f"ag{right}").put_async(si, int(blocks[sb])))
            w.overhead()
            w.mpi_wait(comms, t0)
        nd.land.append(([(b, me == 0 or j == me) for j, b in blocks.items()], None))
        nd.land_sem.release()


def sbcast_children(lst, fanout):
    """Slurm message forwarding: split the node list into `fanout` spans; each span's first node is a
    child and forwards to the rest of its span the same way."""
    out = {}
    def split(src, rest):
        if not rest:
            out.setdefault(src, [])
            return
        k = min(fanout, len(rest))
        q, r = divmod(len(rest), k)
        pos = 0
        kids = []
        for j in range(k):
            ln = q + (1 if j < r else 0)
            span = rest[pos:pos + ln]
            pos += ln
            kids.append(span[0])
            split(span[0], span[1:])
        out[src] = kids
    split(0, list(range(1, lst)))
    return out


def run_sbcast(w, nbytes, opts):
    """Slurm sbcast from the job's first node: read a block (8 MiB), send it down the fanout-8
    forwarding tree, wait for every node's reply, then the next block; no read-ahead, no hashing."""
    sg = w.sg
    n = w.n
    p = w.p
    block = int(opts.get("sbcast_block", 8 << 20))
    blocks = [min(block, nbytes - b * block) for b in range(math.ceil(nbytes / block))]
    kids = sbcast_children(n, int(opts.get("sbcast_fanout", 8)))
    nodes = [Node(w, i) for i in range(n)]
    acks = sg.Semaphore(0)
    for i in range(n):
        sg.Actor.create(f"writer{i}", w.cpu_hosts[i], writer_actor, w, nodes[i], len(blocks), False, 1)
        sg.Actor.create(f"wb{i}", w.cpu_hosts[i], writeback_actor, w, nodes[i], nbytes)
        sg.Actor.create(f"commit{i}", w.nodes[i], commit_actor, w, nodes[i], w.agreement())

    def src():
        for b in blocks:
            w.storage_read(0, b)
            w.work_on(0, b, p["recv_cpu_ns_per_byte"])
            comms = [sg.Mailbox.by_name(f"sb{k}").put_async(b, int(b)) for k in kids.get(0, [])]
            nodes[0].land.append(([(b, True)], None))
            nodes[0].land_sem.release()
            sg.Comm.wait_all(comms)
            for _ in range(n - 1):
                acks.acquire()
            sg.this_actor.sleep_for(p.get("sbcast_block_overhead", 0.0) + 2 * p["node_link_lat"] * max(1, log2c(n)))

    def fwd(i):
        mb = sg.Mailbox.by_name(f"sb{i}")
        for _ in blocks:
            b = mb.get()
            comms = [sg.Mailbox.by_name(f"sb{k}").put_async(b, int(b)) for k in kids.get(i, [])]
            nodes[i].land.append(([(b, False)], None))
            nodes[i].land_sem.release()
            acks.release()
            sg.Comm.wait_all(comms)

    sg.Actor.create("sbcast", w.nodes[0], src)
    for i in range(1, n):
        sg.Actor.create(f"slurmd{i}", w.nodes[i], fwd, i)


def run_every_node_reads(w, chunks, opts):
    sg = w.sg
    n = w.n
    total = sum(s for (s, _) in chunks)
    for i in range(n):
        nd = Node(w, i)
        sendbufs = sg.Semaphore(4)
        nd.sendbufs = sendbufs
        sg.Actor.create(f"reader{i}", w.cpu_hosts[i], reader_actor, w, nd, chunks, sendbufs)
        sg.Actor.create(f"pass{i}", w.cpu_hosts[i], passthrough, w, nd, chunks)
        sg.Actor.create(f"writer{i}", w.cpu_hosts[i], writer_actor, w, nd, len(chunks), True, 1)
        sg.Actor.create(f"wb{i}", w.cpu_hosts[i], writeback_actor, w, nd, total)
        sg.Actor.create(f"commit{i}", w.nodes[i], commit_actor, w, nd, w.agreement())


def passthrough(w, nd, chunks):
    for _ in chunks:
        nd.ready_sem.acquire()
        s, _ = nd.ready.popleft()
        nd.sendbufs.release()
        nd.land.append(([(s, True)], None))
        nd.land_sem.release()


def run_local(w, chunks):
    """One node: the engine's local path (read, hash, write; no MPI)."""
    run_every_node_reads(w, chunks, {})


def simulate(p, algo, n, nbytes, chunk, opts=None):
    """Simulated seconds of one copy (start-up of mpirun included, like the bench's wall times)."""
    opts = dict(opts or {})
    w = World(p, n)
    chunks = chunk_list(nbytes, chunk, opts.get("zero_fraction", 0.0))
    if n == 1 and algo != "sbcast":
        run_local(w, chunks)
    elif algo in ("ring", "ring-round-buffers", "bcast"):
        run_engine(w, chunks, chunk, algo, opts)
    elif algo in ("binomial", "two-tree"):
        run_tree(w, chunks, algo, opts)
    elif algo == "scatter-allgather":
        run_scatter_allgather(w, chunks, opts)
    elif algo == "sbcast":
        run_sbcast(w, nbytes, opts)
    elif algo == "every-node-reads":
        run_every_node_reads(w, chunks, opts)
    else:
        raise ValueError(algo)
    w.e.run()
    body = max(w.done)
    return {"copy": body, "startup": startup(p, n), "total": body + startup(p, n)}
