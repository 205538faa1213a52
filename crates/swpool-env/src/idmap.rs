//! The kernel-overlay path with the site's helper (`sw-pool-mount-helper idmap`): the launcher
//! asks the helper for read-only idmapped views of the site's trees for the environment's first
//! process (pid 1), and tells pid 1 the answer ([`Handshake`]) over the start pipe; pid 1 enters
//! the mount namespace the helper made for it (every mount in it locked, the views included: a
//! user cannot make them writable), mounts one kernel overlay per tree, view below, the layer
//! above, and puts each in place. Measured: kernel-facts items 2–4 (the kernel's overlay cannot
//! write over root-owned lowers without the views; with them it copies up at full speed).
//!
//! When the helper refuses or fails, or the views cannot serve the environment (`--root` needs
//! the whole tree: apt and dpkg write `/etc` and `/var`), pid 1 takes the rootless path and the
//! launcher says why (`-v`).

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::plan::Method;

/// The helper's answer to `idmap --pid P`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Views {
    /// Enter `/proc/<holder>/ns/mnt`.
    pub holder: i32,
    /// The view of `trees[i]` is at `<staging>/<i>`, with an empty `<staging>/m<i>` beside it.
    pub staging: PathBuf,
    pub trees: Vec<PathBuf>,
}

/// What the launcher tells pid 1 after mapping it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Handshake {
    Views(Views),
    /// Take the rootless path; why.
    Rootless(String),
}

/// Longest answer read from the helper or the pipe (a few paths).
const MAX: u64 = 64 * 1024;

/// The launcher's side: ask `helper` (through `sudo -n`) for views for pid `pid`.
pub fn ask(helper: &Path, pid: i32, root: bool, path_var: Option<&std::ffi::OsStr>) -> Handshake {
    let cmd = swpool_sys::exec::helper_sudo(helper)
        .arg("idmap")
        .arg("--pid")
        .arg(pid.to_string());
    let out = match cmd.run(path_var) {
        Ok(o) => o.stdout,
        Err(e) => {
            let why = e.helper_reason();
            return Handshake::Rootless(format!("the site's helper gave no idmapped views: {why}"));
        }
    };
    let v: Views = match serde_json::from_str(out.trim()) {
        Ok(v) => v,
        Err(e) => {
            return Handshake::Rootless(format!(
                "the site's helper gave an unreadable answer ({e}): {}",
                out.trim()
            ))
        }
    };
    if v.trees.is_empty() || v.trees.iter().any(|t| !t.is_absolute()) {
        return Handshake::Rootless(format!(
            "the site's helper named no usable trees: {:?}",
            v.trees
        ));
    }
    if root && !v.trees.iter().any(|t| t == Path::new("/")) {
        return Handshake::Rootless(format!(
            "--root installs into the whole tree (apt and dpkg write /etc and /var), but the \
             site's helper gives views of {} only",
            list(&v.trees)
        ));
    }
    Handshake::Views(v)
}

/// `a, b and c` of paths.
pub fn list(trees: &[PathBuf]) -> String {
    let v: Vec<String> = trees.iter().map(|t| t.display().to_string()).collect();
    match v.len() {
        0 => String::new(),
        1 => v[0].clone(),
        n => format!("{} and {}", v[..n - 1].join(", "), v[n - 1]),
    }
}

/// Why the kernel path applies, for `-v`.
pub fn why(v: &Views) -> String {
    if v.trees.iter().any(|t| t == Path::new("/")) {
        format!(
            "the site's helper gave idmapped views of {}: the kernel's overlay, at full speed",
            list(&v.trees)
        )
    } else {
        format!(
            "the site's helper gave idmapped views of {}: the kernel's overlay over them, at full \
             speed; the layer shows there only, and elsewhere the host's tree is as it is",
            list(&v.trees)
        )
    }
}

/// Pid 1: read the launcher's [`Handshake`] from `fd` (to its end).
pub(crate) fn receive(fd: i32) -> Result<Handshake, String> {
    // SAFETY: the descriptor the launcher passed for this, read once and closed here.
    let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut s = String::new();
    f.take(MAX)
        .read_to_string(&mut s)
        .map_err(|e| format!("reading the launcher's word: {e}"))?;
    serde_json::from_str(s.trim()).map_err(|e| format!("the launcher's word ({e}): {s:?}"))
}

/// Pid 1: enter the namespace the helper's holder made (`setns`: [`crate::kernel::Kernel::setns`]).
pub(crate) fn enter(
    v: &Views,
    setns: impl FnOnce(BorrowedFd<'_>) -> Result<(), rustix::io::Errno>,
) -> Result<(), String> {
    let p = format!("/proc/{}/ns/mnt", v.holder);
    let ns = rustix::fs::open(
        p.as_str(),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| {
        format!(
            "cannot open the helper's namespace {p}: {e} (holder: {}; this process: {})",
            proc_ids(&format!("/proc/{}/status", v.holder)),
            proc_ids("/proc/self/status")
        )
    })?;
    setns(ns.as_fd()).map_err(|e| format!("cannot enter the helper's namespace {p}: {e}"))?;
    // the views are there (idmapped, read-only), or this is not the namespace we asked for
    let mi = swpool_sys::proc::read_mountinfo()
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    for i in 0..v.trees.len() {
        let at = v.staging.join(i.to_string());
        if !mi
            .iter()
            .any(|m| m.mount_point == at && m.mount_options.split(',').any(|o| o == "idmapped"))
        {
            return Err(format!(
                "the helper's namespace has no idmapped view at {}",
                at.display()
            ));
        }
    }
    Ok(())
}

/// The state, ids and capabilities a `/proc/PID/status` shows, for an error message.
fn proc_ids(status: &str) -> String {
    match std::fs::read_to_string(status) {
        Ok(s) => s
            .lines()
            .filter(|l| {
                ["State:", "Uid:", "Gid:", "NSpid:", "CapEff:"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => format!("{status}: {e}"),
    }
}

/// A path usable inside overlay options.
fn opt_path(p: &Path) -> Result<String, String> {
    let s = p
        .to_str()
        .ok_or_else(|| format!("{}: not UTF-8", p.display()))?;
    if s.contains([',', ':', '\\']) {
        return Err(format!(
            "{s}: a layer path with ',', ':' or '\\' cannot be given to the kernel's overlay"
        ));
    }
    Ok(s.to_string())
}

fn overlay(lower: &[PathBuf], upper: &Path, work: &Path, at: &Path) -> Result<(), String> {
    let lower = lower
        .iter()
        .map(|p| opt_path(p))
        .collect::<Result<Vec<_>, _>>()?
        .join(":");
    let opts = format!(
        "lowerdir={lower},upperdir={},workdir={},userxattr",
        opt_path(upper)?,
        opt_path(work)?
    );
    rustix::mount::mount(
        "overlay",
        at,
        "overlay",
        rustix::mount::MountFlags::empty(),
        opts.as_str(),
    )
    .map_err(|e| format!("the kernel's overlay on {} ({opts}): {e}", at.display()))
}

fn mkdirs(p: &Path, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(p)
        .map_err(|e| format!("cannot create {}: {e}", p.display()))
}

/// Pid 1, in the helper's namespace: one kernel overlay per tree (the view below, the job's
/// copy of that tree above it when there is one, the layer's part of the tree as the upper),
/// each put in place. The layer is reached through the directories the launcher opened and
/// checked (`d`, as `/proc/self/fd/N`), never through its paths. The root overlay's descriptor
/// (on the layer's checked `merged`) when `/` is one of the trees, else `None` (the trees were
/// mounted over the host's in place).
pub(crate) fn mount_trees(
    v: &Views,
    d: &crate::overlay::Dirs,
    copy: Option<&Path>,
) -> Result<Option<OwnedFd>, String> {
    use crate::overlay::fd_path;
    // outer trees before the trees inside them
    let mut order: Vec<usize> = (0..v.trees.len()).collect();
    order.sort_by_key(|i| v.trees[*i].components().count());
    let root = v.trees.iter().position(|t| t == Path::new("/"));
    let rel = |i: usize| {
        v.trees[i]
            .strip_prefix("/")
            .unwrap_or(&v.trees[i])
            .to_path_buf()
    };
    // the trees' overlays first: their uppers are inside the root overlay's upper, which must not
    // be in use when theirs are mounted (the kernel warns of overlapping layers otherwise)
    for &i in order.iter().filter(|i| Some(**i) != root) {
        let upper = fd_path(d.upper).join(rel(i));
        mkdirs(&upper, 0o755)?;
        let work = fd_path(d.dir).join(format!("work.{i}"));
        mkdirs(&work, 0o700)?;
        let mut lower: Vec<PathBuf> = copy
            .map(|c| c.join(rel(i)))
            .filter(|c| c.is_dir())
            .into_iter()
            .collect();
        lower.push(v.staging.join(i.to_string()));
        overlay(&lower, &upper, &work, &v.staging.join(format!("m{i}")))?;
    }
    let base = match root {
        Some(r) => {
            let mut lower: Vec<PathBuf> = copy.map(Path::to_path_buf).into_iter().collect();
            lower.push(v.staging.join(r.to_string()));
            let lower = lower
                .iter()
                .map(|p| opt_path(p))
                .collect::<Result<Vec<_>, _>>()?
                .join(":");
            let m = crate::overlay::kernel_overlay(&lower, &fd_path(d.upper), &fd_path(d.work))?;
            crate::overlay::attach(&m, d.merged, "the kernel's overlay")?;
            Some(m)
        }
        None => None,
    };
    for &i in order.iter().filter(|i| Some(**i) != root) {
        let from = v.staging.join(format!("m{i}"));
        let moved = match &base {
            // inside the root overlay, through its descriptor
            Some(b) => rustix::mount::move_mount(
                rustix::fs::CWD,
                from.as_path(),
                std::os::fd::AsFd::as_fd(b),
                rel(i).as_path(),
                rustix::mount::MoveMountFlags::empty(),
            ),
            None => rustix::mount::mount_move(from.as_path(), v.trees[i].as_path()),
        };
        moved.map_err(|e| {
            format!(
                "cannot put the overlay of {} in place: {e}",
                v.trees[i].display()
            )
        })?;
    }
    Ok(base)
}

/// The method pid 1 ends up with, from the handshake.
pub fn method(h: &Handshake) -> Method {
    match h {
        Handshake::Views(_) => Method::KernelOverlay,
        Handshake::Rootless(_) => Method::FuseOverlay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_well() {
        let t = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(list(&t(&["/usr"])), "/usr");
        assert_eq!(list(&t(&["/usr", "/opt", "/srv"])), "/usr, /opt and /srv");
    }

    #[test]
    fn the_handshake_round_trips() {
        let h = Handshake::Views(Views {
            holder: 7,
            staging: "/run/sw-pool-env".into(),
            trees: vec!["/usr".into()],
        });
        let s = serde_json::to_string(&h).unwrap();
        assert_eq!(serde_json::from_str::<Handshake>(&s).unwrap(), h);
    }

    #[test]
    fn option_breaking_paths_are_refused() {
        assert!(opt_path(Path::new("/a,b")).is_err());
        assert!(opt_path(Path::new("/a:b")).is_err());
        assert_eq!(opt_path(Path::new("/a/b")).unwrap(), "/a/b");
    }
}
