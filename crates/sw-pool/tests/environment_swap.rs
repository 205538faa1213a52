//! `run --layer` while the layer's owner swaps the layer's directory for a symlink to another of
//! their layers (rootless path: fuse-overlayfs, as uid 65534): every start either refuses the
//! symlink or runs over the layer it checked — never over the other one (a marker file in each
//! layer's upper tells which one a start saw) — and no start hangs. Also: a fuse-overlayfs that
//! never finishes mounting is given up on in bounded time, and `kill -9` of pid 1 or of the
//! launcher ends an environment whose fuse-overlayfs is stopped (SIGSTOP).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::env_fixture::*;

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

/// The layer's owner at work: exchanges the layer `a` with `.swap` (a symlink to the other layer)
/// in `dir`, as fast as it can, until `stop`; counts the exchanges in `swaps`.
fn start_swapper(
    dir: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    swaps: Arc<AtomicU64>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let d = rustix::fs::open(
            &dir,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        while !stop.load(Ordering::Relaxed) {
            rustix::fs::renameat_with(&d, "a", &d, ".swap", rustix::fs::RenameFlags::EXCHANGE)
                .unwrap();
            swaps.fetch_add(1, Ordering::Relaxed);
        }
    })
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
    let swapper = start_swapper(f.layers(), stop.clone(), swaps.clone());
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
            Some(o) if o.status.success() => {
                other.push(String::from_utf8_lossy(&o.stdout).into_owned())
            }
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
    assert!(
        a > 0 && swaps > 1000,
        "the race ran: {a} starts, {swaps} swaps"
    );
}

/// A fuse-overlayfs that stops itself (SIGSTOP) before it mounts: the start gives up within its
/// bound (20 s) with a message naming it, and nothing of the environment is left.
#[test]
fn a_fuse_overlayfs_that_never_mounts_ends_the_start_in_bounded_time() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    assert_eq!(f.run(&["layer", "create", "s"]).code, 0);
    let bin = f.dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let real = ["/usr/bin/fuse-overlayfs", "/bin/fuse-overlayfs"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap();
    let w = bin.join("fuse-overlayfs");
    std::fs::write(
        &w,
        format!("#!/bin/sh\nkill -STOP $$\nexec {real} \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&w, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display());
    let t0 = Instant::now();
    let mut c = f
        .cmd(&["run", "--layer", "s", "--", "true"])
        .env("PATH", &path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let launcher = c.id() as i32;
    let o = wait_bounded(&mut c, Duration::from_secs(40));
    let took = t0.elapsed();
    let left = descendants_named(launcher, "fuse-overlayfs");
    let o = o.unwrap_or_else(|| panic!("the start still waits after 40 s (killed)"));
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("gave up after {:.1} s: {err}", took.as_secs_f64());
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("did not mount within 20 s"), "{err}");
    assert!(left.is_empty(), "fuse-overlayfs left: {left:?}");
    // and the layer is free again
    assert_eq!(f.run(&["run", "--layer", "s", "--", "true"]).code, 0);
}

/// Processes named `comm` anywhere on the machine whose parent chain reaches `ancestor`, or that
/// are orphans of it (re-parented): by the environment's pid namespace when it still exists.
fn descendants_named(ancestor: i32, comm: &str) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let named =
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm);
        if !named {
            continue;
        }
        let mut p = pid;
        for _ in 0..32 {
            if p == ancestor {
                v.push(pid);
                break;
            }
            match parent(p) {
                Some(q) if q > 1 => p = q,
                _ => break,
            }
        }
    }
    v
}

fn parent(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    after.split(' ').nth(1)?.parse().ok()
}

fn pidns(pid: i32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()
}

/// Processes in the PID namespace `ns`.
fn in_pidns(ns: &Path) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pidns(pid).as_deref() == Some(ns) {
            v.push(pid);
        }
    }
    v
}

/// An environment whose fuse-overlayfs is stopped (SIGSTOP) ends, daemon and all, when pid 1 or
/// the launcher is killed (`kill -9`).
#[test]
fn kill_9_ends_an_environment_whose_fuse_overlayfs_is_stopped() {
    if !ready() {
        return;
    }
    for victim in ["pid 1", "the launcher"] {
        let f = Fixture::new();
        assert_eq!(f.run(&["layer", "create", "k"]).code, 0);
        let mut c = f
            .cmd(&["run", "--layer", "k", "--", "sleep", "300"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let launcher = c.id() as i32;
        let t0 = Instant::now();
        let (daemon, init) = loop {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the environment did not start"
            );
            let d = descendants_named(launcher, "fuse-overlayfs");
            let s = descendants_named(launcher, "sleep");
            if let (Some(&d), Some(&s)) = (d.first(), s.first()) {
                break (d, parent(s).unwrap());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let ns = pidns(init).unwrap();
        assert_eq!(
            pidns(daemon).as_ref(),
            Some(&ns),
            "the daemon is in the environment"
        );
        // signals to processes this test started (by the pids it found under its child)
        let sig = |pid: i32, s: rustix::process::Signal| {
            rustix::process::kill_process(rustix::process::Pid::from_raw(pid).unwrap(), s).unwrap()
        };
        sig(daemon, rustix::process::Signal::Stop);
        let killed = Instant::now();
        let target = if victim == "pid 1" { init } else { launcher };
        sig(target, rustix::process::Signal::Kill);
        loop {
            let left = in_pidns(&ns);
            if left.is_empty() {
                break;
            }
            assert!(
                killed.elapsed() < Duration::from_secs(5),
                "5 s after kill -9 of {victim}, with fuse-overlayfs stopped: left {left:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            wait_bounded(&mut c, Duration::from_secs(5)).is_some(),
            "the launcher ended"
        );
        eprintln!(
            "kill -9 of {victim}: the environment and its stopped daemon gone in {:.2} s",
            killed.elapsed().as_secs_f64()
        );
    }
}

/// The kernel path (the site's helper through sudo, `environment_trees = ["/"]`): the same race,
/// no start over the other layer. The helper's configuration and a sudoers line for uid 65534
/// exist only in a mount namespace of the test's own (an overlay of `/etc`, a private `/run`).
#[test]
fn a_layer_swapped_during_a_kernel_path_start_is_never_the_one_used() {
    if !ready() {
        return;
    }
    let helper = common::bin().with_file_name("sw-pool-mount-helper");
    if !helper.is_file() || !Path::new("/usr/bin/sudo").exists() {
        common::skip("needs sudo and sw-pool-mount-helper built beside sw-pool (cargo build --release --workspace)");
        return;
    }
    let f = Fixture::new();
    for l in ["a", "x"] {
        assert_eq!(f.run(&["layer", "create", l]).code, 0);
    }
    mark(&f, "a", "A");
    mark(&f, "x", "X");
    let swap = f.layers().join(".swap");
    std::os::unix::fs::symlink("x", &swap).unwrap();
    std::os::unix::fs::lchown(&swap, Some(NOBODY), Some(NOBODY)).unwrap();
    // root's copy of the helper, where sudo's rule names it
    let h = f.dir.path().join("helper");
    std::fs::copy(&helper, &h).unwrap();
    std::fs::set_permissions(&h, std::fs::Permissions::from_mode(0o755)).unwrap();
    for d in ["u", "w"] {
        std::fs::create_dir(f.dir.path().join(d)).unwrap();
    }
    let script = r#"
set -eu
D=$1; H=$2; SW=$3
mount -t tmpfs -o mode=0755 swaprun /run
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$D/u,workdir=$D/w" /etc
mkdir -p /etc/sw-pool /etc/sudoers.d
printf 'environment_trees = ["/"]\n' > /etc/sw-pool/helper.toml
chmod 0644 /etc/sw-pool/helper.toml
printf 'nobody ALL=(root) NOPASSWD: %s\n' "$H" > /etc/sudoers.d/sw-pool-swap-test
chmod 0440 /etc/sudoers.d/sw-pool-swap-test
export SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_LAYER_DIR=$D/layers SW_POOL_STATE_DIR=$D/state HOME=/nonexistent SW_POOL_MOUNT_HELPER=$H
run() { timeout -k 1 30 setpriv --reuid=65534 --regid=65534 --clear-groups -- "$SW" "$@"; }
# the kernel path applies (no race yet)
run -v run --layer x -- cat /layer-marker 2>&1 | grep -q 'kernel overlay over idmapped lowers' || { echo "no kernel path"; exit 3; }
a=0; r=0; o=0; h=0; t0=$(date +%s)
while [ $(($(date +%s) - t0)) -lt 12 ]; do
  out=$(run run --layer a -- cat /layer-marker 2>/dev/null) && rc=0 || rc=$?
  if [ $rc = 124 ] || [ $rc = 137 ]; then h=$((h+1))
  elif [ $rc = 0 ] && [ "$out" = A ]; then a=$((a+1))
  elif [ $rc = 0 ]; then o=$((o+1))
  else r=$((r+1)); fi
done
echo "counts $a $r $o $h"
"#;
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let mut c = std::process::Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(f.dir.path())
        .arg(&h)
        .arg(common::bin())
        .current_dir("/")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the race starts once the first (unraced) start is through: give it a moment
    std::thread::sleep(Duration::from_millis(500));
    let swapper = start_swapper(f.layers(), stop.clone(), swaps.clone());
    let o = wait_bounded(&mut c, Duration::from_secs(120));
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let o = o.expect("the kernel-path race did not end within 120 s");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    let n: Vec<u64> = out
        .lines()
        .find_map(|l| l.strip_prefix("counts "))
        .unwrap_or_else(|| panic!("{out}\n{err}"))
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    let swaps = swaps.load(Ordering::Relaxed);
    eprintln!(
        "kernel path, {swaps} swaps: {} starts over the checked layer, {} refused, {} over another layer, {} hung",
        n[0], n[1], n[2], n[3]
    );
    assert_eq!(n[3], 0, "a start hung");
    assert_eq!(n[2], 0, "starts ran over another layer");
    assert!(n[0] > 0 && swaps > 1000, "the race ran");
}
