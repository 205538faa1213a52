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
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fs::{Mode, OFlags};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use swpool_sys::lock::{self, Share};

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
                held: !matches!(lock::try_lock(&fd, Share::Shared), Ok(true)),
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
        if matches!(lock::try_lock(&fd, Share::Exclusive), Ok(true)) {
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

/// Pid 1's end of the rendezvous: its socket, and the directory it is in (to remove it and the lock
/// beside it by name, whatever the path leads to by then).
pub(crate) struct Listener {
    sock: UnixListener,
    dir: OwnedFd,
    name: std::ffi::OsString,
}

impl Listener {
    pub(crate) fn bind(p: &Path) -> std::io::Result<Listener> {
        let parent = p.parent().unwrap_or(Path::new("/"));
        let dir = rustix::fs::open(
            parent,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let _ = std::fs::remove_file(p);
        let sock = UnixListener::bind(p)?;
        sock.set_nonblocking(true)?;
        Ok(Listener {
            sock,
            dir,
            name: p.file_name().unwrap_or_default().to_os_string(),
        })
    }

    /// Remove the socket, then the rendezvous lock beside it, which pid 1 still holds: a start
    /// that locked the removed file sees that it is no longer at its path and takes the path's
    /// new one ([`crate::rendezvous::find`]), and no lock file is left per key (an MPI launcher's key is
    /// new with every job).
    pub(crate) fn remove(&self) {
        let _ = rustix::fs::unlinkat(
            &self.dir,
            self.name.as_os_str(),
            rustix::fs::AtFlags::empty(),
        );
        let lock = Path::new(&self.name).with_extension("lock");
        let _ = rustix::fs::unlinkat(&self.dir, lock.as_os_str(), rustix::fs::AtFlags::empty());
    }
}

/// Send a joiner pid 1's descriptors ([`HANDED`]) with one byte.
fn hand_over(c: &UnixStream, fds: &[OwnedFd]) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    c.set_nonblocking(false)?;
    let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(8))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    anc.push(SendAncillaryMessage::ScmRights(&borrowed));
    rustix::net::sendmsg(
        c,
        &[std::io::IoSlice::new(b"e")],
        &mut anc,
        SendFlags::empty(),
    )?;
    Ok(())
}

/// The starts that joined the environment, as pid 1 keeps them: each connection stays open until
/// its command ends (a joiner never writes: readable means closed).
pub(crate) struct Joiners<'a> {
    listener: Option<&'a Listener>,
    handed: Vec<OwnedFd>,
    conns: Vec<UnixStream>,
}

impl<'a> Joiners<'a> {
    /// `handed`: what each joiner gets ([`HANDED`]).
    pub(crate) fn new(listener: Option<&'a Listener>, handed: Vec<OwnedFd>) -> Joiners<'a> {
        Joiners {
            listener,
            handed,
            conns: Vec::new(),
        }
    }

    /// Hand every start waiting in the listener's backlog the descriptors; keep its connection.
    fn accept(&mut self) {
        if let Some(l) = self.listener {
            while let Ok((c, _)) = l.sock.accept() {
                if hand_over(&c, &self.handed).is_ok() {
                    self.conns.push(c);
                }
            }
        }
    }

    /// The command has ended: may pid 1 end too? Only when no joiner remains, after serving a
    /// start that connected while the command ended (it waits in the backlog).
    pub(crate) fn last_one_out(&mut self) -> bool {
        self.accept();
        self.conns.is_empty()
    }

    /// How many joiners are in.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    /// The descriptors to wait on: the listener's (if any), then each connection's.
    pub(crate) fn poll_fds(&self) -> Vec<i32> {
        self.listener
            .map(|l| l.sock.as_raw_fd())
            .into_iter()
            .chain(self.conns.iter().map(|c| c.as_raw_fd()))
            .collect()
    }

    /// After the wait: `ready[i]` for each of [`Joiners::poll_fds`]. A joiner whose connection
    /// closed has left; then new starts are let in.
    pub(crate) fn ready(&mut self, ready: &[bool]) {
        let first_conn = usize::from(self.listener.is_some());
        for i in (0..self.conns.len()).rev() {
            if ready.get(first_conn + i).copied().unwrap_or(false) {
                let mut b = [0u8; 16];
                use std::io::Read;
                if !matches!(self.conns[i].read(&mut b), Ok(n) if n > 0) {
                    self.conns.remove(i);
                }
            }
        }
        if self.listener.is_some() && ready.first().copied().unwrap_or(false) {
            self.accept();
        }
    }
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
        assert!(lock::try_lock(&early, Share::Exclusive).unwrap());
        assert!(!still_at(&early, &rv.lock));
        // find takes the path's new file, and only one start at a time can hold it
        let Found::Create(new) = find(&rv, Duration::from_millis(50)).unwrap() else {
            panic!("nothing runs")
        };
        assert!(still_at(&new, &rv.lock));
        assert!(find(&rv, Duration::from_millis(30)).is_err());
    }

    /// Five descriptors standing for pid 1's namespaces and root.
    fn five() -> Vec<OwnedFd> {
        (0..HANDED.len())
            .map(|_| std::fs::File::open("/").unwrap().into())
            .collect()
    }

    /// Wait up to 2 s for pid 1's descriptors to be ready, then let [`Joiners`] act on them.
    fn pump(j: &mut Joiners<'_>) {
        let mut pfds: Vec<libc::pollfd> = j
            .poll_fds()
            .into_iter()
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 2000) };
        let ready: Vec<bool> = pfds.iter().map(|p| p.revents != 0).collect();
        j.ready(&ready);
    }

    fn join(rv: &Rendezvous) -> UnixStream {
        match find(rv, Duration::from_millis(200)).unwrap() {
            Found::Running(c) => c,
            Found::Create(_) => panic!("the environment runs"),
        }
    }

    #[test]
    fn joiners_get_the_descriptors_and_the_last_one_out_ends_the_environment() {
        let t = tempfile::tempdir().unwrap();
        let rv = Rendezvous::new(t.path(), "step-7.0");
        let Found::Create(_held) = find(&rv, Duration::from_millis(50)).unwrap() else {
            panic!("nothing runs")
        };
        let l = Listener::bind(&rv.socket).unwrap();
        let mut j = Joiners::new(Some(&l), five());
        // two starts join while the command runs: each receives the five descriptors
        let a = join(&rv);
        pump(&mut j);
        assert_eq!(receive(&a).unwrap().len(), HANDED.len());
        let b = join(&rv);
        pump(&mut j);
        assert_eq!(receive(&b).unwrap().len(), HANDED.len());
        assert_eq!(j.len(), 2);
        // the command ends: pid 1 stays while a joiner is in
        assert!(!j.last_one_out());
        drop(a);
        pump(&mut j);
        assert_eq!(j.len(), 1, "a joiner left");
        assert!(!j.last_one_out());
        // a start that connects as the last joiner leaves waits in the backlog: it is served
        // before pid 1 decides to end
        drop(b);
        pump(&mut j);
        assert_eq!(j.len(), 0);
        let c = join(&rv);
        assert!(!j.last_one_out(), "the late joiner keeps it");
        assert_eq!(receive(&c).unwrap().len(), HANDED.len());
        drop(c);
        pump(&mut j);
        assert!(j.last_one_out(), "the last one out ends it");
        // ending: socket and lock file removed (the lock still held by pid 1)
        l.remove();
        assert!(!rv.socket.exists() && !rv.lock.exists());
    }

    #[test]
    fn a_crashed_holder_leaves_a_socket_the_next_start_clears() {
        use std::os::unix::process::CommandExt;
        let t = tempfile::tempdir().unwrap();
        let rv = Rendezvous::new(t.path(), "step-8.0");
        let Found::Create(held) = find(&rv, Duration::from_millis(50)).unwrap() else {
            panic!("nothing runs")
        };
        let info = Info {
            key: "step-8.0".into(),
            layer: "-".into(),
            layer_dir: None,
            method: "namespaces only (no layer)".into(),
            pid: 4242,
            started: 1,
        };
        info.write(&rv).unwrap();
        let l = Listener::bind(&rv.socket).unwrap();
        // the holder: a process that inherits the lock (as pid 1 does), then dies by SIGKILL
        let raw = held.as_raw_fd();
        let mut holder = unsafe {
            std::process::Command::new("sleep")
                .arg("30")
                .pre_exec(move || {
                    if libc::fcntl(raw, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
                .spawn()
                .unwrap()
        };
        drop(held);
        drop(l); // nobody listens now; the socket file stays, as after a kill -9
        assert_eq!(running(t.path()), vec![info.clone()], "its lock is held");
        assert!(remove_stale(t.path(), false).is_empty(), "not stale yet");
        // another test's child, forked before it execs, may hold a copy of the listener for a
        // moment (the tests of this binary run in parallel threads): until that copy closes a
        // connect still succeeds, so look again for a bounded time
        let until = std::time::Instant::now() + Duration::from_secs(10);
        let e = loop {
            match find(&rv, Duration::from_millis(50)) {
                Err(e) => break e.to_string(),
                Ok(Found::Running(_)) if std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(_) => panic!("the socket still answers 10 s after its listener closed"),
            }
        };
        assert!(e.contains("step-8.0.lock"), "{e}");
        assert!(
            swpool_sys::process::signal(holder.id(), swpool_sys::process::Signal::Kill).unwrap()
        );
        holder.wait().unwrap();
        // the lock died with it: listed as gone, then cleared, and the next start creates anew
        assert!(running(t.path()).is_empty());
        assert_eq!(remove_stale(t.path(), true), vec![rv.socket.clone()]);
        assert!(rv.socket.exists(), "a dry run removes nothing");
        assert_eq!(remove_stale(t.path(), false), vec![rv.socket.clone()]);
        assert!(!rv.socket.exists() && !rv.socket.with_extension("json").exists());
        assert!(matches!(
            find(&rv, Duration::from_millis(50)).unwrap(),
            Found::Create(_)
        ));
    }

    #[test]
    fn a_joiner_enters_user_mount_pid_root_then_its_own_uid() {
        use crate::kernel::{FakeKernel, Step};
        let fds = five();
        let n: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let k = FakeKernel::default();
        enter_with(&k, &fds, false, Path::new("/work")).unwrap();
        assert_eq!(
            k.steps(),
            vec![
                Step::Setns(n[0], Ns::User),
                Step::Setns(n[2], Ns::Mount),
                Step::Setns(n[3], Ns::Pid),
                Step::Fchdir(n[4]),
                Step::Chroot,
                Step::Setns(n[1], Ns::User),
                Step::Chdir("/work".into()),
            ]
        );
        // --root stays the namespace's root; a missing working directory is `/`
        let k = FakeKernel::failing(Step::Chdir("/work".into()), rustix::io::Errno::NOENT);
        enter_with(&k, &fds, true, Path::new("/work")).unwrap();
        assert_eq!(
            k.steps()[4..],
            [
                Step::Chroot,
                Step::Chdir("/work".into()),
                Step::Chdir("/".into())
            ]
        );
        // a step that fails names itself; nothing after it is tried
        let k = FakeKernel::failing(Step::Setns(n[2], Ns::Mount), rustix::io::Errno::PERM);
        let e = enter_with(&k, &fds, false, Path::new("/")).unwrap_err();
        assert!(
            e.to_string()
                .contains("joining the environment: its mount namespace"),
            "{e}"
        );
        assert_eq!(k.steps().len(), 2);
        // a short hand: refused before any step
        let k = FakeKernel::default();
        assert!(enter_with(&k, &fds[..4], false, Path::new("/")).is_err());
        assert!(k.steps().is_empty());
    }
}
