//! `sw-pool layer list|create|rm|du`: a user's writable layers.

use swpool_core::config::Environment;
use swpool_core::size::Bytes;
use swpool_core::{Error, ExitStatus};
use swpool_env::{EnvError, LayerSummary};

use crate::cli::{GlobalArgs, LayerArgs, LayerCommand};
use crate::output::Printer;

fn err(e: EnvError) -> Error {
    let status = match &e {
        EnvError::Io { .. } | EnvError::Start { .. } => ExitStatus::System,
        EnvError::Unsupported(_) => ExitStatus::Tool,
        _ => ExitStatus::BadInput,
    };
    Error::other(status, e)
}

fn json(s: &LayerSummary) -> serde_json::Value {
    serde_json::json!({
        "name": s.name, "dir": s.dir, "bytes": s.bytes, "entries": s.entries,
        "whiteouts": s.whiteouts, "in_use_by": s.in_use,
    })
}

fn line(s: &LayerSummary) -> String {
    let using = s
        .in_use
        .map(|p| format!("  in use (pid {p})"))
        .unwrap_or_default();
    format!(
        "{:<20} {:>10} {:>8} entries {:>6} whiteouts  {}{using}",
        s.name,
        Bytes(s.bytes).to_string(),
        s.entries,
        s.whiteouts,
        s.dir.display()
    )
}

pub fn run(g: &GlobalArgs, a: LayerArgs, env: &Environment) -> Result<(), Error> {
    let store = crate::environment::store(a.layer_dir, env)?;
    match a.command {
        LayerCommand::List { json: j } => {
            let p = Printer::new(g, j);
            let v = store.list().map_err(err)?;
            if v.is_empty() {
                p.result(format!(
                    "no layers in {}: make one with `sw-pool layer create NAME`",
                    store.root().display()
                ));
            }
            for s in &v {
                p.result(line(s));
            }
            p.json(&serde_json::json!({
                "dir": store.root(),
                "layers": v.iter().map(json).collect::<Vec<_>>(),
            }));
        }
        LayerCommand::Create { name } => {
            let l = store.create(&name).map_err(err)?;
            Printer::new(g, false).result(format!(
                "created layer {name} in {}: use it with `sw-pool run --layer {name} -- CMD` or \
                 `sw-pool shell --layer {name}`",
                l.dir.display()
            ));
        }
        LayerCommand::Rm { name } => {
            store.remove(&name).map_err(err)?;
            Printer::new(g, false).result(format!("removed layer {name}"));
        }
        LayerCommand::Du { name, json: j } => {
            let p = Printer::new(g, j);
            let l = store.get(&name).map_err(err)?;
            let s = store.summary(&l).map_err(err)?;
            p.result(line(&s));
            p.json(&json(&s));
        }
    }
    Ok(())
}
