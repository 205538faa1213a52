//! One node's on-demand server (`sw-pool-full lazy-serve`, one task per node of the background
//! step that `load --lazy` starts): it authorizes the pool like `load` (every node, agreed), keeps
//! the chunks it fetches in the node's cache (`<entry>.part`, crash-safe: [`LocalStore`]), answers
//! the node's `sw-pool-serve` through a socket in the user's state directory and its peers through
//! the exchange ([`super::exchange`]), and mounts the pool on the node with the same record and
//! helper chain as `mount --in-place` (`sw-pool-serve --source unix:SOCKET`, which names the
//! manifest's digest when it connects and takes the chunks this server hashed). It returns when
//! the node's mount is gone (`unload`, the epilog) or `stop` is set; interrupted, the process
//! releases the mount ([`release_held`]).

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use swpool_serve::{Chunks, FileSource, Limits, LocalStore};

use super::exchange::{self, ExchangeStats, PeerSource};
use crate::collective::Collective;
use crate::error::Error;
use crate::load::{explicit_mountpoint, NodeContext};
use crate::mount::MountOptions;
use crate::state::{self, AcquireRequest, Record};

/// The mounts of the servers running in this process, released by [`release_held`] when the
/// process is interrupted (SIGINT/SIGTERM/SIGHUP: an interrupted `mpirun sw-pool load --lazy`, or
/// the end of the job before its epilog): record store, mount point, `PATH` for the tools.
type Held = (state::StateDir, PathBuf, Option<std::ffi::OsString>);
static HELD: std::sync::Mutex<Vec<Held>> = std::sync::Mutex::new(Vec::new());

/// Have [`release_held`] release the mount at `mp` (recorded in `dir`) if the process is
/// interrupted while it serves.
fn hold(dir: &state::StateDir, mp: &std::path::Path, path_var: Option<&std::ffi::OsStr>) {
    if let Ok(mut h) = HELD.lock() {
        h.push((
            dir.clone(),
            mp.to_path_buf(),
            path_var.map(|p| p.to_os_string()),
        ));
    }
}

/// For the signal handler: release every mount [`hold`] named that is still recorded (its FUSE
/// helper stopped, the mount and its record gone), so that an interrupted server leaves nothing.
pub fn release_held() {
    let held = match HELD.lock() {
        Ok(mut h) => std::mem::take(&mut *h),
        Err(_) => return,
    };
    for (dir, mp, path_var) in held {
        let sys = crate::mount::RealSys::new(path_var.as_deref());
        if matches!(dir.read(&mp), Ok(Some(_))) {
            if let Err(e) = state::release(&sys, &dir, &mp, true, None) {
                tracing::warn!("{}: {e}", mp.display());
            }
        }
    }
}

/// Remove the server's socket, and forget it for the signal handler.
fn remove_socket(sock: &std::path::Path) {
    let _ = std::fs::remove_file(sock);
    crate::atomic::unregister_file(sock);
}

/// What to serve.
#[derive(Debug, Clone)]
pub struct LazyRequest {
    /// The pool file (resolved by the launcher).
    pub pool: PathBuf,
    /// The manifest digest the launcher authorized: every node must find the same. `None` when
    /// there is no launcher (`mpirun sw-pool load --lazy`: every rank serves in the foreground):
    /// the pool node 0 authorized, which every node authorizes again with its own policy.
    pub digest: Option<String>,
    pub mountpoint: Option<PathBuf>,
    pub cache_dir: Option<PathBuf>,
    pub job_id: Option<String>,
    /// How long a chunk may take from its owner before the read fails (EIO).
    pub stall: Duration,
    /// How long the mount may take to appear.
    pub timeout: Duration,
    /// A prefetch list ([`super::prefetch`]) to warm on every node once every node has mounted.
    pub prefetch: Option<PathBuf>,
}

/// Step 1 on this node, after node 0's trailer went to every node (`tail`): the pool's manifest
/// (read on node 0, from the broadcast bytes elsewhere) authorized with this node's policy, and
/// the pool file opened; it must be the pool the launcher authorized.
fn open_pool(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LazyRequest,
    first: Option<Result<(crate::pool::Pool, swpool_trust::Verdict), Error>>,
    tail: &[u8],
) -> Result<(crate::pool::Manifest, std::fs::File), Error> {
    let mut pool = match first {
        Some(r) => r?.0,
        None => {
            let a: Option<crate::transfer::Authorized> =
                serde_json::from_slice(tail).ok().flatten();
            let Some(a) = a else {
                return Err(Error::other(
                    crate::ExitStatus::Collective,
                    format!(
                        "{}: the pool's trailer could not be read on {} (see its error)",
                        req.pool.display(),
                        job.leader_host(0)
                    ),
                ));
            };
            let pool = crate::pool::Pool::from_tail(&req.pool, a.len, &a.tail)?;
            crate::load::authorized(node, &pool)?;
            pool
        }
    };
    if let Some(want) = req.digest.as_ref().filter(|d| **d != pool.manifest.digest) {
        return Err(crate::load::LoadError::ChangedSinceJob {
            pool: req.pool.clone(),
            want: want.clone(),
            got: pool.manifest.digest.clone(),
        }
        .into());
    }
    // the other nodes open the file without reading it: they read only the chunks they own
    let file = match pool.file.take() {
        Some(f) => f,
        None => std::fs::File::open(&req.pool).map_err(|e| {
            Error::other(
                crate::ExitStatus::System,
                format!("{}: {e}", req.pool.display()),
            )
        })?,
    };
    Ok((pool.manifest, file))
}

/// What step 2 made on this node: its own verified full copy (if an earlier load left one), else
/// the partial copy chunks are kept in (with the chunks it holds), and the socket the node's
/// `sw-pool-serve` connects to.
type Prepared = (
    Option<(std::fs::File, PathBuf)>,
    Option<(LocalStore, Vec<u64>)>,
    PathBuf,
    std::os::unix::net::UnixListener,
);

/// Step 2 on this node: the node's store (the cache entry's partial copy) and its socket.
fn prepare_node(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LazyRequest,
    m: &crate::pool::Manifest,
) -> Result<Prepared, Error> {
    // testing on one machine: `%n` stands for the (fake) node index
    let cache_dir = req.cache_dir.as_deref().map(|d| job.node_path(d));
    let entry = crate::load::cache_entry(node, cache_dir.as_deref(), m)?;
    let part = crate::cache::partial_path(&entry);
    // a full copy an earlier load verified: every chunk is on the node (each is still hashed
    // before it is served); else the partial copy, made if missing
    let full = crate::cache::unchanged_since_verified(&entry)
        .then(|| {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&entry)
                .ok()
        })
        .flatten()
        .map(|f| (f, entry.clone()));
    let store = match full {
        Some(_) => None,
        None => Some(
            LocalStore::open(&part, &m.digest, m.image_size, m.chunk_size).map_err(|e| {
                Error::other(
                    crate::ExitStatus::System,
                    format!(
                        "{} on {}: cannot keep chunks: {e}",
                        part.display(),
                        job.hostname()
                    ),
                )
            })?,
        ),
    };
    let sock = node.state.server_socket(std::process::id());
    let _ = std::fs::remove_file(&sock);
    let listener = std::os::unix::net::UnixListener::bind(&sock).map_err(|e| {
        Error::other(
            crate::ExitStatus::System,
            format!("{} on {}: {e}", sock.display(), job.hostname()),
        )
    })?;
    let _ = std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600));
    // an interrupted server removes it (main's signal handler)
    crate::atomic::register_file(&sock);
    Ok((full, store, sock, listener))
}

/// Step 3 on this node: mount the pool in place through the node's `sw-pool-serve`, fed by this
/// server's socket, with the user's record; held for [`release_held`].
fn mount_node(
    node: &NodeContext,
    req: &LazyRequest,
    m: &crate::pool::Manifest,
    wanted_mp: Option<&std::path::Path>,
    sock: &std::path::Path,
) -> Result<Record, Error> {
    let mp = match wanted_mp {
        Some(p) => explicit_mountpoint(p)?,
        None => node.default_mountpoint(&m.name, &m.version)?,
    };
    let a = state::acquire(
        node.sys,
        &node.state,
        &AcquireRequest {
            image: req.pool.clone(),
            mountpoint: mp,
            options: MountOptions::parse(None)?,
            job_id: req.job_id.clone(),
            timeout: req.timeout,
            once_per_job: false,
            shell: None,
            source: Some(req.pool.clone()),
            lease: None,
            serve: Some(crate::mount::serve::InPlace {
                digest: m.digest.clone(),
                keep: None,
                source: Some(sock.to_path_buf()),
            }),
            reader: node.cfg.fuse_reader.value,
        },
    )?;
    // interrupted (SIGTERM at the end of the job, Ctrl-C of a launcher), the process
    // releases it before it exits
    hold(&node.state, &a.record.mount_point, node.env.path_var());
    Ok(a.record)
}

/// This node's part of the gate: 0 (mounted) or 1 and the error, at most `GATE_LEN` bytes.
fn gate_part(r: &Result<Record, Error>) -> Vec<u8> {
    let mut part = match r {
        Ok(_) => vec![0u8],
        Err(e) => {
            let mut v = vec![1u8];
            v.extend(e.to_string().bytes().take(exchange::GATE_LEN - 1));
            v
        }
    };
    part.truncate(exchange::GATE_LEN);
    part
}

/// The outcome the nodes agreed on: `None` while unknown, then every node's failure (empty: all
/// mounted).
type Agreed = std::sync::Mutex<Option<Vec<String>>>;
/// This node's mount, once tried.
type Mounted = std::sync::Mutex<Option<Result<Record, Error>>>;

/// After the gate: flush the store now and then; set `done` when the node's mount is gone, the
/// nodes failed, or on `stop`.
fn watch_mount(
    engine: &Chunks,
    done: &AtomicBool,
    stop: &AtomicBool,
    records: &state::StateDir,
    mounted: &Mounted,
    agreed: &Agreed,
) {
    loop {
        std::thread::sleep(Duration::from_millis(300));
        if let Some(st) = engine.local() {
            let _ = st.flush();
        }
        if done.load(Ordering::Relaxed) {
            return;
        }
        let outcome = agreed.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mp = match &*mounted.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(Ok(r)) => Some(r.mount_point.clone()),
            _ => None,
        };
        let gone = match (outcome, mp) {
            (Some(f), _) if !f.is_empty() => true,
            (Some(_), Some(mp)) => !matches!(records.read(&mp), Ok(Some(_))),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if gone || stop.load(Ordering::Relaxed) {
            done.store(true, Ordering::Relaxed);
        }
    }
}

/// The prefetch list, once every node has mounted: one chunk at a time (a bounded share of the
/// links and of shared storage; readers' own requests go first in the owners' queues as they
/// come).
fn prefetch_after_gate(
    engine: &Chunks,
    done: &AtomicBool,
    agreed: &Agreed,
    list: &super::prefetch::PrefetchList,
) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        if done.load(Ordering::Relaxed) {
            return;
        }
        match &*agreed.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(f) if f.is_empty() => break,
            Some(_) => return,
            None => {}
        }
    }
    let mut warmed = 0u64;
    for &i in &list.chunks {
        if done.load(Ordering::Relaxed) {
            return;
        }
        warmed += u64::from(engine.warm(i).is_ok());
    }
    tracing::info!("prefetched {warmed} of {} listed chunks", list.chunks.len());
}

/// Serve (see the module's documentation). `ready` is called on every node once every node has
/// mounted, with this node's record.
pub fn serve(
    job: &dyn Collective,
    node: &NodeContext,
    req: &LazyRequest,
    stop: &AtomicBool,
    ready: &dyn Fn(&Record),
) -> Result<ExchangeStats, Error> {
    // 1. node 0 reads the pool's trailer (one read of it from shared storage per job, whatever
    // the number of nodes: a 4 GB pool's manifest is 300 KB); every node authorizes those bytes
    // with its own policy, and they must be the pool the launcher authorized
    let first = (job.node_index() == 0).then(|| crate::load::open_authorized(node, &req.pool));
    let tail = first.as_ref().map(|r| {
        let a = r
            .as_ref()
            .ok()
            .map(|(p, _)| crate::transfer::Authorized::of(p));
        serde_json::to_vec(&a).expect("json")
    });
    let tail = job.leaders_bcast(0, tail.as_deref())?;
    let opened = open_pool(job, node, req, first, &tail);
    job.agree(crate::error::step_part(Some(&opened)))?;
    let (m, file) = opened.expect("agreed");
    // 2. the node's store (the cache entry's partial copy) and its socket
    let prepared = prepare_node(job, node, req, &m);
    job.agree(crate::error::step_part(Some(&prepared)))?;
    let (full, store, sock, listener) = prepared.expect("agreed");
    let hosts: Vec<String> = (0..job.nodes()).map(|i| job.leader_host(i)).collect();
    // (`tx` lives as long as the exchange: its end of the asks never closes early)
    let (tx, rx) = mpsc::channel();
    let source: Box<dyn swpool_serve::ChunkSource> = match full {
        // this node's own verified copy: it serves its peers from there too
        Some((f, path)) => Box::new(FileSource::new(f, &path)),
        None => Box::new(PeerSource {
            me: job.node_index(),
            nodes: job.nodes(),
            chunk_size: m.chunk_size,
            storage: Box::new(FileSource::new(file, &req.pool)),
            asks: tx.clone(),
            stall: req.stall,
            hosts: hosts.clone(),
        }),
    };
    swpool_serve::keep_chunk_buffers(m.chunk_size);
    let engine = Arc::new(Chunks::new(
        &m,
        source,
        store,
        Limits::default(),
        job.hostname(),
    ));
    {
        let e = engine.clone();
        std::thread::spawn(move || swpool_serve::socket::serve(listener, e));
    }
    // 3. mount on every node, all or nothing, agreed through the exchange's gate: a node's mount
    // reads chunks its peers own, so the nodes answer each other while they mount
    let wanted_mp = req.mountpoint.as_deref().map(|p| job.node_path(p));
    let mount = || mount_node(node, req, &m, wanted_mp.as_deref(), &sock);
    // a prefetch list the launcher checked; a node that cannot read it serves without it
    let prefetch = req.prefetch.as_deref().and_then(|p| {
        super::prefetch::read_list(p, &m)
            .map_err(|e| tracing::warn!("{}: {e}; nothing prefetched", job.hostname()))
            .ok()
    });
    let mounted: Mounted = std::sync::Mutex::new(None);
    let agreed: Agreed = std::sync::Mutex::new(None);
    let done = AtomicBool::new(false);
    let plane = job.leaders_plane(true);
    let stats = std::thread::scope(|s| {
        let (st_tx, st_rx) = mpsc::channel::<Vec<u8>>();
        let (engine, done, records, mounted, agreed) =
            (&engine, &done, &node.state, &mounted, &agreed);
        let mount = &mount;
        s.spawn(move || {
            let r = mount();
            let part = gate_part(&r);
            *mounted.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            let _ = st_tx.send(part);
        });
        // after the gate: flush the store; end when the node's mount is gone or on `stop`
        s.spawn(move || watch_mount(engine, done, stop, records, mounted, agreed));
        // the prefetch list, once every node has mounted: one chunk at a time (a bounded share of
        // the links and of shared storage; readers' own requests go first in the owners' queues
        // as they come)
        if let Some(list) = &prefetch {
            s.spawn(move || prefetch_after_gate(engine, done, agreed, list));
        }
        let mut on_all = |all: Vec<u8>| {
            let failures = gate_failures(&all, &hosts);
            if failures.is_empty() {
                if let Some(Ok(r)) = &*mounted.lock().unwrap_or_else(|e| e.into_inner()) {
                    ready(r);
                }
            }
            *agreed.lock().unwrap_or_else(|e| e.into_inner()) = Some(failures);
        };
        let r = match &plane {
            Some(p) => exchange::run(
                p.as_ref(),
                engine.clone(),
                rx,
                done,
                m.chunks.len() as u64,
                m.chunk_size,
                Some(exchange::Gate {
                    mine: st_rx,
                    all: &mut on_all,
                }),
            ),
            // one node: nothing to exchange; the gate is this node's own outcome
            None => {
                if let Ok(mine) = st_rx.recv() {
                    on_all(mine);
                }
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(ExchangeStats::default())
            }
        };
        done.store(true, Ordering::Relaxed);
        r
    });
    let failures = agreed.into_inner().unwrap_or_else(|e| e.into_inner());
    let mounted = mounted.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = failures.filter(|f| !f.is_empty()) {
        // another node failed: take this node's mount back
        if let Some(Ok(r)) = &mounted {
            let _ = state::release(node.sys, &node.state, &r.mount_point, true, None);
        }
        remove_socket(&sock);
        return Err(Error::other(
            crate::ExitStatus::System,
            format!("failed on {} node(s): {}", f.len(), f.join("; ")),
        ));
    }
    if let Some(st) = engine.local() {
        let _ = st.flush();
    }
    remove_socket(&sock);
    stats.map_err(|e| {
        Error::other(
            crate::ExitStatus::System,
            format!(
                "{}: the exchange with the other nodes failed: {e}",
                job.hostname()
            ),
        )
    })
}

/// Every node's failure in the gathered gate parts, named by host and rank.
fn gate_failures(all: &[u8], hosts: &[String]) -> Vec<String> {
    all.chunks(exchange::GATE_LEN)
        .enumerate()
        .filter(|(_, p)| p[0] != 0)
        .map(|(i, p)| {
            let msg = String::from_utf8_lossy(&p[1..])
                .trim_end_matches('\0')
                .to_string();
            format!(
                "{} (rank {i}): {msg}",
                hosts.get(i).cloned().unwrap_or_default()
            )
        })
        .collect()
}
