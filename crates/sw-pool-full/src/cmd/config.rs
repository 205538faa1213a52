use swpool_core::config::Environment;
use swpool_core::Error;

use crate::cli::{ConfigArgs, GlobalArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: ConfigArgs, env: &Environment) -> Result<(), Error> {
    let cfg = super::config(env)?;
    let p = Printer::new(g, a.json);
    // the effective trust policy: require_signature as set, or the default where keys are installed
    let dirs = swpool_core::trust::default_dirs(env);
    let policy =
        swpool_core::trust::policy_from_config(&cfg, swpool_core::trust::TrustedKeys::load(&dirs));
    let mut rows = cfg.rows();
    // one value everywhere: the row shows what applies, with its origin (issue 32, point 6)
    for r in rows.iter_mut().filter(|r| r.0 == "require_signature") {
        r.1 = policy.require_signature.to_string();
        r.2 = policy.origin.to_string();
    }
    // the directories as they are on this node for this user, not the rule that picks them
    let uid = rustix::process::geteuid().as_raw();
    for r in rows.iter_mut() {
        match r.0 {
            "cache_dir" => {
                let (base, chosen_by) =
                    swpool_core::cache::base_dir_from(None, cfg.cache_dir.value.as_deref(), env);
                let dir = swpool_core::cache::existing_dir(&base, uid)
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| swpool_core::userdir::predictable(&base, uid).join("cache"));
                r.1 = dir.display().to_string();
                if cfg.cache_dir.value.is_none() {
                    r.2 = format!("default: {chosen_by}");
                }
            }
            "mount_dir" => {
                r.1 = swpool_core::mount::paths::default_mount_dir(
                    cfg.mount_dir.value.as_deref(),
                    uid,
                    env,
                )
                .display()
                .to_string();
            }
            "layer_dir" => {
                if let Ok(store) = crate::environment::store(None, &cfg, env) {
                    r.1 = store.root().display().to_string();
                }
            }
            _ => {}
        }
    }
    for (k, v, o) in &rows {
        p.result(format!("{k:<18} {v:<40} ({o})"));
    }
    let required = if policy.require_signature {
        "signatures by a trusted key required"
    } else {
        "unsigned and untrusted pools allowed, with a warning"
    };
    let dir_list = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    p.result(format!(
        "{:<18} {required} ({})",
        "trust policy", policy.origin
    ));
    p.result(format!("{:<18} {dir_list}", "trusted keys in"));
    // the variables a user sets; --all adds those sw-pool writes for itself and the test switches
    let vars: Vec<_> = swpool_core::config::env_rows(env)
        .into_iter()
        .filter(|(_, _, _, kind)| a.all || matches!(*kind, "setting" | "file" | "option"))
        .collect();
    p.result(String::new());
    p.result(format!("{:<26} {:<40} origin", "environment", "value"));
    for (k, v, o, _) in &vars {
        p.result(format!("{k:<26} {v:<40} ({o})"));
    }
    if !a.all {
        p.verbose("variables sw-pool sets for itself and test switches: `sw-pool config --all`");
    }
    let files: Vec<String> = swpool_core::config::Config::files(env)
        .iter()
        .map(|f| f.display().to_string())
        .collect();
    p.verbose(format!(
        "files read: {}",
        if files.is_empty() {
            "none".into()
        } else {
            files.join(", ")
        }
    ));
    p.json(&serde_json::json!({
        "settings": rows.iter().map(|(k, v, o)| serde_json::json!({"key": k, "value": v, "origin": o})).collect::<Vec<_>>(),
        "environment": vars.iter().map(|(k, v, o, kind)| serde_json::json!({"name": k, "value": v, "origin": o, "kind": kind})).collect::<Vec<_>>(),
        "files": files,
        "trust_policy": {"require_signature": policy.require_signature, "origin": policy.origin.to_string(), "trusted_keys": policy.keys.keys.len(), "dirs": dirs},
    }));
    Ok(())
}
