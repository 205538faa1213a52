//! The caller's side of `sw-pool run` / `sw-pool shell`: decide ([`crate::plan`]), take the layer,
//! clone pid 1 into new user, mount and PID namespaces, map the caller to its root, let it
//! re-execute the binary as `__enter` ([`crate::init`]), and wait for it.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use crate::init::Spec;
use crate::layer::{Layer, LayerStore};
use crate::plan::{self, Method};
use crate::{probe, EnvError};

/// What to run, and in what.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The command and its arguments (not empty).
    pub argv: Vec<OsString>,
    /// The writable layer, by name, in `store`.
    pub layer: Option<String>,
    /// uid 0 inside the environment (mapped to the caller).
    pub root: bool,
    /// The `sw-pool` binary (re-executed as pid 1).
    pub self_exe: PathBuf,
    /// `PATH` as the caller read it (to find fuse-overlayfs).
    pub path_var: Option<OsString>,
    pub verbose: bool,
}

/// What happened, for the caller to print with `-v` and to exit with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    pub method: Method,
    pub why: String,
    /// The command's exit status (128 + signal when a signal ended it), or 125/126/127 when the
    /// environment could not be set up or the command not started.
    pub status: i32,
}

/// Run `req` in an environment; the command's exit status.
pub fn run(
    req: &RunRequest,
    store: &LayerStore,
    on_plan: &dyn Fn(&plan::Plan),
) -> Result<RunOutcome, EnvError> {
    if req.argv.is_empty() {
        return Err(EnvError::Unsupported("no command to run".into()));
    }
    let layer: Option<Layer> = req.layer.as_deref().map(|n| store.get(n)).transpose()?;
    let facts = probe::facts(req.path_var.as_deref());
    let p = plan::choose(layer.is_some(), &facts)?;
    on_plan(&p);
    let _lock = layer.as_ref().map(|l| store.lock(l)).transpose()?;
    let binds = match &layer {
        Some(l) => {
            let mi = swpool_sys::proc::read_mountinfo()
                .map_err(|e| EnvError::io("cannot read", "/proc/self/mountinfo", e))?;
            let points: Vec<PathBuf> = mi.into_iter().map(|m| m.mount_point).collect();
            plan::binds(&points, &l.merged)
        }
        None => Vec::new(),
    };
    let spec = Spec {
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
        root: req.root,
        method: p.method,
        name: layer.as_ref().map_or("-".into(), |l| l.name.clone()),
        layer,
        fuse_overlayfs: facts.fuse_overlayfs.clone(),
        binds,
        cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        argv: req.argv.clone(),
        verbose: req.verbose,
    };
    let json = serde_json::to_string(&spec).expect("a spec serialises");
    // pid 1 is `sw-pool-enter` beside the binary when installed (small: fast to start), else the
    // binary itself as `sw-pool __enter`
    let small = req.self_exe.with_file_name("sw-pool-enter");
    let (exe, args): (&std::path::Path, &[&[u8]]) = if small.is_file() {
        (&small, &[b"sw-pool-enter"])
    } else {
        (&req.self_exe, &[b"sw-pool", b"__enter"])
    };
    let status = start(exe, args, &json, spec.uid, spec.gid)?;
    Ok(RunOutcome {
        method: p.method,
        why: p.why,
        status,
    })
}

fn cstr(b: &[u8], what: &str) -> Result<CString, EnvError> {
    CString::new(b).map_err(|_| EnvError::Unsupported(format!("{what} contains a NUL byte")))
}

/// Clone pid 1, map it, let it exec `exe ARGS.. json`, wait; its exit status.
fn start(
    exe: &std::path::Path,
    args: &[&[u8]],
    json: &str,
    uid: u32,
    gid: u32,
) -> Result<i32, EnvError> {
    // everything the child touches is made before the clone: between clone and exec it may only
    // make system calls (this process can have other threads)
    let c_exe = cstr(exe.as_os_str().as_bytes(), "the program path")?;
    let mut c_args = args
        .iter()
        .map(|a| cstr(a, "an argument"))
        .collect::<Result<Vec<_>, _>>()?;
    c_args.push(cstr(json.as_bytes(), "the environment's specification")?);
    let mut argv: Vec<*const libc::c_char> = c_args.iter().map(|c| c.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut fds = [0i32; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(EnvError::Start {
            what: "pipe".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    let (rd, wr) = (fds[0], fds[1]);
    let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::SIGCHLD;
    // SAFETY: a fork-like clone (no new stack); the child only makes system calls until execv
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags as libc::c_ulong, 0, 0, 0, 0) };
    if pid == 0 {
        unsafe {
            libc::close(wr);
            // the environment ends with its launcher, whatever ends the launcher
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // EOF: the launcher died or could not map us
            let mut b = [0u8; 1];
            if libc::read(rd, b.as_mut_ptr().cast(), 1) != 1 {
                libc::_exit(crate::EXIT_SETUP); // the launcher could not map us
            }
            libc::execv(c_exe.as_ptr(), argv.as_ptr());
            libc::_exit(crate::EXIT_CANNOT_EXEC);
        }
    }
    unsafe { libc::close(rd) };
    if pid < 0 {
        let e = std::io::Error::last_os_error();
        unsafe { libc::close(wr) };
        let hint = match e.raw_os_error() {
            Some(libc::EPERM) => ": unprivileged user namespaces are not allowed here (a sysctl, a seccomp filter or a container runtime forbids them)",
            Some(libc::ENOSPC) => ": the limit of user or PID namespaces is reached (sysctl user.max_user_namespaces)",
            Some(libc::EINVAL) => ": this kernel does not support the namespaces needed",
            _ => "",
        };
        return Err(EnvError::Start {
            what: format!("new user, mount and PID namespaces{hint}"),
            source: e,
        });
    }
    let pid = pid as i32;
    let mapped = (|| -> std::io::Result<()> {
        std::fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
        std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {uid} 1"))?;
        std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {gid} 1"))?;
        Ok(())
    })();
    if let Err(e) = mapped {
        unsafe { libc::close(wr) }; // the child exits 125 without running anything
        let _ = wait(pid);
        return Err(EnvError::Start {
            what: "mapping your uid and gid into the new user namespace".into(),
            source: e,
        });
    }
    unsafe {
        libc::write(wr, b"g".as_ptr().cast(), 1);
        libc::close(wr);
    }
    wait(pid).map_err(|e| EnvError::Start {
        what: "waiting for the environment".into(),
        source: e,
    })
}

/// Wait for `pid`; its exit status (128 + signal for a signal).
fn wait(pid: i32) -> std::io::Result<i32> {
    loop {
        let mut st = 0;
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid {
            let es = std::process::ExitStatus::from_raw(st);
            return Ok(match (es.code(), es.signal()) {
                (Some(c), _) => c,
                (None, Some(s)) => 128 + s,
                _ => crate::EXIT_SETUP,
            });
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}
