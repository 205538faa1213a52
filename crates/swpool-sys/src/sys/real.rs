//! [`RealSys`]: the real system.

use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Clock, FileKind, FileMeta, Mounts, PinnedDir, Processes};
use crate::exec::{ExecError, Output, ToolCommand};
use crate::proc::MountEntry;

/// The real system.
#[derive(Debug, Default)]
pub struct RealSys {
    children: Mutex<HashMap<u32, Child>>,
    /// The value of `PATH` that tools are looked up in ([`crate::exec::Tool::locate`]).
    path_var: Option<std::ffi::OsString>,
}

impl RealSys {
    /// The real system, running tools found in `path_var` (the value of `PATH` as the caller read
    /// it; `None`: the system directories only, as always for root) before the system directories.
    pub fn new(path_var: Option<&std::ffi::OsStr>) -> RealSys {
        RealSys {
            children: Mutex::default(),
            path_var: path_var.map(ToOwned::to_owned),
        }
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

impl Mounts for RealSys {
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
    fn attach(&self, stage: &Path, to: &PinnedDir) -> io::Result<u32> {
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
    fn unmount_id(&self, id: u32, user: u32, at: &Path, lazy: bool) -> Result<bool, ExecError> {
        let ours =
            |m: &MountEntry| m.is_fuse() && m.is_swpool_helper() && m.fuse_user_id() == Some(user);
        match crate::kmount::unmount_id_if(u64::from(id), lazy, &ours) {
            Ok(crate::kmount::Unmounted::Done) => Ok(true),
            Ok(crate::kmount::Unmounted::Gone) => Ok(false),
            Err(e) => Err(ExecError::Failed {
                tool: crate::exec::Tool::Umount,
                cmdline: format!(
                    "umount2(mount {id}, last seen at {}, UMOUNT_NOFOLLOW{})",
                    crate::exec::show(at),
                    if lazy { "|MNT_DETACH" } else { "" }
                ),
                status: "failed".into(),
                stderr: e.to_string(),
            }),
        }
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

impl Processes for RealSys {
    fn euid(&self) -> u32 {
        rustix::process::geteuid().as_raw()
    }
    fn spawn_helper(&self, cmd: &ToolCommand, log: &Path) -> Result<u32, ExecError> {
        use std::os::unix::fs::OpenOptionsExt;
        use std::os::unix::process::CommandExt;
        let cmdline = cmd.cmdline();
        let spawn_err = |source| ExecError::Spawn {
            cmdline: cmdline.clone(),
            source,
        };
        let mut c = cmd.command(self.path_var.as_deref())?;
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
        if let Ok(None) = child.try_wait() {
            let _ = crate::process::terminate(pid, Duration::from_secs(1), &mut || {
                matches!(child.try_wait(), Ok(Some(_)))
            });
        }
        let _ = child.wait();
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
        cmd.run(self.path_var.as_deref())
    }
    fn read_log(&self, log: &Path) -> String {
        std::fs::read(log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
    fn is_our_helper(&self, pid: u32, uid: u32, mp: &Path) -> bool {
        crate::process::is_our_helper(pid, uid, mp)
    }
    fn running(&self, pid: u32) -> bool {
        !crate::process::ended(pid)
    }
    fn terminate(&self, pid: u32, grace: Duration) -> Result<(), String> {
        crate::process::terminate(pid, grace, &mut || crate::process::ended(pid))
    }
}

impl Clock for RealSys {
    fn sleep(&self, d: Duration) {
        std::thread::sleep(d)
    }
    fn now(&self) -> Instant {
        Instant::now()
    }
}
