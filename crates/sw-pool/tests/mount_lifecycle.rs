//! What outlives a mount command: interrupted mounts, cleanup by job and of stale mounts, the Slurm
//! hooks, and a mounted signed pool whose file changes (the fixture: `common/mount_fixture.rs`).

mod common;
use common::cases::*;
use common::mount_fixture::*;
use common::*;

use std::path::Path;
use std::process::Command;

#[test]
fn interrupted_mounts_leave_a_recorded_mount_or_nothing() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "ext4");
    let mp = t.mkdir("mnt");
    let mut outcomes = std::collections::BTreeMap::new();
    for i in 0..30u64 {
        let mut c = t.sw().args(["mount", "-q", &img, &mp]).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_micros((i * 577) % 9000));
        let _ = Command::new("kill")
            .args(["-INT", &c.id().to_string()])
            .status();
        let code = c.wait().unwrap().code().unwrap_or(-1);
        let mounted = !t.mounts().is_empty();
        let recorded = t.records() > 0;
        assert_eq!(
            mounted, recorded,
            "run {i}: exit {code}, mounted {mounted}, recorded {recorded}"
        );
        *outcomes.entry((code, mounted)).or_insert(0) += 1;
        if mounted {
            t.ok(&["umount", "-q", &mp]);
        }
        t.assert_clean();
    }
    eprintln!("outcomes (exit status, mounted): {outcomes:?}");
}

/// `cleanup --job` keeps a mount another job uses; a killed helper is `list --stale`, `cleanup
/// --stale --dry-run` changes nothing, `cleanup --stale` removes it (real squashfuse_ll).
#[test]
fn cleanup_by_job_and_of_stale_mounts() {
    let t = T::new();
    let img = pool(&t, "sqfs");
    let mp = t.mkdir("mnt");
    t.ok(&["mount", "--job-id", "5", &img, &mp]);
    t.ok(&["mount", "--job-id", "6", &img, &mp]);
    let o = t.ok(&["cleanup", "--job", "5"]);
    assert!(o.stdout.contains("released"), "{}", o.stdout);
    let v = t.list_json();
    assert_eq!(
        v["mounts"][0]["record"]["refs"].as_array().unwrap().len(),
        1
    );
    assert_eq!(v["mounts"][0]["record"]["refs"][0]["job_id"], "6");
    assert_eq!(t.mounts().len(), 1);
    let o = t.ok(&["list", "--job", "5"]);
    assert!(o.stdout.contains("no mounts"), "{}", o.stdout);
    // the helper dies: a stale mount
    let pid = v["mounts"][0]["record"]["helper_pid"].as_u64().unwrap();
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    for _ in 0..50 {
        if !pid_alive(pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let o = t.ok(&["list", "--stale"]);
    assert!(o.stdout.contains("stale"), "{}", o.stdout);
    let before = (t.mounts(), t.records());
    let o = t.ok(&["cleanup", "--stale", "--dry-run"]);
    assert!(o.stdout.contains("would: unmounted"), "{}", o.stdout);
    assert_eq!(before, (t.mounts(), t.records()));
    let o = t.ok(&["cleanup", "--stale", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert!(v["actions"].as_array().unwrap().len() >= 2, "{v}");
    t.assert_clean();
    // nothing left: twice is harmless
    assert!(t
        .ok(&["cleanup", "--stale"])
        .stdout
        .contains("nothing to clean"));
}

/// The Slurm hooks and `cleanup` for a job that asked for no pool, outside Slurm, or with bad
/// input.
const SLURM_HOOKS: &[Case] = &[
    // no pools asked for -> no output at all (slurmstepd parses it)
    Case {
        name: "TaskProlog without pools",
        setup: no_input,
        via: Via::Sw,
        args: &["slurm", "task-prolog"],
        env: &[],
        expect_status: Status::Is(0),
        expect_stdout: Stdout::Empty,
        expect_stderr_contains: &[],
    },
    // the multi-call name Slurm runs (no arguments)
    Case {
        name: "TaskProlog by its multi-call name",
        setup: no_input,
        via: Via::Link("task-prolog"),
        args: &[],
        env: &[("SW_POOL_JOB_POOLS", None), ("SW_POOL_LOAD", None)],
        expect_status: Status::Is(0),
        expect_stdout: Stdout::Empty,
        expect_stderr_contains: &[],
    },
    // a user who never used sw-pool here: nothing
    Case {
        name: "epilog for a user without sw-pool state",
        setup: no_input,
        via: Via::Sw,
        args: &["slurm", "epilog"],
        env: &[
            ("SW_POOL_STATE_DIR", None),
            ("SLURM_JOB_ID", Some("77")),
            ("SLURM_JOB_UID", Some("4242421")),
        ],
        expect_status: Status::Is(0),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &[],
    },
    // a usage error that says what is missing
    Case {
        name: "epilog outside Slurm",
        setup: no_input,
        via: Via::Sw,
        args: &["slurm", "epilog"],
        env: &[("SLURM_JOB_ID", None)],
        expect_status: Status::Is(2),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["SLURM_JOB_ID"],
    },
    Case {
        name: "epilog of a job id that is no job id",
        setup: no_input,
        via: Via::Sw,
        args: &["slurm", "epilog", "--job", "1;rm"],
        env: &[("SLURM_JOB_UID", Some("1"))],
        expect_status: Status::Is(2),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &[],
    },
    // fails loudly: a `print` line for the task
    Case {
        name: "TaskProlog given a damaged job environment",
        setup: no_input,
        via: Via::Sw,
        args: &["slurm", "task-prolog"],
        env: &[("SW_POOL_JOB_POOLS", Some("garbage"))],
        expect_status: Status::Failure,
        expect_stdout: Stdout::StartsWith("print sw-pool: error"),
        expect_stderr_contains: &[],
    },
    Case {
        name: "cleanup told nothing to clean",
        setup: no_input,
        via: Via::Sw,
        args: &["cleanup"],
        env: &[],
        expect_status: Status::Is(2),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["--job JOB_ID, --stale or --all"],
    },
];

#[test]
fn slurm_hooks_do_nothing_for_jobs_without_sw_pool() {
    let t = T::new();
    run_cases(&Ctx::new(&t, &[]), SLURM_HOOKS);
}

/// A signed pool with 4 bytes changed (`{bad}`, signed by the key `{dir}/k`), mounted on `{mp}`:
/// refused, and nothing is mounted.
const CHANGED_SIGNED_POOL: &[Case] = &[
    // the signer is in no trusted-keys directory and signatures are required
    Case {
        name: "signer not trusted, signatures required",
        setup: no_input,
        via: Via::Sw,
        args: &["mount", "{bad}", "{mp}"],
        env: &[("SW_POOL_REQUIRE_SIGNATURE", Some("true"))],
        expect_status: Status::Is(7),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["which is not trusted here"],
    },
    Case {
        name: "signer not trusted, signatures required, the paper's tool name",
        setup: no_input,
        via: Via::Link("scalable-fs-mount"),
        args: &["{bad}", "{mp}"],
        env: &[
            ("SW_POOL_STATE_DIR", Some("{state}")),
            ("SW_POOL_CACHE", Some("{dir}")),
            ("SW_POOL_SYSTEM_CONFIG", Some("")),
            ("SW_POOL_USER_CONFIG", Some("")),
            ("SW_POOL_REQUIRE_SIGNATURE", Some("true")),
        ],
        expect_status: Status::Is(7),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &[],
    },
    // the changed bytes are found before anything is mounted
    Case {
        name: "signer trusted, bytes changed",
        setup: |c| {
            let keys = c.t.p("keys");
            if !keys.exists() {
                std::fs::create_dir(&keys).unwrap();
                std::fs::copy(c.t.p("k.pub.pem"), keys.join("k.pem")).unwrap();
            }
            c.t.s("keys")
        },
        via: Via::Sw,
        args: &["mount", "{bad}", "{mp}"],
        env: &[("SW_POOL_TRUSTED_KEYS", Some("{input}"))],
        expect_status: Status::Is(4),
        expect_stdout: Stdout::Any,
        expect_stderr_contains: &["bad.sqfs is damaged", "does not match"],
    },
];

/// A mounted signed pool serves only the bytes its manifest vouches for. A pool of a 5 MiB
/// random file, signed, then 4 bytes changed at offset 100000: refused when its signer is not
/// trusted and signatures are required (also under the paper's tool name), refused as damaged
/// when the signer is trusted; and a pool changed on disk *after* it was mounted still reads back
/// as signed (the mount serves the verified, read-only copy in the node-local cache). Before, the
/// mount ran the FUSE helper on the file where it lay: the changed bytes were served.
#[test]
fn a_mounted_signed_pool_never_serves_changed_bytes() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let tree = t.p("tree");
    assert_eq!(
        sw_run(&[
            "init",
            "-q",
            "--name",
            "q",
            "--version",
            "1",
            t.s("tree").as_str()
        ])
        .code,
        0
    );
    let mut data = vec![0u8; 5 << 20];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut data)
        .unwrap();
    std::fs::write(tree.join("data"), &data).unwrap();
    let want = sha256_file(&tree.join("data"));
    let q = t.s("q.sqfs");
    let o = sw_run(&["build", "-q", &q, tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(sw_run(&["keygen", "-q", "--out", &t.s("k")]).code, 0);
    let o = sw_run(&["sign", "-q", "--key", &t.s("k.pem"), &q]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let tamper = |p: &str| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(b"\xde\xad\xbe\xef", 100_000).unwrap();
    };
    let bad = t.s("bad.sqfs");
    std::fs::copy(&q, &bad).unwrap();
    tamper(&bad);
    let mp = t.mkdir("mnt");
    run_cases(
        &Ctx::new(&t, &[("bad", &bad), ("mp", &mp)]),
        CHANGED_SIGNED_POOL,
    );
    let keys = t.p("keys");
    let trusted = || {
        let mut c = t.sw();
        c.env("SW_POOL_TRUSTED_KEYS", &keys);
        c
    };
    // mounted intact, then the pool file is changed: the mount still serves the signed bytes
    let o = run(trusted().args(["mount", "--json", &q, &mp]));
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let image = v["record"]["image"].as_str().unwrap().to_string();
    assert_ne!(image, q, "mounted where it lies");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&image).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o222,
        0,
        "the verified copy {image} is writable: {mode:o}"
    );
    tamper(&q);
    assert_eq!(sha256_file(&Path::new(&mp).join("data")), want);
    t.ok(&["umount", &mp]);
    t.assert_clean();
}

/// Issue 32, point 7: `mount POOL` says where the verified copy went (it takes the pool's size on
/// the node's disk), and that a second mount reused it.
#[test]
fn mount_says_where_the_copy_goes() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let tree = t.p("tree");
    assert_eq!(
        sw_run(&[
            "init",
            "-q",
            "--name",
            "w",
            "--version",
            "1",
            t.s("tree").as_str()
        ])
        .code,
        0
    );
    std::fs::write(tree.join("f"), b"x").unwrap();
    let q = t.s("w.sqfs");
    assert_eq!(sw_run(&["build", "-q", &q, tree.to_str().unwrap()]).code, 0);
    let mp = t.mkdir("mnt");
    let o = run(t.sw().args(["mount", &q, &mp]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("verified and copied")
            && o.stdout.contains("into the node-local cache: "),
        "{}",
        o.stdout
    );
    t.ok(&["umount", &mp]);
    let o = run(t.sw().args(["mount", &q, &mp]));
    assert!(
        o.stdout.contains("reused the verified copy"),
        "{}",
        o.stdout
    );
    t.ok(&["umount", &mp]);
    t.assert_clean();
}

/// Issue 32, point 8: `mount DIR POOL` (swapped) says which comes first.
#[test]
fn swapped_mount_arguments_get_a_hint() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let pool = t.path().join("p.sqfs");
    std::fs::write(&pool, b"not really").unwrap();
    let o = sw_run(&["mount", dir.to_str().unwrap(), pool.to_str().unwrap()]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!(
            "`sw-pool mount {} {}`",
            pool.display(),
            dir.display()
        )),
        "{}",
        o.stderr
    );
}

/// Issue 32, point 8: the long warning about a pool nothing trusted vouches for is given once a day
/// per pool on a node; later mounts and loads of it get a one-line reminder.
#[test]
fn the_long_trust_warning_is_given_once_a_day() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let img = pool(&t, "squashfs");
    let mp = t.mkdir("mnt");
    let long = "nothing vouches for its content";
    let o = t.ok(&["mount", &img, &mp]);
    assert!(o.stderr.contains(long), "{}", o.stderr);
    t.ok(&["umount", &mp]);
    let o = t.ok(&["mount", &img, &mp]);
    assert!(!o.stderr.contains(long), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("is unsigned (what to do about it: `sw-pool verify"),
        "{}",
        o.stderr
    );
    t.ok(&["umount", &mp]);
    // a day later it is due again
    let warned = t.state().join("warned");
    for e in std::fs::read_dir(&warned).unwrap() {
        let f = std::fs::File::options()
            .write(true)
            .open(e.unwrap().path())
            .unwrap();
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(25 * 3600))
            .unwrap();
    }
    let o = t.ok(&["mount", &img, &mp]);
    assert!(o.stderr.contains(long), "{}", o.stderr);
    t.ok(&["umount", &mp]);
    t.assert_clean();
}

/// `fuse_reader = "sw-pool"`: a squashfs pool is mounted by sw-pool's own tree server
/// (`sw-pool-serve --tree --cached`, real FUSE) and supervised like squashfuse_ll: its files read,
/// `list` says ok, a killed server is stale, `umount --force` removes it.
#[test]
fn the_tree_server_mounts_a_pool_when_configured_and_is_supervised_like_squashfuse_ll() {
    let t = T::new();
    let img = pool(&t, "sqfs");
    let cfg = t.p("config.toml");
    std::fs::write(&cfg, "fuse_reader = \"sw-pool\"\n").unwrap();
    let sw = |args: &[&str]| {
        let o = run(t.sw().env("SW_POOL_USER_CONFIG", &cfg).args(args));
        assert_eq!(o.code, 0, "sw-pool {args:?}: {}{}", o.stdout, o.stderr);
        o
    };
    let c = sw(&["config"]).stdout;
    assert!(
        c.lines()
            .any(|l| l.contains("fuse_reader") && l.contains("sw-pool")),
        "{c}"
    );
    let mp = t.mkdir("mnt");
    let v: serde_json::Value =
        serde_json::from_str(&sw(&["mount", "--json", &img, &mp]).stdout).unwrap();
    let rec = &v["record"];
    assert_eq!(rec["backend"], "sw_pool_tree", "{v}");
    let pid = rec["helper_pid"].as_u64().unwrap();
    assert!(pid_alive(pid));
    let line = mountinfo_line(&mp);
    // through fusermount3 `fuse.sw-pool`; root's own mount `fuse` with the source `sw-pool`
    assert!(
        line.contains(" - fuse.sw-pool ") || line.contains(" - fuse sw-pool "),
        "{line}"
    );
    let hello = Path::new(&mp).join("install/hello/1.0/bin/hello");
    assert!(std::fs::read_to_string(&hello)
        .unwrap()
        .contains("hello from"));
    assert_eq!(
        sha256_file(&hello),
        sha256_file(&t.p("tree/install/hello/1.0/bin/hello"))
    );
    let l = sw(&["list"]).stdout;
    assert!(l.contains(&mp) && l.contains("ok"), "{l}");
    // the server dies: stale
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    for _ in 0..100 {
        if !pid_alive(pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!pid_alive(pid));
    let l = sw(&["list"]).stdout;
    assert!(l.contains(&mp) && l.contains("stale"), "{l}");
    let o = sw(&["umount", "--force", &mp]);
    assert!(o.stdout.contains("unmounted"), "{}", o.stdout);
    t.assert_clean();
}
