//! `sw-pool shell-init SHELL` (issue 32, point 1): the function it prints makes `load`, `unload`
//! and `env` change the calling shell in bash, zsh, fish and csh, and passes every other command
//! through; without it, those commands on a terminal refuse before doing anything and say what to
//! run.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

fn have(shell: &str) -> bool {
    ["/usr/bin", "/bin"]
        .iter()
        .any(|d| Path::new(d).join(shell).exists())
}

/// Run `script` (a file in the shell's syntax) with sw-pool's directory first on PATH.
fn in_shell(shell: &str, script: &str, state: &Path) -> Out {
    let dir = bin().parent().unwrap().to_path_buf();
    let f = state.join(format!("script.{shell}"));
    std::fs::write(&f, script).unwrap();
    let mut c = Command::new(shell);
    if shell == "csh" {
        c.arg("-f");
    }
    c.arg(&f)
        .env("PATH", format!("{}:/usr/bin:/bin", dir.display()))
        .env("SW_POOL_STATE_DIR", state.join("state"))
        .env("SW_POOL_SYSTEM_CONFIG", "")
        .env("SW_POOL_USER_CONFIG", "")
        .env_remove("SW_POOL_SHELL")
        .env_remove("SW_POOL_SHELL_FUNCTION");
    run(&mut c)
}

#[test]
fn the_function_changes_the_calling_shell_in_bash_zsh_fish_and_csh() {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("state")).unwrap();
    std::fs::set_permissions(
        t.path().join("state"),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let posix = r#"eval "$(sw-pool shell-init SHELL)"
export MODULEPATH=/x/demo/1.0/modulefiles:/site
export SW_POOL_LOADED=/x/demo/1.0
sw-pool --log warn env --unload /x/demo/1.0
echo "MP=$MODULEPATH LOADED=${SW_POOL_LOADED-unset}"
sw-pool config | head -1
sw-pool env /var/tmp/no-pool-here; echo "rc=$?"
"#;
    let fish = r#"sw-pool shell-init fish | source
set -gx MODULEPATH /x/demo/1.0/modulefiles:/site
set -gx SW_POOL_LOADED /x/demo/1.0
sw-pool --log warn env --unload /x/demo/1.0
echo "MP=$MODULEPATH LOADED="(set -q SW_POOL_LOADED; and echo $SW_POOL_LOADED; or echo unset)
sw-pool config | head -1
sw-pool env /var/tmp/no-pool-here; echo "rc=$status"
"#;
    let csh = r#"eval "`sw-pool shell-init csh`"
setenv MODULEPATH /x/demo/1.0/modulefiles:/site
setenv SW_POOL_LOADED /x/demo/1.0
sw-pool --log warn env --unload /x/demo/1.0
if ( $?SW_POOL_LOADED ) then
  echo "MP=$MODULEPATH LOADED=$SW_POOL_LOADED"
else
  echo "MP=$MODULEPATH LOADED=unset"
endif
sw-pool config | head -1
sw-pool env /var/tmp/no-pool-here
echo "rc=$status"
"#;
    let mut ran = 0;
    for (shell, script) in [
        ("bash", posix.replace("SHELL", "bash")),
        ("zsh", posix.replace("SHELL", "zsh")),
        ("fish", fish.to_string()),
        ("csh", csh.to_string()),
    ] {
        if !have(shell) {
            skip(&format!("{shell} is not installed"));
            continue;
        }
        ran += 1;
        let o = in_shell(shell, &script, t.path());
        assert!(
            o.stdout.contains("MP=/site LOADED=unset"),
            "{shell}: the unload changed this shell: {}{}",
            o.stdout,
            o.stderr
        );
        assert!(
            o.stdout.contains("format "),
            "{shell}: config passes through: {}",
            o.stdout
        );
        assert!(
            o.stdout.contains("rc=3") && o.stderr.contains("no pool is mounted"),
            "{shell}: a failing env keeps its status and message: {}{}",
            o.stdout,
            o.stderr
        );
    }
    assert!(ran >= 1, "no shell to test in");
}

#[test]
fn on_a_terminal_without_the_function_load_unload_env_say_what_to_run() {
    if !have("script") {
        skip("script(1) is not installed (util-linux)");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    for (shell, want_eval, want_once) in [
        (
            "/bin/bash",
            r#"eval "$(sw-pool env --unload /x)""#,
            r#"eval "$(sw-pool shell-init bash)""#,
        ),
        (
            "/usr/bin/fish",
            "sw-pool env --unload /x | source",
            "sw-pool shell-init fish | source",
        ),
    ] {
        // a pseudo-terminal as stdout (script), no shell function
        let mut c = Command::new("script");
        c.args(["-qec"])
            .arg(format!("{} env --unload /x", bin().display()))
            .arg("/dev/null")
            .env("SHELL", shell)
            .env("SW_POOL_STATE_DIR", t.path())
            .env_remove("SW_POOL_SHELL_FUNCTION")
            .env("SW_POOL_SYSTEM_CONFIG", "")
            .env("SW_POOL_USER_CONFIG", "");
        let o = run(&mut c);
        assert_eq!(o.code, 2, "{shell}: {}{}", o.stdout, o.stderr);
        let all = format!("{}{}", o.stdout, o.stderr);
        assert!(
            all.contains(want_eval) && all.contains(want_once) && all.contains("nothing was done"),
            "{shell}: {all}"
        );
    }
    // under a launcher (Open MPI forwards a rank's stdout through a pseudo-terminal) the output
    // goes back to whoever started the job: never refused (the paper's `mpirun sw-pool -v load`)
    for var in ["OMPI_COMM_WORLD_SIZE", "SLURM_STEP_ID"] {
        let mut c = Command::new("script");
        c.args(["-qec"])
            .arg(format!("{} env --unload /x", bin().display()))
            .arg("/dev/null")
            .env(var, "1")
            .env("SW_POOL_STATE_DIR", t.path())
            .env_remove("SW_POOL_SHELL_FUNCTION")
            .env("SW_POOL_SYSTEM_CONFIG", "")
            .env("SW_POOL_USER_CONFIG", "");
        let o = run(&mut c);
        assert_eq!(o.code, 0, "{var}: {}{}", o.stdout, o.stderr);
    }
    // on a pipe (what eval and the function read) it prints the code as always
    let o = run(sw()
        .args(["env", "--unload", "/x/demo/1.0"])
        .env("SW_POOL_SHELL", "sh")
        .env("MODULEPATH", "/x/demo/1.0/modulefiles:/site")
        .env("SW_POOL_LOADED", "/x/demo/1.0")
        .env("SW_POOL_STATE_DIR", t.path()));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("MODULEPATH='/site'"), "{}", o.stdout);
}

#[test]
fn shell_init_prints_the_installed_function() {
    let o = sw_run(&["shell-init", "bash"]);
    assert_eq!(o.code, 0);
    let installed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../etc/profile.d/sw-pool.sh"),
    )
    .unwrap();
    assert_eq!(o.stdout, installed);
    assert!(o.stdout.contains("SW_POOL_SHELL_FUNCTION=1"));
    let o = sw_run(&["shell-init", "nushell"]);
    assert_eq!(o.code, 2, "{}", o.stderr);
}
