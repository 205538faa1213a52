//! sw-pool core library.
//!
//! Everything sw-pool does lives here; the `sw-pool` binary only parses arguments and calls into it.
//! No clap in this crate. Each module has its own typed error; [`Error`] gathers them and maps each to
//! a documented exit status ([`ExitStatus`]). How the modules fit together: `docs/architecture.md`.
//!
//! "The paper" in comments is Dieterle, Nolte and Kunkel, *Scalable Software Distribution for
//! HPC-Systems with Software Pools Using MPI and File Systems in User Space* (GWDG), which sw-pool
//! implements and extends (its figures: Figure 7 the pool layout, Figure 8 a modulefile, Figures
//! 9–12 the benchmark). "The Oslo disk-image tools" are the University of Oslo's scripts for disk
//! images of workflows with many small files (`list_images.py`, `umount_all_images.py`, …).

pub mod all_nodes;
pub mod error;
pub mod inspect;
pub mod layer;
pub mod load;
pub mod ondemand;
pub mod trust;

pub use error::{Error, Result};
pub use swpool_format::status::ExitStatus;
// the pool format and the system layer live in their own crates (no MPI, no OpenSSL); their
// modules keep their paths here
pub use swpool_format::{pool, sparse};
pub use swpool_sys::{atomic, exec, lock, userdir};
// the node layer lives in its own crate (no MPI, no OpenSSL: the front is built on it); its
// modules keep their paths here
pub use swpool_node::{cache, config, env, mount, size, slurm, state, users};
// the transfer engine (MPI behind its seams) and the builders live in their own crates; their
// modules keep their paths here
pub use swpool_build::{bundle, image, pyenv, userimage};
pub use swpool_transfer::{collective, plane, transfer, watchdog};
// the MPI job (the one crate that links libmpi)
pub use swpool_mpi::{job, Job};
