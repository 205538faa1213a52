//! One environment shared by every start with the same key on a node: all tasks of a job step on
//! the node (MPI needs them in one user and PID namespace: kernel-facts.md F), and every start on
//! one layer (a layer has one writer). The first start creates it; the others join it.
//!
//! Rendezvous, in the user's private state directory on the node (`<state>/envs/`):
//! - `<key>.lock`: held (flock) by the environment's pid 1 for its whole life, and by the start
//!   that creates it until then;
//! - `<key>.sock`: pid 1 listens on it. A joining start connects, receives pid 1's namespaces and
//!   root as descriptors (`SCM_RIGHTS`: no path is looked up on the joiner's behalf), enters them
//!   (`setns`, `chroot`), forks its command into the environment's PID namespace, and keeps the
//!   connection open until the command ends. Pid 1 stays while its own command, a connection or
//!   any process of the environment remains.
//!
//! A socket nobody listens on and a lock nobody holds is a dead environment's: the next start
//! removes the socket and creates a new one.

use std::io::IoSliceMut;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

use crate::kernel::{Kernel, Ns};
use crate::EnvError;

/// The descriptors pid 1 hands a joiner, in this order.
pub const HANDED: [&str; 5] = ["user", "user (your uid)", "mnt", "pid", "root"];

/// Where an environment with `key` meets its joiners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub socket: PathBuf,
    pub lock: PathBuf,
}

impl Rendezvous {
    pub fn new(dir: &Path, key: &str) -> Rendezvous {
        Rendezvous {
            socket: dir.join(format!("{key}.sock")),
            lock: dir.join(format!("{key}.lock")),
        }
    }
}

/// The key of the environment on a layer (its directory names it).
pub fn layer_key(layer_dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let h = blake3::hash(layer_dir.as_os_str().as_bytes());
    format!("layer-{}", &h.to_hex()[..16])
}

/// What an environment's shadow mounts add to its key (an environment is joined only by starts
/// that ask for the same shadows).
pub fn shadow_key(shadows: &[(PathBuf, PathBuf)]) -> String {
    pairs_key(
        "shadow",
        shadows.iter().map(|(a, b)| (a.as_path(), b.as_path())),
    )
}

/// `PREFIX-<hash of the path pairs>`, each path NUL-terminated.
fn pairs_key<'a>(prefix: &str, pairs: impl Iterator<Item = (&'a Path, &'a Path)>) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut h = blake3::Hasher::new();
    for (a, b) in pairs {
        h.update(a.as_os_str().as_bytes());
        h.update(b"\0");
        h.update(b.as_os_str().as_bytes());
        h.update(b"\0");
    }
    format!("{prefix}-{}", &h.finalize().to_hex()[..12])
}

/// What an environment's `--base` pools add to its key (joined only by starts over the same
/// images at the same places).
pub fn base_key(bases: &[crate::Base]) -> String {
    pairs_key(
        "base",
        bases.iter().map(|b| (b.image.as_path(), b.at.as_path())),
    )
}

/// What an environment's `--pool` pools add to its key (joined only by starts with the same pools
/// at the same places).
pub fn pools_key(pools: &[crate::EnvPool]) -> String {
    pairs_key(
        "pools",
        pools.iter().map(|p| (p.image.as_path(), p.at.as_path())),
    )
}

/// The key of a job step's environment without a layer.
pub fn step_key(job: &str, step: &str) -> Option<String> {
    let ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (ok(job) && ok(step)).then(|| format!("step-{job}.{step}"))
}

/// The key of the environment an MPI launcher's ranks on this node share, outside a Slurm step
/// (`mpirun`/`mpiexec` of Open MPI or MPICH's Hydra start every rank of a node as a child of one
/// process: mpirun itself, its daemon or `hydra_pmi_proxy`): that parent's pid and start time, so
/// that a recycled pid is another key. None for an orphan (parent 1) or an unreadable parent.
pub fn launcher_key(parent: u32) -> Option<String> {
    if parent <= 1 {
        return None;
    }
    swpool_sys::process::start_ticks(parent).map(|t| format!("mpi-{parent}.{t}"))
}

/// What `sw-pool list` shows of a running environment: `<key>.json` beside its lock, written by
/// the start that creates it, removed when it ends (or, after a `kill -9`, with its socket).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Info {
    /// The rendezvous key (`layer-…`, `step-JOB.STEP`; `mpi-PID.TICKS`: an MPI launcher's
    /// ranks).
    pub key: String,
    /// The layer's name (`-`: none).
    pub layer: String,
    /// Where the layer (or the job's copy of it) is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_dir: Option<PathBuf>,
    /// How its root was made ([`crate::plan::Method::as_str`]).
    pub method: String,
    /// Its pid 1, as this node's PID namespace numbers it.
    pub pid: i32,
    /// When it started (seconds since the epoch).
    pub started: u64,
}

impl Info {
    /// Write it for the environment of `rv` (to a temporary name, then renamed).
    pub fn write(&self, rv: &Rendezvous) -> std::io::Result<()> {
        let p = rv.socket.with_extension("json");
        let tmp = rv.socket.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, &p)
    }

    /// Remove the one of `rv`.
    pub fn remove(rv: &Rendezvous) {
        let _ = std::fs::remove_file(rv.socket.with_extension("json"));
    }
}

/// The environments running from `dir` (a state directory's `envs/`): those whose lock is held
/// and whose information is readable (at most 64 KiB each).
pub fn running(dir: &Path) -> Vec<Info> {
    let mut out: Vec<Info> = rendezvous_files(dir, "json")
        .filter(|(_, lock)| lock.held)
        .filter_map(|(p, _)| {
            use std::io::Read;
            let mut b = Vec::new();
            let f = std::fs::File::open(&p).ok()?;
            f.take(64 * 1024).read_to_end(&mut b).ok()?;
            serde_json::from_slice(&b).ok()
        })
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// The sockets in `dir` (a state directory's `envs/`) whose environment is gone (nobody holds
/// their lock): what a `kill -9` of a whole job step leaves. Removed unless `dry_run`; the lock
/// files stay (empty, and a start may hold one an instant later; an environment that ends removes
/// its own).
pub fn remove_stale(dir: &Path, dry_run: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    // the lock is held while the socket is removed: a start that creates the environment anew
    // takes it first, so its new socket is never the one removed here
    for (sock, lock) in rendezvous_files(dir, "sock") {
        if !lock.held && (dry_run || std::fs::remove_file(&sock).is_ok()) {
            if !dry_run {
                let _ = std::fs::remove_file(sock.with_extension("json"));
            }
            out.push(sock);
        }
        drop(lock);
    }
    out
}

/// The files `<key>.<ext>` in `dir`, each with its environment's lock probed (and kept while the
/// caller holds the probe).
fn rendezvous_files<'a>(
    dir: &Path,
    ext: &'a str,
) -> impl Iterator<Item = (PathBuf, LockProbe)> + 'a {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(move |p| p.extension().is_some_and(|x| x == ext))
        .map(|p| {
            let lock = LockProbe::shared(&p.with_extension("lock"));
            (p, lock)
        })
}

/// A rendezvous lock tried with a non-blocking shared `flock`, kept while this value lives (so
/// that no start takes it meanwhile). `held`: someone holds it exclusively (an environment or a
/// start creating one); a missing lock file is held by nobody.
pub(crate) struct LockProbe {
    _fd: Option<OwnedFd>,
    pub held: bool,
}

impl LockProbe {
    pub(crate) fn shared(lock: &Path) -> LockProbe {
        match rustix::fs::open(
            lock,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => LockProbe {
                held: rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared).is_err(),
                _fd: Some(fd),
            },
            Err(_) => LockProbe {
                _fd: None,
                held: false,
            },
        }
    }
}

/// Is the file open as `fd` the one at `path` (not removed, not replaced)?
fn still_at(fd: &OwnedFd, path: &Path) -> bool {
    match (rustix::fs::fstat(fd), rustix::fs::lstat(path)) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// What [`find`] found.
#[derive(Debug)]
pub enum Found {
    /// A running environment: the connection to its pid 1.
    Running(UnixStream),
    /// None: the lock is ours; pass it to the new pid 1.
    Create(OwnedFd),
}

/// Connect to the running environment, or take the lock to create it (waiting up to `wait` while
/// another start is creating it).
pub fn find(rv: &Rendezvous, wait: Duration) -> Result<Found, EnvError> {
    let deadline = Instant::now() + wait;
    loop {
        if let Ok(s) = UnixStream::connect(&rv.socket) {
            return Ok(Found::Running(s));
        }
        let fd = rustix::fs::open(
            &rv.lock,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| EnvError::io("cannot open", &rv.lock, e.into()))?;
        if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok() {
            // an environment removes its lock file as it ends, still holding it: a lock taken on a
            // file no longer at the path is that one's, not the key's; open the path again
            if !still_at(&fd, &rv.lock) {
                continue;
            }
            // nobody holds it: a socket left there is a dead environment's
            let _ = std::fs::remove_file(&rv.socket);
            return Ok(Found::Create(fd));
        }
        if Instant::now() > deadline {
            return Err(EnvError::Unsupported(format!(
                "the environment at {} did not answer within {} s although its lock is held; if \
                 no sw-pool run of yours is running on this node, remove {}",
                rv.socket.display(),
                wait.as_secs(),
                rv.lock.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Receive pid 1's descriptors ([`HANDED`]); the second is `None` when pid 1 made no namespace
/// for your own uid (it always does; kept optional for older environments).
pub fn receive(s: &UnixStream) -> Result<Vec<OwnedFd>, EnvError> {
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(8))];
    let mut anc = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let r = rustix::net::recvmsg(
        s.as_fd(),
        &mut [IoSliceMut::new(&mut byte)],
        &mut anc,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(|e| EnvError::Start {
        what: "receiving the environment's namespaces".into(),
        source: e.into(),
    })?;
    let mut fds = Vec::new();
    for m in anc.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    if r.bytes != 1 || fds.len() != HANDED.len() {
        return Err(EnvError::Start {
            what: format!(
                "the environment handed {} descriptors, not {}",
                fds.len(),
                HANDED.len()
            ),
            source: std::io::Error::from_raw_os_error(libc::EPROTO),
        });
    }
    Ok(fds)
}

/// Enter the environment whose descriptors are `fds` ([`HANDED`]): its user (as root, or as your
/// own uid), mount and PID namespaces and its root; then `cwd` (`/` if it is not there). Only a
/// single-threaded process can enter a user namespace.
pub fn enter(fds: &[OwnedFd], root: bool, cwd: &Path) -> Result<(), EnvError> {
    enter_with(&crate::kernel::RealKernel, fds, root, cwd)
}

/// [`enter`] through `k`: a failed step names itself and nothing after it is tried.
pub(crate) fn enter_with(
    k: &dyn Kernel,
    fds: &[OwnedFd],
    root: bool,
    cwd: &Path,
) -> Result<(), EnvError> {
    if fds.len() != HANDED.len() {
        return Err(EnvError::Start {
            what: format!(
                "joining the environment: {} descriptors, not {}",
                fds.len(),
                HANDED.len()
            ),
            source: std::io::Error::from_raw_os_error(libc::EPROTO),
        });
    }
    let step = |what: &str, r: Result<(), rustix::io::Errno>| {
        r.map_err(|e| EnvError::Start {
            what: format!("joining the environment: {what}"),
            source: e.into(),
        })
    };
    step("its user namespace", k.setns(fds[0].as_fd(), Ns::User))?;
    step("its mount namespace", k.setns(fds[2].as_fd(), Ns::Mount))?;
    step("its PID namespace", k.setns(fds[3].as_fd(), Ns::Pid))?;
    step("its root", k.fchdir(fds[4].as_fd()))?;
    step("chroot", k.chroot_here())?;
    if !root {
        step(
            "your uid's user namespace",
            k.setns(fds[1].as_fd(), Ns::User),
        )?;
    }
    if k.chdir(cwd).is_err() {
        let _ = k.chdir(Path::new("/"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
        let k = launcher_key(parent).expect("the test's parent");
        assert_eq!(
            k,
            format!(
                "mpi-{parent}.{}",
                swpool_sys::process::start_ticks(parent).unwrap()
            )
        );
        assert_eq!(launcher_key(1), None);
        assert_eq!(launcher_key(0), None);
        assert_eq!(step_key("123", "0").as_deref(), Some("step-123.0"));
        assert_eq!(step_key("123", "batch"), Some("step-123.batch".into()));
        assert_eq!(step_key("../x", "0"), None);
        assert_eq!(step_key("", "0"), None);
        let a = layer_key(Path::new("/home/u/layers/dev"));
        assert!(a.starts_with("layer-") && a.len() == 22, "{a}");
        assert_ne!(a, layer_key(Path::new("/home/u/layers/dev2")));
    }

    #[test]
    fn create_then_wait_then_stale() {
        let t = tempfile::tempdir().unwrap();
        let rv = Rendezvous::new(t.path(), "k");
        let lock = match find(&rv, Duration::from_millis(50)).unwrap() {
            Found::Create(fd) => fd,
            Found::Running(_) => panic!("nothing runs"),
        };
        // while the lock is held and nobody listens: wait, then a clear error naming the lock
        let e = find(&rv, Duration::from_millis(30))
            .unwrap_err()
            .to_string();
        assert!(e.contains("k.lock"), "{e}");
        // a listener: joined
        let l = std::os::unix::net::UnixListener::bind(&rv.socket).unwrap();
        assert!(matches!(
            find(&rv, Duration::from_millis(50)).unwrap(),
            Found::Running(_)
        ));
        // the environment died: socket left, lock free -> create again, stale socket removed
        drop(l);
        drop(lock);
        assert!(rv.socket.exists());
        assert!(matches!(
            find(&rv, Duration::from_millis(50)).unwrap(),
            Found::Create(_)
        ));
        assert!(!rv.socket.exists());
    }

    #[test]
    fn a_lock_removed_by_its_ending_environment_is_not_taken() {
        let t = tempfile::tempdir().unwrap();
        let rv = Rendezvous::new(t.path(), "mpi-1.2");
        let Found::Create(held) = find(&rv, Duration::from_millis(50)).unwrap() else {
            panic!("nothing runs")
        };
        // a start opened the lock file before the environment ended
        let early = rustix::fs::open(&rv.lock, OFlags::RDWR, Mode::empty()).unwrap();
        // the environment ends: it removes its lock file while holding it, then lets it go
        std::fs::remove_file(&rv.lock).unwrap();
        drop(held);
        // the early opener's lock is on the removed file: not the key's
        assert!(rustix::fs::flock(&early, FlockOperation::NonBlockingLockExclusive).is_ok());
        assert!(!still_at(&early, &rv.lock));
        // find takes the path's new file, and only one start at a time can hold it
        let Found::Create(new) = find(&rv, Duration::from_millis(50)).unwrap() else {
            panic!("nothing runs")
        };
        assert!(still_at(&new, &rv.lock));
        assert!(find(&rv, Duration::from_millis(30)).is_err());
    }
}
