//! `sw-pool --help` as users see it: the subcommands listed by what they are for.

use std::ffi::OsString;

use super::Cli;

/// The subcommands by what they are for, as `sw-pool --help` lists them (clap lists all in one
/// block); every visible subcommand is in exactly one group (a test checks).
pub const GROUPS: &[(&str, &[&str])] = &[
    (
        "Build and publish pools",
        &[
            "init",
            "modulefiles",
            "bundle",
            "build",
            "inspect",
            "keygen",
            "sign",
            "verify",
        ],
    ),
    (
        "Use pools",
        &[
            "avail",
            "load",
            "unload",
            "mount",
            "umount",
            "env",
            "shadow",
            "list",
            "shell-init",
        ],
    ),
    ("Isolated environments", &["run", "shell", "layer"]),
    ("Data sets", &["image"]),
    ("Across the nodes of a job", &["cp", "slurm"]),
    ("Upkeep", &["cache", "cleanup", "config", "generate"]),
];

/// The command line as users see it: [`Cli`] with its subcommands listed by [`GROUPS`].
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let c = Cli::command();
    let mut listing = String::new();
    for (title, names) in GROUPS {
        listing.push_str(&format!("{title}:\n"));
        for name in *names {
            let about = c
                .find_subcommand(name)
                .and_then(|s| s.get_about())
                .map(|a| a.to_string())
                .unwrap_or_default();
            listing.push_str(&format!("  {name:<12} {}\n", wrapped(&about)));
        }
        listing.push('\n');
    }
    c.help_template(format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{listing}\
         Options:\n{{options}}{{after-help}}"
    ))
}

/// `about` wrapped at words to fit an 80-column listing, continuation lines indented under the
/// first (as clap lists subcommands).
fn wrapped(about: &str) -> String {
    const WIDTH: usize = 80 - 15;
    let mut lines = vec![String::new()];
    for w in about.split_whitespace() {
        let line = lines.last_mut().expect("one line");
        if !line.is_empty() && line.chars().count() + 1 + w.chars().count() > WIDTH {
            lines.push(w.to_string());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(w);
        }
    }
    lines.join(&format!("\n{:15}", ""))
}

/// Parse `args` against [`command`] (exits with clap's message and status 2 on a bad command line).
pub fn parse_from<I, T>(args: I) -> Cli
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    use clap::FromArgMatches;
    let m = command().get_matches_from(args);
    Cli::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
}

/// The paper's stand-alone tools are this binary under another name.
pub fn multicall_args(mut args: Vec<OsString>) -> Vec<OsString> {
    let argv0 = args.first().map(|a| {
        std::path::Path::new(a)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let sub: &[&str] = match argv0.as_deref() {
        Some("scalable-fs-cp") => &["cp"],
        Some("scalable-fs-mount") => &["mount"],
        // Slurm runs Prolog=/TaskProlog=/Epilog= programs without arguments
        Some("sw-pool-prolog" | "prolog") => &["slurm", "prolog"],
        Some("sw-pool-task-prolog" | "task-prolog") => &["slurm", "task-prolog"],
        Some("sw-pool-epilog" | "epilog") => &["slurm", "epilog"],
        _ => return args,
    };
    args[0] = OsString::from("sw-pool");
    for (i, a) in sub.iter().enumerate() {
        args.insert(1 + i, OsString::from(a));
    }
    args
}
