//! The chunk exchange among the nodes of an on-demand load: each chunk has one owner node
//! (`index mod nodes`, as the copy's split read); a node that needs a chunk it does not own asks
//! its owner, and only the owner ever reads it from shared storage, so each chunk is read from
//! storage at most once per job whatever the number of nodes.
//!
//! Transport: two-sided requests and answers over the [`DataPlane`] (non-blocking sends and
//! receives with tags, completed by `test`), driven by one thread ([`run`], the MPI thread:
//! `MPI_THREAD_FUNNELED`); the node's readers hand it their asks through a channel
//! ([`PeerSource`]) and wait with a stall timeout. The seed's design (one-sided `MPI_Get` from a
//! window each node exposes) needs every chunk in memory at a fixed place on its owner and a
//! progress thread for passive target with Open MPI over TCP; request/answer lets the owner fetch a
//! chunk when first asked and keep it on disk. Nothing a peer sends is trusted: lengths and indices
//! are bounded before use, and every chunk is hashed against the manifest by the asking node's
//! engine ([`swpool_serve::Chunks`]) before it is served.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::time::Duration;

// answers are the same frames as over a node's socket: a head, then the chunk or a message (here at
// most 200 bytes, and never longer than the chunk asked for: the asker's buffer)
use swpool_serve::frame::{Answer, HEAD};
use swpool_serve::{ChunkSource, Chunks};

use crate::plane::{DataPlane, PlaneError, Req};

const TAG_ASK: i32 = 7;
/// Answers to slot `s` come with tag `TAG_ANSWER + s`.
const TAG_ANSWER: i32 = 64;
/// Asks in flight to one owner at once.
pub const SLOTS: usize = 64;
const ASK_LEN: usize = 16;

/// One node's ask for a chunk it does not own.
pub struct Ask {
    index: u64,
    len: usize,
    /// The owner's answer as it arrived: its 5-byte head, then the chunk (not copied out of the
    /// receive buffer: one copy of a chunk fewer, measured as CPU on 8 nodes).
    reply: SyncSender<Result<Vec<u8>, String>>,
}

/// The [`ChunkSource`] of a node's engine in an on-demand load: its own chunks from shared
/// storage, the others from their owners through the exchange.
pub struct PeerSource {
    pub me: usize,
    pub nodes: usize,
    pub chunk_size: u64,
    pub storage: Box<dyn ChunkSource>,
    pub asks: Sender<Ask>,
    /// How long an owner may take to answer (then the read fails: `EIO`, not a hang).
    pub stall: Duration,
    /// Host names by node index, for messages.
    pub hosts: Vec<String>,
}

/// The node that owns chunk `index` among `nodes`: the only one that reads it from storage.
pub fn owner(index: u64, nodes: usize) -> usize {
    (index % nodes as u64) as usize
}

impl Ask {
    /// An ask for `len` bytes of chunk `index`, and where its answer comes: the owner's frame
    /// (its head, then the bytes), or why not.
    pub fn new(index: u64, len: usize) -> (Ask, Receiver<Result<Vec<u8>, String>>) {
        let (tx, rx) = mpsc::sync_channel(1);
        (
            Ask {
                index,
                len,
                reply: tx,
            },
            rx,
        )
    }
}

/// Why an ask of [`ask_owner`] got no chunk.
#[derive(Debug)]
pub struct NoAnswer {
    /// The owner did not answer in time.
    pub late: bool,
    pub message: String,
}

/// Ask chunk `index`'s owner (`host`) through this node's exchange (`asks`) for `len` bytes and
/// wait up to `stall`: the owner's frame (its head, then exactly `len` bytes), or why not.
pub fn ask_owner(
    asks: &Sender<Ask>,
    index: u64,
    len: usize,
    stall: Duration,
    host: &str,
) -> Result<Vec<u8>, NoAnswer> {
    let no = |late, message| NoAnswer { late, message };
    let (ask, rx) = Ask::new(index, len);
    asks.send(ask)
        .map_err(|_| no(false, "the node's exchange with its peers has ended".into()))?;
    match rx.recv_timeout(stall) {
        Ok(Ok(v)) if v.len() == HEAD + len => Ok(v),
        Ok(Ok(v)) => Err(no(
            false,
            format!(
                "{host} answered {} bytes for chunk {index} ({len} asked)",
                v.len().saturating_sub(HEAD)
            ),
        )),
        Ok(Err(m)) => Err(no(false, format!("{host} (its owner): {m}"))),
        // the exchange ended before it sent the ask (or its answer)
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(no(
            false,
            "the node's exchange with its peers has ended".into(),
        )),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(no(
            true,
            format!(
                "{host}, its owner, did not answer within {} s (its server may have ended)",
                stall.as_secs()
            ),
        )),
    }
}

impl ChunkSource for PeerSource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let index = offset / self.chunk_size;
        let owner = owner(index, self.nodes);
        if owner == self.me {
            return self.storage.read_at(offset, buf);
        }
        let host = self.hosts.get(owner).cloned().unwrap_or_default();
        let v = ask_owner(&self.asks, index, buf.len(), self.stall, &host).map_err(|e| {
            let kind = if e.late {
                std::io::ErrorKind::TimedOut
            } else {
                std::io::ErrorKind::Other
            };
            std::io::Error::new(kind, e.message)
        })?;
        buf.copy_from_slice(&v[HEAD..]);
        Ok(())
    }
    fn describe(&self) -> String {
        format!(
            "{} ({} nodes share it, chunk i from node i mod {})",
            self.storage.describe(),
            self.nodes,
            self.nodes
        )
    }
}

/// A buffer the plane reads or writes until its request completes.
struct InFlight {
    req: Req,
    buf: Vec<u8>,
}

/// What [`run`] saw (for `-v` and the tests).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExchangeStats {
    pub asked: u64,
    pub answered: u64,
}

/// Bytes of one node's part in a [`Gate`].
pub const GATE_LEN: usize = 256;

/// One collective step taken while the exchange runs (every node's mount, agreed while the nodes
/// already answer each other's asks: a node's mount needs chunks its peers own). Each node sends
/// its [`GATE_LEN`] bytes through `mine` when ready; once every node has, `all` gets every node's
/// bytes in node order.
pub struct Gate<'a> {
    pub mine: Receiver<Vec<u8>>,
    pub all: &'a mut dyn FnMut(Vec<u8>),
}

/// What answers the peers' asks on this node: the bytes of chunk `index` (`len` of them),
/// appended to `out`.
pub trait Local: Send + Sync {
    fn answer_into(&self, index: u64, len: u32, out: &mut Vec<u8>) -> Result<(), String>;
    /// The node among `nodes` that owns chunk `index` (asks go to it; an ask for a chunk this
    /// node does not own is refused).
    fn owner(&self, index: u64, nodes: usize) -> usize {
        owner(index, nodes)
    }
}

/// An on-demand load's engine answers with its verified chunks.
impl Local for Chunks {
    fn answer_into(&self, index: u64, len: u32, out: &mut Vec<u8>) -> Result<(), String> {
        self.read_into(index * self.chunk_size(), len, out)
            .map_err(|e| e.to_string())
    }
}

/// The answer to a peer's ask as it is sent: its head, then chunk `index` (`len` bytes) read
/// right after it from `local`, or an error's words when the ask is not `ok` to answer or the
/// read failed (never longer than the asker's buffer, the chunk it asked for).
fn answer(local: &dyn Local, index: u64, len: u64, ok: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEAD + len as usize);
    v.resize(HEAD, 0);
    let r = if ok {
        local.answer_into(index, len as u32, &mut v)
    } else {
        Err(format!(
            "chunk {index} ({len} bytes) is not one of this node's to answer"
        ))
    };
    let answer = match r {
        Ok(()) => Answer::Chunk((v.len() - HEAD) as u32),
        Err(m) => {
            let mut b = m.into_bytes();
            b.truncate((len as usize).min(200));
            v.truncate(HEAD);
            v.extend_from_slice(&b);
            Answer::Message(b.len() as u32)
        }
    };
    v[..HEAD].copy_from_slice(&answer.head());
    v
}

/// Hand an answer to this node's ask (`f`, its buffer: head, then the body) to the asker.
fn deliver(mut f: InFlight, a: Ask) {
    let answer = Answer::parse(f.buf[..HEAD].try_into().expect("a head"));
    let len = answer.body_len() as usize;
    let r = if HEAD + len > f.buf.len() {
        Err(format!("an answer of {len} bytes for a chunk of {}", a.len))
    } else if let Answer::Chunk(_) = answer {
        f.buf.truncate(HEAD + len);
        Ok(f.buf)
    } else {
        Err(String::from_utf8_lossy(&f.buf[HEAD..HEAD + len]).into_owned())
    };
    let _ = a.reply.send(r);
}

/// The gate's all-gather in flight: (request, my part, everyone's).
type Gathering = Option<(Req, Vec<u8>, Vec<u8>)>;

/// One step of the gate: start the all-gather once this node's part is ready; hand everyone's
/// parts to `all` once it completed (and drop the gate). Whether anything moved.
fn step_gate(
    plane: &dyn DataPlane,
    gate: &mut Option<Gate<'_>>,
    gathering: &mut Gathering,
    n: usize,
) -> Result<bool, PlaneError> {
    let Some(g) = gate else {
        return Ok(false);
    };
    match gathering {
        None => {
            if let Ok(mut mine) = g.mine.try_recv() {
                mine.resize(GATE_LEN, 0);
                let mut all = vec![0u8; GATE_LEN * n];
                // SAFETY: both buffers are kept in `gathering` until the request completes.
                let req = unsafe { plane.iallgather(mine.as_ptr(), GATE_LEN, all.as_mut_ptr())? };
                *gathering = Some((req, mine, all));
                return Ok(true);
            }
        }
        Some((req, _, _)) => {
            if plane.test(*req)? {
                let (_, _, all) = gathering.take().expect("in flight");
                (g.all)(all);
                *gate = None;
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// On stop: the receives that will never match are cancelled; asks still waiting fail; buffers
/// the plane may still read or write are never freed (until the process ends).
fn stop_all(
    plane: &dyn DataPlane,
    ask_in: HashMap<usize, InFlight>,
    waiting: Waiting,
    gathering: Gathering,
    sends: Vec<InFlight>,
) {
    for (_, f) in ask_in {
        plane.cancel(f.req);
        let _ = plane.test(f.req);
    }
    for (_, (f, a)) in waiting {
        plane.cancel(f.req);
        let _ = plane.test(f.req);
        let _ = a.reply.send(Err("this node's server is stopping".into()));
    }
    if let Some((_, a, b)) = gathering {
        std::mem::forget(a);
        std::mem::forget(b);
    }
    for f in sends {
        if !matches!(plane.test(f.req), Ok(true)) {
            std::mem::forget(f.buf);
        }
    }
}

/// This node's asks in flight, by (owner, slot): the receive of the answer and the ask.
type Waiting = HashMap<(usize, usize), (InFlight, Ask)>;

/// Send the queued asks (`queued`: (owner, ask)) that have a free slot at their owner: the
/// answer's receive posted, then the ask. Those without a slot stay queued. Whether any went.
fn send_asks(
    plane: &dyn DataPlane,
    queued: &mut VecDeque<(usize, Ask)>,
    free: &mut [Vec<usize>],
    waiting: &mut Waiting,
    sends: &mut Vec<InFlight>,
    stats: &mut ExchangeStats,
) -> Result<bool, PlaneError> {
    let mut busy = false;
    let mut later = VecDeque::new();
    while let Some((owner, a)) = queued.pop_front() {
        let Some(slot) = free[owner].pop() else {
            later.push_back((owner, a));
            continue;
        };
        busy = true;
        let mut rbuf = vec![0u8; HEAD + a.len];
        let cap = rbuf.len();
        // SAFETY: `rbuf` moves into `waiting` (its heap buffer stays put) until completion.
        let rreq = unsafe { plane.irecv(rbuf.as_mut_ptr(), cap, owner, TAG_ANSWER + slot as i32)? };
        let mut head = Vec::with_capacity(ASK_LEN);
        head.extend_from_slice(&a.index.to_le_bytes());
        head.extend_from_slice(&(slot as u32).to_le_bytes());
        head.extend_from_slice(&(a.len as u32).to_le_bytes());
        // SAFETY: `head` is kept in `sends` until the send completes.
        let sreq = unsafe { plane.isend(head.as_ptr(), head.len(), owner, TAG_ASK)? };
        sends.push(InFlight {
            req: sreq,
            buf: head,
        });
        waiting.insert(
            (owner, slot),
            (
                InFlight {
                    req: rreq,
                    buf: rbuf,
                },
                a,
            ),
        );
        stats.asked += 1;
    }
    *queued = later;
    Ok(busy)
}

/// What wakes [`run`] at once when it waits: this node's ask, or a worker's answer to a peer.
enum Wake {
    Ask(Ask),
    /// (peer, slot, the answer framed: head, then the chunk or the error's words)
    Answer(usize, usize, Vec<u8>),
}

/// How often the thread that forwards this node's asks to [`run`] looks whether `run` ended.
const FORWARD_CHECK: Duration = Duration::from_millis(100);

/// Sets its flag when dropped: [`run`]'s end, however it ends.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The first wait of an idle [`run`]; each idle turn doubles it up to [`IDLE_MAX`].
const IDLE_FIRST: Duration = Duration::from_micros(50);
/// The longest wait of an idle [`run`] before it tests its requests again: what an ask from a
/// peer may wait, at most, for an owner that had nothing to do. Nothing wakes the thread when a
/// peer's message arrives (the plane is tested, not waited on: a blocking MPI call spins), so
/// each turn costs a test of every request in flight and the MPI library's progress (a poll of
/// its sockets); this node's asks and its workers' answers wake it at once.
const IDLE_MAX: Duration = Duration::from_millis(2);

/// Drive the exchange until `stop`: answer the peers' asks from `local` (this node's engine:
/// its own chunks come from storage once, then from its store) and send this node's asks to their
/// owners. Call it on the thread that may call MPI. `chunks` and `max_len` (bytes of one answer)
/// bound what peers ask.
///
/// An idle turn waits for a [`Wake`] (this node's ask, a worker's answer: either wakes it at
/// once) from [`IDLE_FIRST`], doubled each idle turn, to [`IDLE_MAX`]: a turn that only tests
/// the requests costs CPU, and 16 servers that yielded and slept at most 1 ms took 7.7 of the
/// machine's 32 CPU seconds of an 8 × 4 storm run (bench/results/storm-job-20261129-perf).
pub fn run(
    plane: &dyn DataPlane,
    local: Arc<dyn Local>,
    asks: Receiver<Ask>,
    stop: &AtomicBool,
    chunks: u64,
    max_len: u64,
    mut gate: Option<Gate<'_>>,
) -> Result<ExchangeStats, PlaneError> {
    let (me, n) = (plane.rank(), plane.size());
    let mut gathering: Gathering = None;
    let mut stats = ExchangeStats::default();
    // one posted receive of an ask from every peer
    let mut ask_in: HashMap<usize, InFlight> = HashMap::new();
    let post_ask = |p: usize| -> Result<InFlight, PlaneError> {
        let mut buf = vec![0u8; ASK_LEN];
        // SAFETY: `buf` lives in the returned InFlight, untouched until the request completes.
        let req = unsafe { plane.irecv(buf.as_mut_ptr(), ASK_LEN, p, TAG_ASK)? };
        Ok(InFlight { req, buf })
    };
    for p in (0..n).filter(|p| *p != me) {
        ask_in.insert(p, post_ask(p)?);
    }
    let mut sends: Vec<InFlight> = Vec::new();
    // this node's asks: waiting for a slot, and in flight by (owner, slot)
    let mut queued: VecDeque<(usize, Ask)> = VecDeque::new();
    let mut waiting: Waiting = HashMap::new();
    let mut free: Vec<Vec<usize>> = (0..n).map(|_| (0..SLOTS).rev().collect()).collect();
    // this node's asks and the workers' answers, in one channel: either wakes an idle turn
    let (wake_tx, wake) = mpsc::channel::<Wake>();
    // the forwarding thread ends within FORWARD_CHECK of this exchange's end (also on an error),
    // when the askers are gone, or at a send into this ended exchange; with it goes the receiver
    // of the asks, so that an ask made afterwards fails at once
    let ended = Arc::new(AtomicBool::new(false));
    let _ended = SetOnDrop(ended.clone());
    {
        let tx = wake_tx.clone();
        std::thread::spawn(move || loop {
            match asks.recv_timeout(FORWARD_CHECK) {
                Ok(a) => {
                    if tx.send(Wake::Ask(a)).is_err() {
                        break;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if ended.load(Ordering::Acquire) {
                        break;
                    }
                }
            }
        });
    }
    // answers computed by workers, to send
    let mut answers: Vec<(usize, usize, Vec<u8>)> = Vec::new();
    let mut wait = IDLE_FIRST;
    let mut woken: Option<Wake> = None;
    while !stop.load(Ordering::Relaxed) {
        let mut busy = false;
        busy |= step_gate(plane, &mut gate, &mut gathering, n)?;
        for w in woken.take().into_iter().chain(wake.try_iter()) {
            match w {
                Wake::Ask(a) => queued.push_back((local.owner(a.index, n), a)),
                Wake::Answer(p, slot, buf) => answers.push((p, slot, buf)),
            }
        }
        busy |= send_asks(
            plane,
            &mut queued,
            &mut free,
            &mut waiting,
            &mut sends,
            &mut stats,
        )?;
        // one step of progress for every request in flight: the peers' asks, the answers to
        // this node's asks, the sends
        let peers: Vec<usize> = ask_in.keys().copied().collect();
        let keys: Vec<(usize, usize)> = waiting.keys().copied().collect();
        let mut reqs = Vec::with_capacity(peers.len() + keys.len() + sends.len());
        reqs.extend(peers.iter().map(|p| ask_in[p].req));
        reqs.extend(keys.iter().map(|k| waiting[k].0.req));
        reqs.extend(sends.iter().map(|f| f.req));
        let done = plane.test_some(&reqs)?;
        let (asked_done, rest) = done.split_at(peers.len());
        let (answered_done, sent_done) = rest.split_at(keys.len());
        // the peers' asks
        for (&p, _) in peers.iter().zip(asked_done).filter(|(_, d)| **d) {
            busy = true;
            let f = ask_in.remove(&p).expect("posted");
            let index = u64::from_le_bytes(f.buf[..8].try_into().expect("8"));
            let slot = u32::from_le_bytes(f.buf[8..12].try_into().expect("4")) as usize;
            let len = u32::from_le_bytes(f.buf[12..16].try_into().expect("4")) as u64;
            ask_in.insert(p, post_ask(p)?);
            if slot >= SLOTS {
                continue; // cannot be answered: no tag for it (the asker times out)
            }
            let ok = index < chunks && len <= max_len && local.owner(index, n) == me;
            let tx = wake_tx.clone();
            let local = local.clone();
            std::thread::spawn(move || {
                let _ = tx.send(Wake::Answer(p, slot, answer(&*local, index, len, ok)));
            });
        }
        // answers to this node's asks
        for (&k, _) in keys.iter().zip(answered_done).filter(|(_, d)| **d) {
            busy = true;
            let (f, a) = waiting.remove(&k).expect("waiting");
            free[k.0].push(k.1);
            deliver(f, a);
        }
        // sends done
        let mut k = 0;
        sends.retain(|_| {
            let keep = !sent_done[k];
            k += 1;
            keep
        });
        busy |= sent_done.iter().any(|d| *d);
        for (p, slot, buf) in answers.drain(..) {
            busy = true;
            // SAFETY: `buf` is kept in `sends` until the send completes.
            let req = unsafe { plane.isend(buf.as_ptr(), buf.len(), p, TAG_ANSWER + slot as i32)? };
            sends.push(InFlight { req, buf });
            stats.answered += 1;
        }
        if busy {
            wait = IDLE_FIRST;
        } else {
            // (never disconnected: this thread holds a sender)
            woken = wake.recv_timeout(wait).ok();
            wait = (wait * 2).min(IDLE_MAX);
        }
    }
    stop_all(plane, ask_in, waiting, gathering, sends);
    Ok(stats)
}

#[cfg(test)]
mod tests;
