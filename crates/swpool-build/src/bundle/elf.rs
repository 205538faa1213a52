//! ELF dependency closure, resolved the way glibc's `ld.so` resolves it.
//!
//! For an object O that needs a name N (`DT_NEEDED`), glibc 2.36 (`elf/dl-load.c`, `_dl_map_object`):
//! 1. N contains `/`: that path, with `$ORIGIN` expanded relative to O; no search.
//! 2. N matches the name or `DT_SONAME` of an object already loaded: that object (first one wins).
//! 3. O has no `DT_RUNPATH`: the `DT_RPATH` of O, then of the object that loaded O, and so on up to
//!    the executable (an object with `DT_RUNPATH` has no effective `DT_RPATH`), then the executable's.
//! 4. `LD_LIBRARY_PATH`.
//! 5. O's `DT_RUNPATH` (never inherited).
//! 6. `/etc/ld.so.cache` (unless O has `DF_1_NODEFLIB`), read through `ldconfig -p`.
//! 7. The default directories (`/lib/x86_64-linux-gnu`, `/usr/lib/x86_64-linux-gnu`, `/lib`, `/usr/lib`
//!    on Debian; parsed from `ld.so --help`), unless `DF_1_NODEFLIB`.
//!
//! In each search directory the loader first tries the `glibc-hwcaps/<level>` subdirectories the CPU
//! supports and the legacy hwcap subdirectories; a candidate of the wrong ELF class or machine is
//! skipped. Dependencies are loaded breadth first, as `ld.so --list` prints them.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use goblin::elf::Elf;

/// What the closure needs to know about one ELF file.
#[derive(Debug, Clone)]
pub struct ElfInfo {
    pub path: PathBuf,
    pub is_64: bool,
    pub machine: u16,
    pub interpreter: Option<String>,
    pub soname: Option<String>,
    pub needed: Vec<String>,
    pub rpath: Vec<String>,
    pub runpath: Vec<String>,
    pub nodeflib: bool,
    /// Has a dynamic section (false: statically linked).
    pub dynamic: bool,
    /// Libraries named in the version requirements (`.gnu.version_r` `vn_file`).
    pub verneed_files: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("{}: cannot read: {source}", crate::exec::show(path))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not an ELF file ({what}); give sw-pool bundle compiled programs or libraries (for a script, bundle its interpreter or pass the directory it lives in)", crate::exec::show(path))]
    NotElf { path: PathBuf, what: String },
    #[error("{}: damaged ELF file: {reason}", crate::exec::show(path))]
    Bad { path: PathBuf, reason: String },
}

/// Read the parts of an ELF file the closure needs; `Ok(None)` if the file is not ELF.
pub fn read(path: &Path) -> Result<ElfInfo, ElfError> {
    let bytes = std::fs::read(path).map_err(|source| ElfError::Io {
        path: path.into(),
        source,
    })?;
    if bytes.len() < 4 || &bytes[..4] != b"\x7fELF" {
        let what = if bytes.starts_with(b"#!") {
            let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
            format!("a script: {}", String::from_utf8_lossy(line).trim())
        } else if bytes.is_empty() {
            "an empty file".to_string()
        } else {
            "no ELF magic".to_string()
        };
        return Err(ElfError::NotElf {
            path: path.into(),
            what,
        });
    }
    let elf = Elf::parse(&bytes).map_err(|e| ElfError::Bad {
        path: path.into(),
        reason: e.to_string(),
    })?;
    let split = |v: &[&str]| -> Vec<String> {
        v.iter()
            .flat_map(|s| s.split(':'))
            .map(String::from)
            .collect()
    };
    let nodeflib = elf
        .dynamic
        .as_ref()
        .map(|d| d.info.flags_1 & goblin::elf::dynamic::DF_1_NODEFLIB != 0)
        .unwrap_or(false);
    Ok(ElfInfo {
        path: path.into(),
        is_64: elf.is_64,
        machine: elf.header.e_machine,
        interpreter: elf.interpreter.map(String::from),
        soname: elf.soname.map(String::from),
        needed: elf.libraries.iter().map(|s| s.to_string()).collect(),
        rpath: split(&elf.rpaths),
        runpath: split(&elf.runpaths),
        nodeflib,
        dynamic: elf.dynamic.is_some(),
        verneed_files: elf
            .verneed
            .as_ref()
            .map(|v| {
                v.iter()
                    .filter_map(|n| elf.dynstrtab.get_at(n.vn_file).map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// Whether a file starts with the ELF magic (cheap check for directory inputs and traced files).
pub fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut m = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut m))
        .map(|_| &m == b"\x7fELF")
        .unwrap_or(false)
}

/// The system's loader configuration: cache, default directories, hwcap subdirectories.
#[derive(Debug, Clone, Default)]
pub struct LoaderConfig {
    /// `ld.so.cache` entries for this architecture, in the cache's order: name → path.
    pub cache: Vec<(String, PathBuf)>,
    pub default_dirs: Vec<PathBuf>,
    /// Subdirectories tried before each search directory, in priority order.
    pub subdirs: Vec<String>,
    /// `LD_LIBRARY_PATH` entries (raw, `$ORIGIN` expanded against the executable).
    pub ld_library_path: Vec<String>,
}

impl LoaderConfig {
    /// Read the host's configuration: `ldconfig -p` for the cache, `ld.so --help` for the default
    /// directories and hwcap subdirectories; `LD_LIBRARY_PATH` from `ld_library_path`. The tools
    /// are looked up in `path_var` (the value of `PATH`).
    pub fn host(
        ld_library_path: Option<&str>,
        path_var: Option<&std::ffi::OsStr>,
    ) -> Result<LoaderConfig, crate::exec::ExecError> {
        use crate::exec::{Tool, ToolCommand};
        let cache_txt = ToolCommand::new(Tool::Ldconfig)
            .arg("-p")
            .run(path_var)?
            .stdout;
        let help = ToolCommand::new(Tool::LdSo)
            .arg("--help")
            .run(path_var)?
            .stdout;
        let mut c = LoaderConfig {
            cache: parse_ldconfig_p(&cache_txt),
            ..Default::default()
        };
        parse_ldso_help(&help, &mut c);
        if c.default_dirs.is_empty() {
            c.default_dirs = [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/lib",
                "/usr/lib",
            ]
            .iter()
            .map(PathBuf::from)
            .collect();
        }
        if let Some(l) = ld_library_path {
            // `;` separates too; an empty entry is the current directory
            c.ld_library_path = l.split([':', ';']).map(String::from).collect();
        }
        Ok(c)
    }
}

/// `ldconfig -p` lines: `\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1`.
/// Only 64-bit x86 entries without a hwcap tag are kept (this tool bundles x86-64 programs).
pub fn parse_ldconfig_p(s: &str) -> Vec<(String, PathBuf)> {
    s.lines()
        .filter_map(|l| {
            let l = l.trim();
            let (lhs, path) = l.split_once(" => ")?;
            let (name, flags) = lhs.split_once(" (")?;
            if !flags.contains("x86-64") || flags.contains("hwcap") {
                return None;
            }
            Some((name.to_string(), PathBuf::from(path)))
        })
        .collect()
}

fn parse_ldso_help(s: &str, c: &mut LoaderConfig) {
    let mut section = "";
    let mut hwcaps = Vec::new();
    for l in s.lines() {
        if !l.starts_with(' ') {
            section = l;
            continue;
        }
        let t = l.trim();
        if section.starts_with("Shared library search path") {
            if let Some(d) = t.strip_suffix(" (system search path)") {
                c.default_dirs.push(PathBuf::from(d));
            }
        } else if section.starts_with("Subdirectories of glibc-hwcaps") {
            if let Some((name, rest)) = t.split_once(' ') {
                if rest.contains("searched") {
                    hwcaps.push(format!("glibc-hwcaps/{name}"));
                }
            }
        }
    }
    // glibc 2.36 also tries the legacy subdirectories (platform x86_64, tls); 2.37 dropped them
    c.subdirs = hwcaps;
    if s.contains("Legacy HWCAP subdirectories") {
        for d in [
            "tls/x86_64/x86_64",
            "tls/x86_64",
            "tls",
            "x86_64/x86_64",
            "x86_64",
        ] {
            c.subdirs.push(d.to_string());
        }
    }
}

/// Expand `$ORIGIN`/`${ORIGIN}`, `$LIB`, `$PLATFORM` in a search-path entry or a `DT_NEEDED` path.
pub fn expand_dst(s: &str, origin: &Path) -> String {
    let o = origin.to_string_lossy();
    s.replace("${ORIGIN}", &o)
        .replace("$ORIGIN", &o)
        .replace("${LIB}", "lib/x86_64-linux-gnu")
        .replace("$LIB", "lib/x86_64-linux-gnu")
        .replace("${PLATFORM}", "x86_64")
        .replace("$PLATFORM", "x86_64")
}

/// One object of the closure.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The name it was asked for (DT_NEEDED), or the input's path for the roots.
    pub name: String,
    /// Where the loader finds it (not canonicalised: as the search found it).
    pub path: PathBuf,
    pub info: ElfInfo,
    /// Index of the object that caused it to be loaded (`None` for a root).
    pub loader: Option<usize>,
    /// How it was found: "RPATH of X", "LD_LIBRARY_PATH", "RUNPATH of X", "ld.so.cache", "default directory", "path".
    pub how: String,
    /// `(DT_NEEDED name, index of the object that satisfies it)`, in DT_NEEDED order.
    pub needs: Vec<(String, usize)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Elf(#[from] ElfError),
    #[error("{name}, needed by {}, was not found (searched: {}); install it, or point LD_LIBRARY_PATH at the directory that holds it", crate::exec::show(needed_by), searched.join(", "))]
    Missing {
        name: String,
        needed_by: PathBuf,
        searched: Vec<String>,
    },
    #[error("{}: statically linked (no dynamic section): it has no libraries to bundle; put it into a pool tree's install/<pkg>/<ver>/bin/ and run `sw-pool build` instead", crate::exec::show(path))]
    Static { path: PathBuf },
}

/// The breadth-first closure of one executable or library (`roots[0]` the main program).
pub fn closure(root: &Path, cfg: &LoaderConfig) -> Result<Vec<Loaded>, ResolveError> {
    let info = read(root)?;
    if !info.dynamic {
        return Err(ResolveError::Static { path: root.into() });
    }
    let exe_origin = parent(root);
    let mut objs: Vec<Loaded> = vec![Loaded {
        name: root.to_string_lossy().into_owned(),
        path: root.into(),
        info,
        loader: None,
        how: "input".into(),
        needs: Vec::new(),
    }];
    // names already satisfied: needed name or soname -> index
    let mut by_name: HashMap<String, usize> = HashMap::new();
    if let Some(s) = &objs[0].info.soname {
        by_name.insert(s.clone(), 0);
    }
    let mut queue = VecDeque::from([0usize]);
    while let Some(i) = queue.pop_front() {
        let needed = objs[i].info.needed.clone();
        for n in needed {
            if let Some(&j) = by_name.get(&n) {
                objs[i].needs.push((n.clone(), j));
                continue;
            }
            let (path, how) = find(&objs, i, &n, cfg, &exe_origin)?;
            // the same file loaded under another name (a path, or a soname) is one object
            let canon = std::fs::canonicalize(&path).unwrap_or(path.clone());
            if let Some(j) = objs
                .iter()
                .position(|o| std::fs::canonicalize(&o.path).unwrap_or(o.path.clone()) == canon)
            {
                by_name.insert(n.clone(), j);
                objs[i].needs.push((n.clone(), j));
                continue;
            }
            let info = read(&path)?;
            let j = objs.len();
            by_name.insert(n.clone(), j);
            if let Some(s) = &info.soname {
                by_name.entry(s.clone()).or_insert(j);
            }
            objs.push(Loaded {
                name: n.clone(),
                path,
                info,
                loader: Some(i),
                how,
                needs: Vec::new(),
            });
            objs[i].needs.push((n.clone(), j));
            queue.push_back(j);
        }
    }
    Ok(objs)
}

fn parent(p: &Path) -> PathBuf {
    let abs = crate::exec::absolute(p);
    abs.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "/".into())
}

fn compatible(p: &Path, want: &ElfInfo) -> bool {
    match read(p) {
        Ok(i) => i.is_64 == want.is_64 && i.machine == want.machine,
        Err(_) => false,
    }
}

fn find(
    objs: &[Loaded],
    i: usize,
    name: &str,
    cfg: &LoaderConfig,
    exe_origin: &Path,
) -> Result<(PathBuf, String), ResolveError> {
    let o = &objs[i];
    let origin = parent(&o.path);
    let want = &objs[0].info;
    if name.contains('/') {
        let p = PathBuf::from(expand_dst(name, &origin));
        if p.is_file() {
            return Ok((p, "path".into()));
        }
        return Err(ResolveError::Missing {
            name: name.into(),
            needed_by: o.path.clone(),
            searched: vec![p.display().to_string()],
        });
    }
    let mut searched: Vec<String> = Vec::new();
    let try_dirs = |dirs: Vec<PathBuf>, how: &str, searched: &mut Vec<String>| {
        for d in dirs {
            if d.as_os_str().is_empty() {
                continue;
            }
            let subs = cfg
                .subdirs
                .iter()
                .map(|s| d.join(s))
                .chain(std::iter::once(d.clone()));
            for sd in subs {
                let c = sd.join(name);
                if c.is_file() && compatible(&c, want) {
                    return Some((c, how.to_string()));
                }
            }
            searched.push(d.display().to_string());
        }
        None
    };
    let expand = |entries: &[String], origin: &Path| -> Vec<PathBuf> {
        entries
            .iter()
            .map(|e| {
                if e.is_empty() {
                    std::env::current_dir().unwrap_or_default()
                } else {
                    PathBuf::from(expand_dst(e, origin))
                }
            })
            .collect()
    };
    // 3. DT_RPATH chain, only when O has no DT_RUNPATH
    if o.info.runpath.is_empty() {
        let mut k = Some(i);
        let mut did_main = false;
        while let Some(j) = k {
            let l = &objs[j];
            if l.info.runpath.is_empty() && !l.info.rpath.is_empty() {
                let dirs = expand(&l.info.rpath, &parent(&l.path));
                if let Some(r) = try_dirs(
                    dirs,
                    &format!("RPATH of {}", l.path.display()),
                    &mut searched,
                ) {
                    return Ok(r);
                }
            }
            if j == 0 {
                did_main = true;
            }
            k = l.loader;
        }
        let m = &objs[0];
        if !did_main && m.info.runpath.is_empty() && !m.info.rpath.is_empty() {
            let dirs = expand(&m.info.rpath, exe_origin);
            if let Some(r) = try_dirs(dirs, "RPATH of the executable", &mut searched) {
                return Ok(r);
            }
        }
    }
    // 4. LD_LIBRARY_PATH ($ORIGIN is the executable's directory there)
    if !cfg.ld_library_path.is_empty() {
        let dirs = expand(&cfg.ld_library_path, exe_origin);
        if let Some(r) = try_dirs(dirs, "LD_LIBRARY_PATH", &mut searched) {
            return Ok(r);
        }
    }
    // 5. DT_RUNPATH of O
    if !o.info.runpath.is_empty() {
        let dirs = expand(&o.info.runpath, &origin);
        if let Some(r) = try_dirs(
            dirs,
            &format!("RUNPATH of {}", o.path.display()),
            &mut searched,
        ) {
            return Ok(r);
        }
    }
    if !o.info.nodeflib {
        // 6. ld.so.cache
        if let Some((_, p)) = cfg
            .cache
            .iter()
            .find(|(n, p)| n == name && compatible(p, want))
        {
            return Ok((p.clone(), "ld.so.cache".into()));
        }
        searched.push("/etc/ld.so.cache".into());
        // 7. default directories
        if let Some(r) = try_dirs(cfg.default_dirs.clone(), "default directory", &mut searched) {
            return Ok(r);
        }
    }
    Err(ResolveError::Missing {
        name: name.into(),
        needed_by: o.path.clone(),
        searched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldconfig_lines() {
        let s = "706 libs found in cache `/etc/ld.so.cache'\n\
                 \tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1\n\
                 \tlibz.so.1 (libc6) => /lib/i386-linux-gnu/libz.so.1\n\
                 \tlibfoo.so.2 (libc6,x86-64, hwcap: \"x86-64-v3\") => /usr/lib/glibc-hwcaps/x86-64-v3/libfoo.so.2\n";
        let v = parse_ldconfig_p(s);
        assert_eq!(
            v,
            vec![(
                "libz.so.1".to_string(),
                PathBuf::from("/lib/x86_64-linux-gnu/libz.so.1")
            )]
        );
    }

    #[test]
    fn ldso_help() {
        let s = "Shared library search path:\n  (libraries located via /etc/ld.so.cache)\n  /lib/x86_64-linux-gnu (system search path)\n  /usr/lib (system search path)\n\nSubdirectories of glibc-hwcaps directories, in priority order:\n  x86-64-v4\n  x86-64-v3 (supported, searched)\n";
        let mut c = LoaderConfig::default();
        parse_ldso_help(s, &mut c);
        assert_eq!(
            c.default_dirs,
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu"),
                PathBuf::from("/usr/lib")
            ]
        );
        assert_eq!(c.subdirs, vec!["glibc-hwcaps/x86-64-v3".to_string()]);
    }

    #[test]
    fn dst() {
        assert_eq!(
            expand_dst("$ORIGIN/../lib:${ORIGIN}", Path::new("/a/b")),
            "/a/b/../lib:/a/b"
        );
    }
}
