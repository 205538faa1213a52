//! Outputs written under a temporary name and renamed into place only when complete.
//!
//! Every temporary path is registered in a process-wide list, so that the binary's signal handler
//! can remove them on SIGINT/SIGTERM ([`remove_all_registered`]): an interrupted build leaves nothing.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

static REGISTERED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static REGISTERED_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

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
        let dir = parent_dir(dest);
        let name = dest
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let tmp = dir.join(format!(
            ".{}.swpool-tmp-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let _ = std::fs::remove_file(&tmp); // our own pid: a leftover of a crashed earlier run with the same pid
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        REGISTERED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tmp.clone());
        Ok((
            TempOutput {
                tmp,
                dest: dest.to_path_buf(),
                committed: false,
            },
            f,
        ))
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

fn unregister(p: &Path) {
    if let Ok(mut l) = REGISTERED.lock() {
        l.retain(|x| x != p);
    }
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
    use std::io::Write;

    #[test]
    fn commit_and_abort() {
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
}
