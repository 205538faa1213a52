//! The job-wide view: one listing and one read of each file from shared storage per job, whatever
//! the number of nodes (`sw-pool run --cache DIR` in a Slurm step of several nodes).
//!
//! The job's view servers (`sw-pool-full view-serve`, one MPI task per node, started by the step's
//! task 0) agree on one **virtual image** of the tree: they walk the tree once, together
//! ([`walk_shared`]: each node reads a share of each level's directories and every node gets every
//! share), so every node holds the same [`Snapshot`] and its [`encode`]ing; every node lays it out
//! the same way ([`Layout`]):
//! the encoding first, then each regular file at an offset aligned to the chunk size, so that a
//! chunk holds bytes of one file only. A file is read from storage by its owner only (a
//! directory's files by one node, or in runs by several: [`Layout::with_owners`]; [`Owned`]: once, checked against the snapshot's size and mtime after the read,
//! hashed with BLAKE3); a node that needs it asks its owner over MPI and checks the hash that
//! comes with it. Each node's `sw-pool-view` takes the snapshot and the files' bytes from its
//! node's server through a Unix socket ([`JobBytes`], a [`FileBytes`]) and serves them as a
//! per-node view does.
//!
//! One version per job: the nodes list one snapshot, and a file is only ever served as that
//! walk saw it (a chunk read after the file changed is refused by its owner, on every node alike,
//! and a chunk read once is kept by its owner and answered the same way to every node).

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::walk::Read;
use super::{FileBytes, Kind, Node, Snapshot, Storage};
use crate::socket::UnixSource;
use crate::ChunkSource;

/// The chunk of the virtual image: what one ask moves between nodes.
pub const CHUNK: u64 = super::PIECE;

mod layout;
pub use layout::{Layout, Readers, RUN, RUN_CHUNKS, RUN_DIRS};

/// Bytes of the BLAKE3 hash that comes before a chunk's bytes in an owner's answer.
pub const HASH: usize = 32;
const MAGIC: &[u8; 8] = b"swpview1";
/// The longest name and symlink target an encoding may carry.
const MAX_NAME: usize = 4096;

/// What a client of a job's view server names when it connects.
pub fn digest(tree: &Path) -> String {
    format!("sw-pool-view {}", tree.display())
}

/// Where a node's server that failed says why, beside its socket.
pub fn failed_path(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".failed");
    PathBuf::from(s)
}

/// Write down beside `socket` ([`failed_path`]) why its server will not serve: whole or not at
/// all (a temporary name of this process's, renamed), since the node's view reads it as soon as
/// it is there. No lock is taken (not `swpool_sys::atomic`'s registry): the servers' watcher
/// calls it in a forked child.
pub fn write_failed(socket: &Path, why: &str) -> std::io::Result<()> {
    let dest = failed_path(socket);
    let mut tmp = dest.clone().into_os_string();
    tmp.push(format!(".{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let r = std::fs::write(&tmp, why).and_then(|()| std::fs::rename(&tmp, &dest));
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

fn put_bytes(v: &mut Vec<u8>, b: &[u8]) {
    v.extend_from_slice(&(b.len() as u32).to_le_bytes());
    v.extend_from_slice(b);
}

/// The snapshot as bytes: every node in order (parent index, name, kind, flags, permission bits,
/// size, mtime, inode, links, owner, group, symlink target). The children lists and paths are
/// rebuilt from the parents and names by [`decode`].
pub fn encode(s: &Snapshot) -> Vec<u8> {
    let mut v = Vec::with_capacity(64 + s.nodes.len() * 80);
    v.extend_from_slice(MAGIC);
    v.extend_from_slice(&(s.nodes.len() as u32).to_le_bytes());
    v.extend_from_slice(&s.requests.to_le_bytes());
    for n in &s.nodes {
        v.extend_from_slice(&n.parent.to_le_bytes());
        put_node(
            &mut v,
            n.path.file_name().map(|f| f.as_bytes()).unwrap_or(b""),
            n,
        );
    }
    v
}

/// An entry's name and what `lstat` said of it (all but its parent and path).
fn put_node(v: &mut Vec<u8>, name: &[u8], n: &Node) {
    put_bytes(v, name);
    v.push(match n.kind {
        Kind::Dir => 0,
        Kind::File => 1,
        Kind::Symlink => 2,
        Kind::Other => 3,
    });
    v.push(u8::from(n.unreadable));
    v.extend_from_slice(&n.perm.to_le_bytes());
    v.extend_from_slice(&n.size.to_le_bytes());
    v.extend_from_slice(&n.mtime.0.to_le_bytes());
    v.extend_from_slice(&n.mtime.1.to_le_bytes());
    v.extend_from_slice(&n.ino.to_le_bytes());
    v.extend_from_slice(&n.nlink.to_le_bytes());
    v.extend_from_slice(&n.uid.to_le_bytes());
    v.extend_from_slice(&n.gid.to_le_bytes());
    put_bytes(v, &n.target);
}

/// What [`put_node`] wrote, checked (entry `i` in messages): its name and the entry, with no
/// path, parent or children yet.
fn get_node(c: &mut Cursor<'_>, i: usize) -> Result<(Vec<u8>, Node), String> {
    let name = c.bytes()?.to_vec();
    let kind = match c.u8()? {
        0 => Kind::Dir,
        1 => Kind::File,
        2 => Kind::Symlink,
        3 => Kind::Other,
        k => return Err(format!("entry {i}: kind {k}")),
    };
    let unreadable = c.u8()? != 0;
    let perm = c.u16()? & 0o7777;
    let size = c.u64()?;
    let mtime = (c.u64()? as i64, c.u32()?);
    if mtime.1 >= 1_000_000_000 {
        return Err(format!("entry {i}: mtime nanoseconds {}", mtime.1));
    }
    let (ino, nlink, uid, gid) = (c.u64()?, c.u32()?, c.u32()?, c.u32()?);
    let target = c.bytes()?.to_vec();
    let node = Node {
        path: PathBuf::new(),
        kind,
        perm,
        size,
        mtime,
        ino,
        nlink,
        uid,
        gid,
        target,
        children: Vec::new(),
        unreadable,
        parent: 0,
    };
    Ok((name, node))
}

/// Whether `name` is one path component.
fn one_component(name: &[u8]) -> bool {
    !(name.is_empty() || name == b"." || name == b".." || name.contains(&b'/'))
}

/// A bounded reader of an encoding.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("the snapshot's encoding ends early".into());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        if n > MAX_NAME {
            return Err(format!(
                "a name or link target of {n} bytes in the snapshot"
            ));
        }
        self.take(n)
    }
}

/// The snapshot [`encode`] made, checked: every parent an earlier directory, every name a single
/// path component, unique in its directory, at most [`super::MAX_ENTRIES`] nodes.
pub fn decode(b: &[u8]) -> Result<Snapshot, String> {
    let mut c = Cursor(b);
    if c.take(8)? != MAGIC {
        return Err("not a sw-pool view snapshot".into());
    }
    let count = c.u32()? as usize;
    if count == 0 || count > super::MAX_ENTRIES {
        return Err(format!("a snapshot of {count} entries"));
    }
    let requests = c.u64()?;
    let mut nodes: Vec<Node> = Vec::with_capacity(count.min(b.len() / 40 + 1));
    for i in 0..count {
        let parent = c.u32()?;
        let (name, mut node) = get_node(&mut c, i)?;
        node.parent = parent;
        if i == 0 {
            if parent != 0 || !name.is_empty() || node.kind != Kind::Dir {
                return Err("the snapshot's first entry is not its root directory".into());
            }
        } else {
            let p = nodes
                .get(parent as usize)
                .filter(|p| p.kind == Kind::Dir)
                .ok_or_else(|| format!("entry {i}: parent {parent} is no earlier directory"))?;
            if !one_component(&name) {
                return Err(format!(
                    "entry {i}: the name {:?}",
                    String::from_utf8_lossy(&name)
                ));
            }
            node.path = p.path.join(std::ffi::OsStr::from_bytes(&name));
        }
        nodes.push(node);
        if i > 0 {
            nodes[parent as usize].children.push((name, i as u32));
        }
    }
    if !c.0.is_empty() {
        return Err(format!("{} bytes after the snapshot", c.0.len()));
    }
    for n in &mut nodes {
        n.children.sort_by(|a, b| a.0.cmp(&b.0));
        if n.children.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(format!("{}: a name listed twice", n.path.display()));
        }
    }
    Ok(Snapshot { nodes, requests })
}

/// One node's reads of a level of the shared walk ([`walk_shared`]): for each directory it read,
/// its index in the level (u32), the requests it cost (u64) and its read: 0 and its entries
/// (count u32, then each as in [`encode`] without the parent), 1 (it may not be read) or 2 and
/// why not.
pub fn pack_level(reads: &[Option<(Read, u64)>]) -> Vec<u8> {
    let mut v = Vec::new();
    for (k, r) in reads.iter().enumerate() {
        let Some((r, n)) = r else { continue };
        v.extend_from_slice(&(k as u32).to_le_bytes());
        v.extend_from_slice(&n.to_le_bytes());
        match r {
            Ok(Some(entries)) => {
                v.push(0);
                v.extend_from_slice(&(entries.len() as u32).to_le_bytes());
                for e in entries {
                    put_node(
                        &mut v,
                        e.path.file_name().map(|f| f.as_bytes()).unwrap_or(b""),
                        e,
                    );
                }
            }
            Ok(None) => v.push(1),
            Err(why) => {
                v.push(2);
                let why = &why.as_bytes()[..why.len().min(MAX_NAME)];
                put_bytes(&mut v, why);
            }
        }
    }
    v
}

/// What [`pack_level`] made on another node, checked into `out` (one place per directory of the
/// level `dirs`): each directory one `may` allows (that node's to read), once, its names single
/// path components.
pub fn unpack_level(
    b: &[u8],
    dirs: &[PathBuf],
    may: &dyn Fn(usize) -> bool,
    out: &mut [Option<(Read, u64)>],
) -> Result<(), String> {
    let mut c = Cursor(b);
    while !c.0.is_empty() {
        let k = c.u32()? as usize;
        let n = c.u64()?;
        if k >= dirs.len() || k >= out.len() || !may(k) || out[k].is_some() {
            return Err(format!("directory {k} of the level is not one it may send"));
        }
        let r = match c.u8()? {
            0 => {
                let count = c.u32()? as usize;
                // an entry takes 50 bytes at least: no count larger than the bytes allow
                if count > c.0.len() / 50 || count > super::MAX_ENTRIES {
                    return Err(format!("{}: {count} entries", dirs[k].display()));
                }
                let mut entries = Vec::with_capacity(count);
                for i in 0..count {
                    let (name, mut node) = get_node(&mut c, i)?;
                    if !one_component(&name) {
                        return Err(format!(
                            "{}: the name {:?}",
                            dirs[k].display(),
                            String::from_utf8_lossy(&name)
                        ));
                    }
                    node.path = dirs[k].join(std::ffi::OsStr::from_bytes(&name));
                    entries.push(node);
                }
                Ok(Some(entries))
            }
            1 => Ok(None),
            2 => Err(String::from_utf8_lossy(c.bytes()?).into_owned()),
            x => return Err(format!("{}: read status {x}", dirs[k].display())),
        };
        out[k] = Some((r, n));
    }
    Ok(())
}

/// The listing of the tree below `root`, made by the job's `nodes` nodes together, this one being
/// node `me`: the walk goes level by level (as [`Snapshot::walk`]); a directory is read by one
/// node only ([`Readers`]: the one that read its parent, or the next for runs of many), and `gather` sends this node's reads ([`pack_level`]) to every
/// node and gives every node's, in node order. Every node assembles the same snapshot; a
/// directory one node could not read fails the walk on every node alike. Spread over the nodes'
/// own storage clients, the metadata round trips go in parallel. The snapshot comes with the
/// node that listed each directory (for [`Layout::with_owners`]).
pub fn walk_shared(
    root: std::os::fd::BorrowedFd<'_>,
    what: &Path,
    me: usize,
    nodes: usize,
    gather: &mut dyn FnMut(Vec<u8>) -> Result<Vec<Vec<u8>>, String>,
) -> Result<(Snapshot, Readers), String> {
    let nodes = nodes.max(1);
    let mut readers = Readers::new(nodes);
    let snap = super::walk::walk_levels(root, what, &mut |dirs| {
        let by = readers.level(dirs);
        let mine =
            super::walk::read_level(root, what, dirs, &|k| by[k] == me, super::walk::THREADS);
        let parts = gather(pack_level(&mine))?;
        if parts.len() != nodes {
            return Err(format!("{} nodes' reads for {nodes} nodes", parts.len()));
        }
        let mut all: Vec<Option<(Read, u64)>> = (0..dirs.len()).map(|_| None).collect();
        for (node, part) in parts.iter().enumerate() {
            unpack_level(part, dirs, &|k| by[k] == node, &mut all)
                .map_err(|e| format!("the listing from node {node}: {e}"))?;
        }
        all.into_iter()
            .enumerate()
            .map(|(k, r)| r.ok_or_else(|| format!("{}: no node listed it", dirs[k].display())))
            .collect()
    })?;
    Ok((snap, readers))
}

/// A chunk read once (or refused once), shared by the asks that wait for it.
type Cell = Arc<OnceLock<Result<Arc<Vec<u8>>, String>>>;

/// The chunks of a job's view this node owns, read from storage once each and kept (up to a
/// bound; past it they are read again when asked, checked against the snapshot as the first time).
pub struct Owned {
    pub storage: Storage,
    pub snap: Arc<Snapshot>,
    pub layout: Layout,
    kept: Mutex<HashMap<u64, Cell>>,
    kept_bytes: AtomicU64,
    max_kept: u64,
    said_full: AtomicBool,
}

impl Owned {
    pub fn new(storage: Storage, snap: Arc<Snapshot>, layout: Layout, max_kept: u64) -> Owned {
        Owned {
            storage,
            snap,
            layout,
            kept: Mutex::new(HashMap::new()),
            kept_bytes: AtomicU64::new(0),
            max_kept,
            said_full: AtomicBool::new(false),
        }
    }

    /// Chunk `i`'s bytes, read from storage at the first ask (one read however many ask at once).
    pub fn chunk(&self, i: u64) -> Result<Arc<Vec<u8>>, String> {
        let (idx, off, len) = self
            .layout
            .piece(&self.snap, i)
            .ok_or_else(|| format!("chunk {i} holds no file's bytes"))?;
        let node = &self.snap.nodes[idx as usize];
        let cell = {
            let mut k = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            k.entry(i).or_default().clone()
        };
        let mut fresh = false;
        let r = cell
            .get_or_init(|| {
                fresh = true;
                self.storage
                    .read_piece(node, off, len)
                    .map(Arc::new)
                    .map_err(|e| format!("{}: {e}", node.path.display()))
            })
            .clone();
        // (a refusal stays: a file changed on storage stays refused on every node)
        if let (true, Ok(v)) = (fresh, &r) {
            let n = v.len() as u64;
            if self.kept_bytes.fetch_add(n, Ordering::Relaxed) + n > self.max_kept {
                // not kept: the next ask reads it again
                self.kept_bytes.fetch_sub(n, Ordering::Relaxed);
                self.kept
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&i);
                if !self.said_full.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "{}: more than {} bytes of this node's chunks read: the next are not \
                         kept (read from storage again when asked again)",
                        self.storage.describe(),
                        self.max_kept
                    );
                }
            }
        }
        r
    }
}

/// The chunks of the small files (at most `small` bytes each, `total` bytes in all, in the
/// listing's order): the same on every node. At the first read of one, a node's server fetches
/// the others of its directory too (each read from storage by its owner only), so that a job
/// that opens many small files (Python's modules) waits for no storage request and no peer at
/// most opens, and a directory the job never reads in is never read.
///
/// Not among them (each still read once per job, when first opened):
/// - a Python source whose compiled module lies beside it (`__pycache__/NAME.*.pyc`): Python
///   reads the compiled one and only `stat`s the source (reading every small file of a venv of
///   numpy and scipy made the start cost as much as the imports straight from storage:
///   bench/results/pyenv-job-20261129-0445);
/// - what programs do not open when they run ([`not_run`]): test suites (a `tests` or `test`
///   directory), type stubs, C and Cython sources and headers, documents. Of numpy's 988 files of
///   at most 64 KiB (pip, 2026-11-29), 744 are such, and `import numpy` opens 84 files.
///
/// Each as (its chunk, its file's node index).
pub fn small_chunks(snap: &Snapshot, layout: &Layout, small: u64, total: u64) -> Vec<(u64, u32)> {
    let mut sum = 0u64;
    let mut out = Vec::new();
    for (i, n) in snap.nodes.iter().enumerate() {
        if n.kind != Kind::File || n.size == 0 || n.size > small.min(layout.chunk) {
            continue;
        }
        if compiled_beside(snap, n) || not_run(&n.path) {
            continue;
        }
        if sum + n.size > total {
            break;
        }
        if let Some(start) = layout.start(i as u32) {
            sum += n.size;
            out.push((start / layout.chunk, i as u32));
        }
    }
    out
}

/// Whether the file at `path` (below the tree) is one programs do not open when they run: in a
/// `tests` or `test` directory, or a type stub, C, C++, Cython or Fortran source or header, a
/// static library, or a document (Markdown, reStructuredText; see [`small_chunks`]).
pub fn not_run(path: &Path) -> bool {
    const EXT: &[&str] = &[
        "pyi", "h", "hpp", "hh", "c", "cc", "cpp", "cxx", "pxd", "pyx", "pxi", "f", "f90", "a",
        "la", "md", "rst",
    ];
    let in_tests = path
        .parent()
        .into_iter()
        .flat_map(|p| p.components())
        .any(|c| matches!(c.as_os_str().as_bytes(), b"tests" | b"test"));
    in_tests
        || path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXT.contains(&e))
}

/// Whether `n` is `NAME.py` with a `__pycache__/NAME.*.pyc` in its directory.
fn compiled_beside(snap: &Snapshot, n: &Node) -> bool {
    let Some(stem) = n
        .path
        .file_name()
        .and_then(|f| f.as_bytes().strip_suffix(b".py"))
    else {
        return false;
    };
    let Ok(Some(cache)) = snap.lookup(n.parent, b"__pycache__") else {
        return false;
    };
    let c = &snap.nodes[cache as usize];
    let mut prefix = stem.to_vec();
    prefix.push(b'.');
    let from = c
        .children
        .partition_point(|(name, _)| name.as_slice() < prefix.as_slice());
    c.children[from..]
        .iter()
        .take_while(|(name, _)| name.starts_with(&prefix))
        .any(|(name, _)| name.ends_with(b".pyc"))
}

/// The files' bytes from this node's server of the job's view (see the module's documentation).
pub struct JobBytes {
    src: UnixSource,
    layout: Layout,
    index: HashMap<PathBuf, u32>,
    /// Held for the view's life: the server knows the view is there until it closes.
    _presence: UnixStream,
    what: String,
    /// Bytes asked of the node's server.
    pub bytes: AtomicU64,
}

impl JobBytes {
    /// Connect to the node's server at `sock` (waiting up to `wait` for it: the servers start as a
    /// step of their own, or for its word of failure beside the socket, [`failed_path`]) serving
    /// `tree`, and take the snapshot from it.
    pub fn connect(
        sock: &Path,
        tree: &Path,
        wait: Duration,
        stall: Duration,
    ) -> Result<(JobBytes, Snapshot), String> {
        let src = UnixSource::new(sock, stall, &digest(tree));
        let t0 = Instant::now();
        let failed = failed_path(sock);
        let mut presence = loop {
            if let Ok(why) = std::fs::read_to_string(&failed) {
                return Err(format!(
                    "the job's view server of {}: {why}",
                    tree.display()
                ));
            }
            match src.connect() {
                Ok(s) => break s,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                    ) && t0.elapsed() < wait =>
                {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => {
                    return Err(format!(
                        "the job's view server for {} ({}): {e}",
                        tree.display(),
                        sock.display()
                    ))
                }
            }
        };
        let ask = |s: &mut UnixStream, offset: u64, len: usize| -> Result<Vec<u8>, String> {
            let mut b = vec![0u8; len];
            crate::socket::ask(s, offset, &mut b)
                .map_err(|e| format!("the snapshot from {}: {e}", sock.display()))?;
            Ok(b)
        };
        let len = u64::from_le_bytes(ask(&mut presence, 0, 8)?.try_into().expect("8"));
        if len > 1 << 32 {
            return Err(format!("{}: a snapshot of {len} bytes", sock.display()));
        }
        let mut enc = Vec::with_capacity(len as usize);
        while (enc.len() as u64) < len {
            let n = (len - enc.len() as u64).min(CHUNK) as usize;
            enc.extend(ask(&mut presence, 8 + enc.len() as u64, n)?);
        }
        let snap = decode(&enc).map_err(|e| format!("{}: {e}", sock.display()))?;
        let layout = Layout::new(&snap, len, CHUNK);
        let index = snap
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.kind == Kind::File)
            .map(|(i, n)| (n.path.clone(), i as u32))
            .collect();
        Ok((
            JobBytes {
                src,
                layout,
                index,
                _presence: presence,
                what: format!("the job's view server ({})", sock.display()),
                bytes: AtomicU64::new(0),
            },
            snap,
        ))
    }
}

impl JobBytes {
    /// `len` bytes of file `node` at `offset` (within the file), chunk by chunk from the server.
    fn read(&self, node: &Node, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        if offset.checked_add(len).is_none_or(|e| e > node.size) {
            return Err(format!("bytes {offset}+{len} are past the file's end"));
        }
        let mut v = vec![0u8; len as usize];
        if len == 0 {
            return Ok(v);
        }
        let idx = self
            .index
            .get(&node.path)
            .ok_or("not a file of the job's snapshot")?;
        let start = self
            .layout
            .start(*idx)
            .ok_or("no bytes in the job's view")?;
        for (k, part) in v.chunks_mut(self.layout.chunk as usize).enumerate() {
            self.src
                .read_at(start + offset + k as u64 * self.layout.chunk, part)
                .map_err(|e| e.to_string())?;
        }
        self.bytes.fetch_add(len, Ordering::Relaxed);
        Ok(v)
    }
}

impl FileBytes for JobBytes {
    fn fetch(&self, node: &Node) -> Result<Vec<u8>, String> {
        self.read(node, 0, node.size)
    }
    fn fetch_piece(&self, node: &Node, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        // (a piece is one chunk of the image: the view's pieces are the chunks)
        self.read(node, offset, u64::from(len))
    }
    fn describe(&self) -> String {
        self.what.clone()
    }
}

#[cfg(test)]
mod tests;
