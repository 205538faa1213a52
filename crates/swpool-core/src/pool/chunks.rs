//! Hashing an image's chunks, in parallel, skipping holes: used by `build` (to write the manifest)
//! and by `verify` (to check an image against it).

use std::fs::File;
use std::os::unix::fs::FileExt;

use super::manifest::{hash_chunk, Manifest};

/// Hash every chunk of `file[0, image_size)`; `None` for holes and all-zero chunks.
/// Holes are found with SEEK_DATA/SEEK_HOLE and never read; chunks are hashed on all cores,
/// each worker with one chunk-sized buffer (memory: workers × chunk size).
pub fn hash_chunks(
    file: &File,
    image_size: u64,
    chunk_size: u64,
) -> std::io::Result<Vec<Option<[u8; 32]>>> {
    let data = crate::sparse::data_ranges(file, image_size)?;
    let n = Manifest::chunk_count(image_size, chunk_size) as usize;
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8)
        .min(n.max(1));
    let mut results: Vec<Option<[u8; 32]>> = vec![None; n];
    let slices: Vec<(usize, &mut [Option<[u8; 32]>])> = {
        // interleave by blocks of chunks so each worker reads a contiguous stretch at a time
        let per = n.div_ceil(workers.max(1)).max(1);
        results
            .chunks_mut(per)
            .enumerate()
            .map(|(k, s)| (k * per, s))
            .collect()
    };
    std::thread::scope(|scope| -> std::io::Result<()> {
        let mut handles = Vec::new();
        for (first, slice) in slices {
            let data = &data;
            handles.push(scope.spawn(move || -> std::io::Result<()> {
                let mut buf = vec![0u8; chunk_size as usize];
                let mut hint = 0usize;
                for (k, slot) in slice.iter_mut().enumerate() {
                    let i = (first + k) as u64;
                    let start = i * chunk_size;
                    let end = (start + chunk_size).min(image_size);
                    if !crate::sparse::overlaps_data(data, &(start..end), &mut hint) {
                        continue;
                    }
                    let b = &mut buf[..(end - start) as usize];
                    file.read_exact_at(b, start)?;
                    if !crate::sparse::is_all_zero(b) {
                        *slot = Some(hash_chunk(b));
                    }
                }
                Ok(())
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| std::io::Error::other("hash worker panicked"))??;
        }
        Ok(())
    })?;
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
pub fn verify_image(file: &File, m: &Manifest) -> std::io::Result<Option<Mismatch>> {
    let got = hash_chunks(file, m.image_size, m.chunk_size)?;
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
