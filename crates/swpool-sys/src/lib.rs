//! **swpool-sys** owns sw-pool's contact with the operating system where it must be exact: root's
//! walk of a user's path by descriptor ([`walk`]), mounting onto the directory that was checked
//! ([`pinned`]), the mount table and who holds a mount ([`proc`]), outputs written under a
//! temporary name and renamed when complete ([`atomic`]), per-user directories in shared places and
//! their squat fallbacks ([`userdir`]), external tools and the processes sw-pool starts ([`exec`]),
//! the one way to end a process ([`process`]), the one lock ([`lock`]), syslog ([`syslog`]), and
//! the seams the mount code goes through ([`sys`]: mounts, processes, clock; their typed recording
//! fake behind the `testkit` feature). It links neither MPI nor OpenSSL: the privileged mount helper is
//! built on it. It reads no environment variable: what it needs from the environment (`PATH` for
//! tools, `XDG_RUNTIME_DIR`) its callers pass as parameters.

pub mod atomic;
pub mod exec;
pub mod idmap;
pub mod kmount;
pub mod lock;
pub mod loopdev;
pub mod pinned;
pub mod proc;
pub mod process;
pub mod sys;
pub mod syslog;
pub mod userdir;
pub mod walk;
