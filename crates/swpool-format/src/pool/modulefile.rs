//! Modulefiles generated for `install/<pkg>/<ver>/`: Lmod (`modulefiles/<pkg>/<ver>.lua`) and
//! Environment Modules (Tcl, `modulefiles/<pkg>/<ver>`, which Lmod reads too; where both exist Lmod
//! takes the `.lua` one, and Environment Modules ignores `.lua` files: they lack its `#%Module`
//! header).
//!
//! Like the paper's Figure 8, a generated modulefile finds its package under
//! `$SW_POOL_MOUNT/<pool>/<pool-version>/install/<pkg>/<ver>` (or `$GWDG_SW_MOUNT/…`, the paper's
//! variable). When the pool is mounted somewhere else (`sw-pool load -m DIR`), it falls back to the
//! pool root that contains the modulefile itself, so a module never points at a wrong path.

use std::path::{Path, PathBuf};

use super::layout::{LayoutError, PoolLayout};

/// Which environment variables a generated modulefile sets, and in which languages.
#[derive(Debug, Clone, Copy, Default)]
pub struct ModulefileOptions {
    /// Also prepend `lib`/`lib64` to `LD_LIBRARY_PATH` (off by default: RPATHs are better).
    pub ld_library_path: bool,
    pub formats: Formats,
}

/// The modulefile languages written (`--modules lua|tcl|both`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Formats {
    Lua,
    Tcl,
    /// Lmod and Environment Modules sites alike (the default).
    #[default]
    Both,
}

impl Formats {
    pub fn lua(self) -> bool {
        self != Formats::Tcl
    }
    pub fn tcl(self) -> bool {
        self != Formats::Lua
    }
}

impl std::str::FromStr for Formats {
    type Err = String;
    fn from_str(s: &str) -> Result<Formats, String> {
        match s {
            "lua" => Ok(Formats::Lua),
            "tcl" => Ok(Formats::Tcl),
            "both" => Ok(Formats::Both),
            o => Err(format!("{o}: expected lua, tcl or both")),
        }
    }
}

/// Install prefixes inside a package directory: the package itself (`bin/`, `lib/`), and the
/// layouts of a Debian package extracted with `dpkg -x` (`usr/`) or of a `/usr/local` install.
const PREFIXES: &[&str] = &["", "usr", "usr/local"];

/// Multiarch library directories under `<prefix>/lib` (`x86_64-linux-gnu`, `aarch64-linux-gnu`, …).
fn triplets(lib: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(lib)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains("-linux-"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// `(variable, directory relative to the package)` pairs for the directories that exist in
/// `pkg_dir`, in the order they are prepended.
pub fn env_dirs(pkg_dir: &Path, opts: ModulefileOptions) -> Vec<(&'static str, String)> {
    let has = |rel: &str| pkg_dir.join(rel).is_dir();
    let join = |p: &str, r: &str| {
        if p.is_empty() {
            r.to_string()
        } else {
            format!("{p}/{r}")
        }
    };
    let mut out = Vec::new();
    for p in PREFIXES {
        if !p.is_empty() && !has(p) {
            continue;
        }
        let mut libs = vec![join(p, "lib"), join(p, "lib64")];
        libs.extend(
            triplets(&pkg_dir.join(join(p, "lib")))
                .iter()
                .map(|t| join(p, &format!("lib/{t}"))),
        );
        for rel in [join(p, "bin"), join(p, "sbin")] {
            if has(&rel) {
                out.push(("PATH", rel));
            }
        }
        for rel in [join(p, "share/man"), join(p, "man")] {
            if has(&rel) {
                out.push(("MANPATH", rel));
            }
        }
        let mut pc: Vec<String> = libs.iter().map(|l| format!("{l}/pkgconfig")).collect();
        pc.push(join(p, "share/pkgconfig"));
        for rel in pc {
            if has(&rel) {
                out.push(("PKG_CONFIG_PATH", rel));
            }
        }
        if p.is_empty() || has(&join(p, "lib")) || has(&join(p, "bin")) {
            out.push(("CMAKE_PREFIX_PATH", p.to_string()));
        }
        if opts.ld_library_path {
            for rel in libs {
                if has(&rel) {
                    out.push(("LD_LIBRARY_PATH", rel));
                }
            }
        }
    }
    out
}

/// The text of the modulefile for `install/<pkg>/<ver>` of pool `pool`/`pool_version`;
/// `pkg_dir` is inspected to set only the variables whose directories exist.
pub fn render(
    pool: &str,
    pool_version: &str,
    pkg: &str,
    ver: &str,
    pkg_dir: &Path,
    opts: ModulefileOptions,
) -> String {
    let mut body = String::new();
    for (var, rel) in env_dirs(pkg_dir, opts) {
        if rel.is_empty() {
            body.push_str(&format!("prepend_path(\"{var}\", root)\n"));
        } else {
            body.push_str(&format!(
                "prepend_path(\"{var}\", pathJoin(root, \"{rel}\"))\n"
            ));
        }
    }
    format!(
        r#"-- Lmod modulefile for {pkg}/{ver} in pool {pool}/{pool_version}
-- generated by sw-pool; edit freely (sw-pool only writes modulefiles that are missing)
local pkgName = myModuleName()
local version = myModuleVersion()
local poolName = "{pool}"
local poolVersion = "{pool_version}"
local mountPoint = os.getenv("SW_POOL_MOUNT") or os.getenv("GWDG_SW_MOUNT")
local root = nil
if mountPoint then
   root = pathJoin(mountPoint, poolName, poolVersion, "install", pkgName, version)
end
if not root or not isDir(root) then
   -- the pool is mounted elsewhere (sw-pool load -m DIR): use the pool that holds this modulefile
   local poolRoot = myFileName():gsub("/modulefiles/[^/]+/[^/]+$", "")
   root = pathJoin(poolRoot, "install", pkgName, version)
end
whatis("Name: " .. pkgName)
whatis("Version: " .. version)
whatis("Pool: " .. poolName .. "/" .. poolVersion)
help([[{pkg} {ver} from the sw-pool pool {pool}/{pool_version}]])
{body}"#
    )
}

/// A string as a Tcl word in braces (names and versions are checked to be plain: no braces,
/// backslashes or newlines, see `layout::check_name`).
fn tcl_word(s: &str) -> String {
    format!("{{{s}}}")
}

/// The Tcl (Environment Modules) modulefile for `install/<pkg>/<ver>`, with the same semantics as
/// [`render`]: the package under `$SW_POOL_MOUNT` (or `$GWDG_SW_MOUNT`)`/<pool>/<version>`, else
/// under the pool that holds the modulefile.
pub fn render_tcl(
    pool: &str,
    pool_version: &str,
    pkg: &str,
    ver: &str,
    pkg_dir: &Path,
    opts: ModulefileOptions,
) -> String {
    let mut body = String::new();
    for (var, rel) in env_dirs(pkg_dir, opts) {
        if rel.is_empty() {
            body.push_str(&format!("prepend-path {var} $root\n"));
        } else {
            body.push_str(&format!(
                "prepend-path {var} [file join $root {}]\n",
                tcl_word(&rel)
            ));
        }
    }
    // the names as Tcl words where they are values; the comments and texts read them plainly
    let (pool_w, pool_version_w, pkg_w, ver_w) = (
        tcl_word(pool),
        tcl_word(pool_version),
        tcl_word(pkg),
        tcl_word(ver),
    );
    format!(
        r#"#%Module1.0
## Environment Modules (Tcl) modulefile for {pkg}/{ver} in pool {pool}/{pool_version}
## generated by sw-pool; edit freely (sw-pool only writes modulefiles that are missing)
set pkgName {pkg_w}
set pkgVersion {ver_w}
set poolName {pool_w}
set poolVersion {pool_version_w}
set root {{}}
foreach var {{SW_POOL_MOUNT GWDG_SW_MOUNT}} {{
    if {{[info exists ::env($var)] && $::env($var) ne {{}}}} {{
        set root [file join $::env($var) $poolName $poolVersion install $pkgName $pkgVersion]
        break
    }}
}}
if {{$root eq {{}} || ![file isdirectory $root]}} {{
    # the pool is mounted elsewhere (sw-pool load -m DIR): use the pool that holds this modulefile
    set poolRoot [file dirname [file dirname [file dirname $ModulesCurrentModulefile]]]
    set root [file join $poolRoot install $pkgName $pkgVersion]
}}
module-whatis "Name: $pkgName"
module-whatis "Version: $pkgVersion"
module-whatis "Pool: $poolName/$poolVersion"
proc ModulesHelp {{}} {{
    global pkgName pkgVersion poolName poolVersion
    puts stderr "$pkgName $pkgVersion from the sw-pool pool $poolName/$poolVersion"
}}
{body}"#
    )
}

/// Whether a modulefile was written by sw-pool (not by hand).
fn generated(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .take(3)
                .any(|l| l.contains("generated by sw-pool"))
        })
        .unwrap_or(false)
}

/// What [`generate_missing`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Generated {
    pub written: Vec<PathBuf>,
    /// Packages for which no `PATH` could be set (no `bin/`, `sbin/`, `usr/bin/`, …).
    pub warnings: Vec<String>,
}

/// Write a modulefile for every package in `root`'s layout that lacks one, each through `write`
/// (the caller's atomic write: `swpool_sys::atomic::write_file`; this crate does not do it).
pub fn generate_missing(
    root: &Path,
    opts: ModulefileOptions,
    write: &mut dyn FnMut(&Path, &[u8]) -> std::io::Result<()>,
) -> Result<Generated, LayoutError> {
    let layout = PoolLayout::scan(root)?;
    let toml = layout.toml.as_ref().ok_or_else(|| LayoutError::Invalid {
        path: root.join("pool.toml"),
        reason: "no pool.toml: modulefiles need the pool's name and version (create it with `sw-pool init` or by hand)".into(),
    })?;
    let mut out = Generated::default();
    for p in &layout.packages {
        let dir = root.join("modulefiles").join(&p.name);
        let pkg_dir = root.join("install").join(&p.name).join(&p.version);
        let lua = dir.join(format!("{}.lua", p.version));
        let tcl = dir.join(&p.version);
        let lua_missing = opts.formats.lua() && !lua.is_file();
        let tcl_missing = opts.formats.tcl() && !tcl.is_file();
        if !lua_missing && !tcl_missing {
            continue;
        }
        if !env_dirs(&pkg_dir, opts).iter().any(|(v, _)| *v == "PATH") {
            out.warnings.push(format!(
                "{}/{}: no bin/, sbin/, usr/bin/ or usr/local/bin/ in {}: its modulefile sets no PATH",
                p.name,
                p.version,
                pkg_dir.display()
            ));
        }
        let mut todo: Vec<(&PathBuf, String)> = Vec::new();
        if lua_missing {
            let t = render(
                &toml.name,
                &toml.version,
                &p.name,
                &p.version,
                &pkg_dir,
                opts,
            );
            todo.push((&lua, t));
        }
        if tcl_missing {
            let t = render_tcl(
                &toml.name,
                &toml.version,
                &p.name,
                &p.version,
                &pkg_dir,
                opts,
            );
            todo.push((&tcl, t));
        }
        // a hand-written modulefile in the other language may set more than the layout says
        for other in [&lua, &tcl] {
            if other.is_file() && !generated(other) {
                out.warnings.push(format!(
                    "{}/{}: {} was written by hand; the modulefile generated beside it follows the directory layout only: check that it sets the same",
                    p.name,
                    p.version,
                    other.display()
                ));
            }
        }
        std::fs::create_dir_all(&dir).map_err(|source| LayoutError::Io {
            path: dir.clone(),
            source,
        })?;
        for (file, text) in todo {
            let io = |source| LayoutError::Io {
                path: file.clone(),
                source,
            };
            write(file, text.as_bytes()).map_err(io)?;
            out.written.push(file.clone());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Tcl modulefile read by a real Tcl interpreter (`tclsh`; the module commands stubbed):
    /// its help and whatis texts name the package without Tcl's braces.
    #[test]
    fn tcl_help_names_the_package_plainly() {
        if std::process::Command::new("tclsh")
            .stdin(std::process::Stdio::null())
            .output()
            .is_err()
        {
            eprintln!("SKIP: tclsh is not installed");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        let t = render_tcl(
            "demo",
            "1.0",
            "hello",
            "2.1",
            d.path(),
            ModulefileOptions::default(),
        );
        let mf = d.path().join("2.1");
        std::fs::write(&mf, &t).unwrap();
        let driver = "proc module-whatis {s} {puts stdout \"whatis: $s\"}\n\
                      proc prepend-path {args} {}\n\
                      set ModulesCurrentModulefile [lindex $argv 0]\n\
                      source [lindex $argv 0]\n\
                      ModulesHelp\n";
        let o = std::process::Command::new("tclsh")
            .arg("/dev/stdin")
            .arg(&mf)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(driver.as_bytes())?;
                c.wait_with_output()
            })
            .unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(o.status.success(), "{out}{err}");
        assert_eq!(
            err.trim(),
            "hello 2.1 from the sw-pool pool demo/1.0",
            "{t}"
        );
        assert!(out.contains("whatis: Name: hello\n"), "{out}");
        assert!(!t.lines().take(3).any(|l| l.contains('{')), "{t}");
    }

    #[test]
    fn renders_only_existing_dirs() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("bin")).unwrap();
        std::fs::create_dir_all(d.path().join("lib/pkgconfig")).unwrap();
        let t = render(
            "demo",
            "1.0",
            "hello",
            "2.1",
            d.path(),
            ModulefileOptions::default(),
        );
        assert!(t.contains("prepend_path(\"PATH\", pathJoin(root, \"bin\"))"));
        assert!(t.contains("PKG_CONFIG_PATH"));
        assert!(t.contains("CMAKE_PREFIX_PATH"));
        assert!(!t.contains("MANPATH"));
        assert!(!t.contains("LD_LIBRARY_PATH"));
        assert!(t.contains("GWDG_SW_MOUNT"));
        let t = render(
            "demo",
            "1.0",
            "hello",
            "2.1",
            d.path(),
            ModulefileOptions {
                ld_library_path: true,
                ..Default::default()
            },
        );
        assert!(t.contains("LD_LIBRARY_PATH"));
    }

    #[test]
    fn generates_missing_only() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        super::super::layout::init(root, "demo", "1.0", None).unwrap();
        std::fs::create_dir_all(root.join("install/a/1/bin")).unwrap();
        std::fs::create_dir_all(root.join("install/b/2/bin")).unwrap();
        std::fs::create_dir_all(root.join("modulefiles/b")).unwrap();
        std::fs::write(root.join("modulefiles/b/2.lua"), "-- mine").unwrap();
        let lua = ModulefileOptions {
            formats: Formats::Lua,
            ..Default::default()
        };
        let w = generate_missing(root, lua, &mut |p, b| std::fs::write(p, b)).unwrap();
        assert_eq!(w.written, vec![root.join("modulefiles/a/1.lua")]);
        assert!(w.warnings.is_empty());
        assert_eq!(
            std::fs::read_to_string(root.join("modulefiles/b/2.lua")).unwrap(),
            "-- mine"
        );
        assert!(
            generate_missing(root, lua, &mut |p, b| std::fs::write(p, b))
                .unwrap()
                .written
                .is_empty()
        );
        // both languages (the default): the Tcl ones are added; b's hand-written Lua file is
        // named in a warning, a's generated one is not
        let w = generate_missing(root, ModulefileOptions::default(), &mut |p, b| {
            std::fs::write(p, b)
        })
        .unwrap();
        assert_eq!(
            w.written,
            vec![root.join("modulefiles/a/1"), root.join("modulefiles/b/2")]
        );
        assert_eq!(w.warnings.len(), 1, "{:?}", w.warnings);
        assert!(
            w.warnings[0].starts_with("b/2: ") && w.warnings[0].contains("by hand"),
            "{:?}",
            w.warnings
        );
        let tcl = std::fs::read_to_string(root.join("modulefiles/a/1")).unwrap();
        assert!(tcl.starts_with("#%Module"), "{tcl}");
        assert!(
            tcl.contains("prepend-path PATH [file join $root {bin}]"),
            "{tcl}"
        );
        assert!(
            generate_missing(root, ModulefileOptions::default(), &mut |p, b| {
                std::fs::write(p, b)
            })
            .unwrap()
            .written
            .is_empty()
        );
    }

    /// A toolchain extracted with `dpkg -x` into `install/gcc/12`: PATH, MANPATH, the multiarch
    /// library and pkg-config directories come from `usr/`; a package without any bin directory
    /// gets a warning.
    #[test]
    fn debian_package_layouts() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        super::super::layout::init(root, "tools", "1", None).unwrap();
        let gcc = root.join("install/gcc/12");
        for sub in [
            "usr/bin",
            "usr/share/man/man1",
            "usr/lib/x86_64-linux-gnu/pkgconfig",
            "usr/lib/gcc",
        ] {
            std::fs::create_dir_all(gcc.join(sub)).unwrap();
        }
        std::fs::create_dir_all(root.join("install/data/1/share/doc")).unwrap();
        let opts = ModulefileOptions {
            ld_library_path: true,
            formats: Formats::Lua,
        };
        let dirs = env_dirs(&gcc, opts);
        let has = |v: &str, r: &str| dirs.iter().any(|(a, b)| *a == v && b == r);
        assert!(has("PATH", "usr/bin"), "{dirs:?}");
        assert!(has("MANPATH", "usr/share/man"), "{dirs:?}");
        assert!(
            has("PKG_CONFIG_PATH", "usr/lib/x86_64-linux-gnu/pkgconfig"),
            "{dirs:?}"
        );
        assert!(
            has("LD_LIBRARY_PATH", "usr/lib/x86_64-linux-gnu"),
            "{dirs:?}"
        );
        assert!(has("LD_LIBRARY_PATH", "usr/lib"), "{dirs:?}");
        assert!(has("CMAKE_PREFIX_PATH", "usr"), "{dirs:?}");
        let g = generate_missing(root, opts, &mut |p, b| std::fs::write(p, b)).unwrap();
        assert_eq!(g.written.len(), 2);
        let text = std::fs::read_to_string(root.join("modulefiles/gcc/12.lua")).unwrap();
        assert!(
            text.contains("prepend_path(\"PATH\", pathJoin(root, \"usr/bin\"))"),
            "{text}"
        );
        assert_eq!(g.warnings.len(), 1, "{:?}", g.warnings);
        assert!(
            g.warnings[0].starts_with("data/1: no bin/"),
            "{:?}",
            g.warnings
        );
    }
}
