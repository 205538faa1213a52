//! `sw-pool load` and the calling shell: output that no shell evaluates is refused, one reference
//! per pool per shell, an idempotent unload, `avail` and "did you mean", the exported function, and
//! `list` with a lazy load's chunk server.

mod common;
use common::load_fixture::*;
use common::*;

use std::process::Command;

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
    // a script run through its #! line (its process is named after the script, as a Slurm
    // batch script is `slurm_script`): its shell still evaluates
    let script = t.p("job-script");
    std::fs::write(
        &script,
        "#!/bin/bash\neval \"$(\"$SWP\" -q load demo/1.0)\" && echo \"MP=$MODULEPATH\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = bash(&t, "\"$D/job-script\"");
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("demo/1.0/modulefiles"), "{}", o.stdout);
    let o = bash(&t, "\"$SWP\" -q load --json demo/1.0 > \"$D/report\"");
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = bash(
        &t,
        "SW_POOL_SHELL_FUNCTION=1 \"$SWP\" -q load demo/1.0 > /dev/null",
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // the shell named (the SPANK plugin's broadcast: output on /dev/null): the caller's own
    let o = bash(&t, "\"$SWP\" -q load --shell sh demo/1.0 > /dev/null");
    assert_eq!(o.code, 0, "{}", o.stderr);
    for _ in 0..5 {
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
