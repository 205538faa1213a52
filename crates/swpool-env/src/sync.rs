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
//! Whiteouts: the layer's upper records a deleted lower file as a character device 0/0, which a
//! user cannot create outside a user namespace; the copy records it as `.wh.NAME`, the other form
//! fuse-overlayfs reads in a lower.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::EnvError;

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
    /// Walk `upper` (not following symlinks). Special files other than whiteouts (sockets, fifos,
    /// devices) are skipped with a warning; an unreadable directory is an error naming it.
    pub fn scan(upper: &Path) -> io::Result<Manifest> {
        let mut entries = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = upper.join(&rel);
            let mut names: Vec<OsString> = fs::read_dir(&dir)
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
            names.sort();
            let mut subdirs = Vec::new();
            for name in names {
                let r = rel.join(&name);
                let p = upper.join(&r);
                let m = fs::symlink_metadata(&p)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?;
                let ft = m.file_type();
                let mode = m.mode() & 0o7777;
                let e = if ft.is_dir() {
                    subdirs.push(r.clone());
                    Entry {
                        path: r,
                        kind: Kind::Dir,
                        mode,
                        size: 0,
                        mtime_ns: 0,
                        target: None,
                    }
                } else if ft.is_symlink() {
                    Entry {
                        path: r,
                        kind: Kind::Symlink,
                        mode: 0o777,
                        size: 0,
                        mtime_ns: 0,
                        target: Some(fs::read_link(&p)?),
                    }
                } else if ft.is_file() && is_wh_name(&name) {
                    // fuse-overlayfs' other form of a whiteout
                    Entry {
                        path: r,
                        kind: Kind::Whiteout,
                        mode: 0,
                        size: 0,
                        mtime_ns: 0,
                        target: None,
                    }
                } else if ft.is_file() {
                    Entry {
                        path: r,
                        kind: Kind::File,
                        mode,
                        size: m.len(),
                        mtime_ns: i128::from(m.mtime()) * 1_000_000_000
                            + i128::from(m.mtime_nsec()),
                        target: None,
                    }
                } else if ft.is_char_device() && m.rdev() == 0 {
                    let mut wh = OsString::from(".wh.");
                    wh.push(&name);
                    Entry {
                        path: rel.join(wh),
                        kind: Kind::Whiteout,
                        mode: 0,
                        size: 0,
                        mtime_ns: 0,
                        target: None,
                    }
                } else {
                    tracing::warn!(path = %p.display(), "skipping a special file in the layer (socket, fifo or device)");
                    continue;
                };
                entries.push(e);
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(Manifest { entries })
    }

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

fn is_wh_name(n: &OsStr) -> bool {
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
    if s.len() % 2 != 0 || s.len() > MAX_PATH * 2 {
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

/// The copies of one layer on this node.
#[derive(Debug, Clone)]
pub struct NodeCopies {
    dir: PathBuf,
}

const CURRENT: &str = "current";

impl NodeCopies {
    /// The directory for the layer at `layer_dir` (named `name`) under the user's node-local
    /// `layers` directory (created 0700).
    pub fn open(layers: &Path, name: &str, layer_dir: &Path) -> Result<NodeCopies, EnvError> {
        let key = format!(
            "{name}-{}",
            &blake3::hash(layer_dir.as_os_str().as_bytes()).to_hex()[..16]
        );
        let dir = layers.join(key);
        for d in [layers, dir.as_path(), &dir.join("jobs")] {
            match fs::DirBuilder::new().mode(0o700).create(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(EnvError::io("cannot create", d, e)),
            }
            let m = fs::symlink_metadata(d).map_err(|e| EnvError::io("cannot read", d, e))?;
            if !m.is_dir() || m.uid() != rustix::process::getuid().as_raw() || m.mode() & 0o022 != 0
            {
                return Err(EnvError::NotYours {
                    path: d.to_path_buf(),
                    why: "not a private directory".into(),
                    uid: rustix::process::getuid().as_raw(),
                });
            }
        }
        Ok(NodeCopies { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of state `gen`.
    pub fn state(&self, gen: &str) -> PathBuf {
        self.dir.join(gen)
    }

    /// Take the directory's lock (a sync changes it).
    pub fn lock(&self) -> Result<swpool_sys::lock::FileLock, EnvError> {
        let p = self.dir.join("lock");
        swpool_sys::lock::FileLock::exclusive(&p).map_err(|e| EnvError::io("cannot lock", p, e))
    }

    /// The current state and its manifest, if a complete one is here.
    pub fn current(&self) -> Option<(String, Manifest)> {
        let gen = fs::read_link(self.dir.join(CURRENT)).ok()?;
        let gen = gen.to_str()?.to_string();
        if !valid_gen(&gen) || !self.state(&gen).is_dir() {
            return None;
        }
        let m = Manifest::decode(&fs::read(self.dir.join(format!("{gen}.manifest"))).ok()?).ok()?;
        Some((gen, m))
    }

    /// The state synced for job `job`, if it is complete and here.
    pub fn for_job(&self, job: &str) -> Option<PathBuf> {
        if !valid_job(job) {
            return None;
        }
        let gen = fs::read_to_string(self.dir.join("jobs").join(job)).ok()?;
        let gen = gen.trim();
        (valid_gen(gen) && self.state(gen).is_dir()).then(|| self.state(gen))
    }

    /// Record that job `job` uses state `gen`.
    pub fn mark_job(&self, job: &str, gen: &str) -> Result<(), EnvError> {
        if !valid_job(job) {
            return Err(EnvError::Unsupported(format!("bad job id {job:?}")));
        }
        let p = self.dir.join("jobs").join(job);
        swpool_sys::atomic::write_file(&p, format!("{gen}\n").as_bytes(), true)
            .map_err(|e| EnvError::io("cannot write", p, e))
    }

    /// Start state `m` in a temporary directory: every directory made, every file of `m` not in
    /// `incoming` hard-linked from the current state `have` (it is the same there), whiteouts
    /// and symlinks made. The files in `incoming` are then extracted into it; [`Self::commit`]
    /// checks and moves it into place.
    pub fn prepare(
        &self,
        m: &Manifest,
        have: Option<&(String, Manifest)>,
        incoming: &HashSet<usize>,
    ) -> Result<swpool_sys::atomic::TempDir, EnvError> {
        let t = swpool_sys::atomic::TempDir::create(&self.dir.join("state"), "tmp")
            .map_err(|e| EnvError::io("cannot create a temporary directory in", &self.dir, e))?;
        let root = t.path().to_path_buf();
        let old_root = have.map(|(g, _)| self.state(g));
        for (i, e) in m.entries.iter().enumerate() {
            let p = root.join(&e.path);
            let r = match e.kind {
                Kind::Dir => fs::DirBuilder::new().mode(0o700).create(&p),
                Kind::Symlink => {
                    std::os::unix::fs::symlink(e.target.as_deref().unwrap_or(Path::new("")), &p)
                }
                Kind::Whiteout => fs::File::create(&p)
                    .and_then(|_| fs::set_permissions(&p, fs::Permissions::from_mode(0))),
                Kind::File if incoming.contains(&i) => Ok(()),
                Kind::File => match &old_root {
                    Some(o) => fs::hard_link(o.join(&e.path), &p),
                    None => Err(io::Error::other("no earlier copy to link from")),
                },
            };
            r.map_err(|x| EnvError::io("cannot make", &p, x))?;
        }
        Ok(t)
    }

    /// Check the tree in `t` against `m` (every entry there, with its kind, size, mode and mtime;
    /// nothing else), give directories their modes, and move it into place as state `gen`; then
    /// make it the current state.
    pub fn commit(
        &self,
        t: swpool_sys::atomic::TempDir,
        m: &Manifest,
        gen: &str,
    ) -> Result<PathBuf, EnvError> {
        let root = t.path().to_path_buf();
        // directories: modes last, deepest first (a read-only directory would stop the others)
        for e in m.entries.iter().rev().filter(|e| e.kind == Kind::Dir) {
            let p = root.join(&e.path);
            fs::set_permissions(&p, fs::Permissions::from_mode(e.mode | 0o700))
                .map_err(|x| EnvError::io("cannot chmod", &p, x))?;
        }
        let got = Manifest::scan(&root).map_err(|e| EnvError::io("cannot read", &root, e))?;
        let want: Vec<Entry> = m
            .entries
            .iter()
            .map(|e| Entry {
                mode: if e.kind == Kind::Dir { e.mode | 0o700 } else { e.mode },
                ..e.clone()
            })
            .collect();
        if got.entries != want {
            let first = want
                .iter()
                .zip(got.entries.iter())
                .find(|(a, b)| a != b)
                .map(|(a, _)| a.path.display().to_string())
                .unwrap_or_else(|| "the number of entries".into());
            return Err(EnvError::Unsupported(format!(
                "the copy of the layer made in {} does not match the layer (first difference: {first}); nothing was changed",
                root.display()
            )));
        }
        let mpath = self.dir.join(format!("{gen}.manifest"));
        swpool_sys::atomic::write_file(&mpath, &m.encode(), true)
            .map_err(|e| EnvError::io("cannot write", &mpath, e))?;
        let dest = self.state(gen);
        if dest.is_dir() {
            // the same state is here already (made by an earlier sync): keep it
            drop(t);
        } else {
            t.commit(&dest, false)
                .map_err(|e| EnvError::io("cannot move into place", &dest, e))?;
        }
        let tmp_link = self.dir.join(format!(".current.{}", std::process::id()));
        let _ = fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(gen, &tmp_link)
            .and_then(|()| fs::rename(&tmp_link, self.dir.join(CURRENT)))
            .map_err(|e| EnvError::io("cannot switch to the new state", &self.dir, e))?;
        Ok(dest)
    }

    /// Remove states other than `keep` that no environment uses (their lock is free).
    pub fn prune(&self, keep: &[&str]) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            let Some(gen) = name.to_str().filter(|g| valid_gen(g)) else {
                continue;
            };
            if keep.contains(&gen) {
                continue;
            }
            let lock = self.dir.join(format!("{gen}.lock"));
            let free = match fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock)
            {
                Ok(f) => rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                    .is_ok(),
                Err(_) => false,
            };
            if free {
                let _ = crate::layer::remove_tree(&e.path());
                let _ = fs::remove_file(self.dir.join(format!("{gen}.manifest")));
                let _ = fs::remove_file(&lock);
            }
        }
    }

    /// Hold state `gen` for an environment's life (shared: [`Self::prune`] leaves it alone).
    pub fn hold(&self, gen_dir: &Path) -> Result<fs::File, EnvError> {
        let gen = gen_dir
            .file_name()
            .and_then(|g| g.to_str())
            .filter(|g| valid_gen(g))
            .ok_or_else(|| EnvError::Unsupported(format!("{} is not a layer state", gen_dir.display())))?;
        let lock = self.dir.join(format!("{gen}.lock"));
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|e| EnvError::io("cannot open", &lock, e))?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockShared)
            .map_err(|e| EnvError::io("cannot lock", &lock, e.into()))?;
        Ok(f)
    }
}

fn valid_gen(g: &str) -> bool {
    g.len() == 32 && g.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

fn valid_job(j: &str) -> bool {
    !j.is_empty() && j.len() <= 64 && j.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
        && !j.starts_with('.')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let u = t.path();
        fs::create_dir_all(u.join("usr/local/bin")).unwrap();
        fs::write(u.join("usr/local/bin/hello"), b"#!/bin/sh\necho hi\n").unwrap();
        fs::set_permissions(u.join("usr/local/bin/hello"), fs::Permissions::from_mode(0o755))
            .unwrap();
        fs::write(u.join("usr/local/data"), vec![7u8; 10_000]).unwrap();
        std::os::unix::fs::symlink("bin/hello", u.join("usr/local/h")).unwrap();
        fs::create_dir(u.join("etc")).unwrap();
        fs::write(u.join("etc/.wh.motd"), b"").unwrap();
        t
    }

    #[test]
    fn manifest_round_trips_and_names_a_state() {
        let t = tree();
        let m = Manifest::scan(t.path()).unwrap();
        assert_eq!(m.entries.len(), 8);
        let d = Manifest::decode(&m.encode()).unwrap();
        assert_eq!(d, m);
        assert_eq!(d.generation(), m.generation());
        assert_eq!(m.file_bytes(), 10_000 + 18);
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let ok = format!("{MAGIC}\nd 755 0 0 {}\n", hex(b"a"));
        assert!(Manifest::decode(ok.as_bytes()).is_ok());
        for bad in [
            format!("{MAGIC}\nf 644 1 0 {}\n", hex(b"../x")),
            format!("{MAGIC}\nf 644 1 0 {}\n", hex(b"/etc/passwd")),
            format!("{MAGIC}\nf 644 1 0 {}\n", hex(b"a/b")), // parent not listed
            format!("{MAGIC}\nf 644 1 0 {}\nf 644 1 0 {}\n", hex(b"x"), hex(b"x")),
            format!("{MAGIC}\nf 99999 1 0 {}\n", hex(b"x")),
            format!("{MAGIC}\nw 0 0 0 {}\n", hex(b"x")),
            format!("{MAGIC}\nl 777 0 0 {}\n", hex(b"x")),
            format!("{MAGIC}\nf 644 1 0 zz\n"),
            "not a manifest\n".to_string(),
        ] {
            assert!(Manifest::decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn needs_only_changed_files() {
        let t = tree();
        let a = Manifest::scan(t.path()).unwrap();
        assert_eq!(a.needs(None).len(), 2);
        assert!(a.needs(Some(&a)).is_empty());
        fs::write(t.path().join("usr/local/data"), vec![8u8; 10_001]).unwrap();
        let b = Manifest::scan(t.path()).unwrap();
        let n = b.needs(Some(&a));
        assert_eq!(n.len(), 1);
        assert_eq!(b.entries[n[0]].path, Path::new("usr/local/data"));
        assert_ne!(a.generation(), b.generation());
    }

    #[test]
    fn sets_encode_and_join() {
        let s1 = encode_set(10, &[0, 9]);
        let s2 = encode_set(10, &[3]);
        assert_eq!(union_sets(10, &[s1.clone(), s2]).unwrap(), vec![0, 3, 9]);
        assert!(union_sets(20, &[s1]).is_err());
    }

    /// A node's new state reuses unchanged files (hard links) and is checked before it is used.
    #[test]
    fn states_are_made_linked_checked_and_switched() {
        let t = tree();
        let node = tempfile::tempdir().unwrap();
        let nc = NodeCopies::open(&node.path().join("layers"), "dev", t.path()).unwrap();
        let m1 = Manifest::scan(t.path()).unwrap();
        // first state: both files arrive (copied here as the stream would extract them)
        let all: HashSet<usize> = m1.needs(None).into_iter().collect();
        let tmp = nc.prepare(&m1, None, &all).unwrap();
        for &i in &all {
            let e = &m1.entries[i];
            fs::copy(t.path().join(&e.path), tmp.path().join(&e.path)).unwrap();
            set_mtime(&tmp.path().join(&e.path), e.mtime_ns);
        }
        let g1 = m1.generation();
        nc.commit(tmp, &m1, &g1).unwrap();
        let cur = nc.current().unwrap();
        assert_eq!(cur.0, g1);
        // second state: one file changed; the other is a link to the first state's
        fs::write(t.path().join("usr/local/data"), b"new").unwrap();
        let m2 = Manifest::scan(t.path()).unwrap();
        let need: HashSet<usize> = m2.needs(Some(&cur.1)).into_iter().collect();
        assert_eq!(need.len(), 1);
        let tmp = nc.prepare(&m2, Some(&cur), &need).unwrap();
        // a missing incoming file fails the check and leaves the current state as it was
        let g2 = m2.generation();
        assert!(nc.commit(tmp, &m2, &g2).is_err());
        assert_eq!(nc.current().unwrap().0, g1);
        let tmp = nc.prepare(&m2, Some(&cur), &need).unwrap();
        for &i in &need {
            let e = &m2.entries[i];
            fs::copy(t.path().join(&e.path), tmp.path().join(&e.path)).unwrap();
            set_mtime(&tmp.path().join(&e.path), e.mtime_ns);
        }
        let s2 = nc.commit(tmp, &m2, &g2).unwrap();
        assert_eq!(nc.current().unwrap().0, g2);
        let a = fs::metadata(nc.state(&g1).join("usr/local/bin/hello")).unwrap();
        let b = fs::metadata(s2.join("usr/local/bin/hello")).unwrap();
        assert_eq!(a.ino(), b.ino());
        assert_eq!(fs::read(s2.join("usr/local/data")).unwrap(), b"new");
        // jobs, holds and pruning
        nc.mark_job("42", &g2).unwrap();
        assert_eq!(nc.for_job("42"), Some(s2.clone()));
        assert_eq!(nc.for_job("43"), None);
        assert_eq!(nc.for_job("../x"), None);
        let held = nc.hold(&nc.state(&g1)).unwrap();
        nc.prune(&[&g2]);
        assert!(nc.state(&g1).is_dir(), "a held state stays");
        drop(held);
        nc.prune(&[&g2]);
        assert!(!nc.state(&g1).exists());
        assert!(s2.is_dir());
    }

    fn set_mtime(p: &Path, ns: i128) {
        let ts = rustix::fs::Timespec {
            tv_sec: ns.div_euclid(1_000_000_000) as i64,
            tv_nsec: ns.rem_euclid(1_000_000_000) as _,
        };
        rustix::fs::utimensat(
            rustix::fs::CWD,
            p,
            &rustix::fs::Timestamps {
                last_access: ts,
                last_modification: ts,
            },
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
}
