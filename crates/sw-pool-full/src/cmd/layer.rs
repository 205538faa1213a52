//! `sw-pool layer list|create|rm|du|sync|export`: a user's writable layers (`layer sync`:
//! `swpool_core::layer::sync`).

use swpool_core::config::Environment;
use swpool_core::size::Bytes;
use swpool_core::Error;
use swpool_env::{EnvError, LayerSummary};

use crate::cli::{GlobalArgs, LayerArgs, LayerCommand};
use crate::output::Printer;

fn err(e: EnvError) -> Error {
    swpool_core::layer::env_error(e)
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

fn none_yet(store: &swpool_env::LayerStore) -> String {
    format!(
        "no layers in {}: make one with `sw-pool layer create NAME`",
        store.root().display()
    )
}

pub fn run(g: &GlobalArgs, a: LayerArgs, env: &Environment) -> Result<(), Error> {
    let cfg = super::config(env)?;
    let store = crate::environment::store(a.layer_dir, &cfg, env)?;
    match a.command {
        LayerCommand::List { json: j } => {
            // names, where, in use: nothing inside a layer is read (sizes: `layer du`)
            let p = Printer::new(g, j);
            let names = store.names().map_err(err)?;
            if names.is_empty() {
                p.result(none_yet(&store));
            }
            let mut rows = Vec::new();
            for name in &names {
                let l = store.paths(name);
                let using = store.user_of(&l);
                p.result(format!(
                    "{name:<20} {}{}",
                    l.dir.display(),
                    using
                        .map(|p| format!("  in use (pid {p})"))
                        .unwrap_or_default()
                ));
                rows.push(serde_json::json!({"name": name, "dir": l.dir, "in_use_by": using}));
            }
            p.json(&serde_json::json!({"dir": store.root(), "layers": rows}));
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
        LayerCommand::Sync {
            name,
            cache_dir,
            json: j,
        } => sync(g, &store, &cfg, &name, cache_dir, j, env)?,
        LayerCommand::Export {
            name,
            out,
            format,
            version,
            force,
            keep_special,
            json: j,
        } => export(
            g,
            &store,
            &cfg,
            env,
            (&name, out, format, version, force, keep_special),
            j,
        )?,
        LayerCommand::Du {
            name: Some(name),
            json: j,
        } => {
            let p = Printer::new(g, j);
            let l = store.get(&name).map_err(err)?;
            let s = store.summary(&l).map_err(err)?;
            p.result(line(&s));
            p.json(&json(&s));
        }
        LayerCommand::Du {
            name: None,
            json: j,
        } => {
            let p = Printer::new(g, j);
            let v = store.list().map_err(err)?;
            if v.is_empty() {
                p.result(none_yet(&store));
            }
            for s in &v {
                p.result(line(s));
            }
            p.result(format!(
                "{:<20} {:>10} in {} layer{}",
                "total",
                Bytes(v.iter().map(|s| s.bytes).sum()).to_string(),
                v.len(),
                if v.len() == 1 { "" } else { "s" }
            ));
            p.json(&serde_json::json!({
                "dir": store.root(),
                "layers": v.iter().map(json).collect::<Vec<_>>(),
            }));
        }
    }
    Ok(())
}

/// `layer sync NAME`: collective (spread over the allocation from a batch script); node 0 prints.
fn sync(
    g: &GlobalArgs,
    store: &swpool_env::LayerStore,
    cfg: &swpool_core::config::Config,
    name: &str,
    cache_dir: Option<std::path::PathBuf>,
    j: bool,
    env: &Environment,
) -> Result<(), Error> {
    use swpool_core::collective::Collective;
    super::spread_over_allocation(env)?;
    let job = swpool_core::Job::init(env)?;
    let rep = match swpool_core::layer::sync(&job, store, cfg, name, cache_dir.as_deref(), env) {
        Ok(rep) => rep,
        Err(e) => return super::finish_collective(job, Err(e)),
    };
    if job.world_rank() == 0 {
        let p = Printer::new(g, j);
        p.result(format!(
            "layer {name}: state {} on {} node(s) ({} updated): {} files, {}; moved {} files, {} in {:.2} s",
            &rep.generation[..12],
            rep.nodes,
            rep.nodes_updated,
            rep.files,
            Bytes(rep.bytes),
            rep.files_sent,
            Bytes(rep.bytes_sent),
            rep.seconds
        ));
        p.json(&serde_json::json!({
            "layer": name,
            "generation": rep.generation,
            "path": rep.path,
            "nodes": rep.nodes,
            "nodes_updated": rep.nodes_updated,
            "files": rep.files,
            "bytes": rep.bytes,
            "files_sent": rep.files_sent,
            "bytes_sent": rep.bytes_sent,
            "bytes_read": rep.bytes_read,
            "seconds": rep.seconds,
            "phases": rep.phases,
        }));
    }
    Ok(())
}

/// `layer export NAME OUT`: the layer's upper built as a pool (named after the layer), under the
/// layer's lock (no environment writes into it meanwhile). Whiteouts (character devices 0/0, or
/// `.wh.NAME` files) stay in the image as they are: the pool is an overlay layer, to be stacked.
/// The files become root's, so setuid/setgid bits are cleared and device nodes left out (each
/// named in a warning) unless root asks to keep them (`--keep-special`).
fn export(
    g: &GlobalArgs,
    store: &swpool_env::LayerStore,
    cfg: &swpool_core::config::Config,
    env: &Environment,
    (name, out, format, version, force, keep_special): (
        &str,
        std::path::PathBuf,
        Option<crate::cli::FormatArg>,
        String,
        bool,
        bool,
    ),
    j: bool,
) -> Result<(), Error> {
    use swpool_core::image::{build, BuildOptions, ImageFormat};
    let p = Printer::new(g, j);
    let l = store.get(name).map_err(err)?;
    let _lock = store.lock(&l).map_err(err)?;
    let s = store.summary(&l).map_err(err)?;
    let format = format
        .map(|f| match f {
            crate::cli::FormatArg::Squashfs => ImageFormat::Squashfs,
            crate::cli::FormatArg::Ext4 => ImageFormat::Ext4,
            crate::cli::FormatArg::Ext3 => ImageFormat::Ext3,
            crate::cli::FormatArg::Ext2 => ImageFormat::Ext2,
            crate::cli::FormatArg::Erofs => ImageFormat::Erofs,
        })
        .or_else(|| ImageFormat::from_extension(&out))
        .or(Some(ImageFormat::Squashfs));
    let r = build(&BuildOptions {
        out,
        src: l.upper.clone(),
        size: None,
        format,
        name: Some(name.to_string()),
        version: Some(version),
        force,
        chunk_size: cfg.chunk_size.value,
        gen_modulefiles: false,
        modulefile_opts: Default::default(),
        squashfs_level: cfg.squashfs_level.value,
        // the layer's files are its owner's; stacked under `run --base` they are the
        // environment's root's (the user's) as a base pool's are
        no_compress: false,
        all_root: true,
        keep_special,
        source_date_epoch: None,
        path_var: env.path_var().map(ToOwned::to_owned),
    })?;
    for w in r.warnings.iter().filter(|w| !w.contains("pool.toml")) {
        p.warn(w);
    }
    let m = &r.manifest;
    p.result(format!(
        "exported layer {name} ({} entries, {} whiteouts, {}) to {}: {} pool {}/{}; sign it with `sw-pool sign`",
        s.entries,
        s.whiteouts,
        Bytes(s.bytes),
        r.out.display(),
        m.format,
        m.name,
        m.version
    ));
    p.json(&serde_json::json!({
        "layer": name,
        "out": r.out,
        "format": m.format,
        "digest": m.digest,
        "entries": s.entries,
        "whiteouts": s.whiteouts,
    }));
    Ok(())
}
