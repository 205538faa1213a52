//! The config key `fuse_reader`: which FUSE server reads squashfs pools (see
//! `crate::mount::Backend`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which FUSE server reads squashfs pools (config key `fuse_reader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum FuseReader {
    /// `squashfuse_ll` (on the chunk server's file in place and on demand: two hops).
    #[serde(rename = "squashfuse_ll")]
    SquashfuseLl,
    /// sw-pool's own tree server, `mount::Backend::SwPoolTree` (the default: one hop in place
    /// and on demand, falling back to squashfuse_ll for an image it does not read).
    #[default]
    #[serde(rename = "sw-pool")]
    SwPool,
}

impl std::str::FromStr for FuseReader {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "squashfuse_ll" => Ok(FuseReader::SquashfuseLl),
            "sw-pool" => Ok(FuseReader::SwPool),
            o => Err(format!(
                "unknown FUSE reader {o:?}: use \"sw-pool\" (the default) or \"squashfuse_ll\""
            )),
        }
    }
}

impl fmt::Display for FuseReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FuseReader::SquashfuseLl => "squashfuse_ll",
            FuseReader::SwPool => "sw-pool",
        })
    }
}
