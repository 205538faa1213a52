//! `sw-pool bundle`: put a program, the libraries it loads and the files it opens into a pool tree.
//!
//! 1. The ELF closure of every input, resolved as glibc's loader does ([`elf`]).
//! 2. With `--trace -- CMD`: every file CMD opened under the traced prefixes ([`trace`]): `dlopen`ed
//!    plugins (with their own closure), Python modules (`--python`, laid out under `python/` by
//!    import path, [`python`]), data files.
//! 3. An exclude list: the C library and the loader, MPI and the interconnect stack, GPU drivers
//!    (they must match the host); `bundle.json` says for every file why it is in or out.
//! 4. The copies' library references are rewritten with patchelf so the loader does no search:
//!    [`LinkMode::Needed`] (default) replaces every bundled `DT_NEEDED` by `$ORIGIN/<relative path>`
//!    — glibc expands `$ORIGIN` in a `DT_NEEDED` that contains a `/` and opens exactly that file,
//!    as Shrinkwrap's absolute paths do, but the pool may be mounted anywhere (`sw-pool load` mounts
//!    at `$SW_POOL_MOUNT/NAME/VERSION`, per user, or at `-m DIR`); [`LinkMode::Runpath`] only sets
//!    `DT_RUNPATH` to `$ORIGIN`-relative directories (the loader searches them).
//! 5. The result is written to a temporary directory beside OUT and renamed into place at the end
//!    (or built into a pool file with the image builder): never half-written.

pub mod elf;
pub mod python;
pub mod trace;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::exec::{ExecError, Tool, ToolCommand};
use swpool_format::status::ExitStatus;

/// How bundled objects find the bundled libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkMode {
    /// `DT_NEEDED` = `$ORIGIN/../lib/libx.so.1`: no search at all (Shrinkwrap, position independent).
    Needed,
    /// `DT_RUNPATH` = `$ORIGIN/../lib`: the loader searches one directory first.
    Runpath,
}

/// Library name patterns excluded by default, with the reason (`*` matches any run of characters).
pub const DEFAULT_EXCLUDES: &[(&str, &str)] = &[
    ("ld-linux*", "the loader: the host's, named by PT_INTERP"),
    ("libc.so.*", "the C library: must match the host's loader"),
    (
        "libm.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libmvec.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libpthread.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libdl.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "librt.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libutil.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libresolv.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libanl.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libnss_*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libthread_db.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libBrokenLocale.so.*",
        "the C library (glibc): must match the host's loader",
    ),
    (
        "libmpi*",
        "MPI: must come from the host (matches its launcher and network)",
    ),
    (
        "libopen-rte.so*",
        "MPI (Open MPI runtime): must come from the host",
    ),
    (
        "libopen-pal.so*",
        "MPI (Open MPI runtime): must come from the host",
    ),
    (
        "libmca_*",
        "MPI (Open MPI components): must come from the host",
    ),
    (
        "libpmix.so*",
        "process management (PMIx): must come from the host's launcher",
    ),
    (
        "libpmi.so*",
        "process management (PMI): must come from the host's launcher",
    ),
    (
        "libpmi2.so*",
        "process management (PMI-2): must come from the host's launcher",
    ),
    (
        "libfabric.so*",
        "interconnect stack (libfabric): must match the host's network",
    ),
    (
        "libibverbs.so*",
        "interconnect stack (verbs): must match the host's network",
    ),
    (
        "librdmacm.so*",
        "interconnect stack (RDMA CM): must match the host's network",
    ),
    (
        "libmlx*",
        "interconnect stack (Mellanox provider): must match the host's network",
    ),
    (
        "libucp.so*",
        "interconnect stack (UCX): must match the host's network",
    ),
    (
        "libucs.so*",
        "interconnect stack (UCX): must match the host's network",
    ),
    (
        "libuct.so*",
        "interconnect stack (UCX): must match the host's network",
    ),
    (
        "libucm.so*",
        "interconnect stack (UCX): must match the host's network",
    ),
    (
        "libpsm*",
        "interconnect stack (PSM): must match the host's network",
    ),
    (
        "libcxi.so*",
        "interconnect stack (Slingshot CXI): must match the host's network",
    ),
    (
        "libhfi*",
        "interconnect stack (Omni-Path): must match the host's network",
    ),
    (
        "libslurm*",
        "the resource manager: must match the host's Slurm",
    ),
    (
        "libmunge.so*",
        "the resource manager (munge): must match the host",
    ),
    (
        "libcuda.so*",
        "GPU driver: must match the host's kernel driver",
    ),
    (
        "libnvidia-*",
        "GPU driver: must match the host's kernel driver",
    ),
    ("libGL.so*", "graphics driver (GL): must match the host"),
    ("libEGL*", "graphics driver (EGL): must match the host"),
    ("libGLX*", "graphics driver (GLX): must match the host"),
];

#[derive(Debug, Clone)]
pub struct BundleOptions {
    /// Executables, libraries or directories.
    pub inputs: Vec<PathBuf>,
    pub name: Option<String>,
    pub version: Option<String>,
    /// A directory (the pool tree) or a pool file (`.sqfs`, `.ext4`, …).
    pub out: PathBuf,
    pub force: bool,
    /// `--python[=PYTHON]`: `Some(None)` for `python3`.
    pub python: Option<Option<PathBuf>>,
    /// `--trace -- CMD ARGS…`
    pub trace: Option<Vec<OsString>>,
    /// Directories whose traced files are bundled; default: the inputs' installation prefixes.
    pub trace_prefixes: Vec<PathBuf>,
    /// Extra exclude patterns (with the default list unless `no_default_excludes`).
    pub exclude: Vec<String>,
    /// Patterns taken off the exclude list.
    pub include: Vec<String>,
    pub no_default_excludes: bool,
    pub link: LinkMode,
    /// `LD_LIBRARY_PATH` the closure is resolved with (the caller's environment).
    pub ld_library_path: Option<String>,
    /// `PYTHONPATH` (the caller's environment): with `--python`, its directories count as module
    /// directories too.
    pub pythonpath: Option<OsString>,
    /// The value of `PATH` the tools (patchelf, strace, ldconfig, ld.so, python3, mksquashfs, …)
    /// are looked up in (the caller's environment; see [`crate::exec::Tool::locate`]).
    pub path_var: Option<OsString>,
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{}: {reason}", crate::exec::show(path))]
    Input { path: PathBuf, reason: String },
    #[error(transparent)]
    Resolve(#[from] elf::ResolveError),
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(
        "{} exists; use --force to replace it, or choose another --out",
        crate::exec::show(path)
    )]
    Exists { path: PathBuf },
    #[error("{what} {}: {source}", crate::exec::show(path))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Build(#[from] crate::image::BuildError),
}

impl BundleError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            BundleError::Input { .. } | BundleError::Exists { .. } => ExitStatus::BadInput,
            BundleError::Resolve(_) => ExitStatus::BadInput,
            BundleError::Trace(trace::TraceError::CommandFailed { .. }) => ExitStatus::BadInput,
            BundleError::Trace(trace::TraceError::Exec(e)) => e.exit_status(),
            BundleError::Trace(trace::TraceError::Log { .. }) => ExitStatus::System,
            BundleError::Exec(e) => e.exit_status(),
            BundleError::Io { source, .. } => swpool_format::status::io_status(source),
            BundleError::Usage(_) => ExitStatus::Usage,
            BundleError::Build(e) => e.exit_status(),
        }
    }
}

/// One line of `bundle.json`: a file and why it is in the bundle or not.
#[derive(Debug, Clone, Serialize)]
pub struct FileRecord {
    /// Where it came from (as found: the path the loader or the traced command used).
    pub source: PathBuf,
    /// Where it is in the package (`bin/x`, `lib/libx.so.1`, `python/pkg/mod.py`); `None` if out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dest: Option<PathBuf>,
    pub included: bool,
    /// input, library, plugin, python, data, excluded, outside-prefix
    pub kind: &'static str,
    pub reason: String,
}

#[derive(Debug, Serialize)]
pub struct BundleReport {
    pub name: String,
    pub version: String,
    /// The pool tree or pool file written.
    pub out: PathBuf,
    pub link: LinkMode,
    pub files: Vec<FileRecord>,
    /// The traced command, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub traced: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<python::PythonInfo>,
    /// The package directory inside the tree: `install/NAME/VERSION`.
    pub package: PathBuf,
    /// What the bundle relies on the host for beyond the exclude list (with `--python`: the
    /// standard library).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(skip)]
    pub build: Option<crate::image::BuildReport>,
}

impl BundleReport {
    pub fn included(&self) -> usize {
        self.files.iter().filter(|f| f.included).count()
    }
}

/// Options of the image build when OUT is a pool file.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    pub chunk_size: u64,
    pub squashfs_level: Option<u32>,
    pub source_date_epoch: Option<u64>,
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BundleError + 'a {
    move |source| BundleError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Bundle `o.inputs` into `o.out`.
pub fn bundle(o: &BundleOptions, image: &ImageOptions) -> Result<BundleReport, BundleError> {
    if o.inputs.is_empty() && o.trace.is_none() {
        return Err(BundleError::Usage(
            "give at least one EXE or DIR to bundle, or --trace -- CMD".into(),
        ));
    }
    if o.inputs.is_empty() && o.trace_prefixes.is_empty() && o.python.is_none() {
        return Err(BundleError::Usage(
            "without EXE or DIR, say which files of the traced command to bundle: --trace-prefix DIR or --python".into(),
        ));
    }
    let first: PathBuf = match (o.inputs.first(), &o.trace) {
        (Some(i), _) => i.clone(),
        (None, Some(cmd)) => cmd.first().map(PathBuf::from).unwrap_or_default(),
        (None, None) => PathBuf::new(),
    };
    if o.python.is_some() && o.trace.is_none() {
        return Err(BundleError::Usage(
            "--python bundles the modules a command imports: add --trace -- CMD ARGS… (e.g. --trace -- python3 app.py)".into(),
        ));
    }
    let name = match &o.name {
        Some(n) => n.clone(),
        None => first
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "bundle".into()),
    };
    let version = o.version.clone().unwrap_or_else(|| "0".into());
    for (what, v) in [("name", &name), ("version", &version)] {
        crate::pool::manifest::check_name(what, v).map_err(|reason| BundleError::Input {
            path: first.clone(),
            reason: format!("{reason} (set --name / --version)"),
        })?;
    }
    let image_format = crate::image::ImageFormat::from_extension(&o.out);
    let out = crate::exec::absolute(&o.out);
    if (out.exists() || out.is_symlink()) && !o.force {
        return Err(BundleError::Exists { path: out });
    }
    let out_dir = crate::atomic::parent_dir(&out).to_path_buf();
    if !out_dir.is_dir() {
        return Err(BundleError::Input {
            path: out_dir,
            reason: "the directory of --out does not exist; create it first".into(),
        });
    }
    // inputs exist and are what they claim, before anything is written
    for i in &o.inputs {
        let m = std::fs::metadata(i).map_err(|e| BundleError::Input {
            path: i.clone(),
            reason: format!("{e}; give an existing executable, library or directory"),
        })?;
        if m.is_file() {
            let info = elf::read(i).map_err(elf::ResolveError::from)?;
            if !info.dynamic {
                return Err(elf::ResolveError::Static { path: i.clone() }.into());
            }
        } else if !m.is_dir() {
            return Err(BundleError::Input {
                path: i.clone(),
                reason: "not a regular file or directory".into(),
            });
        }
        if out.starts_with(canon(i)) {
            return Err(BundleError::Input {
                path: out.clone(),
                reason: format!(
                    "--out lies inside the input {}; write it elsewhere",
                    i.display()
                ),
            });
        }
    }

    let cfg = elf::LoaderConfig::host(o.ld_library_path.as_deref(), o.path_var.as_deref())?;
    let ex = Excludes::new(o);
    let mut plan = Plan {
        files: Vec::new(),
        by_source: HashMap::new(),
        by_dest: HashMap::new(),
        out: Vec::new(),
        closures: Vec::new(),
        bundled: Vec::new(),
        aliases: BTreeMap::new(),
    };

    let py: Option<python::PythonInfo> = if let (Some(p), Some(_)) = (&o.python, &o.trace) {
        Some(python::probe(
            p.as_deref(),
            o.pythonpath.as_deref(),
            o.path_var.as_deref(),
        )?)
    } else {
        None
    };
    // 1. inputs
    let mut roots: Vec<(PathBuf, usize)> = Vec::new(); // ELF root path, its plan index
    for i in &o.inputs {
        if i.is_file() {
            let info = elf::read(i).map_err(elf::ResolveError::from)?;
            let fname = i.file_name().unwrap_or_default();
            let sub = if info.interpreter.is_some() {
                "bin"
            } else {
                "lib"
            };
            let k = plan.add(Planned {
                source: crate::exec::absolute(i),
                dest: Path::new(sub).join(fname),
                kind: "input",
                reason: "named on the command line".into(),
                elf: None,
                symlink: None,
            });
            roots.push((crate::exec::absolute(i), k));
        } else {
            // a directory on the Python module path lands under python/ at its import path
            let under = py.as_ref().and_then(|pi| {
                let c = canon(i);
                pi.locate(&c).map(|(_, rel)| Path::new("python").join(rel))
            });
            add_dir(
                &mut plan,
                i,
                under.as_deref().unwrap_or(Path::new("")),
                &mut roots,
            )?;
        }
    }

    // 2. the static closure of the inputs, then the traced files and their closures
    let mut seen_out: HashSet<PathBuf> = HashSet::new();
    let mut r = 0;
    close_roots(&mut plan, &roots, &mut r, &cfg, &ex, &mut seen_out)?;
    let py: Option<python::PythonInfo> = if let (Some(p), Some(_)) = (&o.python, &o.trace) {
        Some(python::probe(
            p.as_deref(),
            o.pythonpath.as_deref(),
            o.path_var.as_deref(),
        )?)
    } else {
        None
    };
    let mut traced_cmd = None;
    let scratch = tempdir_beside(&out, "trace")?;
    if let Some(cmd) = &o.trace {
        if cmd.is_empty() {
            return Err(BundleError::Usage(
                "--trace needs a command after --".into(),
            ));
        }
        traced_cmd = Some(
            cmd.iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
        );
        let mut prefixes: Vec<PathBuf> = if o.trace_prefixes.is_empty() {
            o.inputs.iter().map(|i| default_prefix(i)).collect()
        } else {
            o.trace_prefixes.iter().map(|p| canon(p)).collect()
        };
        if let Some(pi) = &py {
            prefixes.extend(pi.path.iter().cloned());
        }
        let mut opened = trace::trace(cmd, scratch.path(), o.path_var.as_deref())?;
        if let Some(pi) = &py {
            opened = pi.with_companions(opened);
        }
        let mut outside = 0usize;
        for f in opened {
            let c = canon(&f);
            let Ok(m) = std::fs::metadata(&c) else {
                continue;
            };
            if !m.is_file() || plan.by_source.contains_key(&c) {
                continue;
            }
            let under = prefixes
                .iter()
                .any(|p| f.starts_with(p) || c.starts_with(p));
            if !under {
                outside += 1;
                if !is_system_dir(&c) {
                    plan.out.push(FileRecord {
                        source: f.clone(),
                        dest: None,
                        included: false,
                        kind: "outside-prefix",
                        reason: "opened by the traced command, outside the traced prefixes (--trace-prefix)".into(),
                    });
                }
                continue;
            }
            let is_elf = elf::is_elf(&c);
            // the exclude list applies to what the command opened or executed as it does to the
            // closure: the C library and the loader, MPI, drivers come from the host
            if let Some(reason) = traced_exclusion(&ex, &f, &c, is_elf) {
                if seen_out.insert(c.clone()) {
                    plan.out.push(FileRecord {
                        source: f.clone(),
                        dest: None,
                        included: false,
                        kind: "excluded",
                        reason,
                    });
                }
                continue;
            }
            if let Some(pi) = &py {
                // with the interpreter in the bundle, the standard library goes where it looks
                // (the rule `build --from-env` follows too): lib/pythonX.Y beside bin/
                if let Some(dest) = pi.stdlib_dest(&plan, &f, &c) {
                    let k = plan.add(pi.planned(f.clone(), dest, "the bundled interpreter's standard library, imported by the traced command"));
                    if is_elf && elf::read(&c).map(|i| i.dynamic).unwrap_or(false) {
                        roots.push((f.clone(), k));
                    }
                    continue;
                }
                // else the standard library stays the host's, wherever the file was found from
                if pi.is_stdlib(&f) || pi.is_stdlib(&c) {
                    plan.out.push(FileRecord {
                        source: f.clone(),
                        dest: None,
                        included: false,
                        kind: "excluded",
                        reason: format!(
                            "Python {} standard library: not bundled, the host's interpreter's is used",
                            pi.version
                        ),
                    });
                    continue;
                }
                if let Some((_, rel)) = pi.locate(&f).or_else(|| pi.locate(&c)) {
                    let k = plan.add(Planned {
                        source: f.clone(),
                        dest: Path::new("python").join(rel),
                        kind: "python",
                        reason: "imported by the traced command (a module file under sys.path)"
                            .into(),
                        elf: None,
                        symlink: None,
                    });
                    if is_elf && elf::read(&c).map(|i| i.dynamic).unwrap_or(false) {
                        roots.push((f.clone(), k));
                    }
                    continue;
                }
            }
            if is_elf {
                let info = elf::read(&c).map_err(elf::ResolveError::from)?;
                let fname = f.file_name().unwrap_or_default().to_os_string();
                let (sub, kind, reason) = if info.interpreter.is_some() {
                    ("bin", "input", "executed by the traced command")
                } else {
                    ("lib", "plugin", "opened by the traced command (dlopen)")
                };
                let k = plan.add(Planned {
                    source: f.clone(),
                    dest: Path::new(sub).join(fname),
                    kind,
                    reason: reason.into(),
                    elf: None,
                    symlink: None,
                });
                if info.dynamic {
                    roots.push((f.clone(), k));
                }
            } else {
                let p = prefixes
                    .iter()
                    .filter(|p| f.starts_with(p))
                    .max_by_key(|p| p.as_os_str().len())
                    .cloned();
                let rel = match &p {
                    Some(p) => f.strip_prefix(p).unwrap_or(&f).to_path_buf(),
                    None => PathBuf::from(f.file_name().unwrap_or_default()),
                };
                plan.add(Planned {
                    source: f.clone(),
                    dest: Path::new("share").join(rel),
                    kind: "data",
                    reason: "opened by the traced command (data file)".into(),
                    elf: None,
                    symlink: None,
                });
            }
        }
        tracing::debug!(outside, "traced files outside the prefixes");
    }
    if let Some(l) = py.as_ref().and_then(|pi| pi.landmark(&plan)) {
        plan.add(l);
    }
    close_roots(&mut plan, &roots, &mut r, &cfg, &ex, &mut seen_out)?;

    // names under which a bundled library is needed besides its file's name (runpath mode)
    for (ci, objs) in plan.closures.iter().enumerate() {
        for (i, o) in objs.iter().enumerate() {
            if !plan.bundled[ci][i] {
                continue;
            }
            for (n, j) in &o.needs {
                if !plan.bundled[ci][*j] || n.contains('/') {
                    continue;
                }
                if let Some(&fi) = plan.by_source.get(&canon(&objs[*j].path)) {
                    let d = &plan.files[fi].dest;
                    let alias = d.parent().unwrap_or(Path::new("")).join(n);
                    if &alias != d && !plan.by_dest.contains_key(&alias) {
                        plan.aliases.insert(alias, d.clone());
                    }
                }
            }
        }
    }

    // 4. write: a temporary tree, then rename (or build)
    let tmp = tempdir_beside(&out, "tree")?;
    let root = tmp.path().to_path_buf();
    let pkg_rel = Path::new("install").join(&name).join(&version);
    let pkg = root.join(&pkg_rel);
    for f in &plan.files {
        let d = pkg.join(&f.dest);
        if let Some(parent) = d.parent() {
            std::fs::create_dir_all(parent).map_err(io("cannot create", parent))?;
        }
        if let Some(t) = &f.symlink {
            std::os::unix::fs::symlink(t, &d).map_err(io("cannot create", &d))?;
            continue;
        }
        copy_file(&f.source, &d)?;
    }
    if let Some(d) = py.as_ref().and_then(|pi| pi.lib_dynload(&plan)) {
        let d = pkg.join(d);
        std::fs::create_dir_all(&d).map_err(io("cannot create", &d))?;
    }
    for (alias, target) in &plan.aliases {
        let a = pkg.join(alias);
        let t = target.file_name().unwrap_or_default();
        std::os::unix::fs::symlink(t, &a).map_err(io("cannot create", &a))?;
    }
    rewrite(&plan, &pkg, o.link, o.path_var.as_deref())?;

    let mut records: Vec<FileRecord> = plan
        .files
        .iter()
        .map(|f| FileRecord {
            source: f.source.clone(),
            dest: Some(f.dest.clone()),
            included: true,
            kind: f.kind,
            reason: f.reason.clone(),
        })
        .collect();
    records.extend(plan.out.iter().cloned());

    // pool.toml, modulefile, bundle.json
    let toml_text = format!(
        "# written by sw-pool bundle\nname = {:?}\nversion = {:?}\ndescription = {:?}\n",
        name,
        version,
        format!("{} bundled by sw-pool bundle", first.display())
    );
    write(&root.join("pool.toml"), toml_text.as_bytes())?;
    let mut mf = crate::pool::modulefile::render(
        &name,
        &version,
        &name,
        &version,
        &pkg,
        crate::pool::modulefile::ModulefileOptions::default(),
    );
    if pkg.join("python").is_dir() {
        mf.push_str("prepend_path(\"PYTHONPATH\", pathJoin(root, \"python\"))\n");
    }
    let mfd = root.join("modulefiles").join(&name);
    std::fs::create_dir_all(&mfd).map_err(io("cannot create", &mfd))?;
    write(&mfd.join(format!("{version}.lua")), mf.as_bytes())?;
    let notes: Vec<String> = py
        .iter()
        .filter(|pi| pi.bundled_at(&plan).is_none())
        .map(|pi| {
            format!(
                "Python's standard library is not bundled: the modules under python/ run with the \
                 host's ({}, Python {}), as does a bundled interpreter (it finds no standard \
                 library beside it); run the bundle where Python {} is installed",
                pi.stdlib
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                pi.version,
                pi.version
            )
        })
        .collect();
    let mut report = BundleReport {
        notes,
        name: name.clone(),
        version: version.clone(),
        out: out.clone(),
        link: o.link,
        files: records,
        traced: traced_cmd,
        python: py,
        package: pkg_rel.clone(),
        build: None,
    };
    let json = serde_json::to_vec_pretty(&report).expect("report serialises");
    write(&pkg.join("bundle.json"), &json)?;
    drop(scratch);

    match image_format {
        Some(fmt) => {
            let b = crate::image::build(&crate::image::BuildOptions {
                out: out.clone(),
                src: root.clone(),
                size: None,
                format: Some(fmt),
                name: Some(name),
                version: Some(version),
                force: o.force,
                chunk_size: image.chunk_size,
                gen_modulefiles: false,
                modulefile_opts: Default::default(),
                squashfs_level: image.squashfs_level,
                no_compress: false,
                all_root: false,
                keep_special: false,
                source_date_epoch: image.source_date_epoch,
                path_var: o.path_var.clone(),
            })?;
            report.build = Some(b);
            drop(tmp);
        }
        None => {
            tmp.commit(&out, o.force)
                .map_err(io("cannot rename into place", &out))?;
        }
    }
    Ok(report)
}

/// Why a traced file (as opened, `f`; resolved, `c`) is left out by the exclude list: by its
/// file names and, for an ELF object, its soname.
fn traced_exclusion(ex: &Excludes, f: &Path, c: &Path, is_elf: bool) -> Option<String> {
    let mut names: Vec<String> = [f, c]
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    if is_elf {
        if let Some(s) = elf::read(c).ok().and_then(|i| i.soname) {
            names.push(s);
        }
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    ex.reason(&refs)
}

mod exclude;
mod place;
pub use exclude::glob_match;
use exclude::Excludes;
use place::*;

#[cfg(test)]
mod tests;
