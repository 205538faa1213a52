//! The caller's side of `sw-pool run` / `sw-pool shell`: decide ([`crate::plan`]), take the layer,
//! clone pid 1 into new user, mount and PID namespaces, map the caller to its root, let it
//! re-execute the binary as `__enter` ([`crate::init`]), and wait for it.

use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, IntoRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

use swpool_sys::exec::{Tool, ToolCommand};

use crate::init::Spec;
use crate::layer::{Layer, LayerStore};
use crate::plan::{self, Method};
use crate::{rendezvous, EnvError};

mod steps;

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
    /// The user's private state directory on this node: environments meet their joiners in
    /// `<dir>/envs` ([`crate::rendezvous`]). `None`: never shared.
    pub state_dir: Option<PathBuf>,
    /// The caller's home directory: it stays the host's (not in the layer).
    pub home: Option<PathBuf>,
    /// Share the environment without a layer under this key (a job step's tasks on a node:
    /// [`crate::rendezvous::step_key`]).
    pub step_key: Option<String>,
    /// The layer's copy synced to this node for the job ([`crate::sync`]): used as the read-only
    /// lower under a fresh upper in `scratch`, removed when the environment ends.
    pub synced: Option<Synced>,
    /// Shadow mounts made in the environment's mount namespace only: `(source, original)`, each
    /// source (a loaded pool's `install/<pkg>/<ver>`) bound over its original directory.
    pub shadows: Vec<(PathBuf, PathBuf)>,
    /// The site's privileged helper (`sw-pool-mount-helper`, through `sudo -n`): with a layer it
    /// is asked for idmapped views of the site's trees, for the kernel's overlay ([`crate::idmap`]).
    pub helper: Option<PathBuf>,
    /// `--base` pools, bottom first: they replace the host's `/` as the lowest layers.
    pub bases: Vec<crate::Base>,
    /// `--pool` pools: mounted at their usual mount points in this environment only.
    pub pools: Vec<crate::EnvPool>,
    /// sw-pool's tree server (`sw-pool-serve`, config `fuse_reader = "sw-pool"`): it mounts the
    /// squashfs `--pool` and `--base` pools, squashfuse_ll being the fallback.
    pub tree_server: Option<PathBuf>,
}

/// A job's copy of a layer on this node.
#[derive(Debug, Clone)]
pub struct Synced {
    pub copies: crate::sync::NodeCopies,
    /// The state (a directory of `copies`).
    pub state: PathBuf,
    /// A node-local directory for the environment's upper, work and merged directories (made
    /// fresh by the start that creates the environment, removed by it at the end).
    pub scratch: PathBuf,
    /// Keep the upper here (`--keep-upper DIR`: `DIR/<node>`) instead of removing it.
    pub keep_upper: Option<PathBuf>,
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
    let synced = req.synced.as_ref().filter(|_| req.layer.is_some());
    let layer = steps::the_layer(req, synced, store)?;
    let base = !req.bases.is_empty();
    let (facts, mut p, fuse2fs) = steps::choose(req, synced, layer.is_some())?;
    // one environment per layer, and per job step on a node: join it when it runs
    let key = steps::environment_key(req, layer.as_ref(), base);
    let (share_lock, socket, rendezvous) =
        match steps::meet(req, key.as_deref(), layer.as_ref(), &mut p)? {
            steps::Meeting::Joined(conn, fds) => {
                on_plan(&p);
                return join(req, conn, fds, layer.as_ref(), p);
            }
            steps::Meeting::Alone => (None, None, None),
            steps::Meeting::Create(fd, rv) => (Some(fd), Some(rv.socket.clone()), Some(rv)),
        };
    // the kernel path is known to apply once the helper has answered (after the clone)
    let kernel = p.method == Method::KernelOverlay;
    if !kernel {
        on_plan(&p);
    }
    // the job's copy: its state held for the environment's life, its upper made fresh (a dead
    // environment's leftovers under this key are ours: its rendezvous lock was free)
    let held = match (synced, &layer) {
        (Some(s), Some(l)) => Some(steps::fresh_copy(s, l)?),
        _ => None,
    };
    if let (true, Method::FuseOverlay, Some(l)) = (req.root, p.method, &layer) {
        crate::rootless_root::seed(&l.upper);
    }
    // the layer's directories, opened and checked: pid 1 mounts these, never the paths (a layer
    // swapped after the check is not the one used)
    let (layer_fds, lock) = steps::open_layer(store, layer.as_ref(), synced.is_some())?;
    let layer_raw = layer_fds
        .as_ref()
        .map(|f| [&f.dir, &f.upper, &f.work, &f.merged].map(|d| d.as_raw_fd()));
    // pid 1 holds both locks for the environment's life, and gets the layer's directories
    let locks = lock
        .as_ref()
        .map(|l| l.fd())
        .into_iter()
        .chain(share_lock.as_ref().map(|f| f.as_fd()))
        .chain(held.as_ref().map(|f| f.as_fd()));
    let keep_fds = steps::inherited(layer_fds.as_ref(), locks)?;
    // the new root (the layer's merged tree, or the top base) gets the host's mounts
    let new_root = layer
        .as_ref()
        .map(|l| l.merged.clone())
        .or_else(|| req.bases.last().map(|b| b.at.clone()));
    let binds = match &new_root {
        Some(r) => steps::host_binds(req, r)?,
        None => Vec::new(),
    };
    // a single-threaded launcher (the front) runs pid 1 in its cloned child directly: one exec
    // and one program start less per environment
    let direct = single_threaded();
    let (rd, wr) = pipe()?;
    let spec = Spec {
        handshake_fd: kernel.then_some(rd.as_raw_fd()),
        uid: rustix::process::getuid().as_raw(),
        gid: rustix::process::getgid().as_raw(),
        root: req.root,
        method: p.method,
        name: layer.as_ref().map_or("-".into(), |l| l.name.clone()),
        lower: synced.map(|s| s.state.clone()),
        // (pools are mounted by pid 1's FUSE daemons as the namespace's root)
        identity: direct
            && !req.root
            && socket.is_none()
            && p.method == Method::Plain
            && req.pools.is_empty(),
        layer,
        layer_fds: layer_raw,
        fuse_overlayfs: facts.fuse_overlayfs.clone(),
        bases: req.bases.clone(),
        squashfuse: facts.squashfuse.clone(),
        tree_server: req.tree_server.clone(),
        pools: req.pools.clone(),
        fuse2fs,
        binds,
        shadows: req.shadows.clone(),
        cwd: std::env::current_dir().unwrap_or_else(|_| "/".into()),
        argv: req.argv.clone(),
        verbose: req.verbose,
        socket,
        keep_fds,
    };
    // the kernel path: the helper's views for pid 1, or the rootless path and why
    let info = |pid: i32, method: Method| steps::describe(key.as_deref(), &spec, pid, method);
    let mut told = |pid: i32| -> Option<Vec<u8>> {
        // a shared environment says what it is (`sw-pool list`)
        let note = |method: Method| {
            if let Some(rv) = &rendezvous {
                if let Err(e) = info(pid, method).write(rv) {
                    tracing::debug!(
                        "cannot describe the environment in {}: {e}",
                        rv.socket.display()
                    );
                }
            }
        };
        let Some(helper) = req.helper.as_deref().filter(|_| kernel) else {
            note(p.method);
            return None;
        };
        let h = crate::idmap::ask(helper, pid, req.root, req.path_var.as_deref());
        p.method = crate::idmap::method(&h);
        p.why = match &h {
            crate::idmap::Handshake::Views(v) => crate::idmap::why(v),
            crate::idmap::Handshake::Rootless(why) => match &facts.fuse_overlayfs {
                Some(f) => format!("{why}: rootless {}", f.display()),
                None => format!(
                    "{why}, and the rootless path needs fuse-overlayfs, which is not installed"
                ),
            },
        };
        on_plan(&p);
        note(p.method);
        Some(serde_json::to_vec(&h).expect("a handshake serialises"))
    };
    let pipe = Pipe {
        rd,
        wr,
        told: &mut told,
    };
    let status = start_pid1(req, &spec, direct, pipe);
    if let Some(rv) = &rendezvous {
        rendezvous::Info::remove(rv);
    }
    if let Some(s) = synced {
        steps::end_copy(req, s);
    }
    let status = status?;
    Ok(RunOutcome {
        method: p.method,
        why: p.why,
        status,
    })
}

/// Start pid 1: in the cloned child itself (`direct`), else as `sw-pool-enter` beside the binary
/// when installed (small: fast to start), else as the binary itself (`sw-pool __enter`), given
/// the spec as JSON. The command's exit status.
fn start_pid1(
    req: &RunRequest,
    spec: &Spec,
    direct: bool,
    pipe: Pipe<'_>,
) -> Result<i32, EnvError> {
    if direct {
        return start(Pid1::Run(spec), spec.uid, spec.gid, pipe);
    }
    let small = req.self_exe.with_file_name("sw-pool-enter");
    let (exe, args): (&std::path::Path, &[&[u8]]) = if small.is_file() {
        (&small, &[b"sw-pool-enter"])
    } else {
        (&req.self_exe, &[b"sw-pool", b"__enter"])
    };
    let json = serde_json::to_string(spec).expect("a spec serialises");
    start(
        Pid1::Exec {
            exe,
            args,
            json: &json,
            handshake: spec.handshake_fd.is_some(),
        },
        spec.uid,
        spec.gid,
        pipe,
    )
}

fn cstr(b: &[u8], what: &str) -> Result<CString, EnvError> {
    CString::new(b).map_err(|_| EnvError::Unsupported(format!("{what} contains a NUL byte")))
}

/// Whether this process has one thread (`/proc/self/status`): only then may its cloned child
/// run more than system calls (no lock another thread held at the clone).
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .map(|n| n.trim() == "1")
        })
        .unwrap_or(false)
}

/// How the cloned child becomes pid 1.
enum Pid1<'a> {
    /// Run pid 1's work in the child itself (the launcher is single-threaded).
    Run(&'a Spec),
    /// Exec `exe ARGS.. json`.
    Exec {
        exe: &'a std::path::Path,
        args: &'a [&'a [u8]],
        json: &'a str,
        /// Pid 1 reads the launcher's word from the start pipe.
        handshake: bool,
    },
}

/// The start pipe: pid 1 waits for one byte (its maps are written), then reads what `told`
/// returns for its pid, if anything, from `rd` (its `handshake_fd`) to the end.
struct Pipe<'a> {
    rd: std::os::fd::OwnedFd,
    wr: std::os::fd::OwnedFd,
    told: &'a mut dyn FnMut(i32) -> Option<Vec<u8>>,
}

fn pipe() -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), EnvError> {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(EnvError::Start {
            what: "pipe".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: just made, owned here only
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Clone pid 1, map it, let it become pid 1 as `how` says, wait; its exit status.
fn start(how: Pid1<'_>, uid: u32, gid: u32, pipe: Pipe<'_>) -> Result<i32, EnvError> {
    // everything the child touches is made before the clone: between clone and exec it may only
    // make system calls when this process has other threads
    let (direct, exec) = match how {
        Pid1::Run(spec) => (Some(spec), None),
        Pid1::Exec {
            exe, args, json, ..
        } => {
            let c_exe = cstr(exe.as_os_str().as_bytes(), "the program path")?;
            let mut c_args = args
                .iter()
                .map(|a| cstr(a, "an argument"))
                .collect::<Result<Vec<_>, _>>()?;
            c_args.push(cstr(json.as_bytes(), "the environment's specification")?);
            (None, Some((c_exe, c_args)))
        }
    };
    let argv: Option<Vec<*const libc::c_char>> = exec.as_ref().map(|(_, c_args)| {
        c_args
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    });
    let Pipe { rd, wr, told } = pipe;
    let handshake = match how {
        Pid1::Run(spec) => spec.handshake_fd.is_some(),
        Pid1::Exec { handshake, .. } => handshake,
    };
    let (rd, wr) = (rd.into_raw_fd(), wr.into_raw_fd());
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
            if handshake {
                // pid 1 reads the rest (the launcher's word on the kernel path) itself
                libc::fcntl(rd, libc::F_SETFD, 0);
            } else {
                libc::close(rd);
            }
            if let Some(spec) = direct {
                crate::init::run(spec.clone());
            }
            if let (Some((c_exe, _)), Some(argv)) = (&exec, &argv) {
                libc::execv(c_exe.as_ptr(), argv.as_ptr());
            }
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
    let inside = |id: u32| match direct {
        Some(s) if s.identity => id,
        _ => 0,
    };
    let mapped = crate::write_id_maps(
        &pid.to_string(),
        &format!("{} {uid} 1", inside(uid)),
        &format!("{} {gid} 1", inside(gid)),
        false,
    );
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
    }
    if let Some(word) = told(pid) {
        let mut off = 0;
        while off < word.len() {
            let n = unsafe { libc::write(wr, word[off..].as_ptr().cast(), word.len() - off) };
            if n <= 0 {
                break; // pid 1 ended: waited for below
            }
            off += n as usize;
        }
    }
    unsafe { libc::close(wr) };
    let _signals = Forwarding::to(pid);
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
            return Ok(crate::exit_code(std::process::ExitStatus::from_raw(st)));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Run the command in the running environment `conn` leads to.
fn join(
    req: &RunRequest,
    conn: std::os::unix::net::UnixStream,
    fds: Vec<std::os::fd::OwnedFd>,
    layer: Option<&Layer>,
    p: plan::Plan,
) -> Result<RunOutcome, EnvError> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    rendezvous::enter(&fds, req.root, &cwd)?;
    drop(fds);
    let (prog, args) = req.argv.split_first().expect("checked");
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args).env(
        "SW_POOL_ENVIRONMENT",
        layer.map_or("-", |l| l.name.as_str()),
    );
    let child = cmd.spawn();
    let _signals = child.as_ref().ok().map(|c| Forwarding::to(c.id() as i32));
    let status = match child.and_then(|mut c| c.wait()) {
        Ok(st) => crate::exit_code(st),
        Err(e) => {
            eprintln!(
                "sw-pool: environment: cannot run {}: {e}",
                prog.to_string_lossy()
            );
            if e.kind() == std::io::ErrorKind::NotFound {
                crate::EXIT_NOT_FOUND
            } else {
                crate::EXIT_CANNOT_EXEC
            }
        }
    };
    // the connection closes with this process: pid 1 may end once nothing else runs
    drop(conn);
    Ok(RunOutcome {
        method: p.method,
        why: p.why,
        status,
    })
}

/// While the launcher waits: the terminal's SIGINT and SIGQUIT reach the command (same process
/// group) and are ignored here, so that the launcher lives to report how the command ended (as
/// system(3) does); SIGTERM and SIGHUP sent to the launcher are passed on to the environment.
struct Forwarding {
    old: [(i32, libc::sighandler_t); 4],
}

static FORWARD_TO: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn pass_on(sig: libc::c_int) {
    let pid = FORWARD_TO.load(std::sync::atomic::Ordering::Relaxed);
    if pid > 0 {
        swpool_sys::process::forward(pid as u32, sig);
    }
}

impl Forwarding {
    fn to(pid: i32) -> Forwarding {
        FORWARD_TO.store(pid, std::sync::atomic::Ordering::Relaxed);
        let set = |sig: i32, h: libc::sighandler_t| (sig, unsafe { libc::signal(sig, h) });
        let pass = pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t;
        Forwarding {
            old: [
                set(libc::SIGINT, libc::SIG_IGN),
                set(libc::SIGQUIT, libc::SIG_IGN),
                set(libc::SIGTERM, pass),
                set(libc::SIGHUP, pass),
            ],
        }
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        for (sig, h) in self.old {
            unsafe { libc::signal(sig, h) };
        }
        FORWARD_TO.store(0, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Move an environment's upper to `dir/<node>` (replacing an earlier one of this node): a rename
/// on the same file system, else a copy (`cp -a`, which keeps modes, times and whiteouts).
fn keep_upper(
    upper: &std::path::Path,
    dir: &std::path::Path,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<(), String> {
    let node = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let dest = dir.join(&node);
    if !dir.is_dir() {
        return Err(format!("--keep-upper {}: not a directory", dir.display()));
    }
    crate::layer::remove_tree(&dest)
        .map_err(|e| format!("cannot replace {}: {e}", dest.display()))?;
    match std::fs::rename(upper, &dest) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
            let cp = ToolCommand::new(Tool::Cp)
                .arg("-a")
                .end_of_options()
                .path(upper)
                .path(&dest);
            match cp.run(path_var) {
                Ok(_) => Ok(()),
                Err(e) => {
                    let _ = crate::layer::remove_tree(&dest);
                    Err(format!("keeping the upper in {}: {e}", dest.display()))
                }
            }
        }
        Err(e) => Err(format!("cannot move the upper to {}: {e}", dest.display())),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::keep_upper;

    /// An upper on another file system than `--keep-upper DIR` (tmpfs here) is copied by `cp -a`
    /// through swpool-sys' runner: modes kept, an earlier copy of this node replaced.
    #[test]
    fn keep_upper_copies_across_file_systems_and_replaces_the_nodes_earlier_copy() {
        let shm = std::path::Path::new("/dev/shm");
        let (Ok(a), Ok(b)) = (rustix::fs::statfs(shm), rustix::fs::statfs("/tmp")) else {
            panic!("this test needs /dev/shm and /tmp");
        };
        assert_ne!(a.f_type, b.f_type, "/dev/shm and /tmp on one file system");
        let upper = tempfile::tempdir_in(shm).unwrap();
        std::fs::create_dir_all(upper.path().join("usr/local/bin")).unwrap();
        let tool = upper.path().join("usr/local/bin/t");
        std::fs::write(&tool, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o750)).unwrap();
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let node = rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned();
        std::fs::create_dir_all(dir.path().join(&node).join("stale")).unwrap();
        let path = std::env::var_os("PATH");
        keep_upper(upper.path(), dir.path(), path.as_deref()).unwrap();
        let kept = dir.path().join(&node);
        let m = std::fs::metadata(kept.join("usr/local/bin/t")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o750);
        assert!(!kept.join("stale").exists(), "the earlier copy replaced");
        assert!(tool.exists(), "copied, not renamed");
        // not a directory: refused, nothing made
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = keep_upper(upper.path(), &file, path.as_deref()).unwrap_err();
        assert!(e.contains("not a directory"), "{e}");
    }
}
