//! `sw-pool build --from-env ENV OUT`: a Python environment (venv, uv, conda, pixi) laid out as a
//! pool package `install/<name>/<version>/` with its modulefiles, made relocatable.
//!
//! Relocation rules (docs/architecture.md repeats them):
//! - venv / uv: an interpreter outside the tree (pyenv, uv's managed Pythons, `/usr/bin`) is
//!   copied to `interpreter/bin/pythonX.Y` with its standard library in `interpreter/lib/pythonX.Y`
//!   (its `site-packages`/`dist-packages` left out) and, when it links `libpythonX.Y.so`, that
//!   library in `interpreter/lib/` with the copy's RUNPATH set to `$ORIGIN/../lib`. `bin/python*`
//!   become relative links to it. `pyvenv.cfg` loses `home`, `executable` and `command`: without
//!   `home` Python takes the base prefix from the real path of `bin/python` (CPython ≥ 3.11's
//!   getpath), wherever the pool is mounted.
//! - conda / pixi: the interpreter is in the tree already. Files that `conda-meta/*.json` lists
//!   with a `prefix_placeholder` (`paths_data`) are rewritten as conda-pack's `conda-unpack` does,
//!   to the prefix the package will be seen at (`--env-prefix`): `file_mode: text` by plain
//!   replacement of the original prefix (and of the placeholder, if still there); `binary` in each
//!   C string holding it, padded with NULs to the same length, refused (naming the file) when the
//!   new prefix is longer. Without `--env-prefix` they keep the original path and are named.
//! - Entry points whose shebang names the environment's interpreter get a `/bin/sh` preamble that
//!   runs the `python` beside the script (pip's own form for long shebangs).
//! - `bin/activate` computes `VIRTUAL_ENV` from its own location; `activate.csh`, `activate.fish`
//!   and `Activate.ps1` are left out (they name the original path): `module load` is the way in.
//! - `.pth` lines naming a directory under the original path become relative to `site-packages`.
//! - Absolute symlinks into the tree become relative; those out of the tree are kept and named.
//! - Every file rewritten gets its hash and size updated in the `RECORD` that lists it.
//! - Files still naming the original path afterwards are counted and named (the first few).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::exec::{show, ExecError, Tool, ToolCommand};
use swpool_format::status::ExitStatus;

mod compile;
mod conda;
mod relocate;
use compile::byte_compile;
use conda::{check_prefix, conda_placeholders, count_inodes, own_interpreter};
use relocate::{fix_records, normalize, relative_to};
pub use relocate::{
    record_hash, relocate_activate, relocate_pth, relocate_shebang, replace_prefix_binary,
    replace_prefix_text,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvKind {
    Venv,
    Uv,
    Conda,
    Pixi,
}

impl std::fmt::Display for EnvKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            EnvKind::Venv => "venv",
            EnvKind::Uv => "uv",
            EnvKind::Conda => "conda",
            EnvKind::Pixi => "pixi",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PyEnvError {
    #[error("{} is not a Python environment: it has no pyvenv.cfg (venv, uv) and no conda-meta/ (conda, pixi); give the environment's top directory (the one holding bin/python)", show(path))]
    NotAnEnv { path: PathBuf },
    #[error("{}: the environment's interpreter link is broken: {} points at {}, which {}; recreate the environment or repair the link", show(env), show(link), show(target), reason)]
    BrokenInterpreter {
        env: PathBuf,
        link: PathBuf,
        target: PathBuf,
        reason: String,
    },
    #[error(
        "{}: the environment has no interpreter (no bin/python3 or bin/python)",
        show(env)
    )]
    NoInterpreter { env: PathBuf },
    #[error("cannot include the interpreter {} of {}: {reason}; recreate the environment over a CPython (3.11 or later) that runs here", show(python), show(env))]
    Interpreter {
        env: PathBuf,
        python: PathBuf,
        reason: String,
    },
    #[error("{}: the {kind} environment's interpreter {} points out of the environment, at {}: a {kind} environment carries its own interpreter and standard library (sys.prefix is where the interpreter really lies), so a pool of it would run {} from the host; recreate the environment with its files copied in (conda create --copy, or conda-pack --format no-archive), then build again", show(env), show(link), show(target), show(target))]
    InterpreterOutside {
        env: PathBuf,
        kind: EnvKind,
        link: PathBuf,
        target: PathBuf,
    },
    #[error(transparent)]
    PrefixTooLong(Box<PrefixTooLong>),
    #[error("--env-prefix {}: {reason}", show(prefix))]
    EnvPrefix { prefix: PathBuf, reason: String },
    #[error("{} {what}: {source}", show(path))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl PyEnvError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            PyEnvError::Io { source, .. } if source.kind() != std::io::ErrorKind::NotFound => {
                ExitStatus::System
            }
            _ => ExitStatus::BadInput,
        }
    }
}

pub(super) fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> PyEnvError + 'a {
    move |source| PyEnvError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A binary file of a conda package cannot take the new prefix (boxed in [`PyEnvError`]).
#[derive(Debug, thiserror::Error)]
#[error("{} (listed with the prefix placeholder {placeholder:?} in {}) cannot be relocated to {}: {reason}; give an --env-prefix of at most {max} bytes, or build without --env-prefix (the file then keeps naming the original path)", show(file), show(meta), show(new), max = old_len)]
pub struct PrefixTooLong {
    pub file: PathBuf,
    pub meta: PathBuf,
    pub placeholder: String,
    pub new: PathBuf,
    pub old_len: usize,
    pub reason: String,
}

/// What `stage` made of an environment.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EnvReport {
    pub kind: EnvKind,
    pub source: PathBuf,
    pub python_version: String,
    /// Where the interpreter came from when it lived outside the tree (now under `interpreter/`).
    pub interpreter_included: Option<PathBuf>,
    /// `*.dist-info` / `*.egg-info` directories in site-packages (conda: `conda-meta/*.json`).
    pub packages: usize,
    pub files: u64,
    /// Files, directories and links of the package: the inodes the environment takes on shared
    /// storage as a tree (as a pool: 1).
    pub inodes: u64,
    /// conda: files rewritten for their prefix placeholder (`--env-prefix`).
    pub prefix_rewritten: usize,
    pub rewritten: Vec<PathBuf>,
    /// `.pyc` files in the package after byte-compiling it (unchecked-hash).
    pub compiled: u64,
    pub warnings: Vec<String>,
}

impl EnvReport {
    /// One line for the pool's description (shown by `inspect`).
    pub fn description(&self) -> String {
        format!(
            "Python environment: {} (Python {}), {}, {}{}; from {}; {} inodes on \
             shared storage as a tree, 1 as this pool ({} saved)",
            self.kind,
            self.python_version,
            counted(self.packages as u64, "package"),
            counted(self.files, "file"),
            match &self.interpreter_included {
                Some(p) => format!(", interpreter included from {}", p.display()),
                None => String::new(),
            },
            self.source.display(),
            self.inodes,
            self.inodes.saturating_sub(1)
        )
    }
}

/// "1 package", "2 packages".
pub fn counted(n: u64, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}

/// Where a bundled CPython `X.Y` whose executable is (really) at `exe` finds its standard library:
/// `lib/pythonX.Y` under the prefix two levels above the executable (`<prefix>/bin/python`), the
/// `os.py` landmark CPython's getpath looks for. `build --from-env` (`interpreter/bin/pythonX.Y`)
/// and `bundle --python` (the interpreter in `bin/`) both lay the standard library out here.
pub fn stdlib_beside(exe: &Path, version: &str) -> PathBuf {
    exe.parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new(""))
        .join("lib")
        .join(format!("python{version}"))
}

/// Which kind of environment `env` is, from its own files.
pub fn detect(env: &Path) -> Result<EnvKind, PyEnvError> {
    if !env.is_dir() {
        return Err(PyEnvError::NotAnEnv {
            path: env.to_path_buf(),
        });
    }
    if let Ok(cfg) = std::fs::read_to_string(env.join("pyvenv.cfg")) {
        let uv = cfg
            .lines()
            .any(|l| l.split('=').next().map(str::trim) == Some("uv"));
        return Ok(if uv { EnvKind::Uv } else { EnvKind::Venv });
    }
    if env.join("conda-meta").is_dir() {
        let s = env.to_string_lossy();
        let pixi = s.contains("/.pixi/envs/") || env.join("conda-meta/pixi").exists();
        return Ok(if pixi { EnvKind::Pixi } else { EnvKind::Conda });
    }
    Err(PyEnvError::NotAnEnv {
        path: env.to_path_buf(),
    })
}

#[derive(Debug, serde::Deserialize)]
struct Probe {
    version: String,
    full_version: String,
    stdlib: PathBuf,
    platstdlib: PathBuf,
    libdir: Option<PathBuf>,
    ldlibrary: Option<String>,
    shared: Option<i64>,
}

const PROBE: &str = "import json, sys, sysconfig\n\
p = sysconfig.get_paths()\n\
v = sysconfig.get_config_var\n\
print(json.dumps({'version': '%d.%d' % sys.version_info[:2], 'full_version': '%d.%d.%d' % sys.version_info[:3],\n\
 'stdlib': p['stdlib'], 'platstdlib': p['platstdlib'],\n\
 'libdir': v('LIBDIR'), 'ldlibrary': v('INSTSONAME'), 'shared': v('Py_ENABLE_SHARED')}))";

fn probe(python: &Path, env: &Path, path_var: Option<&OsStr>) -> Result<Probe, PyEnvError> {
    let out = ToolCommand::new(Tool::Python3)
        .program(python)
        .args(["-I", "-S", "-c", PROBE])
        .run(path_var)
        .map_err(|e| PyEnvError::Interpreter {
            env: env.to_path_buf(),
            python: python.to_path_buf(),
            reason: format!("it does not run: {e}"),
        })?;
    serde_json::from_str(out.stdout.trim()).map_err(|e| PyEnvError::Interpreter {
        env: env.to_path_buf(),
        python: python.to_path_buf(),
        reason: format!(
            "its answer to sys/sysconfig is unreadable ({e}): {}",
            out.stdout
        ),
    })
}

/// The environment's interpreter link (`bin/python3`, else `bin/python`), checked to resolve.
fn interpreter(env: &Path) -> Result<(PathBuf, PathBuf), PyEnvError> {
    for n in ["bin/python3", "bin/python"] {
        let link = env.join(n);
        if link.symlink_metadata().is_err() {
            continue;
        }
        return match std::fs::canonicalize(&link) {
            Ok(real) if real.is_file() => Ok((link, real)),
            Ok(real) => Err(PyEnvError::BrokenInterpreter {
                env: env.to_path_buf(),
                link,
                target: real,
                reason: "is not a file".into(),
            }),
            Err(e) => Err(PyEnvError::BrokenInterpreter {
                env: env.to_path_buf(),
                target: std::fs::read_link(&link).unwrap_or_default(),
                link,
                reason: format!("cannot be resolved ({e})"),
            }),
        };
    }
    Err(PyEnvError::NoInterpreter {
        env: env.to_path_buf(),
    })
}

/// Lay out `env` as `<root>/install/<name>/<version>/` (relocated), with modulefiles under
/// `<root>/modulefiles/<name>/`. `root` is a fresh directory the caller removes on failure.
pub fn stage(
    env: &Path,
    root: &Path,
    name: &str,
    version: &str,
    new_prefix: Option<&Path>,
    path_var: Option<&OsStr>,
) -> Result<EnvReport, PyEnvError> {
    new_prefix.map(check_prefix).transpose()?;
    let kind = detect(env)?;
    let env = std::fs::canonicalize(env).map_err(io("cannot be resolved", env))?;
    let real = own_interpreter(&env, kind)?;
    let pr = probe(&real, &env, path_var)?;
    let pkg = root.join("install").join(name).join(version);
    std::fs::create_dir_all(pkg.parent().unwrap_or(root)).map_err(io("cannot create", root))?;
    let mut warnings = Vec::new();
    let mut files = 0u64;
    copy_tree(&env, &env, &pkg, &mut warnings, &mut files)?;
    let mut rewritten: HashMap<PathBuf, ()> = HashMap::new();
    let mut included = None;
    if !real.starts_with(&env) && matches!(kind, EnvKind::Venv | EnvKind::Uv) {
        include_interpreter(&env, &real, &pr, &pkg, path_var, &mut files)?;
        included = Some(real.clone());
        let cfg = pkg.join("pyvenv.cfg");
        let text = std::fs::read_to_string(&cfg).map_err(io("cannot be read", &cfg))?;
        let kept: String = text
            .lines()
            .filter(|l| {
                let k = l.split('=').next().unwrap_or("").trim();
                !matches!(k, "home" | "executable" | "command")
            })
            .map(|l| format!("{l}\n"))
            .collect();
        write_file(&cfg, kept.as_bytes())?;
    }
    // entry points, activate scripts
    let bin = pkg.join("bin");
    let prefix = env.as_os_str().as_encoded_bytes().to_vec();
    if let Ok(rd) = std::fs::read_dir(&bin) {
        for e in rd.flatten() {
            let p = e.path();
            let n = e.file_name().to_string_lossy().into_owned();
            let Ok(m) = p.symlink_metadata() else {
                continue;
            };
            if !m.is_file() {
                continue;
            }
            if matches!(
                n.as_str(),
                "activate.csh" | "activate.fish" | "Activate.ps1" | "activate.nu" | "activate.bat"
            ) {
                std::fs::remove_file(&p).map_err(io("cannot remove", &p))?;
                files -= 1;
                continue;
            }
            let data = std::fs::read(&p).map_err(io("cannot be read", &p))?;
            if n == "activate" {
                if let Some(new) = relocate_activate(&data, &prefix) {
                    write_file(&p, &new)?;
                    rewritten.insert(p, ());
                }
                continue;
            }
            if let Some(new) = relocate_shebang(&data, &prefix) {
                write_file(&p, &new)?;
                std::fs::set_permissions(&p, m.permissions()).map_err(io("cannot chmod", &p))?;
                rewritten.insert(p, ());
            }
        }
    }
    let prefix_rewritten = conda_placeholders(kind, &env, &pkg, new_prefix, &mut rewritten)?;
    // .pth files
    let sites = site_packages(&pkg);
    for sp in &sites {
        if let Ok(rd) = std::fs::read_dir(sp) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension() != Some(OsStr::new("pth")) {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let sp_src = env.join(sp.strip_prefix(&pkg).unwrap_or(sp));
                if let Some(new) = relocate_pth(&text, &env, &sp_src) {
                    write_file(&p, new.as_bytes())?;
                    rewritten.insert(p, ());
                }
            }
        }
    }
    let mut packages = 0;
    for sp in &sites {
        packages += fix_records(sp, &rewritten)?;
    }
    if matches!(kind, EnvKind::Conda | EnvKind::Pixi) {
        packages = std::fs::read_dir(pkg.join("conda-meta"))
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().extension() == Some(OsStr::new("json")))
                    .count()
            })
            .unwrap_or(0);
    }
    // what still names the original path
    let mut left = Vec::new();
    scan_for(&pkg, &pkg, &prefix, &mut left);
    if !left.is_empty() {
        left.sort();
        warnings.push(format!(
            "{} file(s) still name the original path {} (they are used as they are; a program that \
             reads the path from them looks for the original tree): {}{}",
            left.len(),
            env.display(),
            left.iter()
                .take(5)
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            if left.len() > 5 { ", …" } else { "" }
        ));
        if matches!(kind, EnvKind::Conda | EnvKind::Pixi) && new_prefix.is_none() {
            warnings.push(
                "give --env-prefix DIR (where install/<name>/<version> will be seen on the nodes) \
                 to rewrite the files conda-meta lists with a prefix placeholder"
                    .into(),
            );
        }
    }
    let compiled = byte_compile(&real, &pkg, path_var, &mut warnings);
    write_modulefiles(root, name, version, &pkg, kind)?;
    let inodes = count_inodes(&pkg);
    let mut rewritten: Vec<PathBuf> = rewritten
        .into_keys()
        .map(|p| p.strip_prefix(&pkg).map(Path::to_path_buf).unwrap_or(p))
        .collect();
    rewritten.sort();
    Ok(EnvReport {
        kind,
        source: env,
        python_version: pr.full_version,
        interpreter_included: included,
        packages,
        files,
        inodes,
        prefix_rewritten,
        rewritten,
        compiled,
        warnings,
    })
}

pub(super) fn write_file(p: &Path, data: &[u8]) -> Result<(), PyEnvError> {
    // the copy may be read-only (a read-only source tree): make it writable to rewrite it
    if let Ok(m) = p.metadata() {
        let mut perm = m.permissions();
        if perm.mode() & 0o200 == 0 {
            perm.set_mode(perm.mode() | 0o200);
            let _ = std::fs::set_permissions(p, perm);
        }
    }
    std::fs::write(p, data).map_err(io("cannot be written", p))
}

/// Copy `src` (inside the environment `env`) to `dst`: files with their modes, symlinks into the
/// tree as relative links, symlinks out of it as they are (named in `warnings`).
fn copy_tree(
    env: &Path,
    src: &Path,
    dst: &Path,
    warnings: &mut Vec<String>,
    files: &mut u64,
) -> Result<(), PyEnvError> {
    let m = src.symlink_metadata().map_err(io("cannot be read", src))?;
    std::fs::create_dir(dst).map_err(io("cannot be created", dst))?;
    let rd = std::fs::read_dir(src).map_err(io("cannot be read", src))?;
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let s = e.path();
        let d = dst.join(e.file_name());
        let em = s.symlink_metadata().map_err(io("cannot be read", &s))?;
        if em.file_type().is_symlink() {
            let t = std::fs::read_link(&s).map_err(io("cannot be read", &s))?;
            let t = if t.is_absolute() {
                let tn = normalize(&t);
                if let Ok(rel) = tn.strip_prefix(env) {
                    relative_to(rel, s.parent().unwrap_or(env).strip_prefix(env).unwrap())
                } else {
                    if !is_interpreter_link(&s, env) {
                        warnings.push(format!(
                            "{} points out of the environment, at {}: kept as it is, so the pool \
                             relies on that path existing on every node",
                            s.strip_prefix(env).unwrap_or(&s).display(),
                            t.display()
                        ));
                    }
                    t
                }
            } else {
                t
            };
            std::os::unix::fs::symlink(&t, &d).map_err(io("cannot be created", &d))?;
        } else if em.is_dir() {
            copy_tree(env, &s, &d, warnings, files)?;
        } else if em.is_file() {
            std::fs::copy(&s, &d).map_err(io("cannot be copied", &s))?;
            *files += 1;
        } else {
            warnings.push(format!(
                "{} is neither a file, a directory nor a link: left out",
                s.display()
            ));
        }
    }
    std::fs::set_permissions(
        dst,
        std::fs::Permissions::from_mode(m.permissions().mode() | 0o700),
    )
    .map_err(io("cannot chmod", dst))?;
    Ok(())
}

fn is_interpreter_link(p: &Path, env: &Path) -> bool {
    p.parent() == Some(&env.join("bin"))
        && p.file_name()
            .map(|n| n.to_string_lossy().starts_with("python"))
            .unwrap_or(false)
}

/// Copy the interpreter `real` and its standard library into `<pkg>/interpreter/`, and point the
/// environment's `bin/python*` at it.
fn include_interpreter(
    env: &Path,
    real: &Path,
    pr: &Probe,
    pkg: &Path,
    path_var: Option<&OsStr>,
    files: &mut u64,
) -> Result<(), PyEnvError> {
    let err = |reason: String| PyEnvError::Interpreter {
        env: env.to_path_buf(),
        python: real.to_path_buf(),
        reason,
    };
    let v = &pr.version;
    let stdlib_name = format!("python{v}");
    if pr.stdlib.file_name() != Some(OsStr::new(&stdlib_name)) || !pr.stdlib.join("os.py").is_file()
    {
        return Err(err(format!(
            "its standard library {} is not a lib/{stdlib_name} directory holding os.py (a \
             zipped or embedded standard library cannot be included)",
            pr.stdlib.display()
        )));
    }
    if !pr.platstdlib.starts_with(&pr.stdlib) && pr.platstdlib != pr.stdlib {
        return Err(err(format!(
            "its platform library {} is outside its standard library {}",
            pr.platstdlib.display(),
            pr.stdlib.display()
        )));
    }
    let ib = pkg.join("interpreter/bin");
    let il = pkg.join("interpreter/lib");
    std::fs::create_dir_all(&ib).map_err(io("cannot be created", &ib))?;
    std::fs::create_dir_all(&il).map_err(io("cannot be created", &il))?;
    let exe = ib.join(&stdlib_name);
    std::fs::copy(real, &exe).map_err(io("cannot be copied", real))?;
    *files += 1;
    // the standard library without the base's own site-packages / dist-packages
    let dst = stdlib_beside(&exe, v);
    copy_stdlib(&pr.stdlib, &dst, files)?;
    if pr.shared == Some(1) {
        let (Some(libdir), Some(so)) = (&pr.libdir, &pr.ldlibrary) else {
            return Err(err(
                "it is built with a shared libpython but does not say where it is (LIBDIR, \
                 INSTSONAME)"
                    .into(),
            ));
        };
        let lib = libdir.join(so);
        if !lib.is_file() {
            return Err(err(format!(
                "it links {} which does not exist",
                lib.display()
            )));
        }
        std::fs::copy(&lib, il.join(so)).map_err(io("cannot be copied", &lib))?;
        *files += 1;
    }
    // the interpreter, libpython and the extension modules of the standard library find their
    // libraries through a RUNPATH naming the base prefix (pyenv, python-build-standalone): make
    // those entries relative to each file
    if let Some(base) = pr.stdlib.parent().and_then(Path::parent) {
        fix_runpaths(
            &pkg.join("interpreter"),
            &pkg.join("interpreter"),
            base,
            path_var,
        )?;
    }
    let bin = pkg.join("bin");
    for e in std::fs::read_dir(&bin)
        .map_err(io("cannot be read", &bin))?
        .flatten()
    {
        let n = e.file_name().to_string_lossy().into_owned();
        let is_py = n == "python"
            || n == "python3"
            || n.strip_prefix("python3.")
                .is_some_and(|r| r.chars().all(|c| c.is_ascii_digit()));
        if is_py {
            let p = e.path();
            let _ = std::fs::remove_file(&p);
            std::os::unix::fs::symlink(format!("../interpreter/bin/{stdlib_name}"), &p)
                .map_err(io("cannot be created", &p))?;
        }
    }
    let p = bin.join(&stdlib_name);
    if p.symlink_metadata().is_err() {
        std::os::unix::fs::symlink(format!("../interpreter/bin/{stdlib_name}"), &p)
            .map_err(io("cannot be created", &p))?;
    }
    Ok(())
}

/// RUNPATH / RPATH entries under `base` (the interpreter's prefix, copied to `top`) rewritten to
/// `$ORIGIN/…`, in every ELF file under `dir`.
fn fix_runpaths(
    top: &Path,
    dir: &Path,
    base: &Path,
    path_var: Option<&OsStr>,
) -> Result<(), PyEnvError> {
    let rd = std::fs::read_dir(dir).map_err(io("cannot be read", dir))?;
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = p.symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            fix_runpaths(top, &p, base, path_var)?;
            continue;
        }
        if !m.is_file() {
            continue;
        }
        let Ok(data) = std::fs::read(&p) else {
            continue;
        };
        if !data.starts_with(b"\x7fELF") {
            continue;
        }
        let Ok(elf) = goblin::elf::Elf::parse(&data) else {
            continue;
        };
        let entries: Vec<String> = elf
            .runpaths
            .iter()
            .chain(elf.rpaths.iter())
            .flat_map(|r| r.split(':'))
            .map(str::to_owned)
            .collect();
        if !entries.iter().any(|r| Path::new(r).starts_with(base)) {
            continue;
        }
        let here = p
            .parent()
            .and_then(|d| d.strip_prefix(top).ok())
            .unwrap_or(Path::new(""));
        let new: Vec<String> = entries
            .iter()
            .map(|r| match Path::new(r).strip_prefix(base) {
                Ok(rel) => format!("$ORIGIN/{}", relative_to(rel, here).display()),
                Err(_) => r.clone(),
            })
            .collect();
        ToolCommand::new(Tool::Patchelf)
            .args([OsStr::new("--set-rpath"), OsStr::new(&new.join(":"))])
            .arg(&p)
            .run(path_var)?;
    }
    Ok(())
}

fn copy_stdlib(src: &Path, dst: &Path, files: &mut u64) -> Result<(), PyEnvError> {
    std::fs::create_dir_all(dst).map_err(io("cannot be created", dst))?;
    for e in std::fs::read_dir(src)
        .map_err(io("cannot be read", src))?
        .flatten()
    {
        let n = e.file_name();
        if n == "site-packages" || n == "dist-packages" {
            continue;
        }
        let s = e.path();
        let d = dst.join(&n);
        let m = s.symlink_metadata().map_err(io("cannot be read", &s))?;
        if m.file_type().is_symlink() {
            let t = std::fs::read_link(&s).map_err(io("cannot be read", &s))?;
            std::os::unix::fs::symlink(&t, &d).map_err(io("cannot be created", &d))?;
        } else if m.is_dir() {
            copy_stdlib(&s, &d, files)?;
        } else if m.is_file() {
            std::fs::copy(&s, &d).map_err(io("cannot be copied", &s))?;
            *files += 1;
        }
    }
    Ok(())
}

fn site_packages(pkg: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for lib in ["lib", "lib64"] {
        let d = pkg.join(lib);
        if d.symlink_metadata().map(|m| m.is_dir()).unwrap_or(false) {
            if let Ok(rd) = std::fs::read_dir(&d) {
                for e in rd.flatten() {
                    let sp = e.path().join("site-packages");
                    if e.file_name().to_string_lossy().starts_with("python") && sp.is_dir() {
                        v.push(sp);
                    }
                }
            }
        }
    }
    v.sort();
    v
}

/// Regular files under `dir` (byte-compiled files left out) that contain `needle`.
fn scan_for(top: &Path, dir: &Path, needle: &[u8], out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let Ok(m) = p.symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            scan_for(top, &p, needle, out);
        } else if m.is_file() && p.extension() != Some(OsStr::new("pyc")) {
            if let Ok(data) = std::fs::read(&p) {
                if data.windows(needle.len()).any(|w| w == needle) {
                    out.push(p.strip_prefix(top).unwrap_or(&p).to_path_buf());
                }
            }
        }
    }
}

/// `modulefiles/<name>/<version>.lua` and `modulefiles/<name>/<version>` (Tcl): the environment
/// on `PATH`, and what activation sets.
fn write_modulefiles(
    root: &Path,
    name: &str,
    version: &str,
    pkg: &Path,
    kind: EnvKind,
) -> Result<(), PyEnvError> {
    use crate::pool::modulefile::{render, render_tcl, ModulefileOptions};
    let var = match kind {
        EnvKind::Venv | EnvKind::Uv => "VIRTUAL_ENV",
        EnvKind::Conda | EnvKind::Pixi => "CONDA_PREFIX",
    };
    let mut lua = render(
        name,
        version,
        name,
        version,
        pkg,
        ModulefileOptions::default(),
    );
    lua.push_str(&format!(
        "setenv(\"{var}\", root)\nunsetenv(\"PYTHONHOME\")\nfamily(\"python_env\")\n"
    ));
    let mut tcl = render_tcl(
        name,
        version,
        name,
        version,
        pkg,
        ModulefileOptions::default(),
    );
    tcl.push_str(&format!("setenv {var} $root\nunsetenv PYTHONHOME\n"));
    let d = root.join("modulefiles").join(name);
    std::fs::create_dir_all(&d).map_err(io("cannot be created", &d))?;
    write_file(&d.join(format!("{version}.lua")), lua.as_bytes())?;
    write_file(&d.join(version), tcl.as_bytes())?;
    let toml = format!("name = {name:?}\nversion = {version:?}\n");
    write_file(&root.join("pool.toml"), toml.as_bytes())
}

#[cfg(test)]
mod tests;
