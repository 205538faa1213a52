//! `sw-pool run --cache DIR`: a directory tree on storage shown read-once over itself inside the
//! environment (real FUSE, as uid 65534): an unmodified program and Python importing a package
//! from the tree; every lookup answered from the listing made at the start; each file read from
//! storage once; a snapshot (a file changed after the start is not served, a file read before
//! the tree went away still is); read-only; nothing left when the environment ends.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::env_fixture::*;

fn chown_r(p: &Path) {
    std::os::unix::fs::lchown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    if p.is_dir() && !p.is_symlink() {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            chown_r(&e.path());
        }
    }
}

/// A prefix like an application's or a venv's: bin/ls (a real ELF), a Python package, data.
fn tree(t: &Path) {
    for d in ["bin", "lib/pkg", "share"] {
        std::fs::create_dir_all(t.join(d)).unwrap();
    }
    std::fs::copy("/bin/ls", t.join("bin/ls")).unwrap();
    std::fs::write(t.join("lib/pkg/__init__.py"), "from .core import VALUE\n").unwrap();
    std::fs::write(t.join("lib/pkg/core.py"), "VALUE = 'from the view'\n").unwrap();
    std::fs::write(t.join("share/never-read.txt"), "x\n").unwrap();
    std::fs::write(t.join("share/changed.txt"), "old\n").unwrap();
    std::os::unix::fs::symlink("pkg", t.join("lib/pkg-link")).unwrap();
    chown_r(t);
}

fn views_running(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains("sw-pool-view") && c.contains(needle) {
                out.push(c);
            }
        }
    }
    out
}

/// The test user's tree on "storage": `<fixture>/project/env` ([`tree`]).
fn project(f: &Fixture) -> std::path::PathBuf {
    std::fs::set_permissions(f.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = f.dir.path().join("project/env");
    tree(&t);
    std::os::unix::fs::chown(f.dir.path().join("project"), Some(NOBODY), Some(NOBODY)).unwrap();
    t
}

/// A node-local cache base of the test user's (`$SW_POOL_CACHE`), in the fixture.
fn cache_base(f: &Fixture) -> std::path::PathBuf {
    let c = f.dir.path().join("cache");
    if !c.exists() {
        std::fs::create_dir(&c).unwrap();
        std::os::unix::fs::chown(&c, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    c
}

#[test]
fn a_next_run_reads_from_storage_only_what_changed() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let t = project(&f);
    let ts = t.display().to_string();
    let base = cache_base(&f);
    let run = |script: &str| {
        let mut c = f.cmd(&["run", "--cache", &ts, "--", "sh", "-c", script]);
        c.env("SW_POOL_CACHE", &base);
        let o = c.output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let read =
        format!("cat {ts}/lib/pkg/core.py; cat {ts}/share/changed.txt; {ts}/bin/ls {ts}/lib/pkg");
    let (code, out, err) = run(&read);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out, "VALUE = 'from the view'\nold\n__init__.py\ncore.py\n",
        "{err}"
    );
    // the files it read are kept in the user's private warm start, one directory per tree
    let views = base.join("sw-pool-65534/views");
    let dirs: Vec<_> = std::fs::read_dir(&views).unwrap().flatten().collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let warm = dirs[0].path();
    let mode = std::fs::metadata(&warm).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{}", warm.display());
    // (ls, larger than a piece of the view, is kept by the pieces the loader touched)
    let ls_pieces = std::fs::metadata(t.join("bin/ls"))
        .unwrap()
        .len()
        .div_ceil(swpool_serve::view::PIECE) as usize;
    let kept = std::fs::read_dir(&warm).unwrap().count();
    assert!(
        (3..=2 + ls_pieces).contains(&kept),
        "core.py, changed.txt and ls's pieces: {kept} entries"
    );
    // between the jobs: one file changed (size and mtime); another rewritten behind the view's
    // back with its size and mtime kept, which only a copy kept on the node can still show as
    // it was (the rule the warm start shares with make and rsync: same size, same mtime to the
    // nanosecond, same file)
    std::fs::write(t.join("share/changed.txt"), "new, longer\n").unwrap();
    let core = t.join("lib/pkg/core.py");
    let mtime = std::fs::metadata(&core).unwrap().modified().unwrap();
    std::fs::write(&core, "VALUE = 'from storage!'\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&core)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    // the next job: what did not change comes from the node's warm start, what changed is read
    // again from storage
    let (code, out, err) = run(&read);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(
        out, "VALUE = 'from the view'\nnew, longer\n__init__.py\ncore.py\n",
        "{err}"
    );
    // a damaged entry is never served: the file is read from storage again
    for e in std::fs::read_dir(&warm).unwrap().flatten() {
        let mut b = std::fs::read(e.path()).unwrap();
        if b.ends_with(b"VALUE = 'from the view'\n") {
            let n = b.len();
            b[n - 3] ^= 1;
            std::fs::write(e.path(), b).unwrap();
        }
    }
    let (code, out, err) = run(&format!("cat {ts}/lib/pkg/core.py"));
    assert_eq!(
        (code, out.as_str()),
        (Some(0), "VALUE = 'from storage!'\n"),
        "{err}"
    );
    assert!(views_running(&ts).is_empty(), "{:?}", views_running(&ts));
}

#[test]
fn a_tree_is_read_once_as_a_snapshot_and_still_served_when_storage_goes() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let t = project(&f);
    let sync = f.dir.path().join("sync");
    std::fs::create_dir(&sync).unwrap();
    std::os::unix::fs::chown(&sync, Some(NOBODY), Some(NOBODY)).unwrap();
    let (ts, ss) = (t.display().to_string(), sync.display().to_string());
    // phase 1 reads the program and the package; then the test changes storage from outside;
    // phase 2 runs them again, and tries what was never read or changed since the start
    let script = format!(
        r#"set -u
T={ts}; S={ss}
$T/bin/ls $T/lib/pkg
PYTHONPATH=$T/lib python3 -c 'import pkg; print(pkg.VALUE)'
ls $T/lib/nope 2>/dev/null || echo "no nope"
touch $T/new 2>/dev/null || echo "read-only"
grep -q " $T fuse" /proc/mounts && echo "mounted over itself"
V=; for p in /proc/[0-9]*; do grep -qx sw-pool-view $p/comm 2>/dev/null && V=${{p#/proc/}}; done
grep CapEff /proc/$V/status
touch $S/ready
i=0; while [ ! -e $S/go ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done
echo phase2
$T/bin/ls $T/lib/pkg
PYTHONPATH=$T/lib python3 -c 'import pkg; print(pkg.VALUE)'
ls $T/added 2>/dev/null || echo "no added"
cat $T/share/never-read.txt || echo "never-read failed"
cat $T/share/changed.txt || echo "changed failed"
cat $T/lib/pkg-link/core.py
kill -9 $V; sleep 0.3
cat $T/lib/pkg/core.py 2>&1 | grep -q "not connected" && echo "server killed: clean failure"
"#
    );
    let mut c = f.cmd(&["run", "--cache", &ts, "--", "sh", "-c", &script]);
    c.env("SW_POOL_CACHE", cache_base(&f));
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sync.join("ready").exists() {
        let ended = child.try_wait().unwrap().is_some();
        if ended || t0.elapsed() > Duration::from_secs(30) {
            if !ended {
                let _ = child.kill();
            }
            let o = child.wait_with_output().unwrap();
            panic!(
                "phase 1 did not end ({}):\n--- stdout\n{}--- stderr\n{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // storage changes under the running job: a file changed, a file added, the rest made
    // unreadable to the job's user (the files it read stay served from the node-local copy)
    std::fs::write(t.join("share/changed.txt"), "new, longer\n").unwrap();
    std::fs::write(t.join("added"), "x").unwrap();
    for p in [
        "bin/ls",
        "lib/pkg/__init__.py",
        "lib/pkg/core.py",
        "share/never-read.txt",
    ] {
        std::fs::set_permissions(t.join(p), std::fs::Permissions::from_mode(0o0)).unwrap();
    }
    std::fs::set_permissions(t.join("lib/pkg"), std::fs::Permissions::from_mode(0o0)).unwrap();
    std::fs::write(sync.join("go"), "").unwrap();
    let t1 = Instant::now();
    let o = child.wait_with_output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    );
    assert!(
        t1.elapsed() < Duration::from_secs(20),
        "phase 2 hung: {out}{err}"
    );
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let (p1, p2) = out.split_once("phase2\n").expect(&out);
    assert_eq!(
        p1,
        "__init__.py\ncore.py\nfrom the view\nno nope\nread-only\nmounted over itself\n\
         CapEff:\t0000000000000000\n",
        "{err}"
    );
    // after the change: what was read is served as read; the listing is the start's; a file
    // never read cannot be read now, and a changed one is not served (one version only)
    assert!(
        p2.starts_with("__init__.py\ncore.py\nfrom the view\nno added\n"),
        "{p2}{err}"
    );
    assert!(
        p2.contains("never-read failed\nchanged failed\n"),
        "{p2}{err}"
    );
    // and a killed server: a clean failure at once, not a hang
    assert!(
        p2.ends_with("VALUE = 'from the view'\nserver killed: clean failure\n"),
        "{p2}{err}"
    );
    assert!(
        err.contains("share/changed.txt") && err.contains("changed on storage since"),
        "{err}"
    );
    assert!(err.contains("share/never-read.txt"), "{err}");
    // nothing left: no server, no mount (the test's namespace is gone; the host's table)
    assert!(views_running(&ts).is_empty(), "{:?}", views_running(&ts));
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(&ts), "{mounts}");
    // bad input: named, exit 125
    let o = f.run(&["run", "--cache", "/nonexistent/x", "--", "true"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("--cache /nonexistent/x"), "{}", o.stderr);
}
