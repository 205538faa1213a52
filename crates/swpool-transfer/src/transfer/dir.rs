//! Directories: one reader turns the tree into a tar stream in memory (a producer thread writing
//! into a bounded channel, never an archive on disk); the stream moves in chunks (a small header
//! with length and BLAKE3 hash, then the bytes, both `MPI_Bcast` from the reader); every receiving
//! leader verifies each chunk and feeds it to an extractor thread unpacking into a temporary
//! directory, renamed into place on collective success. Modes, symlinks, hard links and mtimes (to
//! the nanosecond, in PAX extended headers) are kept; ownership too when the copy runs as root
//! (otherwise the files belong to whoever runs it).
//!
//! After every chunk all leaders exchange their status (`MPI_Allgather` of one byte): a receiving
//! node whose verification or extraction failed stops the stream for everyone at once, naming itself.
//!
//! Memory: at most a few chunks in the two channels plus one being broadcast.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::engine::{plane_err, LocalResult};
use super::Stats;
use crate::plane::{DataPlane, PlaneError};
use crate::watchdog::Watchdog;
use swpool_format::status::ExitStatus;

/// Signature of a tree's metadata (paths, types, modes, sizes, mtimes, link targets) and an
/// estimate of its tar stream's size.
pub(crate) fn signature(root: &Path) -> LocalResult<(String, u64)> {
    let mut h = Sha256::new();
    let mut bytes = 1024u64;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = std::fs::read_dir(root.join(&rel))
            .map_err(|e| walk_err(&root.join(&rel), e))?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        for name in names.into_iter().rev() {
            let r = rel.join(&name);
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p).map_err(|e| walk_err(&p, e))?;
            h.update(r.as_os_str().as_encoded_bytes());
            h.update([0]);
            h.update(m.mode().to_le_bytes());
            h.update(m.mtime().to_le_bytes());
            h.update(m.mtime_nsec().to_le_bytes());
            bytes += 512;
            if m.is_file() {
                h.update(m.len().to_le_bytes());
                bytes += m.len().div_ceil(512) * 512;
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).map_err(|e| walk_err(&p, e))?;
                h.update(t.as_os_str().as_encoded_bytes());
            } else if m.is_dir() {
                stack.push(r);
            }
        }
    }
    Ok((format!("tree:{}", hex::encode(h.finalize())), bytes))
}

fn walk_err(p: &Path, e: io::Error) -> (ExitStatus, String) {
    (
        swpool_format::status::io_status(&e),
        format!("cannot read {} in SRC: {e}", p.display()),
    )
}

/// One PAX extended-header record: `"<len> <key>=<value>\n"`, where `<len>` counts the whole record.
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    loop {
        let l = len.to_string().len() + body.len();
        if l == len {
            break;
        }
        len = l;
    }
    format!("{len}{body}").into_bytes()
}

/// The PAX `mtime` value of a file's mtime, to the nanosecond (`None` when whole seconds say it all,
/// or before 1970, where the sign convention of fractional PAX times differs between readers).
fn pax_mtime(m: &std::fs::Metadata) -> Option<String> {
    (m.mtime_nsec() != 0 && m.mtime() >= 0).then(|| format!("{}.{:09}", m.mtime(), m.mtime_nsec()))
}

/// Parse a PAX time `sec[.frac]` into (seconds, nanoseconds).
fn parse_pax_time(v: &str) -> Option<(i64, i64)> {
    let (sec, frac) = v.split_once('.').unwrap_or((v, ""));
    let sec: i64 = sec.parse().ok()?;
    if sec < 0 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    Some((sec, digits.parse().ok()?))
}

fn set_mtime(p: &Path, sec: i64, nsec: i64) {
    let _ = crate::atomic::set_mtime(p, i128::from(sec) * 1_000_000_000 + i128::from(nsec));
}

/// A temporary directory beside DEST ([`crate::atomic::TempDir`]: removed unless committed, also
/// by the signal handler and the watchdog).
pub(crate) struct TempDir {
    tmp: crate::atomic::TempDir,
    path: PathBuf,
}

impl TempDir {
    pub(crate) fn create(dest: &Path) -> io::Result<TempDir> {
        let tmp = crate::atomic::TempDir::create(dest, "tmp")?;
        let path = tmp.path().to_path_buf();
        Ok(TempDir { tmp, path })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Flush the extracted tree to disk.
    pub(crate) fn sync(&self) -> LocalResult<()> {
        let f = File::open(&self.path).map_err(|e| {
            (
                ExitStatus::System,
                format!("cannot open {}: {e}", self.path.display()),
            )
        })?;
        rustix::fs::syncfs(&f).map_err(|e| {
            (
                ExitStatus::System,
                format!("cannot sync {}: {e}", self.path.display()),
            )
        })
    }

    /// Give the root SRC's mode and mtime, stamp it, and move it to `target` (replacing an earlier
    /// copy atomically with `RENAME_EXCHANGE`).
    pub(crate) fn commit(
        self,
        target: &Path,
        mode: u32,
        mtime_ns: i128,
        stamp: impl FnOnce(&Path) -> LocalResult<()>,
    ) -> LocalResult<()> {
        let err = |what: &str, e: &dyn std::fmt::Display| {
            (
                ExitStatus::System,
                format!("cannot {what} {}: {e}", self.path.display()),
            )
        };
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(|e| err("chmod", &e))?;
        crate::atomic::set_mtime(&self.path, mtime_ns).map_err(|e| err("set the mtime of", &e))?;
        stamp(&self.path)?;
        // an earlier copy is exchanged atomically (readers see the old tree or the new one)
        self.tmp
            .commit(target, true)
            .map_err(|e| err("move into place as", &e))
    }
}

/// A `Write` cutting the stream into chunks sent over a bounded channel.
struct ChanWriter {
    tx: SyncSender<Vec<u8>>,
    buf: Vec<u8>,
    chunk: usize,
}

impl Write for ChanWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(self.chunk - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == self.chunk {
            let full = std::mem::replace(&mut self.buf, Vec::with_capacity(self.chunk));
            self.tx.send(full).map_err(|_| {
                io::Error::new(io::ErrorKind::BrokenPipe, "the distribution stopped")
            })?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl ChanWriter {
    fn finish(mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let rest = std::mem::take(&mut self.buf);
            self.tx.send(rest).map_err(|_| {
                io::Error::new(io::ErrorKind::BrokenPipe, "the distribution stopped")
            })?;
        }
        Ok(())
    }
}

/// A `Read` over chunks received from a channel.
struct ChanReader {
    rx: Receiver<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for ChanReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            match self.rx.recv() {
                Ok(v) => {
                    self.cur = v;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Write the tree under `root` as a tar stream (sorted, no symlink following, hard links as links).
/// Returns the bytes of file data read.
fn produce(root: &Path, w: ChanWriter) -> Result<u64, String> {
    let mut b = tar::Builder::new(w);
    b.follow_symlinks(false);
    let mut links: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut read = 0u64;
    let mut stack = vec![PathBuf::new()];
    let e = |p: &Path, e: io::Error| format!("cannot read {} in SRC: {e}", p.display());
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|x| e(&dir, x))?
            .filter_map(|x| x.ok().map(|x| x.file_name()))
            .collect();
        names.sort();
        // depth-first, in name order
        let mut subdirs = Vec::new();
        for name in names {
            let r = rel.join(&name);
            let p = root.join(&r);
            let m = std::fs::symlink_metadata(&p).map_err(|x| e(&p, x))?;
            let mut h = tar::Header::new_gnu();
            h.set_metadata_in_mode(&m, tar::HeaderMode::Complete);
            let ft = m.file_type();
            if let Some(t) = pax_mtime(&m) {
                // a PAX extended header before the entry: its mtime to the nanosecond
                let rec = pax_record("mtime", &t);
                let mut x = tar::Header::new_ustar();
                x.set_entry_type(tar::EntryType::XHeader);
                x.set_path("././@PaxHeader").map_err(|x| e(&p, x))?;
                x.set_mode(0o644);
                x.set_mtime(0);
                x.set_size(rec.len() as u64);
                x.set_cksum();
                b.append(&x, rec.as_slice()).map_err(|x| e(&p, x))?;
            }
            if ft.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, &r, io::empty())
                    .map_err(|x| e(&p, x))?;
                subdirs.push(r);
            } else if ft.is_symlink() {
                let t = std::fs::read_link(&p).map_err(|x| e(&p, x))?;
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, &r, &t).map_err(|x| e(&p, x))?;
            } else if ft.is_file() {
                if m.nlink() > 1 {
                    if let Some(first) = links.get(&(m.dev(), m.ino())) {
                        h.set_entry_type(tar::EntryType::Link);
                        h.set_size(0);
                        b.append_link(&mut h, &r, first).map_err(|x| e(&p, x))?;
                        continue;
                    }
                    links.insert((m.dev(), m.ino()), r.clone());
                }
                let f = File::open(&p).map_err(|x| e(&p, x))?;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_size(m.len());
                b.append_data(&mut h, &r, f.take(m.len()))
                    .map_err(|x| e(&p, x))?;
                read += m.len();
            } else {
                tracing::warn!(path = %p.display(), "skipping a special file (device, fifo or socket)");
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    let w = b
        .into_inner()
        .map_err(|x| format!("cannot finish the tar stream: {x}"))?;
    w.finish()
        .map_err(|x| format!("cannot finish the tar stream: {x}"))?;
    Ok(read)
}

fn extract(rd: ChanReader, dest: &Path) -> Result<(), String> {
    let mut a = tar::Archive::new(rd);
    a.set_preserve_permissions(true);
    a.set_preserve_mtime(true);
    a.set_unpack_xattrs(false);
    a.set_overwrite(false);
    // numeric owners and groups, as in SRC, when we may set them
    a.set_preserve_ownerships(rustix::process::geteuid().is_root());
    let e = |x: io::Error| format!("cannot extract into {}: {x}", dest.display());
    // directories get their mtimes last (creating their entries changed them)
    let mut dirs: Vec<(PathBuf, i64, i64)> = Vec::new();
    for entry in a.entries().map_err(e)? {
        let mut entry = entry.map_err(e)?;
        // the PAX mtime (nanoseconds) if there is one, else the header's (seconds)
        let pax = entry.pax_extensions().ok().flatten().and_then(|mut x| {
            x.find_map(|r| {
                r.ok()
                    .filter(|r| r.key() == Ok("mtime"))
                    .and_then(|r| r.value().ok().and_then(parse_pax_time))
            })
        });
        let mtime = pax.or_else(|| entry.header().mtime().ok().map(|m| (m as i64, 0)));
        let kind = entry.header().entry_type();
        let path = entry.path().map(|p| dest.join(p)).ok();
        entry.unpack_in(dest).map_err(e)?;
        match (kind, path, mtime) {
            (tar::EntryType::Directory, Some(p), Some((s, ns))) => dirs.push((p, s, ns)),
            (tar::EntryType::Link, _, _) => {}
            (_, Some(p), Some((s, ns))) if pax.is_some() => set_mtime(&p, s, ns),
            _ => {}
        }
    }
    for (p, s, ns) in dirs.iter().rev() {
        set_mtime(p, *s, *ns);
    }
    Ok(())
}

const HDR: usize = 56;

fn encode_hdr(status: u64, len: u64, eof: bool, hash: &[u8; 32]) -> [u8; HDR] {
    let mut b = [0u8; HDR];
    b[..8].copy_from_slice(&status.to_le_bytes());
    b[8..16].copy_from_slice(&len.to_le_bytes());
    b[16..24].copy_from_slice(&u64::from(eof).to_le_bytes());
    b[24..].copy_from_slice(hash);
    b
}

/// After each chunk: every leader's status (1 = this leader failed); the hosts of the failed ones.
fn failed_nodes(
    watch: &Watchdog,
    c: &dyn DataPlane,
    mine: bool,
    hosts: &[String],
) -> Result<Vec<String>, PlaneError> {
    let all = c.all_gather_byte(u8::from(mine))?;
    watch.touch();
    Ok(all
        .iter()
        .enumerate()
        .filter(|(_, &f)| f != 0)
        .map(|(k, _)| {
            hosts
                .get(k)
                .cloned()
                .unwrap_or_else(|| format!("leader {k}"))
        })
        .collect())
}

/// Record that the stream stops because of `failed` (unless this leader already has its own error).
fn stop_for(err: &mut Option<(ExitStatus, String)>, failed: &[String]) {
    if err.is_none() {
        *err = Some((
            ExitStatus::Collective,
            format!("stopped: failed on {}", failed.join(", ")),
        ));
    }
}

/// Stream the tree from the reader (rank 0 of `comm`, or this process when `comm` is `None`) into
/// `tmp` on every receiving leader.
#[allow(clippy::too_many_arguments)]
pub(crate) fn transfer(
    comm: Option<&dyn DataPlane>,
    src: &Path,
    tmp: &Path,
    chunk_size: u64,
    hosts: &[String],
    stats: &mut Stats,
    progress: &dyn Fn(u64),
    watch: &Watchdog,
) -> LocalResult<()> {
    let chunk = chunk_size as usize;
    let reader = !matches!(comm, Some(c) if c.rank() != 0);
    let (ext_tx, ext_rx) = sync_channel::<Vec<u8>>(2);
    let dest = tmp.to_path_buf();
    let extractor = std::thread::spawn(move || {
        extract(
            ChanReader {
                rx: ext_rx,
                cur: Vec::new(),
                pos: 0,
            },
            &dest,
        )
    });
    let mut s = Stream {
        ext_tx: Some(ext_tx),
        err: None,
        broken: None,
        done: 0,
        hosts,
        progress,
        watch,
    };
    let t0 = Instant::now();
    if reader {
        s.send(comm, src, chunk, stats);
    } else {
        s.receive(comm.expect("receiver has a communicator"), stats);
    }
    let Stream {
        ext_tx,
        mut err,
        broken,
        done,
        ..
    } = s;
    if let Some(e) = broken {
        err.get_or_insert(plane_err(e));
    }
    drop(ext_tx);
    let tw = Instant::now();
    let extracted = extractor
        .join()
        .unwrap_or_else(|_| Err("the extractor panicked".into()));
    stats.write += tw.elapsed();
    let _ = t0;
    match (err, extracted) {
        (Some(e), Err(x)) if e.1 == "extraction stopped" => Err((ExitStatus::System, x)),
        (Some(e), _) => Err(e),
        (None, Err(x)) => Err((ExitStatus::System, x)),
        (None, Ok(())) => {
            stats.bytes_written += done;
            Ok(())
        }
    }
}

/// One leader's side of the directory stream: the channel to its extractor, the first failure
/// and the bytes streamed so far.
struct Stream<'a> {
    /// To the extractor thread; `None` once it stopped.
    ext_tx: Option<SyncSender<Vec<u8>>>,
    err: Option<(ExitStatus, String)>,
    /// The first data-plane failure: the stream stops on every member (the plane fails them all).
    broken: Option<PlaneError>,
    done: u64,
    hosts: &'a [String],
    progress: &'a dyn Fn(u64),
    watch: &'a Watchdog,
}

impl Stream<'_> {
    /// Hand `data` to the extractor; when it stopped, record that (its error is collected at the
    /// end).
    fn feed(&mut self, data: Vec<u8>) {
        if let Some(tx) = &self.ext_tx {
            if tx.send(data).is_err() {
                // the extractor stopped: its error is collected at the end
                self.ext_tx = None;
                if self.err.is_none() {
                    self.err = Some((ExitStatus::System, "extraction stopped".into()));
                }
            }
        }
    }

    /// Whether the stream stops after a chunk because a member failed (this one included): asks
    /// the members, and records the reason.
    fn stops(&mut self, c: &dyn DataPlane) -> bool {
        let failed = match failed_nodes(self.watch, c, self.err.is_some(), self.hosts) {
            Ok(f) => f,
            Err(e) => {
                self.broken = Some(e);
                return true;
            }
        };
        if !failed.is_empty() {
            stop_for(&mut self.err, &failed);
            return true;
        }
        false
    }

    /// The reader's side: tar the tree under `src` in a producer thread, hash every chunk of it,
    /// broadcast its header and data over `comm` (when there is one) and extract it here too.
    fn send(&mut self, comm: Option<&dyn DataPlane>, src: &Path, chunk: usize, stats: &mut Stats) {
        let (prod_tx, prod_rx) = sync_channel::<Vec<u8>>(2);
        let root = src.to_path_buf();
        let mut producer = Some(std::thread::spawn(move || {
            produce(
                &root,
                ChanWriter {
                    tx: prod_tx,
                    buf: Vec::with_capacity(chunk),
                    chunk,
                },
            )
        }));
        loop {
            let next = prod_rx.recv().ok();
            self.watch.touch();
            let (status, data, eof) = match next {
                Some(d) => (0u64, d, false),
                None => {
                    let r = match producer.take() {
                        Some(p) => p
                            .join()
                            .unwrap_or_else(|_| Err("the tar producer panicked".into())),
                        None => Ok(0),
                    };
                    match r {
                        Ok(n) => stats.bytes_read += n,
                        Err(m) => self.err = Some((ExitStatus::System, m)),
                    }
                    (u64::from(self.err.is_some()), Vec::new(), true)
                }
            };
            let tv = Instant::now();
            let hash: [u8; 32] = crate::pool::manifest::hash_chunk(&data);
            stats.verify += tv.elapsed();
            if let Some(c) = comm {
                let mut hdr = encode_hdr(status, data.len() as u64, eof, &hash);
                if let Err(e) = c.bcast(&mut hdr[..], 0) {
                    self.broken = Some(e);
                    break;
                }
                if !data.is_empty() {
                    let mut d = data;
                    if let Err(e) = c.bcast(&mut d[..], 0) {
                        self.broken = Some(e);
                        break;
                    }
                    self.watch.touch();
                    stats.bytes_sent += d.len() as u64;
                    self.done += d.len() as u64;
                    self.feed(d);
                }
            } else if !data.is_empty() {
                self.done += data.len() as u64;
                self.feed(data);
            }
            (self.progress)(self.done);
            if eof {
                break;
            }
            if let Some(c) = comm {
                // a receiver that failed stops the stream now, not at the end
                if self.stops(c) {
                    break;
                }
            } else if self.err.is_some() {
                break;
            }
        }
        // the producer may be blocked on a full channel: close it, then collect the thread
        drop(prod_rx);
        if let Some(p) = producer.take() {
            let _ = p.join();
        }
    }

    /// A receiver's side: take every header and chunk the reader broadcasts over `c`, check each
    /// chunk's hash and extract it.
    fn receive(&mut self, c: &dyn DataPlane, stats: &mut Stats) {
        let hosts = self.hosts;
        let reader_host = || hosts.first().cloned().unwrap_or_default();
        loop {
            let mut hdr = [0u8; HDR];
            if let Err(e) = c.bcast(&mut hdr[..], 0) {
                self.broken = Some(e);
                break;
            }
            self.watch.touch();
            let status = u64::from_le_bytes(hdr[..8].try_into().unwrap());
            let len = u64::from_le_bytes(hdr[8..16].try_into().unwrap()) as usize;
            let eof = u64::from_le_bytes(hdr[16..24].try_into().unwrap()) != 0;
            if status != 0 {
                if self.err.is_none() {
                    self.err = Some((
                        ExitStatus::Collective,
                        format!("the reader {} failed", reader_host()),
                    ));
                }
                break;
            }
            if len > 0 {
                let mut d = vec![0u8; len];
                if let Err(e) = c.bcast(&mut d[..], 0) {
                    self.broken = Some(e);
                    break;
                }
                self.watch.touch();
                let tv = Instant::now();
                let got: [u8; 32] = crate::pool::manifest::hash_chunk(&d);
                stats.verify += tv.elapsed();
                if got[..] != hdr[24..] && self.err.is_none() {
                    self.err = Some((
                        ExitStatus::System,
                        format!(
                            "verification failed for the directory stream at byte {} (sent by {}): hash mismatch",
                            self.done,
                            reader_host()
                        ),
                    ));
                }
                self.done += len as u64;
                if self.err.is_none() {
                    self.feed(d);
                }
            }
            (self.progress)(self.done);
            if eof || self.stops(c) {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_records_count_their_own_length() {
        let r = pax_record("mtime", "1500000000.123456789");
        assert_eq!(r, b"30 mtime=1500000000.123456789\n");
        assert_eq!(r.len(), 30);
        // the length field's own digits can push the record over a power of ten
        let r = pax_record("k", &"v".repeat(94));
        let text = String::from_utf8(r.clone()).unwrap();
        let (len, _) = text.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), r.len());
        assert_eq!(r.len(), 101);
    }

    #[test]
    fn pax_times_parse_to_nanoseconds() {
        assert_eq!(
            parse_pax_time("1500000000.123456789"),
            Some((1_500_000_000, 123_456_789))
        );
        assert_eq!(parse_pax_time("12.5"), Some((12, 500_000_000)));
        assert_eq!(parse_pax_time("12"), Some((12, 0)));
        assert_eq!(parse_pax_time("12.1234567891"), Some((12, 123_456_789)));
        assert_eq!(parse_pax_time("-1.5"), None);
        assert_eq!(parse_pax_time("x"), None);
        assert_eq!(parse_pax_time("1.2x"), None);
    }
}
