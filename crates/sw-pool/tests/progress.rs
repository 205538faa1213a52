//! Issue 32, point 7: progress where work is long, on a terminal only. Each command runs twice:
//! under a pseudo-terminal (`script`, util-linux) it draws its bar or spinner on stderr; with
//! stderr a pipe it draws nothing. A pool found in the cache draws no empty `0 B/0 B` bar.

mod common;
use common::mount_fixture::*;
use common::*;

use std::path::Path;
use std::process::Command;

/// Run `sw-pool ARGS` with stdout and stderr on a pseudo-terminal; returns what the terminal got.
fn on_terminal(t: &T, args: &[&str], env: &[(&str, &str)]) -> Out {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let line = std::iter::once(bin().to_string_lossy().into_owned())
        .chain(args.iter().map(|a| a.to_string()))
        .map(|a| quote(&a))
        .collect::<Vec<_>>()
        .join(" ");
    let mut c = Command::new("script");
    // the fixture's environment (state and cache directories), as `t.sw()` sets it
    c.env("SW_POOL_STATE_DIR", t.state())
        .env("SW_POOL_CACHE", t.d.path())
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env_remove("SLURM_JOB_ID")
        .env("COLUMNS", "120");
    for (k, v) in env {
        c.env(k, v);
    }
    run(c.args(["-qec", &line, "/dev/null"]))
}

/// A pool of 48 MiB of incompressible data (hashing it takes long enough for a bar to be drawn).
fn big_pool(t: &T) -> String {
    let tree = big_tree(t);
    let out = t.s("big.sqfs");
    let o = sw_run(&[
        "build",
        "-q",
        "--name",
        "big",
        "--version",
        "1.0",
        &out,
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    out
}

/// A tree of 48 MiB of incompressible data.
fn big_tree(t: &T) -> std::path::PathBuf {
    let tree = t.p("tree");
    let bin_dir = tree.join("install/big/1.0/bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let data: Vec<u8> = (0..48 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(bin_dir.join("blob"), data).unwrap();
    tree
}

fn keys(t: &T) -> (String, String) {
    let base = t.s("k");
    let o = sw_run(&["keygen", "-q", "--out", &base]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    (format!("{base}.pem"), format!("{base}.pub.pem"))
}

#[test]
fn sign_and_verify_draw_a_bar_on_a_terminal_only() {
    let t = T::new();
    let pool = big_pool(&t);
    let (private, public) = keys(&t);
    let o = on_terminal(&t, &["sign", "--key", &private, &pool], &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(o.stdout.contains("checking"), "{}", o.stdout);
    assert!(o.stdout.contains("MiB/48."), "{}", o.stdout);
    let o = on_terminal(&t, &["verify", "--key", &public, &pool], &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(o.stdout.contains("verifying"), "{}", o.stdout);
    // not a terminal: the result only
    let o = sw_run(&["verify", "--key", &public, &pool]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.is_empty(), "{}", o.stderr);
    assert!(!o.stdout.contains("verifying"), "{}", o.stdout);
    // --quiet and --json: nothing either
    let o = on_terminal(&t, &["verify", "--json", "--key", &public, &pool], &[]);
    assert!(!o.stdout.contains("verifying"), "{}", o.stdout);
}

#[test]
fn build_and_bundle_show_a_spinner_on_a_terminal_only() {
    let t = T::new();
    let tree = t.p("tree");
    std::fs::create_dir_all(tree.join("install/a/1/bin")).unwrap();
    std::fs::write(tree.join("install/a/1/bin/a"), b"#!/bin/sh\n").unwrap();
    let args = [
        "build",
        "--name",
        "a",
        "--version",
        "1",
        &t.s("a.sqfs"),
        tree.to_str().unwrap(),
    ];
    let o = on_terminal(&t, &args, &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    let spinner = format!("building {}", t.s("a.sqfs"));
    assert!(o.stdout.contains(&spinner), "{:?}", o.stdout);
    let o = sw_run(&[&args[..], &["--force"]].concat());
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains(&spinner), "{}", o.stderr);
    let out = t.s("true.sqfs");
    let o = on_terminal(&t, &["bundle", "-o", &out, "/bin/true"], &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(o.stdout.contains("bundling into"), "{}", o.stdout);
}

/// Issue 52, point 9: `build` of a large tree shows how far mksquashfs has read the tree's bytes,
/// as a percentage with an ETA (not only a spinner); with stderr not a terminal, nothing.
#[test]
fn build_of_a_large_tree_shows_a_percentage_and_an_eta() {
    let t = T::new();
    let tree = big_tree(&t);
    let out = t.s("big.sqfs");
    let args = [
        "build",
        "--name",
        "big",
        "--version",
        "1.0",
        &out,
        tree.to_str().unwrap(),
    ];
    let o = on_terminal(&t, &args, &[]);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(
        o.stdout.contains("MiB/48.00 MiB") && o.stdout.contains("% ") && o.stdout.contains("ETA"),
        "no percentage, bytes of the tree's 48 MiB and ETA on the terminal: {:?}",
        o.stdout
    );
    let o = sw_run(&[&args[..], &["--force"]].concat());
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains("ETA"), "{}", o.stderr);
}

/// Issue 32 (point 1's `0 B/0 B`): a load that finds the pool cached and mounted moves nothing
/// and draws no empty bar; the first load of a pool draws the copy's bar.
#[test]
fn a_cached_load_draws_no_empty_bar() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let pool = big_pool(&t);
    let mp = t.mkdir("mnt");
    let function = [("SW_POOL_SHELL_FUNCTION", "1")];
    let o = on_terminal(&t, &["load", "-m", &mp, &pool], &function);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(o.stdout.contains("MiB/48."), "{}", o.stdout);
    let o = on_terminal(&t, &["load", "-m", &mp, &pool], &function);
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(!o.stdout.contains("0 B/0 B"), "{}", o.stdout);
    for _ in 0..2 {
        t.ok(&["umount", &mp]);
    }
    t.assert_clean();
    assert!(Path::new(&pool).exists());
}
