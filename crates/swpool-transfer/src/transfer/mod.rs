//! The broadcast engine (`sw-pool cp`, `scalable-fs-cp`): copy a file or a directory from shared
//! storage to node-local storage on every node of an MPI job, reading each data byte once.
//!
//! [`copy`] is collective: every rank of the job calls it; only the node leaders (one per node,
//! from `MPI_Comm_split_type(SHARED)`) do I/O; the other ranks wait for their leader's outcome and
//! return it. Steps (docs/architecture.md, "The load pipeline", step 4):
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
pub mod layer;
mod leader;
pub mod plan;
mod prepare;
pub mod reuse;
mod source;
pub use crate::watchdog;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::collective::{Agreed, Collective, Local};
use crate::config::{EnvVar, Environment};
use crate::pool::Pool;
use leader::leader_copy;
#[cfg(any(test, feature = "testkit"))]
pub use prepare::TEST_FREE_BYTES;
pub use prepare::{free_bytes, space_needed};
use source::{Kind, SrcInfo};
use swpool_format::status::ExitStatus;

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

/// How a full disk's message ends for `cp`; [`TransferError::for_cache`] says it for the
/// node-local cache (`load`, `mount`), whose destination the user chooses differently.
pub(crate) const ANOTHER_DEST: &str = "choose another DEST";

impl TransferError {
    /// The same error, its advice about the destination said for the node-local cache.
    pub fn for_cache(self) -> TransferError {
        const CACHE: &str =
            "choose another node-local cache directory (--cache-dir, config cache_dir, $SW_POOL_CACHE)";
        match self {
            TransferError::Failed { message, status } => TransferError::Failed {
                message: message.replace(ANOTHER_DEST, CACHE),
                status,
            },
            TransferError::Agreed(mut a) => {
                for f in a.failures.iter_mut() {
                    f.message = f.message.replace(ANOTHER_DEST, CACHE);
                }
                TransferError::Agreed(a)
            }
            e => e,
        }
    }

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
    /// One reader; chunks alternate between two complementary binary trees of `MPI_Isend`/
    /// `MPI_Irecv` (`engine/tree.rs`): log-depth, one open of SRC per copy.
    #[serde(rename = "two-tree")]
    TwoTree,
}

impl Algorithm {
    /// `SW_POOL_CP_ALGORITHM` in `env` (`ring`, `two-tree`, `allgather` or `bcast`; benchmarks),
    /// else `None`: [`Algorithm::choose`] decides per copy.
    pub fn from_env(env: &Environment) -> Option<Algorithm> {
        match env.get(EnvVar::CpAlgorithm).as_deref() {
            Some("bcast") => Some(Algorithm::Bcast),
            Some("allgather") => Some(Algorithm::Allgather),
            Some("ring") => Some(Algorithm::Ring),
            Some("two-tree") => Some(Algorithm::TwoTree),
            _ => None,
        }
    }
    /// The algorithm for a file of `chunks` data chunks on `nodes` receiving leaders (the same on
    /// every leader). Large files take the ring, whose many readers read shared storage in
    /// parallel: measured on the testbed a little faster than the `MPI_Iallgatherv` (1 GiB, N = 8:
    /// 29.8 s vs 31.5 s) and far faster than one `MPI_Ibcast` per reader (57 s). A file of at most
    /// [`plan::TREE_CHUNKS_PER_LEADER`] chunks per leader takes the two trees from one reader:
    /// there the ring's fill (a chunk crossing N − 1 hops) dominates, and its one open per reader
    /// makes a small pool's storage requests grow with the job. The scale model
    /// (`bench/results/model-*`) puts the two trees at 1.0–1.05× the ring up to 16 nodes and ahead
    /// beyond (16 MB on 1,024 nodes: 2.8× the 2-node time instead of 28.5×).
    pub fn choose(nodes: usize, chunks: usize) -> Algorithm {
        if nodes > 2 && chunks <= plan::TREE_CHUNKS_PER_LEADER * nodes {
            Algorithm::TwoTree
        } else {
            Algorithm::Ring
        }
    }
    /// Name as in `SW_POOL_CP_ALGORITHM` and reports.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Allgather => "allgather",
            Algorithm::Bcast => "bcast",
            Algorithm::Ring => "ring",
            Algorithm::TwoTree => "two-tree",
        }
    }
}

/// `SW_POOL_BENCH_NO_VERIFY=1`: a **benchmark switch, not a user option** (no flag, no config key,
/// not in `--help`; honoured by `sw-pool cp` only, never by `load`). The file pipeline then neither
/// hashes nor checks any chunk (zero detection and sparse writes stay), so that
/// `bench/cp-verify.sh` can measure the broadcast with verification ÷ without. A copy made
/// this way is NOT verified; never set it outside a benchmark. Read from `env`.
pub fn bench_no_verify(env: &Environment) -> bool {
    env.is_one(EnvVar::BenchNoVerify)
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
    /// Distribution algorithm (`None`: [`Algorithm::choose`] per copy).
    pub algorithm: Option<Algorithm>,
    /// A rank that sees no progress for this long gives up (exit 8) and removes its temporaries.
    pub stall_timeout: Duration,
    /// The pool the trust policy authorized (`load`): the copy moves exactly its bytes or fails on
    /// every node with "changed on shared storage since it was checked".
    pub authorized: Option<Authorized>,
    /// SRC already open on the first node's leader (`load`: the file the trust policy checked);
    /// that leader inspects and reads it instead of opening SRC again.
    pub src_file: Option<Arc<std::fs::File>>,
    /// The benchmark switch `SW_POOL_BENCH_SLOTS=K`: at most K chunks per round (the smallest K
    /// among the leaders counts; `None`: no cap).
    pub bench_slots: Option<u64>,
    /// A pool: take over the chunks each node already holds in DEST's partial copy
    /// (`DEST.part`, left by an on-demand run; [`reuse`]) and move only the others.
    pub reuse_partial: bool,
}

/// A pool as it was when the trust policy checked it: its length and its trailer bytes (manifest
/// with every chunk hash, signature block, footer). Every reader checks that the file it opens
/// still ends in these bytes, and every chunk is checked against the manifest they hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authorized {
    pub len: u64,
    pub image_size: u64,
    #[serde(with = "hex_bytes")]
    pub tail: Vec<u8>,
}

/// Bytes as a hex string in JSON (a trailer sent between node leaders).
mod hex_bytes {
    pub fn serialize<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(b))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let h: String = serde::Deserialize::deserialize(d)?;
        hex::decode(h).map_err(serde::de::Error::custom)
    }
}

impl Authorized {
    /// The trailer of an opened pool, as it was read when the pool was opened.
    pub fn of(pool: &Pool) -> Authorized {
        Authorized {
            len: pool.file_len,
            image_size: pool.manifest.image_size,
            tail: pool.tail(),
        }
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

/// The built-in defaults: the algorithm chosen per copy, a stall timeout of
/// [`watchdog::DEFAULT_TIMEOUT`], no benchmark switch.
impl Default for CopyOptions {
    fn default() -> Self {
        CopyOptions {
            chunk_size: None,
            progress: false,
            progress_sink: None,
            verify_source_chunks: true,
            verify_chunks: true,
            algorithm: None,
            stall_timeout: watchdog::DEFAULT_TIMEOUT,
            authorized: None,
            src_file: None,
            bench_slots: None,
            reuse_partial: false,
        }
    }
}

impl CopyOptions {
    /// The defaults with what `env` sets: `SW_POOL_CP_ALGORITHM`, `SW_POOL_STALL_TIMEOUT`,
    /// `SW_POOL_BENCH_SLOTS` (not `SW_POOL_BENCH_NO_VERIFY`: only `sw-pool cp` honours that one).
    pub fn from_env(env: &Environment) -> CopyOptions {
        CopyOptions {
            algorithm: Algorithm::from_env(env),
            stall_timeout: watchdog::default_timeout(env),
            bench_slots: env
                .get(EnvVar::BenchSlots)
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&k| k > 0),
            ..CopyOptions::default()
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
            .field("bench_slots", &self.bench_slots)
            .field("reuse_partial", &self.reuse_partial)
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
    /// Bytes the receiving leaders took from their own partial copies (verified, not read from SRC
    /// nor moved), all together.
    #[serde(default)]
    pub bytes_reused: u64,
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
        .then(|| job.watchdog().arm(job.whoami(), opts.stall_timeout));
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

fn bad(status: ExitStatus, m: impl Into<String>) -> (ExitStatus, String) {
    (status, m.into())
}
