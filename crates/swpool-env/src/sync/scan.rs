//! [`Manifest::scan`]: the list of a layer's upper, made on node 0 of a sync from the layer where
//! it lives — shared storage, where every `lstat` is a round trip to a metadata server. The
//! entries of a whole level of the tree are looked at by [`THREADS`] threads at once (what
//! mpiFileUtils' `dwalk` does with ranks), so a layer of many small files lists in a fraction of
//! the sequential walk's time there (measured: bench/layer-sync.sh, the `list` phase); the list
//! is the same as the sequential walk's, entry for entry and in the same order.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{is_wh_name, Entry, Kind, Manifest};

/// Threads looking at entries at once (a level with fewer than [`PARALLEL_FROM`] entries is done
/// in the calling thread).
const THREADS: usize = 8;
const PARALLEL_FROM: usize = 32;

impl Manifest {
    /// Walk `upper` (not following symlinks). Special files other than whiteouts (sockets, fifos,
    /// devices) are skipped with a warning; an unreadable directory is an error naming it. The
    /// order: each directory's entries sorted by path, directories depth first.
    pub fn scan(upper: &Path) -> io::Result<Manifest> {
        let mut listing: HashMap<PathBuf, Vec<Entry>> = HashMap::new();
        let mut level = vec![PathBuf::new()];
        while !level.is_empty() {
            let names = par_map(&level, |rel| read_names(upper, rel));
            let mut items: Vec<(usize, OsString)> = Vec::new();
            for (i, n) in names.into_iter().enumerate() {
                items.extend(n?.into_iter().map(|name| (i, name)));
            }
            let looked = par_map(&items, |(i, name)| entry(upper, &level[*i], name));
            let mut per_dir: Vec<Vec<Entry>> = vec![Vec::new(); level.len()];
            let mut next = Vec::new();
            for ((i, _), e) in items.iter().zip(looked) {
                if let Some(e) = e? {
                    if e.kind == Kind::Dir {
                        next.push(e.path.clone());
                    }
                    per_dir[*i].push(e);
                }
            }
            for (rel, mut here) in level.into_iter().zip(per_dir) {
                // in the order of the names the copy has (a whiteout `x` is `.wh.x` there), so
                // that a copy scans to the same list
                here.sort_by(|a, b| a.path.cmp(&b.path));
                listing.insert(rel, here);
            }
            level = next;
        }
        let mut entries = Vec::with_capacity(listing.values().map(Vec::len).sum());
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let here = listing.remove(&rel).unwrap_or_default();
            let subdirs: Vec<PathBuf> = here
                .iter()
                .filter(|e| e.kind == Kind::Dir)
                .map(|e| e.path.clone())
                .collect();
            entries.extend(here);
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(Manifest { entries })
    }
}

fn read_names(upper: &Path, rel: &Path) -> io::Result<Vec<OsString>> {
    let dir = upper.join(rel);
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", dir.display()));
    fs::read_dir(&dir)
        .map_err(named)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()
        .map_err(named)
}

/// The entry for `rel/name`, or `None` for a special file (skipped, with a warning).
fn entry(upper: &Path, rel: &Path, name: &OsString) -> io::Result<Option<Entry>> {
    let r = rel.join(name);
    let p = upper.join(&r);
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
    let m = fs::symlink_metadata(&p).map_err(named)?;
    let ft = m.file_type();
    let mode = m.mode() & 0o7777;
    let plain = |path: PathBuf, kind: Kind, mode: u32| Entry {
        path,
        kind,
        mode,
        size: 0,
        mtime_ns: 0,
        target: None,
    };
    Ok(Some(if ft.is_dir() {
        plain(r, Kind::Dir, mode)
    } else if ft.is_symlink() {
        Entry {
            target: Some(fs::read_link(&p).map_err(named)?),
            ..plain(r, Kind::Symlink, 0o777)
        }
    } else if ft.is_file() && is_wh_name(name) {
        // fuse-overlayfs' other form of a whiteout
        plain(r, Kind::Whiteout, 0)
    } else if ft.is_file() {
        Entry {
            size: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ..plain(r, Kind::File, mode)
        }
    } else if crate::layer::is_whiteout_device(&m) {
        let mut wh = OsString::from(".wh.");
        wh.push(name);
        plain(rel.join(wh), Kind::Whiteout, 0)
    } else {
        tracing::warn!(path = %p.display(), "skipping a special file in the layer (socket, fifo or device)");
        return Ok(None);
    }))
}

/// `f` over `items`, in their order; by [`THREADS`] threads taking the next item as they finish
/// one when there are at least [`PARALLEL_FROM`] items.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() < PARALLEL_FROM {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let mut out: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    std::thread::scope(|sc| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                sc.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(it) = items.get(i) else { break };
                        done.push((i, f(it)));
                    }
                    done
                })
            })
            .collect();
        for w in workers {
            // a panic in `f` is a bug: pass it on
            for (i, r) in w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                out[i] = Some(r);
            }
        }
    });
    out.into_iter()
        .map(|r| r.expect("every item was taken by a worker"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The oracle: a plain recursive walk, one lstat after the other — each directory's entries
    /// sorted by path, then each subdirectory's in that order (what the parallel scan must give).
    fn sequential(upper: &Path, rel: &Path) -> Vec<Entry> {
        let mut names = read_names(upper, rel).unwrap();
        names.sort();
        let mut here: Vec<Entry> = names
            .iter()
            .filter_map(|n| entry(upper, rel, n).unwrap())
            .collect();
        here.sort_by(|a, b| a.path.cmp(&b.path));
        let mut out = here.clone();
        for d in here.iter().filter(|e| e.kind == Kind::Dir) {
            out.extend(sequential(upper, &d.path));
        }
        out
    }

    #[test]
    fn parallel_scan_lists_what_the_sequential_walk_lists_in_its_order() {
        let t = tempfile::tempdir().unwrap();
        let u = t.path();
        // wide (over PARALLEL_FROM in one directory), deep, and every kind of entry
        for d in 0..5 {
            let dir = u.join(format!("d{d}/sub{d}/deeper"));
            fs::create_dir_all(&dir).unwrap();
            for i in 0..(if d == 2 { 300 } else { 7 }) {
                fs::write(dir.join(format!("f{i:03}")), vec![b'x'; i]).unwrap();
            }
        }
        fs::write(u.join("d1/.wh.gone"), b"").unwrap();
        std::os::unix::fs::symlink("../d0", u.join("d1/link")).unwrap();
        fs::create_dir(u.join("empty")).unwrap();
        for i in 0..40 {
            fs::create_dir(u.join(format!("many{i:02}"))).unwrap();
            fs::write(u.join(format!("many{i:02}/one")), b"1").unwrap();
        }
        let m = Manifest::scan(u).unwrap();
        assert_eq!(m.entries, sequential(u, Path::new("")));
        assert_eq!(m.entries.len(), 5 * 3 + 4 * 7 + 300 + 2 + 1 + 80);
        assert!(m.entries.iter().any(|e| e.kind == Kind::Whiteout));
        assert!(m
            .entries
            .iter()
            .any(|e| e.kind == Kind::Symlink && e.target.as_deref() == Some(Path::new("../d0"))));
        // the same list twice (the generation is a hash of it)
        assert_eq!(Manifest::scan(u).unwrap().generation(), m.generation());
    }

    #[test]
    fn an_unreadable_directory_is_an_error_naming_it() {
        let t = tempfile::tempdir().unwrap();
        let e = Manifest::scan(&t.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
