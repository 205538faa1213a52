//! `init`, `modulefiles`, `inspect`, `config`, multi-call names, man pages and completions.

mod common;
use common::*;

#[test]
fn init_modulefiles_build_inspect() {
    let d = scratch();
    let tree = d.path().join("demo");
    sample_tree(&tree);
    // init refuses a non-empty directory
    let o = sw_run(&[
        "init",
        "--name",
        "x",
        "--version",
        "1",
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("not empty"), "{}", o.stderr);
    // build without modulefiles warns that packages will not show in module avail
    let pool = d.path().join("demo.sqfs");
    let o = sw_run(&["build", pool.to_str().unwrap(), tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("hello/1.0 has no modulefile"),
        "{}",
        o.stderr
    );
    // modulefiles writes the two missing ones, then nothing
    let o = sw_run(&["modulefiles", tree.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("modulefiles/hello/1.0.lua")
            && o.stdout.contains("modulefiles/cfact/2.0.lua"),
        "{}",
        o.stdout
    );
    let lua = std::fs::read_to_string(tree.join("modulefiles/cfact/2.0.lua")).unwrap();
    assert!(
        lua.contains("MANPATH")
            && lua.contains("SW_POOL_MOUNT")
            && !lua.contains("LD_LIBRARY_PATH")
    );
    assert!(sw_run(&["modulefiles", tree.to_str().unwrap()])
        .stdout
        .contains("already"));
    let o = sw_run(&[
        "build",
        "--force",
        "-v",
        pool.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains("warning"), "{}", o.stderr);
    assert!(o.stdout.contains("timings: scan"), "{}", o.stdout);
    let o = sw_run(&["inspect", pool.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for s in [
        "demo/1.0",
        "squashfs",
        "hello/1.0",
        "cfact/2.0",
        "check     ok",
    ] {
        assert!(o.stdout.contains(s), "{s}: {}", o.stdout);
    }
    let j: serde_json::Value =
        serde_json::from_str(&sw_run(&["inspect", "--json", pool.to_str().unwrap()]).stdout)
            .unwrap();
    assert_eq!(j["manifest"]["packages"].as_array().unwrap().len(), 2);
    assert_eq!(j["manifest"]["name"], "demo");
    // --name/--version override pool.toml
    let o = sw_run(&[
        "build",
        "--name",
        "other",
        "--version",
        "2",
        d.path().join("o.sqfs").to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("other/2"), "{}", o.stdout);
    let o = sw_run(&[
        "build",
        "--name",
        "bad/name",
        d.path().join("p.sqfs").to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("bad/name"), "{}", o.stderr);
}

#[test]
fn inspect_rejects_what_is_not_a_pool() {
    let d = scratch();
    let f = d.path().join("random.bin");
    std::fs::write(&f, vec![9u8; 100_000]).unwrap();
    let o = sw_run(&["inspect", f.to_str().unwrap()]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("random.bin") && o.stderr.contains("not a sw-pool pool"),
        "{}",
        o.stderr
    );
    // a bare image is named as such
    let img = d.path().join("bare.ext4");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let st = std::process::Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4"])
        .arg(&img)
        .status()
        .unwrap();
    assert!(st.success());
    let o = sw_run(&["inspect", img.to_str().unwrap()]);
    assert_eq!(o.code, 4);
    assert!(
        o.stderr
            .contains("starts like a ext4 image but has no sw-pool trailer"),
        "{}",
        o.stderr
    );
    // a pool truncated by one byte, one with bytes appended, a damaged manifest, a damaged superblock
    let tree = d.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("f"), vec![1u8; 200_000]).unwrap();
    let pool = d.path().join("p.ext4");
    assert_eq!(
        sw_run(&["build", pool.to_str().unwrap(), tree.to_str().unwrap()]).code,
        0
    );
    let good = std::fs::read(&pool).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", good[..good.len() - 1].to_vec(), "truncated"),
        (
            "appended",
            [good.clone(), b"x".to_vec()].concat(),
            "1 bytes were appended",
        ),
        (
            "manifest",
            {
                let mut v = good.clone();
                let n = v.len();
                v[n - 200] ^= 0x20; // inside the manifest JSON
                v
            },
            "damaged",
        ),
        (
            "superblock",
            {
                let mut v = good.clone();
                v[1024 + 56] = 0; // ext magic
                v
            },
            "manifest says ext4",
        ),
    ];
    for (what, bytes, needle) in cases {
        let p = d.path().join(format!("{what}.ext4"));
        std::fs::write(&p, bytes).unwrap();
        let o = sw_run(&["inspect", p.to_str().unwrap()]);
        assert_eq!(o.code, 4, "{what}: {}", o.stderr);
        assert!(o.stderr.contains(needle), "{what}: {}", o.stderr);
    }
    // file-system damage behind a valid manifest is caught by the consistency check
    let mut v = good.clone();
    for b in &mut v[4096..4096 * 3] {
        *b ^= 0xff; // group descriptors
    }
    let p = d.path().join("fsdamage.ext4");
    std::fs::write(&p, v).unwrap();
    let o = sw_run(&["inspect", p.to_str().unwrap()]);
    assert_eq!(o.code, 4, "{}", o.stderr);
    assert!(
        o.stderr.contains("file-system check failed"),
        "{}",
        o.stderr
    );
}

/// The row of `key` in `sw-pool config --json`'s settings.
fn setting(config: &serde_json::Value, key: &str) -> serde_json::Value {
    config["settings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap()
        .clone()
}

#[test]
fn config_precedence_and_errors() {
    let d = scratch();
    let sys = d.path().join("sys.toml");
    let user = d.path().join("user.toml");
    std::fs::write(&sys, "format = \"ext4\"\nchunk_size = \"1MiB\"\n").unwrap();
    std::fs::write(&user, "chunk_size = 65536\n").unwrap();
    let o = run(sw()
        .env("SW_POOL_SYSTEM_CONFIG", &sys)
        .env("SW_POOL_USER_CONFIG", &user)
        .env("SW_POOL_PATH", "/a:/b")
        .args(["config", "--json"]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let get = |k: &str| setting(&j, k);
    assert_eq!(get("format")["value"], "ext4");
    assert_eq!(get("format")["origin"], sys.to_str().unwrap());
    assert_eq!(get("chunk_size")["value"], "65536");
    assert_eq!(get("pool_path")["origin"], "$SW_POOL_PATH");
    // the configured format is used when OUT's extension names none; a flag beats it
    let tree = d.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("f"), b"x").unwrap();
    let out = d.path().join("pool.img");
    let o = run(sw().env("SW_POOL_SYSTEM_CONFIG", &sys).args([
        "build",
        out.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]));
    assert!(o.stdout.contains("ext4 pool"), "{} {}", o.stdout, o.stderr);
    let o = run(sw().env("SW_POOL_CHUNK_SIZE", "3000").args(["config"]));
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("SW_POOL_CHUNK_SIZE"), "{}", o.stderr);
    std::fs::write(&user, "colour = 1\n").unwrap();
    let o = run(sw().env("SW_POOL_USER_CONFIG", &user).args(["config"]));
    assert_eq!(o.code, 3);
    assert!(
        o.stderr.contains("user.toml") && o.stderr.contains("colour"),
        "{}",
        o.stderr
    );
}

#[test]
fn multicall_names_and_generated_docs() {
    let d = scratch();
    for (name, sub) in [("scalable-fs-cp", "cp"), ("scalable-fs-mount", "mount")] {
        let link = d.path().join(name);
        std::os::unix::fs::symlink(bin(), &link).unwrap();
        let o = run(std::process::Command::new(&link).arg("--help"));
        assert_eq!(o.code, 0);
        assert!(o.stdout.contains(&format!("sw-pool {sub}")), "{}", o.stdout);
        let o = run(std::process::Command::new(&link)
            .args(["a", "b"])
            .env("SW_POOL_SYSTEM_CONFIG", "")
            .env("SW_POOL_USER_CONFIG", ""));
        assert_ne!(
            o.code, 0,
            "{name} must fail until it is implemented, or succeed only for real"
        );
    }
    let man = d.path().join("man");
    let o = sw_run(&["generate", "man", man.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(man.join("sw-pool.1").exists() && man.join("sw-pool-build.1").exists());
    // the exit table under its own section (not clap_mangen's "EXTRA"); groff reads every page
    // without a warning on its ASCII device (no `special character 'u2026'`)
    let top = std::fs::read_to_string(man.join("sw-pool.1")).unwrap();
    assert!(top.contains(".SH \"EXIT STATUS\"\n"), "{top}");
    let have_groff = std::process::Command::new("groff")
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success());
    for e in std::fs::read_dir(&man).unwrap() {
        let page = e.unwrap().path();
        let text = std::fs::read_to_string(&page).unwrap();
        assert!(!text.contains(".SH EXTRA"), "{}", page.display());
        if have_groff {
            let o = run(std::process::Command::new("groff")
                .args(["-ww", "-man", "-Tascii", "-z"])
                .arg(&page)
                .env("LC_ALL", "C"));
            assert!(o.stderr.is_empty(), "{}: {}", page.display(), o.stderr);
        }
    }
    let o = sw_run(&["generate", "completions", "bash"]);
    assert!(o.stdout.contains("sw-pool") && o.stdout.contains("build"));
    let o = sw_run(&["--help"]);
    assert!(o.stdout.contains("EXIT STATUS"));
}

#[test]
fn config_shows_every_environment_variable() {
    let d = scratch();
    let o = run(sw()
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env("SW_POOL_STATE_DIR", d.path())
        .env_remove("SW_POOL_SHELL")
        .args(["config", "--json"]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let vars = j["environment"].as_array().unwrap();
    let get = |k: &str| vars.iter().find(|r| r["name"] == k).unwrap().clone();
    let st = get("SW_POOL_STATE_DIR");
    assert_eq!(st["value"], d.path().to_str().unwrap());
    assert_eq!(st["origin"], "$SW_POOL_STATE_DIR");
    assert_eq!(get("SW_POOL_SHELL")["origin"], "unset");
    // the benchmark and test switches, and what sw-pool sets for itself, only with --all
    // (issue 32, point 6: only user-facing variables)
    for k in [
        "SW_POOL_BENCH_NO_VERIFY",
        "SW_POOL_FAKE_NODES",
        "SW_POOL_LOADED",
    ] {
        assert!(
            vars.iter().all(|r| r["name"] != k),
            "{k} shown without --all"
        );
    }
    let o = run(sw()
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .args(["config", "--all", "--json"]));
    let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let all = j["environment"].as_array().unwrap().clone();
    let get = |k: &str| all.iter().find(|r| r["name"] == k).unwrap().clone();
    for k in [
        "SW_POOL_BENCH_NO_VERIFY",
        "SW_POOL_FAKE_NODES",
        "SW_POOL_CP_ALGORITHM",
    ] {
        assert_eq!(get(k)["kind"], "test switch", "{k}");
    }
    assert_eq!(get("SW_POOL_LOADED")["kind"], "state");
    // the table on stdout names every one with --all, and only the user's without
    let table = |all: bool| {
        let mut c = sw();
        c.env("SW_POOL_SYSTEM_CONFIG", "")
            .env("SW_POOL_USER_CONFIG", "")
            .arg("config");
        if all {
            c.arg("--all");
        }
        run(&mut c).stdout
    };
    let (short, long) = (table(false), table(true));
    for v in &all {
        let name = v["name"].as_str().unwrap();
        assert!(long.contains(name), "{long}");
        let users = matches!(v["kind"].as_str(), Some("setting" | "file" | "option"));
        assert_eq!(
            short.contains(&format!("{name} ")),
            users,
            "{name}: {short}"
        );
    }
}

/// Issue 32, point 6: `config` shows the cache and mount directories this user gets on this
/// node, not the rule that picks them.
#[test]
fn config_shows_the_real_directories() {
    let d = scratch();
    let uid = rustix::process::geteuid().as_raw();
    let o = run(sw()
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env_remove("LOCAL_TMPDIR")
        .env_remove("SW_POOL_CACHE")
        .env("TMPDIR", d.path())
        .env("SW_POOL_MOUNT", d.path().join("mnt"))
        .args(["config", "--json"]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let get = |k: &str| setting(&j, k);
    let want = d.path().join(format!("sw-pool-{uid}")).join("cache");
    assert_eq!(get("cache_dir")["value"], want.to_str().unwrap());
    assert_eq!(get("cache_dir")["origin"], "default: $TMPDIR");
    assert_eq!(
        get("mount_dir")["value"],
        d.path().join("mnt").to_str().unwrap()
    );
    assert_eq!(get("mount_dir")["origin"], "$SW_POOL_MOUNT");
    assert!(!get("layer_dir")["value"].as_str().unwrap().starts_with('('));
}

/// Issue 32, point 6: `init DIR` names the pool after DIR when --name is absent.
#[test]
fn init_takes_the_name_from_the_directory() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("mypool");
    let o = sw_run(&["init", "--version", "2.1", dir.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("for mypool/2.1"), "{}", o.stdout);
    let toml = std::fs::read_to_string(dir.join("pool.toml")).unwrap();
    assert!(toml.contains("name = \"mypool\""), "{toml}");
    let o = sw_run(&["init", "--version", "1", "/"]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stderr.contains("give --name"), "{}", o.stderr);
}
