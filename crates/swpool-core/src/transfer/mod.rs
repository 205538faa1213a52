//! The broadcast engine (`sw-pool cp`, `scalable-fs-cp`): copy a file or a directory from shared
//! storage to node-local storage on every node of an MPI job, reading each data byte once.
//!
//! [`copy`] is collective: every rank of the job calls it; only the node leaders (one per node,
//! from `MPI_Comm_split_type(SHARED)`) do I/O; the other ranks wait for their leader's outcome and
//! return it. Steps (DESIGN.md "The main job", 2–6):
//!
//! 1. **Identity** (leader 0 reads SRC's metadata and, for a pool, its trailer; every leader checks its
//!    DEST): a node holds an identical DEST when
//!    - *pool*: DEST has SRC's length and SRC's exact trailer (manifest with its content digest,
//!      signature, footer) — DEST was verified chunk by chunk against that manifest when written;
//!    - *plain file*: DEST carries the stamp written at copy time (xattr `user.sw-pool.cp`) naming
//!      SRC's size and mtime (ns) and DEST's own size and mtime, and all four still match (rsync's
//!      quick check, plus a guard against DEST being modified since);
//!    - *directory*: the same stamp on DEST's root, with a signature over SRC's tree metadata (paths,
//!      types, modes, sizes, mtimes, link targets) instead of the mtime.
//!
//!    When every node holds it, nothing else happens: no byte of SRC's data is read. Otherwise only
//!    the leaders that lack it take part in the rest.
//! 2. **Preflight** on every receiving leader: SRC opens for reading, DEST's directory exists and
//!    takes the temporary file, enough free space; one agreement, one message naming the node.
//! 3. **Split reading and distribution** ([`engine`]): chunks that hold data (pool: from the manifest;
//!    plain file: SEEK_DATA, then all-zero chunks found when read and never sent), each read once by
//!    one leader, moved with non-blocking MPI in pipelined rounds of bounded memory (reader and
//!    writer threads around the MPI thread, several rounds in flight; [`plan`], [`engine`]),
//!    verified (BLAKE3 against the manifest, or against the reader's hash from the round
//!    header) before being written sparse with `pwrite`.
//! 4. **Commit**: fsync, agreement, rename on every node only if all succeeded; otherwise every node
//!    removes its temporary and every rank returns the same error.
//!
//! One receiving node: a local sparse copy, no MPI traffic. Directories: a tar stream produced by one
//! reader from the tree (no archive on disk), broadcast in chunks, extracted by every node into a
//! temporary directory renamed on success ([`dir`]).
//!
//! A stall watchdog ([`watchdog`]) turns a dead or hung peer into an error in bounded time.

mod dir;
mod engine;
pub mod job;
pub mod plan;
pub mod watchdog;

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use serde::{Deserialize, Serialize};

use crate::atomic::TempOutput;
use crate::error::ExitStatus;
use crate::pool::{Manifest, ManifestError, Pool};
pub use job::Job;
use plan::Chunk;

/// Errors of the broadcast engine. Messages name the node (hostname), the rank and the path.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// MPI could not be set up.
    #[error("MPI: {0}")]
    Mpi(String),
    /// The copy failed (on this node or another one: the message names it). Every rank of the job
    /// gets the same message.
    #[error("{message}")]
    Failed { message: String, status: ExitStatus },
    /// A step failed on one or more nodes: every rank gets the same failures.
    #[error(transparent)]
    Agreed(#[from] Agreed),
}

impl TransferError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            TransferError::Mpi(_) => ExitStatus::System,
            TransferError::Failed { status, .. } => *status,
            TransferError::Agreed(a) => a.exit_status(),
        }
    }
}

/// How data moves among the leaders (measured on the testbed: see `bench/results/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// One `MPI_Iallgatherv` per round (every reader's chunk to every leader).
    Allgather,
    /// One `MPI_Ibcast` per reader per round.
    Bcast,
    /// A pipelined ring of `MPI_Isend`/`MPI_Irecv` per round: every chunk travels the ring of
    /// leaders, each forwarding what it received from its left neighbour to its right one.
    Ring,
}

impl Algorithm {
    /// `SW_POOL_CP_ALGORITHM` (`ring`, `allgather` or `bcast`), else the default.
    pub fn from_env() -> Algorithm {
        match std::env::var("SW_POOL_CP_ALGORITHM").as_deref() {
            Ok("bcast") => Algorithm::Bcast,
            Ok("allgather") => Algorithm::Allgather,
            Ok("ring") => Algorithm::Ring,
            _ => Algorithm::DEFAULT,
        }
    }
    /// Measured on the testbed (1 GiB, caps 400/800 Mbit, bench/cp-probe.sh and bench/results/):
    /// the pipelined ring is a little faster than the `MPI_Iallgatherv` (N = 8: 29.8 s vs 31.5 s;
    /// N = 2: 27.0 s vs 27.9 s) and far faster than one `MPI_Ibcast` per reader (N = 8: 57 s); it
    /// also keeps one TCP stream per neighbour instead of one per peer.
    pub const DEFAULT: Algorithm = Algorithm::Ring;
}

/// `SW_POOL_BENCH_NO_VERIFY=1`: a **benchmark switch, not a user option** (no flag, no config key,
/// not in `--help`; honoured by `sw-pool cp` only, never by `load`). The file pipeline then neither
/// hashes nor checks any chunk (zero detection and sparse writes stay), so that
/// `bench/cp-verify.sh` can measure the broadcast with verification ÷ without (issue 6). A copy made
/// this way is NOT verified; never set it outside a benchmark.
pub fn bench_no_verify() -> bool {
    std::env::var_os("SW_POOL_BENCH_NO_VERIFY").is_some_and(|v| v == "1")
}

/// A progress callback: `(bytes done, bytes total)`, called on world rank 0 only.
pub type ProgressSink = Arc<dyn Fn(u64, u64) + Send + Sync>;

/// Options of [`copy`].
#[derive(Clone)]
pub struct CopyOptions {
    /// Transfer chunk size for plain files and directories (default 1 MiB; 4 KiB ..= 32 MiB). Pools
    /// always move in their manifest's chunks.
    pub chunk_size: Option<u64>,
    /// Report progress to `progress_sink` (world rank 0 only).
    pub progress: bool,
    pub progress_sink: Option<ProgressSink>,
    /// Check each chunk a reader reads from a pool against the manifest before sending it.
    pub verify_source_chunks: bool,
    /// Hash and check every chunk (reader and receivers). Always on, except that `sw-pool cp`
    /// turns it off under the benchmark switch [`bench_no_verify`].
    pub verify_chunks: bool,
    /// Distribution algorithm.
    pub algorithm: Algorithm,
    /// A rank that sees no progress for this long gives up (exit 8) and removes its temporaries.
    pub stall_timeout: Duration,
    /// The pool the trust policy authorized (`load`): the copy moves exactly its bytes or fails on
    /// every node with "changed on shared storage since it was checked".
    pub authorized: Option<Authorized>,
}

/// A pool as it was when the trust policy checked it: its length and its trailer bytes (manifest
/// with every chunk hash, signature block, footer). Every reader checks that the file it opens
/// still ends in these bytes, and every chunk is checked against the manifest they hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authorized {
    pub len: u64,
    pub image_size: u64,
    pub tail: Vec<u8>,
}

impl Authorized {
    /// The trailer of an opened pool, read from its open file handle.
    pub fn of(pool: &Pool) -> Result<Authorized, crate::pool::ManifestError> {
        Ok(Authorized {
            len: pool.file_len,
            image_size: pool.manifest.image_size,
            tail: pool.tail()?,
        })
    }

    fn changed(src: &Path) -> (ExitStatus, String) {
        bad(
            ExitStatus::InvalidPool,
            format!(
                "{} changed on shared storage since it was checked; run load again",
                src.display()
            ),
        )
    }

    /// Node 0's view of SRC is the authorized pool.
    fn check(&self, src: &Path, info: &SrcInfo) -> Local<()> {
        let same = info.kind == Kind::Pool
            && info.len == self.len
            && info.tail_hex.as_deref() == Some(hex::encode(&self.tail).as_str());
        if same {
            Ok(())
        } else {
            Err(Self::changed(src))
        }
    }

    /// A reader's open SRC still ends in the authorized trailer.
    fn check_file(&self, src: &Path, f: &File) -> Local<()> {
        use std::os::unix::fs::FileExt;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let mut tail = vec![0u8; self.tail.len()];
        if len != self.len
            || f.read_exact_at(&mut tail, self.image_size).is_err()
            || tail != self.tail
        {
            return Err(Self::changed(src));
        }
        Ok(())
    }
}

impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            chunk_size: None,
            progress: false,
            progress_sink: None,
            verify_source_chunks: true,
            verify_chunks: true,
            algorithm: Algorithm::from_env(),
            stall_timeout: watchdog::default_timeout(),
            authorized: None,
        }
    }
}

impl std::fmt::Debug for CopyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyOptions")
            .field("chunk_size", &self.chunk_size)
            .field("progress", &self.progress)
            .field("verify_source_chunks", &self.verify_source_chunks)
            .field("verify_chunks", &self.verify_chunks)
            .field("algorithm", &self.algorithm)
            .field("stall_timeout", &self.stall_timeout)
            .finish()
    }
}

/// Wall time of each phase on this rank's leader (world rank 0's figures are the ones printed).
/// `read`, `verify` and `write` are time spent in those operations; `distribute` is the rest of the
/// transfer loop (waiting for the network).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Phases {
    pub preflight: Duration,
    pub read: Duration,
    pub distribute: Duration,
    pub write: Duration,
    pub verify: Duration,
    pub commit: Duration,
    pub total: Duration,
    /// `distribute` is the wall time of the pipelined transfer, and `read`, `verify` and `write`
    /// (summed over this leader's threads) overlapped it.
    #[serde(default)]
    pub overlapped: bool,
    /// Within `distribute`: time the MPI thread waited for this leader's own chunks from SRC.
    #[serde(default)]
    pub wait_src: Duration,
    /// Within `distribute`: time the MPI thread waited for verify + write to free a round buffer.
    #[serde(default)]
    pub wait_dest: Duration,
}

/// What [`copy`] did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CopyReport {
    /// Every node already held an identical DEST: nothing was read or sent.
    pub skipped_all: bool,
    /// Nodes in the job.
    pub nodes: usize,
    /// Nodes that received DEST (the others already held it).
    pub nodes_received: usize,
    /// `file`, `pool` or `directory`.
    pub kind: String,
    /// SRC's size (directories: bytes of the tar stream).
    pub bytes_total: u64,
    /// Bytes that had to move (data chunks; holes and zero chunks excluded).
    pub bytes_data: u64,
    /// Bytes read from SRC by all leaders together (each data byte once).
    pub bytes_read_from_src: u64,
    /// Bytes the readers fed into the distribution (all leaders together; zero chunks are not sent).
    pub bytes_sent: u64,
    /// Bytes written to DEST by all receiving leaders together.
    pub bytes_written: u64,
    /// Chunk size used.
    pub chunk_size: u64,
    pub algorithm: Option<Algorithm>,
    pub phases: Phases,
    /// The final path on every node.
    pub dest: PathBuf,
}

/// Per-leader counters.
#[derive(Debug, Default, Clone)]
pub(crate) struct Stats {
    pub bytes_read: u64,
    pub bytes_sent: u64,
    pub bytes_written: u64,
    pub read: Duration,
    pub write: Duration,
    pub verify: Duration,
    /// The MPI thread waited this long for this leader's own chunks from SRC (reader thread).
    pub wait_src: Duration,
    /// The MPI thread waited this long for a free round buffer while none was in flight (every one
    /// being verified and written), and for the writer to finish at the end.
    pub wait_dest: Duration,
    /// Wall time of the pipelined transfer, in which read, verify and write overlap the network.
    pub pipeline: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Kind {
    File,
    Pool,
    Directory,
}

/// What leader 0 learns about SRC and tells the others.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SrcInfo {
    kind: Kind,
    len: u64,
    mtime_ns: i128,
    mode: u32,
    /// Bytes that hold data (space needed on every node).
    data_bytes: u64,
    chunk_size: u64,
    /// Pool: its manifest and the hex of its trailer `[image_size, len)`.
    manifest: Option<Manifest>,
    tail_hex: Option<String>,
    /// Plain file: indices of chunks that overlap data (SEEK_DATA).
    candidates: Vec<u64>,
    /// Directory: signature of the tree's metadata.
    signature: String,
}

/// The stamp recorded on DEST at copy time (plain files and directories).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    v: u32,
    kind: Kind,
    src_len: u64,
    src_mtime_ns: i128,
    signature: String,
    dest_len: u64,
    dest_mtime_ns: i128,
}

const STAMP_XATTR: &str = "user.sw-pool.cp";

fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128
}

/// Copy `src` to `dest` on every node of the job. Collective: every rank calls it with the same
/// arguments; only leaders do I/O; every rank gets the same outcome.
pub fn copy(
    job: &dyn Collective,
    src: &Path,
    dest: &Path,
    opts: &CopyOptions,
) -> Result<CopyReport, TransferError> {
    let _arm = job
        .is_leader()
        .then(|| watchdog::arm(job.whoami(), opts.stall_timeout));
    if !job.is_leader() {
        return outcome_from_leader(job, None);
    }
    let res = leader_copy(job, src, dest, opts);
    if job.world_size() > 1 {
        outcome_from_leader(job, Some(res))
    } else {
        res
    }
}

/// The leader's outcome to the ranks of its node.
fn outcome_from_leader(
    job: &dyn Collective,
    res: Option<Result<CopyReport, TransferError>>,
) -> Result<CopyReport, TransferError> {
    #[derive(Serialize, Deserialize)]
    enum Outcome {
        Ok(Box<CopyReport>),
        Err(String, u8),
    }
    let bytes = res.as_ref().map(|r| {
        let o = match r {
            Ok(rep) => Outcome::Ok(Box::new(rep.clone())),
            Err(TransferError::Failed { message, status }) => {
                Outcome::Err(message.clone(), *status as u8)
            }
            Err(e) => Outcome::Err(e.to_string(), e.exit_status() as u8),
        };
        serde_json::to_vec(&o).expect("json")
    });
    let got = job.from_leader(bytes.as_deref());
    if let Some(r) = res {
        return r; // the leader keeps its own (typed) result
    }
    match serde_json::from_slice::<Outcome>(&got?) {
        Ok(Outcome::Ok(rep)) => Ok(*rep),
        Ok(Outcome::Err(message, _)) => Err(TransferError::Failed {
            message,
            status: ExitStatus::Collective,
        }),
        Err(e) => Err(TransferError::Mpi(format!(
            "cannot decode the leader's outcome: {e}"
        ))),
    }
}

use crate::collective::{Agreed, Collective, Local};

fn bad(status: ExitStatus, m: impl Into<String>) -> (ExitStatus, String) {
    (status, m.into())
}

/// Leader 0: what is SRC?
fn inspect_src(src: &Path, chunk_opt: Option<u64>) -> Local<SrcInfo> {
    let meta = std::fs::metadata(src).map_err(|e| {
        bad(
            crate::error::io_status(&e),
            format!(
                "cannot access SRC {}: {e}; check the path and that it is readable",
                src.display()
            ),
        )
    })?;
    let chunk_size = chunk_opt.unwrap_or(crate::pool::manifest::DEFAULT_CHUNK_SIZE);
    if !(plan::MIN_TRANSFER_CHUNK..=plan::MAX_TRANSFER_CHUNK).contains(&chunk_size) {
        return Err(bad(
            ExitStatus::BadInput,
            format!(
                "chunk size {chunk_size} is outside 4 KiB ..= {} MiB (bounded memory)",
                plan::MAX_TRANSFER_CHUNK >> 20
            ),
        ));
    }
    let mut info = SrcInfo {
        kind: Kind::File,
        len: meta.len(),
        mtime_ns: mtime_ns(&meta),
        mode: meta.mode(),
        data_bytes: 0,
        chunk_size,
        manifest: None,
        tail_hex: None,
        candidates: Vec::new(),
        signature: String::new(),
    };
    if meta.is_dir() {
        info.kind = Kind::Directory;
        let (sig, bytes) = dir::signature(src)?;
        info.signature = sig;
        info.data_bytes = bytes;
        return Ok(info);
    }
    if !meta.is_file() {
        return Err(bad(
            ExitStatus::BadInput,
            format!(
                "SRC {} is neither a regular file nor a directory",
                src.display()
            ),
        ));
    }
    let f = File::open(src).map_err(|e| {
        bad(
            crate::error::io_status(&e),
            format!("cannot open SRC {}: {e}", src.display()),
        )
    })?;
    // only a file ending in a pool footer is opened as a pool (Pool::open would scan the last MiB
    // of a plain file for a misplaced trailer: a MiB read from shared storage for nothing)
    let has_footer = {
        use crate::pool::trailer::{END_MAGIC, FOOTER_LEN, MAGIC};
        use std::os::unix::fs::FileExt;
        let mut fb = [0u8; FOOTER_LEN as usize];
        info.len >= FOOTER_LEN
            && f.read_exact_at(&mut fb, info.len - FOOTER_LEN).is_ok()
            && &fb[..8] == MAGIC
            && &fb[72..80] == END_MAGIC
    };
    let opened = if has_footer {
        Pool::open(src)
    } else {
        Err(ManifestError::NotAPool {
            path: src.to_path_buf(),
            reason: crate::pool::trailer::TrailerError::NoMagic,
        })
    };
    match opened {
        Ok(p) => {
            let m = p.manifest;
            if m.chunk_size > plan::MAX_TRANSFER_CHUNK {
                return Err(bad(
                    ExitStatus::InvalidPool,
                    format!(
                        "pool {} has {}-byte chunks; cp moves at most {} MiB chunks: rebuild it with a smaller chunk size",
                        src.display(),
                        m.chunk_size,
                        plan::MAX_TRANSFER_CHUNK >> 20
                    ),
                ));
            }
            let mut tail = vec![0u8; (p.file_len - m.image_size) as usize];
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut tail, m.image_size).map_err(|e| {
                bad(
                    ExitStatus::System,
                    format!("cannot read the trailer of {}: {e}", src.display()),
                )
            })?;
            info.kind = Kind::Pool;
            info.chunk_size = m.chunk_size;
            info.data_bytes = m.data_size + tail.len() as u64;
            info.tail_hex = Some(hex::encode(&tail));
            info.len = p.file_len;
            info.manifest = Some(m);
        }
        Err(ManifestError::NotAPool { .. }) => {
            let ranges = crate::sparse::data_ranges(&f, info.len).map_err(|e| {
                bad(
                    ExitStatus::System,
                    format!("cannot map the data of {}: {e}", src.display()),
                )
            })?;
            let chunks = plan::plain_chunks(info.len, chunk_size, &ranges);
            info.data_bytes = chunks.iter().map(|c| c.len as u64).sum();
            info.candidates = chunks.iter().map(|c| c.offset / chunk_size).collect();
        }
        Err(e) => return Err(bad(e.exit_status(), e.to_string())),
    }
    Ok(info)
}

/// The chunks that move, identical on every leader.
fn chunk_list(info: &SrcInfo) -> Vec<Chunk> {
    match &info.manifest {
        Some(m) => {
            let mut zero = crate::pool::manifest::ZeroHashes::default();
            let mut out = Vec::new();
            for (i, h) in m.chunks.iter().enumerate() {
                if h.is_some() {
                    let r = m.chunk_range(i as u64);
                    out.push(Chunk {
                        offset: r.start,
                        len: (r.end - r.start) as u32,
                        expect: m.chunk_hash(i, &mut zero),
                    });
                }
            }
            // the trailer: its bytes are known (node 0 read them, and checked them against the
            // authorized pool when there is one), so its chunks are bound to them too
            let tail = info
                .tail_hex
                .as_deref()
                .and_then(|h| hex::decode(h).ok())
                .unwrap_or_default();
            out.extend(
                plan::grid(m.image_size..info.len, info.chunk_size).map(|mut c| {
                    let s = (c.offset - m.image_size) as usize;
                    if let Some(b) = tail.get(s..s + c.len as usize) {
                        c.expect = Some(*blake3::hash(b).as_bytes());
                    }
                    c
                }),
            );
            out
        }
        None => info
            .candidates
            .iter()
            .map(|&i| {
                let off = i * info.chunk_size;
                Chunk {
                    offset: off,
                    len: ((off + info.chunk_size).min(info.len) - off) as u32,
                    expect: None,
                }
            })
            .collect(),
    }
}

/// The path written on this node: DEST itself, or DEST/<name of SRC> when DEST is an existing
/// directory (or ends with `/`) and SRC is a file (like cp).
fn target_path(src: &Path, dest: &Path, kind: Kind) -> PathBuf {
    if kind != Kind::Directory
        && (dest.is_dir() || dest.as_os_str().to_string_lossy().ends_with('/'))
    {
        if let Some(name) = src.file_name() {
            return dest.join(name);
        }
    }
    dest.to_path_buf()
}

fn read_stamp(p: &Path) -> Option<Stamp> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::getxattr(p, STAMP_XATTR, &mut buf).ok()?;
    serde_json::from_slice(&buf[..n]).ok()
}

/// Does this node already hold an identical DEST?
fn holds_identical(info: &SrcInfo, target: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(target) else {
        return false;
    };
    match info.kind {
        Kind::Pool => {
            if !meta.is_file() || meta.len() != info.len {
                return false;
            }
            let (Some(m), Some(tail_hex)) = (&info.manifest, &info.tail_hex) else {
                return false;
            };
            let Ok(f) = File::open(target) else {
                return false;
            };
            let mut tail = vec![0u8; (info.len - m.image_size) as usize];
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut tail, m.image_size).is_ok() && hex::encode(&tail) == *tail_hex
        }
        Kind::File | Kind::Directory => {
            if (info.kind == Kind::File) != meta.is_file()
                || (info.kind == Kind::Directory) != meta.is_dir()
            {
                return false;
            }
            let Some(s) = read_stamp(target) else {
                return false;
            };
            s.v == 1
                && s.kind == info.kind
                && s.src_len == info.len
                && (info.kind == Kind::Directory || s.src_mtime_ns == info.mtime_ns)
                && s.signature == info.signature
                && (info.kind == Kind::Directory || s.dest_len == meta.len())
                && s.dest_mtime_ns == mtime_ns(&meta)
        }
    }
}

fn write_stamp(info: &SrcInfo, path: &Path) -> Local<()> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| {
        bad(
            ExitStatus::System,
            format!("cannot stat {}: {e}", path.display()),
        )
    })?;
    let s = Stamp {
        v: 1,
        kind: info.kind,
        src_len: info.len,
        src_mtime_ns: info.mtime_ns,
        signature: info.signature.clone(),
        dest_len: if info.kind == Kind::File {
            meta.len()
        } else {
            0
        },
        dest_mtime_ns: mtime_ns(&meta),
    };
    // best effort: without xattr support the next copy simply copies again
    if let Err(e) = rustix::fs::setxattr(
        path,
        STAMP_XATTR,
        &serde_json::to_vec(&s).expect("json"),
        rustix::fs::XattrFlags::empty(),
    ) {
        tracing::info!(path = %path.display(), error = %e, "no stamp recorded (xattrs unsupported?): a repeat copy will copy again");
    }
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// Unit tests: the free space this thread's "node" reports (a full disk on one fake node).
    pub(crate) static TEST_FREE_BYTES: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// What a receiving leader prepared in preflight.
enum Prepared {
    File { tmp: Box<TempOutput>, out: File },
    Dir(dir::TempDir),
}

fn preflight(info: &SrcInfo, src: &Path, target: &Path, reader: bool) -> Local<Prepared> {
    if reader || info.kind != Kind::Directory {
        let r = if info.kind == Kind::Directory {
            std::fs::read_dir(src).map(|_| ())
        } else {
            File::open(src).map(|_| ())
        };
        r.map_err(|e| {
            bad(
                crate::error::io_status(&e),
                format!(
                    "cannot read SRC {}: {e}; every node's leader reads part of it: make it readable everywhere",
                    src.display()
                ),
            )
        })?;
    }
    let parent = crate::atomic::parent_dir(target);
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(bad(
                ExitStatus::BadInput,
                format!("DEST's parent {} is not a directory", parent.display()),
            ))
        }
        Err(e) => {
            return Err(bad(
                ExitStatus::BadInput,
                format!(
                    "DEST's directory {} is not usable: {e}; create it on every node first (or choose another DEST)",
                    parent.display()
                ),
            ))
        }
    }
    if let Ok(m) = std::fs::symlink_metadata(target) {
        let ours = read_stamp(target).is_some();
        if info.kind == Kind::Directory && m.is_dir() {
            let empty = std::fs::read_dir(target)
                .map(|mut d| d.next().is_none())
                .unwrap_or(false);
            if !ours && !empty {
                return Err(bad(
                    ExitStatus::BadInput,
                    format!(
                        "DEST {} exists, is not empty and was not made by sw-pool cp: remove it or choose another DEST",
                        target.display()
                    ),
                ));
            }
        } else if info.kind != Kind::Directory && m.is_dir() {
            return Err(bad(
                ExitStatus::BadInput,
                format!("DEST {} is a directory", target.display()),
            ));
        } else if info.kind == Kind::Directory && !m.is_dir() {
            return Err(bad(
                ExitStatus::BadInput,
                format!("DEST {} exists and is not a directory", target.display()),
            ));
        }
    }
    remove_stale_temporaries(parent, target);
    let st = rustix::fs::statvfs(parent).map_err(|e| {
        bad(
            ExitStatus::System,
            format!("cannot query free space of {}: {e}", parent.display()),
        )
    })?;
    #[allow(unused_mut)]
    let mut free = st.f_bavail.saturating_mul(st.f_frsize);
    #[cfg(test)]
    if let Some(f) = TEST_FREE_BYTES.with(|c| c.get()) {
        free = f; // a full disk on one node of a fake cluster (unit tests only)
    }
    // a little slack for metadata blocks
    let need = info.data_bytes + info.data_bytes / 64 + (1 << 20);
    if free < need {
        return Err(bad(
            ExitStatus::System,
            format!(
                "not enough space in {}: need {}, {} free; free space on this node or choose another DEST",
                parent.display(),
                crate::size::Bytes(need),
                crate::size::Bytes(free)
            ),
        ));
    }
    let tmp_err = |e: std::io::Error| {
        bad(
            crate::error::io_status(&e),
            format!(
                "cannot create a temporary file in {}: {e}; make DEST's directory writable",
                parent.display()
            ),
        )
    };
    match info.kind {
        Kind::Directory => Ok(Prepared::Dir(
            dir::TempDir::create(target).map_err(tmp_err)?,
        )),
        _ => {
            let (tmp, out) = TempOutput::create(target).map_err(tmp_err)?;
            // SRC's permission bits (without set-id bits), like cp
            use std::os::unix::fs::PermissionsExt;
            let _ = out.set_permissions(std::fs::Permissions::from_mode(info.mode & 0o777));
            out.set_len(info.len).map_err(|e| {
                bad(
                    ExitStatus::System,
                    format!("cannot size {}: {e}", tmp.path().display()),
                )
            })?;
            Ok(Prepared::File {
                tmp: Box::new(tmp),
                out,
            })
        }
    }
}

fn leader_copy(
    job: &dyn Collective,
    src: &Path,
    dest: &Path,
    opts: &CopyOptions,
) -> Result<CopyReport, TransferError> {
    let t0 = Instant::now();
    let pf = watchdog::phase("preflight");
    // 1. leader 0 inspects SRC and tells the others
    let info: Option<Local<SrcInfo>> = (job.node_index() == 0).then(|| {
        inspect_src(src, opts.chunk_size).and_then(|i| match &opts.authorized {
            Some(a) => a.check(src, &i).map(|()| i),
            None => Ok(i),
        })
    });
    let mine = info.as_ref().map(|i| {
        let v: Result<&SrcInfo, (u8, &str)> = i.as_ref().map_err(|(s, m)| (*s as u8, m.as_str()));
        serde_json::to_vec(&v).expect("json")
    });
    let bytes = job.leaders_bcast(0, mine.as_deref())?;
    let info: Local<SrcInfo> = match info {
        Some(own) => own,
        None => match serde_json::from_slice::<Result<SrcInfo, (u8, String)>>(&bytes) {
            Ok(Ok(i)) => Ok(i),
            Ok(Err((_, m))) => Err(bad(ExitStatus::Collective, m)),
            Err(e) => Err(bad(ExitStatus::Internal, format!("bad SRC info: {e}"))),
        },
    };
    let info = info.map_err(|(status, m)| TransferError::Failed {
        message: format!("{}: {m}", job.leader_host(0)),
        status,
    })?;
    // testing on one machine: `%n` in DEST stands for the (fake) node index
    let dest = job.node_path(dest);
    let target = target_path(src, &dest, info.kind);
    let need = !holds_identical(&info, &target);
    // who needs it
    let needs: Vec<bool> = job
        .leaders_all_gather(&[u8::from(need)])?
        .into_iter()
        .map(|b| b.first() == Some(&1))
        .collect();
    let receivers: Vec<usize> = (0..needs.len()).filter(|&i| needs[i]).collect();
    let mut report = CopyReport {
        nodes: job.nodes(),
        nodes_received: receivers.len(),
        kind: format!("{:?}", info.kind).to_lowercase(),
        bytes_total: if info.kind == Kind::Directory {
            info.data_bytes
        } else {
            info.len
        },
        bytes_data: info.data_bytes,
        chunk_size: info.chunk_size,
        dest: target.clone(),
        ..Default::default()
    };
    if receivers.is_empty() {
        report.skipped_all = true;
        report.phases.preflight = t0.elapsed();
        report.phases.total = t0.elapsed();
        return Ok(report);
    }
    // 2. preflight on the receivers
    let reader = receivers.first() == Some(&job.node_index());
    let prepared = if need {
        preflight(&info, src, &target, reader).map(Some)
    } else {
        Ok(None)
    };
    let (prepared, local) = match prepared {
        Ok(p) => (p, Ok(())),
        Err(e) => (None, Err(e)),
    };
    job.leaders_agree(local)?;
    drop(pf);
    report.phases.preflight = t0.elapsed();

    // 3. transfer among the receivers
    let t1 = Instant::now();
    let tcomm: Option<SimpleCommunicator> = job.mpi_leaders().and_then(|l| {
        l.split_by_color_with_key(
            if need {
                Color::with_value(0)
            } else {
                Color::undefined()
            },
            job.node_index() as i32,
        )
    });
    let hosts: Vec<String> = receivers.iter().map(|&i| job.leader_host(i)).collect();
    let mut stats = Stats::default();
    let total_bytes = info.data_bytes;
    let sink = opts
        .progress_sink
        .clone()
        .filter(|_| opts.progress && job.world_rank() == 0);
    let progress = move |done: u64| {
        if let Some(s) = &sink {
            s(done, total_bytes);
        }
    };
    let mut algorithm = None;
    let transferred: Local<()> = match &prepared {
        None => Ok(()),
        Some(Prepared::File { tmp, out }) => {
            let src_f = File::open(src).map_err(|e| {
                bad(
                    crate::error::io_status(&e),
                    format!("cannot open SRC {}: {e}", src.display()),
                )
            });
            let src_f = src_f.and_then(|f| match &opts.authorized {
                Some(a) => a.check_file(src, &f).map(|()| f),
                None => Ok(f),
            });
            match src_f {
                Err(e) => Err(e),
                Ok(src_f) => {
                    let chunks = chunk_list(&info);
                    let fj = engine::FileJob {
                        src: &src_f,
                        src_path: src,
                        out,
                        out_path: tmp.path(),
                        chunks: &chunks,
                        chunk_size: info.chunk_size,
                        verify_source: opts.verify_source_chunks,
                        verify: opts.verify_chunks,
                        hosts: &hosts,
                        progress: &progress,
                    };
                    match tcomm.as_ref().filter(|c| c.size() > 1) {
                        Some(c) => {
                            algorithm = Some(opts.algorithm);
                            engine::distribute(c, &fj, opts.algorithm, &mut stats)
                        }
                        None => engine::local(&fj, &mut stats),
                    }
                }
            }
        }
        Some(Prepared::Dir(td)) => {
            let comm = tcomm.as_ref().filter(|c| c.size() > 1);
            if comm.is_some() {
                algorithm = Some(Algorithm::Bcast);
            }
            dir::transfer(
                comm,
                src,
                td.path(),
                info.chunk_size,
                &hosts,
                &mut stats,
                &progress,
            )
        }
    };
    // fsync before agreeing
    let tc = Instant::now();
    let ready: Local<()> = transferred.and_then(|()| match &prepared {
        Some(Prepared::File { out, tmp }) => out.sync_all().map_err(|e| {
            bad(
                ExitStatus::System,
                format!("cannot fsync {}: {e}", tmp.path().display()),
            )
        }),
        Some(Prepared::Dir(td)) => td.sync(),
        None => Ok(()),
    });
    report.phases.distribute = match stats.pipeline {
        // read, verify and write ran in their own threads, overlapping the network
        Some(wall) => wall,
        None => t1
            .elapsed()
            .saturating_sub(stats.read + stats.write + stats.verify + tc.elapsed()),
    };
    report.phases.overlapped = stats.pipeline.is_some();
    report.phases.wait_src = stats.wait_src;
    report.phases.wait_dest = stats.wait_dest;
    let _c = watchdog::phase("commit");
    // 4. all-or-nothing
    job.leaders_agree(ready)?;
    let committed: Local<()> = match prepared {
        None => Ok(()),
        Some(Prepared::File { tmp, out }) => {
            let p = tmp.path().to_path_buf();
            let stamped = if info.kind == Kind::File {
                // the stamp names DEST's final size and mtime (renaming keeps both)
                write_stamp(&info, &p)
            } else {
                Ok(())
            };
            stamped.and_then(|()| {
                tmp.commit(out).map_err(|e| {
                    bad(
                        ExitStatus::System,
                        format!("cannot rename {} to {}: {e}", p.display(), target.display()),
                    )
                })
            })
        }
        Some(Prepared::Dir(td)) => {
            td.commit(&target, info.mode, info.mtime_ns, |p| write_stamp(&info, p))
        }
    };
    job.leaders_agree(committed)?;
    report.phases.commit = tc.elapsed();
    report.phases.read = stats.read;
    report.phases.write = stats.write;
    report.phases.verify = stats.verify;
    report.algorithm = algorithm;
    // totals over all leaders
    let mine = [stats.bytes_read, stats.bytes_sent, stats.bytes_written];
    let mut totals = [0u64; 3];
    let mine_b: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    for b in job.leaders_all_gather(&mine_b)? {
        for (i, c) in b.chunks_exact(8).take(3).enumerate() {
            totals[i] += u64::from_le_bytes(c.try_into().expect("8 bytes"));
        }
    }
    report.bytes_read_from_src = totals[0];
    report.bytes_sent = totals[1];
    report.bytes_written = totals[2];
    report.phases.total = t0.elapsed();
    Ok(report)
}

/// Remove `.<name>.swpool-tmp-<pid>` left by a copy whose process died without cleaning up
/// (SIGKILL): only when no process with that pid exists on this node.
fn remove_stale_temporaries(parent: &Path, target: &Path) {
    let Some(name) = target.file_name() else {
        return;
    };
    let prefix = format!(".{}.swpool-tmp-", name.to_string_lossy());
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = n.strip_prefix(&prefix).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let p = e.path();
            tracing::info!(path = %p.display(), "removing a stale temporary of a dead copy");
            let _ = std::fs::remove_file(&p).or_else(|_| std::fs::remove_dir_all(&p));
        }
    }
}
