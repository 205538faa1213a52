//! `sw-pool bundle` against the real loader: the closure of programs built here (with `$ORIGIN`
//! RUNPATH and RPATH libraries) and of Debian programs matches `ld.so --list`; a dlopen()ed plugin
//! is found only with `--trace`; bundles run with the original tree hidden; bad input fails cleanly.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const LDSO: &str = "/lib64/ld-linux-x86-64.so.2";

fn sh(cmd: &str) {
    let st = Command::new("sh").args(["-ec", cmd]).status().unwrap();
    assert!(st.success(), "failed: {cmd}");
}

/// app/bin/prog → libb.so.1 (RUNPATH $ORIGIN) → liba.so.1 → libz.so.1 (Debian); prog's RUNPATH is
/// $ORIGIN/../lib:$ORIGIN/../plugins; with an argument it dlopen()s libplug.so by name.
/// `rpath`: prog and libb use DT_RPATH instead (--disable-new-dtags).
fn build_app(root: &Path, rpath: bool) -> PathBuf {
    let app = root.join("app");
    let tags = if rpath {
        "--disable-new-dtags"
    } else {
        "--enable-new-dtags"
    };
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(
        root.join("src/a.c"),
        "#include <zlib.h>\nint a_fn(void){ return (int)zlibVersion()[0]; }\n",
    )
    .unwrap();
    std::fs::write(
        root.join("src/b.c"),
        "int a_fn(void);\nint b_fn(void){ return a_fn()+1; }\n",
    )
    .unwrap();
    std::fs::write(root.join("src/plug.c"), "int plug_fn(void){ return 42; }\n").unwrap();
    std::fs::write(
        root.join("src/main.c"),
        r#"#include <stdio.h>
#include <dlfcn.h>
int b_fn(void);
int main(int argc, char **argv) {
  printf("b=%d\n", b_fn());
  if (argc > 1) {
    void *h = dlopen("libplug.so", RTLD_NOW);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 3; }
    int (*f)(void) = (int (*)(void))dlsym(h, "plug_fn");
    printf("plug=%d\n", f());
  }
  return 0;
}
"#,
    )
    .unwrap();
    sh(&format!(
        "cd {root}; mkdir -p app/bin app/lib app/plugins
         gcc -shared -fPIC -o app/lib/liba.so.1 -Wl,-soname,liba.so.1 src/a.c -lz
         gcc -shared -fPIC -o app/lib/libb.so.1 -Wl,-soname,libb.so.1 src/b.c -Lapp/lib -l:liba.so.1 -Wl,{tags},-rpath,'$ORIGIN'
         gcc -shared -fPIC -o app/plugins/libplug.so src/plug.c
         gcc -o app/bin/prog src/main.c -Lapp/lib -l:libb.so.1 -ldl -Wl,{tags},-rpath,'$ORIGIN/../lib:$ORIGIN/../plugins' -Wl,-rpath-link,app/lib",
        root = root.display()
    ));
    app
}

/// The files `ld.so --list` maps for `exe` (canonical paths; the vDSO left out).
fn ldso_list(exe: &Path, ld_library_path: Option<&str>) -> BTreeSet<PathBuf> {
    let mut c = Command::new(LDSO);
    c.arg("--list").arg(exe).env_remove("LD_LIBRARY_PATH");
    if let Some(l) = ld_library_path {
        c.env("LD_LIBRARY_PATH", l);
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "ld.so --list {}", exe.display());
    // the program itself (ld.so --list prints only what it maps besides it)
    std::iter::once(std::fs::canonicalize(exe).unwrap())
        .chain(String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| {
            let l = l.trim();
            let p = match l.split_once(" => ") {
                Some((_, rest)) => rest.split(" (").next()?.to_string(),
                None => l.split(" (").next()?.to_string(),
            };
            p.starts_with('/')
                .then(|| std::fs::canonicalize(&p).unwrap())
        }))
        .collect()
}

fn bundle_json(tree: &Path, name: &str, version: &str) -> serde_json::Value {
    let p = tree.join(format!("install/{name}/{version}/bundle.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

/// The closure as bundle.json records it: every file in or out, except traced outsiders.
fn bundle_closure(j: &serde_json::Value) -> BTreeSet<PathBuf> {
    j["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| matches!(f["kind"].as_str(), Some("input" | "library" | "excluded")))
        .map(|f| std::fs::canonicalize(f["source"].as_str().unwrap()).unwrap())
        .collect()
}

fn dests(j: &serde_json::Value) -> BTreeSet<String> {
    j["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["dest"].as_str().map(String::from))
        .collect()
}

/// Run `cmd` with `hide` invisible: a tmpfs over it in a private mount namespace (root), or
/// mode 000 (anyone else).
fn run_hidden(hide: &Path, cmd: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut c = if is_root() {
        let mut c = Command::new("unshare");
        c.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o mode=000 none {} && test -z \"$(ls -A {})\" && exec {cmd}",
                hide.display(),
                hide.display()
            ));
        c
    } else {
        sh(&format!("chmod 000 {}", hide.display()));
        let mut c = Command::new("sh");
        c.args(["-c", cmd]);
        c
    };
    c.env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    if !is_root() {
        sh(&format!("chmod 755 {}", hide.display()));
    }
    o
}

#[test]
fn closure_matches_ldso_list_runpath_and_rpath() {
    let d = scratch();
    for rpath in [false, true] {
        let root = d.path().join(if rpath { "r" } else { "n" });
        let app = build_app(&root, rpath);
        let prog = app.join("bin/prog");
        let tree = root.join("out");
        let o = sw_run(&[
            "bundle",
            "--name",
            "app",
            "--version",
            "1.0",
            "-o",
            tree.to_str().unwrap(),
            prog.to_str().unwrap(),
        ]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        let j = bundle_json(&tree, "app", "1.0");
        assert_eq!(bundle_closure(&j), ldso_list(&prog, None), "rpath={rpath}");
        let ds = dests(&j);
        for want in [
            "bin/prog",
            "lib/libb.so.1",
            "lib/liba.so.1",
            "lib/libz.so.1",
        ] {
            assert!(ds.contains(want), "{want} missing: {ds:?}");
        }
        assert!(!ds.iter().any(|d| d.contains("libc.so")), "{ds:?}");
        // every excluded file says why
        for f in j["files"].as_array().unwrap() {
            assert!(!f["reason"].as_str().unwrap().is_empty());
        }
        // the bundle resolves entirely inside itself (libc and the loader from the host)
        let bprog = tree.join("install/app/1.0/bin/prog");
        for p in ldso_list(&bprog, None) {
            assert!(
                p.starts_with(std::fs::canonicalize(&tree).unwrap())
                    || p.ends_with("libc.so.6")
                    || p.ends_with("ld-linux-x86-64.so.2"),
                "{} resolves outside the bundle",
                p.display()
            );
        }
        let out = run_hidden(&app, bprog.to_str().unwrap(), &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "b=50\n");
    }
}

#[test]
fn ld_library_path_beats_runpath_but_not_rpath() {
    // a decoy liba.so.1 on LD_LIBRARY_PATH: the loader takes it over RUNPATH, not over RPATH
    let d = scratch();
    for rpath in [false, true] {
        let root = d.path().join(if rpath { "r" } else { "n" });
        let app = build_app(&root, rpath);
        let decoy = root.join("decoy");
        std::fs::create_dir_all(&decoy).unwrap();
        std::fs::copy(app.join("lib/liba.so.1"), decoy.join("liba.so.1")).unwrap();
        let prog = app.join("bin/prog");
        let tree = root.join("out");
        let o = run(sw().env("LD_LIBRARY_PATH", &decoy).args([
            "bundle",
            "-o",
            tree.to_str().unwrap(),
            prog.to_str().unwrap(),
        ]));
        assert_eq!(o.code, 0, "{}", o.stderr);
        let j = bundle_json(&tree, "prog", "0");
        let want = ldso_list(&prog, Some(decoy.to_str().unwrap()));
        assert_eq!(bundle_closure(&j), want, "rpath={rpath}");
        let decoy_a = std::fs::canonicalize(decoy.join("liba.so.1")).unwrap();
        assert_eq!(want.contains(&decoy_a), !rpath, "loader semantics changed?");
    }
}

#[test]
fn debian_programs_match_ldso_list() {
    // real Debian binaries with many libraries, resolved through ld.so.cache
    let d = scratch();
    for exe in [
        "/usr/bin/ssh",
        "/usr/bin/curl",
        "/usr/sbin/mke2fs",
        "/usr/bin/mpirun",
    ] {
        let exe = Path::new(exe);
        if !exe.exists() {
            continue;
        }
        let real = std::fs::canonicalize(exe).unwrap();
        let tree = d.path().join(real.file_name().unwrap());
        let o = sw_run(&[
            "bundle",
            "-o",
            tree.to_str().unwrap(),
            real.to_str().unwrap(),
        ]);
        assert_eq!(o.code, 0, "{}: {}", exe.display(), o.stderr);
        let name = real.file_name().unwrap().to_str().unwrap();
        let j = bundle_json(&tree, name, "0");
        assert_eq!(
            bundle_closure(&j),
            ldso_list(&real, None),
            "{}",
            exe.display()
        );
        if name.starts_with("orterun") || name.starts_with("mpirun") {
            // Open MPI's launcher: its MPI runtime libraries stay with the host
            let out: Vec<&str> = j["files"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["included"] == false)
                .filter_map(|f| f["source"].as_str())
                .collect();
            assert!(
                out.iter()
                    .any(|s| s.contains("libopen-rte") || s.contains("libopen-pal")),
                "{out:?}"
            );
        }
    }
}

#[test]
fn dlopen_plugin_needs_trace() {
    let d = scratch();
    let app = build_app(d.path(), false);
    let prog = app.join("bin/prog");
    let plain = d.path().join("plain");
    let traced = d.path().join("traced");
    let o = sw_run(&[
        "bundle",
        "--name",
        "app",
        "-o",
        plain.to_str().unwrap(),
        prog.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!dests(&bundle_json(&plain, "app", "0")).contains("lib/libplug.so"));
    let o = sw_run(&[
        "bundle",
        "--name",
        "app",
        "-o",
        traced.to_str().unwrap(),
        prog.to_str().unwrap(),
        "--trace",
        "--",
        prog.to_str().unwrap(),
        "with-plugin",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let j = bundle_json(&traced, "app", "0");
    let plug = j["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["dest"] == "lib/libplug.so")
        .expect("plugin bundled with --trace");
    assert_eq!(plug["kind"], "plugin");
    // the static closure is not mistaken for plugins
    let b = j["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["dest"] == "lib/libb.so.1")
        .unwrap();
    assert_eq!(b["kind"], "library");
    // with the original tree hidden: the plain bundle cannot find the plugin, the traced one can
    let o = run_hidden(
        &app,
        &format!("{}/install/app/0/bin/prog x", plain.display()),
        &[],
    );
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = run_hidden(
        &app,
        &format!("{}/install/app/0/bin/prog x", traced.display()),
        &[],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "b=50\nplug=42\n");
}

#[test]
fn runpath_mode_and_pool_file() {
    let d = scratch();
    let app = build_app(d.path(), false);
    let prog = app.join("bin/prog");
    let tree = d.path().join("rp");
    let o = sw_run(&[
        "bundle",
        "--link",
        "runpath",
        "-o",
        tree.to_str().unwrap(),
        prog.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let bprog = tree.join("install/prog/0/bin/prog");
    let re = Command::new("readelf")
        .arg("-d")
        .arg(&bprog)
        .output()
        .unwrap();
    let re = String::from_utf8_lossy(&re.stdout);
    assert!(
        re.contains("[libb.so.1]") && re.contains("RUNPATH") && re.contains("[$ORIGIN/../lib]"),
        "{re}"
    );
    let out = run_hidden(&app, bprog.to_str().unwrap(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --out X.sqfs: a pool with the package and its modulefile
    let pool = d.path().join("app-1.0.sqfs");
    let o = sw_run(&[
        "bundle",
        "--name",
        "app",
        "--version",
        "1.0",
        "-o",
        pool.to_str().unwrap(),
        prog.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = sw_run(&["inspect", "--json", pool.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("\"app\""), "{}", o.stdout);
    assert_nothing_left_bundle(d.path());
    let o = Command::new("unsquashfs")
        .args(["-l", pool.to_str().unwrap()])
        .output()
        .unwrap();
    let l = String::from_utf8_lossy(&o.stdout);
    for want in [
        "install/app/1.0/bin/prog",
        "install/app/1.0/lib/liba.so.1",
        "install/app/1.0/bundle.json",
        "modulefiles/app/1.0.lua",
        "pool.toml",
    ] {
        assert!(l.contains(want), "{want} not in the pool:\n{l}");
    }
}

#[test]
fn python_modules_under_python_dir() {
    let python = "/usr/bin/python3";
    if !Path::new(python).exists() {
        return;
    }
    let d = scratch();
    let site = d.path().join("site");
    std::fs::create_dir_all(site.join("mypkg")).unwrap();
    std::fs::write(site.join("mypkg/__init__.py"), "from . import sub\n").unwrap();
    std::fs::write(site.join("mypkg/sub.py"), "VALUE = 7\n").unwrap();
    std::fs::write(site.join("unused.py"), "raise SystemExit(9)\n").unwrap();
    // precompiled: Python then opens only the .pyc files (it stats the sources)
    sh(&format!("{python} -m compileall -q {}", site.display()));
    let tree = d.path().join("py");
    let o = run(sw().env("PYTHONPATH", &site).args([
        "bundle",
        "--name",
        "pyapp",
        "--version",
        "1",
        "--python=/usr/bin/python3",
        "-o",
        tree.to_str().unwrap(),
        "--trace",
        "--",
        python,
        "-c",
        "import mypkg; print(mypkg.sub.VALUE)",
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let pkg = tree.join("install/pyapp/1");
    assert!(pkg.join("python/mypkg/sub.py").is_file());
    assert!(pkg.join("python/mypkg/__init__.py").is_file());
    assert!(
        pkg.join("python/mypkg/__pycache__/sub.cpython-311.pyc")
            .is_file()
            || !python.ends_with("python3")
    );
    assert!(
        !pkg.join("python/unused.py").exists(),
        "not imported, not in python/"
    );
    let mf = std::fs::read_to_string(tree.join("modulefiles/pyapp/1.lua")).unwrap();
    assert!(mf.contains("PYTHONPATH"), "{mf}");
    let pp = pkg.join("python");
    let o = run_hidden(
        &site,
        &format!("{python} -c 'import mypkg; print(mypkg.sub.VALUE, mypkg.__file__)'"),
        &[("PYTHONPATH", pp.to_str().unwrap())],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("7 "));
}

fn assert_nothing_left_bundle(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !n.contains(".swpool-"),
            "temporary {n} left in {}",
            dir.display()
        );
    }
}

#[test]
fn bad_input_fails_cleanly() {
    let d = scratch();
    let app = build_app(d.path(), false);
    let prog = app.join("bin/prog");
    let outdir = d.path().join("outs");
    std::fs::create_dir_all(&outdir).unwrap();
    let out = outdir.join("b");
    let out_s = out.to_str().unwrap();
    let check = |o: &Out, want: &[&str]| {
        assert_eq!(o.code, 3, "{}", o.stderr);
        for w in want {
            assert!(o.stderr.contains(w), "want {w:?} in {}", o.stderr);
        }
        assert_eq!(
            std::fs::read_dir(&outdir).unwrap().count(),
            0,
            "output or temporary left"
        );
    };
    // not an ELF file
    let script = d.path().join("run.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    check(
        &sw_run(&["bundle", "-o", out_s, script.to_str().unwrap()]),
        &["run.sh", "not an ELF file", "a script"],
    );
    // a static binary
    std::fs::write(d.path().join("s.c"), "int main(void){return 0;}\n").unwrap();
    sh(&format!(
        "cd {} && gcc -static -o static s.c",
        d.path().display()
    ));
    let st = d.path().join("static");
    check(
        &sw_run(&["bundle", "-o", out_s, st.to_str().unwrap()]),
        &["static", "statically linked", "sw-pool build"],
    );
    // a missing library
    std::fs::rename(app.join("lib/liba.so.1"), app.join("lib/liba.so.1.gone")).unwrap();
    check(
        &sw_run(&["bundle", "-o", out_s, prog.to_str().unwrap()]),
        &["liba.so.1", "libb.so.1", "was not found", "LD_LIBRARY_PATH"],
    );
    std::fs::rename(app.join("lib/liba.so.1.gone"), app.join("lib/liba.so.1")).unwrap();
    // a traced command that fails (after the closure was resolved: still nothing written)
    check(
        &sw_run(&[
            "bundle",
            "-o",
            out_s,
            prog.to_str().unwrap(),
            "--trace",
            "--",
            "sh",
            "-c",
            "echo broken >&2; exit 4",
        ]),
        &["traced command", "exit status: 4", "broken"],
    );
    // a missing input
    check(
        &sw_run(&["bundle", "-o", out_s, "/nonexistent/prog"]),
        &["/nonexistent/prog"],
    );
    // an existing output is kept without --force
    std::fs::create_dir(&out).unwrap();
    let o = sw_run(&["bundle", "-o", out_s, prog.to_str().unwrap()]);
    assert_eq!(o.code, 3);
    assert!(o.stderr.contains("--force"), "{}", o.stderr);
    let o = sw_run(&["bundle", "-f", "-o", out_s, prog.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(out.join("install/prog/0/bin/prog").is_file());
    assert_nothing_left_bundle(&outdir);
}

/// The glibc and loader names of the default exclude list (file names, as bundled).
const GLIBC: &[&str] = &[
    "ld-linux",
    "libc.so.",
    "libm.so.",
    "libmvec.so.",
    "libpthread.so.",
    "libdl.so.",
    "librt.so.",
    "libutil.so.",
    "libresolv.so.",
    "libanl.so.",
    "libnss_",
    "libthread_db.so.",
    "libBrokenLocale.so.",
];

fn is_glibc(name: &str) -> bool {
    GLIBC.iter().any(|g| name.starts_with(g))
}

/// `--trace` of an interpreter: what it opened and executed passes the exclude list as its
/// closure does (the interpreter loads libm with dlopen-like opens, executes helpers linked to
/// libc): no glibc or loader file is bundled, no file is both in and out; with the interpreter in
/// the bundle, the standard library modules it imported are bundled beside it and the bundled
/// interpreter, run from the unpacked pool, imports them from there.
#[test]
fn traced_interpreter_bundles_no_glibc_and_its_stdlib_beside_it() {
    let python = "/usr/bin/python3";
    if !Path::new(python).exists() {
        skip("/usr/bin/python3 is not installed");
        return;
    }
    let d = scratch();
    let pool = d.path().join("py.sqfs");
    let o = run(sw().args([
        "bundle",
        "--name",
        "py",
        "--version",
        "1",
        "--python",
        "-o",
        pool.to_str().unwrap(),
        python,
        "--trace",
        "--",
        python,
        "-c",
        "import json",
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let tree = d.path().join("unpacked");
    let u = Command::new("unsquashfs")
        .args(["-q", "-no-progress", "-d"])
        .arg(&tree)
        .arg(&pool)
        .output()
        .unwrap();
    assert!(u.status.success(), "{}", String::from_utf8_lossy(&u.stderr));
    let j = bundle_json(&tree, "py", "1");
    let files = j["files"].as_array().unwrap();
    let sources = |inc: bool| -> BTreeSet<String> {
        files
            .iter()
            .filter(|f| f["included"].as_bool() == Some(inc))
            .map(|f| f["source"].as_str().unwrap().to_string())
            .collect()
    };
    let both: Vec<String> = sources(true)
        .intersection(&sources(false))
        .cloned()
        .collect();
    assert!(both.is_empty(), "both in and out of the bundle: {both:?}");
    for f in files
        .iter()
        .filter(|f| f["included"].as_bool() == Some(true))
    {
        let src = Path::new(f["source"].as_str().unwrap());
        let names = [
            src.file_name().unwrap().to_string_lossy().into_owned(),
            std::fs::canonicalize(src)
                .unwrap()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        ];
        assert!(
            !names.iter().any(|n| is_glibc(n)),
            "a glibc file bundled: {f}"
        );
    }
    let pkg = tree.join("install/py/1");
    let mut stack = vec![pkg.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            assert!(!is_glibc(&n), "in the pool: {}", e.path().display());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    let version = j["python"]["version"].as_str().unwrap();
    assert!(
        !pkg.join(format!("share/lib/python{version}")).exists(),
        "no standard library where python never looks"
    );
    // the interpreter is in the bundle: so is the standard library it imported, where it looks
    // (lib/pythonX.Y beside bin/, the rule `build --from-env` follows), and no note says otherwise
    assert!(
        !o.stdout.contains("standard library is not bundled"),
        "{}",
        o.stdout
    );
    assert!(pkg.join(format!("lib/python{version}/os.py")).is_file());
    let r = Command::new(pkg.join("bin/python3"))
        .args(["-c", "import json, sys; print(json.__file__)"])
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME")
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let at = PathBuf::from(String::from_utf8_lossy(&r.stdout).trim());
    let want = pkg.join(format!("lib/python{version}/json"));
    assert!(
        at.starts_with(&want),
        "json from {}, expected {}",
        at.display(),
        want.display()
    );
}
