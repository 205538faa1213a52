//! `sw-pool layer sync`: a user's layer onto node-local storage on every node of a job (seed 003's
//! self-deployment), read from where it lives once, and afterwards only what changed.
//!
//! Collective, every step agreed among the node leaders:
//! 1. node 0 lists the layer ([`Manifest::scan`]) and tells the others (the manifest names the new
//!    state: a digest of it);
//! 2. each node compares it with its current copy ([`Manifest::needs`]: files whose size, mtime or
//!    mode differ) and all learn the union of what the nodes need;
//! 3. the nodes that need a new state, and node 0 (the reader), prepare it beside their current one
//!    ([`NodeCopies::prepare`]: unchanged files hard-linked) and take part in one directory stream
//!    carrying the directories and the needed files only ([`super::dir`]: one reader, chunks
//!    hashed and checked on every receiver);
//! 4. every node checks its new tree against the manifest; only when all did, each installs it
//!    (rename) and switches `current` (rename): a node has the old state or the new one, never a
//!    mix, and a failure anywhere changes nothing anywhere.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use swpool_env::sync::{encode_set, finish_files, union_sets, Kind, Manifest, NodeCopies};
use swpool_format::status::ExitStatus;

use super::{engine, Algorithm, Stats, TransferError};
use crate::collective::{leader_value, Collective, Local};

/// What to sync.
#[derive(Debug, Clone)]
pub struct LayerSync {
    /// The layer's name (for messages and the node-local directory's name).
    pub name: String,
    /// The layer's directory (its identity on the nodes) and its `upper` (what is copied).
    pub layer_dir: PathBuf,
    pub upper: PathBuf,
    /// The user's node-local `layers` directory.
    pub node_layers: PathBuf,
    /// Mark the state as this job's (environments of the job then use it).
    pub job: Option<String>,
    pub chunk_size: u64,
}

/// What happened, the same on every rank.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LayerSyncReport {
    /// The state every node now holds.
    pub generation: String,
    /// Its path on every node.
    pub path: PathBuf,
    pub nodes: usize,
    /// Nodes that installed a new state (the others had it).
    pub nodes_updated: usize,
    pub files: usize,
    pub bytes: u64,
    /// Files and bytes that moved (the union of what the nodes lacked).
    pub files_sent: usize,
    pub bytes_sent: u64,
    /// Bytes read from the layer by the reader.
    pub bytes_read: u64,
    pub seconds: f64,
    /// Where the time went, on node 0, each phase ending when every node has agreed on it.
    #[serde(default)]
    pub phases: LayerPhases,
}

/// Seconds per phase of a sync ([`LayerSyncReport::phases`]; `layer sync --json`, bench/layer-sync.sh).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct LayerPhases {
    /// Node 0 lists the layer; the list reaches every node.
    pub list: f64,
    /// Every node compares it with its copy; the union of what they lack.
    pub plan: f64,
    /// Directories, links, whiteouts and hard links of the new state made.
    pub prepare: f64,
    /// The needed files streamed (read once, every chunk hashed and checked), modes and times set.
    pub stream: f64,
    /// Every node's tree checked against the list.
    pub check: f64,
    /// Renamed into place, marked for the job.
    pub install: f64,
}

fn env_err(e: swpool_env::EnvError) -> (ExitStatus, String) {
    (ExitStatus::System, e.to_string())
}

/// Sync `r` on every node of `job`. Collective: every rank calls it; only leaders do I/O.
pub fn sync_layer(job: &dyn Collective, r: &LayerSync) -> Result<LayerSyncReport, TransferError> {
    let _arm = job
        .is_leader()
        .then(|| job.watchdog().arm(job.whoami(), Duration::from_secs(600)));
    let mine = if job.is_leader() {
        Some(match leader_sync(job, r) {
            Ok(rep) => Ok(rep),
            Err(e) => Err((e.exit_status() as u8, e.to_string())),
        })
    } else {
        None
    };
    let got: Result<LayerSyncReport, (u8, String)> = if job.world_size() > 1 {
        leader_value(job, mine.as_ref())?
    } else {
        mine.expect("one rank is a leader")
    };
    got.map_err(|(_, message)| TransferError::Failed {
        message,
        status: ExitStatus::Collective,
    })
}

fn leader_sync(job: &dyn Collective, r: &LayerSync) -> Result<LayerSyncReport, TransferError> {
    let t0 = Instant::now();
    // 1. the manifest, from node 0
    let (scanned, bytes) = list_layer(job, r)?;
    let mut phases = LayerPhases::default();
    let mut mark = t0;
    let mut lap = || {
        let now = Instant::now();
        let d = now.duration_since(mark).as_secs_f64();
        mark = now;
        d
    };
    phases.list = lap();
    let m = layer_manifest(job, scanned, &bytes)?;
    let gen = m.generation();
    let here = job.node_path(&r.node_layers);

    // 2. what each node has and needs
    let Needs {
        nc,
        _lock,
        have,
        up_to_date,
        flags,
        union,
    } = agree_needs(job, r, &m, &gen, &here)?;
    phases.plan = lap();
    let mut report = LayerSyncReport {
        generation: gen.clone(),
        path: nc.state(&gen),
        nodes: job.nodes(),
        nodes_updated: flags.iter().filter(|u| !**u).count(),
        files: m.entries.iter().filter(|e| e.kind == Kind::File).count(),
        bytes: m.file_bytes(),
        files_sent: union.len(),
        bytes_sent: union.iter().map(|&i| m.entries[i].size).sum(),
        ..Default::default()
    };
    if report.nodes_updated == 0 {
        let marked: Local<()> = match &r.job {
            Some(j) => nc.mark_job(j, &gen).map_err(env_err),
            None => Ok(()),
        };
        job.leaders_agree(marked)?;
        report.seconds = t0.elapsed().as_secs_f64();
        return Ok(report);
    }

    // 3. prepare and stream (node 0 reads; it takes part even when it had the state)
    let member = !up_to_date || job.node_index() == 0;
    let incoming: HashSet<usize> = union.iter().copied().collect();
    let prepared = if member {
        nc.prepare(&m, have.as_ref(), &incoming)
            .map(Some)
            .map_err(env_err)
    } else {
        Ok(None)
    };
    job.leaders_agree(prepared.as_ref().map(|_| ()).map_err(Clone::clone))?;
    phases.prepare = lap();
    let tmp = prepared.expect("agreed");
    let plane = job.leaders_plane(member);
    let hosts: Vec<String> = (0..job.nodes())
        .filter(|&i| !flags[i] || i == 0)
        .map(|i| job.leader_host(i))
        .collect();
    // the needed files one after the other, moved as one file by the engine: node 0 reads (the
    // layer may exist on its node only), two pipelined trees, every chunk hashed and checked
    let layout = Arc::new(Layout::new(&m, &union));
    let source = (job.node_index() == 0 || !job.has_data_plane())
        .then(|| Concat::new(r.upper.clone(), layout.clone(), false));
    let mut stats = Stats::default();
    let streamed: Local<()> = match &tmp {
        None => Ok(()),
        Some(t) => {
            let s = Streamed {
                plane: plane.as_deref(),
                source: source.as_ref(),
                layout: &layout,
                hosts: &hosts,
            };
            s.stream(job, r, &m, &union, t.path(), &mut stats)
        }
    };
    drop(plane);
    // 4. check everywhere, then install everywhere
    let streamed = job.leaders_agree(streamed);
    phases.stream = lap();
    streamed?;
    let checked: Local<()> = match &tmp {
        Some(t) => nc.check(t, &m).map_err(env_err),
        None => Ok(()),
    };
    job.leaders_agree(checked)?;
    phases.check = lap();
    let installed: Local<()> = match tmp {
        Some(t) if !up_to_date => nc.install(t, &m, &gen).map(|_| ()).map_err(env_err),
        _ => Ok(()),
    }
    .and_then(|()| match &r.job {
        Some(j) => nc.mark_job(j, &gen).map_err(env_err),
        None => Ok(()),
    });
    job.leaders_agree(installed)?;
    phases.install = lap();
    report.phases = phases;
    // the states no environment holds any more (a running one keeps its own)
    nc.prune(&[gen.as_str()]);
    report.bytes_read = job
        .leaders_all_gather(&stats.bytes_read.to_le_bytes())?
        .iter()
        .map(|b| {
            b.get(..8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
        })
        .sum();
    report.seconds = t0.elapsed().as_secs_f64();
    Ok(report)
}

/// Step 1 of a sync: node 0 lists the layer and sends the list to the other leaders. Returns node
/// 0's own listing (`None` on the others) and what every leader received.
fn list_layer(
    job: &dyn Collective,
    r: &LayerSync,
) -> Result<(Option<Local<Manifest>>, Vec<u8>), TransferError> {
    let scanned: Option<Local<Manifest>> = (job.node_index() == 0).then(|| {
        Manifest::scan(&r.upper).map_err(|e| {
            (
                swpool_format::status::io_status(&e),
                format!("cannot list the layer {}: {e}", r.name),
            )
        })
    });
    let bytes = scanned.as_ref().map(|m| {
        let v: Result<Vec<u8>, (u8, &str)> = m
            .as_ref()
            .map(|m| m.encode())
            .map_err(|(s, msg)| (*s as u8, msg.as_str()));
        serde_json::to_vec(&v).expect("json")
    });
    let bytes = job.leaders_bcast(0, bytes.as_deref())?;
    Ok((scanned, bytes))
}

/// The layer's list on this leader: node 0's own (`scanned`), or the one it sent (`bytes`); node
/// 0's failure is every leader's.
fn layer_manifest(
    job: &dyn Collective,
    scanned: Option<Local<Manifest>>,
    bytes: &[u8],
) -> Result<Manifest, TransferError> {
    let manifest: Local<Manifest> = match scanned {
        Some(own) => own,
        None => match serde_json::from_slice::<Result<Vec<u8>, (u8, String)>>(bytes) {
            Ok(Ok(b)) => Manifest::decode(&b).map_err(|e| {
                (
                    ExitStatus::Internal,
                    format!("the layer's list from {} is bad: {e}", job.leader_host(0)),
                )
            }),
            Ok(Err((_, m))) => Err((ExitStatus::Collective, m)),
            Err(e) => Err((ExitStatus::Internal, format!("bad layer list: {e}"))),
        },
    };
    manifest.map_err(|(status, message)| TransferError::Failed {
        message: format!("{}: {message}", job.leader_host(0)),
        status,
    })
}

/// What the nodes have and need of a sync's new state, agreed among the leaders (step 2).
struct Needs {
    /// This node's copies of the layer, locked for the whole sync.
    nc: NodeCopies,
    _lock: swpool_sys::lock::FileLock,
    /// This node's current state and its list.
    have: Option<(String, Manifest)>,
    /// This node holds the new state already.
    up_to_date: bool,
    /// Per node: it holds the new state already.
    flags: Vec<bool>,
    /// The entries of the list some node lacks.
    union: Vec<usize>,
}

/// Step 2 of a sync: open and lock this node's copies of the layer under `here`, compare its
/// current state with `m` (state `gen`), and learn what every node needs.
fn agree_needs(
    job: &dyn Collective,
    r: &LayerSync,
    m: &Manifest,
    gen: &str,
    here: &std::path::Path,
) -> Result<Needs, TransferError> {
    let n = m.entries.len();
    let opened: Local<(NodeCopies, swpool_sys::lock::FileLock)> =
        NodeCopies::open(here, &r.name, &r.layer_dir)
            .and_then(|nc| nc.lock().map(|l| (nc, l)))
            .map_err(env_err);
    let (have, need) = match &opened {
        Ok((nc, _)) => {
            let have = nc.current();
            let need = match &have {
                Some((g, _)) if *g == gen => Vec::new(),
                Some((_, hm)) => m.needs(Some(hm)),
                None => m.needs(None),
            };
            (have, need)
        }
        Err(_) => (None, Vec::new()),
    };
    let up_to_date = have.as_ref().is_some_and(|(g, _)| *g == gen);
    job.leaders_agree(opened.as_ref().map(|_| ()).map_err(Clone::clone))?;
    let (nc, _lock) = opened.expect("agreed");
    let mut msg = encode_set(n, &need);
    msg.push(u8::from(up_to_date));
    let all = job.leaders_all_gather(&msg)?;
    let flags: Vec<bool> = all.iter().map(|v| v.last() == Some(&1)).collect();
    let sets: Vec<Vec<u8>> = all
        .iter()
        .map(|v| v[..v.len().saturating_sub(1)].to_vec())
        .collect();
    let union = union_sets(n, &sets).map_err(|e| TransferError::Failed {
        message: e,
        status: ExitStatus::Internal,
    })?;
    Ok(Needs {
        nc,
        _lock,
        have,
        up_to_date,
        flags,
        union,
    })
}

/// What the stream of a sync (step 3) moves the needed files with.
struct Streamed<'a> {
    /// Among the leaders that take part (`None`: this one only).
    plane: Option<&'a dyn crate::plane::DataPlane>,
    /// The layer's files, on the leader that reads them.
    source: Option<&'a Concat>,
    layout: &'a Arc<Layout>,
    /// Hostname per member of `plane`.
    hosts: &'a [String],
}

impl Streamed<'_> {
    /// Step 3 of a sync on a leader that takes part: the needed files of `m` (`union`) streamed
    /// into the new state `tmp`, then given their modes and times.
    fn stream(
        &self,
        job: &dyn Collective,
        r: &LayerSync,
        m: &Manifest,
        union: &[usize],
        tmp: &std::path::Path,
        stats: &mut Stats,
    ) -> Local<()> {
        let chunks: Vec<super::plan::Chunk> =
            super::plan::grid(0..self.layout.len, r.chunk_size).collect();
        let sink = Concat::new(tmp.to_path_buf(), self.layout.clone(), true);
        let fj = engine::FileJob {
            src: self.source.map(|s| s as &dyn engine::Source),
            src_path: &r.upper,
            out: &sink,
            out_path: tmp,
            chunks: &chunks,
            chunk_size: r.chunk_size,
            verify_source: false,
            verify: true,
            hosts: self.hosts,
            progress: &|_| {},
            bench_slots: None,
            watch: job.watchdog(),
        };
        let moved = if chunks.is_empty() {
            Ok(())
        } else {
            match self.plane.filter(|c| c.size() > 1) {
                Some(c) => engine::distribute(c, &fj, Algorithm::TwoTree, stats),
                None => engine::local(&fj, stats),
            }
        };
        moved.and_then(|()| finish_files(tmp, m, union).map_err(env_err))
    }
}

/// The files a sync moves, one after the other: `(path relative to the root, offset, length)`.
struct Layout {
    files: Vec<(PathBuf, u64, u64)>,
    len: u64,
}

impl Layout {
    fn new(m: &Manifest, moved: &[usize]) -> Layout {
        let mut files = Vec::new();
        let mut off = 0u64;
        for &i in moved {
            let e = &m.entries[i];
            if e.size > 0 {
                files.push((e.path.clone(), off, e.size));
                off += e.size;
            }
        }
        Layout { files, len: off }
    }

    /// The file holding byte `off` (< `len`).
    fn find(&self, off: u64) -> usize {
        self.files.partition_point(|(_, start, _)| *start <= off) - 1
    }
}

/// The files of a [`Layout`] under `root` as one file: the source on the reader, the sink on every
/// receiver. A few files stay open (the engine reads and writes in order).
struct Concat {
    root: PathBuf,
    layout: Arc<Layout>,
    write: bool,
    open: Mutex<Vec<(usize, Arc<File>)>>,
}

const OPEN_FILES: usize = 8;

impl Concat {
    fn new(root: PathBuf, layout: Arc<Layout>, write: bool) -> Concat {
        Concat {
            root,
            layout,
            write,
            open: Mutex::new(Vec::new()),
        }
    }

    fn file(&self, i: usize) -> std::io::Result<Arc<File>> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, f)) = open.iter().find(|(k, _)| *k == i) {
            return Ok(f.clone());
        }
        let p = self.root.join(&self.layout.files[i].0);
        // the sink creates its files (in the sync's private temporary state; `prepare` made the
        // directories)
        let f = std::fs::OpenOptions::new()
            .read(!self.write)
            .write(self.write)
            .create(self.write)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
        let f = Arc::new(f);
        if open.len() >= OPEN_FILES {
            open.remove(0);
        }
        open.push((i, f.clone()));
        Ok(f)
    }

    /// Visit the pieces of `off .. off + len` file by file: `(file, offset in it, range in the
    /// buffer)`; `f` returns how many bytes it did (fewer: stop there).
    fn pieces(
        &self,
        off: u64,
        len: usize,
        mut f: impl FnMut(&File, usize, u64, std::ops::Range<usize>) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        let mut done = 0usize;
        for (i, within, r) in self.plan(off, len) {
            let n = r.len();
            let k = f(&*self.file(i)?, i, within, r)?;
            done += k;
            if k < n {
                break;
            }
        }
        Ok(done)
    }
}

/// A chunk spanning at least this many files is read by [`READERS`] threads at once: small files
/// one after the other cost a round trip each to the shared storage (open, read).
const PARALLEL_FROM: usize = 16;
const READERS: usize = 8;

impl Concat {
    fn shorter(&self, i: usize) -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "{} is shorter than when the sync listed it: do not change a layer while it is synced",
                self.root.join(&self.layout.files[i].0).display()
            ),
        )
    }

    /// The files of `off .. off + len`, as [`Self::pieces`] visits them, without opening them.
    fn plan(&self, off: u64, len: usize) -> Vec<(usize, u64, std::ops::Range<usize>)> {
        let mut v = Vec::new();
        let mut done = 0usize;
        while done < len && off + (done as u64) < self.layout.len {
            let pos = off + done as u64;
            let i = self.layout.find(pos);
            let (_, start, flen) = &self.layout.files[i];
            let within = pos - start;
            let n = (len - done).min((flen - within) as usize);
            v.push((i, within, done..done + n));
            done += n;
        }
        v
    }

    /// Read `pieces` (consecutive ranges of `buf` from 0) with [`READERS`] threads, each opening
    /// its files itself (not through the shared cache: no lock held across an open).
    fn read_parallel(
        &self,
        buf: &mut [u8],
        pieces: &[(usize, u64, std::ops::Range<usize>)],
    ) -> std::io::Result<usize> {
        let total = pieces.last().map_or(0, |p| p.2.end);
        let mut rest = &mut buf[..total];
        let mut work: Vec<(usize, u64, &mut [u8])> = Vec::with_capacity(pieces.len());
        for (i, within, r) in pieces {
            let (a, b) = std::mem::take(&mut rest).split_at_mut(r.len());
            work.push((*i, *within, a));
            rest = b;
        }
        let per = work.len().div_ceil(READERS);
        std::thread::scope(|sc| {
            let handles: Vec<_> = work
                .chunks_mut(per)
                .map(|group| {
                    sc.spawn(move || -> std::io::Result<()> {
                        for (i, within, dst) in group.iter_mut() {
                            let p = self.root.join(&self.layout.files[*i].0);
                            let f = std::fs::OpenOptions::new()
                                .read(true)
                                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                                .open(&p)
                                .map_err(|e| {
                                    std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
                                })?;
                            let mut got = 0;
                            while got < dst.len() {
                                let k =
                                    FileExt::read_at(&f, &mut dst[got..], *within + got as u64)?;
                                if k == 0 {
                                    return Err(self.shorter(*i));
                                }
                                got += k;
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a reader thread panicked")))
            })
        })?;
        Ok(total)
    }
}

impl engine::Source for Concat {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        let plan = self.plan(off, buf.len());
        if plan.len() >= PARALLEL_FROM {
            return self.read_parallel(buf, &plan);
        }
        self.pieces(off, buf.len(), |f, i, at, r| {
            let k = FileExt::read_at(f, &mut buf[r.clone()], at)?;
            if k == 0 {
                return Err(self.shorter(i));
            }
            Ok(k)
        })
    }
}

impl engine::Sink for Concat {
    fn write_all_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        let n = self.pieces(off, buf.len(), |f, _, at, r| {
            FileExt::write_all_at(f, &buf[r.clone()], at).map(|()| r.len())
        })?;
        if n < buf.len() {
            return Err(std::io::Error::other(format!(
                "a write past the end of the layer's files ({} bytes at offset {off})",
                buf.len()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    use super::*;
    use crate::collective::fake::{FakeCluster, FakeRank};

    fn layer(root: &Path) -> PathBuf {
        let up = root.join("dev/upper");
        fs::create_dir_all(up.join("usr/local/bin")).unwrap();
        fs::create_dir_all(up.join("etc")).unwrap();
        fs::write(up.join("usr/local/bin/tool"), b"#!/bin/sh\necho tool\n").unwrap();
        fs::write(up.join("usr/local/big"), vec![5u8; 300_000]).unwrap();
        // zeros the transfer leaves unwritten: a file of them only, and one ending in them
        fs::write(up.join("usr/local/zeros"), vec![0u8; 200_000]).unwrap();
        let mut tail = b"abc".to_vec();
        tail.resize(150_000, 0);
        fs::write(up.join("usr/local/tailz"), tail).unwrap();
        fs::write(up.join("etc/.wh.motd"), b"").unwrap();
        std::os::unix::fs::symlink("bin/tool", up.join("usr/local/t")).unwrap();
        up
    }

    fn req(root: &Path, job: &str) -> LayerSync {
        // each node's private directory (the cache's `sw-pool-<uid>`)
        for n in 0..8 {
            fs::create_dir_all(root.join(format!("node{n}"))).unwrap();
        }
        LayerSync {
            name: "dev".into(),
            layer_dir: root.join("dev"),
            upper: root.join("dev/upper"),
            node_layers: root.join("node%n/layers"),
            job: Some(job.into()),
            chunk_size: 64 << 10,
        }
    }

    fn copies(root: &Path, node: usize) -> NodeCopies {
        NodeCopies::open(
            &root.join(format!("node{node}/layers")),
            "dev",
            &root.join("dev"),
        )
        .unwrap()
    }

    fn sync_all(nodes: usize, r: &LayerSync) -> Vec<Result<LayerSyncReport, String>> {
        FakeCluster::run(nodes, 2, |rank: &FakeRank| {
            sync_layer(rank, r).map_err(|e| e.to_string())
        })
    }

    /// First sync: everything moves once; again: nothing; one file changed: that file only, the
    /// rest hard-linked; every node ends on the same state, the old one pruned.
    /// A chunk over many small files reads them with several threads; the bytes are the files'
    /// in order, and a file shorter than listed is named.
    #[test]
    fn a_chunk_of_many_small_files_reads_in_parallel_and_in_order() {
        let d = tempfile::tempdir().unwrap();
        let up = d.path().join("upper");
        fs::create_dir_all(up.join("s")).unwrap();
        let mut want = Vec::new();
        for k in 0..100u8 {
            let body = vec![k; 100 + usize::from(k)];
            fs::write(up.join(format!("s/f{k:03}")), &body).unwrap();
            want.extend(body);
        }
        let m = Manifest::scan(&up).unwrap();
        let moved: Vec<usize> = (0..m.entries.len())
            .filter(|&i| m.entries[i].kind == Kind::File)
            .collect();
        let layout = Arc::new(Layout::new(&m, &moved));
        let src = Concat::new(up.clone(), layout.clone(), false);
        let mut buf = vec![0u8; want.len() + 10];
        // from an offset inside the third file, to the end
        let n = engine::Source::read_at(&src, &mut buf, 250).unwrap();
        assert_eq!(n, want.len() - 250);
        assert_eq!(&buf[..n], &want[250..]);
        assert!(src.plan(250, buf.len()).len() >= PARALLEL_FROM);
        fs::write(up.join("s/f050"), b"short").unwrap();
        let e = engine::Source::read_at(&src, &mut buf, 0).unwrap_err();
        assert!(e.to_string().contains("f050 is shorter"), "{e}");
    }

    #[test]
    fn full_then_nothing_then_the_change() {
        let t = tempfile::tempdir().unwrap();
        let up = layer(t.path());
        let r = req(t.path(), "7");
        let out = sync_all(4, &r);
        let rep = out[0].clone().unwrap();
        assert!(out
            .iter()
            .all(|o| o.as_ref().unwrap().generation == rep.generation));
        assert_eq!((rep.nodes, rep.nodes_updated), (4, 4));
        assert_eq!((rep.files, rep.files_sent), (4, 4));
        assert_eq!(rep.bytes_sent, 300_000 + 20 + 200_000 + 150_000);
        for n in 0..4 {
            let c = copies(t.path(), n);
            let s = c.for_job("7").unwrap();
            assert_eq!(
                fs::read(s.join("usr/local/big")).unwrap(),
                vec![5u8; 300_000]
            );
            assert_eq!(
                fs::read(s.join("usr/local/zeros")).unwrap(),
                vec![0u8; 200_000]
            );
            let tail = fs::read(s.join("usr/local/tailz")).unwrap();
            assert_eq!((tail.len(), &tail[..3]), (150_000, &b"abc"[..]));
            // the deletion in the kernel's form (the kernel's overlay reads it too)
            let wh = fs::symlink_metadata(s.join("etc/motd")).unwrap();
            assert!(
                std::os::unix::fs::FileTypeExt::is_char_device(&wh.file_type()) && wh.rdev() == 0,
                "{wh:?}"
            );
            assert_eq!(
                fs::read_link(s.join("usr/local/t")).unwrap(),
                Path::new("bin/tool")
            );
            assert_eq!(
                fs::metadata(s.join("usr/local/bin/tool")).unwrap().mode() & 0o777,
                0o644
            );
        }
        let again = sync_all(4, &r)[0].clone().unwrap();
        assert_eq!((again.nodes_updated, again.files_sent), (0, 0));
        assert_eq!(again.generation, rep.generation);
        // one file changes
        fs::write(up.join("usr/local/big"), vec![6u8; 1000]).unwrap();
        let r2 = req(t.path(), "8");
        let next = sync_all(4, &r2)[0].clone().unwrap();
        assert_ne!(next.generation, rep.generation);
        assert_eq!(
            (next.nodes_updated, next.files_sent, next.bytes_sent),
            (4, 1, 1000)
        );
        for n in 0..4 {
            let c = copies(t.path(), n);
            let s = c.for_job("8").unwrap();
            assert_eq!(fs::read(s.join("usr/local/big")).unwrap(), vec![6u8; 1000]);
            // job 7's state went: no environment held it
            assert!(c.for_job("7").is_none());
            assert_eq!(c.current().unwrap().0, next.generation);
        }
    }

    /// A new node (no copy) gets everything while the others take part in one stream.
    #[test]
    fn a_node_without_a_copy() {
        let t = tempfile::tempdir().unwrap();
        layer(t.path());
        let r = req(t.path(), "1");
        sync_all(3, &r);
        crate::atomic::TempDir::create(&t.path().join("x"), "y").ok();
        swpool_env::layer::remove_tree(&t.path().join("node2/layers")).unwrap();
        let rep = sync_all(3, &r)[0].clone().unwrap();
        assert_eq!((rep.nodes_updated, rep.files_sent), (1, 4));
        assert!(copies(t.path(), 2).for_job("1").is_some());
    }

    /// A node that cannot hold the copy fails the sync on every rank with one message naming it,
    /// and no node's current state changes.
    #[test]
    fn one_node_fails_all_fail_nothing_changes() {
        let t = tempfile::tempdir().unwrap();
        let up = layer(t.path());
        let r = req(t.path(), "1");
        let first = sync_all(3, &r)[0].clone().unwrap();
        fs::write(up.join("usr/local/new"), b"new").unwrap();
        // node 1's copies directory is taken by a file
        let d1 = copies(t.path(), 1).dir().to_path_buf();
        swpool_env::layer::remove_tree(&d1).unwrap();
        fs::write(&d1, b"in the way").unwrap();
        let out = sync_all(3, &r);
        let msgs: Vec<String> = out.iter().map(|o| o.clone().unwrap_err()).collect();
        assert!(msgs.iter().all(|m| m == &msgs[0]), "{msgs:?}");
        assert!(msgs[0].contains("fake1"), "{}", msgs[0]);
        for n in [0, 2] {
            assert_eq!(copies(t.path(), n).current().unwrap().0, first.generation);
        }
    }
}
