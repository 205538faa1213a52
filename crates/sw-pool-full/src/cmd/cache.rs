//! `sw-pool cache list|prune`: this user's node-local pool cache.

use std::path::PathBuf;

use swpool_core::cache::{self, Entry};
use swpool_core::config::Environment;
use swpool_core::size::{parse_size, Bytes};
use swpool_core::state::StateDir;
use swpool_core::Error;

use crate::cli::{CacheArgs, CacheCommand, GlobalArgs};
use crate::output::Printer;

/// Images mounted by this user on this node (never evicted).
pub fn images_in_use(env: &Environment) -> Vec<PathBuf> {
    StateDir::open_default(env)
        .map(|d| swpool_core::state::images_in_use(&d))
        .unwrap_or_default()
}

pub fn run(g: &GlobalArgs, a: CacheArgs, env: &Environment) -> Result<(), Error> {
    let cfg = super::config(env)?;
    let uid = rustix::process::geteuid().as_raw();
    let base = cache::base_dir(a.cache_dir.as_deref(), cfg.cache_dir.value.as_deref(), env);
    if let CacheCommand::Fetch {
        require_signature,
        no_progress,
        json,
        for_step,
        pool,
    } = &a.command
    {
        let f = super::fetch::Fetch {
            cache_dir: a.cache_dir.as_deref(),
            require_signature: *require_signature,
            no_progress: *no_progress,
            json: *json,
            for_step: for_step.as_deref(),
            pool,
        };
        return super::fetch::run(g, f, env);
    }
    if let CacheCommand::Trace { output, view, pool } = &a.command {
        return match (view, pool) {
            (Some(v), _) => view_trace(g, &base, uid, output.as_deref(), v),
            (None, Some(p)) => trace(g, &cfg, &base, uid, output.as_deref(), p),
            (None, None) => Err(Error::other(
                swpool_core::ExitStatus::Usage,
                "cache trace: give a POOL or --view DIR".to_string(),
            )),
        };
    }
    let Some(dir) = cache::existing_dir(&base, uid)? else {
        // nothing was ever cached here: nothing to list or prune (not an error)
        let p = Printer::new(g, matches!(a.command, CacheCommand::List { json: true }));
        let dir = base.join(format!("sw-pool-{uid}")).join("cache");
        p.result(format!(
            "no pool cached in {} yet: nothing to list or prune",
            dir.display()
        ));
        p.json(&serde_json::json!({"dir": dir, "total_bytes": 0, "entries": []}));
        return Ok(());
    };
    let entries = cache::list(&dir, &images_in_use(env))?;
    match a.command {
        CacheCommand::List { json } => {
            let p = Printer::new(g, json);
            let total: u64 = entries.iter().map(|e| e.disk_bytes).sum();
            for e in &entries {
                p.result(line(e));
            }
            p.result(format!(
                "{} entries, {} in {}",
                entries.len(),
                Bytes(total),
                dir.display()
            ));
            p.json(&serde_json::json!({"dir": dir, "total_bytes": total, "entries": entries}));
        }
        CacheCommand::Prune { max_size, dry_run } => {
            let p = Printer::new(g, false);
            let total: u64 = entries.iter().map(|e| e.disk_bytes).sum();
            let target = match max_size {
                Some(s) => parse_size(&s)?,
                None => match cfg.cache_prune_target(total) {
                    Some(t) => t,
                    None => {
                        p.result(format!(
                            "{} in {}: {} (give --max-size, or set cache_high_watermark)",
                            Bytes(total),
                            dir.display(),
                            if cfg.cache_high_watermark.value.is_some() {
                                "below the high watermark"
                            } else {
                                "no watermark configured"
                            }
                        ));
                        return Ok(());
                    }
                },
            };
            let (victims, left) = cache::plan_prune(&entries, target);
            for v in victims {
                if dry_run {
                    p.result(format!("would remove {}", line(v)));
                } else {
                    swpool_core::cache::remove_entry(&v.path).map_err(|source| {
                        swpool_core::cache::CacheError::Io {
                            what: "remove",
                            path: v.path.clone(),
                            source,
                        }
                    })?;
                    p.result(format!("removed {}", line(v)));
                }
            }
            p.result(format!(
                "{} left (target {}){}",
                Bytes(left),
                Bytes(target),
                if left > target {
                    "; the rest is mounted"
                } else {
                    ""
                }
            ));
        }
        CacheCommand::Trace { .. } | CacheCommand::Fetch { .. } => unreachable!("handled above"),
    }
    Ok(())
}

/// `cache trace`: the chunks on-demand runs fetched here, as a prefetch list.
fn trace(
    g: &GlobalArgs,
    cfg: &swpool_core::config::Config,
    base: &std::path::Path,
    uid: u32,
    output: Option<&std::path::Path>,
    pool: &std::path::Path,
) -> Result<(), Error> {
    use swpool_core::ondemand::prefetch;
    let src = swpool_core::load::resolve(pool, &cfg.pool_path.value)?;
    let m = swpool_core::pool::Pool::open(&src)?.manifest;
    let dir = cache::dir(base, uid, false)?;
    let list = prefetch::trace(&dir, &m)?;
    let text = list.render();
    emit(&Printer::new(g, false), output, &text, |o| {
        format!(
            "{} of {} chunks of {}/{} written to {} (load --lazy --prefetch {})",
            list.chunks.len(),
            list.total,
            m.name,
            m.version,
            o.display(),
            o.display()
        )
    })
}

/// `text` to standard output, or to `output` (replaced whole) and then `said(output)` said.
fn emit(
    p: &Printer,
    output: Option<&std::path::Path>,
    text: &str,
    said: impl FnOnce(&std::path::Path) -> String,
) -> Result<(), Error> {
    match output {
        None => crate::output::out(text.as_bytes()),
        Some(o) => {
            swpool_core::atomic::write_file(o, text.as_bytes(), false).map_err(|e| {
                Error::other(
                    swpool_core::ExitStatus::System,
                    format!("cannot write {}: {e}", o.display()),
                )
            })?;
            p.result(said(o));
        }
    }
    Ok(())
}

/// `cache trace --view DIR`: the files of DIR that `run --cache DIR` jobs read on this node.
fn view_trace(
    g: &GlobalArgs,
    base: &std::path::Path,
    uid: u32,
    output: Option<&std::path::Path>,
    view: &std::path::Path,
) -> Result<(), Error> {
    let tree = std::fs::canonicalize(view).map_err(|e| {
        Error::other(
            swpool_core::ExitStatus::BadInput,
            format!(
                "--view {}: {e}; give the directory jobs ran with --cache",
                view.display()
            ),
        )
    })?;
    let dir = cache::dir(base, uid, false)?;
    let warm = swpool_core::cache::views_dir(&dir).join(swpool_core::cache::view_key(&tree));
    let files = swpool_serve::view::warm_list(&warm)
        .map_err(|e| Error::other(swpool_core::ExitStatus::System, e))?;
    let mut text = String::new();
    for f in &files {
        text.push_str(&tree.join(&f.path).to_string_lossy());
        text.push('\n');
    }
    let p = Printer::new(g, false);
    if files.is_empty() {
        p.warn(format!(
            "no job with --cache {} read files on this node (or its warm cache was emptied: {})",
            tree.display(),
            warm.display()
        ));
    }
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    emit(&p, output, &text, |o| {
        format!(
            "{} files of {} ({}) that jobs read on this node written to {}",
            files.len(),
            tree.display(),
            Bytes(bytes),
            o.display()
        )
    })
}

fn line(e: &Entry) -> String {
    format!(
        "{:<24} {:>10} {}{}",
        e.pool.as_deref().unwrap_or(match e.partial {
            true => "(partial copy)",
            false => "(damaged)",
        }),
        Bytes(e.disk_bytes).to_string(),
        e.path.display(),
        if e.in_use { "  (mounted)" } else { "" }
    )
}
