//! `sw-pool`: the front. `run` and `shell` start an environment from here; every other command is
//! the full program, `sw-pool-full` beside this one, run in this process (`execv`, the same
//! arguments and `argv[0]`: MPI launchers, Slurm and the multi-call names see no difference).
//!
//! Why two programs: an environment start pays for every shared library the program that starts it
//! loads, and the full program links MPI and OpenSSL (measured: 1.9 ms of the 3.4 ms a start of
//! the full program costs, `bench/env-start.sh`). This one links neither (`ldd sw-pool`).

#![deny(clippy::print_stdout)]

// shared with the full program (crates/sw-pool-full); the front uses only the parts `run`/`shell`
// need
use sw_pool::{cli, eline, environment, output};

use std::ffi::{OsStr, OsString};
use std::process::ExitCode;

/// The subcommands the front runs itself.
const HERE: &[&str] = &["run", "shell"];

fn main() -> ExitCode {
    // a task the SPANK plugin's --layer started: `sw-pool run --layer L -- ITS PROGRAM ...`, here
    // (the environment is joined from this single-threaded program)
    let argv = swpool_node::config::spank_task_args(std::env::args_os().collect());
    if argv.get(1).map(OsString::as_os_str) == Some(OsStr::new("__enter")) {
        match argv.get(2).and_then(|s| s.to_str()) {
            Some(spec) => swpool_env::init::main(spec),
            None => return ExitCode::from(swpool_env::EXIT_SETUP as u8),
        }
    }
    if !runs_here(&argv) {
        return exec_full(&argv);
    }
    let cli = <FrontCli as clap::Parser>::parse_from(&argv);
    let env = swpool_node::config::Environment::capture();
    output::init_logging(&cli.global, &env);
    let g = &cli.global;
    let r = match cli.command {
        FrontCommand::Run(a) => environment::run(g, a, &env),
        FrontCommand::Shell(a) => environment::shell(g, a, &env),
    };
    // (run and shell exit with their command's status; they return only on failure)
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            environment::print(&e);
            ExitCode::from(e.status.code() as u8)
        }
    }
}

/// The command line of the two subcommands the front runs: the full program's [`cli::Cli`] with
/// only `run` and `shell` (the same argument types and texts). Building the parsers of every other
/// subcommand, and `--help`'s grouped listing, cost ~0.2 ms and ~40 page faults a start.
#[derive(clap::Parser)]
#[command(name = "sw-pool", version, after_help = cli::EXIT_STATUS_HELP)]
struct FrontCli {
    #[command(flatten)]
    global: cli::GlobalArgs,
    #[command(subcommand)]
    command: FrontCommand,
}

#[derive(clap::Subcommand)]
enum FrontCommand {
    #[command(about = cli::RUN_ABOUT)]
    Run(cli::RunArgs),
    #[command(about = cli::SHELL_ABOUT)]
    Shell(cli::ShellArgs),
}

/// Is the subcommand (the first argument that is not a global option) one of [`HERE`]? Only when
/// called as `sw-pool` (the multi-call names are other commands).
fn runs_here(argv: &[OsString]) -> bool {
    let name = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(OsStr::to_str);
    if !matches!(name, Some("sw-pool") | Some("sw-pool-front")) {
        return false;
    }
    let mut it = argv.iter().skip(1).map(|a| a.to_str());
    while let Some(a) = it.next() {
        match a {
            Some("-q" | "--quiet") => {}
            Some(f) if f.starts_with("--log=") => {}
            Some("--log") => {
                it.next();
            }
            Some(f)
                if f == "--verbose"
                    || (f.starts_with('-') && f.len() > 1 && f[1..].bytes().all(|b| b == b'v')) => {
            }
            Some(sub) => return HERE.contains(&sub),
            None => return false,
        }
    }
    false
}

/// Become the full program with the same arguments.
fn exec_full(argv: &[OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let full = std::env::current_exe()
        .map(|p| p.with_file_name("sw-pool-full"))
        .unwrap_or_else(|_| "sw-pool-full".into());
    let mut c = std::process::Command::new(&full);
    c.args(&argv[1..]);
    if let Some(a0) = argv.first() {
        c.arg0(a0);
    }
    let e = c.exec();
    eline!(
        "sw-pool: error: cannot run the full program {}: {e}. It is installed beside sw-pool \
         (`make install` and the Debian package install both); reinstall sw-pool",
        full.display()
    );
    ExitCode::from(swpool_node::ExitStatus::System.code() as u8)
}
