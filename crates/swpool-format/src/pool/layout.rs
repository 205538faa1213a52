//! The pool layout (the paper's Figure 7):
//!
//! ```text
//! pool.toml                       name, version, description
//! install/<pkg>/<ver>/…           the software (bin/, lib/, share/man/, …)
//! modulefiles/<pkg>/<ver>.lua     Lmod modulefiles, one per installed package version
//! source/                         optional: sources, for reproducibility
//! config/                         optional: build recipes and configuration
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::manifest::{check_name, PackageRef};

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error("cannot read {}: {source}", crate::show::show(path))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {reason}", crate::show::show(path))]
    Invalid { path: PathBuf, reason: String },
    #[error(
        "{} already exists and is not empty; choose a new directory",
        crate::show::show(path)
    )]
    NotEmpty { path: PathBuf },
}

/// `pool.toml` at the top of a pool tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolToml {
    pub name: String,
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl PoolToml {
    pub fn read(path: &Path) -> Result<PoolToml, LayoutError> {
        let text = std::fs::read_to_string(path).map_err(|source| LayoutError::Io {
            path: path.into(),
            source,
        })?;
        let t: PoolToml = toml::from_str(&text).map_err(|e| LayoutError::Invalid {
            path: path.into(),
            reason: e.message().to_string(),
        })?;
        for (what, v) in [("name", &t.name), ("version", &t.version)] {
            check_name(what, v).map_err(|reason| LayoutError::Invalid {
                path: path.into(),
                reason,
            })?;
        }
        Ok(t)
    }
}

/// What was found in a pool tree.
#[derive(Debug, Clone, Default)]
pub struct PoolLayout {
    /// `pool.toml`, when present (an ad-hoc tree has none).
    pub toml: Option<PoolToml>,
    pub packages: Vec<PackageRef>,
    /// Modulefiles without a matching `install/<pkg>/<ver>/` (reported as warnings).
    pub orphan_modulefiles: Vec<PathBuf>,
    pub has_modulefiles_dir: bool,
}

impl PoolLayout {
    /// Read the layout of the tree at `root`. Problems that make the pool unusable are errors;
    /// incompleteness (no modulefile for a package) is reported in the result.
    pub fn scan(root: &Path) -> Result<PoolLayout, LayoutError> {
        let mut layout = PoolLayout::default();
        let toml_path = root.join("pool.toml");
        if toml_path.exists() {
            layout.toml = Some(PoolToml::read(&toml_path)?);
        }
        let install = root.join("install");
        let modules = root.join("modulefiles");
        layout.has_modulefiles_dir = modules.is_dir();
        if install.is_dir() {
            for pkg in sorted_dirs(&install)? {
                let pname = name_of(&pkg);
                check_name("package name", &pname).map_err(|reason| LayoutError::Invalid {
                    path: pkg.clone(),
                    reason,
                })?;
                for ver in sorted_dirs(&pkg)? {
                    let vname = name_of(&ver);
                    check_name("package version", &vname).map_err(|reason| {
                        LayoutError::Invalid {
                            path: ver.clone(),
                            reason,
                        }
                    })?;
                    let modulefile = modules.join(&pname).join(format!("{vname}.lua")).is_file()
                        || modules.join(&pname).join(&vname).is_file();
                    layout.packages.push(PackageRef {
                        name: pname.clone(),
                        version: vname,
                        modulefile,
                    });
                }
            }
        } else if layout.toml.is_some() {
            return Err(LayoutError::Invalid {
                path: install,
                reason: "pool.toml is present but install/ is missing; create install/<pkg>/<version>/ (see `sw-pool init`)".into(),
            });
        }
        if layout.has_modulefiles_dir {
            for pkg in sorted_dirs(&modules)? {
                let pname = name_of(&pkg);
                for f in sorted_entries(&pkg)? {
                    let fname = name_of(&f);
                    let ver = fname.strip_suffix(".lua").unwrap_or(&fname).to_string();
                    if !layout
                        .packages
                        .iter()
                        .any(|p| p.name == pname && p.version == ver)
                    {
                        layout.orphan_modulefiles.push(f);
                    }
                }
            }
        }
        Ok(layout)
    }
}

/// The `install/<pkg>/<ver>` directories of the pool tree (or mounted pool) at `root` as
/// (package, version), sorted; leniently, for a pool that was checked when it was built (shadow
/// mounts): a name a pool may not have ([`check_name`]), a symlink (never followed) and an
/// unreadable directory are left out rather than failing.
pub fn installed(root: &Path) -> Vec<(String, String)> {
    let dirs = |d: &Path| -> Vec<String> {
        sorted_entries(d)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
            .map(|p| name_of(&p))
            .filter(|n| check_name("name", n).is_ok())
            .collect()
    };
    let install = root.join("install");
    let mut out = Vec::new();
    for pkg in dirs(&install) {
        for ver in dirs(&install.join(&pkg)) {
            out.push((pkg.clone(), ver));
        }
    }
    out
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, LayoutError> {
    let rd = std::fs::read_dir(dir).map_err(|source| LayoutError::Io {
        path: dir.into(),
        source,
    })?;
    let mut v = Vec::new();
    for e in rd {
        let e = e.map_err(|source| LayoutError::Io {
            path: dir.into(),
            source,
        })?;
        v.push(e.path());
    }
    v.sort();
    Ok(v)
}

fn sorted_dirs(dir: &Path) -> Result<Vec<PathBuf>, LayoutError> {
    Ok(sorted_entries(dir)?
        .into_iter()
        .filter(|p| p.is_dir())
        .collect())
}

/// `sw-pool init DIR`: scaffold an empty pool tree.
pub fn init(
    dir: &Path,
    name: &str,
    version: &str,
    description: Option<&str>,
) -> Result<(), LayoutError> {
    for (what, v) in [("name", name), ("version", version)] {
        check_name(what, v).map_err(|reason| LayoutError::Invalid {
            path: dir.into(),
            reason,
        })?;
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LayoutError::Io { path, source }
    };
    if dir.exists() {
        let mut rd = std::fs::read_dir(dir).map_err(io(dir))?;
        if rd.next().is_some() {
            return Err(LayoutError::NotEmpty { path: dir.into() });
        }
    }
    for sub in ["install", "modulefiles", "source", "config"] {
        let p = dir.join(sub);
        std::fs::create_dir_all(&p).map_err(io(&p))?;
    }
    let t = PoolToml {
        name: name.into(),
        version: version.into(),
        description: description.map(String::from),
    };
    let text = format!(
        "# sw-pool pool description (see `sw-pool init --help`)\n{}",
        toml::to_string(&t).expect("pool.toml serialises")
    );
    let p = dir.join("pool.toml");
    std::fs::write(&p, text).map_err(io(&p))?;
    let readme = dir.join("README.pool");
    std::fs::write(
        &readme,
        format!(
            "Pool {name}/{version}\n\n\
             install/<pkg>/<ver>/      put each package's files here (bin/, lib/, share/man/, ...)\n\
             modulefiles/<pkg>/<ver>.lua  Lmod modulefiles; `sw-pool modulefiles {}` writes missing ones\n\
             source/, config/           optional: sources and build recipes, for reproducibility\n\n\
             Build the pool file with: sw-pool build {name}-{version}.sqfs {}\n",
            dir.display(),
            dir.display()
        ),
    )
    .map_err(io(&readme))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_then_scan() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("p");
        init(&root, "demo", "1.0", Some("a demo")).unwrap();
        std::fs::create_dir_all(root.join("install/hello/2.1/bin")).unwrap();
        std::fs::create_dir_all(root.join("install/tool/0.3")).unwrap();
        std::fs::create_dir_all(root.join("modulefiles/hello")).unwrap();
        std::fs::write(root.join("modulefiles/hello/2.1.lua"), "").unwrap();
        std::fs::create_dir_all(root.join("modulefiles/gone")).unwrap();
        std::fs::write(root.join("modulefiles/gone/1.lua"), "").unwrap();
        let l = PoolLayout::scan(&root).unwrap();
        assert_eq!(l.toml.as_ref().unwrap().name, "demo");
        assert_eq!(
            l.packages,
            vec![
                PackageRef {
                    name: "hello".into(),
                    version: "2.1".into(),
                    modulefile: true
                },
                PackageRef {
                    name: "tool".into(),
                    version: "0.3".into(),
                    modulefile: false
                },
            ]
        );
        assert_eq!(
            l.orphan_modulefiles,
            vec![root.join("modulefiles/gone/1.lua")]
        );
        assert!(matches!(
            init(&root, "demo", "1.0", None),
            Err(LayoutError::NotEmpty { .. })
        ));
    }

    #[test]
    fn bad_pool_toml() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("pool.toml"),
            "name = \"x y\"\nversion = \"1\"\n",
        )
        .unwrap();
        let e = PoolLayout::scan(d.path()).unwrap_err().to_string();
        assert!(e.contains("pool.toml") && e.contains("name"), "{e}");
        std::fs::write(
            d.path().join("pool.toml"),
            "name = \"x\"\nversoin = \"1\"\n",
        )
        .unwrap();
        let e = PoolLayout::scan(d.path()).unwrap_err().to_string();
        assert!(e.contains("versoin") || e.contains("unknown field"), "{e}");
        std::fs::write(
            d.path().join("pool.toml"),
            "name = \"x\"\nversion = \"1\"\n",
        )
        .unwrap();
        let e = PoolLayout::scan(d.path()).unwrap_err().to_string();
        assert!(e.contains("install/ is missing"), "{e}");
    }

    #[test]
    fn ad_hoc_tree_has_no_packages() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("random.data"), b"x").unwrap();
        let l = PoolLayout::scan(d.path()).unwrap();
        assert!(l.toml.is_none() && l.packages.is_empty());
    }
}
