//! Who reads what in a job's view: the nodes that list each directory ([`Readers`]) and the
//! virtual image of the files with each chunk's owner ([`Layout`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::view::{Kind, Snapshot};

/// The fewest files of one directory a node reads from storage ([`Layout::with_owners`]).
pub const RUN: usize = 32;

/// The fewest subdirectories of one directory a node lists in the shared walk ([`Readers`]).
pub const RUN_DIRS: usize = 4;

/// The fewest chunks of one large file a node reads from storage ([`Layout::owner`]): a file of
/// more chunks is read in runs of at least this many by its owner and the next nodes, so that
/// one node does not read and answer a job's large libraries alone (bench/results/
/// storm-job-20261129-readers, 8 × 4: node1 read 13.4 of numpy's 14.6 MB and sent 702 answers).
pub const RUN_CHUNKS: u64 = 8;

/// Which node lists each directory in the shared walk ([`super::walk_shared`], which gives them
/// back with its snapshot) and reads the files in it ([`Layout::with_owners`]): the node that listed its parent, and past [`RUN_DIRS`]
/// subdirectories of one directory, runs of them to the next nodes, so that the levels below
/// spread over the nodes. A node's storage client resolves each path component it has not
/// resolved before with a request: with directory `k` of a level listed by node `k mod nodes`
/// every node resolved nearly every directory (bench/results/storm-job-20261129-owners: 676
/// lookups on one node, 1,611 on 8).
#[derive(Debug)]
pub struct Readers {
    nodes: usize,
    by_path: HashMap<PathBuf, usize>,
}

impl Readers {
    pub fn new(nodes: usize) -> Readers {
        Readers {
            nodes: nodes.max(1),
            by_path: HashMap::new(),
        }
    }

    /// The nodes that list a level's directories (paths below the root, as the walk gives them:
    /// the children of one directory next to each other), remembered for the next level.
    pub fn level(&mut self, dirs: &[PathBuf]) -> Vec<usize> {
        let n = self.nodes;
        let mut out = vec![0usize; dirs.len()];
        let mut k = 0;
        while k < dirs.len() {
            let parent = dirs[k].parent();
            let m = dirs[k..]
                .iter()
                .take_while(|d| d.parent() == parent)
                .count();
            let base = parent.and_then(|p| self.lister(p)).unwrap_or(0);
            for j in 0..m {
                out[k + j] = in_runs(base, j, m, RUN_DIRS, n);
            }
            k += m;
        }
        for (d, r) in dirs.iter().zip(&out) {
            self.by_path.insert(d.clone(), *r);
        }
        out
    }

    /// The node that listed directory `dir` (a path below the root), once its level was listed.
    pub fn lister(&self, dir: &Path) -> Option<usize> {
        self.by_path.get(dir).copied()
    }

    /// The nodes of the job.
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

/// Item `j` of `m` (a directory's subdirectories or files) cut into runs of at least `run`, on up
/// to `nodes` nodes from node `base` on: the node it goes to.
fn in_runs(base: usize, j: usize, m: usize, run: usize, nodes: usize) -> usize {
    let runs = m.div_ceil(run).clamp(1, nodes);
    (base + j * runs / m) % nodes
}

/// The virtual image of a job's view (see the module's documentation).
#[derive(Debug, Clone)]
pub struct Layout {
    /// Bytes before the first file: the encoding's length (u64), the encoding, then zeros.
    pub head: u64,
    pub chunk: u64,
    /// The image's size (the end of its last file).
    pub size: u64,
    /// (start, node index) of every regular file of at least one byte, by start.
    files: Vec<(u64, u32)>,
    /// The node that reads each of `files` from storage ([`Layout::with_owners`]); none yet:
    /// chunk `i`'s is node `i mod nodes`.
    owners: Vec<u32>,
    /// A file's start by node index.
    starts: HashMap<u32, u64>,
}

/// The next multiple of `a` at or after `x`.
fn align(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

impl Layout {
    /// The layout of `snap` whose encoding is `encoded` bytes long.
    pub fn new(snap: &Snapshot, encoded: u64, chunk: u64) -> Layout {
        let head = align(8 + encoded, chunk);
        let mut at = head;
        let mut files = Vec::new();
        let mut starts = HashMap::new();
        for (i, n) in snap.nodes.iter().enumerate() {
            if n.kind == Kind::File && n.size > 0 {
                files.push((at, i as u32));
                starts.insert(i as u32, at);
                at = align(at.saturating_add(n.size), chunk);
            }
        }
        Layout {
            head,
            chunk,
            size: at,
            files,
            starts,
            owners: Vec::new(),
        }
    }

    /// The layout with each file's owner among the nodes of `listers` (the shared walk's): the
    /// one node that reads it from storage (all its chunks, but see [`Layout::owner`] for a
    /// large file). A directory's files go to the node
    /// that listed it, or, past [`RUN`] files, in runs of at least `RUN` to it and the next nodes.
    /// A node that reads a file opens the directories above it, so the storage requests of a
    /// job grow with the nodes that read below each directory: with owners by chunk
    /// (`i mod nodes`) every node opened nearly every directory (bench/results/
    /// storm-job-20261129-opath: 160 requests more per node).
    pub fn with_owners(mut self, snap: &Snapshot, listers: &Readers) -> Layout {
        let n = listers.nodes();
        // each directory's files (positions in `files`), directories by their first file
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_of: HashMap<u32, usize> = HashMap::new();
        for (k, (_, idx)) in self.files.iter().enumerate() {
            let parent = snap.nodes[*idx as usize].parent;
            let g = *group_of.entry(parent).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[g].push(k);
        }
        let mut owners = vec![0u32; self.files.len()];
        for g in &groups {
            let parent = snap.nodes[self.files[g[0]].1 as usize].parent;
            let base = listers
                .lister(&snap.nodes[parent as usize].path)
                .unwrap_or(0);
            for (j, &k) in g.iter().enumerate() {
                owners[k] = in_runs(base, j, g.len(), RUN, n) as u32;
            }
        }
        self.owners = owners;
        self
    }

    /// The node among `nodes` that reads chunk `i` from storage (and answers the others' asks):
    /// its file's owner, or for a file of more than [`RUN_CHUNKS`] chunks, runs of its chunks
    /// from its owner on.
    pub fn owner(&self, i: u64, nodes: usize) -> usize {
        let n = nodes.max(1);
        match self.file_at(i) {
            Some((k, at)) if !self.owners.is_empty() => {
                let (start, _) = self.files[k];
                let end = self.files.get(k + 1).map_or(self.size, |f| f.0);
                let m = (end - start) / self.chunk;
                let j = (at - start) / self.chunk;
                // one run (the owner's) for a file of at most RUN_CHUNKS chunks
                in_runs(
                    self.owners[k] as usize,
                    j as usize,
                    m as usize,
                    RUN_CHUNKS as usize,
                    n,
                )
            }
            _ => (i % n as u64) as usize,
        }
    }

    /// The file chunk `i` begins in: its place in `files`, and the chunk's offset in the image.
    fn file_at(&self, i: u64) -> Option<(usize, u64)> {
        let at = i.checked_mul(self.chunk)?;
        if at < self.head || at >= self.size {
            return None;
        }
        let k = self
            .files
            .partition_point(|(s, _)| *s <= at)
            .checked_sub(1)?;
        Some((k, at))
    }

    /// Chunks of the image.
    pub fn chunks(&self) -> u64 {
        self.size.div_ceil(self.chunk)
    }

    /// Where file `idx`'s bytes start.
    pub fn start(&self, idx: u32) -> Option<u64> {
        self.starts.get(&idx).copied()
    }

    /// Chunk `i` of a file: (the file's node index, the chunk's offset in the file, its bytes).
    pub fn piece(&self, snap: &Snapshot, i: u64) -> Option<(u32, u64, u32)> {
        let (k, at) = self.file_at(i)?;
        let (start, idx) = self.files[k];
        let size = snap.nodes[idx as usize].size;
        let off = at - start;
        (off < size).then(|| (idx, off, (size - off).min(self.chunk) as u32))
    }
}
