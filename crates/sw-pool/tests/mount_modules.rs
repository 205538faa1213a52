//! `sw-pool env`, the profile function and the pool modulefiles with the real Lmod and Environment
//! Modules (the fixture: `common/mount_fixture.rs`).

mod common;
use common::cases::*;
use common::mount_fixture::*;
use common::*;

use std::path::Path;
use std::process::Command;

/// The module system a test drives: Lmod, or Environment Modules 5.2 (Tcl, the package unpacked
/// by `make setup` beside Lmod, which it conflicts with).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Modules {
    Lmod,
    Tcl,
}

impl Modules {
    fn init(self) -> String {
        match self {
            Modules::Lmod => format!("source {LMOD_INIT}"),
            Modules::Tcl => envmod_init(),
        }
    }
    /// The pool modulefile template and the name it is installed under for version `v`.
    fn pool_modulefile(self, v: &str) -> (&'static str, String) {
        match self {
            Modules::Lmod => ("etc/lmod/pool-modulefile.lua", format!("{v}.lua")),
            Modules::Tcl => ("etc/modules/pool-modulefile.tcl", v.to_string()),
        }
    }
}

fn modules(m: Modules, script: &str, t: &T, env: &[(&str, String)]) -> Out {
    let dir = bin().parent().unwrap().to_path_buf();
    let mut c = Command::new("bash");
    c.arg("-c").arg(format!(
        "set -e; {}; export MODULEPATH={}; {script}",
        m.init(),
        t.s("mf")
    ));
    c.env(
        "PATH",
        format!("{}:{}", dir.display(), std::env::var("PATH").unwrap()),
    )
    .env("SW_POOL_STATE_DIR", t.state())
    .env("SW_POOL_SYSTEM_CONFIG", "")
    .env("SW_POOL_USER_CONFIG", "")
    .env_remove("SW_POOL_MOUNT")
    .env_remove("GWDG_SW_MOUNT")
    .env_remove("SW_POOL_LOADED")
    .env_remove("SLURM_JOB_ID")
    .env_remove("LMOD_CMD")
    .env_remove("LOADEDMODULES")
    .env_remove("_LMFILES_");
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

#[test]
fn env_output_and_profile_function_drive_real_lmod() {
    env_output_and_profile_function(Modules::Lmod);
}

#[test]
fn env_output_and_profile_function_drive_environment_modules() {
    env_output_and_profile_function(Modules::Tcl);
}

fn env_output_and_profile_function(m: Modules) {
    if !need_root() {
        return;
    }
    let t = T::new();
    t.mkdir("mf");
    let tree = t.p("tree");
    sample_tree(&tree);
    std::fs::create_dir_all(t.p("pools/demo")).unwrap();
    let o = sw_run(&[
        "build",
        "-q",
        "--gen-modulefiles",
        &t.s("pools/demo/1.0.sqfs"),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../etc/profile.d/sw-pool.sh");
    let env = [("SW_POOL_PATH", t.s("pools")), ("SW_POOL_MOUNT", t.s("m"))];
    // mount by name/version at $SW_POOL_MOUNT/demo/1.0; the function evals `sw-pool env`
    let o = modules(
        m,
        &format!(
            r#"source {}
mp=$(sw-pool mount --print-mountpoint demo/1.0)
unset SW_POOL_MOUNT
sw-pool env "$mp"
echo "MP=$MODULEPATH"; echo "SPM=$SW_POOL_MOUNT"; echo "GW=$GWDG_SW_MOUNT"
module avail 2>&1
module load hello/1.0 cfact/2.0; hello; cfact 5
module purge
sw-pool env --unload "$mp"
echo "AFTER=$MODULEPATH|${{SW_POOL_MOUNT-unset}}|${{GWDG_SW_MOUNT-unset}}|${{SW_POOL_LOADED-unset}}"
sw-pool umount "$mp"
"#,
            profile.display()
        ),
        &t,
        &env,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let root = std::fs::canonicalize(t.p("m")).unwrap();
    assert_contains_all(
        &o.stdout,
        &[
            &format!("MP={}/demo/1.0/modulefiles:{}", root.display(), t.s("mf")),
            &format!("SPM={}\n", root.display()),
            &format!("GW={}\n", root.display()),
            "hello/1.0",
            "cfact/2.0",
            "hello from",
            "\n120\n",
            &format!("AFTER={}|unset|unset|unset", t.s("mf")),
        ],
        "",
    );
    t.assert_clean();
}

#[test]
fn pool_modulefile_mounts_on_load_and_releases_on_unload() {
    pool_modulefile(Modules::Lmod);
}

#[test]
fn tcl_pool_modulefile_mounts_on_load_and_releases_on_unload() {
    pool_modulefile(Modules::Tcl);
}

fn pool_modulefile(m: Modules) {
    if !need_root() {
        return;
    }
    let t = T::new();
    t.mkdir("mf/pool/demo");
    let tree = t.p("tree");
    sample_tree(&tree);
    std::fs::create_dir_all(t.p("pools")).unwrap();
    let o = sw_run(&[
        "build",
        "-q",
        "--gen-modulefiles",
        &t.s("pools/demo-1.0.sqfs"),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let (template, name) = m.pool_modulefile("1.0");
    let template = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(template);
    std::os::unix::fs::symlink(
        std::fs::canonicalize(template).unwrap(),
        t.p(&format!("mf/pool/demo/{name}")),
    )
    .unwrap();
    let env = [("SW_POOL_PATH", t.s("pools")), ("SW_POOL_MOUNT", t.s("m"))];
    let spider = match m {
        Modules::Lmod => "module spider cfact 2>&1 | head -20",
        Modules::Tcl => "true",
    };
    let o = modules(
        m,
        &format!(
            r#"module load pool/demo/1.0
echo "MP=$MODULEPATH"
sw-pool list
module avail 2>&1
module load cfact/2.0; cfact 6
{spider}
module load pool/demo/1.0
module unload pool/demo/1.0
echo "AFTER=$MODULEPATH"
sw-pool list
module load nope/1 2>&1 || echo "missing module fails"
"#
        ),
        &t,
        &env,
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let root = std::fs::canonicalize(t.p("m")).unwrap();
    assert_contains_all(
        &o.stdout,
        &[
            &format!("MP={}/demo/1.0/modulefiles:", root.display()),
            "demo/1.0",
            "hello/1.0",
            "\n720\n",
            &format!("AFTER={}\n", t.s("mf")),
        ],
        "",
    );
    // the warning about the unsigned pool reaches the user through the module (issue 32, point 8)
    // (Lmod wraps the message at the terminal's width)
    let said = o.stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        said.contains("is unsigned; nothing vouches for its content"),
        "{}",
        o.stderr
    );
    let after = o.stdout.split("AFTER=").nth(1).unwrap_or_default();
    assert!(
        !after.contains(&format!("{}/demo/1.0", root.display())),
        "still listed after unload: {after}"
    );
    // a pool that cannot be mounted is a module error, with sw-pool's reason, and changes nothing
    std::fs::create_dir_all(t.p("mf/pool/ghost")).unwrap();
    std::os::unix::fs::symlink(
        t.p(&format!("mf/pool/demo/{name}")),
        t.p(&format!("mf/pool/ghost/{}", m.pool_modulefile("9").1)),
    )
    .unwrap();
    let o = modules(
        m,
        "module load pool/ghost/9 2>&1 || echo \"FAILED MP=$MODULEPATH\"",
        &t,
        &env,
    );
    assert_contains_all(
        &o.stdout,
        &["no such pool", &format!("FAILED MP={}\n", t.s("mf"))],
        &o.stderr,
    );
    t.assert_clean();
}

#[test]
fn profile_function_evals_in_bash_and_zsh_and_passes_other_commands_through() {
    let t = T::new();
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../etc/profile.d/sw-pool.sh");
    let dir = bin().parent().unwrap().to_path_buf();
    each_case(
        &["bash", "zsh"],
        |sh| sh.to_string(),
        |&sh| {
            let mut c = Command::new(sh);
            c.arg("-c")
                .arg(format!(
                    r#"source {}
export MODULEPATH=/x/demo/1.0/modulefiles:/site
export SW_POOL_LOADED=/x/demo/1.0
sw-pool --log warn env --unload /x/demo/1.0
echo "MP=$MODULEPATH LOADED=${{SW_POOL_LOADED-unset}}"
sw-pool env --unload --json /x 2>/dev/null; echo "json-rc=$?"
sw-pool list | head -1
sw-pool env /var/tmp/no-pool-here; echo "rc=$?"
"#,
                    profile.display()
                ))
                .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
                .env("SW_POOL_STATE_DIR", t.state())
                .env("SW_POOL_SYSTEM_CONFIG", "")
                .env("SW_POOL_USER_CONFIG", "");
            let o = run(&mut c);
            assert!(
                o.stdout.contains("MP=/site LOADED=unset"),
                "{sh}: {}{}",
                o.stdout,
                o.stderr
            );
            assert!(
                o.stdout.contains("json-rc=2"),
                "{sh}: --json is not evaluated: {}",
                o.stdout
            );
            // (other tests running in parallel may have mounts of their own)
            assert!(
                o.stdout.contains("no mounts on") || o.stdout.contains("STATUS"),
                "{sh}: list passes through: {}",
                o.stdout
            );
            assert!(
                o.stdout.contains("rc=3") && o.stderr.contains("no pool is mounted"),
                "{sh}: {}{}",
                o.stdout,
                o.stderr
            );
        },
    );
}

#[test]
fn unload_refuses_under_loaded_modules_in_lmod_and_environment_modules() {
    unload_under_loaded_modules(Modules::Lmod);
    unload_under_loaded_modules(Modules::Tcl);
}

/// Issue 32, point 2: `sw-pool unload` (and `env --unload`) of a pool whose modules are loaded in
/// the shell refuses, naming them, and changes nothing; once they are unloaded it goes through
/// and says it unmounted the last reference.
fn unload_under_loaded_modules(m: Modules) {
    if !need_root() {
        return;
    }
    let t = T::new();
    let tree = t.p("tree");
    sample_tree(&tree);
    std::fs::create_dir_all(t.p("pools/demo")).unwrap();
    std::fs::create_dir_all(t.p("cache")).unwrap();
    let o = sw_run(&[
        "build",
        "-q",
        "--gen-modulefiles",
        &t.s("pools/demo/1.0.sqfs"),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../etc/profile.d/sw-pool.sh");
    let env = [
        ("SW_POOL_PATH", t.s("pools")),
        ("SW_POOL_MOUNT", t.s("m")),
        ("SW_POOL_CACHE", t.s("cache")),
    ];
    let o = modules(
        m,
        &format!(
            r#"source {}
set +e
sw-pool load demo/1.0
module load hello/1.0
mp=${{MODULEPATH%%/modulefiles*}}
sw-pool unload demo/1.0; echo "rc=$?"
sw-pool env --unload "$mp"; echo "env-rc=$?"
hello
echo "MOUNTED=$(awk -v m="$mp" '$2 == m' /proc/self/mounts | wc -l)"
module unload hello/1.0
sw-pool unload demo/1.0; echo "rc2=$?"
echo "AFTER=$MODULEPATH MOUNTED=$(awk -v m="$mp" '$2 == m' /proc/self/mounts | wc -l)"
"#,
            profile.display()
        ),
        &t,
        &env,
    );
    assert_contains_all(
        &o.stdout,
        &[
            "rc=3\n",
            "env-rc=3\n",
            "hello from",
            "MOUNTED=1\n",
            "rc2=0\n",
            &format!("AFTER={} MOUNTED=0", t.s("mf")),
        ],
        &o.stderr,
    );
    assert_contains_all(
        &o.stderr,
        &[
            "module(s) hello/1.0 from",
            "(`module unload hello/1.0`); nothing was unloaded",
            "unloaded demo/1.0: that was the last reference",
        ],
        &o.stdout,
    );
    t.assert_clean();
}

/// Issue 32, point 6: `env` and `umount` take NAME/VERSION like `mount`, `load` and `unload`.
#[test]
fn env_and_umount_take_name_version() {
    if !need_root() {
        return;
    }
    let t = T::new();
    let tree = t.p("tree");
    sample_tree(&tree);
    std::fs::create_dir_all(t.p("pools/demo")).unwrap();
    let o = sw_run(&[
        "build",
        "-q",
        "--gen-modulefiles",
        &t.s("pools/demo/1.0.sqfs"),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = modules(
        Modules::Lmod,
        r#"set +e
mp=$(sw-pool mount --print-mountpoint demo/1.0)
sw-pool env --shell sh demo/1.0 | grep -c "MODULEPATH='$mp/modulefiles"
sw-pool umount demo/1.0; echo "umount-rc=$?"
echo "MOUNTED=$(awk -v m="$mp" '$2 == m' /proc/self/mounts | wc -l)"
sw-pool umount nopool/9.9; echo "missing-rc=$?"
"#,
        &t,
        &[("SW_POOL_PATH", t.s("pools")), ("SW_POOL_MOUNT", t.s("m"))],
    );
    assert_contains_all(
        &o.stdout,
        &["1\n", "umount-rc=0\n", "MOUNTED=0\n", "missing-rc=3\n"],
        &o.stderr,
    );
    assert!(
        o.stderr.contains("nopool/9.9 is not loaded"),
        "{}",
        o.stderr
    );
    t.assert_clean();
}
