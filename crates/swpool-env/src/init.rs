//! Pid 1 of an environment (`sw-pool __enter SPEC`): a fresh, single-threaded process, root of the
//! new user namespace (mapped to the caller), alone in the new mount and PID namespaces.
//!
//! It makes the environment's root ([`Spec::method`]), remounts `/proc`, starts the command (as the
//! caller's own uid through a nested user namespace, or as root with `--root`), forwards the
//! signals it gets to the command, reaps every orphan, and exits with the command's status. When it
//! exits the kernel kills whatever is left in the PID namespace (the FUSE daemon included) and the
//! mount namespace, with every mount made here, goes away.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MountPropagationFlags};

use crate::layer::Layer;
use crate::plan::Method;
use crate::{EXIT_CANNOT_EXEC, EXIT_NOT_FOUND, EXIT_SETUP};
use swpool_sys::exec::{Tool, ToolCommand};

/// Everything pid 1 needs, from the launcher (serialised into its argument).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Spec {
    pub uid: u32,
    pub gid: u32,
    /// uid 0 inside (else the caller's own uid).
    pub root: bool,
    pub method: Method,
    pub layer: Option<Layer>,
    pub fuse_overlayfs: Option<PathBuf>,
    /// Host mounts to bind into the new root.
    pub binds: Vec<PathBuf>,
    pub cwd: PathBuf,
    pub argv: Vec<OsString>,
    /// Shown to the command as `SW_POOL_ENVIRONMENT`.
    pub name: String,
    pub verbose: bool,
}

/// Signals forwarded to the command.
const FORWARD: [i32; 8] = [
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
];

fn fail(what: &str) -> ! {
    eprintln!("sw-pool: environment: {what}");
    std::process::exit(EXIT_SETUP)
}

extern "C" fn noop(_: libc::c_int) {}

/// The entry point of `sw-pool __enter SPEC`. Never returns.
pub fn main(spec_json: &str) -> ! {
    let spec: Spec = match serde_json::from_str(spec_json) {
        Ok(s) => s,
        Err(e) => fail(&format!("bad start specification from the launcher: {e}")),
    };
    if let Err(e) = setup(&spec) {
        fail(&e);
    }
    std::process::exit(supervise(&spec))
}

fn setup(spec: &Spec) -> Result<(), String> {
    // nothing we mount here propagates back to the host
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("cannot make the mounts private: {e}"))?;
    let proc_flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    match spec.method {
        Method::Plain => {
            rustix::mount::mount("proc", "/proc", "proc", proc_flags, "")
                .map_err(|e| format!("cannot mount /proc: {e}"))?;
        }
        Method::FuseOverlay | Method::KernelOverlay => {
            let l = spec.layer.as_ref().ok_or("an overlay without a layer")?;
            mount_overlay(spec, l)?;
            let m = &l.merged;
            for b in &spec.binds {
                let target = under(m, b);
                match rustix::mount::mount_recursive_bind(b.as_path(), target.as_path()) {
                    Ok(()) => {}
                    // a mount point that is not in the host's root file system's tree (a file
                    // bind-mounted over another type): nothing to bind it onto
                    Err(rustix::io::Errno::NOENT) | Err(rustix::io::Errno::NOTDIR) => {
                        tracing::debug!(mount = %b.display(), "not bound into the environment")
                    }
                    Err(e) => {
                        return Err(format!(
                            "cannot bind the host's {} into the environment: {e}",
                            b.display()
                        ))
                    }
                }
            }
            // a bound mount that contains the layer brought a copy of the overlay with it: the
            // environment sees the layer's plain (empty) mount point there instead. Only then: a
            // path to the layer that is not in a bound mount resolves through the overlay, whose
            // daemon would look the merged directory up in its lower, i.e. in itself, and hang
            // (after the move below its lower no longer has the overlay there)
            if spec.binds.iter().any(|b| m.starts_with(b)) {
                let copy = under(m, m);
                let _ = rustix::mount::unmount(&copy, rustix::mount::UnmountFlags::DETACH);
            }
            rustix::mount::mount("proc", under(m, Path::new("/proc")), "proc", proc_flags, "")
                .map_err(|e| format!("cannot mount /proc: {e}"))?;
            std::env::set_current_dir(m)
                .map_err(|e| format!("cannot enter {}: {e}", m.display()))?;
            rustix::mount::mount_move(".", "/")
                .map_err(|e| format!("cannot move the environment's root into place: {e}"))?;
            rustix::process::chroot(".")
                .map_err(|e| format!("cannot change into the environment's root: {e}"))?;
        }
    }
    if std::env::set_current_dir(&spec.cwd).is_err() {
        let _ = std::env::set_current_dir("/");
    }
    Ok(())
}

/// `b` (absolute) below `root`.
fn under(root: &Path, b: &Path) -> PathBuf {
    root.join(b.strip_prefix("/").unwrap_or(b))
}

fn mount_overlay(spec: &Spec, l: &Layer) -> Result<(), String> {
    match spec.method {
        Method::FuseOverlay => {
            let prog = spec
                .fuse_overlayfs
                .clone()
                .ok_or("fuse-overlayfs was not found")?;
            let opts = format!(
                "lowerdir=/,upperdir={},workdir={},squash_to_root",
                l.upper.display(),
                l.work.display()
            );
            ToolCommand::new(Tool::FuseOverlayfs)
                .program(prog)
                .arg("-o")
                .arg(opts)
                // fuse-overlayfs does not accept `--`; the mount point is absolute (no option)
                .path(&l.merged)
                .run(None)
                .map_err(|e| format!("cannot mount the layer {}: {e}", l.name))?;
            Ok(())
        }
        Method::KernelOverlay => {
            Err("the kernel overlay path needs the site's helper, which is not installed".into())
        }
        Method::Plain => Ok(()),
    }
}

/// Start the command, forward signals, reap; the command's exit status.
fn supervise(spec: &Spec) -> i32 {
    let Some((prog, args)) = spec.argv.split_first() else {
        fail("no command")
    };
    // the signals pid 1 forwards reach it only with a handler installed; blocked, they queue for
    // sigwaitinfo (the command starts with the mask and handlers reset)
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        for s in FORWARD.iter().chain(std::iter::once(&libc::SIGCHLD)) {
            libc::sigaddset(&mut set, *s);
            libc::signal(*s, noop as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).env("SW_POOL_ENVIRONMENT", &spec.name);
    let (uid, gid, root) = (spec.uid, spec.gid, spec.root);
    unsafe {
        cmd.pre_exec(move || {
            // the command starts with no signal blocked (std leaves the mask as it is; the
            // handlers installed above are reset by exec)
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            if !root {
                // the caller's own uid inside: a nested user namespace mapping it to this
                // one's root
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let _ = std::fs::write("/proc/self/setgroups", "deny");
                std::fs::write("/proc/self/uid_map", format!("{uid} 0 1"))?;
                std::fs::write("/proc/self/gid_map", format!("{gid} 0 1"))?;
            }
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "sw-pool: environment: cannot run {}: {e}",
                prog.to_string_lossy()
            );
            return if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXEC
            };
        }
    };
    let cmd_pid = child.id() as i32;
    loop {
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
        if sig < 0 {
            continue; // EINTR
        }
        if sig != libc::SIGCHLD {
            unsafe { libc::kill(cmd_pid, sig) };
            continue;
        }
        // reap everything that ended: the command, and orphans re-parented to pid 1
        loop {
            let mut st = 0;
            let pid = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == cmd_pid {
                let es = std::process::ExitStatus::from_raw(st);
                return match (es.code(), es.signal()) {
                    (Some(c), _) => c,
                    (None, Some(s)) => 128 + s,
                    _ => EXIT_CANNOT_EXEC,
                };
            }
        }
    }
}
