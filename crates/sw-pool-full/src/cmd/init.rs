use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, InitArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: InitArgs) -> Result<(), Error> {
    // without --name, the directory names the pool (`sw-pool init --version 1.0 demo`)
    let name = match &a.name {
        Some(n) => n.clone(),
        None => a
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty() && n != "." && n != "..")
            .ok_or_else(|| {
                Error::other(
                    ExitStatus::BadInput,
                    format!("{} names no pool: give --name NAME", a.dir.display()),
                )
            })?,
    };
    swpool_core::pool::layout::init(&a.dir, &name, &a.version, a.description.as_deref())?;
    let p = Printer::new(g, false);
    p.result(format!(
        "created pool tree {} for {}/{}",
        a.dir.display(),
        name,
        a.version
    ));
    p.result(format!(
        "next: put packages in {0}/install/<pkg>/<version>/, then `sw-pool build --gen-modulefiles {1}-{2}.sqfs {0}`",
        a.dir.display(),
        name,
        a.version
    ));
    Ok(())
}
