//! Outputs written under a temporary name and renamed into place only when complete: the one
//! temp-and-commit of sw-pool, for files ([`TempOutput`], [`write_file`]) and directory trees
//! ([`TempDir`]).
//!
//! A temporary lives beside its destination (same file system: the rename is atomic) as
//! `.<name>.swpool-tmp-<pid>`, is created exclusively, and is registered in a process-wide list,
//! so that the binary's signal handler can remove it on SIGINT/SIGTERM
//! ([`remove_all_registered`]): an interrupted build or copy leaves nothing. Dropped without a
//! commit, it is removed. A commit flushes the data, renames, and flushes the directory.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

static REGISTERED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static REGISTERED_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Private temporaries of this process so far (each gets its own name).
static PRIVATE_SEQ: AtomicU64 = AtomicU64::new(0);

/// `.<name>.swpool-<what>-<pid>[-<seq>]` beside `dest`.
fn temp_name(dest: &Path, what: &str, seq: Option<u64>) -> io::Result<PathBuf> {
    let name = dest
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut n = format!(
        ".{}.swpool-{what}-{}",
        name.to_string_lossy(),
        std::process::id()
    );
    if let Some(k) = seq {
        n.push_str(&format!("-{k}"));
    }
    Ok(parent_dir(dest).join(n))
}

/// Remove every registered temporary file and directory (called from the signal handler thread).
pub fn remove_all_registered() {
    let list = REGISTERED
        .lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default();
    for p in list {
        let _ = std::fs::remove_file(&p);
    }
    let dirs = REGISTERED_DIRS
        .lock()
        .map(|mut l| std::mem::take(&mut *l))
        .unwrap_or_default();
    for d in dirs {
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// Register a file of this process (a socket it serves on, ...) to be removed by
/// [`remove_all_registered`] if the process is interrupted.
pub fn register_file(p: &Path) {
    REGISTERED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(p.to_path_buf());
}

/// Forget a file [`register_file`] named (it was removed).
pub fn unregister_file(p: &Path) {
    if let Ok(mut l) = REGISTERED.lock() {
        l.retain(|x| x != p);
    }
}

/// Register a temporary directory tree to be removed by [`remove_all_registered`].
pub fn register_dir(p: &Path) {
    REGISTERED_DIRS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(p.to_path_buf());
}

/// Forget a temporary directory (it was renamed into place or removed).
pub fn unregister_dir(p: &Path) {
    if let Ok(mut l) = REGISTERED_DIRS.lock() {
        l.retain(|x| x != p);
    }
}

/// A file being written at a temporary name beside its final path.
#[derive(Debug)]
pub struct TempOutput {
    tmp: PathBuf,
    dest: PathBuf,
    committed: bool,
}

impl TempOutput {
    /// Create `.<name>.swpool-tmp-<pid>` in `dest`'s directory (exclusively).
    pub fn create(dest: &Path) -> io::Result<(TempOutput, File)> {
        let tmp = temp_name(dest, "tmp", None)?;
        let _ = std::fs::remove_file(&tmp); // our own pid: a leftover of a crashed earlier run with the same pid
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        Ok(Self::registered(tmp, dest, f))
    }

    /// A private temporary (mode 0600, never through a symlink, its own name in this process even
    /// when several threads write beside one destination): `.<name>.swpool-tmp-<pid>-<seq>`.
    pub fn create_private(dest: &Path) -> io::Result<(TempOutput, File)> {
        let seq = PRIVATE_SEQ.fetch_add(1, Ordering::Relaxed);
        let tmp = temp_name(dest, "tmp", Some(seq))?;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        Ok(Self::registered(tmp, dest, f))
    }

    fn registered(tmp: PathBuf, dest: &Path, f: File) -> (TempOutput, File) {
        REGISTERED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tmp.clone());
        (
            TempOutput {
                tmp,
                dest: dest.to_path_buf(),
                committed: false,
            },
            f,
        )
    }

    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// fsync the file, rename it over the destination, fsync the directory.
    pub fn commit(mut self, f: File) -> io::Result<()> {
        f.sync_all()?;
        drop(f);
        std::fs::rename(&self.tmp, &self.dest)?;
        sync_dir(parent_dir(&self.dest))?;
        self.committed = true;
        unregister(&self.tmp);
        Ok(())
    }
}

impl Drop for TempOutput {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
            unregister(&self.tmp);
        }
    }
}

/// Write `bytes` to `dest` through a temporary (`private`: [`TempOutput::create_private`]).
pub fn write_file(dest: &Path, bytes: &[u8], private: bool) -> io::Result<()> {
    let (t, mut f) = match private {
        true => TempOutput::create_private(dest)?,
        false => TempOutput::create(dest)?,
    };
    f.write_all(bytes)?;
    t.commit(f)
}

/// A directory tree being built at a temporary name beside its destination.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    committed: bool,
}

impl TempDir {
    /// Create `.<name>.swpool-<what>-<pid>` beside `dest` (a leftover of an earlier process with
    /// our pid is removed first).
    pub fn create(dest: &Path, what: &str) -> io::Result<TempDir> {
        let path = temp_name(dest, what, None)?;
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path)?;
        register_dir(&path);
        Ok(TempDir {
            path,
            committed: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Move the tree to `dest`. Where `dest` exists: with `replace`, atomically exchanged with it
    /// (`RENAME_EXCHANGE`: readers see the old or the new tree, never none) and the old one removed;
    /// without, refused (`AlreadyExists`, nothing changed).
    pub fn commit(mut self, dest: &Path, replace: bool) -> io::Result<()> {
        use rustix::fs::{renameat_with, RenameFlags, CWD};
        let exists = dest.symlink_metadata().is_ok();
        if exists && replace {
            renameat_with(CWD, &self.path, CWD, dest, RenameFlags::EXCHANGE)?;
            // our path now holds the previous tree (or file, or symlink: never followed)
            match self.path.symlink_metadata() {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&self.path)?,
                Ok(_) => std::fs::remove_file(&self.path)?,
                Err(_) => {}
            }
        } else {
            renameat_with(CWD, &self.path, CWD, dest, RenameFlags::NOREPLACE)?;
        }
        self.committed = true;
        unregister_dir(&self.path);
        let _ = sync_dir(parent_dir(dest));
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
            unregister_dir(&self.path);
        }
    }
}

fn unregister(p: &Path) {
    if let Ok(mut l) = REGISTERED.lock() {
        l.retain(|x| x != p);
    }
}

/// Give an output its modification (and access) time, `mtime_ns` nanoseconds since the epoch,
/// without following a symlink at `p`.
pub fn set_mtime(p: &Path, mtime_ns: i128) -> io::Result<()> {
    let ts = rustix::fs::Timespec {
        tv_sec: mtime_ns.div_euclid(1_000_000_000) as i64,
        tv_nsec: mtime_ns.rem_euclid(1_000_000_000) as _,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        p,
        &rustix::fs::Timestamps {
            last_access: ts,
            last_modification: ts,
        },
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(io::Error::from)
}

pub fn parent_dir(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

pub fn sync_dir(d: &Path) -> io::Result<()> {
    File::open(d)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `remove_all_registered` removes every temporary of the process: the tests take turns.
    static ONE: Mutex<()> = Mutex::new(());

    #[test]
    fn commit_and_abort() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("out.img");
        let (t, mut f) = TempOutput::create(&dest).unwrap();
        f.write_all(b"abc").unwrap();
        assert!(t.path().exists() && !dest.exists());
        t.commit(f).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"abc");
        {
            let (t, _f) = TempOutput::create(&dest).unwrap();
            assert!(t.path().exists());
        }
        // dropped without commit: the temporary is gone, the old output untouched
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 1);
        let (t, _f) = TempOutput::create(&dest).unwrap();
        let tmp = t.path().to_path_buf();
        remove_all_registered();
        assert!(!tmp.exists());
    }

    #[test]
    fn private_files_are_0600_and_never_through_a_symlink() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("rec.json");
        write_file(&dest, b"{}", true).unwrap();
        let m = std::fs::metadata(&dest).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        // two private temporaries beside one destination get two names
        let (a, _fa) = TempOutput::create_private(&dest).unwrap();
        let (b, _fb) = TempOutput::create_private(&dest).unwrap();
        assert_ne!(a.path(), b.path());
    }

    #[test]
    fn a_tree_replaces_the_old_one_atomically_or_is_refused() {
        let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("tree");
        let t = TempDir::create(&dest, "tmp").unwrap();
        std::fs::write(t.path().join("a"), b"1").unwrap();
        t.commit(&dest, false).unwrap();
        let t = TempDir::create(&dest, "tmp").unwrap();
        std::fs::write(t.path().join("b"), b"2").unwrap();
        let tmp = t.path().to_path_buf();
        assert_eq!(
            t.commit(&dest, false).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert!(!tmp.exists(), "dropped after the refused commit");
        assert!(dest.join("a").exists());
        let t = TempDir::create(&dest, "tmp").unwrap();
        std::fs::write(t.path().join("b"), b"2").unwrap();
        t.commit(&dest, true).unwrap();
        assert!(dest.join("b").exists() && !dest.join("a").exists());
        // a symlink at the destination is replaced, its target untouched
        let target = d.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("keep"), b"").unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let t = TempDir::create(&link, "tmp").unwrap();
        t.commit(&link, true).unwrap();
        assert!(link.is_dir() && !link.is_symlink() && target.join("keep").exists());
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            3,
            "nothing left beside"
        );
    }
}
