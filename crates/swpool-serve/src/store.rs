//! The node's copy of the chunks fetched so far: a sparse file the size of the image, and beside it
//! a record (`<file>.chunks`) with one byte per chunk, `1` where the chunk is on disk.
//!
//! Crash safety: a chunk's mark is written only after its bytes are on disk (`fdatasync` of the
//! data file, then the marks of every chunk written before it), so a crash can lose marks (the
//! chunk is fetched again) but never leaves a mark for bytes that are not there. Marks are written
//! in batches ([`LocalStore::flush`], every few hundred milliseconds and at the end) so that the
//! read path never waits for a disk flush. A chunk read back from the store is hashed again before
//! it is served, once per server (the file is the user's and could be changed under us).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Bytes before the marks: `sw-pool chunks v1 <digest> <chunks>\n`, zero-padded.
pub const HEADER_LEN: u64 = 128;

/// See the module's documentation.
pub struct LocalStore {
    data: File,
    record: File,
    path: PathBuf,
    chunk_size: u64,
    pending: Mutex<Vec<u64>>,
}

/// The record of a data file.
pub fn record_path(data: &Path) -> PathBuf {
    let mut s = data.as_os_str().to_os_string();
    s.push(".chunks");
    PathBuf::from(s)
}

fn header(digest: &str, chunks: u64) -> io::Result<Vec<u8>> {
    let mut h = format!("sw-pool chunks v1 {digest} {chunks}\n").into_bytes();
    if h.len() as u64 > HEADER_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "pool digest too long for the chunk record",
        ));
    }
    h.resize(HEADER_LEN as usize, 0);
    Ok(h)
}

fn open_rw(p: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
}

/// The chunks `record` marks present, when it is the record of this pool (`want`: its header) and
/// `data` has the image's length; `None` for another pool's, another chunking's or a damaged one.
fn marks(
    record: &File,
    data: &File,
    want: &[u8],
    image_size: u64,
    n: u64,
) -> io::Result<Option<Vec<u64>>> {
    let mut head = vec![0u8; HEADER_LEN as usize];
    let valid = record.metadata()?.len() == HEADER_LEN + n
        && data.metadata()?.len() == image_size
        && record.read_exact_at(&mut head, 0).is_ok()
        && head == want;
    if !valid {
        return Ok(None);
    }
    // the marks, in bounded pieces
    let mut present = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut i = 0u64;
    while i < n {
        let len = (n - i).min(buf.len() as u64) as usize;
        record.read_exact_at(&mut buf[..len], HEADER_LEN + i)?;
        present.extend(
            buf[..len]
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'1')
                .map(|(k, _)| i + k as u64),
        );
        i += len as u64;
    }
    Ok(Some(present))
}

/// A store's data file opened read-only and the chunks its record marks present, without changing
/// either (a full copy taking over what an on-demand run fetched); `Ok(None)` when there is no
/// store for this pool at `data` (none, another pool's, a damaged record). Symlinks are not
/// followed. The marks say only that the bytes were written: the reader verifies them.
pub fn read_marks(
    data: &Path,
    digest: &str,
    image_size: u64,
    chunk_size: u64,
) -> io::Result<Option<(File, Vec<u64>)>> {
    let open = |p: &Path| {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(p)
    };
    let data_file = match open(data) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let record = match open(&record_path(data)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !data_file.metadata()?.is_file() || !record.metadata()?.is_file() {
        return Ok(None);
    }
    let n = image_size.div_ceil(chunk_size);
    let want = header(digest, n)?;
    Ok(marks(&record, &data_file, &want, image_size, n)?.map(|p| (data_file, p)))
}

/// Remove a store (data file and record), e.g. once a full copy replaced it.
pub fn remove(data: &Path) {
    let _ = std::fs::remove_file(record_path(data));
    let _ = std::fs::remove_file(data);
}

impl LocalStore {
    /// Open (or create) the store at `data` for the pool with manifest `digest`: returns it and the
    /// chunks its record marks present. A record of another pool, another chunking or a damaged
    /// one is started afresh (the data file emptied too).
    pub fn open(
        data: &Path,
        digest: &str,
        image_size: u64,
        chunk_size: u64,
    ) -> io::Result<(LocalStore, Vec<u64>)> {
        let n = image_size.div_ceil(chunk_size);
        let want = header(digest, n)?;
        let data_file = open_rw(data)?;
        let record = open_rw(&record_path(data))?;
        let present = marks(&record, &data_file, &want, image_size, n)?;
        if present.is_none() {
            // marks first (none), then the data: a crash in between leaves no mark
            record.set_len(0)?;
            record.write_all_at(&want, 0)?;
            record.set_len(HEADER_LEN + n)?;
            record.sync_data()?;
            data_file.set_len(0)?;
            data_file.set_len(image_size)?;
        }
        Ok((
            LocalStore {
                data: data_file,
                record,
                path: data.to_path_buf(),
                chunk_size,
                pending: Mutex::new(Vec::new()),
            },
            present.unwrap_or_default(),
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write chunk `i`; it is marked present by the next [`flush`](Self::flush).
    pub fn write_chunk(&self, i: u64, bytes: &[u8]) -> io::Result<()> {
        self.data.write_all_at(bytes, i * self.chunk_size)?;
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(i);
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset` of the image from the store.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.data.read_exact_at(buf, offset)
    }

    /// Make the chunks written so far durable, then mark them present. Returns how many were marked.
    pub fn flush(&self) -> io::Result<usize> {
        let batch = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        if batch.is_empty() {
            return Ok(0);
        }
        // not durable: not marked (they are fetched again next time)
        self.data.sync_data()?;
        for i in &batch {
            self.record.write_all_at(b"1", HEADER_LEN + i)?;
        }
        Ok(batch.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_only_what_was_flushed_and_survives_reopening() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.pool.part");
        let (s, present) = LocalStore::open(&p, "blake3:ab", 10_000, 4096).unwrap();
        assert!(present.is_empty());
        s.write_chunk(1, &[7u8; 4096]).unwrap();
        assert_eq!(s.flush().unwrap(), 1);
        s.write_chunk(2, &[9u8; 10_000 - 8192]).unwrap(); // written, never flushed: a crash here
        drop(s);
        let (s, present) = LocalStore::open(&p, "blake3:ab", 10_000, 4096).unwrap();
        assert_eq!(present, vec![1]);
        let mut b = [0u8; 4096];
        s.read_at(4096, &mut b).unwrap();
        assert_eq!(b, [7u8; 4096]);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 10_000);
    }

    #[test]
    fn another_pools_record_starts_afresh() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        let (s, _) = LocalStore::open(&p, "blake3:ab", 8192, 4096).unwrap();
        s.write_chunk(0, &[1u8; 4096]).unwrap();
        s.flush().unwrap();
        drop(s);
        let (_, present) = LocalStore::open(&p, "blake3:cd", 8192, 4096).unwrap();
        assert!(present.is_empty());
        // and a damaged record (wrong length) too
        std::fs::write(record_path(&p), b"junk").unwrap();
        let (_, present) = LocalStore::open(&p, "blake3:cd", 8192, 4096).unwrap();
        assert!(present.is_empty());
    }

    #[test]
    fn read_marks_sees_what_was_flushed_and_changes_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.pool.part");
        assert!(read_marks(&p, "blake3:ab", 10_000, 4096).unwrap().is_none());
        let (s, _) = LocalStore::open(&p, "blake3:ab", 10_000, 4096).unwrap();
        s.write_chunk(2, &[5u8; 10_000 - 8192]).unwrap();
        s.flush().unwrap();
        s.write_chunk(0, &[6u8; 4096]).unwrap(); // not flushed: not present
        drop(s);
        let (f, present) = read_marks(&p, "blake3:ab", 10_000, 4096).unwrap().unwrap();
        assert_eq!(present, vec![2]);
        let mut b = [0u8; 16];
        f.read_exact_at(&mut b, 8192).unwrap();
        assert_eq!(b, [5u8; 16]);
        // another pool's view: nothing, and the store is left as it was
        assert!(read_marks(&p, "blake3:cd", 10_000, 4096).unwrap().is_none());
        assert!(read_marks(&p, "blake3:ab", 10_001, 4096).unwrap().is_none());
        assert_eq!(
            read_marks(&p, "blake3:ab", 10_000, 4096)
                .unwrap()
                .unwrap()
                .1,
            vec![2]
        );
        remove(&p);
        assert!(!p.exists() && !record_path(&p).exists());
        // a symlink in place of the data file is no store
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        assert!(read_marks(&p, "blake3:ab", 10_000, 4096).is_err());
    }

    #[test]
    fn refuses_to_follow_a_symlink() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        assert!(LocalStore::open(&p, "blake3:ab", 8192, 4096).is_err());
    }
}
