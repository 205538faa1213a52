//! A full copy of a pool that takes over what an on-demand run left on the node: the cache entry's
//! partial copy (`<entry>.part` and its record, [`swpool_serve::store`], written by `load --lazy`
//! and `mount --in-place`).
//!
//! 1. Every receiving leader reads its record and **verifies** each chunk it marks present against
//!    the manifest (a mark says only that the bytes were written; the file is the user's).
//! 2. The leaders exchange what they hold (one bit per chunk). A chunk that every receiver holds is
//!    not moved at all; the others move as before, and a reader that holds one of its chunks reads
//!    it from its own copy instead of shared storage ([`LocalFirst`]). So after an on-demand run
//!    in which every node touched the same 30 % of a pool, a full `load` reads about 70 % of it
//!    from shared storage.
//! 3. Each receiver copies the chunks it holds into the copy's temporary, verifying them again
//!    while copying (they could have changed since step 1: then this node fails the copy, as for
//!    any other bad byte, and every node reports it).
//! 4. Once the copy is committed the partial copy is removed: the entry holds everything.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::engine::Source;
use super::plan::Chunk;
use crate::collective::Local;
use crate::pool::manifest::{hash_chunk, Manifest, ZeroHashes};
use swpool_format::status::ExitStatus;

/// What a node holds of a pool: the partial copy's data file and, per chunk of the manifest's
/// grid, whether it holds that chunk's verified bytes.
#[derive(Default)]
pub(super) struct Held {
    file: Option<File>,
    pub(super) have: Vec<bool>,
}

impl Held {
    fn indices(&self) -> impl Iterator<Item = usize> + '_ {
        self.have
            .iter()
            .enumerate()
            .filter(|(_, h)| **h)
            .map(|(i, _)| i)
    }

    /// One bit per chunk, after a leading `1` byte (the message is never empty).
    pub(super) fn to_bits(&self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; 1 + n.div_ceil(8)];
        v[0] = 1;
        for i in self.indices().filter(|&i| i < n) {
            v[1 + i / 8] |= 1 << (i % 8);
        }
        v
    }
}

/// Whether chunk `i` is set in a message of [`Held::to_bits`] (a short or malformed message holds
/// nothing).
fn bit(msg: &[u8], i: usize) -> bool {
    msg.first() == Some(&1) && msg.get(1 + i / 8).is_some_and(|b| b & (1 << (i % 8)) != 0)
}

/// Per chunk of `n`: held by every one of the `receivers` (indices into `msgs`, one message of
/// [`Held::to_bits`] per leader).
pub(super) fn held_by_all(msgs: &[Vec<u8>], receivers: &[usize], n: usize) -> Vec<bool> {
    (0..n)
        .map(|i| {
            !receivers.is_empty()
                && receivers
                    .iter()
                    .all(|&r| msgs.get(r).is_some_and(|m| bit(m, i)))
        })
        .collect()
}

/// The chunks that still have to move: those not held by every receiver.
pub(super) fn to_move(chunks: Vec<Chunk>, m: &Manifest, all: &[bool]) -> Vec<Chunk> {
    chunks
        .into_iter()
        .filter(|c| {
            !all.get((c.offset / m.chunk_size) as usize)
                .copied()
                .unwrap_or(false)
        })
        .collect()
}

/// Step 1: the chunks of `part` whose bytes match the manifest. A missing, foreign or unreadable
/// partial copy holds nothing (it is a cache: the copy goes on without it).
pub(super) fn scan(m: &Manifest, part: &Path) -> Held {
    let n = m.chunks.len();
    let opened = swpool_serve::store::read_marks(part, &m.digest, m.image_size, m.chunk_size);
    let (file, present) = match opened {
        Ok(Some(x)) => x,
        Ok(None) => return Held::default(),
        Err(e) => {
            tracing::warn!(path = %part.display(), "partial copy not used: {e}");
            return Held::default();
        }
    };
    let mut have = vec![false; n];
    let mut zero = ZeroHashes::default();
    let mut buf = Vec::new();
    for i in present.into_iter().filter(|&i| (i as usize) < n) {
        if matches(m, &file, i, &mut buf, &mut zero).is_ok_and(|ok| ok) {
            have[i as usize] = true;
        }
    }
    Held {
        file: Some(file),
        have,
    }
}

/// Whether chunk `i` of `file` holds the manifest's bytes (read into `buf`).
fn matches(
    m: &Manifest,
    file: &File,
    i: u64,
    buf: &mut Vec<u8>,
    zero: &mut ZeroHashes,
) -> std::io::Result<bool> {
    let r = m.chunk_range(i);
    buf.resize((r.end - r.start) as usize, 0);
    file.read_exact_at(buf, r.start)?;
    Ok(m.chunk_hash(i as usize, zero) == Some(hash_chunk(buf)))
}

/// Step 3: copy the held chunks into `out` (the copy's temporary, already sized), verifying each
/// again. Returns the bytes copied.
pub(super) fn fill(m: &Manifest, held: &Held, out: &File, out_path: &Path) -> Local<u64> {
    let Some(file) = &held.file else {
        return Ok(0);
    };
    let mut zero = ZeroHashes::default();
    let mut buf = Vec::new();
    let mut done = 0u64;
    for i in held.indices() {
        let ok = matches(m, file, i as u64, &mut buf, &mut zero).unwrap_or(false);
        if !ok {
            return Err((
                ExitStatus::System,
                format!(
                    "the node's partial copy of {}/{} changed while it was being used (chunk {i}); \
                     run load again",
                    m.name, m.version
                ),
            ));
        }
        if crate::sparse::is_all_zero(&buf) {
            continue; // the temporary is sparse: zeros are already there
        }
        out.write_all_at(&buf, m.chunk_range(i as u64).start)
            .map_err(|e| {
                super::engine::io_err(&format!("cannot write {}", out_path.display()), &e)
            })?;
        done += buf.len() as u64;
    }
    Ok(done)
}

/// A reader's source that serves the chunks its node holds from the copy's temporary (filled with
/// verified bytes by [`fill`]) and every other byte from SRC.
pub(super) struct LocalFirst<'a> {
    pub(super) src: &'a dyn Source,
    pub(super) tmp: &'a File,
    pub(super) have: &'a [bool],
    pub(super) chunk_size: u64,
    /// Bytes served from the temporary (not read from SRC).
    pub(super) local: AtomicU64,
}

impl Source for LocalFirst<'_> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        let cs = self.chunk_size.max(1);
        let last = off + (buf.len() as u64).max(1) - 1;
        let held = (off / cs..=last / cs).all(|i| self.have.get(i as usize) == Some(&true));
        if held && !buf.is_empty() {
            let n = FileExt::read_at(self.tmp, buf, off)?;
            self.local.fetch_add(n as u64, Ordering::Relaxed);
            Ok(n)
        } else {
            self.src.read_at(buf, off)
        }
    }
    fn advise(&self, off: u64, len: u64, advice: rustix::fs::Advice) {
        self.src.advise(off, len, advice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_round_trip_and_bad_messages_hold_nothing() {
        let h = Held {
            file: None,
            have: vec![true, false, true, true, false, false, false, false, true],
        };
        let b = h.to_bits(9);
        assert_eq!(b.len(), 3);
        let got: Vec<bool> = (0..9).map(|i| bit(&b, i)).collect();
        assert_eq!(got, h.have);
        // empty, short or wrongly led messages: nothing held
        assert!(!bit(&[], 0));
        assert!(!bit(&[1], 0));
        assert!(!bit(&[0, 0xff], 0));
    }

    #[test]
    fn a_chunk_moves_unless_every_receiver_holds_it() {
        let a = Held {
            file: None,
            have: vec![true, true, false, false],
        }
        .to_bits(4);
        let b = Held {
            file: None,
            have: vec![true, false, true, false],
        }
        .to_bits(4);
        let none = Held::default().to_bits(4);
        // leaders 0 and 1 receive, leader 2 already has the pool (its message is ignored)
        let msgs = vec![a.clone(), b, none.clone()];
        assert_eq!(held_by_all(&msgs, &[0, 1], 4), [true, false, false, false]);
        assert_eq!(held_by_all(&msgs, &[0], 4), [true, true, false, false]);
        assert_eq!(held_by_all(&msgs, &[0, 2], 4), [false; 4]);
        assert_eq!(held_by_all(&msgs, &[], 4), [false; 4]);
        let m = swpool_format::pool::manifest::sample(&[7u8; 4 * 4096], 4096);
        let chunks: Vec<Chunk> = (0..4)
            .map(|i| Chunk {
                offset: i * 4096,
                len: 4096,
                expect: None,
            })
            .collect();
        let left = to_move(chunks, &m, &held_by_all(&msgs, &[0, 1], 4));
        assert_eq!(
            left.iter().map(|c| c.offset).collect::<Vec<_>>(),
            [4096, 8192, 12288]
        );
    }

    #[test]
    fn only_verified_chunks_are_held_and_filled() {
        let d = tempfile::tempdir().unwrap();
        let mut image = vec![0u8; 4 * 4096];
        for (i, b) in image.iter_mut().enumerate() {
            *b = (i / 4096) as u8 + 1;
        }
        let m = swpool_format::pool::manifest::sample(&image, 4096);
        let part = d.path().join("p.pool.part");
        let (s, _) =
            swpool_serve::LocalStore::open(&part, &m.digest, m.image_size, m.chunk_size).unwrap();
        s.write_chunk(0, &image[..4096]).unwrap();
        s.write_chunk(2, &[9u8; 4096]).unwrap(); // marked, but wrong bytes
        s.write_chunk(3, &image[3 * 4096..]).unwrap();
        s.flush().unwrap();
        drop(s);
        let held = scan(&m, &part);
        assert_eq!(held.have, [true, false, false, true]);
        let out_p = d.path().join("out");
        let out = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&out_p)
            .unwrap();
        out.set_len(image.len() as u64).unwrap();
        assert_eq!(fill(&m, &held, &out, &out_p).unwrap(), 8192);
        let got = std::fs::read(&out_p).unwrap();
        assert_eq!(got[..4096], image[..4096]);
        assert_eq!(got[3 * 4096..], image[3 * 4096..]);
        assert!(got[4096..3 * 4096].iter().all(|&b| b == 0));
        // the reader's source: held chunks from the temporary, the rest from SRC
        let src = tempfile::tempfile().unwrap();
        src.write_all_at(&image, 0).unwrap();
        let lf = LocalFirst {
            src: &src,
            tmp: &out,
            have: &held.have,
            chunk_size: 4096,
            local: AtomicU64::new(0),
        };
        let mut b = vec![0u8; 4096];
        for i in 0..4u64 {
            lf.read_at(&mut b, i * 4096).unwrap();
            assert_eq!(b[..], image[i as usize * 4096..][..4096]);
        }
        assert_eq!(lf.local.load(Ordering::Relaxed), 8192);
        // the partial copy changed after the scan: filling fails, naming the pool
        std::fs::OpenOptions::new()
            .write(true)
            .open(&part)
            .unwrap()
            .write_all_at(&[0u8; 4], 0)
            .unwrap();
        let e = fill(&m, &held, &out, &out_p).unwrap_err();
        assert!(e.1.contains("changed while it was being used"), "{}", e.1);
        // no partial copy, or another pool's: nothing held
        assert!(scan(&m, &d.path().join("none")).have.is_empty());
    }
}
