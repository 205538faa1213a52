//! The helper's seam: every system call its requests make on a user's behalf, behind [`Host`].
//! [`RealHost`] makes them (descriptor walks with `openat2`/`mkdirat`/`unlinkat`, `fsmount` +
//! `move_mount` onto the opened directory, loop devices, the caller's file opened as the caller,
//! bounded tool runs, the records under their lock); the recording fake (`host::fake`, tests
//! only) plays a script and records each call as a typed [`fake::Call`], so the order of steps and
//! every refusal of SECURITY.md's table are unit-tested without root.
//!
//! The seam sits at the level of single calls on descriptors, so the rules stay in the callers
//! (`image.rs`, `caller.rs`, `cleanup.rs`), where the fake drives them: a directory is an opened
//! descriptor (`Host::Dir`), never a path looked up again. Waits and the ending of processes go
//! through `swpool-sys`'s own seams ([`swpool_sys::sys::Clock`],
//! [`swpool_sys::sys::Processes::terminate`]); file metadata is `swpool-sys`'s [`FileMeta`].

use std::ffi::OsString;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use swpool_sys::kmount::{self, KernelMount};
use swpool_sys::loopdev::LoopDevice;
use swpool_sys::pinned::Pinned;
use swpool_sys::sys::{Clock, FileKind, FileMeta, Processes};

use crate::bounded::{As, OpenError, Opened, ToolEnd};
use crate::error::{HelperError, Result};
use crate::state::{Records, State};

/// The records, locked for as long as this lives.
pub trait Locked {
    fn records(&mut self) -> &mut Records;
    fn save(&mut self) -> Result<()>;
}

impl Locked for State {
    fn records(&mut self) -> &mut Records {
        &mut self.records
    }
    fn save(&mut self) -> Result<()> {
        State::save(self)
    }
}

/// A mount point opened by descriptor, as [`Host::open_target`] found it.
#[derive(Debug)]
pub struct Target<T> {
    pub handle: T,
    pub dev: u64,
    pub ino: u64,
    /// It had no entries when it was opened.
    pub empty: bool,
}

/// A process holding something under a mount point.
#[derive(Debug, Clone)]
pub struct Holder {
    pub pid: u32,
    pub uid: Option<u32>,
    pub command: String,
    /// In the helper's own mount namespace.
    pub same_ns: bool,
}

/// The system calls of the helper's requests.
pub trait Host {
    /// A directory opened by descriptor (`O_PATH`).
    type Dir;
    /// A mount point opened once, empty ([`Target`]).
    type Target;
    /// A loop device attached to a descriptor (autoclear).
    type Loop;
    /// The records under their lock.
    type Locked: Locked;
    /// `swpool-sys`'s process and clock seams (the one `terminate`, sleeps).
    type Sys: Processes + Clock;

    fn sys(&self) -> &Self::Sys;

    // --- the caller's bytes: never with the records locked

    /// Open the caller's file with their ids (`None`: root's), `O_NOFOLLOW|O_NONBLOCK`, within
    /// `limit`; `fstat`/`fstatfs` on the descriptor.
    fn open_as(
        &self,
        who: Option<As>,
        path: &Path,
        write: bool,
        limit: Duration,
    ) -> std::result::Result<Opened, OpenError>;
    /// Run `tool` from the system directories (empty environment plus `env`), killed by its PID
    /// after `limit`.
    fn run_tool(
        &self,
        tool: &str,
        args: &[OsString],
        env: &[(&str, OsString)],
        limit: Duration,
    ) -> Result<ToolEnd>;

    // --- the records

    /// Lock the records and drop those whose mount is gone; returns this mount namespace.
    fn records(&self) -> Result<(Self::Locked, u64)>;

    // --- root's trees, by descriptor

    /// Make `p` and its missing parents (root's, `mode`).
    fn make_root_dir(&self, p: &Path, mode: u32) -> io::Result<()>;
    /// Open a directory of root's (no symlink on the way).
    fn open_root(&self, p: &Path) -> io::Result<Self::Dir>;
    /// `fstat` of an opened directory.
    fn meta(&self, d: &Self::Dir) -> io::Result<FileMeta>;
    /// `mkdirat(name, 0755)` when missing, then open it beneath `d` (`RESOLVE_BENEATH |
    /// NO_SYMLINKS | NO_XDEV`): `ELOOP`/`ENOTDIR` not a directory, `EXDEV` a mount point.
    fn mkdir_open(&self, d: &Self::Dir, name: &str) -> io::Result<Self::Dir>;
    /// Make the directory root's, mode 0755, through its own descriptor.
    fn adopt(&self, d: &Self::Dir) -> io::Result<()>;
    /// `fstatat(name, AT_SYMLINK_NOFOLLOW)`; `None` when missing.
    fn entry(&self, d: &Self::Dir, name: &str) -> io::Result<Option<FileMeta>>;
    /// `unlinkat(name[, AT_REMOVEDIR])`: never follows.
    fn unlink(&self, d: &Self::Dir, name: &str, dir: bool) -> io::Result<()>;
    /// The directory `rel` beneath `d` (`d` itself when `rel` is empty).
    fn dir_beneath(&self, d: &Self::Dir, rel: &Path) -> io::Result<Self::Dir>;
    /// Open a file of root's (the cache's copy) read-only, `O_NOFOLLOW`.
    fn open_root_file(&self, p: &Path) -> io::Result<std::fs::File>;
    /// Is `p` a regular file (root's cache)?
    fn is_file(&self, p: &Path) -> bool;
    /// Open `name` beneath `d` as a mount point.
    fn open_target(&self, d: &Self::Dir, name: &str) -> io::Result<Target<Self::Target>>;

    // --- devices and mounts

    fn attach_loop(
        &self,
        backing: BorrowedFd<'_>,
        size: u64,
        rw: bool,
        label: &str,
    ) -> io::Result<Self::Loop>;
    /// `loopN`.
    fn loop_name(&self, l: &Self::Loop) -> String;
    /// Detach a loop device no mount uses (the mount failed).
    fn free_loop(&self, l: Self::Loop);
    /// Let the mount hold the device (autoclear frees it with the mount).
    fn hand_over_loop(&self, l: Self::Loop);
    /// `fsopen`/`fsmount` of `m`, moved onto the opened directory; the new mount's ID.
    fn mount_on(&self, t: &Self::Target, m: &KernelMount<'_>) -> io::Result<u64>;
    /// Undo [`Host::mount_on`], wherever the directory is now.
    fn detach(&self, t: &Self::Target);
    /// Unmount the mount with this ID wherever it is (never by path).
    fn unmount_id(&self, id: u64, lazy: bool) -> io::Result<()>;
    /// Where the mount with this ID is now.
    fn mount_point_of(&self, id: u64) -> Option<PathBuf>;
    /// Processes holding something under `mp`.
    fn holders(&self, mp: &Path) -> Vec<Holder>;
}

/// The system itself.
pub struct RealHost {
    sys: swpool_sys::sys::RealSys,
}

impl RealHost {
    pub fn new() -> RealHost {
        RealHost {
            sys: swpool_sys::sys::RealSys::new(None),
        }
    }
}

fn file_meta(st: &rustix::fs::Stat) -> FileMeta {
    use rustix::fs::FileType;
    FileMeta {
        kind: match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => FileKind::Dir,
            FileType::RegularFile => FileKind::File,
            FileType::Symlink => FileKind::Symlink,
            _ => FileKind::Other,
        },
        uid: st.st_uid,
        mode: st.st_mode,
        dev: st.st_dev,
        ino: st.st_ino,
    }
}

impl Host for RealHost {
    type Dir = OwnedFd;
    type Target = Pinned;
    type Loop = LoopDevice;
    type Locked = State;
    type Sys = swpool_sys::sys::RealSys;

    fn sys(&self) -> &Self::Sys {
        &self.sys
    }

    fn open_as(
        &self,
        who: Option<As>,
        path: &Path,
        write: bool,
        limit: Duration,
    ) -> std::result::Result<Opened, OpenError> {
        crate::bounded::open_as(who, path, write, limit)
    }

    fn run_tool(
        &self,
        tool: &str,
        args: &[OsString],
        env: &[(&str, OsString)],
        limit: Duration,
    ) -> Result<ToolEnd> {
        let mut cmd = crate::tools::command(tool)?;
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        crate::bounded::run_tool(cmd, limit).map_err(|e| HelperError::tool(tool, e.to_string()))
    }

    fn records(&self) -> Result<(State, u64)> {
        State::open_live()
    }

    fn make_root_dir(&self, p: &Path, mode: u32) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(p)
    }

    fn open_root(&self, p: &Path) -> io::Result<OwnedFd> {
        Pinned::open_root(p)
    }

    fn meta(&self, d: &OwnedFd) -> io::Result<FileMeta> {
        Ok(file_meta(&rustix::fs::fstat(d)?))
    }

    fn mkdir_open(&self, d: &OwnedFd, name: &str) -> io::Result<OwnedFd> {
        kmount::mkdir_open(d, name, 0o755, None)
    }

    fn adopt(&self, fd: &OwnedFd) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        rustix::fs::chownat(
            fd,
            "",
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::ROOT),
            rustix::fs::AtFlags::EMPTY_PATH,
        )?;
        // an O_PATH descriptor takes no fchmod: its own /proc link, which is that directory
        rustix::fs::chmod(
            format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
            rustix::fs::Mode::from_raw_mode(0o755),
        )?;
        Ok(())
    }

    fn entry(&self, d: &OwnedFd, name: &str) -> io::Result<Option<FileMeta>> {
        match rustix::fs::statat(d, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(file_meta(&st))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn unlink(&self, d: &OwnedFd, name: &str, dir: bool) -> io::Result<()> {
        let flags = if dir {
            rustix::fs::AtFlags::REMOVEDIR
        } else {
            rustix::fs::AtFlags::empty()
        };
        Ok(rustix::fs::unlinkat(d, name, flags)?)
    }

    fn dir_beneath(&self, d: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
        if rel.as_os_str().is_empty() {
            Ok(rustix::io::dup(d)?)
        } else {
            swpool_sys::pinned::dir_beneath(d, rel)
        }
    }

    fn open_root_file(&self, p: &Path) -> io::Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(p)
    }

    fn is_file(&self, p: &Path) -> bool {
        p.is_file()
    }

    fn open_target(&self, d: &OwnedFd, name: &str) -> io::Result<Target<Pinned>> {
        let p = Pinned::open_beneath(d, Path::new(name))?;
        Ok(Target {
            dev: p.dev,
            ino: p.ino,
            empty: p.empty,
            handle: p,
        })
    }

    fn attach_loop(
        &self,
        backing: BorrowedFd<'_>,
        size: u64,
        rw: bool,
        label: &str,
    ) -> io::Result<LoopDevice> {
        LoopDevice::attach(backing, size, rw, label)
    }

    fn loop_name(&self, l: &LoopDevice) -> String {
        l.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    fn free_loop(&self, l: LoopDevice) {
        l.detach();
    }

    fn hand_over_loop(&self, l: LoopDevice) {
        drop(l);
    }

    fn mount_on(&self, t: &Pinned, m: &KernelMount<'_>) -> io::Result<u64> {
        kmount::mount_on(t, m)
    }

    fn detach(&self, t: &Pinned) {
        let _ = t.detach();
    }

    fn unmount_id(&self, id: u64, lazy: bool) -> io::Result<()> {
        kmount::unmount_id(id, lazy).map(drop)
    }

    fn mount_point_of(&self, id: u64) -> Option<PathBuf> {
        kmount::mount_point_of(id)
    }

    fn holders(&self, mp: &Path) -> Vec<Holder> {
        let ns = |p: &str| {
            std::fs::metadata(p)
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .ok()
        };
        let here = ns("/proc/self/ns/mnt");
        let (found, _) = swpool_sys::proc::holders(mp);
        found
            .into_iter()
            .map(|h| {
                let theirs = ns(&format!("/proc/{}/ns/mnt", h.pid));
                Holder {
                    pid: h.pid,
                    uid: h.uid,
                    command: h.command,
                    same_ns: theirs.is_some() && theirs == here,
                }
            })
            .collect()
    }
}

#[cfg(test)]
pub mod fake;
