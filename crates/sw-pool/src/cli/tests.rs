//! Checks of the command-line definitions (clap structs, help, groups).
use super::help::{command, GROUPS};
use super::*;
use clap::CommandFactory;

#[test]
fn cli_is_consistent() {
    Cli::command().debug_assert();
    command().debug_assert();
}

/// `--help` lists the subcommands in groups (issue 32, point 8): each visible one in exactly
/// one, and the listing fits 80 columns.
#[test]
fn every_subcommand_is_in_one_group() {
    let c = Cli::command();
    for s in c.get_subcommands().filter(|s| !s.is_hide_set()) {
        let n = GROUPS
            .iter()
            .filter(|(_, names)| names.contains(&s.get_name()))
            .count();
        assert_eq!(n, 1, "{} is in {n} groups", s.get_name());
    }
    for (_, names) in GROUPS {
        for name in *names {
            assert!(c.find_subcommand(name).is_some(), "{name}");
        }
    }
    let help = command().render_help().to_string();
    for (title, names) in GROUPS {
        let at = help.find(&format!("{title}:")).expect(title);
        for name in *names {
            assert!(help[at..].contains(&format!("  {name} ")), "{name}: {help}");
        }
    }
    let listing = &help[help.find(GROUPS[0].0).unwrap()..help.find("Options:").unwrap()];
    for line in listing.lines() {
        assert!(line.chars().count() <= 80, "{line:?}");
    }
}

#[test]
fn log_levels_are_checked() {
    for ok in ["warn", "debug", "swpool_core=trace,warn", "INFO"] {
        assert!(
            Cli::try_parse_from(["sw-pool", "--log", ok, "config"]).is_ok(),
            "{ok}"
        );
    }
    for bad in ["bogus", "warn,verbose", "x=loud"] {
        let e = Cli::try_parse_from(["sw-pool", "--log", bad, "config"]).unwrap_err();
        assert!(e.to_string().contains("is not a log level"), "{bad}: {e}");
    }
}

/// The help footers (examples, notes) keep their own line breaks on an 80-column terminal:
/// every line as written appears whole in the help (issue 32, point 8).
#[test]
fn help_footers_keep_their_line_breaks() {
    fn walk(c: &clap::Command, path: &str, broken: &mut Vec<String>) {
        let help = c.clone().term_width(80).render_long_help().to_string();
        for text in [c.get_after_help(), c.get_after_long_help()]
            .into_iter()
            .flatten()
        {
            for line in text.to_string().lines() {
                if !help.contains(line.trim_end()) {
                    broken.push(format!("{path}: {line:?}"));
                }
            }
        }
        for s in c.get_subcommands() {
            if !s.is_hide_set() {
                walk(s, &format!("{path} {}", s.get_name()), broken);
            }
        }
    }
    let mut broken = Vec::new();
    walk(&command(), "sw-pool", &mut broken);
    assert!(broken.is_empty(), "footer lines wrapped: {broken:#?}");
}

/// Every argument of every (visible) subcommand has a help line (issue 32, point 8).
#[test]
fn every_argument_has_help() {
    fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for a in c.get_arguments() {
            let auto = matches!(
                a.get_action(),
                clap::ArgAction::Help
                    | clap::ArgAction::HelpShort
                    | clap::ArgAction::HelpLong
                    | clap::ArgAction::Version
            );
            if a.is_hide_set() || auto {
                continue;
            }
            if a.get_help().is_none() && a.get_long_help().is_none() {
                missing.push(format!("{path} {}", a.get_id()));
            }
        }
        for s in c.get_subcommands() {
            if !s.is_hide_set() {
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "sw-pool", &mut missing);
    assert!(missing.is_empty(), "arguments without help: {missing:#?}");
}

#[test]
fn paper_command_lines_parse() {
    let c = Cli::try_parse_from([
        "sw-pool",
        "build",
        "-s",
        "1020MB",
        "test-pool.ext2",
        "test-pool",
    ])
    .unwrap();
    match c.command {
        Command::Build(b) => {
            assert_eq!(b.size.as_deref(), Some("1020MB"));
            assert_eq!(b.out, PathBuf::from("test-pool.ext2"));
        }
        _ => panic!(),
    }
}

#[test]
fn multicall() {
    let a = multicall_args(vec![
        "/usr/bin/scalable-fs-cp".into(),
        "a".into(),
        "b".into(),
    ]);
    assert_eq!(
        a,
        vec![
            OsString::from("sw-pool"),
            "cp".into(),
            "a".into(),
            "b".into()
        ]
    );
    let a = multicall_args(vec!["sw-pool".into(), "build".into()]);
    assert_eq!(a.len(), 2);
}
