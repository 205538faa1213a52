//! Root's walk of a path: component by component from `/`, by file descriptor, never following a
//! symlink that a user could have planted.
//!
//! `realpath(3)` (and `std::fs::canonicalize`) follow every symlink on the way. As root that lets
//! the owner of any directory on the path redirect root: with `ln -s /elsewhere B/p/sub`, root's
//! "B/p/sub/mnt" becomes "/elsewhere/mnt", and a `mkdir` or a mount lands there. [`walk_dir`]
//! instead opens each component with `openat(O_PATH|O_NOFOLLOW)` relative to the directory it
//! just opened, and
//!
//! * follows a symlink only when the directory holding it is root's and writable by no one else
//!   (a site's own `/var/run -> /run`, `/lib -> usr/lib`): its target is walked the same way;
//! * refuses a symlink in any directory a non-root user can write (owner not root, or group- or
//!   world-writable, `/tmp` included): [`WalkError::UserSymlink`];
//! * creates missing directories (when asked) with `mkdirat` on the descriptor of their parent.
//!
//! The result is the descriptor of the directory the walk reached and the path that names it
//! (no symlink left in it): whatever is done next is done on that descriptor, or on that path with
//! `RESOLVE_NO_SYMLINKS`, so a symlink swapped in afterwards makes it fail instead of redirecting it.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};

/// At most this many symlinks on one walk (the kernel's own limit).
const MAX_LINKS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    #[error("{}: a symlink in a user-writable directory; root does not follow those (give the real path)", crate::exec::show(link))]
    UserSymlink { link: PathBuf },
    #[error("{}: not a directory", crate::exec::show(path))]
    NotDir { path: PathBuf },
    #[error("{}: too many levels of symbolic links", crate::exec::show(path))]
    Loop { path: PathBuf },
    #[error("{}: {source}", crate::exec::show(path))]
    Io { path: PathBuf, source: io::Error },
}

impl WalkError {
    /// The component that does not exist (for callers that fall back to a recorded path).
    pub fn is_not_found(&self) -> bool {
        matches!(self, WalkError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// As an `io::Error` (for callers behind an `io::Result` seam): the walk's own I/O error as it was,
/// `ENOTDIR` for a non-directory, and a refused or looping symlink as an `Other` error carrying the
/// `WalkError` itself ([`is_refused_symlink`] tells it apart).
impl From<WalkError> for io::Error {
    fn from(e: WalkError) -> io::Error {
        match e {
            WalkError::Io { source, .. } => source,
            WalkError::NotDir { .. } => io::Error::from_raw_os_error(libc::ENOTDIR),
            other => io::Error::other(other),
        }
    }
}

/// Did a walk behind this `io::Error` meet a symlink it refuses (or a loop)?
pub fn is_refused_symlink(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<WalkError>())
}

/// Walk the parent of `p` ([`walk_dir`], nothing created) and return it with `p`'s last component:
/// where root looks at, opens or unmounts a mount point.
pub fn walk_parent(p: &Path) -> Result<(Walked, &OsStr), WalkError> {
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => Ok((walk_dir(parent, None)?, name)),
        _ => Err(WalkError::Io {
            path: p.to_path_buf(),
            source: io::Error::from(io::ErrorKind::InvalidInput),
        }),
    }
}

/// A directory reached by [`walk_dir`].
#[derive(Debug)]
pub struct Walked {
    /// `O_PATH|O_DIRECTORY` descriptor of the directory.
    pub fd: OwnedFd,
    /// Its path, with every symlink the walk followed resolved.
    pub path: PathBuf,
    /// Directories the walk created, outermost first.
    pub created: Vec<PathBuf>,
}

/// Can a user other than root change the entries of a directory with this owner and mode?
pub fn user_writable(uid: u32, mode: u32) -> bool {
    uid != 0 || mode & 0o022 != 0
}

fn open_path(dir: &impl AsFd, name: &OsStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn push_components(queue: &mut VecDeque<OsString>, p: &Path) {
    for c in p.components().rev() {
        match c {
            Component::Normal(n) => queue.push_front(n.to_os_string()),
            Component::ParentDir => queue.push_front(OsString::from("..")),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}

/// Walk the absolute `path` from `/` (see the module documentation). `create`: make missing
/// directories with this mode (`mkdir -p`), each with `mkdirat` on its parent's descriptor.
pub fn walk_dir(path: &Path, create: Option<u32>) -> Result<Walked, WalkError> {
    let path = crate::exec::absolute(path);
    let io_err = |p: &Path, e: rustix::io::Errno| WalkError::Io {
        path: p.to_path_buf(),
        source: io::Error::from(e),
    };
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err(Path::new("/"), e))?;
    let root_st = rustix::fs::fstat(&root).map_err(|e| io_err(Path::new("/"), e))?;
    // (descriptor, can a user change its entries) for `/` and each directory below it
    let mut stack: Vec<(OwnedFd, bool)> =
        vec![(root, user_writable(root_st.st_uid, root_st.st_mode as u32))];
    let mut names: Vec<OsString> = Vec::new();
    let mut queue = VecDeque::new();
    push_components(&mut queue, &path);
    let mut links = 0usize;
    let mut created = Vec::new();
    let here = |names: &[OsString], last: &OsStr| {
        let mut p = PathBuf::from("/");
        for n in names {
            p.push(n);
        }
        p.join(last)
    };
    while let Some(name) = queue.pop_front() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
                names.pop();
            }
            continue;
        }
        let at = here(&names, &name);
        let (dir, dir_user) = stack.last().expect("the root stays");
        let mut tries = 0;
        let fd = loop {
            match open_path(dir, &name) {
                Ok(fd) => break fd,
                Err(rustix::io::Errno::NOENT) if create.is_some() && tries < 8 => {
                    tries += 1;
                    let mode = Mode::from_raw_mode(create.unwrap_or(0o755));
                    match rustix::fs::mkdirat(dir, &name, mode) {
                        Ok(()) => created.push(at.clone()),
                        Err(rustix::io::Errno::EXIST) => {} // raced: open what is there now
                        Err(e) => return Err(io_err(&at, e)),
                    }
                }
                Err(e) => return Err(io_err(&at, e)),
            }
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(&at, e))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::Symlink => {
                if *dir_user {
                    return Err(WalkError::UserSymlink { link: at });
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(WalkError::Loop { path: at });
                }
                let target =
                    rustix::fs::readlinkat(dir, &name, Vec::new()).map_err(|e| io_err(&at, e))?;
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    stack.truncate(1);
                    names.clear();
                }
                push_components(&mut queue, &target);
            }
            FileType::Directory => {
                stack.push((fd, user_writable(st.st_uid, st.st_mode as u32)));
                names.push(name);
            }
            _ => return Err(WalkError::NotDir { path: at }),
        }
    }
    let mut p = PathBuf::from("/");
    for n in &names {
        p.push(n);
    }
    let (fd, _) = stack.pop().expect("the root stays");
    Ok(Walked {
        fd,
        path: p,
        created,
    })
}

/// `path` made absolute and normalized by its text alone (`.` and `..` removed, no symlink looked
/// at): how a record names a mount point when its directories are gone.
pub fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in crate::exec::absolute(path).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn resolves_root_only_symlinks_and_dotdot() {
        let d = tempfile::tempdir().unwrap();
        let b = d.path().join("b");
        std::fs::create_dir_all(b.join("real/x")).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        symlink("real", b.join("link")).unwrap();
        let w = walk_dir(&b.join("link/x/../x"), None);
        if is_root() {
            // b is root's, mode 0755: its symlink is followed
            let w = w.unwrap();
            assert_eq!(w.path, std::fs::canonicalize(b.join("real/x")).unwrap());
        }
        // make b writable by others: the same symlink is refused
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = walk_dir(&b.join("link/x"), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("a symlink in a user-writable directory"),
            "{e}"
        );
        assert!(lexical(&b.join("link/../real/./x")).ends_with("b/real/x"));
    }

    #[test]
    fn creates_with_mkdirat_and_refuses_non_directories() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/b/c");
        let w = walk_dir(&p, Some(0o755)).unwrap();
        assert!(p.is_dir());
        assert_eq!(w.created.len(), 3);
        assert!(walk_dir(&p, Some(0o755)).unwrap().created.is_empty());
        std::fs::write(d.path().join("f"), b"").unwrap();
        let e = walk_dir(&d.path().join("f/x"), Some(0o755)).unwrap_err();
        assert!(matches!(e, WalkError::NotDir { .. }), "{e}");
        assert!(walk_dir(&d.path().join("missing/x"), None)
            .unwrap_err()
            .is_not_found());
    }
}
