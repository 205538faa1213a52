//! The one lock: an exclusive `flock` on a file, opened without following a symlink.
//!
//! `flock` locks an open file description, so two threads of one process that each open the file
//! exclude each other as two processes do. The lock is released when the [`FileLock`] is dropped
//! (or the process ends, however it ends: nothing to clean up after a crash).

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// An exclusive lock held on a file.
#[derive(Debug)]
pub struct FileLock {
    _f: File,
    path: PathBuf,
}

impl FileLock {
    /// Create `path` if needed (mode 0600; a symlink there is refused, `ELOOP`) and wait for the
    /// exclusive lock on it.
    pub fn exclusive(path: &Path) -> io::Result<FileLock> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(FileLock {
            _f: f,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn excludes_another_thread_and_refuses_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("lock");
        let held = FileLock::exclusive(&p).unwrap();
        let got = Arc::new(AtomicBool::new(false));
        let (p2, g2) = (p.clone(), got.clone());
        let t = std::thread::spawn(move || {
            let _l = FileLock::exclusive(&p2).unwrap();
            g2.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!got.load(Ordering::SeqCst), "the second lock waited");
        drop(held);
        t.join().unwrap();
        assert!(got.load(Ordering::SeqCst));
        let l = d.path().join("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert_eq!(
            FileLock::exclusive(&l).unwrap_err().raw_os_error(),
            Some(libc::ELOOP)
        );
    }
}
