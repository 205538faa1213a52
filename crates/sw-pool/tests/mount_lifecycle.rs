//! What outlives a mount command: interrupted mounts, cleanup by job and of stale mounts, the Slurm
//! hooks, and a mounted signed pool whose file changes (the fixture: `common/mount_fixture.rs`).

mod common;
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

#[test]
fn slurm_hooks_do_nothing_for_jobs_without_sw_pool() {
    let t = T::new();
    // the TaskProlog: no pools asked for -> no output at all (slurmstepd parses it)
    let o = run(t.sw().args(["slurm", "task-prolog"]));
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    // the multi-call name Slurm runs (no arguments)
    let link = t.p("task-prolog");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let o = run(Command::new(&link)
        .env_remove("SW_POOL_JOB_POOLS")
        .env_remove("SW_POOL_LOAD"));
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    // the epilog for a user who never used sw-pool here: nothing
    let o = run(t
        .sw()
        .args(["slurm", "epilog"])
        .env_remove("SW_POOL_STATE_DIR")
        .env("SLURM_JOB_ID", "77")
        .env("SLURM_JOB_UID", "4242421"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    // outside Slurm: a usage error that says what is missing
    let o = run(t.sw().args(["slurm", "epilog"]).env_remove("SLURM_JOB_ID"));
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains("SLURM_JOB_ID"), "{}", o.stderr);
    let o = run(t
        .sw()
        .args(["slurm", "epilog", "--job", "1;rm"])
        .env("SLURM_JOB_UID", "1"));
    assert_eq!(o.code, 2, "{}", o.stderr);
    // a TaskProlog given a damaged job environment fails loudly (a `print` line for the task)
    let o = run(t
        .sw()
        .args(["slurm", "task-prolog"])
        .env("SW_POOL_JOB_POOLS", "garbage"));
    assert_ne!(o.code, 0);
    assert!(o.stdout.starts_with("print sw-pool: error"), "{}", o.stdout);
    // cleanup needs to be told what to clean
    let o = t.run(&["cleanup"]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("--job JOB_ID, --stale or --all"),
        "{}",
        o.stderr
    );
}

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
    // the signer is in no trusted-keys directory and signatures are required: refused
    let o = run(t
        .sw()
        .env("SW_POOL_REQUIRE_SIGNATURE", "true")
        .args(["mount", &bad, &mp]));
    assert_eq!(o.code, 7, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("which is not trusted here"),
        "{}",
        o.stderr
    );
    let link = t.p("scalable-fs-mount");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let o = run(Command::new(&link)
        .args([&bad, &mp])
        .env("SW_POOL_STATE_DIR", t.state())
        .env("SW_POOL_CACHE", t.d.path())
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env("SW_POOL_REQUIRE_SIGNATURE", "true"));
    assert_eq!(o.code, 7, "{}{}", o.stdout, o.stderr);
    t.assert_clean();
    // the signer is trusted: the changed bytes are found before anything is mounted
    let keys = t.p("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::copy(t.p("k.pub.pem"), keys.join("k.pem")).unwrap();
    let trusted = || {
        let mut c = t.sw();
        c.env("SW_POOL_TRUSTED_KEYS", &keys);
        c
    };
    let o = run(trusted().args(["mount", &bad, &mp]));
    assert_eq!(o.code, 4, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stderr.contains("bad.sqfs is damaged") && o.stderr.contains("does not match"),
        "{}",
        o.stderr
    );
    t.assert_clean();
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
