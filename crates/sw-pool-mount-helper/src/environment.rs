//! `idmap --pid P`: read-only idmapped views of the trees the site lists (`environment_trees` in
//! helper.toml) for one of the caller's environments (`sw-pool run --layer`), so that the user's
//! own kernel overlay over them can copy root-owned files up into the user's layer (kernel-facts
//! item 4). `P` is the environment's first process: a process of the caller's, in a user
//! namespace the caller created, mapping exactly the caller's uid and one of their gids to 0.
//!
//! The views must stay read-only and `nosuid,nodev` for good: in a mount namespace its user owns,
//! a mount that root attached (`move_mount`) could be remounted read-write, and writes through an
//! idmapped view of a root-owned tree land as root. The kernel locks a mount's flags only when it
//! copies a more privileged mount namespace into one a less privileged user namespace owns. So a
//! child process of the helper (the *holder*):
//!
//! 1. unshares a private mount namespace (root's), mounts a small tmpfs on `STAGING` and attaches
//!    each idmapped view at `STAGING/<i>` (with an empty `STAGING/m<i>` beside it, where the
//!    environment mounts its overlay before moving it into place);
//! 2. drops every group, enters the environment's user namespace and becomes its root (the
//!    caller's uid and gid: from here on it is one of the caller's processes; before the caller
//!    may trace it (dumpable) it closes every descriptor but its standard streams, which are on
//!    `/dev/null`, so it holds none of root's);
//! 3. unshares a mount namespace again: a copy owned by the caller's namespace, in which every
//!    mount, the views included, is locked (read-only, `nosuid`, `nodev`; none can be unmounted
//!    to reveal what it covers);
//! 4. waits (at most [`HOLD`]) until `P` has entered that namespace, then exits.
//!
//! The caller learns the holder's pid from the answer; `P` enters `/proc/<holder>/ns/mnt`.
//! Nothing of this is visible outside the environment, and nothing outlives it: the namespace
//! goes with its last process.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use swpool_sys::pinned::Pinned;

use crate::caller::Caller;
use crate::config::HelperConfig;
use crate::error::{HelperError, Refusal, Result};

/// Where the views are, in the environment's mount namespace only (root's, mode 0755).
pub const STAGING: &str = "/run/sw-pool-env";
/// How long the holder waits for the environment to enter its namespace.
const HOLD: Duration = Duration::from_secs(10);
/// How long the helper waits for the holder to become the caller's after it said it is ready.
const READY: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize)]
pub struct Idmapped {
    /// The holder: enter `/proc/<holder>/ns/mnt`.
    pub holder: i32,
    /// The views are at `<staging>/<i>`, one per tree, with an empty `<staging>/m<i>` beside each.
    pub staging: PathBuf,
    pub trees: Vec<PathBuf>,
}

/// The environment's first process, checked to be the caller's.
struct Target {
    pid: i32,
    /// The caller's uid (the holder becomes theirs).
    uid: u32,
    userns: OwnedFd,
    _pidfd: OwnedFd,
}

fn refused(pid: i32, why: impl std::fmt::Display) -> HelperError {
    HelperError::refused(
        Refusal::Process,
        format!("process {pid}: {why}; no idmapped view was made"),
    )
}

fn read_proc(pid: i32, f: &str) -> Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/{f}"))
        .map_err(|e| refused(pid, format!("cannot read /proc/{pid}/{f}: {e}")))
}

/// The one line of a uid or gid map, `inside outside count`, as numbers.
fn one_line_map(s: &str) -> Option<(u32, u32, u32)> {
    let mut lines = s.lines().filter(|l| !l.trim().is_empty());
    let l = lines.next()?;
    if lines.next().is_some() {
        return None;
    }
    let v: Vec<u32> = l
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<Vec<_>>>()?;
    match v[..] {
        [a, b, c] => Some((a, b, c)),
        _ => None,
    }
}

/// P's four uids must all be the caller's.
pub(crate) fn judge_uids(c: &Caller, pid: i32, uids: &[u32]) -> Result<()> {
    if uids.len() != 4 || uids.iter().any(|u| *u != c.uid) {
        return Err(refused(pid, format!("not a process of {}'s", c.name)));
    }
    Ok(())
}

/// P's user namespace must map exactly `0 → caller` and `0 → one of the caller's groups` (a map
/// with subordinate ranges would hand the caller the files of those ids too).
pub(crate) fn judge_maps(c: &Caller, pid: i32, uid_map: &str, gid_map: &str) -> Result<()> {
    match one_line_map(uid_map) {
        Some((0, u, 1)) if u == c.uid => {}
        _ => {
            return Err(refused(
                pid,
                format!("its uid map must be exactly `0 {} 1`", c.uid),
            ))
        }
    }
    match one_line_map(gid_map) {
        Some((0, g, 1)) if c.in_group(g) => Ok(()),
        _ => Err(refused(
            pid,
            "its gid map must be exactly `0 G 1` for one of your groups G",
        )),
    }
}

fn check_target(c: &Caller, pid: i32) -> Result<Target> {
    if pid <= 1 {
        return Err(refused(pid, "not an environment's first process"));
    }
    // SAFETY: pidfd_open(2) returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return Err(refused(pid, std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor pidfd_open just returned, owned here only.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
    let status = read_proc(pid, "status")?;
    let uids = swpool_sys::proc::status_uids(&status);
    judge_uids(c, pid, &uids)?;
    let ns_path = format!("/proc/{pid}/ns/user");
    let userns = rustix::fs::open(
        ns_path.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| refused(pid, format!("cannot open {ns_path}: {e}")))?;
    let own = swpool_sys::idmap::ns_id(Path::new("/proc/self/ns/user"))
        .map_err(|e| HelperError::system(Path::new("/proc/self/ns/user"), e))?;
    let theirs = swpool_sys::idmap::ns_id_fd(&userns).map_err(|e| refused(pid, e))?;
    if own == theirs {
        return Err(refused(pid, "not in a user namespace of its own"));
    }
    let owner = swpool_sys::idmap::userns_owner(&userns).map_err(|e| refused(pid, e))?;
    if owner != c.uid {
        return Err(refused(
            pid,
            format!(
                "its user namespace was made by uid {owner}, not by {}",
                c.name
            ),
        ));
    }
    // exactly the caller (and one of the caller's groups) as the namespace's root: a map of
    // other ids (subordinate ranges) would give the caller the files of those ids in the views
    judge_maps(
        c,
        pid,
        &read_proc(pid, "uid_map")?,
        &read_proc(pid, "gid_map")?,
    )?;
    let again = swpool_sys::idmap::ns_id(Path::new(&ns_path)).map_err(|e| refused(pid, e))?;
    // SAFETY: pidfd_send_signal(2) with signal 0 only checks that the process lives.
    let alive = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    } == 0;
    if again != theirs || !alive {
        return Err(refused(
            pid,
            "it changed namespace or ended while it was checked",
        ));
    }
    Ok(Target {
        pid,
        uid: c.uid,
        userns,
        _pidfd: pidfd,
    })
}

/// `idmap --pid P`.
pub fn idmap(cfg: &HelperConfig, c: &Caller, pid: i32) -> Result<Idmapped> {
    if cfg.environment_trees.is_empty() {
        return Err(HelperError::refused(Refusal::TurnedOff,
            "no environment_trees in /etc/sw-pool/helper.toml: this node gives environments no idmapped views (the rootless path is used)",
        ));
    }
    if c.is_root() {
        return Err(HelperError::refused(
            Refusal::Process,
            "idmap is for a user's environment (root's own environments need no helper)",
        ));
    }
    let t = check_target(c, pid)?;
    let trees = cfg.environment_trees.clone();
    let run = Pinned::open_root(Path::new("/run"))
        .map_err(|e| HelperError::system(Path::new("/run"), e))?;
    let name = Path::new(STAGING)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("sw-pool-env");
    swpool_sys::kmount::mkdir_open(&run, name, 0o755, None)
        .map_err(|e| HelperError::system(Path::new(STAGING), e))?;
    let holder = start_holder(&t, &trees)?;
    Ok(Idmapped {
        holder,
        staging: STAGING.into(),
        trees,
    })
}

fn errno(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// Fork the holder; its pid once it has made the namespace, or why it could not.
fn start_holder(t: &Target, trees: &[PathBuf]) -> Result<i32> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2(2) fills two descriptors, owned below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(HelperError::system(
            Path::new("pipe"),
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: just made, owned here only.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the helper is single-threaded; the child only runs the code below and exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(HelperError::system(
            Path::new("fork"),
            std::io::Error::last_os_error(),
        ));
    }
    if pid == 0 {
        drop(rd);
        let mut wr = std::fs::File::from(wr);
        let r = holder_setup(t, trees);
        let _ = wr.write_all(
            match &r {
                Ok(()) => b"ok".to_vec(),
                Err(e) => e.clone().into_bytes(),
            }
            .as_slice(),
        );
        drop(wr);
        if r.is_ok() {
            become_the_callers();
            wait_for_entry(t.pid);
        }
        // SAFETY: end the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    drop(wr);
    let mut said = String::new();
    let _ = std::fs::File::from(rd).read_to_string(&mut said);
    let fail = |said: String| {
        // SAFETY: our own child: ended (or killed here) and reaped.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        Err(HelperError::step(
            format!("idmapped views for process {}", t.pid),
            said,
        ))
    };
    if said != "ok" {
        return fail(said);
    }
    // the environment opens the holder's namespace once the holder is traceable by the caller
    // (dumpable, after it closed every descriptor): answer only then
    let t0 = Instant::now();
    loop {
        match traceable_by(pid, t.uid) {
            Ok(true) => return Ok(pid),
            Ok(false) if t0.elapsed() < READY => std::thread::sleep(Duration::from_millis(1)),
            _ => {
                return fail(format!(
                    "the helper's holder (pid {pid}) did not become yours within {} s",
                    READY.as_secs()
                ))
            }
        }
    }
}

/// Whether process `pid` is `uid`'s and dumpable, so that `uid` may open its `/proc/PID/ns/*`.
/// `/proc/PID` itself shows the effective uid whatever the dumpable flag; its files (`status`)
/// are root's until the process is dumpable.
fn traceable_by(pid: i32, uid: u32) -> std::io::Result<bool> {
    let m = std::fs::metadata(format!("/proc/{pid}/status"))?;
    Ok(std::os::unix::fs::MetadataExt::uid(&m) == uid)
}

/// In the holder, once it is in the caller's user namespace as their uid and before it may be
/// traced by them (dumpable): close every descriptor but the standard streams (on `/dev/null`) —
/// the helper's own (`/run`, the target's pidfd and user namespace, whatever the helper
/// inherited) — and leave the directory the helper ran in.
fn become_the_callers() {
    // SAFETY: plain system calls in the single-threaded holder.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
        libc::chdir(c"/".as_ptr());
        // the caller's own process from here on: the environment may open its namespace
        libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0);
    }
}

/// Steps 1–3 of the module documentation, in the holder.
fn holder_setup(t: &Target, trees: &[PathBuf]) -> std::result::Result<(), String> {
    // SAFETY: plain system calls on descriptors and constant strings, in a single-threaded child.
    unsafe {
        // off the caller's terminal and pipes: sudo and the caller do not wait for us
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
        }
        libc::setsid();
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(errno("unshare(CLONE_NEWNS)"));
        }
    }
    use rustix::mount::{MountFlags, MountPropagationFlags};
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::SLAVE | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("making / a slave: {e}"))?;
    rustix::mount::mount(
        "sw-pool-env",
        STAGING,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        "mode=0755,size=64k,nr_inodes=1024",
    )
    .map_err(|e| format!("a tmpfs on {STAGING}: {e}"))?;
    let staging = Pinned::open_root(Path::new(STAGING)).map_err(|e| format!("{STAGING}: {e}"))?;
    for (i, p) in trees.iter().enumerate() {
        // opened in this namespace: a mount of another one cannot be cloned
        let fd = Pinned::open_root(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let at = swpool_sys::kmount::mkdir_open(&staging, &i.to_string(), 0o755, None)
            .map_err(|e| format!("{STAGING}/{i}: {e}"))?;
        swpool_sys::kmount::mkdir_open(&staging, &format!("m{i}"), 0o755, None)
            .map_err(|e| format!("{STAGING}/m{i}: {e}"))?;
        let view = swpool_sys::idmap::idmapped_clone(&fd, &t.userns)
            .map_err(|e| format!("an idmapped view of {}: {e}", p.display()))?;
        rustix::mount::move_mount(
            view.as_fd(),
            "",
            at.as_fd(),
            "",
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH
                | rustix::mount::MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )
        .map_err(|e| {
            format!(
                "attaching the view of {} at {STAGING}/{i}: {e}",
                p.display()
            )
        })?;
    }
    drop(staging);
    // SAFETY: as above.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(errno("setgroups"));
        }
        if libc::setns(t.userns.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
            return Err(errno("entering the environment's user namespace"));
        }
        if libc::setresgid(0, 0, 0) != 0 || libc::setresuid(0, 0, 0) != 0 {
            return Err(errno("becoming the environment's root"));
        }
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(errno("a mount namespace for the environment"));
        }
    }
    Ok(())
}

/// Step 4: wait until process `pid` is in our mount namespace, has ended, or [`HOLD`] is over.
fn wait_for_entry(pid: i32) {
    let t0 = Instant::now();
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    while t0.elapsed() < HOLD {
        match std::fs::read_link(format!("/proc/{pid}/ns/mnt")) {
            Ok(l) if Some(&l) == ours.as_ref() => return,
            Ok(_) => {}
            Err(_) => return, // ended (or no longer ours to look at)
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[cfg(test)]
mod tests {
    use super::one_line_map;

    /// The holder becomes the caller's (setresuid) before it is dumpable: the helper must not
    /// answer on the first sign. A process of uid 65534 that is not yet dumpable is not
    /// traceable by 65534 although `/proc/PID` already shows 65534; once dumpable it is.
    #[test]
    fn a_process_is_traceable_only_once_dumpable() {
        use std::io::{BufRead, Write};
        // SAFETY: geteuid(2) cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: needs root (a process that changes its uid)");
            return;
        }
        let mut c = std::process::Command::new("python3")
            .args([
                "-c",
                "import os, sys, ctypes\n\
                 os.setresgid(65534, 65534, 65534); os.setresuid(65534, 65534, 65534)\n\
                 print('changed', flush=True); sys.stdin.readline()\n\
                 ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)\n\
                 print('dumpable', flush=True); sys.stdin.readline()\n",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let pid = c.id() as i32;
        let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
        let mut inp = c.stdin.take().unwrap();
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "changed");
        let dir = std::fs::metadata(format!("/proc/{pid}")).unwrap();
        assert_eq!(std::os::unix::fs::MetadataExt::uid(&dir), 65534);
        assert!(!super::traceable_by(pid, 65534).unwrap());
        inp.write_all(b"\n").unwrap();
        l.clear();
        out.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "dumpable");
        assert!(super::traceable_by(pid, 65534).unwrap());
        inp.write_all(b"\n").unwrap();
        c.wait().unwrap();
    }

    #[test]
    fn maps_must_be_one_line() {
        assert_eq!(
            one_line_map("         0       1000          1\n"),
            Some((0, 1000, 1))
        );
        assert_eq!(one_line_map("0 1000 1\n1 100000 65536\n"), None);
        assert_eq!(one_line_map(""), None);
        assert_eq!(one_line_map("0 x 1"), None);
        assert_eq!(one_line_map("0 1 2 3"), None);
    }
}
