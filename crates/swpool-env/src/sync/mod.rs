//! A layer on the nodes of a job (seed 003's self-deployment): each node holds read-only copies of
//! a user's layer on node-local storage, one immutable directory per state ("generation"), and an
//! environment in the job stacks a fresh node-local upper over the copy it started with. Nodes
//! never write back into the user's layer.
//!
//! ```text
//! <node>/layers/<key>/<gen>/            one state of the layer's upper (read-only lower)
//! <node>/layers/<key>/<gen>.manifest    what it holds ([`Manifest`]; written before <gen>)
//! <node>/layers/<key>/<gen>.lock        held shared by every environment using <gen>
//! <node>/layers/<key>/current           symlink to the newest complete <gen>
//! <node>/layers/<key>/jobs/<job>        the <gen> synced for job <job>
//! <node>/layers/<key>/lock              held while a sync changes the directory
//! ```
//!
//! A state is made beside the others under a temporary name and renamed when complete and
//! verified, so a node has the old state or the new one, never a mix; `current` is replaced by a
//! rename. What moves between nodes is decided here ([`Manifest::needs`]): a file whose size,
//! mtime or mode differ from the node's current copy (SDEE compares size and mtime; the mode too,
//! since a `chmod` changes the file). Unchanged files are hard links to the previous state, so a
//! new state costs the changed files only.
//!
//! Whiteouts: the layer's upper records a deleted lower file as a character device 0/0 (or, from
//! fuse-overlayfs without that right, as `.wh.NAME`); the list names both `.wh.NAME`. The copy
//! makes the device (users may since Linux 5.8; measured here), which the kernel's overlay and
//! fuse-overlayfs both read, and the `.wh.NAME` file only where the kernel refuses it (then the
//! environment takes fuse-overlayfs: [`NodeCopies::has_whiteouts`]).

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// What an entry of a layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    /// A deleted lower file (`.wh.NAME` in the copy).
    Whiteout,
}

impl Kind {
    fn tag(self) -> char {
        match self {
            Kind::Dir => 'd',
            Kind::File => 'f',
            Kind::Symlink => 'l',
            Kind::Whiteout => 'w',
        }
    }
    fn from_tag(c: &str) -> Option<Kind> {
        Some(match c {
            "d" => Kind::Dir,
            "f" => Kind::File,
            "l" => Kind::Symlink,
            "w" => Kind::Whiteout,
            _ => return None,
        })
    }
}

/// One entry, relative to the layer's upper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The path relative to the root as the copy has it (a whiteout: `dir/.wh.NAME`).
    pub path: PathBuf,
    pub kind: Kind,
    /// Permission bits (`0o7777`).
    pub mode: u32,
    /// Regular files: the size.
    pub size: u64,
    /// Regular files: the mtime in nanoseconds since the epoch (directories: 0, they change with
    /// their entries).
    pub mtime_ns: i128,
    /// Symlinks: the target.
    pub target: Option<PathBuf>,
}

impl Entry {
    /// The same content: a file needs no transfer when this holds.
    fn same(&self, o: &Entry) -> bool {
        self == o
    }
}

/// Every entry of a layer's upper, in walk order (parents before children, names sorted).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub entries: Vec<Entry>,
}

/// A manifest line's fields are separated by spaces; paths are hex (any byte may be in a name).
const MAGIC: &str = "sw-pool-layer-manifest 1";
/// Bounds for untrusted manifests (a node's own file, or bytes from the reader).
const MAX_ENTRIES: usize = 10_000_000;
const MAX_PATH: usize = 4096;

impl Manifest {
    /// The manifest as text (what is stored and broadcast).
    pub fn encode(&self) -> Vec<u8> {
        let mut s = String::with_capacity(64 + self.entries.len() * 96);
        s.push_str(MAGIC);
        s.push('\n');
        for e in &self.entries {
            use std::fmt::Write;
            let _ = write!(
                s,
                "{} {:o} {} {} {}",
                e.kind.tag(),
                e.mode,
                e.size,
                e.mtime_ns,
                hex(e.path.as_os_str().as_bytes())
            );
            if let Some(t) = &e.target {
                s.push(' ');
                s.push_str(&hex(t.as_os_str().as_bytes()));
            }
            s.push('\n');
        }
        s.into_bytes()
    }

    /// Parse [`Manifest::encode`]'s text, defensively: bounded, every path relative and without
    /// `..`, parents listed before their entries, no path twice.
    pub fn decode(b: &[u8]) -> Result<Manifest, String> {
        let s = std::str::from_utf8(b).map_err(|_| "not UTF-8 text".to_string())?;
        let mut lines = s.lines();
        if lines.next() != Some(MAGIC) {
            return Err("not a layer manifest (bad first line)".into());
        }
        let mut entries = Vec::new();
        let mut seen: HashSet<PathBuf> = HashSet::new();
        let mut dirs: HashSet<PathBuf> = HashSet::new();
        for (i, line) in lines.enumerate() {
            let bad = |why: &str| format!("line {}: {why}", i + 2);
            if entries.len() >= MAX_ENTRIES {
                return Err(bad("too many entries"));
            }
            let f: Vec<&str> = line.split(' ').collect();
            let kind = f
                .first()
                .and_then(|t| Kind::from_tag(t))
                .ok_or_else(|| bad("unknown kind"))?;
            if f.len() != if kind == Kind::Symlink { 6 } else { 5 } {
                return Err(bad("wrong number of fields"));
            }
            let mode = u32::from_str_radix(f[1], 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| bad("bad mode"))?;
            let size: u64 = f[2].parse().map_err(|_| bad("bad size"))?;
            let mtime_ns: i128 = f[3].parse().map_err(|_| bad("bad mtime"))?;
            let path = PathBuf::from(OsString::from_vec(
                unhex(f[4]).ok_or_else(|| bad("bad path"))?,
            ));
            if !safe_rel(&path) {
                return Err(bad("path is not a plain relative path"));
            }
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                if !dirs.contains(parent) {
                    return Err(bad("entry before its directory"));
                }
            }
            if !seen.insert(path.clone()) {
                return Err(bad("path listed twice"));
            }
            if kind == Kind::Whiteout && !is_wh_name(path.file_name().unwrap_or_default()) {
                return Err(bad("a whiteout not named .wh.NAME"));
            }
            let target = match kind {
                Kind::Symlink => {
                    let t = unhex(f[5]).ok_or_else(|| bad("bad link target"))?;
                    if t.is_empty() || t.len() > MAX_PATH || t.contains(&0) {
                        return Err(bad("bad link target"));
                    }
                    Some(PathBuf::from(OsString::from_vec(t)))
                }
                _ => None,
            };
            if kind == Kind::Dir {
                dirs.insert(path.clone());
            }
            entries.push(Entry {
                path,
                kind,
                mode,
                size,
                mtime_ns,
                target,
            });
        }
        Ok(Manifest { entries })
    }

    /// The state's name: a digest of the manifest.
    pub fn generation(&self) -> String {
        let h = blake3::hash(&self.encode());
        h.to_hex()[..32].to_string()
    }

    /// Bytes of regular files.
    pub fn file_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.kind == Kind::File)
            .map(|e| e.size)
            .sum()
    }

    /// Indices of the regular files of `self` a node holding `have` must receive: new ones, and
    /// those whose size, mtime or mode changed.
    pub fn needs(&self, have: Option<&Manifest>) -> Vec<usize> {
        let old: std::collections::HashMap<&Path, &Entry> = have
            .map(|h| h.entries.iter().map(|e| (e.path.as_path(), e)).collect())
            .unwrap_or_default();
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == Kind::File)
            .filter(|(_, e)| !old.get(e.path.as_path()).is_some_and(|o| o.same(e)))
            .map(|(i, _)| i)
            .collect()
    }
}

pub(crate) fn is_wh_name(n: &OsStr) -> bool {
    let b = n.as_bytes();
    b.len() > 4 && b.starts_with(b".wh.") && !b.starts_with(b".wh..")
}

/// Relative, no `.`/`..`/root components, bounded.
fn safe_rel(p: &Path) -> bool {
    use std::path::Component;
    let len = p.as_os_str().len();
    len > 0
        && len <= MAX_PATH
        && !p.as_os_str().as_bytes().contains(&0)
        && p.components().all(|c| matches!(c, Component::Normal(_)))
}

fn hex(b: &[u8]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        s.push(H[(x >> 4) as usize] as char);
        s.push(H[(x & 15) as usize] as char);
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > MAX_PATH * 2 {
        return None;
    }
    let v = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(v(p[0])? << 4 | v(p[1])?))
        .collect()
}

/// A bit set over manifest indices, as bytes (what each node tells the others it needs).
pub fn encode_set(n: usize, set: &[usize]) -> Vec<u8> {
    let mut v = vec![0u8; n.div_ceil(8)];
    for &i in set.iter().filter(|&&i| i < n) {
        v[i / 8] |= 1 << (i % 8);
    }
    v
}

/// The union of several [`encode_set`] sets of `n` indices (a set of the wrong length is an error).
pub fn union_sets(n: usize, sets: &[Vec<u8>]) -> Result<Vec<usize>, String> {
    let mut u = vec![0u8; n.div_ceil(8)];
    for s in sets {
        if s.len() != u.len() {
            return Err(format!(
                "a node's list of needed files has {} bytes, not {}",
                s.len(),
                u.len()
            ));
        }
        for (a, b) in u.iter_mut().zip(s) {
            *a |= b;
        }
    }
    Ok((0..n).filter(|i| u[i / 8] & (1 << (i % 8)) != 0).collect())
}

mod node;
mod scan;
pub use node::{
    finish_files, of_job, prune_old_marks, remove_job_marks, remove_stale_runs, NodeCopies,
    MARK_MAX_AGE,
};

#[cfg(test)]
mod tests;
