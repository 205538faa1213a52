//! `sw-pool-view`: mount a read-once view of a directory tree over the tree itself (or at
//! `--at`), for the environments of `sw-pool run --cache DIR` (see `swpool_serve::view`).
//!
//! It opens DIR, walks it once (the snapshot), then forks: the child mounts the view and serves
//! it; the parent exits 0 once the view is mounted, or 1 with the child's error, so that the
//! caller (the environment's pid 1) goes on only with the view in place. The child keeps standard
//! error (its log lines: a file not served, the summary at the end) and ends when the view is
//! unmounted, on SIGTERM/SIGINT/SIGHUP (it unmounts), or with the environment's PID namespace.
//! sw-pool starts it; it is not meant to be run by hand.
//!
//! The job's start (the view's [`Epoch`]: no file changed since is served, on any node) is
//! `--epoch` if given (seconds since 1970; `sw-pool run --cache` passes `$SW_POOL_VIEW_EPOCH`,
//! set by a launcher once for all nodes), else with `--step` (which `sw-pool run --cache` gives in
//! a Slurm step on more than one node) the step's start as Slurm recorded it (`scontrol show
//! step`, one request per node, bounded to 10 s), else none: the view is this node's snapshot.

use std::io::{Read, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rustix::fs::{Mode, OFlags};
use swpool_serve::view::job::JobBytes;
use swpool_serve::view::{Epoch, FileBytes, Snapshot, Storage, View, ViewFs, Warm};

/// Mount a read-once, read-only view of a directory over it.
#[derive(Parser, Debug)]
#[command(name = "sw-pool-view", version)]
struct Args {
    /// The directory (on shared storage) to view
    #[arg(long, value_name = "DIR")]
    over: PathBuf,
    /// Mount the view here instead of over DIR itself
    #[arg(long, value_name = "DIR")]
    at: Option<PathBuf>,
    /// A node-local directory to keep the files' bytes in (as unnamed files: nothing is left);
    /// default: memory
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// When the view ends, write the paths of the files it read, one a line, to FILE
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// The warm start: a node-local directory of yours keeping the files views of this tree
    /// read (made if missing, mode 0700); the next view on this node re-reads from storage only
    /// the files whose size or mtime changed (`sw-pool run --cache` gives one in your cache)
    #[arg(long, value_name = "DIR")]
    warm: Option<PathBuf>,
    /// At most this many bytes in --warm's directory (least recently used go first)
    #[arg(long, value_name = "BYTES", default_value_t = 8 << 30)]
    warm_max: u64,
    /// Requests served at once (default: the node's CPUs, 2 to 16)
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// The snapshot time, in seconds since 1970 (`date +%s.%N`): no file changed at or after it
    /// is served (`sw-pool run --cache` gives `$SW_POOL_VIEW_EPOCH` here)
    #[arg(long, value_name = "SECS", conflicts_with = "step")]
    epoch: Option<String>,
    /// The Slurm job step (`JOB.STEP`) whose start is the snapshot time on every node of the step
    /// (asked of `scontrol show step`; `sw-pool run --cache` gives it in a step of several nodes)
    #[arg(long, value_name = "JOB.STEP")]
    step: Option<String>,
    /// The job-wide view: take the listing and the files' bytes from this node's server of the
    /// job's view at SOCKET (`sw-pool-full view-serve`, which `sw-pool run --cache` starts in a
    /// step of several nodes) instead of walking and reading the tree here
    /// (with --step: when the server does not come within --job-wait, this node lists and reads
    /// the tree itself, the step's start its snapshot, as without --job)
    #[arg(long, value_name = "SOCKET", conflicts_with = "epoch")]
    job: Option<PathBuf>,
    /// With --job: seconds to wait for the node's server to be there
    #[arg(long, value_name = "SECS", default_value_t = 90)]
    job_wait: u64,
    /// Log the snapshot's and the view's figures (to standard error)
    #[arg(long)]
    debug: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    swpool_serve::init_logging(args.debug);
    match run(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sw-pool-view: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    let node = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let dir = &args.over;
    if !dir.is_absolute() {
        return Err(format!("{}: give an absolute path", dir.display()));
    }
    // the environment's pid 1 may hand its capabilities on: read the tree as the user does (no
    // CAP_DAC_OVERRIDE), keeping only what the mount needs, and that only until it is made
    keep_caps(CAP_SYS_ADMIN_ONLY).map_err(|e| format!("dropping capabilities: {e}"))?;
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("{} on {node}: {e}; nothing was mounted", dir.display()))?;
    let store = args
        .store
        .as_ref()
        .map(|s| {
            rustix::fs::open(
                s,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| {
                format!(
                    "--store {} on {node}: {e}; give an existing node-local directory",
                    s.display()
                )
            })
        })
        .transpose()?;
    let (source, snap, epoch) = source(args, root, dir, &node)?;
    let warm = args.warm.as_ref().and_then(|w| {
        match swpool_serve::view::open_warm_dir(w, args.warm_max) {
            Ok(fd) => Some(Arc::new(Warm::new(Box::new(source.bytes()), fd))),
            Err(e) => {
                // a cache it cannot use slows this job's start, it does not stop it
                tracing::warn!("{} on {node}: no warm start: {e}", dir.display());
                None
            }
        }
    });
    // the parent waits on this pipe for the child's word: mounted, or why not
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 fills two descriptors, owned below and nowhere else.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fresh descriptors from pipe2, each owned once.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: no thread has been started in this process (tracing's subscriber starts none);
    // the child continues this program, the parent only reads the pipe and exits.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            drop(rd);
            Ok(child(args, (source, warm), store, snap, epoch, wr, &node))
        }
        _ => {
            drop(wr);
            let mut word = String::new();
            let _ = std::fs::File::from(rd).read_to_string(&mut word);
            match word.as_str() {
                "ok" => Ok(ExitCode::SUCCESS),
                "" => Err(format!(
                    "the view of {} on {node} ended before it was mounted",
                    dir.display()
                )),
                e => Err(e.to_string()),
            }
        }
    }
}

fn child(
    args: &Args,
    (source, warm): (Source, Option<Arc<Warm>>),
    store: Option<OwnedFd>,
    snap: Snapshot,
    epoch: Option<Epoch>,
    wr: OwnedFd,
    node: &str,
) -> ExitCode {
    let dir = &args.over;
    let at = args.at.clone().unwrap_or_else(|| dir.clone());
    let mut wr = std::fs::File::from(wr);
    // standard input and output to /dev/null: whoever waits for their end waits for the parent
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto the standard descriptors of this process.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
    let set = termination_signals();
    // SAFETY: a valid signal set; blocked before the session's threads start, so they inherit it.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    let what = format!("view of {} on {node}", dir.display());
    let view = Arc::new(
        View::new(
            snap,
            match &warm {
                Some(w) => Box::new(w.clone()),
                None => Box::new(source.bytes()),
            },
            store,
            &what,
        )
        .with_epoch(epoch),
    );
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 16)
    });
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoAtime,
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::FSName("sw-pool-view".into()),
        fuser::MountOption::Subtype("sw-pool-view".into()),
    ];
    cfg.n_threads = Some(threads.clamp(1, 64));
    let session = match fuser::Session::new(ViewFs(view.clone()), &at, &cfg).and_then(|s| s.spawn())
    {
        Ok(s) => s,
        Err(e) => {
            let _ = write!(
                wr,
                "cannot mount the view of {} at {} on {node}: {e}{}",
                dir.display(),
                at.display(),
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (/dev/fuse must be usable by this user: mode 0666)"
                } else {
                    ""
                }
            );
            return ExitCode::from(1);
        }
    };
    if let Err(e) = keep_caps(0) {
        let _ = write!(wr, "dropping capabilities: {e}");
        return ExitCode::from(1);
    }
    let _ = wr.write_all(b"ok");
    drop(wr);
    let code = loop {
        if session.guard.is_finished() {
            let _ = session.join();
            break ExitCode::SUCCESS;
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        // SAFETY: `set` is a valid signal set blocked in this thread; null info is allowed.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig > 0 {
            if session.umount_and_join().is_err() {
                let _ = rustix::mount::unmount(&at, rustix::mount::UnmountFlags::DETACH);
            }
            break ExitCode::from((128 + sig).clamp(0, 255) as u8);
        }
    };
    let s = &view.stats;
    tracing::debug!(
        fetched = s.fetched.load(Ordering::Relaxed),
        bytes = s.fetched_bytes.load(Ordering::Relaxed),
        failed = s.failed.load(Ordering::Relaxed),
        storage_opens = source.figures().0,
        storage_bytes = source.figures().1,
        warm_hits = warm.as_ref().map_or(0, |w| w.hits.load(Ordering::Relaxed)),
        "{what}: ended"
    );
    if let Some(t) = &args.trace {
        let mut out = String::new();
        for p in view.trace() {
            out.push_str(&p.to_string_lossy());
            out.push('\n');
        }
        let tmp = t.with_extension(format!("tmp{}", std::process::id()));
        let r = std::fs::write(&tmp, out).and_then(|()| std::fs::rename(&tmp, t));
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!("{what}: --trace {}: {e}", t.display());
        }
    }
    code
}

/// Where the view's listing and bytes come from.
enum Source {
    /// The tree itself, walked and read on this node.
    Storage(Arc<Storage>),
    /// The node's server of the job-wide view.
    Job(Arc<JobBytes>),
}

impl Source {
    fn bytes(&self) -> Arc<dyn FileBytes> {
        match self {
            Source::Storage(s) => s.clone(),
            Source::Job(j) => j.clone(),
        }
    }
    /// Storage opens and bytes this node made (the job's server: bytes it was given).
    fn figures(&self) -> (u64, u64) {
        match self {
            Source::Storage(s) => (
                s.opens.load(Ordering::Relaxed),
                s.bytes.load(Ordering::Relaxed),
            ),
            Source::Job(j) => (0, j.bytes.load(Ordering::Relaxed)),
        }
    }
}

/// The listing, where the bytes come from and the job's start (files changed since are not
/// served): the node's server of the job's view (`--job`; no start needed: one listing for the
/// job), or the tree walked here.
fn source(
    args: &Args,
    root: OwnedFd,
    dir: &std::path::Path,
    node: &str,
) -> Result<(Source, Snapshot, Option<Epoch>), String> {
    let t0 = Instant::now();
    if let Some(sock) = &args.job {
        let wait = Duration::from_secs(args.job_wait);
        match JobBytes::connect(sock, dir, wait, Duration::from_secs(120)) {
            Ok((j, snap)) => {
                tracing::debug!(
                    entries = snap.nodes.len(),
                    secs = t0.elapsed().as_secs_f64(),
                    "the job's listing of {}",
                    dir.display()
                );
                return Ok((Source::Job(Arc::new(j)), snap, None));
            }
            Err(e) if args.step.is_some() => tracing::warn!(
                "{e} (on {node}): this node lists and reads {} itself (slower; files changed \
                 since the step's start are not served)",
                dir.display()
            ),
            Err(e) => return Err(format!("{e} (on {node}); nothing was mounted")),
        }
    }
    let epoch = job_epoch(args, node)?;
    if let Some(e) = &epoch {
        tracing::debug!(
            secs = e.at.0,
            nanos = e.at.1,
            "the job's start: {}",
            e.source
        );
    }
    let snap = Snapshot::walk(root.as_fd(), dir)
        .map_err(|e| format!("{e} (on {node}); nothing was mounted"))?;
    let (files, bytes) = snap.files();
    tracing::debug!(
        entries = snap.nodes.len(),
        files,
        bytes,
        requests = snap.requests,
        secs = t0.elapsed().as_secs_f64(),
        "snapshot of {}",
        dir.display()
    );
    Ok((
        Source::Storage(Arc::new(Storage::new(root, dir))),
        snap,
        epoch,
    ))
}

/// The job's start, the same on every node of the job (see the module's documentation): `--epoch`,
/// else the start of the `--step`. `None` without either, or when Slurm does not answer (said in a
/// log line: then each node's view is its own snapshot).
fn job_epoch(args: &Args, node: &str) -> Result<Option<Epoch>, String> {
    if let Some(v) = &args.epoch {
        return Epoch::parse(v, "--epoch")
            .map(Some)
            .map_err(|e| format!("{e} (on {node}); nothing was mounted"));
    }
    let Some(id) = &args.step else {
        return Ok(None);
    };
    let valid = id.split_once('.').is_some_and(|(j, s)| {
        [j, s]
            .iter()
            .all(|x| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()))
    });
    if !valid {
        return Err(format!(
            "--step {id:?} (on {node}): give a job step as JOB.STEP (numbers); nothing was mounted"
        ));
    }
    match step_start(id, Duration::from_secs(10)) {
        Ok(secs) => Ok(Some(Epoch {
            at: (secs, 0),
            source: format!("job step {id}'s start"),
        })),
        Err(e) => {
            tracing::warn!(
                "job step {id} on {node}: its start time is unknown ({e}): this node's view is a \
                 snapshot of its own start, not of the step's (a file changed while the step's \
                 nodes start may be seen in two versions); set SW_POOL_VIEW_EPOCH=$(date +%s) \
                 before srun to give every node one"
            );
            Ok(None)
        }
    }
}

/// When Slurm started job step `id` (`JOB.STEP`), in seconds since 1970: `scontrol -o show step`
/// with `SLURM_TIME_FORMAT=%s`, given `limit` to answer (then killed).
fn step_start(id: &str, limit: Duration) -> Result<i64, String> {
    use std::process::Stdio;
    use swpool_sys::exec::{wait_bounded, ToolEnd};
    let child = std::process::Command::new("scontrol")
        .args(["-o", "show", "step", id])
        .env("SLURM_TIME_FORMAT", "%s")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("scontrol: {e}"))?;
    // the one bounded runner: pipes drained while it runs, killed by its PID at the limit
    let out = match wait_bounded(child, limit, 64 << 10) {
        Ok(ToolEnd::Done(out)) => out,
        Ok(ToolEnd::Killed(_)) => {
            return Err(format!(
                "scontrol show step {id}: no answer within {} s",
                limit.as_secs()
            ))
        }
        Err(e) => return Err(format!("scontrol: {e}")),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "scontrol show step {id}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_start_time(&text).ok_or_else(|| {
        format!(
            "scontrol show step {id} gave no StartTime in seconds: {:?}",
            text.chars().take(200).collect::<String>()
        )
    })
}

/// The `StartTime=SECS` field of `scontrol -o show step`'s line.
fn parse_start_time(out: &str) -> Option<i64> {
    out.split_whitespace()
        .find_map(|f| f.strip_prefix("StartTime="))
        .and_then(|v| v.parse().ok())
        .filter(|&v: &i64| v > 0)
}

/// `keep_caps`' mask of CAP_SYS_ADMIN (bit 21 of the first word).
const CAP_SYS_ADMIN_ONLY: u32 = 1 << 21;

/// Keep of this process's capabilities only those in `mask` (of the first word; none of the
/// second), in the effective and permitted sets; none inheritable or ambient.
fn keep_caps(mask: u32) -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget/capset with a version-3 header and two data words, as the kernel expects.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let keep = d[0].permitted & mask;
        let new = [
            Data {
                effective: keep,
                permitted: keep,
                inheritable: 0,
            },
            Data::default(),
        ];
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        if libc::syscall(libc::SYS_capset, &mut h as *mut Header, new.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_start_is_read_from_scontrols_line() {
        let l = "StepId=12.0 UserId=1001 StartTime=1764355305 TimeLimit=UNLIMITED State=RUNNING";
        assert_eq!(parse_start_time(l), Some(1764355305));
        assert_eq!(
            parse_start_time("StepId=12.0 StartTime=2026-11-28T20:01:45"),
            None
        );
        assert_eq!(parse_start_time("No job steps in the system"), None);
    }
}
