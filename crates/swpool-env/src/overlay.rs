//! The layer's overlay, made of the directories the launcher opened and checked, never of their
//! paths: pid 1 opens them again in its own mount namespace and refuses any that is not the same
//! directory ([`reopen`]); the kernel's overlays take them as `/proc/self/fd/N` and are attached
//! onto the checked `merged` by descriptor ([`kernel_overlay`], [`attach`]); fuse-overlayfs, which
//! takes paths, gets them bound in a tmpfs of pid 1's own over `/run` ([`mount`]). Every wait here
//! is bounded.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::mount::MountFlags;
use swpool_sys::exec::{Tool, ToolCommand};

use crate::layer::Layer;
use crate::plan::Method;

/// The layer's directories as the launcher opened and checked them (inherited descriptors).
pub(crate) struct Dirs {
    pub dir: i32,
    pub upper: i32,
    pub work: i32,
    pub merged: i32,
}

/// The layer's directories opened again in pid 1's own mount namespace (a mount can be made
/// only of, and onto, mounts of one's own namespace; the launcher's descriptors are of the
/// host's), each checked to be the very directory the launcher opened and checked (`checked`:
/// the same device and inode), else refused: the layer was renamed or replaced during the start.
pub(crate) fn reopen(
    l: &Layer,
    checked: [i32; 4],
    held: &mut Vec<OwnedFd>,
) -> Result<Dirs, String> {
    use rustix::fs::{Mode, OFlags};
    let fl = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let changed = |p: &Path| {
        format!(
            "the layer {}'s directory {} changed during the start (renamed, replaced or a \
             symlink now): nothing was run; start again once it stays put",
            l.name,
            p.display()
        )
    };
    let dir = rustix::fs::open(&l.dir, fl, Mode::empty()).map_err(|_| changed(&l.dir))?;
    let mut out = [0i32; 4];
    for (i, (name, p)) in [
        ("", &l.dir),
        (crate::layer::UPPER, &l.upper),
        (crate::layer::WORK, &l.work),
        (crate::layer::MERGED, &l.merged),
    ]
    .into_iter()
    .enumerate()
    {
        let fd = match i {
            0 => dir.try_clone().map_err(|e| format!("dup: {e}"))?,
            _ => rustix::fs::openat(&dir, name, fl, Mode::empty()).map_err(|_| changed(p))?,
        };
        // SAFETY: the launcher's descriptor, held by pid 1 for its whole life
        let theirs = unsafe { std::os::fd::BorrowedFd::borrow_raw(checked[i]) };
        let (a, b) = (rustix::fs::fstat(&fd), rustix::fs::fstat(theirs));
        match (a, b) {
            (Ok(a), Ok(b)) if a.st_dev == b.st_dev && a.st_ino == b.st_ino => {}
            _ => return Err(changed(p)),
        }
        out[i] = fd.as_raw_fd();
        held.push(fd);
    }
    Ok(Dirs {
        dir: out[0],
        upper: out[1],
        work: out[2],
        merged: out[3],
    })
}

/// `/proc/self/fd/N`: the kernel resolves it to the directory descriptor `N` was opened on,
/// whatever its path leads to now.
pub(crate) fn fd_path(fd: i32) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// A kernel overlay made with the new mount API (detached; its descriptor) from `lowerdir`,
/// `upper` and `work` (paths; the layer's as [`fd_path`]s).
pub(crate) fn kernel_overlay(lowerdir: &str, upper: &Path, work: &Path) -> Result<OwnedFd, String> {
    use rustix::mount::{fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen};
    let what = || {
        format!(
            "lowerdir={lowerdir},upperdir={},workdir={},userxattr",
            upper.display(),
            work.display()
        )
    };
    let fs = fsopen("overlay", rustix::mount::FsOpenFlags::FSOPEN_CLOEXEC)
        .map_err(|e| format!("the kernel's overlay: fsopen: {e}"))?;
    fsconfig_set_string(fs.as_fd(), "lowerdir", lowerdir)
        .and_then(|_| fsconfig_set_string(fs.as_fd(), "upperdir", upper))
        .and_then(|_| fsconfig_set_string(fs.as_fd(), "workdir", work))
        .and_then(|_| fsconfig_set_flag(fs.as_fd(), "userxattr"))
        .and_then(|_| fsconfig_create(fs.as_fd()))
        .map_err(|e| format!("the kernel's overlay ({}): {e}", what()))?;
    fsmount(
        fs.as_fd(),
        rustix::mount::FsMountFlags::FSMOUNT_CLOEXEC,
        rustix::mount::MountAttrFlags::empty(),
    )
    .map_err(|e| format!("the kernel's overlay ({}): fsmount: {e}", what()))
}

/// Put the mount whose root `m` is onto the directory descriptor `at` (the layer's checked
/// `merged`): by descriptor at both ends, no path.
pub(crate) fn attach(m: &OwnedFd, at: i32, what: &str) -> Result<(), String> {
    // SAFETY: `at` is a descriptor pid 1 holds for its whole life (the launcher's).
    let at = unsafe { std::os::fd::BorrowedFd::borrow_raw(at) };
    rustix::mount::move_mount(
        m.as_fd(),
        "",
        at,
        "",
        rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH
            | rustix::mount::MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| format!("cannot put {what} on the layer's merged directory: {e}"))
}

/// How long fuse-overlayfs may take to mount (it runs in the foreground until it has).
const FUSE_START: std::time::Duration = std::time::Duration::from_secs(20);

/// Where fuse-overlayfs is given the layer's directories while it starts: a tmpfs over `/run` in
/// pid 1's own mount namespace (a path of root's on the host: the user can neither rename nor
/// replace it), holding binds of the checked descriptors; detached once the overlay is mounted
/// (fuse-overlayfs keeps its layers open).
const STAGE: &str = "/run";

/// The layer's overlay, put on its checked `merged` directory; the descriptor of its root.
pub(crate) fn mount(
    copy: Option<&Path>,
    bases: &[crate::Base],
    fuse_overlayfs: Option<&Path>,
    l: &Layer,
    d: &Dirs,
    method: Method,
) -> Result<OwnedFd, String> {
    match method {
        Method::BaseOverlay => {
            let lower = crate::base::lowers(copy, bases)?;
            let m = kernel_overlay(&lower, &fd_path(d.upper), &fd_path(d.work)).map_err(|e| {
                format!(
                    "cannot mount the kernel's overlay of layer {} over the base pool: {e}",
                    l.name
                )
            })?;
            attach(&m, d.merged, "the kernel's overlay")?;
            Ok(m)
        }
        Method::FuseOverlay => {
            let prog = fuse_overlayfs
                .map(Path::to_path_buf)
                .ok_or("fuse-overlayfs was not found")?;
            // the job's copy of the layer above the host's tree or the base pools
            // (fuse-overlayfs reads its whiteouts in the `.wh.NAME` form); each but `/` opened
            // now, before the staging tmpfs covers `/run`
            let lowers = crate::base::lowers(copy, bases)?;
            let mut opened = Vec::new();
            for p in lowers.split(':') {
                opened.push(match p {
                    "/" => None,
                    _ => Some(
                        rustix::fs::open(
                            p,
                            rustix::fs::OFlags::PATH
                                | rustix::fs::OFlags::DIRECTORY
                                | rustix::fs::OFlags::CLOEXEC,
                            rustix::fs::Mode::empty(),
                        )
                        .map_err(|e| format!("cannot open the lower directory {p}: {e}"))?,
                    ),
                });
            }
            let stage = |e: rustix::io::Errno, what: &str| {
                format!("the layer's staging area in {STAGE} (pid 1's own): {what}: {e}")
            };
            rustix::mount::mount(
                "sw-pool-stage",
                STAGE,
                "tmpfs",
                MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                "mode=0700,size=64k,nr_inodes=64",
            )
            .map_err(|e| stage(e, "tmpfs"))?;
            let at = |n: &str| Path::new(STAGE).join(n);
            let bind = |from: PathBuf, name: &str| -> Result<PathBuf, String> {
                let to = at(name);
                std::fs::create_dir(&to)
                    .map_err(|e| format!("cannot create {}: {e}", to.display()))?;
                rustix::mount::mount_recursive_bind(from.as_path(), to.as_path())
                    .map_err(|e| stage(e, name))?;
                Ok(to)
            };
            // the layer's checked directory, bound whole: fuse-overlayfs renames from its work
            // directory into its upper, which must be on one mount
            let layer = bind(fd_path(d.dir), "layer")?;
            let (upper, work) = (
                layer.join(crate::layer::UPPER),
                layer.join(crate::layer::WORK),
            );
            let same = |p: &Path, fd: i32| {
                // SAFETY: pid 1's own descriptor, held for its life
                let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                match (rustix::fs::lstat(p), rustix::fs::fstat(b)) {
                    (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
                    _ => false,
                }
            };
            // its upper and work as checked, before and after fuse-overlayfs opened them
            let check = || -> Result<(), String> {
                match same(&upper, d.upper) && same(&work, d.work) {
                    true => Ok(()),
                    false => Err(format!(
                        "the layer {}'s upper or work directory was renamed or replaced during \
                         the start: nothing was run; start again once it stays put",
                        l.name
                    )),
                }
            };
            check()?;
            let mut lower = Vec::new();
            for (i, fd) in opened.iter().enumerate() {
                lower.push(match fd {
                    None => "/".to_string(),
                    Some(fd) => bind(fd_path(fd.as_raw_fd()), &format!("lower{i}"))?
                        .display()
                        .to_string(),
                });
            }
            drop(opened);
            let merged = at("merged");
            std::fs::create_dir(&merged)
                .map_err(|e| format!("cannot create {}: {e}", merged.display()))?;
            let opts = format!(
                "lowerdir={},upperdir={},workdir={},squash_to_root",
                lower.join(":"),
                upper.display(),
                work.display()
            );
            start_fuse_overlayfs(&prog, &opts, &merged)
                .map_err(|e| format!("cannot mount the layer {}: {e}", l.name))?;
            check()?;
            let r = rustix::fs::open(
                &merged,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| stage(e, "the mounted overlay"))?;
            // FUSE_SUPER_MAGIC (the field's type differs between architectures)
            #[allow(clippy::unnecessary_cast)]
            let fuse = |t: rustix::fs::StatFs| t.f_type as i64 == 0x6573_5546;
            match rustix::fs::fstatfs(&r) {
                Ok(st) if fuse(st) => {}
                _ => {
                    return Err(format!(
                        "fuse-overlayfs ({}) ended without mounting the layer {}",
                        prog.display(),
                        l.name
                    ))
                }
            }
            attach(&r, d.merged, "fuse-overlayfs' mount")?;
            rustix::mount::unmount(STAGE, rustix::mount::UnmountFlags::DETACH)
                .map_err(|e| stage(e, "detaching it"))?;
            Ok(r)
        }
        // mounted by `crate::idmap::mount_trees` in the helper's namespace
        Method::KernelOverlay | Method::Plain | Method::Base => Err(format!(
            "no overlay to mount for layer {} ({method:?})",
            l.name
        )),
    }
}

/// Run fuse-overlayfs in the foreground of its start (it forks its daemon once mounted) for at
/// most [`FUSE_START`]; killed after that. Its error output when it fails.
fn start_fuse_overlayfs(prog: &Path, opts: &str, at: &Path) -> Result<(), String> {
    use std::io::Read;
    let mut err = tempfile_stderr()?;
    let mut c = ToolCommand::new(Tool::FuseOverlayfs)
        .program(prog)
        .arg("-o")
        .arg(opts)
        // fuse-overlayfs does not accept `--`; the mount point is absolute (no option)
        .arg(at)
        .command(None)
        .map_err(|e| format!("cannot run {}: {e}", prog.display()))?
        .stdout(std::process::Stdio::null())
        .stderr(err.try_clone().map_err(|e| format!("dup: {e}"))?)
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", prog.display()))?;
    let t0 = std::time::Instant::now();
    let st = loop {
        match c.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if t0.elapsed() < FUSE_START => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            Ok(None) | Err(_) => {
                let _ = swpool_sys::process::signal(c.id(), swpool_sys::process::Signal::Kill);
                let _ = c.wait();
                return Err(format!(
                    "{} did not mount within {} s and was killed (a stopped or stuck FUSE \
                     daemon); try again, or see whether fuse-overlayfs works here",
                    prog.display(),
                    FUSE_START.as_secs()
                ));
            }
        }
    };
    if st.success() {
        return Ok(());
    }
    use std::io::Seek;
    let mut msg = String::new();
    let _ = err.seek(std::io::SeekFrom::Start(0));
    let _ = (&mut err).take(4096).read_to_string(&mut msg);
    Err(format!("{} failed ({st}): {}", prog.display(), msg.trim()))
}

/// An unnamed file for a tool's error output (no pipe a daemon could hold open).
fn tempfile_stderr() -> Result<std::fs::File, String> {
    let fd = rustix::fs::memfd_create("fuse-overlayfs-stderr", rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| format!("memfd_create: {e}"))?;
    Ok(std::fs::File::from(fd))
}
