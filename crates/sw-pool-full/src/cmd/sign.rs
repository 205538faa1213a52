use swpool_core::trust::{keys, sign_pool};
use swpool_core::Error;

use crate::cli::{GlobalArgs, SignArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: SignArgs) -> Result<(), Error> {
    let key = keys::read_private(&a.key)?;
    // every byte is checked before it is signed: on a large pool that takes a while
    let bar = crate::output::PassBar::new(!a.json && !g.quiet, "checking");
    let r = sign_pool(&a.pool, &key, Some(&|d, t| bar.step(d, t)));
    bar.finish();
    let r = r?;
    let p = Printer::new(g, a.json);
    p.result(format!(
        "signed {} with {} key {}",
        r.pool.display(),
        r.algorithm.as_str(),
        r.fingerprint
    ));
    p.result(format!("detached signature {}", r.detached.display()));
    p.json(&serde_json::json!({
        "pool": r.pool, "detached": r.detached, "algorithm": r.algorithm, "fingerprint": r.fingerprint,
    }));
    Ok(())
}
