//! `run --layer` while the layer's owner swaps the layer's directory for a symlink to another of
//! their layers (rootless path: fuse-overlayfs, as uid 65534): every start either refuses the
//! symlink or runs over the layer it checked — never over the other one (a marker file in each
//! layer's upper tells which one a start saw) — and no start hangs. Also: a fuse-overlayfs that
//! never finishes mounting is given up on in bounded time, and `kill -9` of pid 1 or of the
//! launcher ends an environment whose fuse-overlayfs is stopped (SIGSTOP).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::env_fixture::*;
use common::*;

fn mark(f: &Fixture, layer: &str, what: &str) {
    let p = f.layers().join(layer).join("upper/layer-marker");
    std::fs::write(&p, what).unwrap();
    std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
}

/// Wait for `c` at most `t`; `None` when it still runs (then it is killed and reaped).
fn wait_bounded(c: &mut Child, t: Duration) -> Option<std::process::Output> {
    let t0 = Instant::now();
    loop {
        if c.try_wait().unwrap().is_some() {
            let mut out = std::process::Output {
                status: c.wait().unwrap(),
                stdout: Vec::new(),
                stderr: Vec::new(),
            };
            use std::io::Read;
            if let Some(mut s) = c.stdout.take() {
                let _ = s.read_to_end(&mut out.stdout);
            }
            if let Some(mut s) = c.stderr.take() {
                let _ = s.read_to_end(&mut out.stderr);
            }
            return Some(out);
        }
        if t0.elapsed() > t {
            let _ = c.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_layer_swapped_during_start_is_never_the_one_used() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    for l in ["a", "x"] {
        assert_eq!(f.run(&["layer", "create", l]).code, 0);
    }
    mark(&f, "a", "A");
    mark(&f, "x", "X");
    // `.swap` is a symlink to the other layer; the owner exchanges it with `a`, again and again
    let swap = f.layers().join(".swap");
    std::os::unix::fs::symlink("x", &swap).unwrap();
    std::os::unix::fs::lchown(&swap, Some(NOBODY), Some(NOBODY)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, dir) = (stop.clone(), swaps.clone(), f.layers());
        std::thread::spawn(move || {
            let d = rustix::fs::open(
                &dir,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(
                    &d,
                    "a",
                    &d,
                    ".swap",
                    rustix::fs::RenameFlags::EXCHANGE,
                )
                .unwrap();
                swaps.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (mut a, mut refused, mut other, mut hung) = (0, 0, Vec::new(), 0);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(12) {
        let mut c = f
            .cmd(&["run", "--layer", "a", "--", "cat", "/layer-marker"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        match wait_bounded(&mut c, Duration::from_secs(30)) {
            None => hung += 1,
            Some(o) if o.status.success() && o.stdout == b"A" => a += 1,
            Some(o) if o.status.success() => other.push(String::from_utf8_lossy(&o.stdout).into_owned()),
            Some(_) => refused += 1,
        }
        if hung > 0 {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);
    eprintln!(
        "{:.1} s, {swaps} swaps: {a} starts over the checked layer, {refused} refused, {} over another layer, {hung} hung",
        t0.elapsed().as_secs_f64(),
        other.len()
    );
    assert_eq!(hung, 0, "a start hung (killed after 30 s)");
    assert!(other.is_empty(), "starts ran over another layer: {other:?}");
    assert!(a > 0 && swaps > 1000, "the race ran: {a} starts, {swaps} swaps");
}
