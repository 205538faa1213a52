//! `sw-pool load` / `unload` on one node (no MPI launcher): cache, mount, environment, references,
//! the trust policy and failures that leave nothing cached half-way or mounted.

mod common;
use common::load_fixture::*;
use common::*;

use std::process::Command;

/// An untrusted signer is warned about like an unsigned pool (it loaded silently before), and a
/// site that installed a trusted key requires signatures unless told otherwise.
#[test]
fn untrusted_signers_warn_and_installed_keys_require_signatures() {
    let t = T::new();
    let p = pool(&t, true);
    let ps = p.to_str().unwrap();
    let unsigned = t.p("unsigned.sqfs");
    std::fs::copy(&p, &unsigned).unwrap();
    assert_eq!(
        sw_run(&["keygen", "-q", "--out", t.p("adm").to_str().unwrap()]).code,
        0
    );
    assert_eq!(
        sw_run(&["sign", "-q", "--key", t.p("adm.pem").to_str().unwrap(), ps]).code,
        0
    );
    // no trusted key installed: the untrusted signer loads, with a warning saying what to do
    let o = t.run(&["load", "-m", t.p("m1").to_str().unwrap(), ps]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for needle in [
        "warning",
        "untrusted key sha256:",
        "trusted-keys",
        "require_signature",
    ] {
        assert!(o.stderr.contains(needle), "{needle}: {}", o.stderr);
    }
    t.ok(&["unload", t.p("m1").to_str().unwrap()]);
    // a trusted key installed: an unsigned pool is refused by default, nothing cached or mounted
    std::fs::copy(t.p("adm.pub.pem"), t.p("keys/site-admin.pem")).unwrap();
    let before = t.cache_files();
    let o = t.run(&[
        "load",
        "-m",
        t.p("m2").to_str().unwrap(),
        unsigned.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 7, "{}", o.stderr);
    assert!(o.stderr.contains("is not signed"), "{}", o.stderr);
    assert_eq!(t.cache_files(), before);
    assert_eq!(t.fuse_mounts(), 0);
    // `sw-pool config` says why
    let o = t.run(&["config"]);
    assert!(
        o.stdout.contains("signatures by a trusted key required"),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("1 trusted key(s) installed"),
        "{}",
        o.stdout
    );
    // an explicit require_signature = false allows it again, with the warning
    let o = run(t.sw().env("SW_POOL_REQUIRE_SIGNATURE", "false").args([
        "load",
        "-m",
        t.p("m3").to_str().unwrap(),
        unsigned.to_str().unwrap(),
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("is unsigned"), "{}", o.stderr);
    t.ok(&["unload", t.p("m3").to_str().unwrap()]);
    // and the signed pool now loads as trusted, without a warning
    let o = t.run(&["load", "-m", t.p("m4").to_str().unwrap(), ps]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains("warning"), "{}", o.stderr);
    t.ok(&["unload", t.p("m4").to_str().unwrap()]);
}

#[test]
fn load_twice_unload_twice() {
    let t = T::new();
    let p = pool(&t, true);
    let o = t.run(&["-v", "load", p.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mp = t.p("mnt/demo/1.0");
    assert!(
        o.stdout
            .contains(&format!("export MODULEPATH='{}/modulefiles'", mp.display())),
        "{}",
        o.stdout
    );
    assert!(
        o.stderr.contains("mount") && o.stderr.contains("total"),
        "-v timings on stderr: {}",
        o.stderr
    );
    assert!(
        o.stderr.contains("unsigned"),
        "an unsigned pool is flagged: {}",
        o.stderr
    );
    assert!(mp.join("install/hello/1.0/bin/hello").exists());
    assert_eq!(t.cache_files().len(), 1, "{:?}", t.cache_files());
    assert_eq!(t.fuse_mounts(), 1);
    // the environment it prints works with the real Lmod
    let script = format!("source /usr/share/lmod/lmod/init/bash\n{}\nmodule load hello/1.0 cfact/2.0; hello; cfact 4", o.stdout);
    let l = run(Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env_remove("MODULEPATH"));
    assert!(
        l.stdout.contains("hello from") && l.stdout.contains("24"),
        "{}{}",
        l.stdout,
        l.stderr
    );
    // by NAME/VERSION on SW_POOL_PATH: the same mount, one more reference
    let o = run(t
        .sw()
        .env("SW_POOL_PATH", t.p("pools"))
        .args(["load", p.to_str().unwrap()]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(t.fuse_mounts(), 1);
    let l = t.run(&["list"]);
    assert!(
        l.stdout.contains("demo/1.0") && l.stdout.contains(" 2 "),
        "{}",
        l.stdout
    );
    let o = t.run(&["unload", "demo/1.0"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(t.fuse_mounts(), 1, "one reference left: still mounted");
    let o = run(t
        .sw()
        .env(
            "MODULEPATH",
            format!("/opt/mods:{}/modulefiles", mp.display()),
        )
        .env("SW_POOL_LOADED", &mp)
        .args(["unload", "demo/1.0"]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("export MODULEPATH='/opt/mods'"),
        "unload takes exactly its entry off: {}",
        o.stdout
    );
    assert_eq!(t.fuse_mounts(), 0);
    assert_eq!(t.cache_files().len(), 1, "the verified cache entry stays");
    // unloading what is not loaded: as asked already, exit 0 with a note
    let o = t.run(&["unload", "demo/1.0"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("nothing to unload"), "{}", o.stderr);
    let o = t.run(&["unload", "never/1"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("never/1 is not loaded") && o.stderr.contains("nothing to unload"),
        "{}",
        o.stderr
    );
}

#[test]
fn trust_policy_and_failures_leave_nothing() {
    let t = T::new();
    let p = pool(&t, true);
    let ps = p.to_str().unwrap();
    // an unsigned pool under --require-signature: refused, nothing cached or mounted
    let o = t.run(&["load", "--require-signature", ps]);
    assert_eq!(o.code, 7, "{}", o.stderr);
    assert!(
        o.stderr.contains("is not signed") && o.stderr.contains("sw-pool sign"),
        "{}",
        o.stderr
    );
    assert!(t.cache_files().is_empty() && t.fuse_mounts() == 0);
    // the same through the environment
    let o = run(t
        .sw()
        .env("SW_POOL_REQUIRE_SIGNATURE", "1")
        .args(["load", ps]));
    assert_eq!(o.code, 7, "{}", o.stderr);
    // signed by an untrusted key: refused with the fingerprint and how to trust it
    assert_eq!(
        sw_run(&["keygen", "-q", "--out", t.p("adm").to_str().unwrap()]).code,
        0
    );
    assert_eq!(
        sw_run(&["sign", "-q", "--key", t.p("adm.pem").to_str().unwrap(), ps]).code,
        0
    );
    let o = t.run(&["load", "--require-signature", ps]);
    assert_eq!(o.code, 7, "{}", o.stderr);
    assert!(
        o.stderr.contains("not trusted") && o.stderr.contains("sha256:"),
        "{}",
        o.stderr
    );
    assert!(t.cache_files().is_empty() && t.fuse_mounts() == 0);
    // trusted: loads
    std::fs::copy(t.p("adm.pub.pem"), t.p("keys/site-admin.pem")).unwrap();
    let o = t.run(&[
        "load",
        "--require-signature",
        "-m",
        t.p("m1").to_str().unwrap(),
        ps,
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    t.ok(&["unload", t.p("m1").to_str().unwrap()]);
    // a flipped byte in the image, loaded into an empty cache (the verified cache entry of the good
    // pool would be served instead, without reading the damaged file at all): refused as it lands
    let mut b = std::fs::read(&p).unwrap();
    b[100] ^= 1;
    let bad = t.p("bad.sqfs");
    std::fs::write(&bad, &b).unwrap();
    std::fs::create_dir_all(t.p("cache2")).unwrap();
    let o = t.run(&[
        "load",
        "--cache-dir",
        t.p("cache2").to_str().unwrap(),
        "-m",
        t.p("m2").to_str().unwrap(),
        bad.to_str().unwrap(),
    ]);
    assert_ne!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("offset") || o.stderr.contains("chunk"),
        "{}",
        o.stderr
    );
    let left: Vec<_> = walk(&t.p("cache2"));
    assert!(
        left.iter().all(|f| std::fs::metadata(f).unwrap().is_dir()),
        "nothing cached half-way: {left:?}"
    );
    assert_eq!(t.fuse_mounts(), 0);
    // not a pool; a mount point that is not empty
    std::fs::write(t.p("junk"), vec![1u8; 5000]).unwrap();
    let o = t.run(&["load", t.p("junk").to_str().unwrap()]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(o.stderr.contains("not a sw-pool pool"), "{}", o.stderr);
    std::fs::create_dir_all(t.p("full")).unwrap();
    std::fs::write(t.p("full/x"), b"x").unwrap();
    let o = t.run(&["load", "-m", t.p("full").to_str().unwrap(), ps]);
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("full") && o.stderr.contains("empty"),
        "{}",
        o.stderr
    );
    assert_eq!(t.fuse_mounts(), 0);
    let o = t.run(&["load", "nosuch/9"]);
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("nosuch"), "{}", o.stderr);
}

#[test]
fn a_pool_without_modulefiles_loads_with_a_warning() {
    let t = T::new();
    let p = pool(&t, false);
    let o = t.run(&["load", p.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("no modulefiles/"), "{}", o.stderr);
    t.ok(&["unload", "demo/1.0"]);
}

#[test]
fn cache_list_prune_and_watermarks() {
    let t = T::new();
    let a = pool(&t, true);
    // a second pool: the same tree under another name
    let b = t.p("other.sqfs");
    let o = sw_run(&[
        "build",
        "-q",
        "--name",
        "other",
        "--version",
        "2",
        b.to_str().unwrap(),
        t.p("tree").to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    t.ok(&["load", a.to_str().unwrap()]);
    t.ok(&["unload", "demo/1.0"]);
    t.ok(&["load", b.to_str().unwrap()]);
    let o = t.run(&["cache", "list"]);
    assert!(
        o.stdout.contains("demo/1.0")
            && o.stdout.contains("other/2")
            && o.stdout.contains("(mounted)"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("2 entries"), "{}", o.stdout);
    let o = t.run(&["cache", "prune", "--max-size", "0", "--dry-run"]);
    assert!(
        o.stdout.contains("would remove") && o.stdout.contains("demo/1.0"),
        "{}",
        o.stdout
    );
    assert_eq!(t.cache_files().len(), 2, "--dry-run changes nothing");
    let o = t.run(&["cache", "prune", "--max-size", "0"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("removed") && o.stdout.contains("the rest is mounted"),
        "{}",
        o.stdout
    );
    assert_eq!(
        t.cache_files().len(),
        1,
        "the mounted pool stays: {:?}",
        t.cache_files()
    );
    // watermarks: after a load, a cache above the high watermark loses its least recently used entries
    t.ok(&["unload", "other/2"]);
    t.ok(&["load", a.to_str().unwrap()]);
    assert_eq!(t.cache_files().len(), 2);
    let o = run(t
        .sw()
        .env("SW_POOL_CACHE_HIGH", "1")
        .args(["load", b.to_str().unwrap()]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let left = t.cache_files();
    assert_eq!(
        left.len(),
        2,
        "both are mounted now, neither is evicted: {left:?}"
    );
    t.ok(&["unload", "demo/1.0"]);
    let o = run(t
        .sw()
        .env("SW_POOL_CACHE_HIGH", "1")
        .args(["load", b.to_str().unwrap()]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let left = t.cache_files();
    assert_eq!(
        left.len(),
        1,
        "demo/1.0 (not mounted, least recently used) evicted: {left:?}"
    );
    assert!(left[0].starts_with("other-2-"), "{left:?}");
    t.ok(&["unload", "other/2"]);
    t.ok(&["unload", "other/2"]);
}

/// In a job (SLURM_JOB_ID, one node): load exports SW_POOL_JOB_POOLS; the TaskProlog run with the
/// job's environment finds the pool mounted and changes nothing (one reference per job); the
/// TaskProlog with SW_POOL_LOAD mounts it itself; the epilog's `cleanup --job` takes it all down;
/// `list --unreported` then shows the cache entry nothing mounts.
#[test]
fn job_pools_for_the_task_prolog_and_cleanup_by_job() {
    let t = T::new();
    let p = pool(&t, true);
    let o = run(t
        .sw()
        .env("SLURM_JOB_ID", "4711")
        .args(["load", p.to_str().unwrap()]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let line = o
        .stdout
        .lines()
        .find(|l| l.starts_with("export SW_POOL_JOB_POOLS="))
        .unwrap_or_else(|| panic!("no SW_POOL_JOB_POOLS in {}", o.stdout));
    let v = line
        .trim_start_matches("export SW_POOL_JOB_POOLS=")
        .trim_end_matches(';')
        .trim_matches('\'');
    let mp = t.p("mnt/demo/1.0");
    assert!(
        v.starts_with("demo@1.0@blake3")
            && v.contains(&format!("@{}@", mp.display()))
            && v.ends_with(".pool"),
        "{v}"
    );
    let modpath = format!("{}/modulefiles", mp.display());
    // the TaskProlog of a later step: already mounted, MODULEPATH already right -> no output, no new ref
    let o = run(t
        .sw()
        .env("SLURM_JOB_ID", "4711")
        .env("SW_POOL_JOB_POOLS", v)
        .env("MODULEPATH", &modpath)
        .args(["slurm", "task-prolog"]));
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    let l: serde_json::Value = serde_json::from_str(&t.run(&["list", "--json"]).stdout).unwrap();
    assert_eq!(
        l["mounts"][0]["record"]["refs"].as_array().unwrap().len(),
        1
    );
    // a task whose environment lacks MODULEPATH gets the export lines (literal, no quotes)
    let o = run(t
        .sw()
        .env("SLURM_JOB_ID", "4711")
        .env("SW_POOL_JOB_POOLS", v)
        .args(["slurm", "task-prolog"]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains(&format!("export MODULEPATH={modpath}\n")),
        "{}",
        o.stdout
    );
    // another job on the node, given the pool at submission (SW_POOL_LOAD): a second reference
    let o = run(t
        .sw()
        .env("SLURM_JOB_ID", "4712")
        .env("SW_POOL_PATH", t.p("nowhere"))
        .env("SW_POOL_LOAD", p.to_str().unwrap())
        .args(["slurm", "task-prolog"]));
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("export SW_POOL_JOB_POOLS=demo@1.0@"),
        "{}",
        o.stdout
    );
    let l: serde_json::Value = serde_json::from_str(&t.run(&["list", "--json"]).stdout).unwrap();
    assert_eq!(
        l["mounts"][0]["record"]["refs"].as_array().unwrap().len(),
        2
    );
    // the first job's epilog: the second job keeps the mount; then the second's
    t.ok(&["cleanup", "--job", "4711"]);
    assert_eq!(t.fuse_mounts(), 1);
    t.ok(&["cleanup", "--job", "4712"]);
    assert_eq!(t.fuse_mounts(), 0);
    let o = t.run(&["list", "--unreported"]);
    assert!(
        o.stdout.contains("unused") && o.stdout.contains("demo/1.0"),
        "{}",
        o.stdout
    );
}
