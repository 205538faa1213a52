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
            // clap_mangen puts the text after the options under "EXTRA": give it its own sections
            for e in std::fs::read_dir(&dir).map_err(io)? {
                let p = e.map_err(io)?.path();
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                if !(name.starts_with(BIN) && name.ends_with(".1")) {
                    continue;
                }
                let roff = std::fs::read_to_string(&p).map_err(io)?;
                let tmp = p.with_extension("1.tmp");
                std::fs::write(&tmp, man_sections(&roff)).map_err(io)?;
                std::fs::rename(&tmp, &p).map_err(io)?;
            }
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

/// A heading of the help text after the options: capitals (and spaces) before a colon that starts
/// the line (`EXIT STATUS:`, `EXAMPLES:`, `IN A JOB: ...`); the heading and the rest of the line.
fn heading(line: &str) -> Option<(&str, &str)> {
    let (h, rest) = line.split_once(':')?;
    let caps = h.len() >= 3
        && h.starts_with(|c: char| c.is_ascii_uppercase())
        && h.chars().all(|c| c.is_ascii_uppercase() || c == ' ');
    caps.then(|| (h, rest.trim_start()))
}

/// A clap_mangen page with the after-help text under sections of its own headings instead of
/// "EXTRA" (`EXIT STATUS`, `EXAMPLES`, ...; text without a heading: `NOTES`), `…` spelled `...`
/// and `×` troff's `\(mu` (troff has no glyph for U+2026 on the ASCII and Latin-1 devices and
/// warns; a raw `×` is two bytes it cannot read without preconv).
fn man_sections(roff: &str) -> String {
    let mut out = String::new();
    let mut extra = false;
    let mut lines = roff.lines().peekable();
    while let Some(line) = lines.next() {
        let line = line.replace('\u{2026}', "...").replace('\u{d7}', "\\(mu");
        if line == ".SH EXTRA" {
            extra = true;
            if lines.peek().and_then(|l| heading(l)).is_none() {
                out.push_str(".SH NOTES\n");
            }
            continue;
        }
        if line.starts_with(".SH ") {
            extra = false;
        }
        match heading(&line).filter(|_| extra) {
            Some((h, rest)) => {
                out.push_str(&format!(".SH \"{h}\"\n"));
                if !rest.is_empty() {
                    out.push_str(rest);
                    out.push('\n');
                }
            }
            None => {
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    out
}

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
    #[test]
    fn man_pages_give_the_after_help_its_own_sections() {
        let roff = ".SH OPTIONS\nx\n.SH EXTRA\nEXIT STATUS:\n  0  success \u{2026}\n\nIN A JOB: in a batch script\nmore\n.SH VERSION\nv1\n";
        let got = super::man_sections(roff);
        assert_eq!(
            got,
            ".SH OPTIONS\nx\n.SH \"EXIT STATUS\"\n  0  success ...\n\n.SH \"IN A JOB\"\nin a batch script\nmore\n.SH VERSION\nv1\n"
        );
        let plain = super::man_sections(".SH EXTRA\nSee also: x\n.SH VERSION\n");
        assert!(plain.starts_with(".SH NOTES\nSee also"), "{plain}");
    }

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
