//! A private shadow: a pool's packages bound over the site's originals inside an environment
//! (`run --shadow`; the site-wide shadow through the helper is swpool-core's `load::shadow`).

use std::path::{Path, PathBuf};

/// The binds of a private shadow: `(pool's install/<pkg>/<ver>, <shadow_root>/<pkg>/<ver>)` for
/// each package of the pool mounted at `pool_mount` whose original exists as a real directory
/// (not a symlink); and the `<pkg>/<ver>` that have none.
pub fn private_shadows(
    pool_mount: &Path,
    shadow_root: &Path,
) -> (Vec<(PathBuf, PathBuf)>, Vec<String>) {
    let install = pool_mount.join("install");
    let mut binds = Vec::new();
    let mut none = Vec::new();
    for (pkg, ver) in swpool_format::pool::layout::installed(pool_mount) {
        let target = shadow_root.join(&pkg).join(&ver);
        let real_dir = std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir())
            && std::fs::symlink_metadata(shadow_root.join(&pkg)).is_ok_and(|m| m.is_dir());
        if real_dir {
            binds.push((install.join(&pkg).join(&ver), target));
        } else {
            none.push(format!("{pkg}/{ver}"));
        }
    }
    (binds, none)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_shadows_pair_packages_with_existing_originals_only() {
        let d = tempfile::tempdir().unwrap();
        let pool = d.path().join("pool");
        let sw = d.path().join("sw");
        for p in [
            "install/gcc/12/bin",
            "install/gcc/13",
            "install/zlib/1.3",
            "install/.hidden/1",
        ] {
            std::fs::create_dir_all(pool.join(p)).unwrap();
        }
        std::fs::create_dir_all(sw.join("gcc/12")).unwrap();
        std::fs::create_dir_all(sw.join("elsewhere")).unwrap();
        std::fs::create_dir_all(sw.join("zlib")).unwrap();
        // a symlink in place of an original is not shadowed (it could lead anywhere)
        std::os::unix::fs::symlink(sw.join("elsewhere"), sw.join("zlib/1.3")).unwrap();
        let (binds, none) = private_shadows(&pool, &sw);
        assert_eq!(
            binds,
            vec![(pool.join("install/gcc/12"), sw.join("gcc/12"))]
        );
        assert_eq!(none, vec!["gcc/13".to_string(), "zlib/1.3".to_string()]);
    }
}
