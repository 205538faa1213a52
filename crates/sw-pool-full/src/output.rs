//! The sw-pool library's output (shared with the front) and what of it speaks swpool-core's error.

pub use sw_pool::output::*;

/// At the end of a command that succeeded: see [`sw_pool::output::stdout_status`].
pub fn stdout_status() -> Result<(), swpool_core::Error> {
    sw_pool::output::stdout_status().map_err(|e| {
        swpool_core::Error::other(
            swpool_core::ExitStatus::System,
            format!("cannot write to standard output: {e}"),
        )
    })
}

/// The shell for printed environment code: `--shell`, `$SW_POOL_SHELL`, else from `$SHELL` (the
/// variables from `env`).
pub fn shell(
    flag: Option<&str>,
    env: &swpool_core::config::Environment,
) -> Result<swpool_core::env::Shell, swpool_core::Error> {
    use swpool_core::{env::Shell, Error, ExitStatus};
    let configured = flag
        .map(String::from)
        .or_else(|| env.get_nonempty(swpool_core::config::EnvVar::Shell));
    match configured {
        Some(s) => s
            .parse()
            .map_err(|e: String| Error::other(ExitStatus::BadInput, e)),
        None => Ok(Shell::from_env(env)),
    }
}
