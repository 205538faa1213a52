//! A closed standard output (`sw-pool config | head -1`) ends the output quietly: no panic, no
//! exit status outside the documented table (README, "Exit status").

mod common;

use std::process::{Command, Stdio};

use common::*;

/// Each command several times: the reader closes its end right after the start, before (almost
/// always) the first write, which then fails with EPIPE (Rust ignores SIGPIPE).
const RUNS: usize = 8;

fn closed_stdout(c: &mut Command) -> (i32, String) {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sw-pool");
    drop(child.stdout.take()); // the reader goes away
    let o = child.wait_with_output().expect("wait for sw-pool");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn closed_stdout_ends_quietly() {
    let d = scratch();
    let state = d.path().join("state");
    let cache = d.path().join("cache");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    let cache_arg = cache.to_str().unwrap();
    let cases: [&[&str]; 6] = [
        &["config"],
        &["config", "--json"],
        &["list"],
        &["cache", "--cache-dir", cache_arg, "list"],
        &["--help"],
        &["generate", "completions", "bash"],
    ];
    for args in cases {
        for _ in 0..RUNS {
            let (code, stderr) = closed_stdout(sw().env("SW_POOL_STATE_DIR", &state).args(args));
            assert!(
                !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
                "sw-pool {args:?} with a closed stdout: {stderr}"
            );
            assert_eq!(
                code, 0,
                "sw-pool {args:?} with a closed stdout exited {code}: {stderr}"
            );
            assert!(
                stderr.is_empty(),
                "sw-pool {args:?} with a closed stdout is not quiet: {stderr}"
            );
        }
    }
}

/// Standard output that fails for another reason than a gone reader (a full disk) is an error of
/// the system's, status 6, said once.
#[test]
fn full_stdout_is_a_system_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        skip("no /dev/full");
        return;
    };
    let o = sw()
        .arg("config")
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(6), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        stderr.matches("standard output").count(),
        1,
        "one message naming standard output: {stderr}"
    );
}
