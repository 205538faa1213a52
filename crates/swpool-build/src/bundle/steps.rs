//! The steps of [`super::bundle`], in order: [`check`] (nothing written yet), [`plan_inputs`],
//! the ELF closures ([`Closure`]), [`plan_traced`] (the traced command's files), [`add_aliases`],
//! [`write_tree`], [`describe`] (pool.toml, the modulefile, bundle.json) and [`finish`].

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::place::*;
use super::{
    elf, io, python, trace, traced_exclusion, BundleError, BundleOptions, BundleReport, Excludes,
    FileRecord, ImageOptions,
};

/// What the checks settled: the pool's name and version, the first input (for messages and the
/// default name), where the result goes and as what.
pub(super) struct Head {
    pub(super) name: String,
    pub(super) version: String,
    pub(super) first: PathBuf,
    pub(super) out: PathBuf,
    pub(super) image_format: Option<crate::image::ImageFormat>,
}

/// Everything about the request that can be wrong, checked before anything is written.
pub(super) fn check(o: &BundleOptions) -> Result<Head, BundleError> {
    if o.inputs.is_empty() && o.trace.is_none() {
        return Err(BundleError::Usage(
            "give at least one EXE or DIR to bundle, or --trace -- CMD".into(),
        ));
    }
    if o.trace.as_ref().is_some_and(|c| c.is_empty()) {
        return Err(BundleError::Usage(
            "--trace needs a command after --".into(),
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
    check_inputs(o, &out)?;
    Ok(Head {
        name,
        version,
        first,
        out,
        image_format,
    })
}

/// The inputs exist and are what they claim; `out` is not inside one of them.
fn check_inputs(o: &BundleOptions, out: &Path) -> Result<(), BundleError> {
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
                path: out.to_path_buf(),
                reason: format!(
                    "--out lies inside the input {}; write it elsewhere",
                    i.display()
                ),
            });
        }
    }
    Ok(())
}

/// The inputs in the plan: an ELF file under `bin/` (an executable) or `lib/`, a directory as it
/// is (under `python/` at its import path when it is on the Python module path). The ELF roots
/// whose closures are still to be planned: (path, plan index).
pub(super) fn plan_inputs(
    o: &BundleOptions,
    plan: &mut Plan,
    py: Option<&python::PythonInfo>,
) -> Result<Vec<(PathBuf, usize)>, BundleError> {
    let mut roots: Vec<(PathBuf, usize)> = Vec::new();
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
            let under = py.and_then(|pi| {
                let c = canon(i);
                pi.locate(&c).map(|(_, rel)| Path::new("python").join(rel))
            });
            add_dir(
                plan,
                i,
                under.as_deref().unwrap_or(Path::new("")),
                &mut roots,
            )?;
        }
    }
    Ok(roots)
}

/// The ELF closures planned so far: how many roots are done, and the files left out (each
/// recorded once).
#[derive(Default)]
pub(super) struct Closure {
    done: usize,
    seen_out: HashSet<PathBuf>,
}

impl Closure {
    /// Plan the closures of the roots not done yet.
    pub(super) fn close(
        &mut self,
        plan: &mut Plan,
        roots: &[(PathBuf, usize)],
        cfg: &elf::LoaderConfig,
        ex: &Excludes,
    ) -> Result<(), BundleError> {
        close_roots(plan, roots, &mut self.done, cfg, ex, &mut self.seen_out)
    }
}

/// Run the traced command `cmd` and plan every file it opened under the traced prefixes (their
/// ELF closures are added to `roots`); the command as recorded in the report.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_traced(
    o: &BundleOptions,
    cmd: &[OsString],
    out: &Path,
    plan: &mut Plan,
    roots: &mut Vec<(PathBuf, usize)>,
    py: Option<&python::PythonInfo>,
    ex: &Excludes,
    closure: &mut Closure,
) -> Result<Vec<String>, BundleError> {
    let mut prefixes: Vec<PathBuf> = if o.trace_prefixes.is_empty() {
        o.inputs.iter().map(|i| default_prefix(i)).collect()
    } else {
        o.trace_prefixes.iter().map(|p| canon(p)).collect()
    };
    if let Some(pi) = py {
        prefixes.extend(pi.path.iter().cloned());
    }
    // the trace's log lives beside OUT only while the command runs
    let scratch = tempdir_beside(out, "trace")?;
    let mut opened = trace::trace(cmd, scratch.path(), o.path_var.as_deref())?;
    drop(scratch);
    if let Some(pi) = py {
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
        if !prefixes
            .iter()
            .any(|p| f.starts_with(p) || c.starts_with(p))
        {
            outside += 1;
            if !is_system_dir(&c) {
                plan.out.push(FileRecord {
                    source: f.clone(),
                    dest: None,
                    included: false,
                    kind: "outside-prefix",
                    reason:
                        "opened by the traced command, outside the traced prefixes (--trace-prefix)"
                            .into(),
                });
            }
            continue;
        }
        let traced = Traced { f, c };
        if let Some(root) = traced.place(plan, &prefixes, py, ex, closure)? {
            roots.push(root);
        }
    }
    tracing::debug!(outside, "traced files outside the prefixes");
    Ok(cmd
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect())
}

/// A file the traced command opened under a traced prefix: as opened (`f`) and resolved (`c`).
struct Traced {
    f: PathBuf,
    c: PathBuf,
}

impl Traced {
    /// Plan it (or record why it is left out); an ELF object whose closure is still to be
    /// planned is returned as a root.
    fn place(
        self,
        plan: &mut Plan,
        prefixes: &[PathBuf],
        py: Option<&python::PythonInfo>,
        ex: &Excludes,
        closure: &mut Closure,
    ) -> Result<Option<(PathBuf, usize)>, BundleError> {
        let Traced { f, c } = self;
        let is_elf = elf::is_elf(&c);
        let dynamic = |c: &Path| is_elf && elf::read(c).map(|i| i.dynamic).unwrap_or(false);
        // the exclude list applies to what the command opened or executed as it does to the
        // closure: the C library and the loader, MPI, drivers come from the host
        if let Some(reason) = traced_exclusion(ex, &f, &c, is_elf) {
            if closure.seen_out.insert(c.clone()) {
                plan.out.push(FileRecord {
                    source: f.clone(),
                    dest: None,
                    included: false,
                    kind: "excluded",
                    reason,
                });
            }
            return Ok(None);
        }
        if let Some(pi) = py {
            // with the interpreter in the bundle, the standard library goes where it looks
            // (the rule `build --from-env` follows too): lib/pythonX.Y beside bin/
            if let Some(dest) = pi.stdlib_dest(plan, &f, &c) {
                let k = plan.add(pi.planned(
                    f.clone(),
                    dest,
                    "the bundled interpreter's standard library, imported by the traced command",
                ));
                return Ok(dynamic(&c).then_some((f, k)));
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
                return Ok(None);
            }
            if let Some((_, rel)) = pi.locate(&f).or_else(|| pi.locate(&c)) {
                let k = plan.add(Planned {
                    source: f.clone(),
                    dest: Path::new("python").join(rel),
                    kind: "python",
                    reason: "imported by the traced command (a module file under sys.path)".into(),
                    elf: None,
                    symlink: None,
                });
                return Ok(dynamic(&c).then_some((f, k)));
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
            return Ok(info.dynamic.then_some((f, k)));
        }
        let p = prefixes
            .iter()
            .filter(|p| f.starts_with(p))
            .max_by_key(|p| p.as_os_str().len());
        let rel = match p {
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
        Ok(None)
    }
}

/// Names under which a bundled library is needed besides its file's name (runpath mode).
pub(super) fn add_aliases(plan: &mut Plan) {
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
}

/// The tree written into a temporary directory beside OUT: the package at `pkg_rel`.
pub(super) struct Tree {
    tmp: crate::atomic::TempDir,
    pkg_rel: PathBuf,
}

impl Tree {
    fn root(&self) -> &Path {
        self.tmp.path()
    }

    fn pkg(&self) -> PathBuf {
        self.root().join(&self.pkg_rel)
    }
}

/// Copy the planned files into a temporary tree (`install/NAME/VERSION/…`) and rewrite their
/// library references.
pub(super) fn write_tree(
    o: &BundleOptions,
    head: &Head,
    plan: &Plan,
    py: Option<&python::PythonInfo>,
) -> Result<Tree, BundleError> {
    let tree = Tree {
        tmp: tempdir_beside(&head.out, "tree")?,
        pkg_rel: Path::new("install").join(&head.name).join(&head.version),
    };
    let pkg = tree.pkg();
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
    if let Some(d) = py.and_then(|pi| pi.lib_dynload(plan)) {
        let d = pkg.join(d);
        std::fs::create_dir_all(&d).map_err(io("cannot create", &d))?;
    }
    for (alias, target) in &plan.aliases {
        let a = pkg.join(alias);
        let t = target.file_name().unwrap_or_default();
        std::os::unix::fs::symlink(t, &a).map_err(io("cannot create", &a))?;
    }
    rewrite(plan, &pkg, o.link, o.path_var.as_deref())?;
    Ok(tree)
}

/// The tree's pool.toml, modulefile and bundle.json; the report they describe.
pub(super) fn describe(
    o: &BundleOptions,
    head: &Head,
    plan: &Plan,
    tree: &Tree,
    traced: Option<Vec<String>>,
    py: Option<python::PythonInfo>,
) -> Result<BundleReport, BundleError> {
    let (name, version, root, pkg) = (&head.name, &head.version, tree.root(), tree.pkg());
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
    let toml_text = format!(
        "# written by sw-pool bundle\nname = {:?}\nversion = {:?}\ndescription = {:?}\n",
        name,
        version,
        format!("{} bundled by sw-pool bundle", head.first.display())
    );
    write(&root.join("pool.toml"), toml_text.as_bytes())?;
    let mut mf = crate::pool::modulefile::render(
        name,
        version,
        name,
        version,
        &pkg,
        crate::pool::modulefile::ModulefileOptions::default(),
    );
    if pkg.join("python").is_dir() {
        mf.push_str("prepend_path(\"PYTHONPATH\", pathJoin(root, \"python\"))\n");
    }
    let mfd = root.join("modulefiles").join(name);
    std::fs::create_dir_all(&mfd).map_err(io("cannot create", &mfd))?;
    write(&mfd.join(format!("{version}.lua")), mf.as_bytes())?;
    let report = BundleReport {
        notes: python_notes(plan, py.as_ref()),
        name: name.clone(),
        version: version.clone(),
        out: head.out.clone(),
        link: o.link,
        files: records,
        traced,
        python: py,
        package: tree.pkg_rel.clone(),
        build: None,
    };
    let json = serde_json::to_vec_pretty(&report).expect("report serialises");
    write(&pkg.join("bundle.json"), &json)?;
    Ok(report)
}

/// What a bundle of Python modules relies on the host for: its standard library, unless the
/// interpreter is bundled with it.
fn python_notes(plan: &Plan, py: Option<&python::PythonInfo>) -> Vec<String> {
    py.iter()
        .filter(|pi| pi.bundled_at(plan).is_none())
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
        .collect()
}

/// The tree built into the pool file OUT (its extension names the format), or renamed to OUT.
pub(super) fn finish(
    o: &BundleOptions,
    image: &ImageOptions,
    head: Head,
    tree: Tree,
    mut report: BundleReport,
) -> Result<BundleReport, BundleError> {
    match head.image_format {
        Some(fmt) => {
            let b = crate::image::build(&crate::image::BuildOptions {
                out: head.out.clone(),
                src: tree.root().to_path_buf(),
                size: None,
                format: Some(fmt),
                name: Some(head.name),
                version: Some(head.version),
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
        }
        None => {
            tree.tmp
                .commit(&head.out, o.force)
                .map_err(io("cannot rename into place", &head.out))?;
        }
    }
    Ok(report)
}
