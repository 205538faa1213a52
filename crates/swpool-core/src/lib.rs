//! sw-pool core library.
//!
//! Everything sw-pool does lives here; the `sw-pool` binary only parses arguments and calls into it.
//! No clap in this crate. Each module has its own typed error; [`Error`] gathers them and maps each to
//! a documented exit status ([`ExitStatus`]).

pub mod atomic;
pub mod cache;
pub mod config;
pub mod error;
pub mod exec;
pub mod image;
pub mod pool;
pub mod size;
pub mod slurm;
pub mod sparse;
pub mod transfer;
pub mod trust;
pub mod users;

pub use error::{Error, ExitStatus, Result};
pub mod env;
pub mod mount;
pub mod state;
