//! The lease of a user image: read-write on one node at a time, read-only on any number.
//!
//! The lease lives beside the image on the shared file system, as `IMG.lease` (JSON: the holders).
//! It is changed only under a short lock, `IMG.lease.lock`, taken by creating that name
//! exclusively (`O_CREAT|O_EXCL`): atomic on every file system sites keep images on (a local one,
//! NFS v3 and later without lockd, sshfs over SFTP), where `flock` is node-local or missing (and
//! sshfs refuses `link(2)` without its hard-link extension). Under the lock the holders are read, checked and written
//! back (to a temporary name, renamed), then the lock name is unlinked.
//!
//! A holder that is gone is recognised ([`Liveness`]): on its own node, its host rebooted (another
//! boot id) or its process is gone; anywhere, its Slurm job has ended. Such a holder is dropped and
//! its place taken, with a note; a holder that may be alive is never dropped: the request is refused
//! naming it. A lock left by a process that died inside the few milliseconds it holds it is taken
//! over after [`LOCK_STALE`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A lock older than this belongs to a process that died while holding it.
pub const LOCK_STALE: Duration = Duration::from_secs(30);
/// How long [`take`] waits for the lock before it gives up.
pub const LOCK_WAIT: Duration = Duration::from_secs(20);

/// Read-write (one holder) or read-only (any number, no writer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Rw,
    Ro,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Rw => "read-write",
            Mode::Ro => "read-only",
        })
    }
}

/// Who holds the image, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub mode: Mode,
    pub host: String,
    /// `/proc/sys/kernel/random/boot_id` of the holder's node when it took the lease.
    pub boot_id: String,
    /// The process whose life is the lease's (the FUSE helper serving the mount).
    pub pid: u32,
    pub uid: u32,
    pub user: String,
    /// The Slurm job it was taken in, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Where it is mounted on `host`.
    pub mount_point: PathBuf,
    /// Seconds since the epoch.
    pub since: u64,
}

impl Holder {
    /// This process on this node holding the image in `mode` for `mount_point` (an offline
    /// operation names the image itself); its pid becomes the serving helper's once that runs.
    pub fn here(mode: Mode, mount_point: &Path, job: Option<String>) -> Holder {
        let uid = rustix::process::geteuid().as_raw();
        Holder {
            mode,
            host: crate::users::hostname(),
            boot_id: boot_id(),
            pid: std::process::id(),
            uid,
            user: crate::users::name_of(uid),
            job,
            mount_point: mount_point.to_path_buf(),
            since: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        }
    }

    /// `read-write on node3 (job 1234, pid 567, user alice, at /home/alice/mnt)`
    pub fn describe(&self) -> String {
        format!(
            "{} on {} ({}pid {}, user {}, at {})",
            self.mode,
            self.host,
            self.job
                .as_ref()
                .map(|j| format!("job {j}, "))
                .unwrap_or_default(),
            self.pid,
            self.user,
            self.mount_point.display()
        )
    }

    /// The same mount: host, boot, mount point, user and mode.
    fn same_mount(&self, other: &Holder) -> bool {
        self.host == other.host
            && self.boot_id == other.boot_id
            && self.mount_point == other.mount_point
            && self.uid == other.uid
            && self.mode == other.mode
    }
}

/// The lease file's content.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFile {
    pub schema: u32,
    pub holders: Vec<Holder>,
}

/// Whether a holder still holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alive {
    Yes,
    /// Gone, and why ("its job 12 has ended", "node3 rebooted").
    No(String),
}

/// Tells whether a holder still lives (the seam tests replace).
pub trait Liveness {
    fn check(&self, h: &Holder) -> Alive;
}

/// What [`take`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// Holders that were gone and were dropped, with why.
    pub dropped: Vec<(Holder, String)>,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("{} is in use: {}; a second read-write mount, or read-write while it is mounted read-only, is refused (unmount it there first; a holder whose job ended or whose node rebooted is taken over by itself)", .image.display(), .holders.iter().map(Holder::describe).collect::<Vec<_>>().join("; "))]
    Held {
        image: PathBuf,
        holders: Vec<Holder>,
    },
    #[error("the lease of {image} ({lease}) is not a valid lease file: {reason}; if no node uses the image, remove that file")]
    Corrupt {
        image: PathBuf,
        lease: PathBuf,
        reason: String,
    },
    #[error("cannot {what} {}: {source}; the image's directory must be writable by you (the lease lives beside the image)", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the lease of {image} stayed locked for {}s by {holder}; try again, or remove {} if that process is gone", LOCK_WAIT.as_secs(), lock.display())]
    Locked {
        image: PathBuf,
        lock: PathBuf,
        holder: String,
    },
}

pub fn lease_path(image: &Path) -> PathBuf {
    suffixed(image, ".lease")
}

fn lock_path(image: &Path) -> PathBuf {
    suffixed(image, ".lease.lock")
}

fn suffixed(p: &Path, s: &str) -> PathBuf {
    let mut o = p.as_os_str().to_os_string();
    o.push(s);
    PathBuf::from(o)
}

/// Held while the lease is being changed.
struct LockGuard {
    path: PathBuf,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> LeaseError + 'a {
    move |source| LeaseError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Take the lock: the lock's name created exclusively (`O_CREAT|O_EXCL`), then our identity
/// written into it. Exclusive create is atomic on a local file system, on NFS (v3 and later) and
/// over SFTP (sshfs: `SSH_FXF_EXCL`), where `flock` is node-local or absent and `link(2)` may be
/// refused (sshfs without the hard-link extension: EPERM).
fn lock(image: &Path, me: &str) -> Result<LockGuard, LeaseError> {
    let lock = lock_path(image);
    let start = std::time::Instant::now();
    let mut pause = Duration::from_millis(2);
    let mut perm_gone = 0;
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
        {
            Ok(mut f) => {
                let g = LockGuard { path: lock };
                let _ = f.write_all(me.as_bytes()); // for the message of a waiter; not needed
                return Ok(g);
            }
            // sshfs reports an existing name as EPERM (SFTP's generic failure): the name is there
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    || (e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error())
                        && std::fs::symlink_metadata(&lock).is_ok()) =>
            {
                let age = std::fs::symlink_metadata(&lock)
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok());
                if age.is_some_and(|a| a > LOCK_STALE) {
                    // its taker died inside the critical section: take it over (one of the racers
                    // removes it; the exclusive create above then decides again)
                    let _ = std::fs::remove_file(&lock);
                    continue;
                }
                if start.elapsed() > LOCK_WAIT {
                    return Err(LeaseError::Locked {
                        image: image.to_path_buf(),
                        holder: std::fs::read_to_string(&lock).unwrap_or_default(),
                        lock,
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            // EPERM and no name there (any more): either its holder unlinked it between our create
            // and our look (seen under load on sshfs: t_75, 1 round in 100 with two busy loops), or
            // the directory is really not writable; the first passes, the second repeats
            Err(e)
                if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error())
                    && perm_gone < PERM_RETRIES =>
            {
                perm_gone += 1;
                std::thread::sleep(pause);
            }
            Err(e) => return Err(io("create the lock", &lock)(e)),
        }
    }
}

/// How many times [`lock`] tries again after an `EPERM` with no lock name there (see there).
const PERM_RETRIES: u32 = 8;

fn read(image: &Path) -> Result<LeaseFile, LeaseError> {
    let p = lease_path(image);
    match std::fs::read(&p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(LeaseFile {
            schema: 1,
            holders: Vec::new(),
        }),
        Err(e) => Err(io("read the lease", &p)(e)),
        Ok(b) if b.len() > 1 << 20 => Err(LeaseError::Corrupt {
            image: image.to_path_buf(),
            lease: p,
            reason: "larger than 1 MiB".into(),
        }),
        Ok(b) => serde_json::from_slice(&b).map_err(|e| LeaseError::Corrupt {
            image: image.to_path_buf(),
            lease: p.clone(),
            reason: e.to_string(),
        }),
    }
}

fn write(image: &Path, l: &LeaseFile) -> Result<(), LeaseError> {
    let p = lease_path(image);
    if l.holders.is_empty() {
        return match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(io("remove the lease", &p)(e))
            }
            _ => Ok(()),
        };
    }
    let json = serde_json::to_vec_pretty(l).expect("lease serialises");
    crate::atomic::write_file(&p, &json, false).map_err(io("write the lease", &p))
}

/// Take the image for `me` (its mode, host, …), dropping holders that are gone. Refused while a
/// holder that may be alive conflicts: any holder for `Rw`, a writer for `Ro`. The same mount taking
/// it again (a second reference on its node) is not a conflict, and keeps the holder as it is (its
/// pid is the serving helper's, which the lease's life follows).
pub fn take(image: &Path, me: &Holder, live: &dyn Liveness) -> Result<Taken, LeaseError> {
    let _g = lock(image, &me.describe())?;
    let mut l = read(image)?;
    let mut dropped = Vec::new();
    l.holders.retain(|h| match live.check(h) {
        Alive::Yes => true,
        Alive::No(why) => {
            dropped.push((h.clone(), why));
            false
        }
    });
    let conflicts: Vec<Holder> = l
        .holders
        .iter()
        .filter(|h| !h.same_mount(me))
        .filter(|h| me.mode == Mode::Rw || h.mode == Mode::Rw)
        .cloned()
        .collect();
    if !conflicts.is_empty() {
        if !dropped.is_empty() {
            write(image, &l)?; // the gone ones go anyway
        }
        return Err(LeaseError::Held {
            image: image.to_path_buf(),
            holders: conflicts,
        });
    }
    if !l.holders.iter().any(|h| h.same_mount(me)) {
        l.holders.push(me.clone());
    }
    l.schema = 1;
    write(image, &l)?;
    Ok(Taken { dropped })
}

/// Update the holder of `me`'s mount (its pid once the helper runs).
pub fn update(image: &Path, me: &Holder) -> Result<(), LeaseError> {
    let _g = lock(image, &me.describe())?;
    let mut l = read(image)?;
    for h in l.holders.iter_mut().filter(|h| h.same_mount(me)) {
        *h = me.clone();
    }
    write(image, &l)
}

/// Give the image back: `me`'s mount is no longer a holder (the lease file goes with the last one).
pub fn release(image: &Path, me: &Holder) -> Result<(), LeaseError> {
    let _g = lock(image, &me.describe())?;
    let mut l = read(image)?;
    l.holders.retain(|h| !h.same_mount(me));
    write(image, &l)
}

/// The holders as they are (for `image resize` and messages), gone ones included.
pub fn holders(image: &Path) -> Result<Vec<Holder>, LeaseError> {
    Ok(read(image)?.holders)
}

/// This node's boot id.
pub fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The real test: on this node by boot id and pid; anywhere by the holder's Slurm job (`squeue`).
pub struct RealLiveness {
    pub host: String,
    pub boot_id: String,
    /// `PATH` for `squeue`.
    pub path_var: Option<std::ffi::OsString>,
}

impl RealLiveness {
    /// This node, with `PATH` for `squeue`.
    pub fn here(path_var: Option<&std::ffi::OsStr>) -> RealLiveness {
        RealLiveness {
            host: crate::users::hostname(),
            boot_id: boot_id(),
            path_var: path_var.map(ToOwned::to_owned),
        }
    }
}

impl Liveness for RealLiveness {
    fn check(&self, h: &Holder) -> Alive {
        if h.host == self.host {
            if h.boot_id != self.boot_id {
                return Alive::No(format!("{} rebooted since it took the lease", h.host));
            }
            if h.pid != 0 && !pid_alive(h.pid) {
                return Alive::No(format!("its process {} on {} is gone", h.pid, h.host));
            }
        }
        if let Some(job) = &h.job {
            if let Some(false) = job_running(job, self.path_var.as_deref()) {
                return Alive::No(format!("its job {job} has ended"));
            }
        }
        Alive::Yes
    }
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    match rustix::process::Pid::from_raw(pid as i32) {
        Some(p) => !matches!(
            rustix::process::test_kill_process(p),
            Err(rustix::io::Errno::SRCH)
        ),
        None => false,
    }
}

/// Whether Slurm still knows the job as pending or running (`None`: cannot tell, no squeue).
fn job_running(job: &str, path_var: Option<&std::ffi::OsStr>) -> Option<bool> {
    if job.is_empty()
        || !job
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'_' || b == b'.')
    {
        return None;
    }
    let out = std::process::Command::new("squeue")
        .args(["-h", "-o", "%T", "-j", job])
        .env("PATH", path_var.unwrap_or_else(|| "/usr/bin:/bin".as_ref()))
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // "Invalid job id specified": Slurm has forgotten it
        return String::from_utf8_lossy(&out.stderr)
            .contains("Invalid job id")
            .then_some(false);
    }
    Some(text.lines().any(|s| {
        matches!(
            s.trim(),
            "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED"
        )
    }))
}

/// Give back the lease of a read-write mount whose record goes: first wait (at most a minute) for
/// its helper to exit, so that everything it buffered is in the image, then drop the holder. A
/// failure is logged, never fatal: the unmount itself has happened, and a lease whose holder is
/// gone is recognised by the next taker.
pub fn end_lease(image: &Path, holder: &Holder, helper_pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while helper_pid != 0 && pid_alive(helper_pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    if let Err(e) = release(image, holder) {
        tracing::warn!("{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    struct Fake(Mutex<Vec<u32>>); // pids that are dead
    impl Liveness for Fake {
        fn check(&self, h: &Holder) -> Alive {
            if self.0.lock().unwrap().contains(&h.pid) {
                Alive::No(format!("pid {} is gone", h.pid))
            } else {
                Alive::Yes
            }
        }
    }

    fn h(mode: Mode, host: &str, pid: u32) -> Holder {
        Holder {
            mode,
            host: host.into(),
            boot_id: "b".into(),
            pid,
            uid: 1000,
            user: "alice".into(),
            job: Some("7".into()),
            mount_point: PathBuf::from(format!("/mnt/{host}")),
            since: 0,
        }
    }

    #[test]
    fn one_writer_or_many_readers() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("data.img");
        std::fs::write(&img, b"x").unwrap();
        let live = Fake(Mutex::new(vec![]));
        take(&img, &h(Mode::Rw, "n1", 1), &live).unwrap();
        // the same mount again (another process): fine, and the holder stays as it was; another
        // writer, a reader, or the same mount point read-only: refused, naming the holder
        take(&img, &h(Mode::Rw, "n1", 9), &live).unwrap();
        assert_eq!(holders(&img).unwrap()[0].pid, 1);
        assert!(take(&img, &h(Mode::Ro, "n1", 9), &live).is_err());
        let e = take(&img, &h(Mode::Rw, "n2", 2), &live)
            .unwrap_err()
            .to_string();
        assert!(e.contains("read-write on n1 (job 7, pid 1"), "{e}");
        let e = take(&img, &h(Mode::Ro, "n2", 2), &live)
            .unwrap_err()
            .to_string();
        assert!(e.contains("read-write on n1"), "{e}");
        release(&img, &h(Mode::Rw, "n1", 1)).unwrap();
        assert!(
            !lease_path(&img).exists(),
            "the last holder removes the lease"
        );
        // readers share; a writer is refused while any reader holds
        take(&img, &h(Mode::Ro, "n1", 1), &live).unwrap();
        take(&img, &h(Mode::Ro, "n2", 2), &live).unwrap();
        let e = take(&img, &h(Mode::Rw, "n3", 3), &live)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("in use") && e.contains("n1") && e.contains("n2"),
            "{e}"
        );
        // a gone holder is dropped and its place taken
        live.0.lock().unwrap().extend([1, 2]);
        let t = take(&img, &h(Mode::Rw, "n3", 3), &live).unwrap();
        assert_eq!(t.dropped.len(), 2);
        assert_eq!(holders(&img).unwrap().len(), 1);
        // no lock or temporary file left beside the image
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn a_corrupt_lease_is_named_and_not_overwritten() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("data.img");
        std::fs::write(lease_path(&img), b"{not json").unwrap();
        let live = Fake(Mutex::new(vec![]));
        let e = take(&img, &h(Mode::Rw, "n1", 1), &live)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a valid lease file"), "{e}");
        assert_eq!(std::fs::read(lease_path(&img)).unwrap(), b"{not json");
    }

    /// Many threads race for the writer's lease, 100 rounds: exactly one wins each round.
    #[test]
    fn racing_writers_exactly_one_wins() {
        let d = tempfile::tempdir().unwrap();
        let img = d.path().join("data.img");
        for round in 0..100 {
            let wins = std::sync::atomic::AtomicUsize::new(0);
            std::thread::scope(|s| {
                for t in 0..4u32 {
                    let (img, wins) = (&img, &wins);
                    s.spawn(move || {
                        let live = Fake(Mutex::new(vec![]));
                        if take(img, &h(Mode::Rw, &format!("n{t}"), t + 1), &live).is_ok() {
                            wins.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    });
                }
            });
            assert_eq!(wins.into_inner(), 1, "round {round}");
            let holder = holders(&img).unwrap().remove(0);
            release(&img, &holder).unwrap();
        }
    }
}
