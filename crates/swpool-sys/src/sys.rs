//! The operations a mount needs from the system, behind a trait (youki's `syscall/` pattern):
//! [`RealSys`] does them, [`FakeSys`] records them and plays a script, so that the order of steps and
//! the clean-up after each kind of failure are unit-tested without root and without FUSE.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

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
    real: Option<crate::pinned::Pinned>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Dir,
    File,
    Symlink,
    Other,
}

/// The system calls and process operations of mounting and unmounting.
pub trait Sys {
    /// The effective uid of the caller.
    fn euid(&self) -> u32;
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
    fn sleep(&self, d: Duration);
    /// Root: open the (canonical) mount point once, following no symlink.
    fn pin(&self, p: &Path) -> io::Result<PinnedDir>;
    /// Root: a fresh staging directory only root can reach.
    fn stage(&self) -> io::Result<PathBuf>;
    /// Root: move the mount at `stage` onto the pinned directory.
    fn attach(&self, stage: &Path, to: &PinnedDir) -> io::Result<()>;
    /// Root: undo [`Sys::attach`] wherever the directory is now.
    fn detach(&self, to: &PinnedDir);
    /// Detach whatever is still mounted on the stage and remove it.
    fn remove_stage(&self, stage: &Path);
    /// Root: `umount2(mp, UMOUNT_NOFOLLOW [| MNT_DETACH])`.
    fn unmount_nofollow(&self, mp: &Path, lazy: bool) -> Result<(), ExecError>;
}

/// The real system.
#[derive(Debug, Default)]
pub struct RealSys {
    children: Mutex<HashMap<u32, Child>>,
}

impl RealSys {
    pub fn new() -> RealSys {
        RealSys::default()
    }
}

fn kind_of(ft: std::fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// Root's `lstat`: the parent walked from `/` by descriptor ([`crate::walk`]), the last component
/// looked at in it without following it. A user's symlink on the parent path is `ELOOP`, never
/// followed (a plain `lstat` would report the symlink target's entry).
fn lstat_walked(p: &Path) -> io::Result<FileMeta> {
    use rustix::fs::{AtFlags, FileType};
    let (dir, name) = crate::walk::walk_parent(p)?;
    let st = rustix::fs::statat(&dir.fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(FileMeta {
        kind: match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => FileKind::Symlink,
            FileType::Directory => FileKind::Dir,
            FileType::RegularFile => FileKind::File,
            _ => FileKind::Other,
        },
        uid: st.st_uid,
        mode: st.st_mode as u32,
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

impl Sys for RealSys {
    fn euid(&self) -> u32 {
        rustix::process::geteuid().as_raw()
    }
    fn lstat(&self, p: &Path) -> io::Result<FileMeta> {
        if self.euid() == 0 {
            return lstat_walked(p);
        }
        let m = std::fs::symlink_metadata(p)?;
        Ok(FileMeta {
            kind: kind_of(m.file_type()),
            uid: m.uid(),
            mode: m.mode(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }
    fn dir_is_empty(&self, p: &Path) -> io::Result<bool> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = if self.euid() == 0 {
            // root: in the directory its walk reached, never through a user's symlink
            let (dir, name) = crate::walk::walk_parent(p)?;
            rustix::fs::openat(&dir.fd, name, flags, Mode::empty())?
        } else {
            rustix::fs::open(p, flags, Mode::empty())?
        };
        let mut dir = rustix::fs::Dir::read_from(&fd)?;
        for e in dir.by_ref() {
            let e = e?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                return Ok(false);
            }
        }
        Ok(true)
    }
    fn probe(&self, p: &Path) -> io::Result<()> {
        // statfs always reaches the FUSE process (stat may be answered from cached attributes:
        // squashfuse_ll caches them forever). A hung process must not hang us: give it 5 s.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = p.to_path_buf();
        std::thread::spawn(move || {
            let _ = tx.send(rustix::fs::statfs(&path).map(drop).map_err(io::Error::from));
        });
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(r) => r,
            Err(_) => Err(io::Error::from_raw_os_error(libc::ENOTCONN)),
        }
    }
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        crate::proc::read_mountinfo()
    }
    fn open_fuse_device(&self) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map(drop)
    }
    fn spawn_helper(&self, cmd: &ToolCommand, log: &Path) -> Result<u32, ExecError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::process::CommandExt;
        let cmdline = cmd.cmdline();
        let spawn_err = |source| ExecError::Spawn {
            cmdline: cmdline.clone(),
            source,
        };
        let mut c = cmd.command()?;
        let err = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(log)
            .map_err(spawn_err)?;
        // fuse2fs reports some failures on stdout: both go to the log
        let out = err.try_clone().map_err(spawn_err)?;
        // its own process group: a Ctrl-C in the user's terminal after the mount does not end it
        c.stdout(out).stderr(err).process_group(0);
        tracing::debug!(command = %cmdline, log = %log.display(), "starting FUSE helper");
        let child = c.spawn().map_err(spawn_err)?;
        let pid = child.id();
        crate::exec::track(pid, true);
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, child);
        Ok(pid)
    }
    fn helper_exited(&self, pid: u32) -> io::Result<Option<String>> {
        let mut l = self.children.lock().unwrap_or_else(|e| e.into_inner());
        match l.get_mut(&pid) {
            Some(c) => Ok(c.try_wait()?.map(|s| s.to_string())),
            None => Ok(Some("not a child of this process".into())),
        }
    }
    fn kill_helper(&self, pid: u32) {
        let child = self
            .children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pid);
        let Some(mut child) = child else {
            tracing::warn!(
                pid,
                "refusing to signal pid {pid}: not a helper this process started"
            );
            return;
        };
        if pid > 1 {
            if let Ok(None) = child.try_wait() {
                if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::Term);
                }
                for _ in 0..50 {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                let _ = child.kill(); // SIGKILL if still there (a no-op error if reaped)
            }
            let _ = child.wait();
        }
        crate::exec::track(pid, false);
    }
    fn release_helper(&self, pid: u32) -> bool {
        if !crate::exec::release(pid) {
            return false; // interrupted: the helper is ours to clean up (kill_helper)
        }
        // dropping a Child neither kills nor waits: the helper lives on (re-parented when we exit)
        self.children
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&pid);
        true
    }
    fn run(&self, cmd: &ToolCommand) -> Result<Output, ExecError> {
        cmd.run()
    }
    fn read_log(&self, log: &Path) -> String {
        std::fs::read(log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
    fn pin(&self, p: &Path) -> io::Result<PinnedDir> {
        let real = crate::pinned::Pinned::open(p)?;
        Ok(PinnedDir {
            path: p.to_path_buf(),
            dev: real.dev,
            ino: real.ino,
            empty: real.empty,
            real: Some(real),
        })
    }
    fn stage(&self) -> io::Result<PathBuf> {
        crate::pinned::Stage::create().map(|s| s.path)
    }
    fn attach(&self, stage: &Path, to: &PinnedDir) -> io::Result<()> {
        match &to.real {
            Some(r) => r.attach(stage),
            None => Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
    }
    fn detach(&self, to: &PinnedDir) {
        if let Some(r) = &to.real {
            let _ = r.detach();
        }
    }
    fn remove_stage(&self, stage: &Path) {
        crate::pinned::Stage::remove(stage)
    }
    fn unmount_nofollow(&self, mp: &Path, lazy: bool) -> Result<(), ExecError> {
        use rustix::mount::UnmountFlags;
        let flags = if lazy {
            UnmountFlags::NOFOLLOW | UnmountFlags::DETACH
        } else {
            UnmountFlags::NOFOLLOW
        };
        // the parent walked by descriptor (no user's symlink followed), the mount point looked up
        // in it without following a symlink: a parent swapped for a symlink after the mount table
        // was read cannot send root's unmount to another mount
        let fail = |status: String, stderr: String| ExecError::Failed {
            tool: crate::exec::Tool::Umount,
            cmdline: format!(
                "umount2({}, UMOUNT_NOFOLLOW{})",
                crate::exec::show(mp),
                if lazy { "|MNT_DETACH" } else { "" }
            ),
            status,
            stderr,
        };
        let (dir, name) =
            crate::walk::walk_parent(mp).map_err(|e| fail("walk".into(), e.to_string()))?;
        let mut at = std::ffi::OsString::from(format!("/proc/self/fd/{}/", {
            use std::os::fd::AsRawFd;
            dir.fd.as_raw_fd()
        }));
        at.push(name);
        rustix::mount::unmount(Path::new(&at), flags).map_err(|e| {
            fail(
                format!("errno {}", e.raw_os_error()),
                io::Error::from(e).to_string(),
            )
        })
    }
}

/// The recording fake of [`Sys`] (unit tests only): a scripted FUSE helper and mount table, so that
/// mount ordering and clean-up after failures are tested without root or FUSE.
#[cfg(any(test, feature = "testkit"))]
pub use fake::{FakeHelper, FakeScript, FakeSys};

#[cfg(any(test, feature = "testkit"))]
mod fake {
    use super::*;
    use std::path::PathBuf;

    /// How the fake helper behaves.
    #[derive(Debug, Clone, Default)]
    pub enum FakeHelper {
        /// The mount appears after this many polls.
        #[default]
        Mounts,
        MountsAfter(u32),
        /// The helper exits with this stderr after this many polls, mounting nothing.
        Exits(u32, String),
        /// The helper never mounts and never exits (a hung helper).
        Hangs,
        /// The helper program is not installed.
        NotInstalled,
    }

    /// The script the fake plays.
    #[derive(Debug, Clone, Default)]
    pub struct FakeScript {
        pub helper: FakeHelper,
        /// `open("/dev/fuse")` fails with this.
        pub fuse_device: Option<io::ErrorKind>,
        /// The mount table before anything happens.
        pub mounts: Vec<MountEntry>,
        /// `fusermount3 -u` fails as busy (a lazy `-z` still works).
        pub busy: bool,
        /// `fusermount3 -u` fails as busy this many more times, then works (a transient holder).
        pub busy_transient: u32,
        /// Mount points whose FUSE process is dead (probe gives ENOTCONN).
        pub stale: Vec<PathBuf>,
        pub euid: u32,
        /// Root's pin of the mount point fails with this errno (a symlink appeared: `ELOOP`).
        pub pin_errno: Option<i32>,
        /// The pinned directory is another inode than the one checked (swapped in between).
        pub pin_other_inode: bool,
        /// Moving the staged mount onto the pinned directory fails with this errno.
        pub attach_errno: Option<i32>,
        /// The pinned directory was renamed before the mount was moved onto it.
        pub attach_elsewhere: bool,
        /// The directory is renamed right after the mount was moved onto it (a rename that had
        /// checked it before): the first look at the mount table still shows it at the path.
        pub moved_after_attach: bool,
    }

    /// A recording fake: file metadata comes from the real file system (tests use temporary
    /// directories), every mount-related operation is recorded in `calls` and follows `script`.
    #[derive(Debug, Default)]
    pub struct FakeSys {
        pub script: Mutex<FakeScript>,
        pub calls: Mutex<Vec<String>>,
        state: Mutex<FakeState>,
    }

    /// The mount ID of the clone `attach` moves onto the pinned directory (a mount of its own).
    const MOVED_ID: u32 = 901;

    #[derive(Debug, Default)]
    struct FakeState {
        /// Reads of the mount table since the attach (for `moved_after_attach`).
        reads_after_attach: Option<u32>,
        polls: u32,
        running: Option<(u32, PathBuf, String)>,
        next_pid: u32,
    }

    impl FakeSys {
        pub fn new(script: FakeScript) -> FakeSys {
            FakeSys {
                script: Mutex::new(script),
                calls: Mutex::default(),
                state: Mutex::new(FakeState {
                    next_pid: 4242,
                    ..Default::default()
                }),
            }
        }
        fn rec(&self, s: impl Into<String>) {
            self.calls.lock().unwrap().push(s.into());
        }
        /// The recorded calls, in order.
        pub fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
        /// The fake mount table now.
        pub fn mount_table(&self) -> Vec<MountEntry> {
            self.script.lock().unwrap().mounts.clone()
        }
        fn fake_entry(p: &Path, fstype: &str) -> MountEntry {
            MountEntry {
                mount_id: 900,
                mount_point: p.to_path_buf(),
                mount_options: "ro,nosuid,nodev,relatime".into(),
                fstype: fstype.into(),
                source: "fake".into(),
                super_options: "ro,user_id=0,group_id=0".into(),
            }
        }
        /// Advance the fake helper by one poll.
        fn tick(&self) {
            let mut st = self.state.lock().unwrap();
            let Some((pid, mp, fstype)) = st.running.clone() else {
                return;
            };
            st.polls += 1;
            let polls = st.polls;
            let mut sc = self.script.lock().unwrap();
            let appear = match &sc.helper {
                FakeHelper::Mounts => true,
                FakeHelper::MountsAfter(n) => polls >= *n,
                _ => false,
            };
            if appear && crate::proc::mount_at(&sc.mounts, &mp).is_none() {
                sc.mounts.push(Self::fake_entry(&mp, &fstype));
                let _ = pid;
            }
        }
    }

    impl Sys for FakeSys {
        fn euid(&self) -> u32 {
            self.script.lock().unwrap().euid
        }
        fn lstat(&self, p: &Path) -> io::Result<FileMeta> {
            let m = RealSys::new().lstat(p)?;
            Ok(FileMeta {
                uid: self.euid(), // temporary directories in tests belong to the fake caller
                ..m
            })
        }
        fn dir_is_empty(&self, p: &Path) -> io::Result<bool> {
            RealSys::new().dir_is_empty(p)
        }
        fn probe(&self, p: &Path) -> io::Result<()> {
            self.rec(format!("probe {}", p.display()));
            if self.script.lock().unwrap().stale.iter().any(|s| s == p) {
                return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
            }
            Ok(())
        }
        fn mounts(&self) -> io::Result<Vec<MountEntry>> {
            self.tick();
            let mut st = self.state.lock().unwrap();
            if let Some(n) = st.reads_after_attach.as_mut() {
                *n += 1;
                if *n == 2 {
                    // the rename completes: the attached mount now sits under another name
                    let mut sc = self.script.lock().unwrap();
                    if let Some(e) = sc.mounts.iter_mut().rev().find(|m| m.mount_id == MOVED_ID) {
                        e.mount_point = e.mount_point.with_extension("renamed");
                    }
                }
            }
            drop(st);
            Ok(self.mount_table())
        }
        fn open_fuse_device(&self) -> io::Result<()> {
            self.rec("open /dev/fuse");
            match self.script.lock().unwrap().fuse_device {
                Some(k) => Err(io::Error::from(k)),
                None => Ok(()),
            }
        }
        fn spawn_helper(&self, cmd: &ToolCommand, _log: &Path) -> Result<u32, ExecError> {
            self.rec(format!("spawn {}", cmd.cmdline()));
            if let FakeHelper::NotInstalled = self.script.lock().unwrap().helper {
                return Err(ExecError::NotFound {
                    tool: cmd.tool(),
                    searched: vec![PathBuf::from("/fake/bin")],
                });
            }
            let mut st = self.state.lock().unwrap();
            let pid = st.next_pid;
            st.next_pid += 1;
            st.polls = 0;
            // the mount point is the last argument that is an absolute path
            let mp = cmd
                .cmdline()
                .split(' ')
                .rfind(|a| a.starts_with('/'))
                .map(PathBuf::from)
                .unwrap_or_default();
            let fstype = format!("fuse.{}", cmd.tool().program());
            st.running = Some((pid, mp, fstype));
            Ok(pid)
        }
        fn helper_exited(&self, pid: u32) -> io::Result<Option<String>> {
            let polls = self.state.lock().unwrap().polls;
            let r = match &self.script.lock().unwrap().helper {
                FakeHelper::Exits(n, _) if polls >= *n => Some("exit status: 1".to_string()),
                _ => None,
            };
            if r.is_some() {
                self.rec(format!("exited {pid}"));
                self.state.lock().unwrap().running = None;
            }
            Ok(r)
        }
        fn kill_helper(&self, pid: u32) {
            self.rec(format!("kill {pid}"));
            self.state.lock().unwrap().running = None;
        }
        fn release_helper(&self, pid: u32) -> bool {
            self.rec(format!("release {pid}"));
            self.state.lock().unwrap().running = None;
            true
        }
        fn run(&self, cmd: &ToolCommand) -> Result<Output, ExecError> {
            let line = cmd.cmdline();
            self.rec(format!("run {line}"));
            let mp = PathBuf::from(line.rsplit(' ').next().unwrap_or_default());
            let mut sc = self.script.lock().unwrap();
            let lazy = line.contains(" -z ") || line.contains(" -l ");
            let transient = sc.busy_transient > 0 && !lazy;
            if transient {
                sc.busy_transient -= 1;
            }
            if (sc.busy || transient) && !lazy && !sc.stale.contains(&mp) {
                return Err(ExecError::Failed {
                    tool: cmd.tool(),
                    cmdline: line.clone(),
                    status: "exit status: 1".into(),
                    stderr: format!(
                        "{}: failed to unmount {}: Device or resource busy",
                        cmd.tool(),
                        mp.display()
                    ),
                });
            }
            match sc.mounts.iter().rposition(|m| m.mount_point == mp) {
                Some(i) => {
                    sc.mounts.remove(i);
                    sc.stale.retain(|s| s != &mp);
                    Ok(Output {
                        stdout: String::new(),
                        stderr: String::new(),
                    })
                }
                None => Err(ExecError::Failed {
                    tool: cmd.tool(),
                    cmdline: line.clone(),
                    status: "exit status: 1".into(),
                    stderr: format!("{}: entry for {} not found", cmd.tool(), mp.display()),
                }),
            }
        }
        fn read_log(&self, _log: &Path) -> String {
            match &self.script.lock().unwrap().helper {
                FakeHelper::Exits(_, s) => s.clone(),
                _ => String::new(),
            }
        }
        fn sleep(&self, _d: Duration) {}
        fn pin(&self, p: &Path) -> io::Result<PinnedDir> {
            self.rec(format!("pin {}", p.display()));
            let sc = self.script.lock().unwrap().clone();
            if let Some(e) = sc.pin_errno {
                return Err(io::Error::from_raw_os_error(e));
            }
            let m = self.lstat(p)?;
            Ok(PinnedDir {
                path: p.to_path_buf(),
                dev: m.dev,
                ino: if sc.pin_other_inode { m.ino + 1 } else { m.ino },
                empty: self.dir_is_empty(p)?,
                real: None,
            })
        }
        fn stage(&self) -> io::Result<PathBuf> {
            self.rec("stage");
            Ok(PathBuf::from("/run/sw-pool/stage-fake"))
        }
        fn attach(&self, stage: &Path, to: &PinnedDir) -> io::Result<()> {
            self.rec(format!("attach {} {}", stage.display(), to.path.display()));
            let mut sc = self.script.lock().unwrap();
            if let Some(e) = sc.attach_errno {
                return Err(io::Error::from_raw_os_error(e));
            }
            let Some(i) = sc.mounts.iter().rposition(|m| m.mount_point == stage) else {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            };
            let mut e = sc.mounts[i].clone();
            e.mount_id = MOVED_ID;
            e.mount_point = if sc.attach_elsewhere {
                to.path.with_extension("renamed")
            } else {
                to.path.clone()
            };
            sc.mounts.push(e);
            if sc.moved_after_attach {
                self.state.lock().unwrap().reads_after_attach = Some(0);
            }
            Ok(())
        }
        fn detach(&self, to: &PinnedDir) {
            self.rec(format!("detach {}", to.path.display()));
            let mut sc = self.script.lock().unwrap();
            let renamed = to.path.with_extension("renamed");
            sc.mounts
                .retain(|m| m.mount_point != to.path && m.mount_point != renamed);
        }
        fn unmount_nofollow(&self, mp: &Path, lazy: bool) -> Result<(), ExecError> {
            let c = crate::exec::ToolCommand::new(crate::exec::Tool::Umount);
            let c = if lazy { c.arg("-l") } else { c };
            self.run(&c.end_of_options().path(mp)).map(drop)
        }
        fn remove_stage(&self, stage: &Path) {
            self.rec(format!("remove stage {}", stage.display()));
            self.script
                .lock()
                .unwrap()
                .mounts
                .retain(|m| m.mount_point != stage);
        }
    }
}
