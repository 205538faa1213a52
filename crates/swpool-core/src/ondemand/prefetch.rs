//! Prefetch lists for on-demand mounts ([`swpool_serve::prefetch`]): `sw-pool cache trace` writes
//! the chunks on-demand runs fetched on a node; `load --lazy --prefetch FILE|auto` warms them on
//! every node after the mount.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::pool::manifest::Manifest;
use crate::{Error, ExitStatus};
pub use swpool_serve::prefetch::PrefetchList;

/// The list `--prefetch auto` looks for: `POOL.prefetch` beside the pool.
pub fn auto_path(pool: &Path) -> PathBuf {
    let mut s = pool.as_os_str().to_os_string();
    s.push(".prefetch");
    PathBuf::from(s)
}

/// The list `--prefetch ARG` names for the pool file `pool`: `auto` is [`auto_path`] when that
/// exists (`None` without one), anything else that path (relative: to the working directory). The
/// flag says it was `auto`.
pub fn requested(arg: &str, pool: &Path) -> Option<(PathBuf, bool)> {
    match arg {
        "auto" => Some(auto_path(pool))
            .filter(|p| p.exists())
            .map(|p| (p, true)),
        f => Some((crate::exec::absolute(Path::new(f)), false)),
    }
}

/// `--prefetch ARG` checked against the authorized manifest `m` before anything starts: the list
/// to warm, or `None` (no `auto` list; or an `auto` list made for another pool or version, which
/// is skipped: the second value says why, for a warning). A list given by name that does not fit
/// is an error naming it.
pub fn choose(
    arg: &str,
    pool: &Path,
    m: &Manifest,
) -> Result<(Option<PathBuf>, Option<String>), Error> {
    let Some((path, auto)) = requested(arg, pool) else {
        tracing::info!("no prefetch list at {}", auto_path(pool).display());
        return Ok((None, None));
    };
    match read_list(&path, m) {
        Ok(l) => {
            tracing::info!(
                "prefetching {} of {} chunks from {}",
                l.chunks.len(),
                l.total,
                path.display()
            );
            Ok((Some(path), None))
        }
        Err(e) if auto => Ok((None, Some(format!("{e}; nothing prefetched")))),
        Err(e) => Err(e),
    }
}

/// The chunks on-demand runs fetched on this node for the pool `m` (its partial copy in the
/// cache `cache`, i.e. `<base>/sw-pool-<uid>/cache`).
pub fn trace(cache: &Path, m: &Manifest) -> Result<PrefetchList, Error> {
    let entry = crate::cache::entry_path(cache, &m.name, &m.version, &m.digest);
    let part = crate::cache::partial_path(&entry);
    let present = swpool_serve::store::read_marks(&part, &m.digest, m.image_size, m.chunk_size)
        .map_err(|e| Error::other(ExitStatus::System, format!("{}: {e}", part.display())))?;
    match present {
        Some((_, chunks)) => Ok(PrefetchList {
            digest: m.digest.clone(),
            total: m.chunks.len() as u64,
            chunks,
        }),
        None if entry.is_file() => Err(Error::other(
            ExitStatus::BadInput,
            format!(
                "this node holds all of {}/{} ({}: a full load), not what a run touched; trace a \
                 node where it was loaded on demand (load --lazy, mount --in-place --keep)",
                m.name,
                m.version,
                entry.display()
            ),
        )),
        None => Err(Error::other(
            ExitStatus::BadInput,
            format!(
                "no chunk of {}/{} was fetched on this node (nothing in {}): run the program \
                 on a pool loaded with load --lazy first, then trace it on that node",
                m.name,
                m.version,
                cache.display()
            ),
        )),
    }
}

/// Read the list at `path` for the pool `m`: bounded, parsed defensively, made for this very pool.
pub fn read_list(path: &Path, m: &Manifest) -> Result<PrefetchList, Error> {
    let bad = |what: String| {
        Error::other(
            ExitStatus::BadInput,
            format!("prefetch list {}: {what}", path.display()),
        )
    };
    let f = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    let mut text = String::new();
    f.take(swpool_serve::prefetch::MAX_LIST_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| bad(e.to_string()))?;
    let list = PrefetchList::parse(&text, m.chunks.len() as u64).map_err(bad)?;
    if list.digest != m.digest {
        return Err(bad(format!(
            "made for another pool (digest {}), not {}/{} ({}); trace this pool again",
            list.digest, m.name, m.version, m.digest
        )));
    }
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_is_what_the_partial_copy_holds_and_reads_back_for_that_pool_only() {
        let d = tempfile::tempdir().unwrap();
        let image: Vec<u8> = (0..5 * 4096u32).map(|i| (i % 251) as u8 + 1).collect();
        let mut m = crate::pool::manifest::sample(&image, 4096);
        m.digest = format!("blake3:{}", "ab".repeat(32));
        // nothing fetched yet
        let e = trace(d.path(), &m).unwrap_err().to_string();
        assert!(e.contains("no chunk of demo/1.0 was fetched"), "{e}");
        let entry = crate::cache::entry_path(d.path(), &m.name, &m.version, &m.digest);
        let part = crate::cache::partial_path(&entry);
        let (s, _) =
            swpool_serve::LocalStore::open(&part, &m.digest, m.image_size, m.chunk_size).unwrap();
        for i in [0u64, 1, 3] {
            s.write_chunk(i, &image[i as usize * 4096..][..4096])
                .unwrap();
        }
        s.flush().unwrap();
        let l = trace(d.path(), &m).unwrap();
        assert_eq!(l.chunks, [0, 1, 3]);
        let file = d.path().join("list");
        std::fs::write(&file, l.render()).unwrap();
        assert_eq!(read_list(&file, &m).unwrap(), l);
        // another pool's manifest: refused, naming both
        let mut other = m.clone();
        other.digest = format!("blake3:{}", "cd".repeat(32));
        let e = read_list(&file, &other).unwrap_err().to_string();
        assert!(
            e.contains("made for another pool") && e.contains("trace this pool again"),
            "{e}"
        );
        // a full entry and no partial copy: says so
        swpool_serve::store::remove(&part);
        std::fs::write(&entry, b"x").unwrap();
        let e = trace(d.path(), &m).unwrap_err().to_string();
        assert!(e.contains("a full load"), "{e}");
    }
}
