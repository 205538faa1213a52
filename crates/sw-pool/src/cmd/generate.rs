use swpool_core::{Error, ExitStatus};

use crate::cli::{GenerateArgs, GenerateWhat};

pub fn run(a: GenerateArgs) -> Result<(), Error> {
    match a.what {
        GenerateWhat::Completions { shell } => {
            let mut cmd = crate::cli::help::command();
            // into memory first: clap_complete panics when its writer fails (a closed stdout)
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, BIN, &mut script);
            if shell == clap_complete::Shell::Bash {
                script = bash_case_labels(&String::from_utf8_lossy(&script)).into_bytes();
            }
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
            let cmd = crate::cli::help::command();
            clap_mangen::generate_to(cmd, &dir).map_err(io)?;
            Ok(())
        }
    }
}

const BIN: &str = "sw-pool";

/// clap_complete's bash script (since 4.6.2, still in 4.6.11: clap-rs/clap#6421, #6529) spells a
/// subcommand's state two ways when the binary's name has a hyphen: the loop over the words sets
/// `cmd="sw__pool__subcmd__build"`, the case arm tests `sw__subcmd__pool__subcmd__build)`, so no
/// arm matches and nothing completes after a subcommand. Spell it the loop's way everywhere: a
/// no-op once clap_complete agrees with itself, and consistent if it changes the loop's spelling
/// to the arms' instead.
fn bash_case_labels(script: &str) -> String {
    const SEP: &str = "__subcmd__"; // clap_complete's separator of subcommands in a state name
    let arms = format!("{}{SEP}", BIN.replace('-', SEP));
    let the_loop = format!("{}{SEP}", BIN.replace('-', "__"));
    script.replace(&arms, &the_loop)
}

#[cfg(test)]
mod tests {
    /// Every state the loop sets has its case arm.
    #[test]
    fn bash_states_have_arms() {
        let mut cmd = <crate::cli::Cli as clap::CommandFactory>::command();
        let mut raw = Vec::new();
        clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, super::BIN, &mut raw);
        let script = super::bash_case_labels(&String::from_utf8(raw).unwrap());
        let states: Vec<&str> = script
            .lines()
            .filter_map(|l| l.trim().strip_prefix("cmd=\"")?.strip_suffix('"'))
            .filter(|s| !s.is_empty())
            .collect();
        assert!(states.len() > 20, "{states:?}");
        for s in states {
            assert!(
                script.lines().any(|l| l.trim() == format!("{s})")),
                "no case arm for {s}"
            );
        }
    }
}
