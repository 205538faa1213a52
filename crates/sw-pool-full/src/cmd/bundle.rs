use swpool_core::bundle::{bundle, BundleOptions, ImageOptions, LinkMode};
use swpool_core::config::{Environment, HostVar};
use swpool_core::{Error, ExitStatus};

use crate::cli::{BundleArgs, GlobalArgs, LinkArg};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: BundleArgs, env: &Environment) -> Result<(), Error> {
    let p = Printer::new(g, a.json);
    if a.trace == a.cmd.is_empty() {
        return Err(Error::other(
            ExitStatus::Usage,
            if a.trace {
                "--trace needs the command to run after `--` (sw-pool bundle … --trace -- CMD ARGS…)"
            } else {
                "a command after `--` is only run with --trace"
            },
        ));
    }
    let mut cfg = super::config(env)?;
    cfg.chunk_size.flag(
        a.chunk
            .as_deref()
            .map(swpool_core::config::parse_chunk_size)
            .transpose()
            .map_err(|e| Error::other(ExitStatus::BadInput, format!("--chunk: {e}")))?,
    );
    let source_date_epoch = env
        .get(HostVar::SourceDateEpoch)
        .and_then(|v| v.trim().parse::<u64>().ok());
    let opts = BundleOptions {
        inputs: a.inputs,
        name: a.name,
        version: a.version,
        out: a.out,
        force: a.force,
        python: a.python,
        trace: a.trace.then_some(a.cmd),
        trace_prefixes: a.trace_prefix,
        exclude: a.exclude,
        include: a.include,
        no_default_excludes: a.no_default_excludes,
        link: match a.link {
            LinkArg::Needed => LinkMode::Needed,
            LinkArg::Runpath => LinkMode::Runpath,
        },
        ld_library_path: env.get(HostVar::LdLibraryPath),
        pythonpath: env.get_os(HostVar::Pythonpath).map(ToOwned::to_owned),
        path_var: env.path_var().map(ToOwned::to_owned),
    };
    // tracing, copying the closure and building the image run quiet: show that work goes on
    let spin = crate::output::spinner(
        !g.quiet && !a.json,
        format!("bundling into {}", opts.out.display()),
    );
    let r = bundle(
        &opts,
        &ImageOptions {
            chunk_size: cfg.chunk_size.value,
            squashfs_level: cfg.squashfs_level.value,
            source_date_epoch,
        },
    );
    if let Some(s) = spin {
        s.finish_and_clear();
    }
    let r = r?;
    let excluded = r.files.len() - r.included();
    for f in &r.files {
        let line = match &f.dest {
            Some(d) => format!(
                "  + {} <- {} ({})",
                d.display(),
                f.source.display(),
                f.reason
            ),
            None => format!("  - {} ({})", f.source.display(), f.reason),
        };
        p.verbose(line);
    }
    p.result(format!(
        "bundled {}/{} into {}: {} files in {}, {} left out (see {}/bundle.json)",
        r.name,
        r.version,
        r.out.display(),
        r.included(),
        r.package.display(),
        excluded,
        r.package.display()
    ));
    for n in &r.notes {
        p.result(n.clone());
    }
    if let Some(b) = &r.build {
        p.result(format!("digest {}", b.manifest.digest));
    }
    p.json(&serde_json::to_value(&r).expect("report serialises"));
    Ok(())
}
