//! Placing a bundle's files: the plan (what goes where, and why), closing over the libraries
//! each root needs, copying, and rewriting the bundled ELF objects' paths.

use super::*;

/// A file to place in the package.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    pub(super) source: PathBuf,
    pub(super) dest: PathBuf,
    pub(super) kind: &'static str,
    pub(super) reason: String,
    /// Bundled ELF: its closure index (root, object) for the rewrite.
    pub(super) elf: Option<(usize, usize)>,
    /// Copy a symlink as a symlink (inside an input directory).
    pub(super) symlink: Option<PathBuf>,
}

#[derive(Default)]
pub(super) struct Plan {
    pub(super) files: Vec<Planned>,
    /// canonical source → index in files
    pub(super) by_source: HashMap<PathBuf, usize>,
    /// dest → index
    pub(super) by_dest: HashMap<PathBuf, usize>,
    pub(super) out: Vec<FileRecord>,
    pub(super) closures: Vec<Vec<elf::Loaded>>,
    /// Which objects of each closure are bundled.
    pub(super) bundled: Vec<Vec<bool>>,
    /// Alias names for bundled libraries (`lib/<other name>` → the file), for `--link runpath`.
    pub(super) aliases: BTreeMap<PathBuf, PathBuf>,
}

pub(super) fn canon(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

impl Plan {
    /// Add a file unless its source is already planned; returns its index.
    pub(super) fn add(&mut self, p: Planned) -> usize {
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
pub(super) fn default_prefix(input: &Path) -> PathBuf {
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

pub(super) fn is_system_dir(p: &Path) -> bool {
    [
        "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev",
    ]
    .iter()
    .any(|d| p.starts_with(d))
}

/// The ELF closures of `roots[*r..]` (in order; a later root reuses files an earlier one planned).
pub(super) fn close_roots(
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
pub(super) fn add_dir(
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

pub(super) fn copy_file(src: &Path, dest: &Path) -> Result<(), BundleError> {
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

pub(super) fn write(p: &Path, data: &[u8]) -> Result<(), BundleError> {
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).map_err(io("cannot create", d))?;
    }
    std::fs::write(p, data).map_err(io("cannot write", p))
}

/// `to` relative to `from_dir` (both relative to the package root).
pub(super) fn relative(from_dir: &Path, to: &Path) -> PathBuf {
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

pub(super) fn origin_path(from_dest: &Path, to_dest: &Path) -> String {
    let dir = from_dest.parent().unwrap_or(Path::new(""));
    let rel = relative(dir, to_dest);
    if rel.as_os_str().is_empty() {
        "$ORIGIN".into()
    } else {
        format!("$ORIGIN/{}", rel.display())
    }
}

/// patchelf every bundled ELF: its bundled DT_NEEDED (needed mode) and its DT_RUNPATH. patchelf is
/// looked up in `path_var` (the value of `PATH`).
pub(super) fn rewrite(
    plan: &Plan,
    pkg: &Path,
    mode: LinkMode,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<(), BundleError> {
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
                    .run(path_var)?;
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
                    .run(path_var)?;
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

/// A temporary directory beside OUT ([`crate::atomic::TempDir`]: registered for removal on a
/// signal, removed on drop unless committed).
pub(super) fn tempdir_beside(
    out: &Path,
    what: &str,
) -> Result<crate::atomic::TempDir, BundleError> {
    crate::atomic::TempDir::create(out, what).map_err(io("cannot create a directory beside", out))
}
