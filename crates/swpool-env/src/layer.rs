//! Layers: a user's writable overlay layers, one directory each under a per-user root
//! (`--layer-dir`, config `layer_dir`; default `~/.local/share/sw-pool/layers`).
//!
//! ```text
//! <root>/<name>/upper    what the environment wrote (overlay upper: files, whiteouts, opaque dirs)
//! <root>/<name>/work     the overlay's work directory (same file system as upper)
//! <root>/<name>/merged   the mount point of the merged tree while an environment runs (empty)
//! <root>/<name>/lock     held (flock) by the environment using the layer: one at a time
//! ```
//!
//! A layer is created under a temporary name and renamed when complete, so a crash never leaves a
//! half-made layer under its name. Every layer (and the root) must be a real directory owned by the
//! caller and writable by no one else ([`swpool_sys::userdir::not_private`]); a symlink planted in
//! its place is refused, not followed.

use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use swpool_sys::lock::{self, Share};

use crate::EnvError;

/// The subdirectories of a layer.
pub const UPPER: &str = "upper";
pub const WORK: &str = "work";
pub const MERGED: &str = "merged";
const LOCK: &str = "lock";

/// The store of one user's layers.
#[derive(Debug, Clone)]
pub struct LayerStore {
    root: PathBuf,
    uid: u32,
}

/// One layer's directories.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layer {
    pub name: String,
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub merged: PathBuf,
}

/// What `layer list` / `layer du` show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSummary {
    pub name: String,
    pub dir: PathBuf,
    /// Bytes of regular files in the upper (apparent size).
    pub bytes: u64,
    /// Entries in the upper (files, directories, links, whiteouts).
    pub entries: u64,
    /// Whiteouts (files deleted from a lower).
    pub whiteouts: u64,
    /// The pid of the environment using it, if one runs.
    pub in_use: Option<i32>,
}

/// The held lock of a layer in use (released when dropped or when every process holding the
/// descriptor has exited).
#[derive(Debug)]
pub struct LayerLock {
    fd: OwnedFd,
}

impl LayerLock {
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }
}

/// A layer's directories, opened and checked ([`LayerStore::open`]).
#[derive(Debug)]
pub struct LayerFds {
    pub dir: OwnedFd,
    pub upper: OwnedFd,
    pub work: OwnedFd,
    pub merged: OwnedFd,
}

/// An open of a layer's directory that failed: a symlink or not a directory is not the caller's
/// layer; anything else is `what`.
fn not_yours_or(e: rustix::io::Errno, p: &Path, uid: u32, what: &'static str) -> EnvError {
    let e = io::Error::from(e);
    if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
        EnvError::NotYours {
            path: p.into(),
            why: "is a symbolic link or not a directory".into(),
            uid,
        }
    } else {
        EnvError::io(what, p, e)
    }
}

/// Is `name` a valid layer name?
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn check_name(name: &str) -> Result<(), EnvError> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(EnvError::BadLayerName { name: name.into() })
    }
}

impl LayerStore {
    /// The store at `root` for `uid`. Nothing is created until a layer is.
    pub fn new(root: PathBuf, uid: u32) -> LayerStore {
        LayerStore { root, uid }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The default root: `$XDG_DATA_HOME/sw-pool/layers`, else `$HOME/.local/share/sw-pool/layers`.
    pub fn default_root(
        xdg_data_home: Option<&std::ffi::OsStr>,
        home: Option<&std::ffi::OsStr>,
    ) -> Option<PathBuf> {
        if let Some(x) = xdg_data_home.filter(|x| Path::new(x).is_absolute()) {
            return Some(Path::new(x).join("sw-pool/layers"));
        }
        let h = home.filter(|h| Path::new(h).is_absolute())?;
        Some(Path::new(h).join(".local/share/sw-pool/layers"))
    }

    /// Check that `p` is the caller's own private directory, opened without following a symlink.
    fn check_private(&self, p: &Path) -> Result<OwnedFd, EnvError> {
        let fd = rustix::fs::open(
            p,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| not_yours_or(e, p, self.uid, "cannot open"))?;
        self.check_fd(fd, p)
    }

    fn check_fd(&self, fd: OwnedFd, p: &Path) -> Result<OwnedFd, EnvError> {
        let st = rustix::fs::fstat(&fd).map_err(|e| EnvError::io("cannot stat", p, e.into()))?;
        let why = if st.st_uid != self.uid {
            Some(format!("belongs to uid {}", st.st_uid))
        } else if st.st_mode & 0o022 != 0 {
            Some(format!(
                "is writable by others (mode {:o})",
                st.st_mode & 0o7777
            ))
        } else {
            None
        };
        match why {
            Some(why) => Err(EnvError::NotYours {
                path: p.into(),
                why,
                uid: self.uid,
            }),
            None => Ok(fd),
        }
    }

    fn ensure_root(&self) -> Result<(), EnvError> {
        if let Some(parent) = self.root.parent() {
            fs::create_dir_all(parent).map_err(|e| {
                EnvError::io("cannot create the layer directory's parent", parent, e)
            })?;
        }
        match fs::DirBuilder::new().mode(0o700).create(&self.root) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(EnvError::io(
                    "cannot create the layer directory",
                    &self.root,
                    e,
                ))
            }
        }
        self.check_private(&self.root).map(drop)
    }

    /// The directories a layer named `name` has (or would have), unchecked.
    pub fn paths(&self, name: &str) -> Layer {
        let dir = self.root.join(name);
        Layer {
            name: name.into(),
            upper: dir.join(UPPER),
            work: dir.join(WORK),
            merged: dir.join(MERGED),
            dir,
        }
    }

    /// Create a new, empty layer.
    pub fn create(&self, name: &str) -> Result<Layer, EnvError> {
        check_name(name)?;
        self.ensure_root()?;
        let l = self.paths(name);
        if fs::symlink_metadata(&l.dir).is_ok() {
            return Err(EnvError::LayerExists {
                name: name.into(),
                root: self.root.clone(),
            });
        }
        let tmp = self
            .root
            .join(format!(".{name}.creating-{}", std::process::id()));
        let build = || -> io::Result<()> {
            fs::DirBuilder::new().mode(0o700).create(&tmp)?;
            fs::DirBuilder::new().mode(0o755).create(tmp.join(UPPER))?;
            fs::DirBuilder::new().mode(0o700).create(tmp.join(WORK))?;
            fs::DirBuilder::new().mode(0o755).create(tmp.join(MERGED))?;
            fs::File::create(tmp.join(LOCK))?;
            // never replaces: a layer created at the same moment by another process wins
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &tmp,
                rustix::fs::CWD,
                &l.dir,
                rustix::fs::RenameFlags::NOREPLACE,
            )?;
            Ok(())
        };
        match build() {
            Ok(()) => Ok(l),
            Err(e) => {
                let _ = remove_tree(&tmp);
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Err(EnvError::LayerExists {
                        name: name.into(),
                        root: self.root.clone(),
                    })
                } else {
                    Err(EnvError::io("cannot create layer", &l.dir, e))
                }
            }
        }
    }

    /// An existing layer, checked to be the caller's own.
    pub fn get(&self, name: &str) -> Result<Layer, EnvError> {
        check_name(name)?;
        let l = self.paths(name);
        match fs::symlink_metadata(&l.dir) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(EnvError::NoSuchLayer {
                    name: name.into(),
                    root: self.root.clone(),
                })
            }
            // another user's store (0700): say so, not that the layer is missing
            Err(e) => return Err(EnvError::io("cannot use layer", &l.dir, e)),
        }
        self.check_private(&self.root)?;
        self.check_private(&l.dir)?;
        for sub in [&l.upper, &l.work, &l.merged] {
            let m = fs::symlink_metadata(sub)
                .map_err(|e| EnvError::io("layer is incomplete", sub.as_path(), e))?;
            if !m.is_dir() || m.uid() != self.uid {
                return Err(EnvError::NotYours {
                    path: sub.clone(),
                    why: "is not a directory of yours".into(),
                    uid: self.uid,
                });
            }
        }
        Ok(l)
    }

    /// Open and check a layer's directories for an environment: the store's root, the layer in
    /// it and its `upper`, `work` and `merged`, each opened relative to the one checked before,
    /// without following a symlink, and checked to be the caller's ([`LayerStore::get`]'s
    /// checks, on the descriptors). The environment uses these descriptors, never the paths: a
    /// layer swapped for another (or for a symlink) after this is not the one used.
    pub fn open(&self, l: &Layer) -> Result<LayerFds, EnvError> {
        let root = self.check_private(&self.root)?;
        let dir = self.check_private_at(&root, &l.name, &l.dir)?;
        self.open_parts(dir, l)
    }

    /// [`LayerStore::open`] for a layer outside the store (the job's copy's scratch directories,
    /// made by the caller): `l.dir` opened without following a symlink and checked.
    pub fn open_dir(&self, l: &Layer) -> Result<LayerFds, EnvError> {
        let dir = self.check_private(&l.dir)?;
        self.open_parts(dir, l)
    }

    fn open_parts(&self, dir: OwnedFd, l: &Layer) -> Result<LayerFds, EnvError> {
        let sub = |name: &str, p: &Path| -> Result<OwnedFd, EnvError> {
            let fd = rustix::fs::openat(
                &dir,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| not_yours_or(e, p, self.uid, "layer is incomplete"))?;
            let st =
                rustix::fs::fstat(&fd).map_err(|e| EnvError::io("cannot stat", p, e.into()))?;
            if st.st_uid != self.uid {
                return Err(EnvError::NotYours {
                    path: p.into(),
                    why: "is not a directory of yours".into(),
                    uid: self.uid,
                });
            }
            Ok(fd)
        };
        Ok(LayerFds {
            upper: sub(UPPER, &l.upper)?,
            work: sub(WORK, &l.work)?,
            merged: sub(MERGED, &l.merged)?,
            dir,
        })
    }

    /// `name` in the checked directory `at` (shown as `p`), checked as [`Self::check_private`].
    fn check_private_at(&self, at: &OwnedFd, name: &str, p: &Path) -> Result<OwnedFd, EnvError> {
        let fd = rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| not_yours_or(e, p, self.uid, "cannot open"))?;
        self.check_fd(fd, p)
    }

    /// Take the layer's lock (one environment per layer at a time on the machine).
    pub fn lock(&self, l: &Layer) -> Result<LayerLock, EnvError> {
        let p = l.dir.join(LOCK);
        let fd = rustix::fs::open(
            &p,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| EnvError::io("cannot open the layer's lock", &p, e.into()))?;
        self.locked(l, fd)
    }

    /// [`LayerStore::lock`] through the layer's opened directory.
    pub fn lock_at(&self, l: &Layer, fds: &LayerFds) -> Result<LayerLock, EnvError> {
        let p = l.dir.join(LOCK);
        let fd = rustix::fs::openat(
            &fds.dir,
            LOCK,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| EnvError::io("cannot open the layer's lock", &p, e.into()))?;
        self.locked(l, fd)
    }

    fn locked(&self, l: &Layer, fd: OwnedFd) -> Result<LayerLock, EnvError> {
        let p = l.dir.join(LOCK);
        if !matches!(lock::try_lock(&fd, Share::Exclusive), Ok(true)) {
            return Err(EnvError::LayerInUse {
                name: l.name.clone(),
                pid: holder(&p).unwrap_or(0),
            });
        }
        let mut f = fs::File::from(fd);
        let _ = f.set_len(0);
        let _ = write!(f, "{}", std::process::id());
        Ok(LayerLock { fd: f.into() })
    }

    /// The names of the store's layers, sorted (none when the store does not exist yet); nothing
    /// inside a layer is read (`layer list`, completion).
    pub fn names(&self) -> Result<Vec<String>, EnvError> {
        let rd = match fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(EnvError::io(
                    "cannot read the layer directory",
                    &self.root,
                    e,
                ))
            }
        };
        self.check_private(&self.root)?;
        let mut out: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| valid_name(n) && self.get(n).is_ok())
            .collect();
        out.sort();
        Ok(out)
    }

    /// The pid of the environment using layer `l`, if one runs (a look at its lock, nothing read).
    pub fn user_of(&self, l: &Layer) -> Option<i32> {
        in_use(&l.dir.join(LOCK))
    }

    /// Every layer of the store (none when the store does not exist yet), by name, with its sizes
    /// (every entry of every upper is visited: `layer du`).
    pub fn list(&self) -> Result<Vec<LayerSummary>, EnvError> {
        let rd = match fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(EnvError::io(
                    "cannot read the layer directory",
                    &self.root,
                    e,
                ))
            }
        };
        self.check_private(&self.root)?;
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !valid_name(&name) {
                continue;
            }
            if let Ok(l) = self.get(&name) {
                out.push(self.summary(&l)?);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Sizes and state of one layer.
    pub fn summary(&self, l: &Layer) -> Result<LayerSummary, EnvError> {
        let mut s = LayerSummary {
            name: l.name.clone(),
            dir: l.dir.clone(),
            bytes: 0,
            entries: 0,
            whiteouts: 0,
            in_use: in_use(&l.dir.join(LOCK)),
        };
        walk(&l.upper, &mut |name: &std::ffi::OsStr, m: &fs::Metadata| {
            s.entries += 1;
            if m.is_file() {
                s.bytes += m.len();
            }
            if is_whiteout(name, m) {
                s.whiteouts += 1;
            }
        })
        .map_err(|e| EnvError::io("cannot read the layer", &l.upper, e))?;
        Ok(s)
    }

    /// Remove a layer (refused while an environment uses it).
    pub fn remove(&self, name: &str) -> Result<(), EnvError> {
        let l = self.get(name)?;
        let _lock = self.lock(&l)?;
        // renamed away first: a concurrent `get` never sees a half-removed layer
        let gone = self
            .root
            .join(format!(".{name}.removing-{}", std::process::id()));
        fs::rename(&l.dir, &gone).map_err(|e| EnvError::io("cannot remove layer", &l.dir, e))?;
        remove_tree(&gone).map_err(|e| EnvError::io("cannot remove layer", &gone, e))
    }
}

/// An overlay whiteout (a file deleted from a lower): a character device 0/0, or (fuse-overlayfs
/// where it cannot make device nodes) a file `.wh.NAME`. The opaque-directory markers
/// `.wh..opq` / `.wh..wh..opq` are not whiteouts.
pub fn is_whiteout(name: &std::ffi::OsStr, m: &fs::Metadata) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let n = name.as_bytes();
    if n.starts_with(b".wh..") {
        return false;
    }
    n.starts_with(b".wh.") || is_whiteout_device(m)
}

/// The kernel's form of a whiteout: a character device 0/0.
pub fn is_whiteout_device(m: &fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_char_device() && m.rdev() == 0
}

/// The pid written in a lock file.
fn holder(p: &Path) -> Option<i32> {
    let mut s = String::new();
    fs::File::open(p).ok()?.read_to_string(&mut s).ok()?;
    s.trim().parse().ok()
}

/// The holder's pid when the lock is held (tested with a non-blocking shared lock).
fn in_use(p: &Path) -> Option<i32> {
    let f = fs::File::open(p).ok()?;
    match lock::try_lock(&f, Share::Shared) {
        Ok(true) => None,
        _ => Some(holder(p).unwrap_or(0)),
    }
}

/// Visit every entry below `dir` (not `dir` itself), without following symlinks.
fn walk(dir: &Path, f: &mut dyn FnMut(&std::ffi::OsStr, &fs::Metadata)) -> io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let m = e.metadata()?;
        f(&e.file_name(), &m);
        if m.is_dir() {
            walk(&e.path(), f)?;
        }
    }
    Ok(())
}

/// Remove a tree the caller owns, making directories writable as needed (an overlay work
/// directory holds a `work/` of mode 0).
pub fn remove_tree(p: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match fs::remove_dir_all(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            fn open_up(d: &Path) {
                if let Ok(m) = fs::symlink_metadata(d) {
                    if m.is_dir() {
                        let _ = fs::set_permissions(d, fs::Permissions::from_mode(0o700));
                        if let Ok(rd) = fs::read_dir(d) {
                            for e in rd.flatten() {
                                open_up(&e.path());
                            }
                        }
                    }
                }
            }
            open_up(p);
            fs::remove_dir_all(p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, LayerStore) {
        let t = tempfile::tempdir().unwrap();
        let uid = rustix::process::geteuid().as_raw();
        let s = LayerStore::new(t.path().join("layers"), uid);
        (t, s)
    }

    #[test]
    fn names() {
        for ok in ["dev", "a.b-c_1", "X"] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "a b", &"x".repeat(65), "ü"] {
            assert!(!valid_name(bad), "{bad}");
        }
    }

    #[test]
    fn create_get_list_remove() {
        let (_t, s) = store();
        assert!(s.list().unwrap().is_empty());
        let l = s.create("dev").unwrap();
        assert!(l.upper.is_dir() && l.work.is_dir() && l.merged.is_dir());
        assert!(matches!(s.create("dev"), Err(EnvError::LayerExists { .. })));
        fs::write(l.upper.join("f"), b"12345").unwrap();
        let v = s.list().unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!((v[0].bytes, v[0].entries, v[0].in_use), (5, 1, None));
        // only the layer's directories are left: no temporary names
        let names: Vec<_> = fs::read_dir(s.root())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("dev")]);
        s.remove("dev").unwrap();
        assert!(matches!(s.get("dev"), Err(EnvError::NoSuchLayer { .. })));
    }

    #[test]
    fn lock_is_exclusive_and_shown() {
        let (_t, s) = store();
        let l = s.create("a").unwrap();
        let lock = s.lock(&l).unwrap();
        match s.lock(&l) {
            Err(EnvError::LayerInUse { pid, .. }) => assert_eq!(pid, std::process::id() as i32),
            other => panic!("{other:?}"),
        }
        assert_eq!(s.list().unwrap()[0].in_use, Some(std::process::id() as i32));
        assert!(matches!(s.remove("a"), Err(EnvError::LayerInUse { .. })));
        drop(lock);
        s.remove("a").unwrap();
    }

    #[test]
    fn symlinked_layer_is_refused() {
        let (t, s) = store();
        s.create("real").unwrap();
        let elsewhere = t.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, s.root().join("planted")).unwrap();
        assert!(matches!(s.get("planted"), Err(EnvError::NotYours { .. })));
        // and the listing skips it rather than following it
        let names: Vec<_> = s.list().unwrap().into_iter().map(|l| l.name).collect();
        assert_eq!(names, vec!["real"]);
    }

    #[test]
    fn open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (_t, s) = store();
        let l = s.create("w").unwrap();
        fs::set_permissions(&l.dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(s.get("w"), Err(EnvError::NotYours { .. })));
    }

    #[test]
    fn remove_tree_handles_mode_zero_dirs() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("w/work");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("x"), b"").unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o0)).unwrap();
        remove_tree(&t.path().join("w")).unwrap();
        assert!(!t.path().join("w").exists());
    }
}
