//! `sw-pool load` / `unload` on one node (no MPI launcher): cache, mount, environment, references,
//! the trust policy and failures that leave nothing cached half-way or mounted.

mod common;
use common::*;

use std::path::PathBuf;
use std::process::Command;

struct T {
    d: tempfile::TempDir,
}

impl T {
    fn new() -> T {
        let t = T { d: scratch() };
        for sub in ["local", "state", "mnt", "keys"] {
            std::fs::create_dir_all(t.d.path().join(sub)).unwrap();
        }
        t
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.d.path().join(rel)
    }
    fn sw(&self) -> Command {
        let mut c = sw();
        c.env("LOCAL_TMPDIR", self.p("local"))
            .env("SW_POOL_STATE_DIR", self.p("state"))
            .env("SW_POOL_MOUNT", self.p("mnt"))
            .env("SW_POOL_TRUSTED_KEYS", self.p("keys"))
            .env("SW_POOL_SHELL", "sh")
            // the test reads and checks the shell code itself (else `load` refuses a pipe that
            // no shell reads)
            .env("SW_POOL_SHELL_FUNCTION", "1")
            .env_remove("SLURM_JOB_ID")
            .env_remove("MODULEPATH");
        c
    }
    fn run(&self, args: &[&str]) -> Out {
        run(self.sw().args(args))
    }
    /// `run`, which must exit 0 (its stderr in the failure message).
    #[track_caller]
    fn ok(&self, args: &[&str]) -> Out {
        let o = self.run(args);
        assert_eq!(o.code, 0, "sw-pool {args:?}: {}", o.stderr);
        o
    }
    fn cache_files(&self) -> Vec<String> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(self.p("local")).unwrap().flatten() {
            if let Ok(rd) = std::fs::read_dir(e.path().join("cache")) {
                v.extend(
                    rd.flatten()
                        .map(|f| f.file_name().to_string_lossy().into_owned())
                        // an entry's verification stamp is bookkeeping, not a file of the cache
                        .filter(|n| !n.ends_with(".verified")),
                );
            }
        }
        v
    }
    fn fuse_mounts(&self) -> usize {
        let root = self.d.path().to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&root) && l.contains("fuse"))
            .count()
    }
}

impl Drop for T {
    fn drop(&mut self) {
        let root = self.d.path().to_string_lossy().into_owned();
        for l in std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
        {
            if let Some(mp) = l.split_whitespace().nth(1).filter(|m| m.starts_with(&root)) {
                let _ = Command::new("fusermount3").args(["-u", "-z", mp]).status();
            }
        }
    }
}

fn pool(t: &T, with_modules: bool) -> PathBuf {
    let tree = t.p("tree");
    sample_tree(&tree);
    if !with_modules {
        std::fs::remove_dir_all(tree.join("modulefiles")).unwrap();
    }
    let out = t.p("demo.sqfs");
    let mut a = vec!["build", "-q"];
    if with_modules {
        a.push("--gen-modulefiles");
    }
    a.extend([out.to_str().unwrap(), tree.to_str().unwrap()]);
    let o = sw_run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    out
}

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

/// A lazy load's verifying chunk server has a FUSE mount of its own (in the state directory):
/// `list` counts it as the record's, not as an unrecorded mount of sw-pool-serve (a user's FUSE
/// mounts are `fuse.sw-pool-serve` through fusermount3, so the test runs as nobody).
#[test]
fn list_takes_the_chunk_servers_mount_for_its_records() {
    if !is_root() {
        skip("needs root to give the test user a private /dev/fuse; run the suite as root");
        return;
    }
    let t = T::new();
    let p = pool(&t, true);
    let f = common::env_fixture::Fixture::new();
    let mp = f.dir.path().join("lazy");
    let script = r#"set -e
"$1" -q load --lazy -m "$2" "$3" >/dev/null
"$1" list
"$1" -q unload "$2" >/dev/null"#;
    let o = run(f
        .cmd_of(
            "sh".as_ref(),
            &[
                "-c",
                script,
                "sh",
                bin().to_str().unwrap(),
                mp.to_str().unwrap(),
                p.to_str().unwrap(),
            ],
        )
        .env("SW_POOL_CACHE", f.dir.path())
        .env("SW_POOL_SHELL_FUNCTION", "1"));
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.contains(mp.to_str().unwrap()), "{}", o.stdout);
    assert!(
        !o.stdout.contains("unrecorded") && !o.stdout.contains("without a sw-pool record"),
        "a false alarm: {}",
        o.stdout
    );
    assert_eq!(o.stdout.lines().count(), 2, "{}", o.stdout);
}

/// A load whose output no shell evaluates (a file, /dev/null, a pipe to a program) refuses
/// before it copies or mounts anything and says what to run; `eval "$(sw-pool load …)"` works.
#[test]
fn load_refuses_output_that_no_shell_evaluates() {
    let t = T::new();
    let p = pool(&t, true);
    std::fs::create_dir_all(t.p("pools/demo")).unwrap();
    std::fs::rename(&p, t.p("pools/demo/1.0.sqfs")).unwrap();
    for (how, goes_to) in [
        ("> \"$D/log\"", "the file"),
        ("> /dev/null", "the device /dev/null"),
        ("| cat", "a pipe read by cat"),
    ] {
        let o = bash(
            &t,
            &format!("set -o pipefail; \"$SWP\" load demo/1.0 {how}"),
        );
        assert_eq!(o.code, 2, "{how}: {}{}", o.stdout, o.stderr);
        assert!(
            o.stderr.contains(goes_to)
                && o.stderr.contains("nothing was mounted")
                && o.stderr.contains("eval \"$(sw-pool load demo/1.0)\""),
            "{how}: {}",
            o.stderr
        );
        assert_eq!(t.fuse_mounts(), 0, "{how}: mounted");
        assert!(
            t.cache_files().is_empty(),
            "{how}: copied {:?}",
            t.cache_files()
        );
        assert!(
            std::fs::read_dir(t.p("state")).unwrap().count() == 0
                || std::fs::read_dir(t.p("state/mounts")).map_or(true, |mut d| d.next().is_none()),
            "{how}: a record"
        );
    }
    // evaluated by the shell: loaded; --json and the shell function's mark are not refused
    let o = bash(
        &t,
        "eval \"$(\"$SWP\" -q load demo/1.0)\" && echo \"MP=$MODULEPATH\"",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("MP=") && o.stdout.contains("demo/1.0/modulefiles"),
        "{}",
        o.stdout
    );
    let o = bash(&t, "\"$SWP\" -q load --json demo/1.0 > \"$D/report\"");
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = bash(
        &t,
        "SW_POOL_SHELL_FUNCTION=1 \"$SWP\" -q load demo/1.0 > /dev/null",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    for _ in 0..3 {
        t.ok(&["unload", "-q", "demo/1.0"]);
    }
    assert_eq!(t.fuse_mounts(), 0);
}

/// `bash -c SCRIPT` with this test's settings, not marked as the shell function's call: `$SWP`
/// is the program, `$D` the test's directory.
fn bash(t: &T, script: &str) -> Out {
    let c = t.sw();
    let prog = c.get_program().to_owned();
    let mut b = Command::new("bash");
    b.arg("-c").arg(script);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => b.env(k, v),
            None => b.env_remove(k),
        };
    }
    b.env_remove("SW_POOL_SHELL_FUNCTION")
        .env("SWP", prog)
        .env("D", t.d.path())
        .env("SW_POOL_PATH", t.p("pools"));
    run(&mut b)
}

/// Loading a pool twice in one shell holds one reference (another shell's load takes its own);
/// each shell's unload drops its own; unloading again is a note, exit 0. `avail` lists the pool
/// path's pools, signed or not and cached here or not; a mistyped NAME/VERSION gets a "did you
/// mean" from load, mount and avail.
#[test]
fn one_reference_per_shell_avail_and_did_you_mean() {
    let t = T::new();
    let p = pool(&t, true);
    std::fs::create_dir_all(t.p("pools/demo")).unwrap();
    std::fs::rename(&p, t.p("pools/demo/1.0.sqfs")).unwrap();
    std::fs::copy(t.p("pools/demo/1.0.sqfs"), t.p("pools/demo-2.0.sqfs")).unwrap();
    assert_eq!(
        sw_run(&["keygen", "-q", "--out", t.p("adm").to_str().unwrap()]).code,
        0
    );
    let signed = t.p("pools/demo-2.0.sqfs");
    assert_eq!(
        sw_run(&[
            "sign",
            "-q",
            "--key",
            t.p("adm.pem").to_str().unwrap(),
            signed.to_str().unwrap()
        ])
        .code,
        0
    );
    // one shell loads twice: one reference; a child shell's load: its own
    let o = bash(
        &t,
        r#"set -e
eval "$("$SWP" -q load demo/1.0)"
eval "$("$SWP" -q load demo/1.0)"
"$SWP" list --json > "$D/one.json"
bash -c 'eval "$("$SWP" -q load demo/1.0)"; "$SWP" list --json > "$D/two.json"; eval "$("$SWP" -q unload demo/1.0)"'
"$SWP" list --json > "$D/back.json"
eval "$("$SWP" unload demo/1.0)"
eval "$("$SWP" unload demo/1.0)"
"#,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let refs = |f: &str| {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(t.p(f)).unwrap()).unwrap();
        v["mounts"][0]["record"]["refs"]
            .as_array()
            .map_or(0, Vec::len)
    };
    assert_eq!(
        (refs("one.json"), refs("two.json"), refs("back.json")),
        (1, 2, 1),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("nothing to unload"), "{}", o.stderr);
    assert_eq!(t.fuse_mounts(), 0);
    let avail = |args: &[&str]| {
        let mut a = vec!["avail"];
        a.extend(args);
        run(t.sw().env("SW_POOL_PATH", t.p("pools")).args(&a))
    };
    let o = avail(&["--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let row = |v: &serde_json::Value, spec: &str| {
        v["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                format!(
                    "{}/{}",
                    r["name"].as_str().unwrap(),
                    r["version"].as_str().unwrap()
                ) == spec
            })
            .cloned()
            .unwrap_or_else(|| panic!("{spec} not in {v}"))
    };
    assert_eq!(row(&v, "demo/1.0")["signed"], false);
    assert_eq!(row(&v, "demo/2.0")["signed"], true);
    // the verified copy stays: avail says it is cached here
    let v: serde_json::Value = serde_json::from_str(&avail(&["--json"]).stdout).unwrap();
    assert_eq!(row(&v, "demo/1.0")["cached"], true);
    let o = avail(&[]);
    assert!(
        o.stdout.contains("demo/1.0")
            && o.stdout.contains("demo/2.0")
            && o.stdout.contains("SIGNED"),
        "{}",
        o.stdout
    );
    // a typo: did you mean
    let o = avail(&["dmeo"]);
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("did you mean one of demo/1.0, demo/2.0"),
        "{}",
        o.stderr
    );
    let o = run(t
        .sw()
        .env("SW_POOL_PATH", t.p("pools"))
        .args(["load", "dmeo/1.0"]));
    assert_ne!(o.code, 0);
    assert!(o.stderr.contains("did you mean demo/1.0?"), "{}", o.stderr);
    let o = run(t.sw().env("SW_POOL_PATH", t.p("pools")).args([
        "mount",
        "demo/3.0",
        t.p("m9").to_str().unwrap(),
    ]));
    assert_ne!(o.code, 0);
    assert!(
        o.stderr.contains("did you mean one of demo/1.0, demo/2.0"),
        "{}",
        o.stderr
    );
}

/// The shell function is exported (bash): a job script run by a plain `bash job.sh > log` from
/// a shell that has it loads into the script's own environment, and the log gets no shell code.
#[test]
fn a_bash_started_from_the_shell_has_the_function() {
    let t = T::new();
    let p = pool(&t, true);
    std::fs::create_dir_all(t.p("pools/demo")).unwrap();
    std::fs::rename(&p, t.p("pools/demo/1.0.sqfs")).unwrap();
    std::fs::write(
        t.p("job.sh"),
        "sw-pool -q load demo/1.0\necho \"MP=$MODULEPATH\"\nsw-pool -q unload demo/1.0\necho \"after=$MODULEPATH\"\n",
    )
    .unwrap();
    let o = bash(
        &t,
        r#"set -e
PATH=$(dirname "$SWP"):$PATH
eval "$(sw-pool shell-init bash)"
bash "$D/job.sh" > "$D/job.log"
"#,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let log = std::fs::read_to_string(t.p("job.log")).unwrap();
    assert!(
        log.contains("MP=") && log.contains("demo/1.0/modulefiles") && !log.contains("export "),
        "{log}{}",
        o.stderr
    );
    assert!(log.contains("after=\n"), "{log}");
    assert_eq!(t.fuse_mounts(), 0);
}
