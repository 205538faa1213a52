use clap::CommandFactory;
use swpool_core::{Error, ExitStatus};

use crate::cli::{Cli, GenerateArgs, GenerateWhat};

pub fn run(a: GenerateArgs) -> Result<(), Error> {
    match a.what {
        GenerateWhat::Completions { shell } => {
            let mut cmd = Cli::command();
            // into memory first: clap_complete panics when its writer fails (a closed stdout)
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "sw-pool", &mut script);
            crate::output::out(&script);
            Ok(())
        }
        GenerateWhat::Man { dir } => {
            let io = |e: std::io::Error| {
                Error::other(
                    ExitStatus::System,
                    format!("cannot write man pages to {}: {e}", dir.display()),
                )
            };
            std::fs::create_dir_all(&dir).map_err(io)?;
            let cmd = Cli::command();
            clap_mangen::generate_to(cmd, &dir).map_err(io)?;
            Ok(())
        }
    }
}
