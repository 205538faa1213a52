//! The verifying chunk server: a pool's file-system image served as one read-only file over FUSE,
//! chunk by chunk, each chunk hashed (BLAKE3) against the pool's authorized manifest before any
//! byte of it is served. A bad chunk is `EIO` plus one log line naming the pool, the chunk, its
//! byte offset and the node; never wrong bytes.
//!
//! The pieces, each behind a seam so that unit tests run them without FUSE or storage:
//! - [`source::ChunkSource`]: where a missing chunk comes from (the pool file on shared storage
//!   today; the on-demand mode's peers through MPI implement the same trait).
//! - [`store::LocalStore`]: the node's copy of the chunks fetched so far, a sparse file plus a
//!   record of the chunks present, written so that a crash never marks a chunk present that is not
//!   on disk (resume and reuse); absent for `mount --in-place`, which keeps no copy.
//! - [`chunks::Chunks`]: the engine: one fetch per chunk however many readers ask at once, a
//!   bounded memory cache when there is no local store, verification before anything is served.
//! - [`frame`]: the answer frame of both chunk transports (the socket below, and the MPI exchange
//!   between the nodes' on-demand servers).
//! - [`socket`]: chunks over a Unix socket, from the node's on-demand server (the MPI rank that
//!   fetches from peers) to the node's `sw-pool-serve`.
//! - [`fs::ImageFs`]: the FUSE file system (one directory, one file `image`), multithreaded, with
//!   the kernel's page cache kept across opens (a pool is immutable), or bypassed over the node's
//!   on-demand server, whose store already holds every chunk ([`fs::ImageFs::direct_io`]).
//!
//! The `sw-pool-serve` binary mounts it and runs the file system's own FUSE helper (squashfuse_ll,
//! fuse2fs) on the served file as its child; it ends when that helper ends (the pool is unmounted),
//! so one record and one unmount cover both (see `docs/architecture.md`, "Serving on demand").

pub mod chunks;
pub mod frame;
pub mod fs;
pub mod prefetch;
pub mod socket;
pub mod source;
pub mod store;
pub mod tree;
pub mod view;

pub use chunks::{ChunkError, Chunks, Limits};

/// The log of sw-pool-serve and sw-pool-view: plain lines on standard error (no time, no colour,
/// no target), `debug` for their figures, fuser's own lines from `info` with `debug`, else `warn`.
pub fn init_logging(debug: bool) {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false)
        .without_time()
        .with_env_filter(tracing_subscriber::EnvFilter::new(if debug {
            "debug,fuser=info"
        } else {
            "info,fuser=warn"
        }))
        .init();
}

/// Keep chunk-sized buffers in the process's heap once freed. A server allocates and frees a
/// buffer of a chunk (1 MiB by default) for every chunk it moves; glibc serves allocations above
/// 128 KiB with `mmap` and gives a freed heap top back to the kernel, so each chunk's buffer was
/// faulted in and zeroed by the kernel page by page again. Measured on the testbed (`bench/lazy.sh`
/// with `PROFILE=1`, 8 nodes, sha256 of a 1 GB file through the lazy mount): the kernel's
/// `clear_page` was 8.4 s of the on-demand servers' 62 s of CPU. The mmap threshold goes above two
/// chunks (glibc's ceiling: 32 MiB) and the heap is trimmed only above 16 chunks, so the memory a
/// server holds stays what its busiest moment needed.
pub fn keep_chunk_buffers(chunk_size: u64) {
    let cap = 32u64 << 20;
    let mmap = (2 * chunk_size.max(1 << 20)).min(cap) as libc::c_int;
    let trim = (16 * chunk_size.max(1 << 20)).min(1 << 30) as libc::c_int;
    // SAFETY: mallopt only sets glibc's allocator parameters; values it refuses leave them as they
    // were (it returns 0), which is harmless.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, mmap);
        libc::mallopt(libc::M_TRIM_THRESHOLD, trim);
    }
}
pub use source::{ChunkSource, FileSource};
pub use store::LocalStore;
