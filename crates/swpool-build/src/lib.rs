//! sw-pool's builders: pool images ([`image`]: squashfs, EROFS, ext), a program bundled with the
//! libraries it loads ([`bundle`]), a Python environment relocated into a pool ([`pyenv`]) and
//! writable user images ([`userimage`]). They run tools (mksquashfs, mke2fs, mkfs.erofs) on a
//! node; no MPI, no OpenSSL. How it fits: `docs/architecture.md`.

pub mod bundle;
pub mod image;
pub mod pyenv;
pub mod userimage;

// the modules of the lower crates keep the paths they have in swpool-core
pub use swpool_format::pool;
pub use swpool_format::status::ExitStatus;
pub use swpool_node::size;
pub use swpool_sys::{atomic, exec};
