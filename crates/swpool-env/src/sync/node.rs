//! The node side of a synced layer: its states on node-local storage ([`NodeCopies`]).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use swpool_sys::lock::{self, Share};

use super::{Entry, Kind, Manifest};
use crate::rendezvous::LockProbe;
use crate::EnvError;

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
        let jobs = dir.join("jobs");
        for d in [layers, dir.as_path(), jobs.as_path()] {
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

    /// Whether the state at `state` (a directory of these copies) deletes lower files in the
    /// `.wh.NAME` form, which only fuse-overlayfs reads (a copy made where the kernel refused the
    /// character device 0/0 form, or by an earlier sw-pool): from its manifest and the entries
    /// themselves; `true` when that cannot be read.
    pub fn has_whiteouts(&self, state: &Path) -> bool {
        let Some(gen) = state.file_name().and_then(|g| g.to_str()) else {
            return true;
        };
        let Some(m) = fs::read(self.dir.join(format!("{gen}.manifest")))
            .ok()
            .and_then(|b| Manifest::decode(&b).ok())
        else {
            return true;
        };
        m.entries
            .iter()
            .filter(|e| e.kind == super::Kind::Whiteout)
            .any(|e| !is_kernel_whiteout(&state.join(kernel_name(&e.path))))
    }

    /// Record that job `job` uses state `gen`. Marks older than [`MARK_MAX_AGE`] go first: the
    /// epilog removes a job's marks ([`remove_job_marks`]) where the site's cache base is; a copy
    /// kept elsewhere (`--cache-dir`) would otherwise gather one file per job for ever.
    pub fn mark_job(&self, job: &str, gen: &str) -> Result<(), EnvError> {
        if !valid_job(job) {
            return Err(EnvError::Unsupported(format!("bad job id {job:?}")));
        }
        prune_old_marks(&self.dir.join("jobs"), MARK_MAX_AGE);
        let p = self.dir.join("jobs").join(job);
        swpool_sys::atomic::write_file(&p, format!("{gen}\n").as_bytes(), true)
            .map_err(|e| EnvError::io("cannot write", p, e))
    }

    /// Record that the sync started for job step `job` (`JOB.STEP`) failed on this node, and why
    /// (the step's tasks waiting for the copy stop waiting).
    pub fn mark_failed(&self, job: &str, why: &str) -> Result<(), EnvError> {
        if !valid_job(job) {
            return Err(EnvError::Unsupported(format!("bad job id {job:?}")));
        }
        let p = self.dir.join("jobs").join(format!("{job}.failed"));
        swpool_sys::atomic::write_file(&p, why.as_bytes(), true)
            .map_err(|e| EnvError::io("cannot write", p, e))
    }

    /// Why the sync started for job step `job` failed on this node, if it did.
    pub fn failed(&self, job: &str) -> Option<String> {
        if !valid_job(job) {
            return None;
        }
        fs::read_to_string(self.dir.join("jobs").join(format!("{job}.failed"))).ok()
    }

    /// Start state `m` in a temporary directory: every directory made, every file of `m` not in
    /// `incoming` hard-linked from the current state `have` (it is the same there), whiteouts
    /// and symlinks made, the empty files in `incoming` made. The others of `incoming` are then
    /// created and written by the transfer (and given their modes and mtimes: [`finish_files`]);
    /// [`Self::commit`] checks the tree and moves it into place.
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
                Kind::Whiteout => make_whiteout(&p),
                // to be written by the transfer, which creates it when its first bytes arrive
                // (overlapped with the network: making 2,000 files here cost 1 s of an 8-node
                // sync on 2 cores); only an empty one is made here
                Kind::File if incoming.contains(&i) => match e.size {
                    0 => fs::File::create(&p).map(drop),
                    _ => Ok(()),
                },
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
        self.check(&t, m)?;
        self.install(t, m, gen)
    }

    /// Check the tree in `t` against `m` and give its directories their modes (a sync checks on
    /// every node before any node installs).
    pub fn check(&self, t: &swpool_sys::atomic::TempDir, m: &Manifest) -> Result<(), EnvError> {
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
                mode: if e.kind == Kind::Dir {
                    e.mode | 0o700
                } else {
                    e.mode
                },
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
        Ok(())
    }

    /// Move a checked tree into place as state `gen` and make it the current state.
    pub fn install(
        &self,
        t: swpool_sys::atomic::TempDir,
        m: &Manifest,
        gen: &str,
    ) -> Result<PathBuf, EnvError> {
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
            let lock = self.gen_lock(gen);
            let free = match open_lock(&lock) {
                Ok(f) => matches!(lock::try_lock(&f, Share::Exclusive), Ok(true)),
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
            .ok_or_else(|| {
                EnvError::Unsupported(format!("{} is not a layer state", gen_dir.display()))
            })?;
        let lock = self.gen_lock(gen);
        let f = open_lock(&lock).map_err(|e| EnvError::io("cannot open", &lock, e))?;
        lock::lock(&f, Share::Shared).map_err(|e| EnvError::io("cannot lock", &lock, e))?;
        Ok(f)
    }

    /// State `gen`'s lock file: shared by every environment on it, exclusive while pruned.
    fn gen_lock(&self, gen: &str) -> PathBuf {
        self.dir.join(format!("{gen}.lock"))
    }
}

/// Open (create when missing) a state's lock file.
fn open_lock(p: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p)
}

/// How long a job's marks are kept when no epilog removed them: longer than any job runs (a mark
/// is read when a step of its job starts `run --layer`).
pub const MARK_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// Remove the marks of job `job` (`jobs/<job>`, and `jobs/<job>.<step>.failed`) of every layer
/// copy under the user's node-local `layers` (the epilog's `cleanup --job`, as the user);
/// returns how many went.
pub fn remove_job_marks(layers: &Path, job: &str) -> usize {
    if !valid_job(job) || job.contains('.') {
        return 0;
    }
    let mut n = 0;
    let Ok(rd) = fs::read_dir(layers) else {
        return 0;
    };
    for copies in rd.flatten() {
        let Ok(marks) = fs::read_dir(copies.path().join("jobs")) else {
            continue;
        };
        for m in marks.flatten() {
            if of_job(&m.file_name().to_string_lossy(), job) && fs::remove_file(m.path()).is_ok() {
                n += 1;
            }
        }
    }
    n
}

/// Whether the mark named `name` is job `job`'s: `<job>` itself, or one of its steps'
/// (`<job>.<step>`, `<job>.<step>.failed`). Shared with the step marks' removal.
pub fn of_job(name: &str, job: &str) -> bool {
    name == job || name.strip_prefix(job).is_some_and(|r| r.starts_with('.'))
}

/// Remove the entries of `dir` (files, or directories with what is in them) last changed more
/// than `age` ago. Best effort: marks are a few bytes each.
pub fn prune_old_marks(dir: &Path, age: std::time::Duration) {
    let Some(cutoff) = std::time::SystemTime::now().checked_sub(age) else {
        return;
    };
    let Ok(rd) = fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if m.modified().is_ok_and(|t| t < cutoff) {
            let _ = if m.is_dir() {
                crate::layer::remove_tree(&e.path())
            } else {
                fs::remove_file(e.path())
            };
        }
    }
}

/// The per-environment directories (`<copies>/run/<key>`) under the user's node-local `layers`
/// whose environment is gone: nobody holds its rendezvous lock in any of `envs_dirs` (the state
/// directories' `envs/`). What an environment killed with `kill -9` together with its launcher
/// leaves; `sw-pool cleanup` removes them (unless `dry_run`).
pub fn remove_stale_runs(layers: &Path, envs_dirs: &[PathBuf], dry_run: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(layers) else {
        return out;
    };
    for copies in rd.flatten() {
        let Ok(runs) = fs::read_dir(copies.path().join("run")) else {
            continue;
        };
        for r in runs.flatten() {
            let scratch = r.path();
            let key = crate::rendezvous::layer_key(&scratch);
            // held while the directory is removed: a start taking this key waits for it
            let locks: Vec<LockProbe> = envs_dirs
                .iter()
                .map(|d| LockProbe::shared(&d.join(format!("{key}.lock"))))
                .collect();
            if locks.iter().any(|l| l.held) {
                continue;
            }
            if dry_run || crate::layer::remove_tree(&scratch).is_ok() {
                out.push(scratch);
            }
        }
    }
    out
}

fn valid_gen(g: &str) -> bool {
    g.len() == 32
        && g.bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
}

fn valid_job(j: &str) -> bool {
    !j.is_empty()
        && j.len() <= 64
        && j.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.')
        && !j.starts_with('.')
}

/// Give the files of `m` listed in `written` (written into the tree at `root` by the transfer)
/// their modes and mtimes.
pub fn finish_files(root: &Path, m: &Manifest, written: &[usize]) -> Result<(), EnvError> {
    use std::os::unix::fs::OpenOptionsExt;
    for &i in written {
        let e = &m.entries[i];
        let p = root.join(&e.path);
        // the transfer creates a file with its first bytes and leaves runs of zeros unwritten:
        // a file of zeros only is made here, and one ending in zeros gets its length
        let f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p)
            .map_err(|x| EnvError::io("cannot open", &p, x))?;
        let len = f
            .metadata()
            .map_err(|x| EnvError::io("cannot stat", &p, x))?
            .len();
        if len < e.size {
            f.set_len(e.size)
                .map_err(|x| EnvError::io("cannot set the length of", &p, x))?;
        }
        f.set_permissions(fs::Permissions::from_mode(e.mode))
            .map_err(|x| EnvError::io("cannot chmod", &p, x))?;
        drop(f);
        swpool_sys::atomic::set_mtime(&p, e.mtime_ns)
            .map_err(|x| EnvError::io("cannot set the mtime of", &p, x))?;
    }
    Ok(())
}

/// Where the kernel's form of the whiteout `dir/.wh.NAME` is: `dir/NAME`.
fn kernel_name(wh: &Path) -> PathBuf {
    let name = wh
        .file_name()
        .map(|n| &n.as_bytes()[4..])
        .unwrap_or_default();
    wh.with_file_name(OsStr::from_bytes(name))
}

fn is_kernel_whiteout(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| crate::layer::is_whiteout_device(&m))
}

/// A deleted lower file in the copy: the kernel's form (a character device 0/0 at `dir/NAME`,
/// which the kernel's overlay and fuse-overlayfs both read; Linux lets users make it since 5.8),
/// else the `.wh.NAME` file `p` names (fuse-overlayfs only).
fn make_whiteout(p: &Path) -> io::Result<()> {
    let k = kernel_name(p);
    match rustix::fs::mknodat(
        rustix::fs::CWD,
        &k,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        0,
    ) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::PERM) => fs::File::create(p)
            .and_then(|_| fs::set_permissions(p, fs::Permissions::from_mode(0o000))),
        Err(e) => Err(e.into()),
    }
}
