//! One module per subcommand: each turns its arguments into library calls.

mod build;
mod config;
mod cp;
mod generate;
mod init;
mod inspect;
mod keygen;
mod modulefiles;
mod sign;
mod verify;

use swpool_core::{Error, ExitStatus};

use crate::cli::{Cli, Command};

pub fn run(cli: Cli) -> Result<(), Error> {
    let g = &cli.global;
    match cli.command {
        Command::Build(a) => build::run(g, a),
        Command::Inspect(a) => inspect::run(g, a),
        Command::Init(a) => init::run(g, a),
        Command::Modulefiles(a) => modulefiles::run(g, a),
        Command::Keygen(a) => keygen::run(g, a),
        Command::Sign(a) => sign::run(g, a),
        Command::Verify(a) => verify::run(g, a),
        Command::Config(a) => config::run(g, a),
        Command::Generate(a) => generate::run(a),
        Command::Cp(a) => cp::run(g, a),
        Command::Mount(_) => Err(not_yet("mount (scalable-fs-mount)", "FUSE mounting")),
    }
}

fn not_yet(what: &str, feature: &str) -> Error {
    Error::other(
        ExitStatus::Internal,
        format!("{what} is not yet available in this build: {feature} has not landed yet"),
    )
}

/// Load the configuration (files and environment; flags are applied by each command).
pub fn config() -> Result<swpool_core::config::Config, Error> {
    Ok(swpool_core::config::Config::load()?)
}
