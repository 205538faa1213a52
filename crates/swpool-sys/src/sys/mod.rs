//! The operations a mount needs from the system, behind three traits (youki's `syscall/` pattern):
//! [`Mounts`] (the file system and the mount table), [`Processes`] (who we are, the helpers and
//! tools we start, the one way we end a process) and [`Clock`]; [`Sys`] is all three.
//! [`RealSys`] does them; [`FakeSys`] (feature `testkit`) records every call as a typed [`Call`]
//! and plays a script on a virtual clock, so that the order of steps, the clean-up after each kind
//! of failure and every timeout are unit-tested without root, without FUSE and without waiting.

#[cfg(any(test, feature = "testkit"))]
mod fake;
mod real;

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::exec::{ExecError, Output, ToolCommand};

use crate::proc::MountEntry;

/// What `lstat` says about a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMeta {
    pub kind: FileKind,
    pub uid: u32,
    pub mode: u32,
    pub dev: u64,
    pub ino: u64,
}

/// A mount point opened once, for root's mounts ([`crate::pinned`]).
#[derive(Debug)]
pub struct PinnedDir {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    /// It had no entries when it was opened.
    pub empty: bool,
    pub(crate) real: Option<crate::pinned::Pinned>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Dir,
    File,
    Symlink,
    Other,
}

/// The file system and mount operations of mounting and unmounting.
pub trait Mounts {
    /// `lstat(2)`: never follows a symlink.
    fn lstat(&self, p: &Path) -> io::Result<FileMeta>;
    /// Whether a directory has no entries (opened with `O_NOFOLLOW|O_DIRECTORY`).
    fn dir_is_empty(&self, p: &Path) -> io::Result<bool>;
    /// `stat(2)` of a mount point: `ENOTCONN` means its FUSE process died.
    fn probe(&self, p: &Path) -> io::Result<()>;
    /// The mount table (`/proc/self/mountinfo`).
    fn mounts(&self) -> io::Result<Vec<MountEntry>>;
    /// Open `/dev/fuse` read-write (and close it): is FUSE usable by this user?
    fn open_fuse_device(&self) -> io::Result<()>;
    /// Root: open the (canonical) mount point once, following no symlink.
    fn pin(&self, p: &Path) -> io::Result<PinnedDir>;
    /// Root: a fresh staging directory only root can reach.
    fn stage(&self) -> io::Result<PathBuf>;
    /// Root: move the mount at `stage` onto the pinned directory; the moved mount's ID (read from
    /// its own descriptor, not looked up by path).
    fn attach(&self, stage: &Path, to: &PinnedDir) -> io::Result<u32>;
    /// Root: undo [`Mounts::attach`] wherever the directory is now.
    fn detach(&self, to: &PinnedDir);
    /// Detach whatever is still mounted on the stage and remove it.
    fn remove_stage(&self, stage: &Path);
    /// Root: `umount2(mp, UMOUNT_NOFOLLOW [| MNT_DETACH])`.
    fn unmount_nofollow(&self, mp: &Path, lazy: bool) -> Result<(), ExecError>;
    /// Root: unmount the mount with ID `id` wherever it is now, if the mount table's entry for it
    /// is still a FUSE mount of sw-pool's helpers made by `user` (IDs are reused); `Ok(false)`: no
    /// such mount any more. `at`: where the caller last saw it (a fake's key).
    fn unmount_id(&self, id: u32, user: u32, at: &Path, lazy: bool) -> Result<bool, ExecError> {
        let _ = (id, user);
        self.unmount_nofollow(at, lazy).map(|()| true)
    }
}

/// Who we are, the processes we start, and the one way we end a process.
pub trait Processes {
    /// The effective uid of the caller.
    fn euid(&self) -> u32;
    /// Start a FUSE helper in the foreground (`-f`), stdin closed, stdout and stderr into `log`, in
    /// its own process group. Returns its pid.
    fn spawn_helper(&self, cmd: &ToolCommand, log: &Path) -> Result<u32, ExecError>;
    /// Has the helper we started exited? `Some(description of its status)` if so.
    fn helper_exited(&self, pid: u32) -> io::Result<Option<String>>;
    /// End a helper *we started* (SIGTERM, then SIGKILL) and reap it. Other pids are refused.
    fn kill_helper(&self, pid: u32);
    /// Forget a helper that is now serving its mount (it must outlive us; we never signal it again).
    /// `false` when an interrupt already signalled it: the caller undoes the mount.
    fn release_helper(&self, pid: u32) -> bool;
    /// Run a short tool to completion (`fusermount3 -u`, `umount`).
    fn run(&self, cmd: &ToolCommand) -> Result<Output, ExecError>;
    /// The helper's stderr so far.
    fn read_log(&self, log: &Path) -> String;
    /// Is `pid` a FUSE helper of `uid` for `mp` (a recorded helper of an earlier sw-pool process;
    /// [`crate::process::is_our_helper`])?
    fn is_our_helper(&self, pid: u32, uid: u32, mp: &Path) -> bool;
    /// Does `pid` still run (not gone, not a zombie)?
    fn running(&self, pid: u32) -> bool;
    /// End a process proved ours ([`Processes::is_our_helper`], a record's writer): SIGTERM, up to
    /// `grace`, SIGKILL ([`crate::process::terminate`]).
    fn terminate(&self, pid: u32, grace: Duration) -> Result<(), String>;
}

/// Time, so that waits and deadlines are faked in tests.
pub trait Clock {
    fn now(&self) -> Instant;
    fn sleep(&self, d: Duration);
}

/// Everything the mount code needs from the system: [`Mounts`], [`Processes`] and [`Clock`].
/// `Sync`: the on-demand server mounts on one thread while another drives the exchange (MPI).
pub trait Sys: Mounts + Processes + Clock + Sync {}

impl<T: Mounts + Processes + Clock + Sync> Sys for T {}

pub use real::RealSys;

/// The recording fake (unit tests, and other crates' tests through the `testkit` feature).
#[cfg(any(test, feature = "testkit"))]
pub use fake::{Call, FakeHelper, FakeScript, FakeSys, DECOY_ID};
