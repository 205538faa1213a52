//! conda's prefix placeholders rewritten as conda-pack's `conda-unpack` does (the rule is in the
//! parent module's docs), and the inode count of a laid-out environment.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use super::relocate::{normalize, replace_prefix_binary, replace_prefix_text};
use super::{interpreter, io, write_file, EnvKind, PrefixTooLong, PyEnvError};

/// `--env-prefix` must be an absolute path.
pub(super) fn check_prefix(p: &Path) -> Result<(), PyEnvError> {
    if !p.is_absolute() || p.as_os_str().as_encoded_bytes().contains(&0) {
        return Err(PyEnvError::EnvPrefix {
            prefix: p.to_path_buf(),
            reason: "not an absolute path; give where install/<name>/<version> of the pool \
                     will be seen on the nodes"
                .into(),
        });
    }
    Ok(())
}

/// Entries (files, directories, links) under `dir`, itself included.
pub(super) fn count_inodes(dir: &Path) -> u64 {
    let mut n = 1;
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => n += count_inodes(&e.path()),
                _ => n += 1,
            }
        }
    }
    n
}

/// conda-pack's prefix rewriting: the files `conda-meta/*.json` lists with a `prefix_placeholder`
/// get `new` where they name the environment's prefix `env` (or still the placeholder), by
/// their `file_mode`. Returns how many files changed.
pub(super) fn conda_placeholders(
    kind: EnvKind,
    env: &Path,
    pkg: &Path,
    new: Option<&Path>,
    rewritten: &mut HashMap<PathBuf, ()>,
) -> Result<usize, PyEnvError> {
    let (Some(new), EnvKind::Conda | EnvKind::Pixi) = (new, kind) else {
        return Ok(0);
    };
    let meta = pkg.join("conda-meta");
    let mut jsons: Vec<PathBuf> = std::fs::read_dir(&meta)
        .map_err(io("cannot be read", &meta))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension() == Some(OsStr::new("json")))
        .collect();
    jsons.sort();
    let old = env.as_os_str().as_encoded_bytes();
    let newb = new.as_os_str().as_encoded_bytes();
    let mut n = 0;
    for j in jsons {
        let text = std::fs::read(&j).map_err(io("cannot be read", &j))?;
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&text) else {
            continue;
        };
        let Some(paths) = v
            .get("paths_data")
            .and_then(|p| p.get("paths"))
            .and_then(|p| p.as_array())
        else {
            continue;
        };
        for e in paths {
            let (Some(rel), Some(ph)) = (
                e.get("_path").and_then(|x| x.as_str()),
                e.get("prefix_placeholder").and_then(|x| x.as_str()),
            ) else {
                continue;
            };
            let mode = e
                .get("file_mode")
                .and_then(|x| x.as_str())
                .unwrap_or("text");
            let f = normalize(&pkg.join(rel));
            if !f.starts_with(pkg) || !f.symlink_metadata().map(|m| m.is_file()).unwrap_or(false) {
                continue;
            }
            let mut data = std::fs::read(&f).map_err(io("cannot be read", &f))?;
            let mut changed = false;
            let mut olds: Vec<&[u8]> = vec![old];
            if ph.as_bytes() != old && !ph.is_empty() {
                olds.push(ph.as_bytes());
            }
            for o in olds {
                let r = if mode == "binary" {
                    replace_prefix_binary(&data, o, newb).map_err(|reason| {
                        PyEnvError::PrefixTooLong(Box::new(PrefixTooLong {
                            file: env.join(rel),
                            meta: env
                                .join("conda-meta")
                                .join(j.file_name().unwrap_or_default()),
                            placeholder: ph.to_string(),
                            new: new.to_path_buf(),
                            old_len: o.len(),
                            reason,
                        }))
                    })?
                } else {
                    replace_prefix_text(&data, o, newb)
                };
                if let Some(d) = r {
                    data = d;
                    changed = true;
                }
            }
            if changed {
                write_file(&f, &data)?;
                rewritten.insert(f, ());
                n += 1;
            }
        }
    }
    Ok(n)
}

/// The interpreter `env` runs (its link resolved); a conda or pixi environment's must lie in the
/// tree, since CPython finds its prefix, and the standard library, from the real path.
pub(super) fn own_interpreter(env: &Path, kind: EnvKind) -> Result<PathBuf, PyEnvError> {
    let (link, real) = interpreter(env)?;
    if !real.starts_with(env) && matches!(kind, EnvKind::Conda | EnvKind::Pixi) {
        return Err(PyEnvError::InterpreterOutside {
            env: env.to_path_buf(),
            kind,
            link,
            target: real,
        });
    }
    Ok(real)
}
