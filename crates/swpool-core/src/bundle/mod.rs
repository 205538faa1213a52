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

use crate::error::ExitStatus;
use crate::exec::{ExecError, Tool, ToolCommand};

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
            BundleError::Io { source, .. } => crate::error::io_status(source),
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

/// Simple glob: `*` matches any run of characters.
pub fn glob_match(pat: &str, s: &str) -> bool {
    let parts: Vec<&str> = pat.split('*').collect();
    if parts.len() == 1 {
        return pat == s;
    }
    let mut rest = s;
    for (k, part) in parts.iter().enumerate() {
        if k == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if k == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(i) => rest = &rest[i + part.len()..],
                None => return false,
            }
        }
    }
    true
}

struct Excludes {
    rules: Vec<(String, String)>,
    include: Vec<String>,
}

impl Excludes {
    fn new(o: &BundleOptions) -> Excludes {
        let mut rules: Vec<(String, String)> = Vec::new();
        if !o.no_default_excludes {
            rules.extend(
                DEFAULT_EXCLUDES
                    .iter()
                    .map(|(p, r)| (p.to_string(), r.to_string())),
            );
        }
        for p in &o.exclude {
            rules.push((p.clone(), format!("excluded by --exclude {p}")));
        }
        Excludes {
            rules,
            include: o.include.clone(),
        }
    }
    /// The reason `names` (the needed name, the soname, the file name) are excluded, if they are.
    fn reason(&self, names: &[&str]) -> Option<String> {
        if names
            .iter()
            .any(|n| self.include.iter().any(|p| glob_match(p, n)))
        {
            return None;
        }
        for (p, r) in &self.rules {
            if let Some(n) = names.iter().find(|n| glob_match(p, n)) {
                return Some(format!("{r} ({n} matches {p})"));
            }
        }
        None
    }
}

/// A file to place in the package.
#[derive(Debug, Clone)]
struct Planned {
    source: PathBuf,
    dest: PathBuf,
    kind: &'static str,
    reason: String,
    /// Bundled ELF: its closure index (root, object) for the rewrite.
    elf: Option<(usize, usize)>,
    /// Copy a symlink as a symlink (inside an input directory).
    symlink: Option<PathBuf>,
}

struct Plan {
    files: Vec<Planned>,
    /// canonical source → index in files
    by_source: HashMap<PathBuf, usize>,
    /// dest → index
    by_dest: HashMap<PathBuf, usize>,
    out: Vec<FileRecord>,
    closures: Vec<Vec<elf::Loaded>>,
    /// Which objects of each closure are bundled.
    bundled: Vec<Vec<bool>>,
    /// Alias names for bundled libraries (`lib/<other name>` → the file), for `--link runpath`.
    aliases: BTreeMap<PathBuf, PathBuf>,
}

fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

impl Plan {
    /// Add a file unless its source is already planned; returns its index.
    fn add(&mut self, p: Planned) -> usize {
        let c = canon(&p.source);
        if let Some(&i) = self.by_source.get(&c) {
            return i;
        }
        let mut p = p;
        if self.by_dest.contains_key(&p.dest) {
            // two different files want the same name (two libfoo.so.1): keep both, the second
            // under a numbered directory, and say so
            let mut k = 2;
            loop {
                let d = p
                    .dest
                    .parent()
                    .unwrap_or(Path::new(""))
                    .join(format!("alt{k}"))
                    .join(p.dest.file_name().unwrap_or_default());
                if !self.by_dest.contains_key(&d) {
                    p.reason = format!(
                        "{} (another file of the same name is {})",
                        p.reason,
                        p.dest.display()
                    );
                    p.dest = d;
                    break;
                }
                k += 1;
            }
        }
        let i = self.files.len();
        self.by_source.insert(c, i);
        self.by_dest.insert(p.dest.clone(), i);
        self.files.push(p);
        i
    }
}

/// Default trace prefix of an input: `/opt/app` for `/opt/app/bin/x`, the directory for a directory.
fn default_prefix(input: &Path) -> PathBuf {
    let abs = canon(input);
    if abs.is_dir() {
        return abs;
    }
    let dir = abs
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| "/".into());
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("bin" | "sbin" | "lib" | "lib64" | "libexec") => {
            dir.parent().map(Path::to_path_buf).unwrap_or(dir)
        }
        _ => dir,
    }
}

fn is_system_dir(p: &Path) -> bool {
    [
        "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev",
    ]
    .iter()
    .any(|d| p.starts_with(d))
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

    let cfg = elf::LoaderConfig::host(o.ld_library_path.as_deref())?;
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
        Some(python::probe(p.as_deref())?)
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
        Some(python::probe(p.as_deref())?)
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
        let mut opened = trace::trace(cmd, scratch.path())?;
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
            if let Some(pi) = &py {
                if let Some((_, rel)) = pi.locate(&f).or_else(|| pi.locate(&c)) {
                    if pi.is_stdlib(&f) {
                        plan.out.push(FileRecord {
                            source: f.clone(),
                            dest: None,
                            included: false,
                            kind: "excluded",
                            reason: format!(
                                "Python {} standard library: comes with the interpreter",
                                pi.version
                            ),
                        });
                        continue;
                    }
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
    for (alias, target) in &plan.aliases {
        let a = pkg.join(alias);
        let t = target.file_name().unwrap_or_default();
        std::os::unix::fs::symlink(t, &a).map_err(io("cannot create", &a))?;
    }
    rewrite(&plan, &pkg, o.link)?;

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
    let mut report = BundleReport {
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
                source_date_epoch: image.source_date_epoch,
            })?;
            report.build = Some(b);
            drop(tmp);
        }
        None => {
            tmp.commit(&out, o.force)?;
        }
    }
    Ok(report)
}

/// The ELF closures of `roots[*r..]` (in order; a later root reuses files an earlier one planned).
fn close_roots(
    plan: &mut Plan,
    roots: &[(PathBuf, usize)],
    r: &mut usize,
    cfg: &elf::LoaderConfig,
    ex: &Excludes,
    seen_out: &mut HashSet<PathBuf>,
) -> Result<(), BundleError> {
    while *r < roots.len() {
        let (root, k) = roots[*r].clone();
        let objs = elf::closure(&root, cfg)?;
        let ci = plan.closures.len();
        plan.files[k].elf = Some((ci, 0));
        let mut bundled = vec![false; objs.len()];
        bundled[0] = true;
        let mut reason_out: Vec<Option<String>> = vec![None; objs.len()];
        for j in 1..objs.len() {
            let l = &objs[j];
            let fname = l
                .path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut names = vec![l.name.as_str(), fname.as_str()];
            if let Some(s) = &l.info.soname {
                names.push(s);
            }
            if objs[0]
                .info
                .interpreter
                .as_deref()
                .map(|i| canon(Path::new(i)) == canon(&l.path))
                .unwrap_or(false)
            {
                reason_out[j] = Some("the loader: the host's, named by PT_INTERP".into());
            } else {
                reason_out[j] = ex.reason(&names);
            }
        }
        // bundled: reachable from the root through bundled objects only
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..objs.len() {
                if !bundled[i] {
                    continue;
                }
                for (_, j) in &objs[i].needs {
                    if !bundled[*j] && reason_out[*j].is_none() {
                        bundled[*j] = true;
                        changed = true;
                    }
                }
            }
        }
        for j in 1..objs.len() {
            let l = &objs[j];
            let needer = objs[l.loader.unwrap_or(0)].path.display().to_string();
            if bundled[j] {
                let dest_name = Path::new(&l.name)
                    .file_name()
                    .unwrap_or_default()
                    .to_os_string();
                let idx = plan.add(Planned {
                    source: l.path.clone(),
                    dest: Path::new("lib").join(&dest_name),
                    kind: "library",
                    reason: format!("needed by {needer} (found via {})", l.how),
                    elf: None,
                    symlink: None,
                });
                if plan.files[idx].elf.is_none() {
                    plan.files[idx].elf = Some((ci, j));
                }
            } else if seen_out.insert(canon(&l.path)) {
                let reason = match &reason_out[j] {
                    Some(r) => r.clone(),
                    None => {
                        "needed only by excluded libraries: comes with them from the host".into()
                    }
                };
                plan.out.push(FileRecord {
                    source: l.path.clone(),
                    dest: None,
                    included: false,
                    kind: "excluded",
                    reason,
                });
            }
        }
        plan.closures.push(objs);
        plan.bundled.push(bundled);
        *r += 1;
    }
    Ok(())
}

/// Walk an input directory: every file keeps its relative path; ELF files get their closure.
fn add_dir(
    plan: &mut Plan,
    dir: &Path,
    dest_base: &Path,
    roots: &mut Vec<(PathBuf, usize)>,
) -> Result<(), BundleError> {
    let base = crate::exec::absolute(dir);
    let mut stack = vec![base.clone()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)
            .map_err(io("cannot read", &d))?
            .filter_map(|e| e.ok())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let p = e.path();
            let ft = e.file_type().map_err(io("cannot read", &p))?;
            let rel = dest_base.join(p.strip_prefix(&base).unwrap_or(&p));
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_symlink() {
                let t = std::fs::read_link(&p).map_err(io("cannot read", &p))?;
                if t.is_relative() {
                    plan.files.push(Planned {
                        source: p.clone(),
                        dest: rel.clone(),
                        kind: "input",
                        reason: format!("in the input directory {} (a symlink)", dir.display()),
                        elf: None,
                        symlink: Some(t),
                    });
                    plan.by_dest.insert(rel, plan.files.len() - 1);
                } else if p.is_file() {
                    plan.add(Planned {
                        source: p.clone(),
                        dest: rel,
                        kind: "input",
                        reason: format!(
                            "in the input directory {} (absolute symlink, copied)",
                            dir.display()
                        ),
                        elf: None,
                        symlink: None,
                    });
                }
            } else if ft.is_file() {
                let k = plan.add(Planned {
                    source: p.clone(),
                    dest: rel,
                    kind: "input",
                    reason: format!("in the input directory {}", dir.display()),
                    elf: None,
                    symlink: None,
                });
                if elf::is_elf(&p) && elf::read(&p).map(|i| i.dynamic).unwrap_or(false) {
                    roots.push((p, k));
                }
            }
        }
    }
    Ok(())
}

fn copy_file(src: &Path, dest: &Path) -> Result<(), BundleError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(src, dest).map_err(io("cannot copy", src))?;
    let m = std::fs::metadata(src).map_err(io("cannot read", src))?;
    // keep the mode (owner-writable, for patchelf) and the mtime (Python's .pyc checks use it)
    let mode = m.permissions().mode() | 0o200;
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(mode))
        .map_err(io("cannot chmod", dest))?;
    let f = std::fs::File::options()
        .write(true)
        .open(dest)
        .map_err(io("cannot open", dest))?;
    if let Ok(t) = m.modified() {
        f.set_modified(t)
            .map_err(io("cannot set the time of", dest))?;
    }
    Ok(())
}

fn write(p: &Path, data: &[u8]) -> Result<(), BundleError> {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).map_err(io("cannot create", d))?;
    }
    std::fs::write(p, data).map_err(io("cannot write", p))
}

/// `to` relative to `from_dir` (both relative to the package root).
fn relative(from_dir: &Path, to: &Path) -> PathBuf {
    let f: Vec<_> = from_dir.components().collect();
    let t: Vec<_> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut r = PathBuf::new();
    for _ in common..f.len() {
        r.push("..");
    }
    for c in &t[common..] {
        r.push(c.as_os_str());
    }
    r
}

fn origin_path(from_dest: &Path, to_dest: &Path) -> String {
    let dir = from_dest.parent().unwrap_or(Path::new(""));
    let rel = relative(dir, to_dest);
    if rel.as_os_str().is_empty() {
        "$ORIGIN".into()
    } else {
        format!("$ORIGIN/{}", rel.display())
    }
}

/// patchelf every bundled ELF: its bundled DT_NEEDED (needed mode) and its DT_RUNPATH.
fn rewrite(plan: &Plan, pkg: &Path, mode: LinkMode) -> Result<(), BundleError> {
    let mtime = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    for f in &plan.files {
        let Some((ci, j)) = f.elf else { continue };
        let objs = &plan.closures[ci];
        let o = &objs[j];
        let mut args: Vec<String> = Vec::new();
        let mut dirs: Vec<String> = Vec::new();
        for (n, k) in &o.needs {
            if !plan.bundled[ci][*k] {
                continue;
            }
            let Some(&fi) = plan.by_source.get(&canon(&objs[*k].path)) else {
                continue;
            };
            let target = &plan.files[fi].dest;
            match mode {
                LinkMode::Needed if !o.info.verneed_files.contains(n) => {
                    args.push("--replace-needed".into());
                    args.push(n.clone());
                    args.push(origin_path(&f.dest, target));
                }
                LinkMode::Needed => {
                    // a library named in the version requirements keeps its name: glibc matches
                    // `vn_file` against the names objects were loaded under, and a rewritten
                    // `$ORIGIN/…` name does not match across objects in different directories
                    // (dl-version.c asserts). It is found through DT_RUNPATH instead.
                    let d = origin_path(&f.dest, target);
                    let d = d.rsplit_once('/').map(|(a, _)| a.to_string()).unwrap_or(d);
                    if !dirs.contains(&d) {
                        dirs.push(d);
                    }
                }
                LinkMode::Runpath => {
                    let d = origin_path(&f.dest, target);
                    let d = d.rsplit_once('/').map(|(a, _)| a.to_string()).unwrap_or(d);
                    if !dirs.contains(&d) {
                        dirs.push(d);
                    }
                }
            }
        }
        let had_path = !o.info.rpath.is_empty() || !o.info.runpath.is_empty();
        let lib_dir = {
            let d = origin_path(&f.dest, Path::new("lib/x"));
            d.rsplit_once('/').map(|(a, _)| a.to_string()).unwrap_or(d)
        };
        match mode {
            LinkMode::Needed => {
                if had_path && !dirs.contains(&lib_dir) {
                    // keeps dlopen("libplugin.so") working from the bundled lib/
                    dirs.push(lib_dir);
                }
                if !dirs.is_empty() {
                    args.push("--set-rpath".into());
                    args.push(dirs.join(":"));
                }
            }
            LinkMode::Runpath => {
                if had_path && !dirs.contains(&lib_dir) {
                    dirs.push(lib_dir);
                }
                if !dirs.is_empty() {
                    args.push("--set-rpath".into());
                    args.push(dirs.join(":"));
                }
            }
        }
        let file = pkg.join(&f.dest);
        if args.is_empty() {
            if had_path {
                // an RPATH into the original tree must not survive
                ToolCommand::new(Tool::Patchelf)
                    .arg("--remove-rpath")
                    .path(&file)
                    .run()?;
            }
            continue;
        }
        let t = mtime(&file);
        // the RUNPATH first, the DT_NEEDED names in a second call: patchelf 0.14 wrote a
        // replacement name into DT_RUNPATH when both came in one call on a DT_RPATH file
        let split = args.iter().position(|a| a == "--set-rpath");
        let (needed, rpath) = match split {
            Some(i) => (&args[..i], &args[i..]),
            None => (&args[..], &args[..0]),
        };
        for part in [rpath, needed] {
            if !part.is_empty() {
                ToolCommand::new(Tool::Patchelf)
                    .args(part)
                    .path(&file)
                    .run()?;
            }
        }
        if let Some(t) = t {
            if let Ok(h) = std::fs::File::options().write(true).open(&file) {
                let _ = h.set_modified(t);
            }
        }
    }
    Ok(())
}

/// A temporary directory beside OUT, registered for removal on a signal, removed on drop unless
/// committed.
struct TempDir {
    path: PathBuf,
    done: bool,
}

fn tempdir_beside(out: &Path, what: &str) -> Result<TempDir, BundleError> {
    let dir = crate::atomic::parent_dir(out);
    let name = out.file_name().unwrap_or_default().to_string_lossy();
    let p = dir.join(format!(".{name}.swpool-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p); // a leftover of an earlier run with our pid
    std::fs::create_dir(&p).map_err(io("cannot create", &p))?;
    crate::atomic::register_dir(&p);
    Ok(TempDir {
        path: p,
        done: false,
    })
}

impl TempDir {
    fn path(&self) -> &Path {
        &self.path
    }
    /// Rename into place (replacing an old OUT when `force`).
    fn commit(mut self, out: &Path, force: bool) -> Result<(), BundleError> {
        let old = crate::atomic::parent_dir(out).join(format!(
            ".{}.swpool-old-{}",
            out.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        let had_old = force && (out.exists() || out.is_symlink());
        if had_old {
            std::fs::rename(out, &old).map_err(io("cannot move away", out))?;
        }
        if let Err(e) = std::fs::rename(&self.path, out) {
            if had_old {
                let _ = std::fs::rename(&old, out);
            }
            return Err(io("cannot rename into place", out)(e));
        }
        self.done = true;
        crate::atomic::unregister_dir(&self.path);
        if had_old {
            if old.is_dir() {
                let _ = std::fs::remove_dir_all(&old);
            } else {
                let _ = std::fs::remove_file(&old);
            }
        }
        let _ = crate::atomic::sync_dir(crate::atomic::parent_dir(out));
        Ok(())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.path);
            crate::atomic::unregister_dir(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("libmpi*", "libmpi.so.40"));
        assert!(glob_match("libc.so.*", "libc.so.6"));
        assert!(!glob_match("libc.so.*", "libcrypt.so.1"));
        assert!(glob_match("*verbs*", "libibverbs.so.1"));
        assert!(glob_match("libz.so.1", "libz.so.1"));
        assert!(!glob_match("libz.so.1", "libz.so.12"));
    }

    #[test]
    fn origin_paths() {
        assert_eq!(
            origin_path(Path::new("bin/x"), Path::new("lib/liba.so.1")),
            "$ORIGIN/../lib/liba.so.1"
        );
        assert_eq!(
            origin_path(Path::new("lib/liba.so"), Path::new("lib/libb.so")),
            "$ORIGIN/libb.so"
        );
        assert_eq!(
            origin_path(Path::new("python/pkg/sub/m.so"), Path::new("lib/libm0.so")),
            "$ORIGIN/../../../lib/libm0.so"
        );
    }

    #[test]
    fn excludes() {
        let o = BundleOptions {
            inputs: vec![],
            name: None,
            version: None,
            out: "x".into(),
            force: false,
            python: None,
            trace: None,
            trace_prefixes: vec![],
            exclude: vec!["libfoo*".into()],
            include: vec!["libm.so.6".into()],
            no_default_excludes: false,
            link: LinkMode::Needed,
            ld_library_path: None,
        };
        let e = Excludes::new(&o);
        assert!(e.reason(&["libc.so.6"]).unwrap().contains("C library"));
        assert!(e.reason(&["libmpi.so.40"]).unwrap().contains("MPI"));
        assert!(e.reason(&["libibverbs.so.1"]).is_some());
        assert!(e.reason(&["libfoo.so.3"]).unwrap().contains("--exclude"));
        assert!(e.reason(&["libm.so.6"]).is_none());
        assert!(e.reason(&["libz.so.1"]).is_none());
    }
}
