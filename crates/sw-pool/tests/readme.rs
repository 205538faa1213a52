//! Issue 32, point 5: every shell example of the README is run by a test. Each ```sh block is
//! preceded by `<!-- example: KIND -->`:
//!
//! - `quickstart`: run here first, and verbatim as a new unprivileged user after the package is
//!   installed (`tests/deb/run.sh`);
//! - `session`: run here after the quick start, in README order, in the same shell (one tutorial
//!   session: later blocks use what earlier ones made), including a job script run by a non-login
//!   `bash job.sh > job.log`;
//! - `paper`, `job`, `job-layer`: run on the virtual cluster (`tests/cluster/t_70_readme.sh`; the
//!   job blocks as batch scripts on 4 nodes).
//!
//! The session runs as root in a private mount namespace (`unshare -m`), with a scratch `HOME` and
//! working directory and a tmpfs on `/etc/sw-pool`, so that the admin examples (a key installed into
//! `/etc/sw-pool/trusted-keys`) change nothing on the machine.

mod common;
use common::mount_fixture::*;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Lazily unmount every FUSE mount in this mount namespace (mountinfo's mount point, octal
/// escapes undone), deepest first.
const DETACH_HOST_FUSE: &str = r#"awk '/ - fuse/ { print $5 }' /proc/self/mountinfo | sort -r |
  while read -r m; do umount -l "$(printf '%b' "$m")" 2>/dev/null || true; done
"#;

const KINDS: &[&str] = &["quickstart", "session", "paper", "job", "job-layer"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README's shell examples: `(kind, code)` in order; a block without a marker has kind "".
fn examples() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        if l.starts_with("```sh") || l.starts_with("```bash") || l.starts_with("```console") {
            let kind = i
                .checked_sub(1)
                .map(|p| lines[p].trim())
                .and_then(|p| p.strip_prefix("<!-- example:"))
                .and_then(|p| p.strip_suffix("-->"))
                .map(|k| k.trim().to_string())
                .unwrap_or_default();
            let mut code = String::new();
            i += 1;
            while i < lines.len() && !lines[i].trim_start().starts_with("```") {
                code.push_str(lines[i]);
                code.push('\n');
                i += 1;
            }
            out.push((kind, code));
        }
        i += 1;
    }
    out
}

#[test]
fn every_shell_example_is_run_by_a_test() {
    let ex = examples();
    assert!(ex.len() >= 5, "{ex:?}");
    for (kind, code) in &ex {
        assert!(
            KINDS.contains(&kind.as_str()),
            "a README shell example without `<!-- example: KIND -->` (one of {KINDS:?}), so no test runs it:\n{code}"
        );
    }
    assert_eq!(ex.iter().filter(|(k, _)| k == "quickstart").count(), 1);
    // the tests that run the other kinds extract them from the README by these markers
    let deb = std::fs::read_to_string(repo().join("tests/deb/run.sh")).unwrap();
    assert!(
        deb.contains("readme-example quickstart"),
        "tests/deb/run.sh"
    );
    let cluster = std::fs::read_to_string(repo().join("tests/cluster/t_70_readme.sh")).unwrap();
    for (kind, how) in [
        ("paper", "readme-example\" paper"),
        ("job", "job_from_readme job "),
        ("job-layer", "job_from_readme job-layer "),
    ] {
        assert!(cluster.contains(how), "t_70_readme.sh runs {kind} ({how})");
    }
    // tools/readme-example prints a block by kind: the same parse as here
    let o = run(Command::new("bash")
        .arg(repo().join("tools/readme-example"))
        .arg("quickstart"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let quick = &ex.iter().find(|(k, _)| k == "quickstart").unwrap().1;
    assert_eq!(&o.stdout, quick);
}

/// A real .deb at `out`: package `hello-deb`, one program `/usr/bin/hello-deb`.
/// A conda environment at `env`: `conda-meta/python-*.json` naming `bin/python3.X`, this machine's
/// python3 copied there (the README block only builds it; tests/pyenv.rs runs conda pools).
fn make_conda_env(env: &Path) {
    let o = std::process::Command::new("python3")
        .args([
            "-c",
            "import sys; print('%d.%d.%d' % sys.version_info[:3]); print(sys.executable)",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let mut l = out.lines();
    let (ver, exe) = (l.next().unwrap().to_string(), l.next().unwrap().to_string());
    let xy = ver.rsplit_once('.').unwrap().0.to_string();
    std::fs::create_dir_all(env.join("bin")).unwrap();
    std::fs::create_dir_all(env.join("conda-meta")).unwrap();
    std::fs::copy(
        std::fs::canonicalize(exe).unwrap(),
        env.join(format!("bin/python{xy}")),
    )
    .unwrap();
    std::os::unix::fs::symlink(format!("python{xy}"), env.join("bin/python")).unwrap();
    let rel = format!("bin/python{xy}");
    std::fs::write(
        env.join(format!("conda-meta/python-{ver}-0.json")),
        format!(
            r#"{{"name":"python","version":"{ver}","build":"0","files":["{rel}"],"paths_data":{{"paths_version":1,"paths":[{{"_path":"{rel}","path_type":"hardlink"}}]}}}}"#
        ),
    )
    .unwrap();
}

fn make_deb(t: &T, out: &str) {
    let root = t.d.path().join("deb-root");
    std::fs::create_dir_all(root.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::write(
        root.join("DEBIAN/control"),
        "Package: hello-deb\nVersion: 1.0\nArchitecture: all\nMaintainer: sw-pool tests <tests@localhost>\nDescription: a program installed into a layer by the README's example\n",
    )
    .unwrap();
    let prog = root.join("usr/bin/hello-deb");
    std::fs::write(
        &prog,
        "#!/bin/sh\necho 'Hello from a package in the layer'\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&root)
        .arg(out));
    assert_eq!(o.code, 0, "dpkg-deb --build: {}", o.stderr);
}

/// Puts a tmpfs on `/etc/sw-pool` inside the test's mount namespace; creates the directory if the
/// machine has none, and removes it again.
struct EtcDir {
    made: bool,
}

impl Drop for EtcDir {
    fn drop(&mut self) {
        if self.made {
            let _ = std::fs::remove_dir("/etc/sw-pool");
        }
    }
}

#[test]
fn the_quick_start_and_the_session_run_as_written() {
    if !need_root() {
        return;
    }
    for tool in ["unshare", "fuse-overlayfs", "dpkg-deb"] {
        if !Path::new("/usr/bin").join(tool).exists() {
            skip(&format!("{tool} is not installed"));
            return;
        }
    }
    let t = T::new();
    let work = t.mkdir("work");
    let home = t.mkdir("home");
    // the package the `--root` block installs into a layer: pkg.deb, package hello-deb
    make_deb(&t, &format!("{work}/pkg.deb"));
    // the conda environment the Python block builds with `--env-prefix`: conda's own layout
    // (conda-meta/, its interpreter in bin/), made by hand as no conda can be installed here
    make_conda_env(Path::new(&format!("{home}/conda/envs/sci")));
    let etc = EtcDir {
        made: std::fs::create_dir("/etc/sw-pool").is_ok(),
    };
    // The namespace starts with a copy of the host's mounts: the FUSE mounts of other work on this
    // machine (a benchmark's servers, another test) would be "everything of yours" to the
    // session's `cleanup --all --kill` as root. Detach those copies first; with private
    // propagation this changes nothing outside the namespace.
    let mut script = String::from(DETACH_HOST_FUSE);
    script.push_str(
        "set -euo pipefail\n\
         mount -t tmpfs -o mode=0755 sw-pool-readme /etc/sw-pool\n\
         source /usr/share/lmod/lmod/init/bash\n\
         eval \"$(sw-pool shell-init bash)\"\n",
    );
    script.push_str(&format!("cd {work}\n"));
    let ex = examples();
    let quick = ex.iter().filter(|(k, _)| k == "quickstart");
    let session = ex.iter().filter(|(k, _)| k == "session");
    for (i, (kind, code)) in quick.chain(session).enumerate() {
        script.push_str(&format!(
            "echo '=== README example {i} ({kind})' >&2\n{code}"
        ));
    }
    script.push_str("echo README-SESSION-DONE\n");
    let dir = bin().parent().unwrap().to_path_buf();
    let mut c = Command::new("unshare");
    c.args(["--mount", "--propagation", "private", "bash", "-c", &script]);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("SW_POOL_")
            || k.starts_with("XDG_")
            || k.starts_with("SLURM_")
            || ["MODULEPATH", "LOADEDMODULES", "_LMFILES_", "LMOD_CMD"].contains(&k.as_str())
        {
            c.env_remove(&k);
        }
    }
    c.env("HOME", &home)
        .env(
            "PATH",
            format!("{}:{}", dir.display(), std::env::var("PATH").unwrap()),
        )
        .env("TMPDIR", t.d.path())
        .env("SW_POOL_STATE_DIR", t.state())
        .env("SW_POOL_MOUNT", t.p("mnt"))
        .current_dir(&work);
    let o = run(&mut c);
    drop(etc);
    assert!(
        o.code == 0 && o.stdout.contains("README-SESSION-DONE"),
        "the README's examples failed (exit {}):\n--- stdout\n{}\n--- stderr\n{}",
        o.code,
        o.stdout,
        o.stderr
    );
    assert!(o.stdout.contains("Hello from a pool"), "{}", o.stdout);
    assert!(o.stdout.contains("made in the layer"), "{}", o.stdout);
    // `run --root --layer dev -- dpkg -i pkg.deb`: the package's program ran from the layer
    assert!(
        o.stdout.contains("Hello from a package in the layer"),
        "{}",
        o.stdout
    );
    // the job script run by a non-login bash with its output in a log (README, "The shell
    // function"): the exported function loaded the pool in the script's own shell, and the log
    // holds the program's output, not the shell code that load prints for the function
    let log = std::fs::read_to_string(format!("{work}/job.log")).unwrap_or_default();
    assert!(
        log.contains("Hello from a pool"),
        "job.log (bash job.sh > job.log): {log:?}"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("export ") || l.contains("MODULEPATH")),
        "job.log holds shell code: {log:?}"
    );
    // nothing left mounted by the session (its namespace is gone; no helper outlives it)
    t.assert_clean();
}
