//! The steps of [`super::run`] before and after pid 1: the layer, the plan, meeting a running
//! environment, the job's copy, what pid 1 inherits, and the end of the job's copy.

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::Duration;

use super::{keep_upper, RunRequest, Synced};
use crate::layer::{Layer, LayerStore};
use crate::plan;
use crate::{probe, rendezvous, EnvError};

/// The probe's facts, the plan chosen from them, and `fuse2fs` where a pool needs it: `--pool`
/// and `--cache` mount with FUSE inside the environment, with the tools for the pools' formats.
pub(super) fn choose(
    req: &RunRequest,
    synced: Option<&Synced>,
    has_layer: bool,
) -> Result<(plan::Facts, plan::Plan, Option<PathBuf>), EnvError> {
    let base = !req.bases.is_empty();
    let mut facts = probe::facts(
        req.path_var.as_deref(),
        has_layer,
        base,
        &req.pools,
        req.helper.as_deref(),
    );
    facts.tree_server = req.tree_server.is_some();
    facts.copy_has_whiteouts = synced.is_some_and(|s| s.copies.has_whiteouts(&s.state));
    let mut p = plan::choose(has_layer, base, &facts)?;
    let fuse2fs = if req.pools.is_empty() {
        None
    } else {
        if let Some(why) = &facts.dev_fuse_blocked {
            return Err(EnvError::Unsupported(format!(
                "--pool and --cache mount inside the environment with FUSE, but {why}"
            )));
        }
        crate::pools::tools(
            &req.pools,
            facts.squashfuse.as_deref(),
            req.tree_server.is_some(),
            req.path_var.as_deref(),
        )
        .map_err(EnvError::Unsupported)?
    };
    if let Some(s) = synced {
        p.why = format!(
            "{}; the layer is the job's copy on this node ({}) under a fresh upper ({}) that ends with the environment",
            p.why,
            s.state.display(),
            s.scratch.display()
        );
    }
    Ok((facts, p, fuse2fs))
}

/// The layer the environment writes into: the job's copy on this node (`synced`: the
/// environment's own directories under its scratch) or the store's layer by name.
pub(super) fn the_layer(
    req: &RunRequest,
    synced: Option<&Synced>,
    store: &LayerStore,
) -> Result<Option<Layer>, EnvError> {
    Ok(match (req.layer.as_deref(), synced) {
        // the job's copy: the environment's own directories on this node
        (Some(n), Some(s)) => Some(Layer {
            name: n.to_string(),
            dir: s.scratch.clone(),
            upper: s.scratch.join(crate::layer::UPPER),
            work: s.scratch.join(crate::layer::WORK),
            merged: s.scratch.join(crate::layer::MERGED),
        }),
        (n, _) => n.map(|n| store.get(n)).transpose()?,
    })
}

/// The key of the environment to share: the layer's, else the job step's; extended by the
/// shadows, bases and pools, since an environment shows them to all who join it (join only one
/// with the same). `None`: not shared.
pub(super) fn environment_key(
    req: &RunRequest,
    layer: Option<&Layer>,
    base: bool,
) -> Option<String> {
    layer
        .map(|l| rendezvous::layer_key(&l.dir))
        .or_else(|| req.step_key.clone())
        .map(|k| match req.shadows.is_empty() {
            true => k,
            false => format!("{k}-{}", rendezvous::shadow_key(&req.shadows)),
        })
        .map(|k| match base {
            false => k,
            true => format!("{k}-{}", rendezvous::base_key(&req.bases)),
        })
        .map(|k| match req.pools.is_empty() {
            true => k,
            false => format!("{k}-{}", rendezvous::pools_key(&req.pools)),
        })
}

/// What [`meet`] found.
pub(super) enum Meeting {
    /// The environment runs already: its connection and what it handed over.
    Joined(std::os::unix::net::UnixStream, Vec<std::os::fd::OwnedFd>),
    /// None runs: this start creates it, holding the lock, and describes it at the rendezvous.
    Create(std::os::fd::OwnedFd, rendezvous::Rendezvous),
    /// Not shared (no key or no state directory).
    Alone,
}

/// Find the environment under `key` in the state directory's `envs/`, or the right to create it.
/// An environment that ends while we connect hands nothing over: look again (up to 100 times).
pub(super) fn meet(
    req: &RunRequest,
    key: Option<&str>,
    layer: Option<&Layer>,
    p: &mut plan::Plan,
) -> Result<Meeting, EnvError> {
    let (Some(key), Some(state)) = (key, &req.state_dir) else {
        return Ok(Meeting::Alone);
    };
    let dir = state.join("envs");
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)
        .map_err(|e| EnvError::io("cannot create", &dir, e))?;
    let rv = rendezvous::Rendezvous::new(&dir, key);
    let mut tries = 0;
    loop {
        match rendezvous::find(&rv, Duration::from_secs(10))? {
            rendezvous::Found::Running(conn) => match rendezvous::receive(&conn) {
                Ok(fds) => {
                    p.why = format!(
                        "joining the environment already running for this {} ({})",
                        if layer.is_some() { "layer" } else { "job step" },
                        rv.socket.display()
                    );
                    return Ok(Meeting::Joined(conn, fds));
                }
                Err(e) if tries >= 100 => return Err(e),
                Err(_) => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
            },
            rendezvous::Found::Create(fd) => return Ok(Meeting::Create(fd, rv)),
        }
    }
}

/// The job's copy for a new environment: its state held for the environment's life, its upper
/// made fresh (a dead environment's leftovers under this key are ours: its rendezvous lock was
/// free). The hold.
pub(super) fn fresh_copy(s: &Synced, l: &Layer) -> Result<std::fs::File, EnvError> {
    let held = s.copies.hold(&s.state)?;
    crate::layer::remove_tree(&s.scratch)
        .map_err(|e| EnvError::io("cannot remove", &s.scratch, e))?;
    for d in [&l.dir, &l.upper, &l.work, &l.merged] {
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(d)
            .map_err(|e| EnvError::io("cannot create", d, e))?;
    }
    Ok(held)
}

/// Let pid 1 inherit the layer's directories and the environment's locks (clear close-on-exec);
/// the locks' descriptors, for pid 1 to keep open.
pub(super) fn inherited<'a>(
    layer_fds: Option<&'a crate::layer::LayerFds>,
    locks: impl Iterator<Item = std::os::fd::BorrowedFd<'a>>,
) -> Result<Vec<i32>, EnvError> {
    for fd in layer_fds.iter().flat_map(|f| {
        [
            f.dir.as_fd(),
            f.upper.as_fd(),
            f.work.as_fd(),
            f.merged.as_fd(),
        ]
    }) {
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).map_err(|e| EnvError::Start {
            what: "passing the layer's directories on".into(),
            source: e.into(),
        })?;
    }
    let mut keep_fds = Vec::new();
    for fd in locks {
        rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()).map_err(|e| EnvError::Start {
            what: "passing the environment's locks on".into(),
            source: e.into(),
        })?;
        keep_fds.push(fd.as_raw_fd());
    }
    Ok(keep_fds)
}

/// The host's mounts (top-level ones, the host directories and the user's home) that the new
/// root `r` gets bound in.
pub(super) fn host_binds(req: &RunRequest, r: &std::path::Path) -> Result<Vec<PathBuf>, EnvError> {
    let mi = swpool_sys::proc::read_mountinfo()
        .map_err(|e| EnvError::io("cannot read", "/proc/self/mountinfo", e))?;
    let points: Vec<PathBuf> = mi.into_iter().map(|m| m.mount_point).collect();
    let mut keep: Vec<PathBuf> = plan::HOST_DIRS.iter().map(PathBuf::from).collect();
    keep.extend(req.home.clone());
    keep.retain(|d| d.is_dir());
    Ok(plan::binds(&points, &keep, r))
}

/// What the environment wrote on this node ends with it (or is kept where `--keep-upper` asked).
pub(super) fn end_copy(req: &RunRequest, s: &Synced) {
    if let Some(dest) = &s.keep_upper {
        if let Err(e) = keep_upper(
            &s.scratch.join(crate::layer::UPPER),
            dest,
            req.path_var.as_deref(),
        ) {
            eprintln!("sw-pool: environment: {e}; what it wrote is lost");
        }
    }
    if let Err(e) = crate::layer::remove_tree(&s.scratch) {
        tracing::warn!("cannot remove {}: {e}", s.scratch.display());
    }
}

/// The layer's directories, opened and checked (pid 1 mounts these, never the paths: a layer
/// swapped after the check is not the one used), and the store's lock on a layer of the store (the
/// job's copy has its own hold).
pub(super) fn open_layer(
    store: &LayerStore,
    layer: Option<&Layer>,
    synced: bool,
) -> Result<
    (
        Option<crate::layer::LayerFds>,
        Option<crate::layer::LayerLock>,
    ),
    EnvError,
> {
    let Some(l) = layer else {
        return Ok((None, None));
    };
    if synced {
        return Ok((Some(store.open_dir(l)?), None));
    }
    let fds = store.open(l)?;
    let lock = store.lock_at(l, &fds)?;
    Ok((Some(fds), Some(lock)))
}

/// What a shared environment says of itself at its rendezvous (`sw-pool list`).
pub(super) fn describe(
    key: Option<&str>,
    spec: &crate::init::Spec,
    pid: i32,
    method: plan::Method,
) -> rendezvous::Info {
    rendezvous::Info {
        key: key.unwrap_or_default().to_string(),
        layer: spec.name.clone(),
        layer_dir: spec.layer.as_ref().map(|l| l.dir.clone()),
        method: method.as_str().to_string(),
        pid,
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    }
}
