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

/// Bundle `o.inputs` into `o.out`: the checks before anything is written, the plan (the inputs,
/// their closure, the traced files and theirs), then a temporary tree written, described and
/// renamed into place or built into a pool file ([`steps`]).
pub fn bundle(o: &BundleOptions, image: &ImageOptions) -> Result<BundleReport, BundleError> {
    let head = steps::check(o)?;
    let cfg = elf::LoaderConfig::host(o.ld_library_path.as_deref(), o.path_var.as_deref())?;
    let ex = Excludes::new(o);
    let mut plan = Plan::default();
    // the interpreter is asked once: its module path places the inputs and the traced files
    let py: Option<python::PythonInfo> = match (&o.python, &o.trace) {
        (Some(p), Some(_)) => Some(python::probe(
            p.as_deref(),
            o.pythonpath.as_deref(),
            o.path_var.as_deref(),
        )?),
        _ => None,
    };
    let mut roots = steps::plan_inputs(o, &mut plan, py.as_ref())?;
    let mut closure = steps::Closure::default();
    closure.close(&mut plan, &roots, &cfg, &ex)?;
    let traced = match &o.trace {
        Some(cmd) => Some(steps::plan_traced(
            o,
            cmd,
            &head.out,
            &mut plan,
            &mut roots,
            py.as_ref(),
            &ex,
            &mut closure,
        )?),
        None => None,
    };
    if let Some(l) = py.as_ref().and_then(|pi| pi.landmark(&plan)) {
        plan.add(l);
    }
    closure.close(&mut plan, &roots, &cfg, &ex)?;
    steps::add_aliases(&mut plan);
    let tree = steps::write_tree(o, &head, &plan, py.as_ref())?;
    let report = steps::describe(o, &head, &plan, &tree, traced, py)?;
    steps::finish(o, image, head, tree, report)
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
mod steps;
pub use exclude::glob_match;
use exclude::Excludes;
use place::*;

#[cfg(test)]
mod tests;
