//! `sw-pool-full`: parse, set up logging, dispatch, map the error to an exit status (`sw-pool`, the
//! front in crates/sw-pool, runs this program for every subcommand but `run` and `shell`).
//! Invoked as `scalable-fs-cp` or `scalable-fs-mount` (symlinks) it behaves as `sw-pool cp` / `sw-pool mount`,
//! the tools of the paper sw-pool implements (Dieterle, Nolte and Kunkel, *Scalable Software
//! Distribution for HPC-Systems with Software Pools Using MPI and File Systems in User Space*); "the
//! paper" in comments is that paper.

// stdout is written through `output::out` only: `print!` panics when the write fails
#![deny(clippy::print_stdout)]

mod cmd;
mod environment;
mod output;

// the command line and the environments are the sw-pool library's (shared with the front)
use sw_pool::cli;
#[allow(unused_imports)]
pub(crate) use sw_pool::eline;

use std::process::ExitCode;

fn main() -> ExitCode {
    // pid 1 of an environment (`sw-pool run`/`shell`): before anything else, and single-threaded
    let mut raw = std::env::args_os();
    if raw.nth(1).as_deref() == Some(std::ffi::OsStr::new("__enter")) {
        match raw.next().and_then(|s| s.into_string().ok()) {
            Some(spec) => swpool_env::init::main(&spec),
            None => return ExitCode::from(swpool_env::EXIT_SETUP as u8),
        }
    }
    // a task the SPANK plugin's --layer started: `sw-pool run --layer L -- ITS PROGRAM ...`
    let args = swpool_core::config::spank_task_args(std::env::args_os().collect());
    let args = cli::multicall_args(args);
    let cli = cli::parse_from(args);
    // the process environment, read once; everything below takes its values from this
    let env = swpool_core::config::Environment::capture();
    output::init_logging(&cli.global, &env);
    install_signal_cleanup();
    swpool_core::transfer::watchdog::on_stall(stalled);
    match cmd::run(cli, &env).and_then(|()| output::stdout_status()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::print_error(&e);
            ExitCode::from(e.exit_status().code() as u8)
        }
    }
}

/// On SIGINT/SIGTERM/SIGHUP stop the tools we started, undo a mount being set up, remove every
/// temporary output still being written, then exit 128+signal: an interrupted command leaves no
/// half-written file, helper or mount.
fn install_signal_cleanup() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        return;
    };
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            swpool_core::exec::terminate_children();
            // a mount in progress ends recorded or undone before we exit
            let _critical = swpool_core::mount::finish_pending();
            // an on-demand server's mount goes with it
            swpool_core::ondemand::serve::release_held();
            swpool_core::atomic::remove_all_registered();
            if let Some(l) = swpool_core::ondemand::view_serve::figures_line() {
                eprintln!("{l}");
            }
            let host = swpool_core::users::hostname();
            eprintln!(
                "sw-pool: interrupted by signal {sig} on {host} (pid {}); temporary files removed",
                std::process::id()
            );
            std::process::exit(128 + sig);
        }
    });
}

/// The broadcast watchdog fired (a peer died or hangs): remove this node's temporaries, say so once
/// and exit 8, so that the launcher tears down the other ranks.
fn stalled(s: &swpool_core::transfer::watchdog::Stall) {
    swpool_core::atomic::remove_all_registered();
    output::print_error(&swpool_core::Error::other(
        swpool_core::ExitStatus::Collective,
        format!("{s}; temporary files removed on this node"),
    ));
    std::process::exit(swpool_core::ExitStatus::Collective.code());
}
