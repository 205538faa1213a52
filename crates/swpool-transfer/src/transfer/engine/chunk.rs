//! One chunk: read it (and check it against the manifest), land it on a receiving node (verify,
//! then write it sparse), and the copy on a single node.

use super::*;

/// A reader reads its own chunks only: no read-ahead by the kernel, which past the end of the
/// reader's range would fetch the next reader's chunks from shared storage a second time (requests
/// and bytes that grow with the number of readers). [`fetch_ahead`] keeps reads overlapped instead.
pub(super) fn read_only_the_range(job: &FileJob) {
    if let Some(f) = job.src {
        f.advise(0, 0, rustix::fs::Advice::Random);
    }
}

/// Start fetching the reader's next chunk `c` while it reads the current one.
pub(super) fn fetch_ahead(job: &FileJob, c: &Chunk) {
    if let Some(f) = job.src.filter(|_| c.len > 0) {
        f.advise(c.offset, u64::from(c.len), rustix::fs::Advice::WillNeed);
    }
}

/// Read chunk `c` into `buf`; returns its header (zero flag, hash).
pub(super) fn read_chunk(
    job: &FileJob,
    zero_hashes: &mut ZeroHashes,
    stats: &mut Stats,
    c: &Chunk,
    buf: &mut [u8],
) -> LocalResult<SlotHeader> {
    let t = Instant::now();
    let Some(src) = job.src else {
        return Err((
            ExitStatus::Internal,
            format!(
                "asked to read the chunk at offset {} of {} on a leader that did not open it",
                c.offset,
                job.src_path.display()
            ),
        ));
    };
    let len = c.len as usize;
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(PIECE);
        let off = c.offset + done as u64;
        match src.read_at(&mut buf[done..done + n], off) {
            Ok(0) => {
                return Err((
                    ExitStatus::BadInput,
                    format!(
                        "{} shrank while being copied (nothing at offset {off}); do not modify SRC during a copy",
                        job.src_path.display()
                    ),
                ))
            }
            Ok(k) => done += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(io_err(
                    &format!("cannot read {} at offset {off}", job.src_path.display()),
                    &e,
                ))
            }
        }
        job.watch.touch();
    }
    stats.bytes_read += len as u64;
    stats.read += t.elapsed();
    let data = &buf[..len];
    let tv = Instant::now();
    let zero = crate::sparse::is_all_zero(data);
    let hash = if !job.verify {
        [0u8; 32]
    } else if zero {
        if c.expect.is_some() {
            zero_hashes.get(len as u64)
        } else {
            [0u8; 32]
        }
    } else {
        crate::pool::manifest::hash_chunk(data)
    };
    stats.verify += tv.elapsed();
    if job.verify && job.verify_source {
        if let Some(e) = c.expect {
            if e != hash {
                return Err((
                    ExitStatus::InvalidPool,
                    format!(
                        "{} is damaged: the chunk at offset {} does not match its manifest hash; \
                         rebuild the pool or restore it",
                        job.src_path.display(),
                        c.offset
                    ),
                ));
            }
        }
    }
    Ok(SlotHeader {
        sent: if zero { 0 } else { c.len },
        zero,
        hash,
    })
}

/// Verify (unless `own`) and write one chunk's received bytes.
#[allow(clippy::too_many_arguments)]
pub(super) fn land(
    job: &FileJob,
    zero_hashes: &mut ZeroHashes,
    stats: &mut Stats,
    c: &Chunk,
    h: &SlotHeader,
    data: &[u8],
    own: bool,
    from: &str,
) -> LocalResult<()> {
    let tv = Instant::now();
    if h.zero {
        if let (true, Some(e)) = (job.verify, c.expect) {
            if zero_hashes.get(c.len as u64) != e {
                return Err((
                    ExitStatus::InvalidPool,
                    format!(
                        "the chunk at offset {} read by {from} is all zeros but the manifest says it holds data: \
                         SRC {} is damaged",
                        c.offset,
                        job.src_path.display()
                    ),
                ));
            }
        }
        return Ok(());
    }
    if data.len() != c.len as usize {
        return Err((
            ExitStatus::Internal,
            format!(
                "the chunk at offset {} from {from} has {} bytes, expected {}",
                c.offset,
                data.len(),
                c.len
            ),
        ));
    }
    if !own && job.verify {
        let got = crate::pool::manifest::hash_chunk(data);
        let want = c.expect.unwrap_or(h.hash);
        if got != want || (c.expect.is_some() && h.hash != want) {
            return Err((
                ExitStatus::System,
                format!(
                    "verification failed for the chunk at offset {} (sent by {from}): its hash \
                     does not match the {}; the data was damaged in transit or in memory",
                    c.offset,
                    if c.expect.is_some() {
                        "pool manifest"
                    } else {
                        "reader's hash"
                    }
                ),
            ));
        }
    }
    stats.verify += tv.elapsed();
    let tw = Instant::now();
    // write runs of non-zero blocks; all-zero blocks stay holes (the file was sized up front)
    let mut pos = 0usize;
    while pos < data.len() {
        let blk = |p: usize| &data[p..(p + SPARSE_BLOCK).min(data.len())];
        if crate::sparse::is_all_zero(blk(pos)) {
            pos += blk(pos).len();
            continue;
        }
        let mut end = pos;
        while end < data.len() && end - pos < 4 * PIECE && !crate::sparse::is_all_zero(blk(end)) {
            end += blk(end).len();
        }
        let off = c.offset + pos as u64;
        job.out.write_all_at(&data[pos..end], off).map_err(|e| {
            io_err(
                &format!("cannot write {} at offset {off}", job.out_path.display()),
                &e,
            )
        })?;
        stats.bytes_written += (end - pos) as u64;
        pos = end;
        job.watch.touch();
    }
    // start writing the chunk back now, so that the fsync before the commit finds little left to do
    job.out.start_writeback(c.offset, u64::from(c.len));
    stats.write += tw.elapsed();
    Ok(())
}

/// Copy on one node: read every chunk, verify it against the manifest (pools), write it sparse.
pub(crate) fn local(job: &FileJob, stats: &mut Stats) -> LocalResult<()> {
    let mut zero = ZeroHashes::default();
    let mut buf = vec![0u8; job.chunk_size as usize];
    let mut done = 0u64;
    for c in job.chunks {
        let h = read_chunk(job, &mut zero, stats, c, &mut buf)?;
        // our own bytes: verified at read (pools), nothing travelled
        land(
            job,
            &mut zero,
            stats,
            c,
            &h,
            &buf[..h.sent as usize],
            true,
            "",
        )?;
        done += c.len as u64;
        (job.progress)(done);
    }
    Ok(())
}
