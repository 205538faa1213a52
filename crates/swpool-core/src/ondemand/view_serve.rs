//! One node's server of a job-wide view (`sw-pool-full view-serve`, one task per node of the
//! background step that task 0 of `sw-pool run --cache DIR` starts in a step of several nodes):
//! the nodes list the tree together, once (each a share of every level's directories,
//! [`job::walk_shared`]), and every node has the same listing; each chunk of the view's virtual
//! image is read from storage by its owner only and reaches the other nodes through the exchange
//! ([`super::exchange`]), with the BLAKE3 its owner computed, checked by the node that asked. The
//! node's `sw-pool-view` (in the job's environment) takes the listing and the bytes through a
//! Unix socket in the user's state directory (`swpool_serve::view::job`).
//!
//! It ends once every node's view has come and gone (each node says so through the exchange's
//! gate, so that no node stops answering while another still reads), or when no view came within
//! `wait`, or on `stop`. A server that fails writes why beside its socket (`SOCKET.failed`), where
//! the node's view looks while it waits.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use swpool_serve::frame::HEAD;
use swpool_serve::socket::Served;
use swpool_serve::view::job::{self, failed_path, Layout, Owned, CHUNK, HASH};
use swpool_serve::view::{Snapshot, Storage};

use super::exchange::{self, Ask, ExchangeStats, Local};
use crate::collective::Collective;
use crate::error::Error;

/// What to serve.
#[derive(Debug, Clone)]
pub struct ViewRequest {
    /// The tree (absolute, canonical: the path the views are mounted over).
    pub tree: PathBuf,
    /// This node's socket (node-local; the same path on every node).
    pub socket: PathBuf,
    /// How long a chunk may take from its owner before the read fails (EIO).
    pub stall: Duration,
    /// How long the node's view may take to come.
    pub wait: Duration,
    /// Bytes of owned chunks kept in memory at most (past it they are read again when asked).
    pub max_kept: u64,
    /// Files of at most this many bytes (`job::small_chunks`, at most `small_total` bytes of them)
    /// are fetched ahead: at the first read of one, this node fetches the others of its directory
    /// too, 8 at once (each read from storage by its owner only, once for the job).
    pub small: u64,
    pub small_total: u64,
}

/// The node's server as its view sees it.
struct NodeServer {
    digest: String,
    /// The listing's bytes as the virtual image begins: its length (u64), then the encoding.
    head: Vec<u8>,
    owned: Arc<Owned>,
    me: usize,
    nodes: usize,
    asks: Sender<Ask>,
    stall: Duration,
    hosts: Vec<String>,
    open: AtomicUsize,
    came: AtomicBool,
    /// Bytes this node's view took, and of them from the other nodes.
    served: AtomicU64,
    from_peers: AtomicU64,
    /// The small files' chunks (`job::small_chunks`) by their directory, and each one's directory.
    small_dirs: HashMap<u32, Vec<u64>>,
    small_dir_of: HashMap<u64, u32>,
    /// Directories whose small files were sent to be fetched ahead.
    dirs_started: Mutex<HashSet<u32>>,
    /// The small files' chunks this node fetched (read if its own, else asked), once each.
    held: Mutex<HashMap<u64, Fetched>>,
    /// Chunks to fetch ahead, for the workers ([`fetch_ahead`]).
    ahead: Mutex<Sender<u64>>,
    /// Chunks fetched ahead of the view's reads.
    fetched_ahead: AtomicU64,
}

/// A chunk fetched once, shared by the reads that wait for it.
type Fetched = Arc<OnceLock<Result<Arc<Vec<u8>>, String>>>;

impl NodeServer {
    /// What this node's server did so far.
    fn stats(&self, exchange: ExchangeStats) -> ViewStats {
        ViewStats {
            exchange,
            storage_bytes: self.owned.storage.bytes.load(Ordering::Relaxed),
            storage_opens: self.owned.storage.opens.load(Ordering::Relaxed),
            served: self.served.load(Ordering::Relaxed),
            from_peers: self.from_peers.load(Ordering::Relaxed),
            ahead: self.fetched_ahead.load(Ordering::Relaxed),
        }
    }

    /// Chunk `i` (`len` bytes): read from storage if this node owns it, else asked of its owner.
    fn fetch(&self, i: u64, len: u32) -> Result<Arc<Vec<u8>>, String> {
        if self.owned.layout.owner(i, self.nodes) == self.me {
            self.owned.chunk(i)
        } else {
            self.ask_peer(i, len).map(Arc::new)
        }
    }

    /// A small file's chunk, fetched once however many read it at once (a failed fetch is not
    /// kept: the next read fetches again).
    fn held(&self, i: u64, len: u32) -> Result<Arc<Vec<u8>>, String> {
        let cell = {
            let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
            h.entry(i).or_default().clone()
        };
        let r = cell.get_or_init(|| self.fetch(i, len)).clone();
        if r.is_err() {
            let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if h.get(&i).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
                h.remove(&i);
            }
        }
        r
    }

    /// At the first read of a small file of directory `dir`, send the directory's other small
    /// files to be fetched ahead (a program that opens one module of a package opens others).
    fn start_dir(&self, dir: u32, except: u64) {
        let first = self
            .dirs_started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(dir);
        if !first {
            return;
        }
        let tx = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
        for &c in self.small_dirs.get(&dir).into_iter().flatten() {
            if c != except {
                let _ = tx.send(c);
            }
        }
    }

    fn ask_peer(&self, i: u64, len: u32) -> Result<Vec<u8>, String> {
        let owner = self.owned.layout.owner(i, self.nodes);
        let host = self.hosts.get(owner).cloned().unwrap_or_default();
        let v = exchange::ask_owner(&self.asks, i, HASH + len as usize, self.stall, &host)
            .map_err(|e| e.message)?;
        let (hash, bytes) = v[HEAD..].split_at(HASH);
        if blake3::hash(bytes).as_bytes() != hash {
            return Err(format!(
                "chunk {i} from {host} does not match the BLAKE3 its owner sent with it: not served"
            ));
        }
        self.from_peers.fetch_add(u64::from(len), Ordering::Relaxed);
        Ok(bytes.to_vec())
    }
}

impl Served for NodeServer {
    fn digest(&self) -> &str {
        &self.digest
    }
    fn read(&self, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        let layout = &self.owned.layout;
        if offset < layout.head {
            let s = offset as usize;
            return self
                .head
                .get(s..s.saturating_add(len as usize))
                .map(<[u8]>::to_vec)
                .ok_or_else(|| format!("{len} bytes at {offset}: past the listing"));
        }
        let i = offset / layout.chunk;
        match layout.piece(&self.owned.snap, i) {
            Some((_, _, plen)) if offset.is_multiple_of(layout.chunk) && plen == len => {}
            _ => return Err(format!("{len} bytes at {offset}: not a chunk of the view")),
        }
        let r = if let Some(&dir) = self.small_dir_of.get(&i) {
            self.start_dir(dir, i);
            self.held(i, len).map(|v| v.to_vec())
        } else {
            self.fetch(i, len).map(|v| v.to_vec())
        };
        if r.is_ok() {
            self.served.fetch_add(u64::from(len), Ordering::Relaxed);
        }
        r
    }
    fn connection(&self, open: bool) {
        if open {
            self.came.store(true, Ordering::Relaxed);
            self.open.fetch_add(1, Ordering::Relaxed);
        } else {
            self.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The owner's answer to a peer: the chunk's BLAKE3, then its bytes. The hash is computed once
/// per chunk, at its first answer, and kept: the nodes that ask for it later get the same one
/// (a chunk read again past `max_kept` whose bytes differ then fails their check: never a mix).
struct Answers {
    owned: Arc<Owned>,
    hashes: Mutex<HashMap<u64, [u8; 32]>>,
}

impl Local for Answers {
    fn answer_into(&self, index: u64, len: u32, out: &mut Vec<u8>) -> Result<(), String> {
        let v = self.owned.chunk(index)?;
        if len as usize != HASH + v.len() {
            return Err(format!(
                "chunk {index} is {} bytes, not {}",
                v.len(),
                (len as usize).saturating_sub(HASH)
            ));
        }
        let kept = self
            .hashes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&index)
            .copied();
        let hash = kept.unwrap_or_else(|| {
            let h = *blake3::hash(&v).as_bytes();
            self.hashes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(index, h);
            h
        });
        out.extend_from_slice(&hash);
        out.extend_from_slice(&v);
        Ok(())
    }
    fn owner(&self, index: u64, nodes: usize) -> usize {
        self.owned.layout.owner(index, nodes)
    }
}

/// Wait until every node got here without spinning (a blocking MPI collective polls a core
/// for as long as it waits: seven nodes waiting for node 0's listing took the CPU its walk
/// and the storage client needed, measured on the testbed: 2,049 requests in 48.7 s on 8 nodes,
/// 6 s on 2): a non-blocking all-gather of one byte, tested every 5 ms.
fn quiet_barrier(
    plane: Option<&(dyn crate::plane::DataPlane + '_)>,
    host: &str,
) -> Result<(), Error> {
    let Some(p) = plane else { return Ok(()) };
    let fail = |e: crate::plane::PlaneError| {
        Error::other(
            crate::ExitStatus::Collective,
            format!("{host}: waiting for the other nodes: {e}"),
        )
    };
    let mine = [1u8];
    let mut all = vec![0u8; p.size()];
    // SAFETY: both buffers live until the request completed (the loop below returns only then,
    // or with the error after which the request is gone).
    let req = unsafe { p.iallgather(mine.as_ptr(), 1, all.as_mut_ptr()) }.map_err(fail)?;
    while !p.test(req).map_err(fail)? {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// Step 1: the tree opened on every node (each lists a share of its directories and the owners
/// read below it).
fn open_tree(job: &dyn Collective, req: &ViewRequest) -> Result<std::os::fd::OwnedFd, Error> {
    rustix::fs::open(
        &req.tree,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        Error::other(
            crate::ExitStatus::BadInput,
            format!("{} on {}: {e}", req.tree.display(), job.hostname()),
        )
    })
}

/// Step 2: the listing, made by all nodes together ([`job::walk_shared`]: each directory listed
/// by one node, `job::Readers`, the reads all-gathered level by level), the same on every node.
fn list_tree(
    job: &dyn Collective,
    req: &ViewRequest,
    root: &std::os::fd::OwnedFd,
    plane: Option<&(dyn crate::plane::DataPlane + '_)>,
) -> Result<(Snapshot, job::Readers), Error> {
    let host = job.hostname();
    let t0 = Instant::now();
    let mut gather = |mine: Vec<u8>| -> Result<Vec<Vec<u8>>, String> {
        quiet_barrier(plane, host).map_err(|e| e.to_string())?;
        job.leaders_all_gather(&mine).map_err(|e| e.to_string())
    };
    let (s, listers) = job::walk_shared(
        std::os::fd::AsFd::as_fd(root),
        &req.tree,
        job.node_index(),
        job.nodes(),
        &mut gather,
    )
    .map_err(|e| Error::other(crate::ExitStatus::BadInput, format!("{e} (on {host})")))?;
    if job.node_index() == 0 {
        let (files, bytes) = s.files();
        tracing::info!(
            "{}: listed once for the job by {} nodes: {} entries, {files} files, {bytes} bytes, {} \
             requests, {:.1} s",
            req.tree.display(),
            job.nodes(),
            s.nodes.len(),
            s.requests,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok((s, listers))
}

/// Step 3: this node's socket, fresh.
fn bind(job: &dyn Collective, sock: &Path) -> Result<std::os::unix::net::UnixListener, Error> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(sock);
    let _ = std::fs::remove_file(failed_path(sock));
    let l = std::os::unix::net::UnixListener::bind(sock).map_err(|e| {
        Error::other(
            crate::ExitStatus::System,
            format!("{} on {}: {e}", sock.display(), job.hostname()),
        )
    })?;
    let _ = std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o600));
    crate::atomic::register_file(sock);
    Ok(l)
}

/// Step 4: the small files by directory (`job::small_chunks`, the same on every node), for
/// [`NodeServer::start_dir`].
fn small_by_dir(owned: &Owned, req: &ViewRequest) -> (HashMap<u32, Vec<u64>>, HashMap<u64, u32>) {
    let (mut dirs, mut dir_of) = (HashMap::<u32, Vec<u64>>::new(), HashMap::new());
    for (i, idx) in job::small_chunks(&owned.snap, &owned.layout, req.small, req.small_total) {
        let dir = owned.snap.nodes[idx as usize].parent;
        dirs.entry(dir).or_default().push(i);
        dir_of.insert(i, dir);
    }
    (dirs, dir_of)
}

/// The workers that fetch small files ahead (8: as many asks in flight), for the server's life.
fn fetch_ahead(server: &Arc<NodeServer>, rx: mpsc::Receiver<u64>) {
    let rx = Arc::new(Mutex::new(rx));
    for _ in 0..8 {
        let (server, rx) = (server.clone(), rx.clone());
        std::thread::spawn(move || loop {
            let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
            let Ok(c) = next else { return };
            let Some((_, _, len)) = server.owned.layout.piece(&server.owned.snap, c) else {
                continue;
            };
            // (a failure is the read's to report, if the program reads it)
            if server.held(c, len).is_ok() {
                server.fetched_ahead.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

/// What a server did, for its last log line.
#[derive(Debug, Default, Clone, Copy)]
pub struct ViewStats {
    pub exchange: ExchangeStats,
    /// Bytes this node read from storage (its own chunks), and requests (opens) for them.
    pub storage_bytes: u64,
    pub storage_opens: u64,
    /// Bytes this node's view took, and of them from other nodes.
    pub served: u64,
    pub from_peers: u64,
    /// Small files' chunks fetched ahead of the view's reads.
    pub ahead: u64,
}

impl ViewStats {
    /// The server's last log line (its storage figures: the exchange's are the caller's to add).
    pub fn line(&self, host: &str, tree: &Path) -> String {
        format!(
            "{host}: view server of {} ends: storage_opens={} storage_bytes={} served={} \
             from_peers={} ahead={} cpu={:.2}s",
            tree.display(),
            self.storage_opens,
            self.storage_bytes,
            self.served,
            self.from_peers,
            self.ahead,
            cpu_seconds()
        )
    }
}

/// This process's CPU time so far (user and system), in seconds: what a server took from the
/// node's ranks.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one struct rusage, which lives on this stack.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The figures of the view server running in this process, for [`figures_line`].
type Figures = Box<dyn Fn() -> String + Send>;
static FIGURES: Mutex<Option<Figures>> = Mutex::new(None);

/// Whether the server's last line was written (by [`figures_line`] or [`claim_end_line`]).
static END_SAID: AtomicBool = AtomicBool::new(false);

/// The last log line of this process's view server, if one runs and its last line was not
/// written yet: for the signal handler (Slurm ends the servers' step with SIGTERM when the job
/// step that started it ends, which may be while the server ends on its own).
pub fn figures_line() -> Option<String> {
    let f = FIGURES.lock().ok()?;
    let line = f.as_ref().map(|f| f())?;
    (!END_SAID.swap(true, Ordering::SeqCst)).then_some(line)
}

/// Whether the caller is the one to write the server's last line (once per server, whether it
/// ended on its own or by a signal).
pub fn claim_end_line() -> bool {
    !END_SAID.swap(true, Ordering::SeqCst)
}

/// Serve (see the module's documentation). `ready` is called once this node's socket is there.
pub fn serve(
    job: &dyn Collective,
    req: &ViewRequest,
    stop: &AtomicBool,
    ready: &dyn Fn(),
) -> Result<ViewStats, Error> {
    let r = serve_inner(job, req, stop, ready);
    if let Err(e) = &r {
        let _ = job::write_failed(&req.socket, &e.to_string());
    }
    r
}

fn serve_inner(
    job: &dyn Collective,
    req: &ViewRequest,
    stop: &AtomicBool,
    ready: &dyn Fn(),
) -> Result<ViewStats, Error> {
    let plane = job.leaders_plane(true);
    let opened = open_tree(job, req);
    job.agree(crate::error::step_part(Some(&opened)))?;
    let root = opened.expect("agreed");
    let listed = list_tree(job, req, &root, plane.as_deref());
    job.agree(crate::error::step_part(Some(&listed)))?;
    let (snap, listers) = listed.expect("agreed");
    let enc = job::encode(&snap);
    let listener = bind(job, &req.socket);
    job.agree(crate::error::step_part(Some(&listener)))?;
    let listener = listener.expect("agreed");
    let layout = Layout::new(&snap, enc.len() as u64, CHUNK).with_owners(&snap, &listers);
    let chunks = layout.chunks();
    let snap = Arc::new(snap);
    let owned = Arc::new(Owned::new(
        Storage::new(root, &req.tree),
        snap,
        layout,
        req.max_kept,
    ));
    let (small_dirs, small_dir_of) = small_by_dir(&owned, req);
    let (ahead_tx, ahead_rx) = mpsc::channel();
    let mut head = (enc.len() as u64).to_le_bytes().to_vec();
    head.extend_from_slice(&enc);
    drop(enc);
    let hosts: Vec<String> = (0..job.nodes()).map(|i| job.leader_host(i)).collect();
    let (tx, rx) = mpsc::channel();
    let server = Arc::new(NodeServer {
        digest: job::digest(&req.tree),
        head,
        owned: owned.clone(),
        me: job.node_index(),
        nodes: job.nodes(),
        asks: tx,
        stall: req.stall,
        hosts,
        open: AtomicUsize::new(0),
        came: AtomicBool::new(false),
        served: AtomicU64::new(0),
        from_peers: AtomicU64::new(0),
        small_dirs,
        small_dir_of,
        dirs_started: Mutex::new(HashSet::new()),
        held: Mutex::new(HashMap::new()),
        ahead: Mutex::new(ahead_tx),
        fetched_ahead: AtomicU64::new(0),
    });
    fetch_ahead(&server, ahead_rx);
    swpool_serve::keep_chunk_buffers(CHUNK);
    {
        let s = server.clone();
        std::thread::spawn(move || swpool_serve::socket::serve(listener, s));
    }
    {
        let (s, host, tree) = (server.clone(), job.hostname().to_string(), req.tree.clone());
        let f: Figures = Box::new(move || {
            format!(
                "sw-pool: {}",
                s.stats(ExchangeStats::default()).line(&host, &tree)
            )
        });
        *FIGURES.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }
    ready();
    let done = AtomicBool::new(false);
    let t0 = Instant::now();
    let stats = std::thread::scope(|s| {
        let (gate_tx, gate_rx) = mpsc::channel::<Vec<u8>>();
        let server = &server;
        let done_ref = &done;
        // this node's part of the gate: its view came and went, or never came
        s.spawn(move || loop {
            std::thread::sleep(Duration::from_millis(100));
            let gone =
                server.came.load(Ordering::Relaxed) && server.open.load(Ordering::Relaxed) == 0;
            let late = !server.came.load(Ordering::Relaxed) && t0.elapsed() > req.wait;
            if late {
                tracing::warn!(
                    "{}: no view of {} came within {} s",
                    server.hosts.get(server.me).cloned().unwrap_or_default(),
                    req.tree.display(),
                    req.wait.as_secs()
                );
            }
            if gone || late || stop.load(Ordering::Relaxed) || done_ref.load(Ordering::Relaxed) {
                let _ = gate_tx.send(vec![u8::from(late)]);
                return;
            }
        });
        let mut on_all = |_all: Vec<u8>| done_ref.store(true, Ordering::Relaxed);
        let r = match &plane {
            Some(p) => exchange::run(
                p.as_ref(),
                Arc::new(Answers {
                    owned: owned.clone(),
                    hashes: Mutex::new(HashMap::new()),
                }),
                rx,
                done_ref,
                chunks,
                HASH as u64 + CHUNK,
                Some(exchange::Gate {
                    mine: gate_rx,
                    all: &mut on_all,
                }),
            ),
            None => {
                let _ = gate_rx.recv();
                Ok(ExchangeStats::default())
            }
        };
        done_ref.store(true, Ordering::Relaxed);
        r
    });
    let _ = std::fs::remove_file(&req.socket);
    crate::atomic::unregister_file(&req.socket);
    FIGURES.lock().unwrap_or_else(|e| e.into_inner()).take();
    let exchange = stats.map_err(|e| {
        Error::other(
            crate::ExitStatus::System,
            format!(
                "{}: the exchange with the other nodes failed: {e}",
                job.hostname()
            ),
        )
    })?;
    Ok(server.stats(exchange))
}
