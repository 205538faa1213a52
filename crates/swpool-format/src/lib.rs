//! **swpool-format** owns what a pool *is*, as bytes: the image formats sw-pool detects
//! ([`format`]), the manifest and its chunk hashes, the trailer and its footer, the file system's own
//! size checked against the image a manifest covers, pool specs (`NAME/VERSION`) and the layout of
//! a pool's tree ([`pool`]), sparse-file helpers ([`sparse`]), and the exit-status table every error
//! maps to ([`status`]). Everything here parses untrusted bytes defensively and depends on neither
//! MPI nor OpenSSL nor any external tool, so the privileged mount helper and the on-demand chunk
//! server can link it and be audited with it.

pub mod file;
pub mod format;
pub mod pool;
pub mod show;
pub mod sparse;
pub mod status;
