use swpool_core::Error;

use crate::cli::{GlobalArgs, InitArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: InitArgs) -> Result<(), Error> {
    swpool_core::pool::layout::init(&a.dir, &a.name, &a.version, a.description.as_deref())?;
    let p = Printer::new(g, false);
    p.result(format!(
        "created pool tree {} for {}/{}",
        a.dir.display(),
        a.name,
        a.version
    ));
    p.result(format!(
        "next: put packages in {0}/install/<pkg>/<version>/, then `sw-pool build --gen-modulefiles {1}-{2}.sqfs {0}`",
        a.dir.display(),
        a.name,
        a.version
    ));
    Ok(())
}
