use swpool_core::config::Environment;
use swpool_core::size::Bytes;
use swpool_core::trust::{verify_pool, KeySource};
use swpool_core::Error;

use crate::cli::{GlobalArgs, VerifyArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: VerifyArgs, env: &Environment) -> Result<(), Error> {
    let source = match (a.key, a.trusted) {
        (Some(k), _) => KeySource::Key(k),
        (None, Some(d)) => KeySource::Dirs(vec![d]),
        (None, None) => KeySource::Dirs(swpool_core::trust::default_dirs(env)),
    };
    let bar = crate::output::PassBar::new(!a.json && !g.quiet, "verifying");
    let r = verify_pool(&a.pool, &source, a.detached, Some(&|d, t| bar.step(d, t)));
    bar.finish();
    let r = r?;
    let p = Printer::new(g, a.json);
    p.result(format!(
        "{}: OK, pool {}/{} ({})",
        r.path.display(),
        r.name,
        r.version,
        r.digest
    ));
    p.result(format!(
        "signed by {} ({}, {})",
        r.signer.name,
        r.signer.fingerprint,
        r.signer.algorithm.as_str()
    ));
    if let Some(d) = &r.detached {
        p.result(format!("detached signature {} matches", d.display()));
    }
    p.verbose(format!(
        "checked {} of data in {:.3}s",
        Bytes(r.data_bytes),
        r.elapsed.as_secs_f64()
    ));
    p.json(&serde_json::to_value(&r).expect("report serialises"));
    Ok(())
}
