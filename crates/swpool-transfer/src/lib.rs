//! sw-pool's transfer engine: how the ranks of a job agree ([`collective`]), how bytes move among
//! node leaders ([`plane`]: MPI, or in process for the N-rank tests), and the transfers built on
//! them ([`transfer`]: a pool into every node's cache, a directory, a writable layer), each
//! watched by a [`watchdog`]. No MPI and no OpenSSL: the MPI job and data plane are
//! the seams' implementations in swpool-mpi. How it fits: `docs/architecture.md`.

pub mod collective;
pub mod plane;
pub mod transfer;
pub mod watchdog;

// the modules of the lower crates keep the paths they have in swpool-core
pub use swpool_format::status::ExitStatus;
pub use swpool_format::{pool, sparse};
pub use swpool_node::{cache, config, size, users};
pub use swpool_sys::atomic;
