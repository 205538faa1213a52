use swpool_core::pool::modulefile::{generate_missing, ModulefileOptions};
use swpool_core::Error;

use crate::cli::{GlobalArgs, ModulefilesArgs};
use crate::output::Printer;

pub fn run(gl: &GlobalArgs, a: ModulefilesArgs) -> Result<(), Error> {
    let g = generate_missing(
        &a.dir,
        ModulefileOptions {
            ld_library_path: a.ld_library_path,
            formats: a.modules,
        },
        &mut |p, b| swpool_core::atomic::write_file(p, b, false),
    )?;
    let p = Printer::new(gl, false);
    for w in &g.warnings {
        p.warn(w);
    }
    let written = g.written;
    if written.is_empty() {
        p.result("every package already has a modulefile");
    }
    for f in written {
        p.result(format!("wrote {}", f.display()));
    }
    Ok(())
}
