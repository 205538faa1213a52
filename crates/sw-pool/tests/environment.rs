//! `sw-pool run` / `shell` / `layer` on this machine: real namespaces, real fuse-overlayfs.
//!
//! The unprivileged cases run as uid 65534 with a private, usable `/dev/fuse` (a device node bound
//! over `/dev/fuse` in a mount namespace of the test's own: the host's may be root-only, as on
//! machines without udev) — the machine itself is never changed. The cluster suite
//! (`tests/cluster/t_60_environments.sh`) runs them across nodes under Slurm.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

use common::env_fixture::*;

#[test]
fn run_returns_the_commands_status_and_sees_only_its_processes() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let o = f.run(&["run", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.code, 7, "{}", o.stderr);
    // the command is one of the first pids (pid 1 is the environment's init), runs as the
    // caller's uid, and sees a handful of processes
    let o = f.run(&[
        "run",
        "--",
        "sh",
        "-c",
        "echo $$ $(id -u); ls /proc | grep -c '^[0-9]'",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut lines = o.stdout.lines();
    let first: Vec<u32> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    assert!(first[0] <= 3 && first[1] == 65534, "{}", o.stdout);
    let n: u32 = lines.next().unwrap().trim().parse().unwrap();
    assert!(n <= 5, "{n} processes visible: {}", o.stdout);
    // --root: uid 0 inside
    let o = f.run(&["run", "--root", "--", "id", "-u"]);
    assert_eq!((o.code, o.stdout.trim()), (0, "0"), "{}", o.stderr);
    // a command that is not there: 127, named
    let o = f.run(&["run", "--", "/nonexistent/cmd"]);
    assert_eq!(o.code, 127, "{}", o.stderr);
    assert!(o.stderr.contains("/nonexistent/cmd"), "{}", o.stderr);
    // a signal that ends the command: 128 + N
    let o = f.run(&["run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.code, 143, "{}", o.stderr);
    // the command starts as after a plain exec: no signal blocked (pid 1 blocks the ones it
    // forwards), SIGPIPE not ignored (Rust ignores it in pid 1), whether pid 1 spawns it directly
    // (plain) or through a nested user namespace (--root has none; a layer has one)
    for args in [&["run", "--"][..], &["run", "--root", "--"][..]] {
        let mut a = args.to_vec();
        a.extend(["grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"]);
        let o = f.run(&a);
        assert_eq!(o.code, 0, "{}", o.stderr);
        let mask = |name: &str| {
            let l = o.stdout.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(l.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(mask("SigBlk:"), 0, "{args:?}: {}", o.stdout);
        assert_eq!(
            mask("SigIgn:") & (1 << (13 - 1)),
            0,
            "SIGPIPE ignored: {}",
            o.stdout
        );
    }
}

/// `mpirun -np 4 sw-pool run -- PROG` outside Slurm: the ranks Open MPI starts on this node share
/// one environment, as a Slurm step's tasks do (with an environment each, every run died: Open MPI's
/// shared memory across user namespaces, all ranks pid 2 — SIGSEGV, 4 runs of 4), the program gives
/// the right answer, and no rendezvous file of the environment is left.
#[test]
fn an_mpi_launchers_ranks_share_one_environment() {
    if !ready() {
        return;
    }
    let Some(mpirun) = ["/usr/bin/mpirun", "/bin/mpirun"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
    else {
        skip("mpirun (Open MPI) is not installed");
        return;
    };
    let selftest = bin().with_file_name("mpi-selftest");
    if !selftest.exists() {
        skip("mpi-selftest is not built (cargo build --release --workspace builds it)");
        return;
    }
    let f = Fixture::new();
    let sw = bin();
    let mut c = f.cmd_of(
        std::ffi::OsStr::new("timeout"),
        &[
            "120",
            mpirun.to_str().unwrap(),
            "--oversubscribe",
            "-np",
            "4",
            sw.to_str().unwrap(),
            "run",
            "--",
            "sh",
            "-c",
            r#"echo "ns $(readlink /proc/self/ns/user)"; exec "$0" 1"#,
            selftest.to_str().unwrap(),
        ],
    );
    let o = run(&mut c);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    let sums: Vec<&str> = o
        .stdout
        .lines()
        .filter(|l| l.starts_with("rank "))
        .map(|l| l.rsplit(' ').next().unwrap())
        .collect();
    assert_eq!(sums.len(), 4, "{}", o.stdout);
    assert!(sums.iter().all(|s| *s == sums[0]), "{}", o.stdout);
    let mut ns: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("ns ")).collect();
    ns.sort();
    ns.dedup();
    assert_eq!(
        ns.len(),
        1,
        "the ranks ran in {} namespaces: {}",
        ns.len(),
        o.stdout
    );
    // the environment is gone with its ranks, and so are its socket, lock and record
    let envs = f.dir.path().join("state").join("envs");
    let left: Vec<_> = std::fs::read_dir(&envs)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "left in {}: {left:?}", envs.display());
}

#[test]
fn writes_anywhere_land_in_the_layer_and_the_host_is_unchanged() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let o = f.run(&["layer", "create", "dev"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let marker = format!("swpool-envtest-{}", std::process::id());
    let etc_hostname = sha256_file(Path::new("/etc/hostname"));
    let script = format!(
        "set -e; printf '#!/bin/sh\\necho hello from the layer\\n' > /usr/local/bin/{marker}; \
         chmod 755 /usr/local/bin/{marker}; echo changed >> /etc/hostname; mkdir -p /opt/{marker}; \
         rm /etc/hostname; echo -v: $SW_POOL_ENVIRONMENT"
    );
    let o = f.run(&["-v", "run", "--layer", "dev", "--", "sh", "-c", &script]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("-v: dev"), "{}", o.stdout);
    assert!(
        o.stderr.contains("fuse-overlayfs"),
        "-v names the method: {}",
        o.stderr
    );
    // the host: untouched
    assert!(!Path::new("/usr/local/bin").join(&marker).exists());
    assert!(!Path::new("/opt").join(&marker).exists());
    assert_eq!(sha256_file(Path::new("/etc/hostname")), etc_hostname);
    // the layer: the new files, and a whiteout for the deleted one
    let upper = f.layers().join("dev/upper");
    assert!(upper.join("usr/local/bin").join(&marker).is_file());
    let wh = std::fs::symlink_metadata(upper.join("etc/hostname")).unwrap();
    assert!(
        swpool_like_is_whiteout(&wh),
        "etc/hostname is not a whiteout"
    );
    // a later environment sees them
    let o = f.run(&["run", "--layer", "dev", "--", &marker]);
    assert_eq!(
        (o.code, o.stdout.trim()),
        (0, "hello from the layer"),
        "{}",
        o.stderr
    );
    let o = f.run(&["run", "--layer", "dev", "--", "test", "-e", "/etc/hostname"]);
    assert_eq!(o.code, 1, "the deleted file stays deleted: {}", o.stderr);
    // an environment without the layer does not
    let o = f.run(&["run", "--", "sh", "-c", &format!("command -v {marker}")]);
    assert_ne!(o.code, 0, "{}", o.stdout);
    // du / list show it
    let o = f.run(&["layer", "du", "dev", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["whiteouts"], 1, "{}", o.stdout);
    assert!(v["entries"].as_u64().unwrap() >= 6, "{}", o.stdout);
    // `layer list` names the layers (nothing inside one is read); `layer du` measures them all
    let list = f.run(&["layer", "list"]);
    let du = f.run(&["layer", "du"]);
    assert_eq!((list.code, du.code), (0, 0), "{}{}", list.stderr, du.stderr);
    assert!(
        list.stdout.starts_with("dev ") && !list.stdout.contains("entries"),
        "{}",
        list.stdout
    );
    assert!(
        du.stdout.contains("1 whiteouts")
            && du.stdout.contains("total")
            && du.stdout.contains("in 1 layer\n"),
        "{}",
        du.stdout
    );
    // export: the upper as a pool, the whiteout kept (a character device 0/0 in the image)
    let pool = f.dir.path().join("state").join("dev.sqfs");
    let o = f.run(&[
        "layer",
        "export",
        "dev",
        pool.to_str().unwrap(),
        "--version",
        "2",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("squashfs pool dev/2"), "{}", o.stdout);
    let i = sw_run(&["inspect", "--json", pool.to_str().unwrap()]);
    assert_eq!(i.code, 0, "{}", i.stderr);
    let l = Command::new("unsquashfs")
        .args(["-lls", "-d", ""])
        .arg(&pool)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&l.stdout);
    assert!(
        listing.contains(&format!("/usr/local/bin/{marker}")),
        "{listing}"
    );
    assert!(
        listing
            .lines()
            .any(|x| x.starts_with('c') && x.contains(" 0,  0 ") && x.ends_with("/etc/hostname")),
        "the whiteout is in the pool: {listing}"
    );
    let o = f.run(&["layer", "rm", "dev"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = f.run(&["layer", "list"]);
    assert!(o.stdout.contains("no layers"), "{}", o.stdout);
}

fn swpool_like_is_whiteout(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    m.file_type().is_char_device() && m.rdev() == 0
}

/// The ids of a process's PID and mount namespaces.
fn ns_ids(pid: i32) -> Option<(PathBuf, PathBuf)> {
    Some((
        std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?,
        std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()?,
    ))
}

/// Processes in the PID namespace `pidns` or the mount namespace `mntns`.
fn members(pidns: &Path, mntns: &Path) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Some((p, m)) = ns_ids(pid) {
            if p == pidns || m == mntns {
                v.push(pid);
            }
        }
    }
    v
}

fn children(ppid: i32) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            let after = &s[s.rfind(')').unwrap() + 2..];
            if after.split(' ').nth(1).and_then(|p| p.parse().ok()) == Some(ppid) {
                v.push(pid);
            }
        }
    }
    v
}

#[test]
fn kill_9_of_the_environments_init_leaves_no_process_and_no_mount() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    assert_eq!(f.run(&["layer", "create", "k"]).code, 0);
    let mut child = f
        .cmd(&[
            "run",
            "--layer",
            "k",
            "--",
            "sh",
            "-c",
            "sleep 300 & sleep 300",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let launcher = child.id() as i32;
    // pid 1 of the environment: the launcher's child, once both sleeps run in its namespace
    let t0 = Instant::now();
    let (init, pidns, mntns) = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the environment did not start"
        );
        let found = children(launcher).into_iter().find_map(|c| {
            let (p, m) = ns_ids(c)?;
            let sleeps = members(&p, &m)
                .into_iter()
                .filter(|&q| {
                    std::fs::read_to_string(format!("/proc/{q}/comm"))
                        .is_ok_and(|c| c.trim() == "sleep")
                })
                .count();
            (sleeps == 2).then_some((c, p, m))
        });
        if let Some(x) = found {
            break x;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let before = members(&pidns, &mntns);
    assert!(
        before.len() >= 4,
        "init, sh, 2 sleeps, fuse-overlayfs: {before:?}"
    );
    // while it runs, another start on the layer joins it: same PID namespace (it sees the two
    // sleeps) and one user namespace for every command of the caller's uid (MPI needs that)
    let o = f.run(&[
        "-v",
        "run",
        "--layer",
        "k",
        "--",
        "sh",
        "-c",
        "n=0; for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = sleep ] && n=$((n+1))          && readlink $p/ns/user; done > /tmp/.ns-$$; readlink /proc/self/ns/user >> /tmp/.ns-$$;          echo $n $(sort -u /tmp/.ns-$$ | wc -l); rm /tmp/.ns-$$",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("joining the environment"), "{}", o.stderr);
    assert_eq!(
        o.stdout.trim(),
        "2 1",
        "2 sleeps seen, 1 user namespace: {}",
        o.stdout
    );
    let killed = Instant::now();
    rustix_kill9(init);
    loop {
        let left = members(&pidns, &mntns);
        if left.is_empty() {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "1 s after kill -9 of pid 1, processes of the environment are left: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // no process holds the mount namespace, so every mount of it is gone with it
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(137), "the launcher reports SIGKILL");
    // and the layer is free again
    assert_eq!(f.run(&["run", "--layer", "k", "--", "true"]).code, 0);
}

fn rustix_kill9(pid: i32) {
    let ok = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

#[test]
fn list_shows_a_running_environment_and_forgets_it_when_it_ends() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    assert_eq!(f.run(&["layer", "create", "ls1"]).code, 0);
    let mut child = f
        .cmd(&["run", "--layer", "ls1", "--", "sleep", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut seen = None;
    while t0.elapsed() < Duration::from_secs(10) && seen.is_none() {
        let o = f.run(&["list", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap_or_default();
        seen = v["environments"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["layer"] == "ls1").cloned());
        std::thread::sleep(Duration::from_millis(50));
    }
    let e = seen.expect("list --json shows the running environment");
    assert!(
        e["method"]
            .as_str()
            .unwrap_or("")
            .contains("fuse-overlayfs"),
        "{e}"
    );
    assert!(e["pid"].as_i64().unwrap_or(0) > 1, "{e}");
    let o = f.run(&["list"]);
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with("env") && l.contains("ls1")),
        "{}",
        o.stdout
    );
    assert!(child.wait().unwrap().success());
    let o = f.run(&["list", "--json"]);
    assert!(
        !o.stdout.contains("ls1"),
        "gone when it ended: {}",
        o.stdout
    );
}

#[test]
fn bad_layers_are_refused_with_what_to_do() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let o = f.run(&["run", "--layer", "nope", "--", "true"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("sw-pool layer create nope"),
        "{}",
        o.stderr
    );
    let o = f.run(&["layer", "create", "../x"]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("not valid"), "{}", o.stderr);
    // a layer that is a symlink to someone else's directory: refused, not followed
    let other = f.dir.path().join("other");
    std::fs::create_dir_all(other.join("upper")).unwrap();
    std::os::unix::fs::symlink(&other, f.layers().join("planted")).unwrap();
    let o = f.run(&["run", "--layer", "planted", "--", "true"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("symbolic link"), "{}", o.stderr);
    // a layer another user owns
    let theirs = f.layers().join("theirs");
    for d in ["", "upper", "work", "merged"] {
        std::fs::create_dir_all(theirs.join(d)).unwrap();
    }
    let o = f.run(&["run", "--layer", "theirs", "--", "true"]);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(o.stderr.contains("belongs to uid 0"), "{}", o.stderr);
}

#[test]
fn an_unusable_dev_fuse_is_named() {
    if !ready() {
        return;
    }
    if std::fs::metadata("/dev/fuse").is_ok_and(|m| m.permissions().mode() & 0o006 == 0o006) {
        skip("/dev/fuse on this machine is usable by everyone");
        return;
    }
    let f = Fixture::new();
    assert_eq!(f.run(&["layer", "create", "x"]).code, 0);
    // without the private device node: the host's root-only /dev/fuse
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin())
        .args(["run", "--layer", "x", "--", "true"])
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env("SW_POOL_LAYER_DIR", f.layers())
        .current_dir("/");
    let o = run(&mut c);
    assert_eq!(o.code, 125, "{}", o.stderr);
    assert!(
        o.stderr.contains("/dev/fuse is not usable by uid 65534")
            && o.stderr.contains("chmod 0666"),
        "{}",
        o.stderr
    );
}

#[test]
fn the_tasks_of_a_job_step_started_at_once_share_one_environment() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let kids: Vec<_> = (0..16)
        .map(|_| {
            f.cmd(&[
                "run",
                "--",
                "sh",
                "-c",
                "readlink /proc/self/ns/pid; readlink /proc/self/ns/user; sleep 1",
            ])
            .env("SLURM_JOB_ID", "77")
            .env("SLURM_STEP_ID", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for k in kids {
        let o = k.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        seen.insert(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    assert_eq!(
        seen.len(),
        1,
        "16 tasks of one step, one PID and user namespace: {seen:?}"
    );
    // another step: another environment
    let o = f.run(&["run", "--", "readlink", "/proc/self/ns/pid"]);
    assert!(
        !seen.iter().next().unwrap().starts_with(o.stdout.trim()),
        "{}",
        o.stdout
    );
    // the environment is gone with its last task: nothing listens any more
    let envs = f.dir.path().join("state/envs");
    let socks = std::fs::read_dir(&envs)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "sock")
        })
        .count();
    assert_eq!(
        socks,
        0,
        "a rendezvous socket was left in {}",
        envs.display()
    );
}

/// Ctrl-C reaches the command, which decides what to do; the launcher lives on to report its exit
/// status. SIGTERM sent to the launcher is passed on to the command.
#[test]
fn interrupts_reach_the_command_and_its_status_comes_back() {
    if !ready() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let f = Fixture::new();
    for (sig, to_group, script, want) in [
        (
            libc_sigint(),
            true,
            "trap 'echo got INT; exit 5' INT; sleep 5 & wait",
            5,
        ),
        (
            libc_sigterm(),
            false,
            "trap 'echo got TERM; exit 6' TERM; sleep 5 & wait",
            6,
        ),
    ] {
        let mut c = f.cmd(&["run", "--", "sh", "-c", script]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        // its own process group, as a terminal's foreground job
        unsafe {
            c.pre_exec(|| {
                setsid();
                Ok(())
            });
        }
        let child = c.spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::sleep(Duration::from_millis(800));
        let target = if to_group { -pid } else { pid };
        assert_eq!(unsafe { kill(target, sig) }, 0);
        let o = child.wait_with_output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(
            o.status.code(),
            Some(want),
            "{out} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("got "), "{out}");
    }
}

extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
    fn setsid() -> i32;
}
fn libc_sigint() -> i32 {
    2
}
fn libc_sigterm() -> i32 {
    15
}

/// `--root` without the site's helper: `dpkg -i` of a package installs into the layer (the
/// package manager's root-only lock files get stand-ins, `rootless_root`; the command's PATH has the
/// sbin directories a user's lacks), its program runs from the layer, and the host's package
/// database does not know it.
#[test]
fn dpkg_install_as_root_lands_in_the_layer() {
    if !ready() {
        return;
    }
    if !Path::new("/usr/bin/dpkg-deb").exists() {
        skip("dpkg-deb is not installed");
        return;
    }
    let f = Fixture::new();
    let pkg = format!("swp-envtest-{}", std::process::id());
    let root = f.dir.path().join("pkg");
    std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::write(
        root.join("DEBIAN/control"),
        format!(
            "Package: {pkg}\nVersion: 1.0\nArchitecture: all\nMaintainer: sw-pool tests <t@localhost>\nDescription: test package\n"
        ),
    )
    .unwrap();
    let prog = root.join("usr/bin").join(&pkg);
    std::fs::write(&prog, "#!/bin/sh\necho installed by dpkg\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let deb = f.dir.path().join("pkg.deb");
    let built = Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group"])
        .arg(&root)
        .arg(&deb)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(built.success());
    std::fs::set_permissions(&deb, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(f.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = f.run(&["layer", "create", "deb"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // as the README has it, from a user's PATH (no sbin directory: dpkg needs ldconfig and
    // start-stop-daemon from there)
    let o = run(f
        .cmd(&[
            "run",
            "--root",
            "--layer",
            "deb",
            "--",
            "dpkg",
            "-i",
            deb.to_str().unwrap(),
        ])
        .env("PATH", "/usr/local/bin:/usr/bin:/bin"));
    assert_eq!(o.code, 0, "dpkg -i in the layer: {}{}", o.stdout, o.stderr);
    assert!(!o.stderr.contains("not found in PATH"), "{}", o.stderr);
    let o = f.run(&["run", "--layer", "deb", "--", &pkg]);
    assert_eq!(
        (o.code, o.stdout.trim()),
        (0, "installed by dpkg"),
        "{}",
        o.stderr
    );
    let o = f.run(&["run", "--layer", "deb", "--", "dpkg", "-s", &pkg]);
    assert!(o.stdout.contains("install ok installed"), "{}", o.stdout);
    // the host: neither the program nor the package
    assert!(!Path::new("/usr/bin").join(&pkg).exists());
    let host = Command::new("dpkg").args(["-s", &pkg]).output().unwrap();
    assert!(!host.status.success(), "the host's dpkg knows {pkg}");
}

/// `sw-pool shell` says on entry and exit which environment it is (`--root` unmistakably), marks
/// the prompt (bash: in front of what its start-up files make; `SW_POOL_PROMPT=` turns it off).
#[test]
fn shell_marks_the_prompt_and_says_where_you_are() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    assert_eq!(f.run(&["layer", "create", "dev"]).code, 0);
    // the "shell" prints its environment
    let shell = |args: &[&str], prompt: Option<&str>| {
        let mut a = vec!["shell"];
        a.extend(args);
        let mut c = f.cmd(&a);
        c.env("SHELL", "/usr/bin/env").env_remove("PS1");
        match prompt {
            Some(p) => c.env("SW_POOL_PROMPT", p),
            None => c.env_remove("SW_POOL_PROMPT"),
        };
        run(&mut c)
    };
    let o = shell(&["--layer", "dev"], None);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("\nPS1=(sw-pool dev) $ \n"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("PROMPT_COMMAND="), "{}", o.stdout);
    let lines: Vec<&str> = o.stderr.lines().collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.contains("entering") && l.contains("layer dev"))
            && lines
                .last()
                .is_some_and(|l| l.contains("left layer dev") && l.contains("exit status 0")),
        "{}",
        o.stderr
    );
    let o = shell(&["--root", "--layer", "dev"], None);
    assert!(
        o.stdout.contains("\nPS1=(sw-pool dev, root) $ \n"),
        "{}",
        o.stdout
    );
    assert!(o.stderr.contains("AS ROOT"), "{}", o.stderr);
    // off by the variable; a mark of one's own
    let o = shell(&["--layer", "dev"], Some(""));
    assert!(
        !o.stdout.contains("PS1=") && !o.stdout.contains("PROMPT_COMMAND="),
        "{}",
        o.stdout
    );
    let o = shell(&["--layer", "dev"], Some("[LAYER] "));
    assert!(o.stdout.contains("\nPS1=[dev] $ \n"), "{}", o.stdout);
    // -q: no lines
    let o = shell(&["-q", "--layer", "dev"], None);
    assert!(!o.stderr.contains("entering"), "{}", o.stderr);
    // a real interactive bash on a terminal: its prompt carries the mark after its start-up files
    let line = format!(
        "env SHELL=/bin/bash {} shell --root --layer dev",
        bin().display()
    );
    let mut child = f
        .cmd_of("script".as_ref(), &["-qec", &line, "/dev/null"])
        .env_remove("PS1")
        .env_remove("SW_POOL_PROMPT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"echo inside-$(id -u)\nexit 3\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("(sw-pool dev, root) ") && out.contains("inside-0"),
        "{out}"
    );
    assert!(
        out.contains("left layer dev's environment (exit status 3)"),
        "{out}"
    );
}
