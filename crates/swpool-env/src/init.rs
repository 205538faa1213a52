//! Pid 1 of an environment (`sw-pool __enter SPEC`): a fresh, single-threaded process, root of the
//! new user namespace (mapped to the caller), alone in the new mount and PID namespaces.
//!
//! It makes the environment's root ([`Spec::method`]), remounts `/proc`, starts the command (as the
//! caller's own uid through a nested user namespace, or as root with `--root`), forwards the
//! signals it gets to the command, reaps every orphan, and exits with the command's status. When it
//! exits the kernel kills whatever is left in the PID namespace (the FUSE daemon included) and the
//! mount namespace, with every mount made here, goes away.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::kernel::{Kernel, OverlayOf, PoolsOf, RealKernel};
use crate::rendezvous::{Joiners, Listener};

use crate::layer::Layer;
use crate::plan::Method;
use crate::{EXIT_CANNOT_EXEC, EXIT_NOT_FOUND, EXIT_SETUP};

/// Everything pid 1 needs, from the launcher (serialised into its argument).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Spec {
    pub uid: u32,
    pub gid: u32,
    /// uid 0 inside (else the caller's own uid).
    pub root: bool,
    pub method: Method,
    pub layer: Option<Layer>,
    /// The layer's directories as the launcher opened and checked them (`dir`, `upper`, `work`,
    /// `merged`; inherited descriptors): the overlay is made of these, never of the paths.
    #[serde(default)]
    pub layer_fds: Option<[i32; 4]>,
    /// A read-only lower above the host's tree (the job's copy of the layer on this node).
    #[serde(default)]
    pub lower: Option<PathBuf>,
    /// The namespace maps the caller's uid and gid to themselves (not to 0): pid 1, never
    /// exec'd, keeps its capabilities in it, and the command runs as the caller without a
    /// nested user namespace (a plain environment started by a single-threaded launcher).
    #[serde(default)]
    pub identity: bool,
    pub fuse_overlayfs: Option<PathBuf>,
    /// `--base` pools, bottom first, mounted here ([`crate::Base`], [`crate::reader`]).
    #[serde(default)]
    pub bases: Vec<crate::Base>,
    #[serde(default)]
    pub squashfuse: Option<PathBuf>,
    /// sw-pool's tree server (`sw-pool-serve`), which mounts squashfs pools when it is set
    /// ([`crate::reader`]; squashfuse_ll is the fallback).
    #[serde(default)]
    pub tree_server: Option<PathBuf>,
    /// `--pool` pools, mounted at their usual mount points ([`crate::EnvPool`]).
    #[serde(default)]
    pub pools: Vec<crate::EnvPool>,
    #[serde(default)]
    pub fuse2fs: Option<PathBuf>,
    /// Host mounts to bind into the new root.
    pub binds: Vec<PathBuf>,
    /// `(source, original)`: a pool's package bound over the original directory (shadow mounts);
    /// one that fails leaves the original and says so.
    #[serde(default)]
    pub shadows: Vec<(PathBuf, PathBuf)>,
    pub cwd: PathBuf,
    pub argv: Vec<OsString>,
    /// Shown to the command as `SW_POOL_ENVIRONMENT`.
    pub name: String,
    pub verbose: bool,
    /// Listen here for starts that join ([`crate::rendezvous`]).
    pub socket: Option<PathBuf>,
    /// Descriptors inherited from the launcher and held for the environment's life (the layer's
    /// and the rendezvous' locks).
    pub keep_fds: Vec<i32>,
    /// The kernel path: the launcher's word ([`crate::idmap::Handshake`]) is read from this
    /// descriptor (the start pipe).
    #[serde(default)]
    pub handshake_fd: Option<i32>,
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
    run(spec)
}

/// Pid 1's work, from the launcher's [`Spec`]: in `sw-pool-enter` (exec'd), or directly in the
/// launcher's cloned child when the launcher is single-threaded ([`crate::launch`]). Never
/// returns.
pub fn run(spec: Spec) -> ! {
    // held here only: neither the FUSE daemon nor a command inherits them
    for fd in spec.keep_fds.iter().chain(spec.layer_fds.iter().flatten()) {
        unsafe { libc::fcntl(*fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // bound before the root changes: the path is the host's
    let listener = spec.socket.as_ref().map(|p| match Listener::bind(p) {
        Ok(l) => l,
        Err(e) => fail(&format!("cannot listen on {}: {e}", p.display())),
    });
    if let Err(e) = setup(&RealKernel, &spec) {
        fail(&e.to_string());
    }
    // a shared environment makes the namespace for the caller's uid once, for every command; an
    // environment of one command makes it in that command (one fork less per start)
    let own_uid = if listener.is_none() {
        None
    } else {
        match own_uid_namespace(spec.uid, spec.gid) {
            Ok(fd) => Some(fd),
            Err(e) => fail(&e),
        }
    };
    let code = supervise(&spec, listener.as_ref(), own_uid.as_ref());
    if let Some(l) = &listener {
        l.remove();
    }
    std::process::exit(code)
}

/// Start `prog args` with `posix_spawnp` (the kernel's vfork: the caller's memory is not copied)
/// with no signal blocked, the signals pid 1 handles or ignores back at their defaults, and
/// `SW_POOL_ENVIRONMENT=name` in the environment. Its process id, or the error of the exec (as
/// `Command::spawn` reports it: `NotFound` for a missing program).
fn spawn(prog: &std::ffi::OsStr, args: &[OsString], name: &str) -> std::io::Result<i32> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a NUL byte in the command",
        )
    };
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| bad());
    let argv: Vec<CString> = std::iter::once(prog)
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| cstr(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut envs: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| k != "SW_POOL_ENVIRONMENT")
        .map(|(k, v)| cstr(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
        .collect::<Result<_, _>>()?;
    envs.push(cstr(format!("SW_POOL_ENVIRONMENT={name}").as_bytes())?);
    let ptrs = |v: &[CString]| -> Vec<*mut libc::c_char> {
        v.iter()
            .map(|c| c.as_ptr() as *mut libc::c_char)
            .chain(std::iter::once(std::ptr::null_mut()))
            .collect()
    };
    let (argp, envp) = (ptrs(&argv), ptrs(&envs));
    let mut pid: libc::pid_t = 0;
    // SAFETY: the attribute object is initialised, used and destroyed here; every pointer handed
    // over points into `argv`/`envs`, alive until the call returns
    let rc = unsafe {
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        libc::posix_spawnattr_init(&mut attr);
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        let mut dfl: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut dfl);
        for s in FORWARD.iter().chain(&[libc::SIGCHLD, libc::SIGPIPE]) {
            libc::sigaddset(&mut dfl, *s);
        }
        libc::posix_spawnattr_setsigmask(&mut attr, &none);
        libc::posix_spawnattr_setsigdefault(&mut attr, &dfl);
        libc::posix_spawnattr_setflags(
            &mut attr,
            (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
        );
        let rc = libc::posix_spawnp(
            &mut pid,
            argv[0].as_ptr(),
            std::ptr::null(),
            &attr,
            argp.as_ptr(),
            envp.as_ptr(),
        );
        libc::posix_spawnattr_destroy(&mut attr);
        rc
    };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(pid)
}

/// The rendezvous socket and the directory it is in (removed through the directory: after the
/// root changed, its path may lead elsewhere).
/// A user namespace inside this one in which the caller is their own uid (mapped to this one's
/// root): every command that is not `--root` enters it, so that all of them share one user
/// namespace (MPI's shared-memory transport needs that: kernel-facts.md F).
fn own_uid_namespace(uid: u32, gid: u32) -> Result<OwnedFd, String> {
    let mut p1 = [0i32; 2];
    let mut p2 = [0i32; 2];
    unsafe {
        if libc::pipe2(p1.as_mut_ptr(), libc::O_CLOEXEC) != 0
            || libc::pipe2(p2.as_mut_ptr(), libc::O_CLOEXEC) != 0
        {
            return Err("pipe".into());
        }
    }
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        unsafe {
            let ok = libc::unshare(libc::CLONE_NEWUSER) == 0;
            if ok {
                libc::write(p1[1], b"x".as_ptr().cast(), 1);
                let mut b = [0u8; 1];
                libc::close(p2[1]);
                libc::read(p2[0], b.as_mut_ptr().cast(), 1);
            }
            libc::_exit(if ok { 0 } else { 1 });
        }
    }
    unsafe {
        libc::close(p1[1]);
        libc::close(p2[0]);
    }
    let mut b = [0u8; 1];
    let got = unsafe { libc::read(p1[0], b.as_mut_ptr().cast(), 1) };
    let r = (|| -> Result<OwnedFd, String> {
        if got != 1 {
            return Err("a user namespace for your uid: unshare failed".into());
        }
        crate::write_id_maps(
            &pid.to_string(),
            &format!("{uid} 0 1"),
            &format!("{gid} 0 1"),
            false,
        )
        .map_err(|e| format!("a user namespace for your uid: {e}"))?;
        rustix::fs::open(
            format!("/proc/{pid}/ns/user"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| format!("a user namespace for your uid: {e}"))
    })();
    unsafe {
        libc::close(p1[0]);
        libc::close(p2[1]); // the child's read returns: it exits
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
    }
    r
}

/// Why pid 1 could not set the environment up (nothing ran): each names the step that failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot make the mounts private: {0}")]
    Private(Errno),
    #[error("layer {0}: no opened directories")]
    NoLayerDirs(String),
    #[error("an overlay without a layer")]
    OverlayWithoutLayer,
    #[error("cannot enter the layer's overlay: {0}")]
    EnterOverlay(Errno),
    #[error("cannot enter {}: {source}", root.display())]
    EnterBase { root: PathBuf, source: Errno },
    #[error("cannot bind the host's {} into the environment: {source}", host.display())]
    Bind { host: PathBuf, source: Errno },
    #[error("cannot mount /proc: {0}")]
    Proc(Errno),
    #[error(
        "cannot mount /proc: the base pool {base} has no /proc directory (a base is a \
         whole root file system: /proc, /dev, /sys, /tmp, /run, /home)"
    )]
    NoProcInBase { base: String },
    #[error("cannot move the environment's root into place: {0}")]
    MoveRoot(Errno),
    #[error("cannot change into the environment's root: {0}")]
    Chroot(Errno),
    /// A stage made by its own module (the bases, the layer's overlay, the helper's views, the
    /// pools): its message.
    #[error("{0}")]
    Stage(String),
}

impl SetupError {
    /// The exit status of a start that failed so: nothing ran.
    pub fn exit_status(&self) -> i32 {
        EXIT_SETUP
    }
}

/// Make the environment's root through `k`, in this order: the helper's views (kernel path),
/// the mounts made private, the `--base` pools, the layer's directories, then either (the host's
/// tree stays the root) `/proc`, the pools and the shadows in place, or (a new root) into the
/// overlay or the top base, the host's mounts bound in, `/proc`, the pools, the shadows, the root
/// moved onto `/` and entered; last the working directory (`/` if it is not there).
pub(crate) fn setup(k: &dyn Kernel, spec: &Spec) -> Result<(), SetupError> {
    // the kernel path: the helper's namespace (or the rootless path after all)
    let mut method = spec.method;
    let mut views = None;
    if let (Method::KernelOverlay, Some(fd)) = (method, spec.handshake_fd) {
        match k.receive_views(fd).map_err(SetupError::Stage)? {
            crate::idmap::Handshake::Views(v) => {
                k.enter_views(&v).map_err(SetupError::Stage)?;
                views = Some(v);
            }
            crate::idmap::Handshake::Rootless(_) => {
                method = Method::FuseOverlay;
                if let (true, Some(l)) = (spec.root, &spec.layer) {
                    k.seed_rootless_root(&l.upper);
                }
            }
        }
    }
    // nothing we mount here propagates back to the host
    k.make_private().map_err(SetupError::Private)?;
    k.mount_bases(
        &spec.bases,
        readers(spec),
        spec.method == Method::BaseOverlay,
    )
    .map_err(SetupError::Stage)?;
    let mut held = Vec::new();
    let dirs = match (&spec.layer, spec.layer_fds) {
        (Some(l), Some(checked)) => Some(
            k.reopen_layer(l, checked, &mut held)
                .map_err(SetupError::Stage)?,
        ),
        (Some(l), None) => return Err(SetupError::NoLayerDirs(l.name.clone())),
        (None, _) => None,
    };
    // the kernel path with views of some trees but not of `/`: they were mounted in place
    let mut tree_root = None;
    let in_place = match (&views, &spec.layer, &dirs) {
        (Some(v), Some(_), Some(d)) => {
            tree_root = k
                .mount_trees(v, d, spec.lower.as_deref())
                .map_err(SetupError::Stage)?;
            tree_root.is_none()
        }
        _ => false,
    };
    // the host's tree stays the root (no layer, or the trees' overlays put in place)
    if method == Method::Plain || in_place {
        k.mount_proc(Path::new("/proc")).map_err(SetupError::Proc)?;
        k.mount_pools(&pools_of(spec), Path::new("/"))
            .map_err(SetupError::Stage)?;
        shadow(k, spec, Path::new("/"));
    } else {
        // the root being built becomes the working directory: with a layer, through the
        // overlay's own descriptor (it sits on the layer's checked `merged`, whatever that path
        // leads to now); everything below is mounted relative to it
        let root = match (&spec.layer, &dirs, method) {
            (Some(l), Some(d), _) => {
                let fd = match tree_root.take() {
                    Some(fd) => fd,
                    None => {
                        let o = OverlayOf {
                            lower: spec.lower.as_deref(),
                            bases: &spec.bases,
                            fuse_overlayfs: spec.fuse_overlayfs.as_deref(),
                            method,
                        };
                        k.mount_overlay(&o, l, d).map_err(SetupError::Stage)?
                    }
                };
                k.fchdir(fd.as_fd()).map_err(SetupError::EnterOverlay)?;
                l.merged.clone()
            }
            (None, _, Method::Base) => {
                let r = k.base_root(&spec.bases).map_err(SetupError::Stage)?;
                k.chdir(&r).map_err(|source| SetupError::EnterBase {
                    root: r.clone(),
                    source,
                })?;
                r
            }
            _ => return Err(SetupError::OverlayWithoutLayer),
        };
        let m = &root;
        let here = Path::new(".");
        for b in &spec.binds {
            let target = under(here, b);
            match k.bind_recursive(b.as_path(), target.as_path()) {
                Ok(()) => {}
                // a mount point that is not in the host's root file system's tree (a file
                // bind-mounted over another type): nothing to bind it onto
                Err(Errno::NOENT) | Err(Errno::NOTDIR) => {
                    tracing::debug!(mount = %b.display(), "not bound into the environment")
                }
                Err(source) => {
                    return Err(SetupError::Bind {
                        host: b.clone(),
                        source,
                    })
                }
            }
        }
        // a bound mount that contains the layer brought a copy of the overlay with it: the
        // environment sees the layer's plain (empty) mount point there instead. Only then: a
        // path to the layer that is not in a bound mount resolves through the overlay, whose
        // daemon would look the merged directory up in its lower, i.e. in itself, and hang
        // (after the move below its lower no longer has the overlay there)
        if spec.binds.iter().any(|b| m.starts_with(b)) {
            let _ = k.detach(&under(here, m));
        }
        k.mount_proc(&under(here, Path::new("/proc")))
            .map_err(|e| match (e, spec.bases.last()) {
                (Errno::NOENT, Some(b)) => SetupError::NoProcInBase {
                    base: b.label.clone(),
                },
                _ => SetupError::Proc(e),
            })?;
        k.mount_pools(&pools_of(spec), m)
            .map_err(SetupError::Stage)?;
        shadow(k, spec, here);
        k.move_to_root().map_err(SetupError::MoveRoot)?;
        k.chroot_here().map_err(SetupError::Chroot)?;
    }
    if k.chdir(&spec.cwd).is_err() {
        let _ = k.chdir(Path::new("/"));
    }
    Ok(())
}

/// The servers that may mount `spec`'s squashfs pools.
fn readers(spec: &Spec) -> crate::reader::Readers<'_> {
    crate::reader::Readers {
        tree: spec.tree_server.as_deref(),
        squashfuse: spec.squashfuse.as_deref(),
    }
}

/// The `--pool` pools of `spec`, as mounted.
fn pools_of(spec: &Spec) -> PoolsOf<'_> {
    PoolsOf {
        pools: &spec.pools,
        readers: readers(spec),
        fuse2fs: spec.fuse2fs.as_deref(),
        verbose: spec.verbose,
    }
}

/// The shadow mounts, under the environment's root `root`: each pool package bound (read-only,
/// as the pool is) over its original; a failure leaves the original and says so.
fn shadow(k: &dyn Kernel, spec: &Spec, root: &Path) {
    for (src, orig) in &spec.shadows {
        let target = under(root, orig);
        match k.bind(src.as_path(), target.as_path()) {
            Ok(()) => {
                if spec.verbose {
                    eprintln!(
                        "sw-pool: environment: {} shows {}",
                        orig.display(),
                        src.display()
                    );
                }
            }
            Err(e) => eprintln!(
                "sw-pool: environment: warning: cannot shadow {} with {}: {e}; the original stays",
                orig.display(),
                src.display()
            ),
        }
    }
}

/// `b` (absolute) below `root`.
fn under(root: &Path, b: &Path) -> PathBuf {
    root.join(b.strip_prefix("/").unwrap_or(b))
}

/// Start the command, serve joiners, forward signals, reap; the command's exit status once it
/// has ended and no joiner is connected.
fn supervise(spec: &Spec, listener: Option<&Listener>, own_uid: Option<&OwnedFd>) -> i32 {
    let Some((prog, args)) = spec.argv.split_first() else {
        fail("no command")
    };
    // the signals pid 1 forwards reach it only with a handler installed; blocked, they are read
    // from a signalfd (the command starts with the mask and handlers reset)
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    let sigfd = unsafe {
        libc::sigemptyset(&mut set);
        for s in FORWARD.iter().chain(std::iter::once(&libc::SIGCHLD)) {
            libc::sigaddset(&mut set, *s);
            libc::signal(*s, noop as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    };
    if sigfd < 0 {
        fail(&format!("signalfd: {}", std::io::Error::last_os_error()));
    }
    let handed = listener.map(|_| handed_fds(own_uid)).unwrap_or_default();
    let own = if spec.root {
        None
    } else {
        own_uid.map(|f| f.as_raw_fd())
    };
    let (uid, gid, nested) = (
        spec.uid,
        spec.gid,
        !spec.root && own_uid.is_none() && !spec.identity,
    );
    // without a user namespace to enter first, the command is started by posix_spawn: no copy of
    // pid 1's page tables (3.5 vs 4.7 ms per `run -- true`, `perf stat -r 200`)
    let started = if own.is_none() && !nested {
        spawn(prog, args, &spec.name)
    } else {
        let mut cmd = std::process::Command::new(prog);
        cmd.args(args).env("SW_POOL_ENVIRONMENT", &spec.name);
        unsafe {
            cmd.pre_exec(move || {
                // the command starts with no signal blocked (std leaves the mask as it is; the
                // handlers installed above are reset by exec)
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                // the caller's own uid inside, in the user namespace every such command shares
                if let Some(fd) = own {
                    if libc::setns(fd, libc::CLONE_NEWUSER) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                } else if nested {
                    if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    crate::write_id_maps(
                        "self",
                        &format!("{uid} 0 1"),
                        &format!("{gid} 0 1"),
                        true,
                    )?;
                }
                Ok(())
            });
        }
        cmd.spawn().map(|c| c.id() as i32)
    };
    let mut status: Option<i32> = None;
    let cmd_pid = match started {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!(
                "sw-pool: environment: cannot run {}: {e}",
                prog.to_string_lossy()
            );
            status = Some(if e.kind() == std::io::ErrorKind::NotFound {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXEC
            });
            -1
        }
    };
    let mut joiners = Joiners::new(listener, handed);
    loop {
        // the environment ends with its command and its last joiner (as `unshare --fork --pid`
        // and bwrap end with their command): whatever else still runs in it is killed by the
        // kernel when pid 1 exits
        if let Some(code) = status {
            if joiners.last_one_out() {
                return code;
            }
        }
        let mut pfds = vec![libc::pollfd {
            fd: sigfd,
            events: libc::POLLIN,
            revents: 0,
        }];
        pfds.extend(joiners.poll_fds().into_iter().map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }));
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
        if n <= 0 {
            continue;
        }
        if pfds[0].revents != 0 {
            let mut si: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
            let sz = std::mem::size_of::<libc::signalfd_siginfo>();
            while unsafe { libc::read(sigfd, (&mut si as *mut libc::signalfd_siginfo).cast(), sz) }
                == sz as isize
            {
                let sig = si.ssi_signo as i32;
                if sig != libc::SIGCHLD {
                    if status.is_none() && cmd_pid > 0 {
                        swpool_sys::process::forward(cmd_pid as u32, sig);
                    }
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
                        status = Some(crate::exit_code(std::process::ExitStatus::from_raw(st)));
                    }
                }
            }
        }
        let ready: Vec<bool> = pfds[1..].iter().map(|p| p.revents != 0).collect();
        joiners.ready(&ready);
    }
}

/// What a joiner gets ([`crate::rendezvous::HANDED`]): this environment's user namespace, the one for
/// the caller's own uid, the mount and PID namespaces, and the root.
fn handed_fds(own_uid: Option<&OwnedFd>) -> Vec<OwnedFd> {
    let open = |p: &str, dir: bool| -> OwnedFd {
        let mut fl = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC;
        if dir {
            fl |= rustix::fs::OFlags::DIRECTORY;
        }
        match rustix::fs::open(p, fl, rustix::fs::Mode::empty()) {
            Ok(fd) => fd,
            Err(e) => fail(&format!("cannot open {p}: {e}")),
        }
    };
    let user = open("/proc/self/ns/user", false);
    let own = match own_uid {
        Some(f) => f.try_clone().unwrap_or_else(|e| fail(&format!("dup: {e}"))),
        None => open("/proc/self/ns/user", false),
    };
    vec![
        user,
        own,
        open("/proc/self/ns/mnt", false),
        open("/proc/self/ns/pid", false),
        open("/", true),
    ]
}

#[cfg(test)]
mod tests;
