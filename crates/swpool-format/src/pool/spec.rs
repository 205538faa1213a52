//! Pool specs: `NAME/VERSION`, found on the pool path (`$SW_POOL_PATH`, `pool_path`).

use std::path::{Path, PathBuf};

/// `NAME/VERSION` was not found (exit status 3).
#[derive(Debug, thiserror::Error)]
#[error("{spec} {reason}")]
pub struct SpecError {
    pub spec: String,
    pub reason: String,
}

const EXTS: &[&str] = &["sqfs", "squashfs", "ext4", "ext3", "ext2", "img"];

/// Whether `spec` names a pool as `name/version` rather than a file.
pub fn is_pool_spec(spec: &str) -> bool {
    let parts: Vec<&str> = spec.split('/').collect();
    parts.len() == 2
        && parts
            .iter()
            .all(|p| crate::pool::manifest::check_name("", p).is_ok())
        && !Path::new(spec).exists()
}

/// Find `name/version` in the pool path: `<dir>/<name>/<version>.<ext>` or `<dir>/<name>-<version>.<ext>`
/// for ext in sqfs, squashfs, ext4, ext3, ext2, img; first directory first.
pub fn resolve_pool(spec: &str, dirs: &[PathBuf]) -> Result<PathBuf, SpecError> {
    let (name, version) = spec.split_once('/').unwrap_or((spec, ""));
    let mut tried = Vec::new();
    for d in dirs {
        for ext in EXTS {
            for c in [
                d.join(name).join(format!("{version}.{ext}")),
                d.join(format!("{name}-{version}.{ext}")),
            ] {
                if c.is_file() {
                    return Ok(c);
                }
                tried.push(c);
            }
        }
    }
    Err(SpecError {
        spec: spec.to_string(),
        reason: if dirs.is_empty() {
            "is not a file, and no pool path is configured to find it as name/version (set SW_POOL_PATH)".into()
        } else {
            format!(
                "no such pool in the pool path ({}); looked for <dir>/{name}/{version}.sqfs, <dir>/{name}-{version}.sqfs and the ext formats{}",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":"),
                did_you_mean(spec, &available(dirs))
                    .map(|m| format!("; did you mean {m}? (`sw-pool avail` lists them)"))
                    .unwrap_or_else(|| "; `sw-pool avail` lists the pools there".into())
            )
        },
    })
}

/// A pool file on the pool path, as [`resolve_pool`] would find it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    pub name: String,
    pub version: String,
    pub path: PathBuf,
}

impl Available {
    pub fn spec(&self) -> String {
        format!("{}/{}", self.name, self.version)
    }
}

/// Every `NAME/VERSION` [`resolve_pool`] finds on the pool path `dirs`, sorted; where two
/// directories hold the same one, the first's (the one a load takes).
pub fn available(dirs: &[PathBuf]) -> Vec<Available> {
    let ext_of = |f: &str| -> Option<(String, String)> {
        let (stem, ext) = f.rsplit_once('.')?;
        EXTS.contains(&ext)
            .then(|| (stem.to_string(), ext.to_string()))
    };
    let valid = |n: &str, v: &str| is_name(n) && is_name(v);
    let mut out: Vec<Available> = Vec::new();
    let mut push = |name: String, version: String, path: PathBuf| {
        if valid(&name, &version) && !out.iter().any(|a| a.name == name && a.version == version) {
            out.push(Available {
                name,
                version,
                path,
            });
        }
    };
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(d) else {
            continue;
        };
        let mut entries: Vec<_> = rd.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let f = e.file_name().to_string_lossy().into_owned();
            let p = e.path();
            if p.is_dir() {
                // <dir>/<name>/<version>.<ext>
                let Ok(sub) = std::fs::read_dir(&p) else {
                    continue;
                };
                let mut files: Vec<_> = sub.flatten().collect();
                files.sort_by_key(|e| e.file_name());
                for v in files {
                    let vf = v.file_name().to_string_lossy().into_owned();
                    if let Some((version, _)) = ext_of(&vf).filter(|_| v.path().is_file()) {
                        push(f.clone(), version, v.path());
                    }
                }
            } else if let Some((stem, _)) = ext_of(&f).filter(|_| p.is_file()) {
                // <dir>/<name>-<version>.<ext>: the version starts at the first '-' before a digit
                let cut = stem
                    .match_indices('-')
                    .map(|(i, _)| i)
                    .find(|&i| stem[i + 1..].starts_with(|c: char| c.is_ascii_digit()))
                    .or_else(|| stem.rfind('-'));
                if let Some(i) = cut {
                    push(stem[..i].to_string(), stem[i + 1..].to_string(), p);
                }
            }
        }
    }
    out.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    out
}

fn is_name(s: &str) -> bool {
    crate::pool::manifest::check_name("", s).is_ok()
}

/// The pools of `found` a mistyped `spec` most likely meant: the versions of the same name, else
/// the nearest names by edit distance (at most a third of the name's length, at least 2).
pub fn did_you_mean(spec: &str, found: &[Available]) -> Option<String> {
    let name = spec.split_once('/').map_or(spec, |(n, _)| n);
    let same: Vec<String> = found
        .iter()
        .filter(|a| a.name == name)
        .map(Available::spec)
        .collect();
    let pick = if !same.is_empty() {
        same
    } else {
        let limit = (name.chars().count() / 3).max(2);
        let best = found
            .iter()
            .map(|a| distance(&a.name.to_lowercase(), &name.to_lowercase()))
            .min()?;
        if best > limit {
            return None;
        }
        let near: Vec<&Available> = found
            .iter()
            .filter(|a| distance(&a.name.to_lowercase(), &name.to_lowercase()) == best)
            .collect();
        // the asked version of a near name, if there is one
        let version = spec.split_once('/').map_or("", |(_, v)| v);
        let exact: Vec<String> = near
            .iter()
            .filter(|a| a.version == version)
            .map(|a| a.spec())
            .collect();
        if exact.is_empty() {
            near.iter().map(|a| a.spec()).collect()
        } else {
            exact
        }
    };
    Some(match pick.as_slice() {
        [] => return None,
        [one] => one.clone(),
        many => format!("one of {}", many.join(", ")),
    })
}

/// Levenshtein distance (characters).
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_name_version() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("p2/demo")).unwrap();
        std::fs::write(d.path().join("p2/demo/1.0.sqfs"), "x").unwrap();
        std::fs::write(d.path().join("p2/tool-2.ext4"), "x").unwrap();
        let dirs = vec![d.path().join("p1"), d.path().join("p2")];
        assert_eq!(
            resolve_pool("demo/1.0", &dirs).unwrap(),
            d.path().join("p2/demo/1.0.sqfs")
        );
        assert_eq!(
            resolve_pool("tool/2", &dirs).unwrap(),
            d.path().join("p2/tool-2.ext4")
        );
        assert!(resolve_pool("nope/1", &dirs)
            .unwrap_err()
            .to_string()
            .contains("no such pool"));
        assert!(is_pool_spec("demo/1.0") && !is_pool_spec("/abs/x.sqfs") && !is_pool_spec("a/b/c"));
    }

    #[test]
    fn lists_the_pool_path_and_suggests_for_a_typo() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("p1/demo")).unwrap();
        std::fs::create_dir_all(d.path().join("p2/demo")).unwrap();
        for f in [
            "p1/demo/1.0.sqfs",
            "p2/demo/1.0.ext4",
            "p2/demo/2.0.sqfs",
            "p2/gcc-12.2.sqfs",
            "p2/notes.txt",
        ] {
            std::fs::write(d.path().join(f), "x").unwrap();
        }
        let dirs = vec![
            d.path().join("p1"),
            d.path().join("p2"),
            d.path().join("none"),
        ];
        let a = available(&dirs);
        let specs: Vec<String> = a.iter().map(Available::spec).collect();
        assert_eq!(specs, ["demo/1.0", "demo/2.0", "gcc/12.2"]);
        assert_eq!(
            a[0].path,
            d.path().join("p1/demo/1.0.sqfs"),
            "the first directory's"
        );
        assert_eq!(
            did_you_mean("demo/3.0", &a).unwrap(),
            "one of demo/1.0, demo/2.0"
        );
        assert_eq!(did_you_mean("dmeo/1.0", &a).unwrap(), "demo/1.0");
        assert_eq!(
            did_you_mean("dmeo/7", &a).unwrap(),
            "one of demo/1.0, demo/2.0"
        );
        assert_eq!(did_you_mean("gc/12.2", &a).unwrap(), "gcc/12.2");
        assert_eq!(did_you_mean("python/3", &a), None);
        let e = resolve_pool("dmeo/1.0", &dirs).unwrap_err().to_string();
        assert!(e.contains("did you mean demo/1.0?"), "{e}");
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
