//! `sw-pool run` / `sw-pool shell`: the command line's options handed to the node layer
//! ([`swpool_node::isolated`]: what the environment is made of, and its start), and what the user
//! sees of it (the lines on entry and exit, the prompt's mark, a login's way out, the error).

use std::ffi::OsString;
use std::path::PathBuf;

use swpool_env::LayerStore;
use swpool_node::config::{Config, Environment, HostVar};
use swpool_node::isolated::{self, Options, Voice};

pub use swpool_node::isolated::Failed;

use crate::cli::{EnvironmentArgs, GlobalArgs, RunArgs, ShellArgs};
use crate::output::Printer;

/// Print a failure as every sw-pool error is printed (one write).
pub fn print(f: &Failed) {
    crate::eline!("sw-pool: error: {}", f.message);
}

/// The layer store: `--layer-dir`, config `layer_dir` / `$SW_POOL_LAYER_DIR`, else the default.
pub fn store(flag: Option<PathBuf>, cfg: &Config, env: &Environment) -> Result<LayerStore, Failed> {
    isolated::store(flag, cfg, env)
}

/// The node layer's options of `run`/`shell`'s command line.
fn options(g: &GlobalArgs, a: EnvironmentArgs) -> Options {
    Options {
        layer: a.layer,
        root: a.root,
        layer_dir: a.layer_dir,
        keep_upper: a.keep_upper,
        shadow: a.shadow,
        base: a.base,
        pool: a.pool,
        cache: a.cache,
        voice: Voice::of(g.quiet, g.verbose),
    }
}

pub fn run(g: &GlobalArgs, a: RunArgs, env: &Environment) -> Result<(), Failed> {
    start(g, a.env, a.cmd, env, None, None)
}

pub fn shell(g: &GlobalArgs, a: ShellArgs, env: &Environment) -> Result<(), Failed> {
    let sh = env
        .get_os(HostVar::Shell)
        .filter(|s| !s.is_empty())
        .map(OsString::from)
        .unwrap_or_else(|| "/bin/sh".into());
    let layer = a.env.layer.as_deref();
    let mark = prompt_mark(
        env.get(swpool_node::config::EnvVar::Prompt),
        layer,
        a.env.root,
    );
    if !mark.is_empty() {
        // bash runs PROMPT_COMMAND before each prompt, after its start-up files set PS1: the mark
        // goes in front of whatever PS1 they made; other shells get it in PS1 from the environment
        // (single-threaded here: nothing reads the environment concurrently)
        let ps1 = env.get_os(HostVar::Ps1).map(OsString::from);
        let mut with_mark = OsString::from(&mark);
        with_mark.push(ps1.as_deref().unwrap_or_else(|| "$ ".as_ref()));
        std::env::set_var("PS1", with_mark);
        std::env::set_var("SW_POOL_PROMPT_MARK", &mark);
        let mut pc = OsString::from(
            r#"case "$PS1" in "$SW_POOL_PROMPT_MARK"*) ;; *) PS1="$SW_POOL_PROMPT_MARK$PS1" ;; esac"#,
        );
        if let Some(before) = env.get_os(HostVar::PromptCommand).filter(|p| !p.is_empty()) {
            pc.push("; ");
            pc.push(before);
        }
        std::env::set_var("PROMPT_COMMAND", pc);
    }
    let what = match (layer, a.env.root) {
        (Some(l), false) => format!("with layer {l} (what you change in / goes into it)"),
        (Some(l), true) => format!(
            "with layer {l} AS ROOT: uid 0 inside is you, not the node's root; what you change in / \
             goes into the layer"
        ),
        (None, false) => "without a layer (/ is the node's, read-only where it is for you)".into(),
        (None, true) => "without a layer AS ROOT: uid 0 inside is you, not the node's root".into(),
    };
    let name = layer.map_or_else(
        || "the environment".to_string(),
        |l| format!("layer {l}'s environment"),
    );
    let quiet = g.quiet;
    let enter = (!quiet)
        .then(|| format!("sw-pool: entering an isolated environment {what}; `exit` leaves it"));
    let leave = (!quiet).then(|| format!("sw-pool: left {name}"));
    let login = a.login.map(|file| Login {
        file,
        layer: layer.unwrap_or("-").to_string(),
    });
    start(
        g,
        a.env,
        vec![sh],
        env,
        Some((enter, leave)),
        login.as_ref(),
    )
}

/// A `shell` started for a login (`shell-init --login-env`, `shell --login FILE`).
struct Login {
    /// Made by the login's shell: gets the environment's shell's status once that has run.
    file: PathBuf,
    layer: String,
}

/// The one line a login gets when its environment cannot start: why, and what to do.
pub fn login_failed_line(layer: &str, why: &str) -> String {
    let why = why.trim().replace('\n', "; ");
    format!(
        "sw-pool: your logins go into layer {layer}'s environment (shell-init --login-env {layer}), \
         but it could not start: {why}. This is a plain shell: fix that, or log in without it \
         (SW_POOL_NO_LOGIN_ENV=1, or drop --login-env from your shell's start-up file)"
    )
}

/// Tell the login's shell that the environment's shell ran (its status in `file`, which that
/// shell made): it then ends with it. Opened without following a link and without creating.
fn login_ran(file: &std::path::Path, status: i32) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let wrote = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(file)
        .and_then(|mut f| writeln!(f, "{status}"));
    if let Err(e) = wrote {
        crate::eline!(
            "sw-pool: warning: cannot tell the login's shell that the environment ended ({}: {e}): \
             it stays open, `exit` it",
            file.display()
        );
    }
}

/// The mark `shell` puts before the prompt: `$SW_POOL_PROMPT` with `LAYER` replaced (empty: none),
/// else `(sw-pool LAYER) `, and `, root` with `--root`.
pub fn prompt_mark(configured: Option<String>, layer: Option<&str>, root: bool) -> String {
    let name = layer.unwrap_or("-");
    match configured {
        Some(c) => c.replace("LAYER", name),
        None => format!("(sw-pool {name}{}) ", if root { ", root" } else { "" }),
    }
}

/// Set up, run, and exit with the command's status (125 when the environment could not be made).
fn start(
    g: &GlobalArgs,
    a: EnvironmentArgs,
    argv: Vec<OsString>,
    env: &Environment,
    lines: Option<(Option<String>, Option<String>)>,
    login: Option<&Login>,
) -> Result<(), Failed> {
    let p = Printer::new(g, false);
    let setup_failed = |e: &dyn std::fmt::Display| -> ! {
        match login {
            Some(l) => crate::eline!("{}", login_failed_line(&l.layer, &e.to_string())),
            None => print(&Failed::new(swpool_node::ExitStatus::BadInput, e)),
        }
        std::process::exit(swpool_env::EXIT_SETUP)
    };
    let warn = |m: String| p.warn(m);
    let prepared = match isolated::prepare(options(g, a), argv, env, &warn) {
        Ok(pr) => pr,
        Err(e) => setup_failed(&e),
    };
    let (enter, leave) = lines.unwrap_or_default();
    let on_plan = |plan: &swpool_env::Plan| {
        if let Some(l) = &enter {
            crate::eline!("{l}");
        }
        if p.verbosity >= crate::output::Verbosity::Verbose {
            crate::eline!(
                "sw-pool: environment: {} ({})",
                plan.method.as_str(),
                plan.why
            );
        }
    };
    match isolated::start(&prepared, env, &on_plan) {
        Ok(out) => {
            let _ = crate::output::stdout_status();
            if let Some(l) = login {
                // the shell itself could not run in it (a layer that hides or breaks it): the
                // login stays a plain shell
                if matches!(
                    out.status,
                    swpool_env::EXIT_CANNOT_EXEC | swpool_env::EXIT_NOT_FOUND
                ) {
                    setup_failed(&format!(
                        "its shell ({}) could not run in it (exit status {})",
                        prepared.request.argv[0].to_string_lossy(),
                        out.status
                    ));
                }
                login_ran(&l.file, out.status);
            }
            if let Some(l) = &leave {
                crate::eline!("{l} (exit status {})", out.status);
            }
            std::process::exit(out.status)
        }
        Err(e) => setup_failed(&e),
    }
}
