//! `sw-pool shell-init bash --login-env NAME`: an interactive shell that reads it (a login) runs
//! `sw-pool shell --layer NAME` in its place; two logins share one environment; a missing or
//! broken layer, or no sw-pool on PATH, leaves a plain shell with one line saying why;
//! `SW_POOL_NO_LOGIN_ENV=1` skips it. Real bash, real namespaces, real fuse-overlayfs, as uid 65534
//! (the cluster suite's `t_84_login_env.sh` logs in through Slurm).

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::env_fixture::*;
use common::*;

/// The start-up file a user writes: the shell-init line for layer `layer`.
fn rc_file(f: &Fixture, layer: &str) -> PathBuf {
    let o = f.run(&["shell-init", "bash", "--login-env", layer]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rc = f.dir.path().join(format!("bashrc-{layer}"));
    std::fs::write(&rc, &o.stdout).unwrap();
    std::fs::set_permissions(&rc, std::fs::Permissions::from_mode(0o644)).unwrap();
    rc
}

/// An interactive bash (a login) reading `rc`, its commands from `input`: (status, stdout, stderr).
fn login(f: &Fixture, rc: &Path, input: &str, vars: &[(&str, &str)]) -> (i32, String, String) {
    let rc = rc.to_str().unwrap();
    let mut c = f.cmd_of("bash".as_ref(), &["--rcfile", rc, "-i"]);
    c.env("SHELL", "/bin/bash")
        .env_remove("SW_POOL_NO_LOGIN_ENV")
        .env_remove("SW_POOL_ENVIRONMENT")
        .env(
            "PATH",
            format!("{}:/usr/bin:/bin", bin().parent().unwrap().display()),
        );
    for (k, v) in vars {
        c.env(k, v);
    }
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

const SHOW: &str = "echo \"env=[$SW_POOL_ENVIRONMENT] mnt=$(readlink /proc/self/ns/mnt)\"\n";

fn host_mnt() -> String {
    std::fs::read_link("/proc/self/ns/mnt")
        .unwrap()
        .display()
        .to_string()
}

#[test]
fn logins_share_the_layers_environment_and_end_with_it() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    assert_eq!(f.run(&["layer", "create", "dev"]).code, 0);
    let rc = rc_file(&f, "dev");
    // the first login stays a while; the second logs in meanwhile
    let first = std::thread::scope(|s| {
        let first = s.spawn(|| login(&f, &rc, &format!("{SHOW}sleep 4\nexit 3\n"), &[]));
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let second = login(&f, &rc, &format!("{SHOW}exit 4\n"), &[]);
        let first = first.join().unwrap();
        (first, second)
    });
    let ((c1, o1, e1), (c2, o2, e2)) = first;
    let mnt = |o: &str| {
        o.lines()
            .find_map(|l| l.strip_prefix("env=[dev] mnt="))
            .map(String::from)
    };
    let (m1, m2) = (mnt(&o1), mnt(&o2));
    assert!(
        m1.is_some(),
        "first login not in layer dev's environment:\n{o1}\n{e1}"
    );
    assert_eq!(
        m1, m2,
        "two logins, two environments:\n{o1}\n{e1}\n---\n{o2}\n{e2}"
    );
    assert_ne!(m1.unwrap(), host_mnt(), "the host's mount namespace");
    // each login ends with its environment's shell, with its status (nothing runs after it)
    assert_eq!((c1, c2), (3, 4), "{e1}\n{e2}");
    assert!(e2.contains("joining") || e2.contains("entering"), "{e2}");
    // no file left behind by the rendezvous of the login and its environment
    let left: Vec<_> = std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("sw-pool-login.")
                && e.metadata()
                    .is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 65534)
        })
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_broken_layer_never_locks_the_login_out() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    // (SW_POOL_ENVIRONMENT is set in every environment)
    let plain = |(code, out, err): (i32, String, String), why: &str| {
        assert_eq!(code, 0, "{why}: {out}\n{err}");
        assert!(
            out.contains("env=[] mnt=") && out.contains("\nafter\n"),
            "{why}: not a plain shell:\n{out}\n{err}"
        );
        err
    };
    let input = format!("{SHOW}echo after\n");
    // no such layer: one line (why, what to do), a plain shell
    let rc = rc_file(&f, "missing");
    let err = plain(login(&f, &rc, &input, &[]), "missing layer");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("sw-pool")).collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("layer \"missing\" does not exist")
            && said[0].contains("sw-pool layer create missing")
            && said[0].contains("plain shell")
            && said[0].contains("SW_POOL_NO_LOGIN_ENV=1"),
        "{err}"
    );
    // a layer that is not the user's alone (writable by others): refused, a plain shell
    assert_eq!(f.run(&["layer", "create", "open"]).code, 0);
    let dir = f.layers().join("open");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let rc = rc_file(&f, "open");
    let err = plain(login(&f, &rc, &input, &[]), "layer writable by others");
    assert!(
        err.lines().filter(|l| l.contains("sw-pool")).count() == 1
            && err.contains("could not start")
            && err.contains("plain shell"),
        "{err}"
    );
    // a layer whose shell cannot run: a whiteout hides /bin/bash... here, $SHELL missing inside
    assert_eq!(f.run(&["layer", "create", "dev"]).code, 0);
    let rc = rc_file(&f, "dev");
    let err = plain(
        login(&f, &rc, &input, &[("SHELL", "/nonexistent/shell")]),
        "shell missing in the environment",
    );
    assert!(
        err.contains("its shell (/nonexistent/shell) could not run") && err.contains("plain shell"),
        "{err}"
    );
    // sw-pool not on PATH: the start-up code says so itself
    let mut c = f.cmd_of("bash".as_ref(), &["--rcfile", rc.to_str().unwrap(), "-i"]);
    c.env("PATH", "/usr/bin:/bin").env("SHELL", "/bin/bash");
    c.stdin(std::fs::File::open(write_input(&f, &input)).unwrap());
    let o = run(&mut c);
    let err = plain((o.code, o.stdout, o.stderr), "no sw-pool on PATH");
    assert!(err.contains("sw-pool is not on PATH"), "{err}");
    // the way out: SW_POOL_NO_LOGIN_ENV=1, no line at all
    let err = plain(
        login(&f, &rc, &input, &[("SW_POOL_NO_LOGIN_ENV", "1")]),
        "SW_POOL_NO_LOGIN_ENV=1",
    );
    assert!(!err.contains("sw-pool"), "{err}");
}

fn write_input(f: &Fixture, input: &str) -> PathBuf {
    let p = f.dir.path().join("input");
    std::fs::write(&p, input).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

#[test]
fn login_env_takes_only_a_layer_name_and_posix_shells() {
    if !ready() {
        return;
    }
    let f = Fixture::new();
    let o = f.run(&["shell-init", "bash", "--login-env", "a'b"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("not a layer name"), "{}", o.stderr);
    let o = f.run(&["shell-init", "fish", "--login-env", "dev"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("bash, zsh and ksh"), "{}", o.stderr);
    // the code parses in every POSIX shell it is for
    let o = f.run(&["shell-init", "bash", "--login-env", "dev"]);
    for sh in ["bash", "dash"] {
        let st = std::process::Command::new(sh)
            .args(["-n", "-c", &o.stdout])
            .status()
            .unwrap();
        assert!(st.success(), "{sh} -n");
    }
}
