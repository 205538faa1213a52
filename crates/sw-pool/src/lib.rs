//! sw-pool's command line (the argument types of every subcommand), its output (stdout through one
//! writer, errors in one write, progress bars) and what `run`/`shell` show of the environments
//! they start (their logic is the node layer's, `swpool_node::isolated`): what the
//! front (`sw-pool`, src/front.rs) and the full program (`sw-pool-full`, crates/sw-pool-full) share.
//!
//! No MPI, no OpenSSL: this crate builds on swpool-node and swpool-env only (`make lint` checks
//! its graph, tools/check-link-graph.sh), so the front links neither.

#![deny(clippy::print_stdout)]

pub mod cli;
pub mod environment;
pub mod output;
