//! Generated modulefiles and the paper's Figure 8 modulefile, loaded by the real Lmod from a pool
//! mounted with squashfuse_ll.

mod common;
use common::*;

use std::path::Path;
use std::process::Command;

const LMOD_INIT: &str = "/usr/share/lmod/lmod/init/bash";

struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3").arg("-u").arg(&self.0).status();
    }
}

fn mount(img: &Path, at: &Path) -> Mount {
    std::fs::create_dir_all(at).unwrap();
    let st = Command::new("squashfuse_ll")
        .arg(img)
        .arg(at)
        .status()
        .unwrap();
    assert!(st.success(), "squashfuse_ll failed");
    Mount(at.to_path_buf())
}

fn lmod(script: &str, env: &[(&str, &Path)]) -> Out {
    shell(&format!("source {LMOD_INIT}"), script, env)
}

/// The same with Environment Modules 5.2 (its modulecmd.tcl, unpacked by `make setup`).
fn envmod(script: &str, env: &[(&str, &Path)]) -> Out {
    shell(&envmod_init(), script, env)
}

fn shell(init: &str, script: &str, env: &[(&str, &Path)]) -> Out {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!("set -e; {init}; export MODULEPATH=; {script}"));
    for (k, v) in env {
        c.env(k, v);
    }
    c.env_remove("SW_POOL_MOUNT")
        .env_remove("GWDG_SW_MOUNT")
        .env_remove("LMOD_CMD")
        .env_remove("LOADEDMODULES")
        .env_remove("_LMFILES_");
    for (k, v) in env {
        c.env(k, v);
    }
    run(&mut c)
}

#[test]
fn generated_modulefiles_work_in_lmod() {
    generated_modulefiles_work(false);
}

/// The generated Tcl modulefiles, with Environment Modules: the same checks as for Lmod.
#[test]
fn generated_modulefiles_work_in_environment_modules() {
    generated_modulefiles_work(true);
}

fn generated_modulefiles_work(tcl: bool) {
    let lmod = if tcl { envmod } else { lmod };
    assert!(
        Path::new(LMOD_INIT).exists(),
        "Lmod is not installed (make setup)"
    );
    let d = scratch();
    let tree = d.path().join("demo");
    sample_tree(&tree);
    let pool = d.path().join("demo.sqfs");
    let o = sw_run(&[
        "build",
        "--gen-modulefiles",
        pool.to_str().unwrap(),
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    // mounted where SW_POOL_MOUNT says: $SW_POOL_MOUNT/<name>/<version>
    let root = d.path().join("mnt");
    let at = root.join("demo/1.0");
    let _m = mount(&pool, &at);
    let o = lmod(
        "module use $SW_POOL_MOUNT/demo/1.0/modulefiles; module avail 2>&1; module load hello/1.0 cfact/2.0; hello; cfact 5; echo MANPATH=$MANPATH",
        &[("SW_POOL_MOUNT", &root)],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("hello/1.0") && o.stdout.contains("cfact/2.0"),
        "module avail: {}",
        o.stdout
    );
    assert!(o.stdout.contains("hello from"), "{}", o.stdout);
    assert!(o.stdout.contains("\n120\n"), "{}", o.stdout);
    assert!(
        o.stdout
            .contains(&format!("{}/install/cfact/2.0/share/man", at.display())),
        "{}",
        o.stdout
    );
    // the paper's variable works too
    let o = lmod(
        "module use $GWDG_SW_MOUNT/demo/1.0/modulefiles; module load hello; hello",
        &[("GWDG_SW_MOUNT", &root)],
    );
    assert!(o.stdout.contains("hello from"), "{}{}", o.stdout, o.stderr);
    // mounted somewhere else (load -m DIR): the modulefile finds the pool it lives in
    let other = d.path().join("elsewhere");
    let _m2 = mount(&pool, &other);
    let o = lmod(
        &format!(
            "module use {}/modulefiles; module load cfact/2.0; which cfact",
            other.display()
        ),
        &[],
    );
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .contains(&format!("{}/install/cfact/2.0/bin/cfact", other.display())),
        "{}",
        o.stdout
    );
    // every package is listed once (Lmod takes the .lua file where both languages are there)
    let o = lmod(
        &format!(
            "module use {}/modulefiles; module -t avail 2>&1",
            other.display()
        ),
        &[],
    );
    assert_eq!(o.stdout.matches("hello/1.0").count(), 1, "{}", o.stdout);
    if tcl {
        return; // `module spider` is Lmod's
    }
    // module spider finds the packages
    let o = lmod(
        &format!(
            "module use {}/modulefiles; module spider cfact 2>&1",
            other.display()
        ),
        &[],
    );
    assert!(o.stdout.contains("cfact/2.0"), "{}", o.stdout);
}

#[test]
fn paper_figure_8_modulefile_works_unchanged() {
    let d = scratch();
    let tree = d.path().join("test-pool");
    let o = sw_run(&[
        "init",
        "--name",
        "test-pool",
        "--version",
        "0.5",
        tree.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let bin = tree.join("install/tool/1.2/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("tool"), "#!/bin/sh\necho tool works\n").unwrap();
    std::fs::set_permissions(
        bin.join("tool"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::create_dir_all(tree.join("modulefiles/tool")).unwrap();
    // Figure 8, verbatim
    std::fs::write(
        tree.join("modulefiles/tool/1.2.lua"),
        r#"local version = myModuleVersion()
local pkgName = myModuleName()
local mountPoint = os.getenv("GWDG_SW_MOUNT")
local poolName = "test-pool"
local poolVersion = "0.5"
local pkg = pathJoin(mountPoint, poolName, poolVersion
                    , "install", pkgName, version, "bin")
prepend_path("PATH", pkg)
"#,
    )
    .unwrap();
    let pool = d.path().join("test-pool.sqfs");
    assert_eq!(
        sw_run(&["build", pool.to_str().unwrap(), tree.to_str().unwrap()]).code,
        0
    );
    let root = d.path().join("sw");
    let _m = mount(&pool, &root.join("test-pool/0.5"));
    let o = lmod(
        "module use $GWDG_SW_MOUNT/test-pool/0.5/modulefiles; module load tool/1.2; tool",
        &[("GWDG_SW_MOUNT", &root)],
    );
    assert!(o.stdout.contains("tool works"), "{}{}", o.stdout, o.stderr);
}
