//! `sw-pool-serve`: serve a pool's image through the verifying chunk server at `DIR/image` and run
//! the file system's FUSE helper on it (`{image}` in its arguments), until that helper ends.
//!
//! sw-pool starts it (`sw-pool mount --in-place`, and `load` when the node has no room for a
//! copy); it is not meant to be run by hand. Its stderr is the mount's log.
//!
//! With `--tree` it serves the pool's squashfs tree itself at DIR, in one hop, with no helper:
//! read through the verifying chunk engine (in place, or `--source unix:PATH` on demand), or with
//! `--cached` straight from a node-local pool file that was verified when it landed. It ends when
//! DIR is unmounted, or on SIGTERM/SIGINT/SIGHUP (it unmounts DIR). An image its reader does not
//! read (another compressor) exits with status 3 before anything is mounted: use the helper.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use clap::Parser;
use swpool_format::pool::Pool;
use swpool_serve::fs::{ImageFs, IMAGE};
use swpool_serve::{Chunks, FileSource, Limits, LocalStore};

/// Serve a pool's image, verifying every chunk against its manifest, and run a FUSE helper on it.
#[derive(Parser, Debug)]
#[command(name = "sw-pool-serve", version)]
struct Args {
    /// The pool file (on shared storage)
    #[arg(long, value_name = "FILE")]
    pool: PathBuf,
    /// The manifest digest that was authorized: a pool whose manifest differs is refused
    #[arg(long, value_name = "DIGEST")]
    digest: String,
    /// An empty directory of the caller's to serve the image in (as DIR/image; with --tree the
    /// pool's tree itself)
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Serve the pool's squashfs tree at DIR in one hop (no helper)
    #[arg(long)]
    tree: bool,
    /// With --tree: POOL is a node-local copy verified when it landed; read it directly
    #[arg(long, requires = "tree", conflicts_with_all = ["source", "keep"])]
    cached: bool,
    /// With --tree: bytes of decompressed blocks kept in memory
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    block_cache: usize,
    /// Where chunks come from: the pool file (default), or `unix:PATH`, the node's on-demand
    /// server (its answers are verified like the file's)
    #[arg(long, value_name = "SOURCE")]
    source: Option<String>,
    /// Seconds one chunk may take from the on-demand server before its read fails (EIO)
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    stall: u64,
    /// Keep fetched chunks in this sparse file (and FILE.chunks), reused by later runs
    #[arg(long, value_name = "FILE")]
    keep: Option<PathBuf>,
    /// Bytes of verified chunks kept in memory when nothing is kept on disk
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 20)]
    memory: u64,
    /// Requests served at once (default: 4; with --tree the node's CPUs, 2 to 16)
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Log each step (to standard error, the mount's log)
    #[arg(long)]
    debug: bool,
    /// The helper and its arguments; `{image}` stands for the served file
    #[arg(last = true, required_unless_present = "tree", value_name = "HELPER")]
    helper: Vec<OsString>,
}

static CHILD: AtomicU32 = AtomicU32::new(0);

fn main() -> ExitCode {
    let args = Args::parse();
    swpool_serve::init_logging(args.debug);
    // before any thread exists: these signals are taken by one thread and passed to the helper
    let set = termination_signals();
    // SAFETY: a valid signal set built by termination_signals; no other thread runs yet.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    match run(&args, set) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sw-pool-serve: {e}");
            ExitCode::from(1)
        }
    }
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

fn run(args: &Args, set: libc::sigset_t) -> Result<ExitCode, String> {
    let node = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned();
    let mut pool = Pool::open(&args.pool).map_err(|e| e.to_string())?;
    let m = pool.manifest.clone();
    if m.digest != args.digest {
        return Err(format!(
            "{}: its manifest ({}) is not the one that was checked ({}): the pool was replaced since; nothing was served, load it again",
            args.pool.display(),
            m.digest,
            args.digest
        ));
    }
    if args.tree && !args.helper.is_empty() {
        return Err("--tree serves the tree itself: give no helper".into());
    }
    if args.tree && m.format != swpool_format::format::ImageFormat::Squashfs {
        eprintln!(
            "sw-pool-serve: {}: a {} image; --tree reads squashfs images only: serve it with its helper",
            args.pool.display(),
            m.format.as_str()
        );
        return Ok(ExitCode::from(UNSUPPORTED));
    }
    let file = match pool.file.take() {
        Some(f) => f,
        None => {
            std::fs::File::open(&args.pool).map_err(|e| format!("{}: {e}", args.pool.display()))?
        }
    };
    if args.cached {
        let what = format!("{} ({})", m.name, args.pool.display());
        return serve_tree(args, set, file, m.image_size, &what, &node);
    }
    let chunks = chunk_engine(args, &m, file, &node)?;
    if args.tree {
        let what = format!("{} ({})", m.name, args.pool.display());
        let size = chunks.image_size();
        let r = serve_tree(
            args,
            set,
            swpool_serve::tree::ChunkReader(chunks.clone()),
            size,
            &what,
            &node,
        );
        if let Some(s) = chunks.local() {
            let _ = s.flush();
        }
        return r;
    }
    serve_image(args, set, &chunks, &m)
}

/// The verifying chunk engine over the pool: chunks from the file (or a node's on-demand server,
/// `--source unix:PATH`), kept in `--keep`'s partial copy if given, read ahead for sequential
/// readers; the kept chunks are marked present now and then.
fn chunk_engine(
    args: &Args,
    m: &swpool_format::pool::Manifest,
    file: std::fs::File,
    node: &str,
) -> Result<Arc<Chunks>, String> {
    let local = match &args.keep {
        Some(p) => Some(
            LocalStore::open(p, &m.digest, m.image_size, m.chunk_size)
                .map_err(|e| format!("{}: cannot keep chunks there: {e}", p.display()))?,
        ),
        None => None,
    };
    let source: Box<dyn swpool_serve::ChunkSource> = match args.source.as_deref() {
        None => Box::new(FileSource::new(file, &args.pool)),
        Some(s) => match s.strip_prefix("unix:") {
            Some(p) => Box::new(swpool_serve::socket::UnixSource::new(
                std::path::Path::new(p),
                Duration::from_secs(args.stall.max(1)),
                &m.digest,
            )),
            None => return Err(format!("--source {s}: give unix:PATH")),
        },
    };
    swpool_serve::keep_chunk_buffers(m.chunk_size);
    let chunks = Arc::new(Chunks::new(
        m,
        source,
        local,
        Limits {
            memory: args.memory,
            ..Limits::default()
        },
        node,
    ));
    // sequential readers (sha256 of a large file, a program's start) do not wait for each chunk
    chunks.start_readahead();
    if chunks.local().is_some() {
        // the chunks fetched so far are marked present now and then (and at the end, below)
        let c = chunks.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(300));
            if let Some(s) = c.local() {
                if let Err(e) = s.flush() {
                    tracing::warn!("{}: marking chunks present: {e}", s.path().display());
                }
            }
        });
    }
    Ok(chunks)
}

/// Two hops: the image served as the file `DIR/image` for the FUSE helper the arguments name, run
/// until it ends; its exit status is ours.
fn serve_image(
    args: &Args,
    set: libc::sigset_t,
    chunks: &Arc<Chunks>,
    m: &swpool_format::pool::Manifest,
) -> Result<ExitCode, String> {
    let mtime = UNIX_EPOCH + Duration::from_secs(m.created);
    let fs = ImageFs::new(
        chunks.clone(),
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
        mtime,
    )
    // the node's on-demand server keeps every chunk in its store (and the page cache of it)
    .direct_io(args.source.is_some());
    let mut cfg = read_only_config("sw-pool-serve");
    cfg.n_threads = Some(args.threads.unwrap_or(4).clamp(1, 64));
    let session = fuser::Session::new(fs, &args.dir, &cfg)
        .and_then(|s| s.spawn())
        .map_err(|e| {
            format!(
                "cannot serve {} at {}: {e}{}",
                m.name,
                args.dir.display(),
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (/dev/fuse must be usable by this user: mode 0666)"
                } else {
                    ""
                }
            )
        })?;
    std::thread::spawn(move || forward_signals(set));
    let image = args.dir.join(IMAGE);
    let argv: Vec<OsString> = args
        .helper
        .iter()
        .map(|a| {
            if a == "{image}" {
                image.clone().into_os_string()
            } else {
                a.clone()
            }
        })
        .collect();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null());
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec only async-signal-safe calls: the helper starts with no
        // signal blocked (ours are blocked for the forwarding thread; the mask is inherited).
        unsafe {
            cmd.pre_exec(|| {
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                Ok(())
            });
        }
    }
    let status = cmd.spawn().and_then(|mut c| {
        CHILD.store(c.id(), Ordering::SeqCst);
        c.wait()
    });
    CHILD.store(0, Ordering::SeqCst);
    if let Some(s) = chunks.local() {
        let _ = s.flush();
    }
    let fetched = chunks
        .stats
        .fetched
        .load(std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(fetched, "helper ended; unmounting the served image");
    drop(session);
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => Ok(match (s.code(), s.signal()) {
            (Some(c), _) => ExitCode::from(c.clamp(0, 255) as u8),
            (None, Some(sig)) => ExitCode::from((128 + sig).clamp(0, 255) as u8),
            _ => ExitCode::from(1),
        }),
        Err(e) => Err(format!("cannot run {}: {e}", argv[0].to_string_lossy())),
    }
}

/// Exit status of `--tree` on an image its reader does not read: fall back to the helper.
const UNSUPPORTED: u8 = 3;

/// `--tree`: serve the squashfs tree read through `src` at DIR until it is unmounted or a
/// termination signal comes (then unmount it).
fn serve_tree<R: swpool_squashfs::ReadAt + 'static>(
    args: &Args,
    set: libc::sigset_t,
    src: R,
    size: u64,
    what: &str,
    node: &str,
) -> Result<ExitCode, String> {
    // blocks (128 KiB by default) and replies are allocated per request: keep them in the heap
    // rather than mmap'ed and faulted in afresh each time (as for chunks, see keep_chunk_buffers)
    swpool_serve::keep_chunk_buffers(1 << 20);
    let ar = match swpool_squashfs::Archive::with_cache(src, size, args.block_cache.max(1 << 20)) {
        Ok(a) => a,
        Err(e @ swpool_squashfs::Error::Unsupported(_)) => {
            eprintln!("sw-pool-serve: {what} on {node}: {e}");
            return Ok(ExitCode::from(UNSUPPORTED));
        }
        Err(e) => return Err(format!("{what} on {node}: {e}; nothing was mounted")),
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 16)
    });
    let fs = swpool_serve::tree::TreeFs::new(ar, what, (threads / 2).max(1));
    let mut cfg = read_only_config("sw-pool");
    cfg.n_threads = Some(threads.clamp(1, 64));
    // each worker reads requests from its own clone of the connection (a queue of its own, no
    // thundering herd on one descriptor)
    cfg.clone_fd = true;
    let session = fuser::Session::new(fs, &args.dir, &cfg)
        .and_then(|s| s.spawn())
        .map_err(|e| {
            format!(
                "cannot serve {what} at {}: {e}{}",
                args.dir.display(),
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (/dev/fuse must be usable by this user: mode 0666)"
                } else {
                    ""
                }
            )
        })?;
    tracing::debug!(threads, "serving the tree");
    loop {
        if session.guard.is_finished() {
            // unmounted from outside (fusermount -u, umount): done
            return match session.join() {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => Err(format!("{what} at {}: {e}", args.dir.display())),
            };
        }
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        // SAFETY: `set` is a valid signal set blocked in this thread; null info is allowed.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig > 0 {
            tracing::debug!(sig, "unmounting on a signal");
            // bounded: a worker still inside a request (a chunk on its way) must not keep the
            // server from ending; past the bound the mount is detached and the process exits
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = done_tx.send(session.umount_and_join());
            });
            let joined = done_rx
                .recv_timeout(Duration::from_secs(2))
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "its requests did not end within 2 s",
                    ))
                });
            if let Err(e) = joined {
                // busy (a file open, a process inside): detach it as libfuse's servers do; the
                // kernel ends the connection when this process exits
                tracing::debug!("unmounting {}: {e}; detaching it", args.dir.display());
                let detached = Command::new("fusermount3")
                    .args(["-u", "-z", "-q", "--"])
                    .arg(&args.dir)
                    .stdin(Stdio::null())
                    .status();
                if !detached.is_ok_and(|s| s.success()) {
                    tracing::warn!(
                        "{what}: cannot unmount {} ({e}); unmount it with `sw-pool umount --force`",
                        args.dir.display()
                    );
                }
            }
            return Ok(ExitCode::from((128 + sig).clamp(0, 255) as u8));
        }
    }
}

/// Pass SIGTERM, SIGINT and SIGHUP on to the helper: it unmounts and ends, and so do we.
fn forward_signals(set: libc::sigset_t) {
    loop {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is a valid signal set blocked in every thread; `sig` is a valid out pointer.
        if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
            continue;
        }
        let pid = CHILD.load(Ordering::SeqCst);
        if pid > 1 {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
        } else {
            std::process::exit(128 + sig);
        }
    }
}

/// The mount options every mount of this server has: read-only, `nosuid,nodev,noatime`, the
/// kernel checking permissions, and `name` as file-system name and subtype (how `list` and
/// `cleanup` recognise sw-pool's mounts in the mount table).
fn read_only_config(name: &str) -> fuser::Config {
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::RO,
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoDev,
        fuser::MountOption::NoAtime,
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::FSName(name.into()),
        fuser::MountOption::Subtype(name.into()),
    ];
    cfg
}
