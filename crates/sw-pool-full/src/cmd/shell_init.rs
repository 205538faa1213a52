//! `sw-pool shell-init SHELL`: the shell function that makes `load`, `unload` and `env` change the
//! calling shell (as zoxide, direnv and conda do it); `shell-exec` is csh's half of it.
//!
//! The functions live in `etc/` (bash/zsh/ksh: the profile.d file `make install` puts in
//! /etc/profile.d; fish and csh: `etc/shell/`), embedded here so that the printed function and
//! the installed one are the same text. csh has no functions: its alias evaluates what
//! `sw-pool shell-exec csh ARGS` prints — the shell code of `load`, `unload` and `env`, and for every
//! other subcommand the command line that runs it unchanged. (Its file is the alias alone: csh's
//! `eval "`...`"` makes one line of its input, so a comment would swallow the alias.)

use std::ffi::OsString;

use swpool_core::{Error, ExitStatus};

use crate::cli::{InitShell, ShellExecArgs, ShellInitArgs};

const POSIX: &str = include_str!("../../../../etc/profile.d/sw-pool.sh");
const FISH: &str = include_str!("../../../../etc/shell/sw-pool.fish");
const CSH: &str = include_str!("../../../../etc/shell/sw-pool.csh");

pub fn init(a: ShellInitArgs) -> Result<(), Error> {
    let text = match a.shell {
        InitShell::Bash | InitShell::Zsh | InitShell::Ksh => POSIX,
        InitShell::Fish => FISH,
        InitShell::Csh | InitShell::Tcsh => CSH,
    };
    let login = match (&a.login_env, a.shell) {
        (None, _) => String::new(),
        (Some(name), InitShell::Bash | InitShell::Zsh | InitShell::Ksh) => login_env(name)?,
        (Some(_), shell) => {
            return Err(Error::other(
                ExitStatus::Usage,
                format!(
                    "--login-env is for bash, zsh and ksh, not {}: in fish or csh, start the \
                     environment from the start-up file yourself (`sw-pool shell --layer NAME`)",
                    format!("{shell:?}").to_lowercase()
                ),
            ))
        }
    };
    crate::output::out(format!("{text}{login}").as_bytes());
    Ok(())
}

/// The code `shell-init --login-env NAME` adds after the function: an interactive shell (a login:
/// ssh, `srun --pty`, `bash -l`) not already in an environment runs `sw-pool shell --layer NAME`
/// and ends with it. Every start of that layer's environment joins the running one, so all logins
/// share it. Nothing can lock the user out: the shell ends only when the file it made holds the
/// environment's shell's status (`shell --login FILE` writes it after its shell ran); else it
/// stays, with one line (sw-pool's own when it says why with status 125, else this code's).
pub fn login_env(name: &str) -> Result<String, Error> {
    if !swpool_env::layer::valid_name(name) {
        return Err(Error::other(
            ExitStatus::Usage,
            format!(
                "--login-env {name:?}: not a layer name (letters, digits, '.', '_' and '-', not \
                 starting with '.', at most 64 characters)"
            ),
        ));
    }
    Ok(format!(
        r#"# logins land in layer {name}'s environment (shell-init --login-env {name}); SW_POOL_NO_LOGIN_ENV=1 skips it
if [ -z "${{SW_POOL_ENVIRONMENT-}}" ] && [ -z "${{SW_POOL_NO_LOGIN_ENV-}}" ]; then
  case $- in
    *i*)
      if (unset -f sw-pool; command -v sw-pool) >/dev/null 2>&1 && __swp_f=$(mktemp "${{TMPDIR:-/tmp}}/sw-pool-login.XXXXXX" 2>/dev/null); then
        command sw-pool shell --login "$__swp_f" --layer '{name}'
        __swp_rc=$?
        if [ -s "$__swp_f" ]; then rm -f "$__swp_f"; exit "$__swp_rc"; fi
        rm -f "$__swp_f"
        [ "$__swp_rc" -eq 125 ] || echo "sw-pool: your logins go into layer {name}'s environment, but \`sw-pool shell --layer {name}\` ended (status $__swp_rc) before its shell ran: this is a plain shell; try that command to see why, or log in without it (SW_POOL_NO_LOGIN_ENV=1, or drop --login-env from your shell's start-up file)" >&2
      else
        echo "sw-pool: your logins go into layer {name}'s environment, but sw-pool is not on PATH (or mktemp failed): this is a plain shell; fix PATH, or drop --login-env from your shell's start-up file" >&2
      fi
      unset __swp_f __swp_rc ;;
  esac
fi
"#
    ))
}

/// The subcommands whose output is shell code for the calling shell.
pub const SHELL_CODE: &[&str] = &["load", "unload", "env"];

/// The subcommand in sw-pool's arguments (the first that is not an option), as the functions find
/// it; `None` for help, version and JSON output (never evaluated).
pub fn subcommand(args: &[OsString]) -> Option<String> {
    let mut it = args.iter().map(|a| a.to_string_lossy());
    let mut sub = None;
    while let Some(a) = it.next() {
        match a.as_ref() {
            "--log" => {
                it.next();
            }
            "-h" | "--help" | "-V" | "--version" | "--json" => return None,
            s if s.starts_with('-') => {}
            s => {
                if sub.is_none() {
                    sub = Some(s.to_string());
                }
            }
        }
    }
    sub
}

/// One argument quoted for csh: single quotes, `'` and `!` escaped; a newline cannot be quoted.
fn csh_quote(a: &str) -> Option<String> {
    if a.contains('\n') {
        return None;
    }
    Some(format!(
        "'{}'",
        a.replace('\'', r"'\''").replace('!', r"\!")
    ))
}

pub fn exec(a: ShellExecArgs) -> Result<(), Error> {
    use std::os::unix::process::CommandExt;
    if !matches!(a.shell.as_str(), "csh" | "tcsh") {
        return Err(Error::other(
            ExitStatus::Usage,
            format!("shell-exec is csh's alias's helper, not for {}", a.shell),
        ));
    }
    let me = std::env::current_exe().map_err(|e| {
        Error::other(
            ExitStatus::System,
            format!("cannot find our own executable: {e}"),
        )
    })?;
    let front = me.with_file_name("sw-pool");
    if subcommand(&a.args).is_some_and(|s| SHELL_CODE.contains(&s.as_str())) {
        // the shell code itself: this process becomes the command
        let e = std::process::Command::new(&front).args(&a.args).exec();
        return Err(Error::other(
            ExitStatus::System,
            format!("cannot run {}: {e}", front.display()),
        ));
    }
    // anything else: the command line, for the alias to run as it is
    let mut line = csh_quote(&front.to_string_lossy()).unwrap_or_default();
    for arg in &a.args {
        let q = csh_quote(&arg.to_string_lossy()).ok_or_else(|| {
            Error::other(
                ExitStatus::Usage,
                "an argument with a newline cannot be passed through csh's alias: run the sw-pool \
                 binary directly",
            )
        })?;
        line.push(' ');
        line.push_str(&q);
    }
    line.push('\n');
    crate::output::out(line.as_bytes());
    Ok(())
}

/// `load`, `unload` and `env` print shell code: on a terminal, with no shell function evaluating
/// it, nothing would change. Refuse before doing anything, and say what to run.
pub fn refuse_on_terminal(env: &swpool_core::config::Environment, json: bool) -> Result<(), Error> {
    use std::io::IsTerminal;
    // under a launcher (mpirun, srun) stdout is the launcher's forwarding, often a pseudo-terminal
    // (Open MPI's): the output goes back to whoever started the job (`eval "$(srun ... load)"`,
    // the paper's `mpirun sw-pool -v load`), so it is never refused there
    let launched = swpool_core::job::launched_by_launcher(env).unwrap_or(true)
        || env.get(swpool_core::config::HostVar::SlurmStepId).is_some();
    if json
        || launched
        || !std::io::stdout().is_terminal()
        || env
            .get(swpool_core::config::EnvVar::ShellFunction)
            .is_some()
    {
        return Ok(());
    }
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let typed = format!("sw-pool {}", args.join(" "));
    let shell = env
        .get(swpool_core::config::HostVar::Shell)
        .and_then(|s| s.rsplit('/').next().map(String::from))
        .filter(|s| matches!(s.as_str(), "bash" | "zsh" | "ksh" | "fish" | "csh" | "tcsh"))
        .unwrap_or_else(|| "bash".into());
    let (once, eval) = match shell.as_str() {
        "fish" => (
            "sw-pool shell-init fish | source".to_string(),
            format!("{typed} | source"),
        ),
        "csh" | "tcsh" => (
            format!("eval \"`sw-pool shell-init {shell}`\""),
            format!("eval \"`{typed}`\""),
        ),
        _ => (
            format!("eval \"$(sw-pool shell-init {shell})\""),
            format!("eval \"$({typed})\""),
        ),
    };
    Err(Error::other(
        ExitStatus::Usage,
        format!(
            "`{typed}` prints shell code for your shell to run, and its output is a terminal: \
             nothing would change in this shell, so nothing was done. Run `{eval}`, or set up the \
             shell function once (in your shell's start-up file) with `{once}`; then `{typed}` \
             works as typed"
        ),
    ))
}

/// Shells (by their process name) whose reading of `load`'s output is taken as evaluating it
/// (`eval "$(sw-pool load …)"`, the shell function's `$(…)`, fish's `(…)`, csh's backquotes).
const SHELLS: &[&str] = &[
    "bash", "sh", "dash", "ash", "zsh", "ksh", "ksh93", "mksh", "lksh", "pdksh", "yash", "posh",
    "fish", "csh", "tcsh", "busybox",
];

/// What this process's standard output goes to.
#[derive(Debug, PartialEq, Eq)]
pub enum Stdout {
    Terminal,
    /// A regular file or a device (`> log`, `> /dev/null`): `what` says which.
    File(String),
    /// A pipe the shell with this process id reads (and others may).
    Shell(u32),
    /// A pipe only these programs read (by name).
    Programs(Vec<String>),
    /// Anything else, or a pipe whose reader is not visible (a socket, another user's process).
    Unknown,
}

/// Where standard output goes, from `/proc` (the parent is looked at first: a shell's `$(…)`).
pub fn stdout_goes_to() -> Stdout {
    use std::io::IsTerminal;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if std::io::stdout().is_terminal() {
        return Stdout::Terminal;
    }
    let Ok(m) = std::fs::metadata("/proc/self/fd/1") else {
        return Stdout::Unknown;
    };
    let t = m.file_type();
    if t.is_file() {
        let path = std::fs::read_link("/proc/self/fd/1")
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "a file".into());
        return Stdout::File(format!("the file {path}"));
    }
    if t.is_char_device() || t.is_block_device() {
        let path = std::fs::read_link("/proc/self/fd/1")
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "a device".into());
        return Stdout::File(format!("the device {path}"));
    }
    if !t.is_fifo() {
        return Stdout::Unknown;
    }
    let pipe = format!("pipe:[{}]", m.ino());
    let me = std::process::id();
    let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32);
    let reads = |pid: u32| -> bool {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        rd.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == pipe.as_str())
                && std::fs::read_to_string(format!(
                    "/proc/{pid}/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .ok()
                .and_then(|info| {
                    info.lines()
                        .find_map(|l| l.strip_prefix("flags:"))
                        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                })
                .is_some_and(|flags| flags & 0o3 == 0) // O_ACCMODE, O_RDONLY
        })
    };
    // the program (a script run through its #! line has the script's name as its comm: a
    // Slurm batch script is `slurm_script`, run by bash), else the comm
    let comm = |pid: u32| {
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .ok()
            .and_then(|e| e.file_name().map(|n| n.to_string_lossy().into_owned()))
            .or_else(|| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .ok()
                    .map(|c| c.trim().to_string())
            })
            .unwrap_or_default()
    };
    if let Some(pp) = parent.filter(|&pp| reads(pp)) {
        if SHELLS.contains(&comm(pp).as_str()) {
            return Stdout::Shell(pp);
        }
    }
    let mut programs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || !reads(pid) {
            continue;
        }
        let name = comm(pid);
        if SHELLS.contains(&name.as_str()) {
            return Stdout::Shell(pid);
        }
        programs.push(name);
    }
    if programs.is_empty() {
        Stdout::Unknown
    } else {
        programs.sort();
        programs.dedup();
        Stdout::Programs(programs)
    }
}

/// Started by an MPI launcher or as a Slurm step's task: standard output is the launcher's
/// forwarding (the paper's `mpirun sw-pool -v load`, `eval "$(srun … load)"`).
fn launched(env: &swpool_core::config::Environment) -> bool {
    swpool_core::job::launched_by_launcher(env).unwrap_or(true)
        || env.get(swpool_core::config::HostVar::SlurmStepId).is_some()
}

/// The shell `load` and `unload` act for: the one that reads their output (the shell function's
/// `$(…)`, `eval "$(sw-pool load …)"`), when it is this process's parent. One reference per pool
/// per shell is taken by it.
pub fn calling_shell(env: &swpool_core::config::Environment, json: bool) -> Option<u32> {
    if json || launched(env) {
        return None;
    }
    match stdout_goes_to() {
        Stdout::Shell(pid) => rustix::process::getppid()
            .map(|p| p.as_raw_nonzero().get() as u32)
            .filter(|&pp| pp == pid),
        _ => None,
    }
}

/// `load` prints shell code: when nothing evaluates it (output to a file, a device, a pipe to a
/// program that is not a shell), the pool would be mounted and referenced with no shell knowing.
/// Refuse before doing anything, and say what to run. Not under a launcher (its forwarding), not
/// with `--json`, not from the shell function (it evaluates the output itself), not when the
/// caller named the shell (`explicit`: `--shell SHELL`; it takes the code itself).
pub fn refuse_unless_evaluated(
    env: &swpool_core::config::Environment,
    json: bool,
    explicit: bool,
) -> Result<(), Error> {
    refuse_on_terminal(env, json)?;
    if json
        || explicit
        || launched(env)
        || env
            .get(swpool_core::config::EnvVar::ShellFunction)
            .is_some()
    {
        return Ok(());
    }
    let goes_to = match stdout_goes_to() {
        Stdout::File(what) => what,
        Stdout::Programs(p) => format!("a pipe read by {}", p.join(", ")),
        Stdout::Terminal | Stdout::Shell(_) | Stdout::Unknown => return Ok(()),
    };
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let typed = format!("sw-pool {}", args.join(" "));
    Err(Error::other(
        ExitStatus::Usage,
        format!(
            "`{typed}` prints shell code for your shell to run, and its output goes to {goes_to}, \
             which does not run it: nothing was mounted. In a shell or a job script, run \
             `eval \"$({typed})\"` (or set up the shell function: `eval \"$(sw-pool shell-init bash)\"`, \
             then `{typed}`); for a report instead of shell code, add --json; to take the code \
             yourself, name its shell with --shell SHELL"
        ),
    ))
}
