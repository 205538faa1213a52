//! Table-driven tests of the real binary: a [`Case`] is one run of `sw-pool` (set up an input, run,
//! check the exit status and the message, check that nothing is left mounted or recorded), and
//! [`each_case`] runs a whole table, going on after a failing case and naming every one that
//! failed at the end.

use super::mount_fixture::T;
use super::*;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;

/// How a case runs the binary.
#[derive(Clone, Copy, Debug)]
pub enum Via {
    /// `T::sw`: no config files, no inherited `SW_POOL_*`, the scratch state directory and cache
    Sw,
    /// the binary under another name (a symbolic link of that name in the scratch directory, made
    /// on first use), with the test's own environment: the multi-call names Slurm and the paper
    /// run
    Link(&'static str),
}

/// The exit status a case expects.
#[derive(Clone, Copy, Debug)]
pub enum Status {
    Is(i32),
    /// any failure (not 0)
    Failure,
}

/// What a case expects on stdout.
#[derive(Clone, Copy, Debug)]
pub enum Stdout {
    Any,
    Empty,
    StartsWith(&'static str),
    Contains(&'static str),
}

/// One run of the binary and what it must give. In `args` and in the values of `env`, `{input}`
/// is what `setup` returned and `{NAME}` a variable of the table (see [`Ctx`]).
pub struct Case {
    pub name: &'static str,
    /// makes the case's input in the scratch directory (a damaged image, a file where a
    /// directory belongs, ...) and returns it as `{input}`
    pub setup: fn(&Ctx) -> String,
    pub via: Via,
    pub args: &'static [&'static str],
    /// set (`Some`) or removed (`None`) for this run only
    pub env: &'static [(&'static str, Option<&'static str>)],
    pub expect_status: Status,
    pub expect_stdout: Stdout,
    /// every one of these is in stderr
    pub expect_stderr_contains: &'static [&'static str],
}

/// A setup that makes nothing.
pub fn no_input(_: &Ctx) -> String {
    String::new()
}

/// What a table's cases share: the scratch directory (`{dir}`, and `{state}` its state directory)
/// and the paths the test names (`{img}`, `{mp}`, ...).
pub struct Ctx<'a> {
    pub t: &'a T,
    vars: Vec<(String, String)>,
}

impl<'a> Ctx<'a> {
    pub fn new(t: &'a T, vars: &[(&str, &str)]) -> Ctx<'a> {
        let mut v: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        v.push(("dir".into(), t.d.path().to_string_lossy().into_owned()));
        v.push(("state".into(), t.state().to_string_lossy().into_owned()));
        Ctx { t, vars: v }
    }
    pub fn var(&self, name: &str) -> &str {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no table variable {{{name}}}"))
    }
    fn expand(&self, s: &str, input: &str) -> String {
        let mut s = s.replace("{input}", input);
        for (k, v) in &self.vars {
            s = s.replace(&format!("{{{k}}}"), v);
        }
        assert!(
            !s.contains('{'),
            "unknown variable in {s:?} (have {:?} and input)",
            self.vars.iter().map(|(k, _)| k).collect::<Vec<_>>()
        );
        s
    }
}

impl Case {
    /// Sets up, runs and returns the output (no checks).
    pub fn run(&self, ctx: &Ctx) -> Out {
        let input = (self.setup)(ctx);
        let mut c = match self.via {
            Via::Sw => ctx.t.sw(),
            Via::Link(name) => {
                let link = ctx.t.p(name);
                if std::fs::symlink_metadata(&link).is_err() {
                    std::os::unix::fs::symlink(bin(), &link).unwrap();
                }
                Command::new(link)
            }
        };
        c.args(self.args.iter().map(|a| ctx.expand(a, &input)));
        for (k, v) in self.env {
            match v {
                Some(v) => c.env(k, ctx.expand(v, &input)),
                None => c.env_remove(k),
            };
        }
        run(&mut c)
    }

    /// Runs the case and checks everything it expects, then that nothing is left mounted or
    /// recorded under the scratch directory; one panic lists every expectation that was missed.
    pub fn check(&self, ctx: &Ctx) {
        let o = self.run(ctx);
        let mut missed = Vec::new();
        match self.expect_status {
            Status::Is(want) if o.code != want => {
                missed.push(format!("exit status {}, expected {want}", o.code))
            }
            Status::Failure if o.code == 0 => {
                missed.push("exit status 0, expected a failure".to_string())
            }
            _ => {}
        }
        let stdout_ok = match self.expect_stdout {
            Stdout::Any => true,
            Stdout::Empty => o.stdout.is_empty(),
            Stdout::StartsWith(s) => o.stdout.starts_with(s),
            Stdout::Contains(s) => o.stdout.contains(s),
        };
        if !stdout_ok {
            missed.push(format!("stdout is not {:?}", self.expect_stdout));
        }
        for s in self.expect_stderr_contains {
            if !o.stderr.contains(s) {
                missed.push(format!("stderr lacks {s:?}"));
            }
        }
        assert!(
            missed.is_empty(),
            "{}\n--- stdout:\n{}--- stderr:\n{}",
            missed.join("; "),
            o.stdout,
            o.stderr
        );
        ctx.t.assert_clean();
    }
}

/// Runs a table of [`Case`]s (see [`each_case`]).
pub fn run_cases(ctx: &Ctx, cases: &[Case]) {
    each_case(cases, |c| c.name.to_string(), |c| c.check(ctx));
}

/// Runs `check` on every case, even after one failed, and panics at the end with the name and
/// the message of every case that failed.
pub fn each_case<C>(cases: &[C], name: impl Fn(&C) -> String, check: impl Fn(&C)) {
    let mut failed = Vec::new();
    for c in cases {
        // (captured by the test harness: shown with the panic of a failing case)
        eprintln!("--- case [{}]", name(c));
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| check(c))) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(no message)".to_string());
            failed.push(format!("[{}] {msg}", name(c)));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} cases failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

/// Panics unless `text` contains every one of `wanted`, naming each one that is missing; the
/// message shows `text` and then `also` (the other stream, or "").
pub fn assert_contains_all(text: &str, wanted: &[&str], also: &str) {
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|w| !text.contains(w))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} in:\n{text}{also}");
}
