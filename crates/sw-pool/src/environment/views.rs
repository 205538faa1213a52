//! `--cache DIR`: each directory shown read-once over itself inside the environment, by the view
//! server beside sw-pool (`sw-pool-view`, `swpool_serve::view`), mounted by pid 1 with the pools.

use std::path::{Path, PathBuf};

/// The views of `dirs`, as pools of the environment: each an existing directory, named by its
/// canonical path (the view is mounted there), served by `sw-pool-view` beside `self_exe`.
pub fn views(dirs: &[PathBuf], self_exe: &Path) -> Result<Vec<swpool_env::EnvPool>, String> {
    if dirs.is_empty() {
        return Ok(Vec::new());
    }
    let server = self_exe.with_file_name("sw-pool-view");
    if !server.is_file() {
        return Err(format!(
            "--cache needs {}, installed with sw-pool; it is missing: reinstall sw-pool",
            server.display()
        ));
    }
    let mut out: Vec<swpool_env::EnvPool> = Vec::new();
    for d in dirs {
        let at = std::fs::canonicalize(d)
            .map_err(|e| format!("--cache {}: {e}; give an existing directory", d.display()))?;
        if !at.is_dir() {
            return Err(format!("--cache {}: not a directory", d.display()));
        }
        if at == Path::new("/") {
            return Err("--cache /: give the directory of a program or environment, not /".into());
        }
        if let Some(o) = out
            .iter()
            .find(|o| o.at.starts_with(&at) || at.starts_with(&o.at))
        {
            return Err(format!(
                "--cache {} and --cache {}: one is inside the other; give the outer one only",
                o.at.display(),
                at.display()
            ));
        }
        out.push(swpool_env::EnvPool {
            label: at.display().to_string(),
            image: at.clone(),
            at,
            ext: false,
            digest: None,
            view: Some(server.clone()),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_canonical_existing_directories_none_inside_another() {
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("sw-pool");
        std::fs::create_dir(t.path().join("a")).unwrap();
        std::fs::create_dir(t.path().join("a/b")).unwrap();
        // no server beside sw-pool: said so
        let e = views(&[t.path().join("a")], &exe).unwrap_err();
        assert!(e.contains("sw-pool-view"), "{e}");
        std::fs::write(t.path().join("sw-pool-view"), b"").unwrap();
        let v = views(&[t.path().join("a/../a/b")], &exe).unwrap();
        let want = std::fs::canonicalize(t.path().join("a/b")).unwrap();
        assert_eq!((v[0].at.clone(), v[0].image.clone()), (want.clone(), want));
        assert_eq!(v[0].view, Some(t.path().join("sw-pool-view")));
        let e = views(&[t.path().join("a"), t.path().join("a/b")], &exe).unwrap_err();
        assert!(e.contains("inside"), "{e}");
        let e = views(&[t.path().join("nope")], &exe).unwrap_err();
        assert!(e.contains("--cache") && e.contains("nope"), "{e}");
        assert!(views(&[PathBuf::from("/")], &exe).is_err());
        assert!(views(&[], &exe).unwrap().is_empty());
    }
}
