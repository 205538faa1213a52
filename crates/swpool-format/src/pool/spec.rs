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
                "no such pool in the pool path ({}); looked for <dir>/{name}/{version}.sqfs, <dir>/{name}-{version}.sqfs and the ext formats",
                dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":")
            )
        },
    })
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
}
