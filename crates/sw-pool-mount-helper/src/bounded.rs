//! Root never waits on a user: every step on a file the caller named (opening it, `fstat`,
//! `fstatfs`, a read) runs on a thread of its own and is given up after the configured time, and
//! every tool run on a caller's file is killed (by the PID the helper holds) when its time is up.
//! A step given up may still sleep in the kernel on the caller's file system (a stopped FUSE
//! daemon): the helper refuses the request and exits, which ends that thread (the kernel's FUSE
//! waits end on a fatal signal). No lock is held meanwhile (`state.rs` is taken only around the
//! records).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file system type of a FUSE mount (`fstatfs`'s `f_type`).
pub const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// `f` on a thread of its own; `None` when it did not finish within `limit` (the thread is left
/// behind, asleep on whatever it waits for, and ends with the process).
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("user-file".into())
        .spawn(move || {
            let _ = tx.send(f());
        });
    if spawned.is_err() {
        return None;
    }
    rx.recv_timeout(limit).ok()
}

/// Whose file-system credentials a step on a caller's file runs with.
#[derive(Debug, Clone)]
pub struct As {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
}

/// A caller's file opened, and what `fstat`/`fstatfs` said of it.
#[derive(Debug)]
pub struct Opened {
    pub file: std::fs::File,
    pub meta: swpool_sys::sys::FileMeta,
    /// `fstatfs`'s `f_type`.
    pub fs_type: i64,
}

#[derive(Debug)]
pub enum OpenError {
    Io(std::io::Error),
    /// Opening or `fstat` did not finish in time.
    Stalled(Duration),
}

/// Open `path` as `who` (`None`: as root) on a thread of its own — never a symlink as its last
/// component, never blocking on a FIFO, never a controlling terminal — and `fstat`/`fstatfs` it,
/// all within `limit`. The thread takes `who`'s ids as its file-system ids (`setfsuid`,
/// `setfsgid` and the raw `setgroups` call act on the calling thread only), so root's own ids on
/// the other threads never change.
pub fn open_as(
    who: Option<As>,
    path: &Path,
    write: bool,
    limit: Duration,
) -> Result<Opened, OpenError> {
    let p: PathBuf = path.to_path_buf();
    let r = within(limit, move || -> std::io::Result<Opened> {
        if let Some(w) = &who {
            become_on_this_thread(w)?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(&p)?;
        let m = file.metadata()?;
        let meta = {
            use std::os::unix::fs::MetadataExt;
            use swpool_sys::sys::{FileKind, FileMeta};
            let t = m.file_type();
            FileMeta {
                kind: if t.is_file() {
                    FileKind::File
                } else if t.is_dir() {
                    FileKind::Dir
                } else if t.is_symlink() {
                    FileKind::Symlink
                } else {
                    FileKind::Other
                },
                uid: m.uid(),
                mode: m.mode(),
                dev: m.dev(),
                ino: m.ino(),
            }
        };
        let fs_type = rustix::fs::fstatfs(&file)?.f_type as i64;
        Ok(Opened {
            file,
            meta,
            fs_type,
        })
    });
    match r {
        None => Err(OpenError::Stalled(limit)),
        Some(Ok(o)) => Ok(o),
        Some(Err(e)) => Err(OpenError::Io(e)),
    }
}

/// This thread's file-system ids and groups become `w`'s (checked: `setfsuid` reports no error).
fn become_on_this_thread(w: &As) -> std::io::Result<()> {
    // SAFETY: plain syscalls on ids; the slice outlives the call. SYS_setgroups (not glibc's
    // setgroups, which applies to every thread) changes this thread's groups only.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, w.groups.len(), w.groups.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::setfsgid(w.gid);
        libc::setfsuid(w.uid);
        // an invalid id changes nothing and returns the current one
        let (fu, fg) = (libc::setfsuid(u32::MAX), libc::setfsgid(u32::MAX));
        if fu as u32 != w.uid || fg as u32 != w.gid {
            return Err(std::io::Error::other(format!(
                "could not take uid {} gid {} to open the file (file-system ids now {fu}/{fg})",
                w.uid, w.gid
            )));
        }
    }
    Ok(())
}

// the bounded tool runner is swpool-sys's, the one every sw-pool program runs tools with
pub use swpool_sys::exec::ToolEnd;

/// Run `cmd` (stdout and stderr captured, at most 1 MiB of each kept), killed with SIGKILL — by
/// the PID of the child this process started, then reaped — when it has not ended within `limit`
/// ([`swpool_sys::exec::wait_bounded`]).
pub fn run_tool(mut cmd: std::process::Command, limit: Duration) -> std::io::Result<ToolEnd> {
    use std::process::Stdio;
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    swpool_sys::exec::wait_bounded(child, limit, 1 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_step_that_does_not_finish_is_given_up_in_time() {
        let t = Instant::now();
        let r = within(Duration::from_millis(200), || {
            std::thread::sleep(Duration::from_secs(30));
            1
        });
        assert_eq!(r, None);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(within(Duration::from_secs(5), || 7), Some(7));
    }

    #[test]
    fn open_as_reports_on_the_opened_file_and_follows_no_symlink() {
        // the stall itself (a stopped FUSE daemon) is shown on the virtual cluster (t_76)
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("img");
        std::fs::write(&f, b"x").unwrap();
        let o = open_as(None, &f, false, Duration::from_secs(5)).unwrap();
        assert_eq!(o.meta.kind, swpool_sys::sys::FileKind::File);
        assert_ne!(o.fs_type, FUSE_SUPER_MAGIC);
        std::os::unix::fs::symlink(&f, d.path().join("link")).unwrap();
        match open_as(None, &d.path().join("link"), false, Duration::from_secs(5)) {
            Err(OpenError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::ELOOP)),
            other => panic!("a symlink was opened: {other:?}"),
        }
    }

    #[test]
    fn the_callers_ids_apply_to_the_opening_thread_only() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root (setfsuid)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("root-only");
        std::fs::write(&f, b"x").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        let nobody = As {
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
        };
        match open_as(Some(nobody), &f, false, Duration::from_secs(5)) {
            Err(OpenError::Io(e)) => assert_eq!(e.raw_os_error(), Some(libc::EACCES)),
            other => panic!("opened as nobody: {other:?}"),
        }
        // this thread is still root
        assert!(rustix::process::geteuid().is_root());
        assert!(std::fs::File::open(&f).is_ok());
    }

    #[test]
    fn a_tool_past_its_time_is_killed_by_its_pid() {
        let t = Instant::now();
        let mut c = std::process::Command::new("/bin/sh");
        c.args(["-c", "echo started; exec sleep 30"]);
        match run_tool(c, Duration::from_millis(300)).unwrap() {
            ToolEnd::Killed(d) => assert_eq!(d, Duration::from_millis(300)),
            ToolEnd::Done(o) => panic!("not killed: {o:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        let mut c = std::process::Command::new("/bin/sh");
        c.args(["-c", "echo out; echo err >&2; exit 3"]);
        match run_tool(c, Duration::from_secs(10)).unwrap() {
            ToolEnd::Done(o) => {
                assert_eq!(o.status.code(), Some(3));
                assert_eq!(o.stdout, b"out\n");
                assert_eq!(o.stderr, b"err\n");
            }
            ToolEnd::Killed(_) => panic!("killed"),
        }
    }
}
