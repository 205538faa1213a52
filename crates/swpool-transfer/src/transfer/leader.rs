//! The copy on a node leader: identity, preflight, transfer, commit, each step agreed among the
//! leaders.

use std::path::Path;
use std::time::Instant;

use super::prepare::{preflight, Prepared};
use super::source::{
    chunk_list, holds_identical, inspect_src, known_tail, target_path, write_stamp, Kind, SrcInfo,
};
use super::{
    bad, dir, engine, plan, reuse, Algorithm, CopyOptions, CopyReport, Stats, TransferError,
};
use crate::collective::{Collective, Local};
use crate::pool::manifest::Manifest;
use swpool_format::status::ExitStatus;

pub(super) fn leader_copy(
    job: &dyn Collective,
    src: &Path,
    dest: &Path,
    opts: &CopyOptions,
) -> Result<CopyReport, TransferError> {
    let t0 = Instant::now();
    let pf = job.watchdog().phase("preflight");
    // 1. leader 0 inspects SRC and tells the others (and keeps the file open: its transfer reads
    // from it)
    let mut src0: Option<std::fs::File> = None;
    let info = share_src_info(job, src, opts, &mut src0)?;
    // testing on one machine: `%n` in DEST stands for the (fake) node index
    let dest = job.node_path(dest);
    let target = target_path(src, &dest, info.kind);
    let need = !holds_identical(&info, &target);
    // who needs it
    let needs: Vec<bool> = job
        .leaders_all_gather(&[u8::from(need)])?
        .into_iter()
        .map(|b| b.first() == Some(&1))
        .collect();
    let receivers: Vec<usize> = (0..needs.len()).filter(|&i| needs[i]).collect();
    let mut report = CopyReport {
        nodes: job.nodes(),
        nodes_received: receivers.len(),
        kind: format!("{:?}", info.kind).to_lowercase(),
        bytes_total: if info.kind == Kind::Directory {
            info.data_bytes
        } else {
            info.len
        },
        bytes_data: info.data_bytes,
        chunk_size: info.chunk_size,
        dest: target.clone(),
        ..Default::default()
    };
    if receivers.is_empty() {
        report.skipped_all = true;
        report.phases.preflight = t0.elapsed();
        report.phases.total = t0.elapsed();
        return Ok(report);
    }
    // 2. preflight on the receivers. Only the leaders that read part of SRC open it (and so touch
    // shared storage at all): the first receiver, which also reads a directory whole, and, for a
    // file, every receiver that owns chunks. With more nodes than chunks the others only receive,
    // so a small pool's load makes the same storage requests on 8 nodes as on 1,000.
    // (Without MPI among the leaders, e.g. the in-memory cluster of the unit tests, every receiver
    // copies SRC itself.)
    // what the receivers already hold of a pool (an on-demand run's partial copy): a chunk every
    // receiver holds does not move
    let reuse_of = info.manifest.as_ref().filter(|_| opts.reuse_partial);
    let part = crate::cache::partial_path(&target);
    let c = LeaderCopy {
        job,
        src,
        opts,
        info: &info,
        target: &target,
        need,
        receivers: &receivers,
        reuse_of,
    };
    let Preflight {
        chunks,
        held,
        algo,
        prepared,
    } = c.preflight(&part, &mut src0)?;
    drop(pf);
    report.phases.preflight = t0.elapsed();

    // 3. transfer among the receivers
    let t1 = Instant::now();
    let tcomm = job.leaders_plane(need);
    let hosts: Vec<String> = receivers.iter().map(|&i| job.leader_host(i)).collect();
    let total_bytes = match reuse_of {
        Some(_) => chunks.iter().map(|c| c.len as u64).sum(),
        None => info.data_bytes,
    };
    let sink = opts
        .progress_sink
        .clone()
        .filter(|_| opts.progress && job.world_rank() == 0);
    let progress = move |done: u64| {
        if let Some(s) = &sink {
            s(done, total_bytes);
        }
    };
    let mut moving = Moving {
        plane: tcomm.as_deref(),
        chunks: &chunks,
        held: &held,
        algo,
        hosts: &hosts,
        progress: &progress,
        stats: Stats::default(),
        reused: 0,
        algorithm: None,
    };
    let transferred = moving.transfer(&c, prepared.as_ref());
    let Moving {
        stats,
        reused,
        algorithm,
        ..
    } = moving;
    // fsync before agreeing
    let tc = Instant::now();
    let ready: Local<()> = transferred.and_then(|()| match &prepared {
        Some(Prepared::File { out, tmp, .. }) => out.sync_all().map_err(|e| {
            bad(
                ExitStatus::System,
                format!("cannot fsync {}: {e}", tmp.path().display()),
            )
        }),
        Some(Prepared::Dir(td)) => td.sync(),
        None => Ok(()),
    });
    report.phases.distribute = match stats.pipeline {
        // read, verify and write ran in their own threads, overlapping the network
        Some(wall) => wall,
        None => t1
            .elapsed()
            .saturating_sub(stats.read + stats.write + stats.verify + tc.elapsed()),
    };
    report.phases.overlapped = stats.pipeline.is_some();
    report.phases.wait_src = stats.wait_src;
    report.phases.wait_dest = stats.wait_dest;
    let _c = job.watchdog().phase("commit");
    // 4. all-or-nothing
    job.leaders_agree(ready)?;
    job.leaders_agree(c.commit(prepared))?;
    if need && reuse_of.is_some() {
        // the entry holds every chunk now: the partial copy has served its purpose
        swpool_serve::store::remove(&part);
    }
    report.phases.commit = tc.elapsed();
    report.phases.read = stats.read;
    report.phases.write = stats.write;
    report.phases.verify = stats.verify;
    report.algorithm = algorithm;
    add_totals(job, &mut report, &stats, reused)?;
    report.phases.total = t0.elapsed();
    Ok(report)
}

/// Step 1 of a copy: leader 0 inspects SRC (and checks it against the authorization) and tells
/// the other leaders; leader 0's failure is every leader's. Leader 0 keeps SRC open in `src0`.
fn share_src_info(
    job: &dyn Collective,
    src: &Path,
    opts: &CopyOptions,
    src0: &mut Option<std::fs::File>,
) -> Result<SrcInfo, TransferError> {
    let info: Option<Local<SrcInfo>> = (job.node_index() == 0).then(|| {
        let (i, f) = inspect_src(src, opts.chunk_size, opts.src_file.as_deref())?;
        *src0 = f;
        match &opts.authorized {
            Some(a) => a.check(src, &i).map(|()| i),
            None => Ok(i),
        }
    });
    let mine = info.as_ref().map(|i| {
        let v: Result<&SrcInfo, (u8, &str)> = i.as_ref().map_err(|(s, m)| (*s as u8, m.as_str()));
        serde_json::to_vec(&v).expect("json")
    });
    let bytes = job.leaders_bcast(0, mine.as_deref())?;
    let info: Local<SrcInfo> = match info {
        Some(own) => own,
        None => match serde_json::from_slice::<Result<SrcInfo, (u8, String)>>(&bytes) {
            Ok(Ok(i)) => Ok(i),
            Ok(Err((_, m))) => Err(bad(ExitStatus::Collective, m)),
            Err(e) => Err(bad(ExitStatus::Internal, format!("bad SRC info: {e}"))),
        },
    };
    info.map_err(|(status, m)| TransferError::Failed {
        message: format!("{}: {m}", job.leader_host(0)),
        status,
    })
}

/// What the steps of a copy on a leader share once SRC is known and some leader needs it.
struct LeaderCopy<'a> {
    job: &'a dyn Collective,
    src: &'a Path,
    opts: &'a CopyOptions,
    info: &'a SrcInfo,
    /// DEST's final path on this node.
    target: &'a Path,
    /// This node needs SRC.
    need: bool,
    /// The node indices of the leaders that need it.
    receivers: &'a [usize],
    /// The pool whose chunks held by every receiver do not move (`--reuse-partial`).
    reuse_of: Option<&'a Manifest>,
}

/// What the preflight (step 2) decided and made.
struct Preflight {
    /// The chunks that move.
    chunks: Vec<plan::Chunk>,
    /// What this node holds of a pool already (in its partial copy `part`).
    held: reuse::Held,
    algo: Algorithm,
    /// The temporary on a receiver, with SRC open on a reader.
    prepared: Option<Prepared>,
}

impl LeaderCopy<'_> {
    /// Step 2 of a copy: the chunks that move (a pool's chunks every receiver holds in its partial
    /// copy `part` do not), the algorithm, which leaders read SRC, and the preflight on the
    /// receivers (the temporary made; leader 0's `src0` handed on when it reads), agreed among the
    /// leaders.
    fn preflight(
        &self,
        part: &Path,
        src0: &mut Option<std::fs::File>,
    ) -> Result<Preflight, TransferError> {
        let job = self.job;
        let chunks = chunk_list(self.info);
        let (held, chunks) = match self.reuse_of {
            Some(m) => {
                let held = match self.need {
                    true => reuse::scan(m, part),
                    false => reuse::Held::default(),
                };
                let msgs = job.leaders_all_gather(&held.to_bits(m.chunks.len()))?;
                let all = reuse::held_by_all(&msgs, self.receivers, m.chunks.len());
                (held, reuse::to_move(chunks, m, &all))
            }
            None => (reuse::Held::default(), chunks),
        };
        let algo = self
            .opts
            .algorithm
            .unwrap_or_else(|| Algorithm::choose(self.receivers.len(), chunks.len()));
        // the two trees have one reader; the other algorithms one per chunk, up to one per leader
        let readers = match algo {
            Algorithm::TwoTree => 1,
            _ => self.receivers.len(),
        };
        let reader = match job.has_data_plane() {
            true => reads_src(
                self.receivers,
                job.node_index(),
                self.info.kind,
                chunks.len(),
                readers,
            ),
            false => self.need,
        };
        let prepared = if self.need {
            let opened = if reader { src0.take() } else { None };
            preflight(
                self.info,
                self.src,
                opened,
                self.target,
                reader,
                self.opts.authorized.is_some(),
            )
            .map(Some)
        } else {
            Ok(None)
        };
        let (prepared, local) = match prepared {
            Ok(p) => (p, Ok(())),
            Err(e) => (None, Err(e)),
        };
        job.leaders_agree(local)?;
        Ok(Preflight {
            chunks,
            held,
            algo,
            prepared,
        })
    }

    /// Step 4 of a copy, once every leader has its temporary written and synced: stamp it and
    /// rename it to the target.
    fn commit(&self, prepared: Option<Prepared>) -> Local<()> {
        let (info, target) = (self.info, self.target);
        match prepared {
            None => Ok(()),
            Some(Prepared::File { tmp, out, src: _ }) => {
                let p = tmp.path().to_path_buf();
                let stamped = if info.kind == Kind::File {
                    // the stamp names DEST's final size and mtime (renaming keeps both)
                    write_stamp(info, &p)
                } else {
                    Ok(())
                };
                stamped.and_then(|()| {
                    tmp.commit(out).map_err(|e| {
                        bad(
                            ExitStatus::System,
                            format!("cannot rename {} to {}: {e}", p.display(), target.display()),
                        )
                    })
                })
            }
            Some(Prepared::Dir(td)) => {
                td.commit(target, info.mode, info.mtime_ns, |p| write_stamp(info, p))
            }
        }
    }
}

/// What the transfer among the receivers (step 3) works with, and what it counts.
struct Moving<'a> {
    /// Among the receivers (`None`, or a plane of one: this leader copies alone).
    plane: Option<&'a dyn crate::plane::DataPlane>,
    chunks: &'a [plan::Chunk],
    held: &'a reuse::Held,
    algo: Algorithm,
    /// Hostname per receiver.
    hosts: &'a [String],
    progress: &'a (dyn Fn(u64) + Sync),
    stats: Stats,
    /// Bytes of a pool this node held already and copied from its partial copy.
    reused: u64,
    /// The algorithm the data moved with among the leaders (none when it was copied alone).
    algorithm: Option<Algorithm>,
}

impl Moving<'_> {
    /// Step 3 of a copy: SRC into this receiver's temporary (`prepared`), a file by the engine, a
    /// directory as one stream.
    fn transfer(&mut self, c: &LeaderCopy, prepared: Option<&Prepared>) -> Local<()> {
        match prepared {
            None => Ok(()),
            Some(Prepared::File { tmp, out, src: f }) => {
                self.transfer_file(c, tmp.path(), out, f.as_ref())
            }
            Some(Prepared::Dir(td)) => {
                let comm = self.plane.filter(|c| c.size() > 1);
                if comm.is_some() {
                    self.algorithm = Some(Algorithm::Bcast);
                }
                dir::transfer(
                    comm,
                    c.src,
                    td.path(),
                    c.info.chunk_size,
                    self.hosts,
                    &mut self.stats,
                    self.progress,
                    c.job.watchdog(),
                )
            }
        }
    }

    /// A file into the temporary `tmp` (open as `out`): a reader's SRC `f` checked against the
    /// authorized trailer, a pool's trailer and the chunks this node holds written first, then the
    /// chunks moved among the receivers.
    fn transfer_file(
        &mut self,
        c: &LeaderCopy,
        tmp: &Path,
        out: &std::fs::File,
        f: Option<&std::fs::File>,
    ) -> Local<()> {
        let (src, opts, info) = (c.src, c.opts, c.info);
        // a reader's SRC (opened in preflight) must end in the authorized trailer
        let src_f = match (f, &opts.authorized) {
            (Some(f), Some(a)) => a.check_file(src, f).map(|()| Some(f)),
            (f, _) => Ok(f),
        };
        // a pool's trailer: written from the bytes every leader already has
        let src_f = src_f.and_then(|f| match known_tail(info)? {
            Some((off, tail)) => {
                use std::os::unix::fs::FileExt;
                out.write_all_at(&tail, off).map_err(|e| {
                    bad(
                        swpool_format::status::io_status(&e),
                        format!("cannot write {}: {e}", tmp.display()),
                    )
                })?;
                self.stats.bytes_written += tail.len() as u64;
                Ok(f)
            }
            None => Ok(f),
        });
        // the chunks this node holds, verified again while copied into the temporary
        let src_f = src_f.and_then(|f| match c.reuse_of {
            Some(m) => {
                self.reused = reuse::fill(m, self.held, out, tmp)?;
                self.stats.bytes_written += self.reused;
                Ok(f)
            }
            None => Ok(f),
        });
        let src_f = src_f?;
        // a reader serves the chunks its node holds from the temporary
        let local_first = src_f.map(|f| reuse::LocalFirst {
            src: f as &dyn engine::Source,
            tmp: out,
            have: &self.held.have,
            chunk_size: info.chunk_size,
            local: Default::default(),
        });
        let fj = engine::FileJob {
            src: local_first.as_ref().map(|l| l as &dyn engine::Source),
            src_path: src,
            out,
            out_path: tmp,
            chunks: self.chunks,
            chunk_size: info.chunk_size,
            verify_source: opts.verify_source_chunks,
            verify: opts.verify_chunks,
            hosts: self.hosts,
            progress: self.progress,
            bench_slots: opts.bench_slots,
            watch: c.job.watchdog(),
        };
        let moved = match self.plane.filter(|c| c.size() > 1) {
            Some(p) => {
                self.algorithm = Some(self.algo);
                engine::distribute(p, &fj, self.algo, &mut self.stats)
            }
            None => engine::local(&fj, &mut self.stats),
        };
        // what the reader took from its own copy was not read from SRC
        if let Some(l) = &local_first {
            let local = l.local.load(std::sync::atomic::Ordering::Relaxed);
            self.stats.bytes_read = self.stats.bytes_read.saturating_sub(local);
        }
        moved
    }
}

/// The byte counts of all leaders added up into `report` (this one's: `stats`, `reused`).
fn add_totals(
    job: &dyn Collective,
    report: &mut CopyReport,
    stats: &Stats,
    reused: u64,
) -> Result<(), TransferError> {
    let mine = [
        stats.bytes_read,
        stats.bytes_sent,
        stats.bytes_written,
        reused,
    ];
    let mut totals = [0u64; 4];
    let mine_b: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    for b in job.leaders_all_gather(&mine_b)? {
        for (i, c) in b.chunks_exact(8).take(4).enumerate() {
            totals[i] += u64::from_le_bytes(c.try_into().expect("8 bytes"));
        }
    }
    report.bytes_read_from_src = totals[0];
    report.bytes_sent = totals[1];
    report.bytes_written = totals[2];
    report.bytes_reused = totals[3];
    Ok(())
}

/// Whether the leader of node `me` reads SRC (opens it on shared storage): the first of the
/// `receivers` always does (it reads a directory whole, and checks that SRC is readable before any
/// temporary is made); for a file, every one of the first `readers` receivers that owns at least
/// one of the `chunks` (the transfer ranks follow the order of `receivers`, as
/// [`plan::owner_range`] assigns chunks).
fn reads_src(receivers: &[usize], me: usize, kind: Kind, chunks: usize, readers: usize) -> bool {
    match receivers.iter().position(|&i| i == me) {
        Some(0) => true,
        Some(k) if kind != Kind::Directory && k < readers => {
            !plan::owner_range(chunks, readers, k).is_empty()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_leaders_that_own_chunks_read_a_file() {
        // 8 receivers, 3 chunks, every leader a possible reader (the ring): the first three read,
        // the other five never open SRC
        let all: Vec<usize> = (0..8).collect();
        let r: Vec<bool> = (0..8)
            .map(|i| reads_src(&all, i, Kind::File, 3, 8))
            .collect();
        assert_eq!(r, [true, true, true, false, false, false, false, false]);
        // as many chunks as receivers or more: everyone reads
        assert!((0..8).all(|i| reads_src(&all, i, Kind::File, 8, 8)));
        assert!((0..8).all(|i| reads_src(&all, i, Kind::File, 100, 8)));
        // one reader (the two trees): the first receiver only
        let r: Vec<bool> = (0..8)
            .map(|i| reads_src(&all, i, Kind::File, 14, 1))
            .collect();
        assert_eq!(r, [true, false, false, false, false, false, false, false]);
        // an empty file: the first receiver still opens it (readability, trailer)
        let r: Vec<bool> = (0..8)
            .map(|i| reads_src(&all, i, Kind::File, 0, 8))
            .collect();
        assert_eq!(r, [true, false, false, false, false, false, false, false]);
        // the transfer ranks are the positions among the receivers, not node indices
        let some = [1usize, 4, 6];
        assert!(reads_src(&some, 1, Kind::File, 2, 3));
        assert!(reads_src(&some, 4, Kind::File, 2, 3));
        assert!(!reads_src(&some, 6, Kind::File, 2, 3));
        assert!(!reads_src(&some, 4, Kind::File, 100, 1));
        // a node that needs nothing never reads
        assert!(!reads_src(&some, 0, Kind::File, 100, 3));
        // a directory: only the first receiver
        assert!(reads_src(&some, 1, Kind::Directory, 100, 3));
        assert!(!reads_src(&some, 4, Kind::Directory, 100, 3));
    }

    #[test]
    fn small_files_on_many_leaders_take_the_two_trees() {
        // the storm's 14-chunk pool: the ring on 2 leaders, the trees from 3 on
        assert_eq!(Algorithm::choose(2, 14), Algorithm::Ring);
        assert_eq!(Algorithm::choose(4, 14), Algorithm::TwoTree);
        assert_eq!(Algorithm::choose(8, 14), Algorithm::TwoTree);
        // 1 GiB of 1 MiB chunks: the ring up to 255 leaders, the trees from 256
        assert_eq!(Algorithm::choose(8, 1024), Algorithm::Ring);
        assert_eq!(Algorithm::choose(255, 1024), Algorithm::Ring);
        assert_eq!(Algorithm::choose(256, 1024), Algorithm::TwoTree);
        assert_eq!(Algorithm::choose(1024, 10240), Algorithm::Ring);
        // two leaders: the trees would be one chain, the ring has two readers
        assert_eq!(Algorithm::choose(2, 1), Algorithm::Ring);
    }
}
