use swpool_core::{Error, ExitStatus};

use swpool_core::config::{EnvVar, Environment};

use crate::cli::{GenerateArgs, GenerateWhat, WordKind};

pub fn run(a: GenerateArgs, env: &Environment) -> Result<(), Error> {
    match a.what {
        GenerateWhat::Completions { shell } => {
            let mut cmd = crate::cli::help::command();
            // into memory first: clap_complete panics when its writer fails (a closed stdout)
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, BIN, &mut script);
            if shell == clap_complete::Shell::Bash {
                script = bash_case_labels(&String::from_utf8_lossy(&script)).into_bytes();
                script.extend_from_slice(BASH_NAMES.as_bytes());
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
        GenerateWhat::Words { kind } => {
            let mut out = String::new();
            for w in words(kind, env) {
                out.push_str(&w);
                out.push('\n');
            }
            crate::output::out(out.as_bytes());
            Ok(())
        }
    }
}

/// The names `kind` completes to; nothing when they cannot be read (a completion prints no error).
fn words(kind: WordKind, env: &Environment) -> Vec<String> {
    let Ok(cfg) = super::config(env) else {
        return Vec::new();
    };
    match kind {
        WordKind::Pools => swpool_core::pool::spec::available(&cfg.pool_path.value)
            .iter()
            .map(|a| a.spec())
            .collect(),
        WordKind::Loaded => {
            let mut v: Vec<String> = env
                .get(EnvVar::Loaded)
                .unwrap_or_default()
                .split(':')
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .collect();
            v.sort();
            v.dedup();
            v
        }
        WordKind::Layers => crate::environment::store(None, &cfg, env)
            .ok()
            .and_then(|s| s.names().ok())
            .unwrap_or_default(),
    }
}

/// Appended to clap_complete's bash script: after its completions, the names a word can be —
/// pools on the pool path (`load`, `avail`, `mount`, `inspect`, `verify`, `cp`), pools loaded in this
/// shell (`unload`, `env`), layers (`--layer`, `layer rm|du|sync|export`) — from `sw-pool generate
/// words`. Plain bash (`complete`, `compgen`): the bash-completion package is not needed.
const BASH_NAMES: &str = r#"
_sw_pool_complete() {
    _sw__pool "$@"
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" sub="" sub2="" kind="" w i
    if [ "$COMP_CWORD" -gt 0 ]; then prev="${COMP_WORDS[COMP_CWORD-1]}"; fi
    case "$cur" in -*) return 0 ;; esac
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${COMP_WORDS[i]}"
        case "$w" in
            -*) ;;
            *) if [ -z "$sub" ]; then sub="$w"; elif [ -z "$sub2" ]; then sub2="$w"; fi ;;
        esac
    done
    case "$prev" in
        --layer) kind=layers ;;
        --pool | --base) kind=pools ;;
        *)
            case "$sub" in
                load | avail | mount | inspect | verify | cp) kind=pools ;;
                unload | env) kind=loaded ;;
                layer) case "$sub2" in rm | du | sync | export) kind=layers ;; esac ;;
            esac
            ;;
    esac
    [ -n "$kind" ] || return 0
    # a layer is only a name: clap's file names are no answer there
    if [ "$kind" = layers ]; then COMPREPLY=(); fi
    local names
    names="$(command sw-pool generate words "$kind" 2>/dev/null)" || return 0
    local IFS=$'\n'
    COMPREPLY+=($(compgen -W "$names" -- "$cur"))
}
complete -F _sw_pool_complete -o bashdefault -o default sw-pool
"#;

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
