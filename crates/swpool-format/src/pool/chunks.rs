//! Hashing an image's chunks, in parallel, skipping holes: used by `build` (to write the manifest)
//! and by `verify` (to check an image against it).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::manifest::{hash_chunk, Manifest};

/// Told how far a long pass over an image got: `(bytes just done, bytes in all)`; called from
/// several threads (a progress bar's `inc`).
pub type Progress<'a> = Option<&'a (dyn Fn(u64, u64) + Sync)>;

/// Hash every chunk of `file[0, image_size)`; `None` for holes and all-zero chunks.
/// Holes are found with SEEK_DATA/SEEK_HOLE and never read; chunks are hashed on all cores,
/// each worker with one chunk-sized buffer (memory: workers × chunk size).
///
/// Workers take the next unhashed chunk from a shared counter rather than a fixed share of the
/// image: with fixed shares one worker sat idle while the other finished its half (a fast half of
/// holes and metadata, or a core taken by another process), and the pass took as long as the
/// slower half.
pub fn hash_chunks(
    file: &File,
    image_size: u64,
    chunk_size: u64,
    progress: Progress,
) -> std::io::Result<Vec<Option<[u8; 32]>>> {
    let data = crate::sparse::data_ranges(file, image_size)?;
    let n = Manifest::chunk_count(image_size, chunk_size);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8)
        .min(n.max(1) as usize);
    let next = AtomicU64::new(0);
    let found = std::thread::scope(|scope| -> std::io::Result<Vec<(u64, [u8; 32])>> {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (data, next) = (&data, &next);
                scope.spawn(move || -> std::io::Result<Vec<(u64, [u8; 32])>> {
                    let mut buf = vec![0u8; chunk_size as usize];
                    let mut hint = 0usize; // each worker's chunk indexes increase: the hint stays valid
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok(out);
                        }
                        let start = i * chunk_size;
                        let end = (start + chunk_size).min(image_size);
                        if crate::sparse::overlaps_data(data, &(start..end), &mut hint) {
                            let b = &mut buf[..(end - start) as usize];
                            file.read_exact_at(b, start)?;
                            if !crate::sparse::is_all_zero(b) {
                                out.push((i, hash_chunk(b)));
                            }
                        }
                        if let Some(p) = progress {
                            p(end - start, image_size);
                        }
                    }
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in handles {
            all.extend(
                h.join()
                    .map_err(|_| std::io::Error::other("hash worker panicked"))??,
            );
        }
        Ok(all)
    })?;
    let mut results: Vec<Option<[u8; 32]>> = vec![None; n as usize];
    for (i, h) in found {
        results[i as usize] = Some(h);
    }
    Ok(results)
}

/// The chunks whose bytes differ from the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// Indexes of differing chunks (at most the first 1000 are kept).
    pub chunks: Vec<u64>,
    /// How many chunks differ in all.
    pub count: u64,
}

/// Check `file`'s image region against `m`, in one pass over the data (holes are not read).
pub fn verify_image(
    file: &File,
    m: &Manifest,
    progress: Progress,
) -> std::io::Result<Option<Mismatch>> {
    let got = hash_chunks(file, m.image_size, m.chunk_size, progress)?;
    let mut mm = Mismatch {
        chunks: Vec::new(),
        count: 0,
    };
    for (i, (g, want)) in got.iter().zip(&m.chunks).enumerate() {
        let same = match (g, want) {
            (None, None) => true,
            (Some(g), Some(w)) => hex::encode(g) == *w,
            _ => false,
        };
        if !same {
            mm.count += 1;
            if mm.chunks.len() < 1000 {
                mm.chunks.push(i as u64);
            }
        }
    }
    Ok((mm.count > 0).then_some(mm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    /// Whatever order the workers take chunks in, the result is the sequential one: holes and
    /// all-zero chunks `None`, a short last chunk hashed over its own length.
    #[test]
    fn parallel_hashes_equal_sequential_ones() {
        let chunk = 64u64 << 10;
        let len = 100 * chunk + 1234; // a short last chunk
        let mut f = tempfile::tempfile().unwrap();
        f.set_len(len).unwrap();
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for i in 0..101u64 {
            if i % 7 == 3 {
                continue; // a hole
            }
            let n = if i == 100 { 1234 } else { chunk as usize };
            let bytes: Vec<u8> = if i % 11 == 5 {
                vec![0; n] // written zeros: data on disk, but an all-zero chunk
            } else {
                (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect()
            };
            f.seek(SeekFrom::Start(i * chunk)).unwrap();
            f.write_all(&bytes).unwrap();
        }
        f.flush().unwrap();
        let mut want = Vec::new();
        for i in 0..101u64 {
            let n = (len - i * chunk).min(chunk) as usize;
            let mut b = vec![0u8; n];
            f.read_exact_at(&mut b, i * chunk).unwrap();
            want.push((!crate::sparse::is_all_zero(&b)).then(|| hash_chunk(&b)));
        }
        assert_eq!(hash_chunks(&f, len, chunk, None).unwrap(), want);
        assert!(want[3].is_none() && want[5].is_none() && want[100].is_some());
    }
}
