use swpool_core::config::{Environment, HostVar};
use swpool_core::image::{build, BuildOptions, ImageFormat};
use swpool_core::pool::modulefile::ModulefileOptions;
use swpool_core::size::{parse_size, Bytes};
use swpool_core::Error;

use crate::cli::{BuildArgs, FormatArg, GlobalArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: BuildArgs, env: &Environment) -> Result<(), Error> {
    let p = Printer::new(g, a.json);
    let mut cfg = super::config(env)?;
    cfg.chunk_size.flag(
        a.chunk
            .as_deref()
            .map(swpool_core::config::parse_chunk_size)
            .transpose()
            .map_err(|e| {
                Error::other(swpool_core::ExitStatus::BadInput, format!("--chunk: {e}"))
            })?,
    );
    let size = a.size.as_deref().map(parse_size).transpose()?;
    let format = a.format.map(|f| match f {
        FormatArg::Squashfs => ImageFormat::Squashfs,
        FormatArg::Ext4 => ImageFormat::Ext4,
        FormatArg::Ext3 => ImageFormat::Ext3,
        FormatArg::Ext2 => ImageFormat::Ext2,
        FormatArg::Erofs => ImageFormat::Erofs,
    });
    // the configured default format applies only when neither --format nor OUT's extension says
    let format = format
        .or_else(|| ImageFormat::from_extension(&a.out))
        .or(Some(cfg.format.value));
    let source_date_epoch = source_date_epoch(env)?;
    if a.all_root && format.is_some_and(|f| f.is_ext()) {
        return Err(Error::other(
            swpool_core::ExitStatus::BadInput,
            "--all-root applies to squashfs and EROFS pools: mke2fs keeps the tree's owners (build \
             the tree as root, or choose --format squashfs)",
        ));
    }
    // --from-env: the environment laid out as install/<name>/<version>/ in a directory beside OUT
    // (removed when this returns, built or not), which becomes the pool's root
    let (src, name, version, staged) = match (&a.from_env, a.src) {
        (Some(envdir), _) => stage_env(
            envdir,
            &a.out,
            a.name,
            a.version,
            a.env_prefix.as_deref(),
            env,
        )?,
        (None, Some(src)) => (src, a.name, a.version, None),
        (None, None) => unreachable!("clap requires SRC without --from-env"),
    };
    let opts = BuildOptions {
        out: a.out,
        src,
        size,
        format,
        name,
        version,
        force: a.force,
        chunk_size: cfg.chunk_size.value,
        gen_modulefiles: a.gen_modulefiles,
        modulefile_opts: ModulefileOptions {
            ld_library_path: a.ld_library_path,
            formats: a.modules,
        },
        squashfs_level: cfg.squashfs_level.value,
        no_compress: a.no_compress,
        all_root: a.all_root,
        keep_special: a.keep_special,
        source_date_epoch,
        path_var: env.path_var().map(ToOwned::to_owned),
    };
    // mksquashfs and mke2fs run quiet: show how far they have read the tree (a 300 MiB tree
    // takes ~15 s): a percentage and an ETA once the tree is measured
    let spin = super::build_progress::start(
        !g.quiet && !a.json,
        format!("building {}", opts.out.display()),
        opts.src.clone(),
    );
    let r = build(&opts);
    drop(spin); // cleared before the result is printed
    let r = r?;
    report(&p, &r, &opts, staged.as_ref().map(|(_, rep)| rep));
    Ok(())
}

/// `SOURCE_DATE_EPOCH`, when set: the build's time (reproducible builds).
fn source_date_epoch(env: &Environment) -> Result<Option<u64>, Error> {
    Ok(match env.get(HostVar::SourceDateEpoch) {
        Some(v) if !v.is_empty() => Some(v.trim().parse::<u64>().map_err(|_| {
            Error::other(
                swpool_core::ExitStatus::BadInput,
                format!("SOURCE_DATE_EPOCH={v:?} is not a number of seconds"),
            )
        })?),
        _ => None,
    })
}

/// What the build made: warnings, the environment's summary (`--from-env`), the modulefiles
/// written, the pool's line and digest, timings (`-v`), the `--json` report.
fn report(
    p: &Printer,
    r: &swpool_core::image::BuildReport,
    opts: &BuildOptions,
    staged: Option<&swpool_core::pyenv::EnvReport>,
) {
    for w in &r.warnings {
        p.warn(w);
    }
    if let Some(rep) = staged {
        for w in &rep.warnings {
            p.warn(w);
        }
        p.result(env_summary(rep));
    }
    // --gen-modulefiles writes into the source tree: say where, and which
    if !r.modulefiles_written.is_empty() {
        let n = r.modulefiles_written.len();
        p.result(format!(
            "wrote {n} modulefile{} into {}: {}",
            if n == 1 { "" } else { "s" },
            opts.src.join("modulefiles").display(),
            r.modulefiles_written
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let m = &r.manifest;
    p.result(format!(
        "built {}: {} pool {}/{}, image {} ({} data in {} of {} chunks), {}",
        r.out.display(),
        m.format,
        m.name,
        m.version,
        Bytes(m.image_size),
        Bytes(m.data_size),
        m.chunks.iter().filter(|c| c.is_some()).count(),
        m.chunks.len(),
        match m.packages.len() {
            1 => "1 package".to_string(),
            n => format!("{n} packages"),
        }
    ));
    p.result(format!("digest {}", m.digest));
    let t = &r.timings;
    p.verbose(format!(
        "timings: scan {:.3}s, mkfs {:.3}s, times {:.3}s, hash {:.3}s, commit {:.3}s",
        t.scan.as_secs_f64(),
        t.mkfs.as_secs_f64(),
        t.times.as_secs_f64(),
        t.hash.as_secs_f64(),
        t.commit.as_secs_f64()
    ));
    p.json(&serde_json::json!({
        "out": r.out,
        "file_size": r.file_len,
        "name": m.name,
        "version": m.version,
        "format": m.format,
        "image_size": m.image_size,
        "data_size": m.data_size,
        "digest": m.digest,
        "chunk_size": m.chunk_size,
        "chunks": m.chunks.len(),
        "packages": m.packages,
        "warnings": r.warnings,
        "environment": staged,
        "tree": {"files": r.tree.files, "dirs": r.tree.dirs, "symlinks": r.tree.symlinks, "bytes": r.tree.bytes},
        "timings": {"scan": t.scan.as_secs_f64(), "mkfs": t.mkfs.as_secs_f64(), "times": t.times.as_secs_f64(), "hash": t.hash.as_secs_f64(), "commit": t.commit.as_secs_f64()},
    }));
}

/// The pool's name for an environment directory: its own name, or its parent's for a hidden one
/// (`project/.venv` → `project`).
fn env_name(envdir: &std::path::Path) -> Result<String, Error> {
    let abs = std::fs::canonicalize(envdir).unwrap_or_else(|_| envdir.to_path_buf());
    let pick = |p: &std::path::Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
    };
    let n = pick(&abs)
        .or_else(|| abs.parent().and_then(pick))
        .ok_or_else(|| {
            Error::other(
                swpool_core::ExitStatus::BadInput,
                format!("cannot name a pool after {}: give --name", envdir.display()),
            )
        })?;
    Ok(n.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect())
}

type Staged = (
    std::path::PathBuf,
    Option<String>,
    Option<String>,
    Option<(swpool_core::atomic::TempDir, swpool_core::pyenv::EnvReport)>,
);

/// `--from-env ENV`: lay the environment out beside `out` (see [`swpool_core::pyenv`]) and write
/// the pool.toml whose description `inspect` shows.
fn stage_env(
    envdir: &std::path::Path,
    out: &std::path::Path,
    name_arg: Option<String>,
    version_arg: Option<String>,
    env_prefix: Option<&std::path::Path>,
    env: &Environment,
) -> Result<Staged, Error> {
    let name = match name_arg {
        Some(n) => n,
        None => env_name(envdir)?,
    };
    let version = version_arg.unwrap_or_else(|| "1".into());
    let tmp = swpool_core::atomic::TempDir::create(out, "env").map_err(|e| {
        Error::other(
            swpool_core::ExitStatus::System,
            format!(
                "cannot create a directory beside {} to lay the environment out in: {e}",
                out.display()
            ),
        )
    })?;
    let rep = swpool_core::pyenv::stage(
        envdir,
        tmp.path(),
        &name,
        &version,
        env_prefix,
        env.path_var(),
    )?;
    let src = tmp.path().to_path_buf();
    let toml = format!(
        "name = {name:?}\nversion = {version:?}\ndescription = {:?}\n",
        rep.description()
    );
    std::fs::write(src.join("pool.toml"), toml).map_err(|e| {
        Error::other(
            swpool_core::ExitStatus::System,
            format!("cannot write {}: {e}", src.join("pool.toml").display()),
        )
    })?;
    Ok((src, Some(name), Some(version), Some((tmp, rep))))
}

/// One line about the environment `build --from-env` laid out.
fn env_summary(rep: &swpool_core::pyenv::EnvReport) -> String {
    format!(
        "{}: {} environment, Python {}, {}, {}{}{}{}; {} inodes in 1 pool file",
        rep.source.display(),
        rep.kind,
        rep.python_version,
        swpool_core::pyenv::counted(rep.packages as u64, "package"),
        swpool_core::pyenv::counted(rep.files, "file"),
        rep.interpreter_included
            .as_ref()
            .map(|i| format!(", interpreter included from {}", i.display()))
            .unwrap_or_default(),
        if rep.prefix_rewritten > 0 {
            format!(
                ", {} files rewritten for their prefix placeholder",
                rep.prefix_rewritten
            )
        } else {
            String::new()
        },
        if rep.compiled > 0 {
            format!(
                ", {} byte-compiled (unchecked-hash: an import reads no source)",
                swpool_core::pyenv::counted(rep.compiled, "module")
            )
        } else {
            String::new()
        },
        rep.inodes
    )
}
