use swpool_core::config::Environment;
use swpool_core::size::Bytes;
use swpool_core::userimage::{self, lease::RealLiveness, CreateOptions};
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, ImageArgs, ImageCommand};
use crate::output::Printer;

/// How this node tells whether a lease's holder is alive.
pub fn liveness(env: &Environment) -> RealLiveness {
    RealLiveness::here(env.path_var())
}

fn size(s: &str) -> Result<u64, Error> {
    swpool_core::size::parse_size(s).map_err(|e| Error::other(ExitStatus::BadInput, e))
}

pub fn run(g: &GlobalArgs, a: ImageArgs, env: &Environment) -> Result<(), Error> {
    let path_var = env.path_var().map(ToOwned::to_owned);
    match a.command {
        ImageCommand::Create {
            size: sz,
            oversize,
            inodes,
            small_files,
            force,
            json,
            image,
            src,
        } => {
            let p = Printer::new(g, json);
            let spin =
                crate::output::spinner(!g.quiet && !json, format!("creating {}", image.display()));
            let r = userimage::create(&CreateOptions {
                image,
                size: sz.as_deref().map(size).transpose()?,
                oversize,
                inodes,
                small_files,
                src,
                force,
                path_var,
            });
            if let Some(s) = spin {
                s.finish_and_clear();
            }
            let r = r?;
            p.result(format!(
                "created {}: ext4, {} (sparse){}",
                r.image.display(),
                Bytes(r.size),
                if r.files > 0 {
                    format!(", {} files ({}) copied in", r.files, Bytes(r.data_bytes))
                } else {
                    String::new()
                }
            ));
            p.result(format!(
                "next: `sw-pool mount --rw {} DIR` (one node at a time), or read-only anywhere",
                r.image.display()
            ));
            p.json(&serde_json::to_value(&r).expect("serialises"));
            Ok(())
        }
        ImageCommand::Resize { image, size: s } => {
            let want = size(&s)?;
            let got = userimage::resize(&image, want, &liveness(env), path_var.as_deref())?;
            Printer::new(g, false).result(format!(
                "resized {} to {}; e2fsck: clean",
                image.display(),
                Bytes(got)
            ));
            Ok(())
        }
        ImageCommand::Check { repair, image } => {
            let report = userimage::check(&image, repair, &liveness(env), path_var.as_deref())?;
            let p = Printer::new(g, false);
            p.verbose(report.trim());
            p.result(format!(
                "{}: clean{}",
                image.display(),
                if repair {
                    " (repaired where needed)"
                } else {
                    ""
                }
            ));
            Ok(())
        }
    }
}
