//! sw-pool's node layer: what one node does for its users without MPI or OpenSSL: the
//! configuration and the environment it reads ([`config`]), users, the per-user state of mounts
//! ([`state`]), mounting and unmounting ([`mount`]), the node-local cache ([`cache`]), the leases
//! of user images ([`lease`]), the environment changes a pool's modules make ([`env`]), and what
//! `sw-pool run`/`shell` make an isolated environment of ([`isolated`]).
//!
//! swpool-core re-exports these modules under the same paths; the front (`sw-pool run/shell`) and
//! the use cases that need no MPI build on this crate alone.

pub mod cache;
pub mod config;
pub mod env;
pub mod isolated;
pub mod lease;
pub mod locate;
pub mod mount;
pub mod shadow;
pub mod size;
pub mod slurm;
pub mod state;
pub mod users;

pub use swpool_format::status::ExitStatus;
pub use swpool_format::{pool, sparse};
pub use swpool_sys::{atomic, exec, lock, userdir};

/// Image formats (the builders are swpool-core's).
pub mod image {
    pub use swpool_format::format::{detect, detect_bytes, DetectError, ImageFormat};
}

/// The user-image lease ([`crate::lease`]) under the path swpool-core gives it.
pub mod userimage {
    pub use crate::lease::{self, end_lease};
}
