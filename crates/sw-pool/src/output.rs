//! The output layer: user messages (stdout for results, stderr for notes and warnings) apart from
//! `tracing` logs (stderr, with host and pid on every line; `--log LEVEL` or `SW_POOL_LOG`).
//!
//! Everything the binary writes on stdout goes through [`out`] (the crate denies `print!` and
//! `println!`, which panic when the write fails): a reader that went away (`sw-pool list | head -1`,
//! EPIPE) ends the output, not the command, which finishes its work and exits with its own
//! status: a command with side effects (mount, unload, cleanup, a collective one whose ranks must
//! meet at the end) is never cut in the middle. Any other failed write (a full disk) is reported
//! once, at the end, as status 6 ([`stdout_status`]).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::cli::GlobalArgs;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verbosity {
    Quiet,
    Normal,
    Verbose,
}

#[derive(Debug, Clone, Copy)]
pub struct Printer {
    pub verbosity: Verbosity,
    pub json: bool,
    /// Stdout carries something else (`mount --print-mountpoint`): no result or detail lines
    /// there; warnings still go to stderr.
    pub stdout_taken: bool,
}

impl Printer {
    pub fn new(g: &GlobalArgs, json: bool) -> Printer {
        let verbosity = if g.quiet {
            Verbosity::Quiet
        } else if g.verbose > 0 {
            Verbosity::Verbose
        } else {
            Verbosity::Normal
        };
        Printer {
            verbosity,
            json,
            stdout_taken: false,
        }
    }

    /// A result line (stdout), unless quiet, JSON or stdout is taken.
    pub fn result(&self, line: impl AsRef<str>) {
        if self.verbosity > Verbosity::Quiet && !self.json && !self.stdout_taken {
            outln(line.as_ref());
        }
    }

    /// Detail shown with `-v` (stdout, as the paper's timing lines).
    pub fn verbose(&self, line: impl AsRef<str>) {
        if self.verbosity >= Verbosity::Verbose && !self.json && !self.stdout_taken {
            outln(line.as_ref());
        }
    }

    /// A warning (stderr), shown unless quiet.
    pub fn warn(&self, line: impl AsRef<str>) {
        if self.verbosity > Verbosity::Quiet {
            eprintln!("sw-pool: warning: {}", line.as_ref());
        }
    }

    /// A JSON document (stdout), when `--json` was given.
    pub fn json(&self, v: &serde_json::Value) {
        if self.json {
            json(v);
        }
    }
}

/// Set by the first failed write to stdout: the rest of the output is dropped.
static STDOUT_FAILED: AtomicBool = AtomicBool::new(false);
/// The first failed write's error, unless the reader had gone away (reported by [`stdout_status`]).
static STDOUT_ERROR: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// Write `bytes` on stdout in one write(2) and flush (see [`eline`]). A failed write never panics
/// and drops the rest of the output (see the module's documentation).
pub fn out(bytes: &[u8]) {
    use std::io::Write as _;
    if STDOUT_FAILED.load(Ordering::Relaxed) {
        return;
    }
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_all(bytes).and_then(|()| o.flush()) {
        STDOUT_FAILED.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            let mut first = STDOUT_ERROR.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert(e);
        }
    }
}

/// One line on stdout (see [`out`]).
pub fn outln(line: &str) {
    out(format!("{line}\n").as_bytes());
}

/// A JSON document on stdout (see [`out`]).
pub fn json(v: &serde_json::Value) {
    outln(&serde_json::to_string_pretty(v).expect("a JSON value serialises"));
}

/// At the end of a command that succeeded: a failed write to stdout, other than to a reader that
/// went away, is the system's refusal (status 6, the caller says so), as for any other file.
pub fn stdout_status() -> Result<(), std::io::Error> {
    let first = STDOUT_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    match first {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

pub fn init_logging(g: &GlobalArgs, env: &swpool_node::config::Environment) {
    use tracing_subscriber::EnvFilter;
    let filter = match &g.log {
        Some(l) => EnvFilter::new(l),
        None => env
            .get(swpool_node::config::EnvVar::Log)
            .and_then(|v| EnvFilter::try_new(v).ok())
            .unwrap_or_else(|| EnvFilter::new("warn")),
    };
    let host = swpool_node::users::hostname();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
    // every log line carries the host and pid (and, under MPI, the rank)
    let span = tracing::info_span!("sw-pool", host = %host, pid = std::process::id());
    std::mem::forget(span.entered());
}

pub fn print_error(e: &dyn std::fmt::Display) {
    // one write(2) for the whole line: stderr is unbuffered, and `eprintln!` writes the pieces of
    // its format separately, so the lines of several ranks under one launcher could interleave
    use std::io::Write;
    let line = format!("sw-pool: error: {e}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// One message line on stderr in a single write(2): under mpirun, stdout and stderr are forwarded
/// separately, and a line written in pieces (as `eprintln!` does) can be split by the shell code on
/// stdout.
#[macro_export]
macro_rules! eline {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let line = format!("{}\n", format_args!($($t)*));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

/// Print shell code on stdout in one write (see [`out`]).
pub fn shell_code(code: &str) {
    out(code.as_bytes());
}

/// A progress bar on stderr, when it is a terminal and nothing asked for none (world rank 0 only).
/// It stays hidden until it is given a length ([`reveal`]): a load that finds its pool cached moves
/// nothing and draws no `0 B/0 B` bar.
pub fn progress(show: bool) -> Option<indicatif::ProgressBar> {
    if !show || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::hidden());
    b.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta}",
        )
        .expect("template"),
    );
    Some(b)
}

/// Give a bar from [`progress`] its length, drawing it from the first non-empty one on: at once,
/// so that a copy that ends before the next position or tick still shows what it moved.
fn reveal(b: &indicatif::ProgressBar, total: u64) {
    if b.length() != Some(total) {
        b.set_length(total);
        if total > 0 && b.is_hidden() {
            b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            b.tick();
            b.enable_steady_tick(std::time::Duration::from_millis(200));
        }
    }
}

/// A spinner with elapsed time on stderr for work whose size is not known (an image tool that runs
/// quiet), when stderr is a terminal and `show`; cleared when dropped.
pub fn spinner(show: bool, msg: String) -> Option<indicatif::ProgressBar> {
    if !show || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new_spinner();
    b.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
            .expect("template"),
    );
    b.set_message(msg);
    b.tick(); // drawn at once: what runs is named even when it ends before the first tick
    b.enable_steady_tick(std::time::Duration::from_millis(200));
    Some(b)
}

/// A pass over a pool's image (verify, sign): a byte bar on stderr, labelled `what`, when it is a
/// terminal and `show`; `progress` is its callback for [`swpool_format::pool::chunks::Progress`].
pub struct PassBar {
    bar: Option<indicatif::ProgressBar>,
}

impl PassBar {
    pub fn new(show: bool, what: &str) -> PassBar {
        let bar = progress(show);
        if let Some(b) = &bar {
            b.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{what} {{wide_bar}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} ETA {{eta}}"
                ))
                .expect("template"),
            );
        }
        PassBar { bar }
    }

    /// Add `done` bytes of `total`.
    pub fn step(&self, done: u64, total: u64) {
        if let Some(b) = &self.bar {
            // counted before the bar is revealed, so that its first frame shows the work done
            b.inc(done);
            reveal(b, total);
        }
    }

    /// Remove the bar before the result is printed.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

/// The broadcast's progress callback driving `bar`.
/// (`swpool_core::transfer::ProgressSink`: this library does not link swpool-core)
pub fn progress_sink(
    bar: &indicatif::ProgressBar,
) -> std::sync::Arc<dyn Fn(u64, u64) + Send + Sync> {
    let b = bar.clone();
    std::sync::Arc::new(move |done: u64, total: u64| {
        b.set_position(done);
        reveal(&b, total);
    })
}
