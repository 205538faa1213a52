//! `sw-pool avail [NAME[/VERSION]]`: the pools on the pool path, as `load NAME/VERSION` finds
//! them; for each, whether it is signed and whether this node's cache holds a copy.

use swpool_core::config::Environment;
use swpool_core::pool::spec::{self, Available};
use swpool_core::{Error, ExitStatus};

use crate::cli::{AvailArgs, GlobalArgs};
use crate::output::Printer;

/// One pool of the list.
#[derive(Debug, serde::Serialize)]
struct Row {
    name: String,
    version: String,
    path: std::path::PathBuf,
    /// `None`: the file is not a readable pool (why in `error`).
    signed: Option<bool>,
    cached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn run(g: &GlobalArgs, a: AvailArgs, env: &Environment) -> Result<(), Error> {
    let p = Printer::new(g, a.json);
    let cfg = super::config(env)?;
    let dirs = &cfg.pool_path.value;
    if dirs.is_empty() {
        return Err(Error::other(
            ExitStatus::BadInput,
            "no pool path is configured: set SW_POOL_PATH (or `pool_path` in the config) to the \
             directories that hold pools (DIR/NAME/VERSION.sqfs); `sw-pool config` shows the setting",
        ));
    }
    let all = spec::available(dirs);
    let chosen: Vec<&Available> = all
        .iter()
        .filter(|x| match a.name.as_deref() {
            None => true,
            Some(n) if n.contains('/') => x.spec() == n,
            Some(n) => x.name == n,
        })
        .collect();
    let shown = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    if let (Some(n), true) = (&a.name, chosen.is_empty()) {
        let hint = spec::did_you_mean(n, &all)
            .map(|m| format!("; did you mean {m}?"))
            .unwrap_or_default();
        return Err(Error::other(
            ExitStatus::BadInput,
            format!("no pool {n} on the pool path ({shown}){hint}"),
        ));
    }
    let uid = rustix::process::getuid().as_raw();
    let base =
        swpool_core::cache::base_dir(a.cache_dir.as_deref(), cfg.cache_dir.value.as_deref(), env);
    let cache = swpool_core::cache::existing_dir(&base, uid).ok().flatten();
    let rows: Vec<Row> = chosen
        .into_iter()
        .map(|x| match swpool_core::pool::Pool::open(&x.path) {
            Ok(pool) => Row {
                name: x.name.clone(),
                version: x.version.clone(),
                path: x.path.clone(),
                signed: Some(!pool.signature.is_empty()),
                cached: cache.as_ref().is_some_and(|c| {
                    swpool_core::cache::entry_path(
                        c,
                        &pool.manifest.name,
                        &pool.manifest.version,
                        &pool.manifest.digest,
                    )
                    .is_file()
                }),
                digest: Some(pool.manifest.digest),
                error: None,
            },
            Err(e) => Row {
                name: x.name.clone(),
                version: x.version.clone(),
                path: x.path.clone(),
                signed: None,
                cached: false,
                digest: None,
                error: Some(e.to_string()),
            },
        })
        .collect();
    if rows.is_empty() {
        p.result(format!("no pools on the pool path ({shown})"));
    } else {
        p.result(format!(
            "{:<28} {:<8} {:<7} FILE",
            "POOL", "SIGNED", "CACHED"
        ));
    }
    for r in &rows {
        p.result(format!(
            "{:<28} {:<8} {:<7} {}{}",
            format!("{}/{}", r.name, r.version),
            match r.signed {
                Some(true) => "yes",
                Some(false) => "no",
                None => "?",
            },
            if r.cached { "yes" } else { "no" },
            r.path.display(),
            r.error
                .as_deref()
                .map(|e| format!(" (not a readable pool: {e})"))
                .unwrap_or_default()
        ));
    }
    p.json(&serde_json::json!({ "pool_path": dirs, "pools": rows }));
    Ok(())
}
