//! The completion scripts of `sw-pool generate completions SHELL`, asked in the real shell what
//! `sw-pool build --<TAB>` and a few other command lines complete to.

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Command lines (the last word is being completed) and words their completions must include.
const CASES: &[(&[&str], &[&str])] = &[
    (
        &["sw-pool", "build", "--"],
        &["--size", "--format", "--force"],
    ),
    (&["sw-pool", "cache", "list", "--"], &["--json"]),
    (&["sw-pool", "slurm", "epilog", "--"], &["--job", "--uid"]),
    (&["sw-pool", "gen"], &["generate"]),
    (
        &["sw-pool", "generate", "completions", ""],
        &["bash", "zsh", "fish"],
    ),
];

fn have(shell: &str) -> bool {
    Command::new(shell)
        .arg("-c")
        .arg("exit 0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The script `sw-pool generate completions SHELL` writes, saved as `dir/name`.
fn generate(shell: &str, dir: &Path, name: &str) -> std::path::PathBuf {
    let o = sw_run(&["generate", "completions", shell]);
    assert_eq!(o.code, 0, "generate completions {shell}: {}", o.stderr);
    let p = dir.join(name);
    std::fs::write(&p, o.stdout).unwrap();
    p
}

/// Run `c` and return its stdout; fail after 30 s (an interactive shell waiting for input).
fn output(c: &mut Command) -> String {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{c:?} did not finish in 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let out = String::from_utf8_lossy(&reader.join().unwrap()).into_owned();
    assert!(status.success(), "{c:?}: {status}\n{out}\n{err}");
    out
}

fn check(shell: &str, line: &[&str], offered: &[String], want: &[&str]) {
    for w in want {
        assert!(
            offered.iter().any(|o| o == w),
            "{shell}: `{}<TAB>` does not offer {w}; it offers {offered:?}",
            line.join(" ")
        );
    }
}

/// bash: the completion function `complete -p sw-pool` names, called as bash calls it.
#[test]
fn bash_completes_after_a_subcommand() {
    if !have("bash") {
        skip("bash is not installed");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let script = generate("bash", d.path(), "sw-pool");
    let ask = r#"
source "$1" || exit 1
shift
f=$(complete -p sw-pool) || exit 1
f=${f#*-F }
f=${f%% *}
COMP_WORDS=("$@")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="$*"
COMP_POINT=${#COMP_LINE}
COMPREPLY=()
"$f" sw-pool "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"#;
    for (line, want) in CASES {
        let out = output(
            Command::new("bash")
                .args(["--norc", "--noprofile", "-c", ask, "bash"])
                .arg(&script)
                .args(*line),
        );
        let offered: Vec<String> = out.lines().map(String::from).collect();
        check("bash", line, &offered, want);
    }
}

/// zsh: an interactive zsh on a pseudo-terminal (zsh/zpty) with the script on $fpath types the
/// line and a TAB; a `compadd` wrapper prints what the completion system is given.
#[test]
fn zsh_completes_after_a_subcommand() {
    if !have("zsh") {
        skip("zsh is not installed");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    generate("zsh", d.path(), "_sw-pool");
    std::fs::write(
        d.path().join(".zshrc"),
        r#"PS1='' RPROMPT=''
fpath=("$ZDOTDIR" $fpath)
autoload -Uz compinit && compinit -u -D
compadd() {
  # queries (-O, -A, -D) pass through
  if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return; fi
  local -a hits
  builtin compadd -A hits "$@"
  local h
  for h in $hits; do print -r -- "MATCH $h"; done
  builtin compadd "$@"
}
done-completing() { print -r -- "DONE-COMPLETING"; exit }
comppostfuncs=(done-completing)
bindkey '^I' complete-word
"#,
    )
    .unwrap();
    let drive = r#"
zmodload zsh/zpty || exit 3
zpty z "ZDOTDIR=${(q)1} zsh -d -i"
zpty -w -n z "$2"$'\t'
zpty -r z out '*DONE-COMPLETING*' || exit 4
print -r -- "$out"
zpty -d z
"#;
    for (line, want) in CASES {
        let out = output(
            Command::new("zsh")
                .args(["-f", "-c", drive, "zsh"])
                .arg(d.path())
                .arg(line.join(" ")),
        );
        let offered: Vec<String> = out
            .lines()
            .filter_map(|l| l.trim_end_matches('\r').split("MATCH ").nth(1))
            .map(String::from)
            .collect();
        check("zsh", line, &offered, want);
    }
}

/// fish: `complete -C LINE` with the script in the only completion directory (autoloaded).
#[test]
fn fish_completes_after_a_subcommand() {
    if !have("fish") {
        skip("fish is not installed");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    generate("fish", d.path(), "sw-pool.fish");
    // clap_complete's fish script completes no positional argument's values (`generate
    // completions <TAB>` offers file names): the cases of options and subcommands only
    for (line, want) in CASES.iter().filter(|(l, _)| l.last() != Some(&"")) {
        let out = output(
            Command::new("fish")
                .args([
                    "--no-config",
                    "-c",
                    // fish loads a command's completions only when the command exists
                    "set PATH $argv[3] $PATH; set fish_complete_path $argv[1]; complete -C $argv[2]",
                ])
                .arg(d.path())
                .arg(line.join(" "))
                .arg(bin().parent().unwrap()),
        );
        let offered: Vec<String> = out
            .lines()
            .map(|l| l.split('\t').next().unwrap_or("").to_string())
            .collect();
        check("fish", line, &offered, want);
    }
}

/// bash without the bash-completion package: an interactive bash that read only the shell
/// integration (`eval "$(sw-pool shell-init bash)"`, as /etc/profile.d/sw-pool.sh) completes
/// sw-pool's subcommands and options, pool names from the pool path, pools loaded in this shell and
/// layer names (the first TAB loads the script; `complete -p` and the function driven through
/// COMP_WORDS/COMP_CWORD as bash drives it).
#[test]
fn bash_completes_names_without_bash_completion() {
    if !have("bash") {
        skip("bash is not installed");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let pools = d.path().join("pools");
    std::fs::create_dir_all(pools.join("demo")).unwrap();
    std::fs::create_dir_all(pools.join("tools")).unwrap();
    std::fs::write(pools.join("demo/1.0.sqfs"), b"").unwrap();
    std::fs::write(pools.join("tools/2.0.sqfs"), b"").unwrap();
    let layers = d.path().join("layers");
    let dir = bin().parent().unwrap().to_path_buf();
    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap());
    for l in ["dev", "data"] {
        let o = run(sw()
            .env("SW_POOL_LAYER_DIR", &layers)
            .args(["layer", "create", l]));
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    let ask = r#"
eval "$(sw-pool shell-init bash)"
complete -p sw-pool >/dev/null || { echo "NO COMPLETION"; exit 0; }
comp() {
  COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMPREPLY=()
  local f; f=$(complete -p sw-pool); f=${f#*-F }; f=${f%% *}
  "$f" sw-pool "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  echo "$*|${COMPREPLY[*]}"
}
comp sw-pool lo
comp sw-pool load ""
comp sw-pool load de
comp sw-pool unload ""
comp sw-pool run --layer d
comp sw-pool layer rm ""
comp sw-pool build --fo
"#;
    let out = output(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-i", "-c", ask])
            .env("PATH", &path)
            .env("SW_POOL_PATH", &pools)
            .env("SW_POOL_LAYER_DIR", &layers)
            .env("SW_POOL_LOADED", "/m/demo/1.0:/m/x/2"),
    );
    let got = |line: &str| -> Vec<String> {
        let l = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{line}|")))
            .unwrap_or_else(|| panic!("no answer for `{line}`:\n{out}"));
        let mut v: Vec<String> = l.split_whitespace().map(String::from).collect();
        v.sort();
        v
    };
    assert!(!out.contains("NO COMPLETION"), "{out}");
    assert_eq!(got("sw-pool lo"), ["load"]);
    let all = got("sw-pool load ");
    assert!(
        all.contains(&"demo/1.0".to_string()) && all.contains(&"tools/2.0".to_string()),
        "{all:?}"
    );
    assert_eq!(got("sw-pool load de"), ["demo/1.0"]);
    let loaded = got("sw-pool unload ");
    assert!(
        loaded.contains(&"/m/demo/1.0".to_string()) && loaded.contains(&"/m/x/2".to_string()),
        "{loaded:?}"
    );
    assert_eq!(got("sw-pool run --layer d"), ["data", "dev"]);
    assert_eq!(got("sw-pool layer rm "), ["data", "dev"]);
    assert_eq!(got("sw-pool build --fo"), ["--force", "--format"]);
}
