//! The one lock: an exclusive `flock` on a file, opened without following a symlink
//! ([`FileLock`]); and the same lock on a descriptor its caller opened ([`try_lock`], [`lock`]:
//! a lock file held by a process's whole life and handed on to its children, a probe whether
//! anyone holds one).
//!
//! `flock` locks an open file description, so two threads of one process that each open the file
//! exclude each other as two processes do. The lock is released when the [`FileLock`] is dropped
//! (or the process ends, however it ends: nothing to clean up after a crash).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
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

/// How a lock is held: by one (a writer, a creator) or by many (readers, a probe).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    Shared,
    Exclusive,
}

impl Share {
    fn op(self, wait: bool) -> rustix::fs::FlockOperation {
        use rustix::fs::FlockOperation as F;
        match (self, wait) {
            (Share::Shared, true) => F::LockShared,
            (Share::Shared, false) => F::NonBlockingLockShared,
            (Share::Exclusive, true) => F::LockExclusive,
            (Share::Exclusive, false) => F::NonBlockingLockExclusive,
        }
    }
}

/// Take the lock on `fd` without waiting: `Ok(false)` when another open file description holds it
/// in a conflicting way (`EWOULDBLOCK`).
pub fn try_lock(fd: impl AsFd, how: Share) -> io::Result<bool> {
    match rustix::fs::flock(fd, how.op(false)) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Wait for the lock on `fd`.
pub fn lock(fd: impl AsFd, how: Share) -> io::Result<()> {
    Ok(rustix::fs::flock(fd, how.op(true))?)
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

    #[test]
    fn a_descriptors_lock_shared_by_many_exclusive_by_one() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("lock");
        std::fs::write(&p, b"").unwrap();
        let open = || std::fs::File::open(&p).unwrap();
        let (a, b, c) = (open(), open(), open());
        assert!(try_lock(&a, Share::Shared).unwrap());
        assert!(try_lock(&b, Share::Shared).unwrap());
        assert!(!try_lock(&c, Share::Exclusive).unwrap(), "readers hold it");
        drop((a, b));
        assert!(try_lock(&c, Share::Exclusive).unwrap());
        assert!(
            !try_lock(open(), Share::Shared).unwrap(),
            "a writer holds it"
        );
        // a waiter gets it when the holder lets it go
        let t = std::thread::spawn({
            let p = p.clone();
            move || lock(std::fs::File::open(p).unwrap(), Share::Shared).unwrap()
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.is_finished(), "the waiter waits");
        drop(c);
        t.join().unwrap();
    }
}
