//! `sw-pool build --from-env`: real Python environments (made here with `python3 -m venv` and
//! pip) become relocatable pools; moved elsewhere with the original tree gone, the interpreter,
//! the entry points and the modulefiles work and nothing opens the original paths.

mod common;
use common::cases::assert_contains_all;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

const LMOD_INIT: &str = "/usr/share/lmod/lmod/init/bash";

fn sh(script: &str) -> Out {
    run(Command::new("bash").arg("-c").arg(script))
}

/// A wheel made by hand (no build backend needed): module `swpdemo` and a console script
/// `swpdemo` whose shebang pip writes with the environment's interpreter.
fn demo_wheel(dir: &Path) -> PathBuf {
    let whl = dir.join("swpdemo-1.0-py3-none-any.whl");
    let script = format!(
        r#"
import base64, hashlib, zipfile
files = {{
 'swpdemo/__init__.py': b'VERSION = "1.0"\ndef main():\n    print("swpdemo " + VERSION)\n',
 'swpdemo-1.0.dist-info/METADATA': b'Metadata-Version: 2.1\nName: swpdemo\nVersion: 1.0\n',
 'swpdemo-1.0.dist-info/WHEEL': b'Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
 'swpdemo-1.0.dist-info/entry_points.txt': b'[console_scripts]\nswpdemo = swpdemo:main\n',
}}
rec = []
with zipfile.ZipFile('{}', 'w') as z:
    for n, d in files.items():
        z.writestr(n, d)
        h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()
        rec.append('%s,sha256=%s,%d' % (n, h, len(d)))
    rec.append('swpdemo-1.0.dist-info/RECORD,,')
    z.writestr('swpdemo-1.0.dist-info/RECORD', '\n'.join(rec) + '\n')
"#,
        whl.display()
    );
    let o = run(Command::new("python3").arg("-c").arg(script));
    assert_eq!(o.code, 0, "{}", o.stderr);
    whl
}

/// numpy and scipy from the package registry, downloaded once into target/ (later runs install
/// from there, offline); `false` when neither the cache nor the registry has them.
fn scipy_into(venv: &Path) -> bool {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyenv-wheels");
    std::fs::create_dir_all(&cache).unwrap();
    let pip = venv.join("bin/pip");
    let install = |c: &Path| {
        run(Command::new(&pip)
            .args(["install", "-q", "--no-index", "--find-links"])
            .arg(c)
            .args(["numpy", "scipy"]))
    };
    if install(&cache).code == 0 {
        return true;
    }
    let dl = run(Command::new(&pip)
        .args(["download", "-q", "-d"])
        .arg(&cache)
        .args(["numpy", "scipy"]));
    if dl.code != 0 {
        skip(&format!(
            "numpy/scipy not in {} and not downloadable: {}",
            cache.display(),
            dl.stderr
        ));
        return false;
    }
    let o = install(&cache);
    assert_eq!(o.code, 0, "{}", o.stderr);
    true
}

/// The host's `python3`, its link resolved.
fn stdlib_python() -> String {
    let o = run(Command::new("python3").args([
        "-c",
        "import os, sys; print(os.path.realpath(sys.executable))",
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.stdout.trim().to_string()
}

/// The base interpreter's standard library directory (outside the venv).
fn stdlib_of(python: &Path) -> String {
    let o = run(Command::new(python).args([
        "-c",
        "import sysconfig; print(sysconfig.get_paths()['stdlib'])",
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.stdout.trim().to_string()
}

#[test]
fn venv_becomes_a_relocatable_pool_with_its_interpreter() {
    let d = scratch();
    let env = d.path().join("proj");
    let o = run(Command::new("python3").arg("-m").arg("venv").arg(&env));
    if o.code != 0 {
        panic!(
            "python3 -m venv failed (install python3-venv: tools/setup-deps.sh): {}",
            o.stderr
        );
    }
    let whl = demo_wheel(d.path());
    let o = run(Command::new(env.join("bin/pip"))
        .args(["install", "-q", "--no-index"])
        .arg(&whl));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let scipy = scipy_into(&env);
    let stdlib = stdlib_of(&env.join("bin/python3"));
    assert!(!stdlib.starts_with(env.to_str().unwrap()), "{stdlib}");

    let pool = d.path().join("proj.sqfs");
    let o = run(sw()
        .args(["build", "--no-compress", "--from-env"])
        .arg(&env)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("venv environment, Python 3."),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("interpreter included from"),
        "{}",
        o.stdout
    );

    // inspect says what it is
    let i = sw_run(&["inspect", "--no-check", pool.to_str().unwrap()]);
    assert_eq!(i.code, 0, "{}", i.stderr);
    let o = run(Command::new(env.join("bin/python")).args([
        "-c",
        "import importlib.metadata as m; print(len(list(m.distributions())))",
    ]));
    let want_pkgs = format!("{} packages", o.stdout.trim());
    assert_contains_all(
        &i.stdout,
        &[
            "Python environment: venv (Python 3.",
            &want_pkgs,
            "files",
            "proj/1",
        ],
        "inspect",
    );

    // the pool's tree somewhere else, the original environment gone
    let moved = d.path().join("elsewhere");
    let o = run(Command::new("unsquashfs")
        .arg("-q")
        .arg("-d")
        .arg(&moved)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let gone = d.path().join("proj.gone");
    std::fs::rename(&env, &gone).unwrap();
    let pkg = moved.join("install/proj/1");
    let import = if scipy {
        "import swpdemo, json, scipy.stats, scipy; print(swpdemo.VERSION, scipy.__version__)"
    } else {
        // json: a module of the included standard library that is not frozen into the interpreter
        "import swpdemo, json; print(swpdemo.VERSION)"
    };
    let trace = d.path().join("strace.log");
    let o = run(Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=%file", "-o"])
        .arg(&trace)
        .arg(pkg.join("bin/python"))
        .args(["-c", import]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.starts_with("1.0"), "{}", o.stdout);
    let log = std::fs::read_to_string(&trace).unwrap();
    for forbidden in [env.to_str().unwrap(), stdlib.as_str()] {
        let hits: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!("\"{forbidden}")))
            .collect();
        assert!(
            hits.is_empty(),
            "the moved pool touched {forbidden}:\n{}",
            hits.join("\n")
        );
    }
    // byte-compiled at build time (unchecked-hash .pyc): no import read a module's source (a
    // copy's sources have new modification times, so the environment's own timestamp .pyc files
    // would be stale and every import from the read-only pool would compile its source again)
    let sources: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("open") && l.contains(".py\""))
        .collect();
    assert!(
        sources.is_empty(),
        "imports read {} module sources (stale or missing .pyc):\n{}",
        sources.len(),
        sources
            .iter()
            .take(5)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // sys.prefix is the moved tree, the standard library the included one
    let o = run(Command::new(pkg.join("bin/python")).args([
        "-c",
        "import sys, os; print(sys.prefix); print(os.__file__)",
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(Path::new(lines[0]), pkg);
    assert!(
        lines[1].starts_with(pkg.join("interpreter/lib/python3.").to_str().unwrap()),
        "{}",
        lines[1]
    );
    // the entry point runs through the relocated shebang, and every RECORD hash still holds
    let o = run(&mut Command::new(pkg.join("bin/swpdemo")));
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "swpdemo 1.0\n"),
        "{}",
        o.stderr
    );
    let check = r#"
import base64, csv, glob, hashlib, os, sys
bad = 0
for rec in glob.glob(os.path.join(sys.prefix, 'lib/python3.*/site-packages/*.dist-info/RECORD')):
    sp = os.path.dirname(os.path.dirname(rec))
    for row in csv.reader(open(rec)):
        if len(row) < 3 or not row[1]:
            continue
        f = os.path.normpath(os.path.join(sp, row[0]))
        d = open(f, 'rb').read()
        h = 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()
        if h != row[1] or str(len(d)) != row[2]:
            print('mismatch', f); bad += 1
sys.exit(bad)
"#;
    let o = run(Command::new(pkg.join("bin/python")).args(["-c", check]));
    assert_eq!(
        o.code, 0,
        "RECORDs out of step with the files: {}{}",
        o.stdout, o.stderr
    );
    // bin/activate takes its own location
    let o = sh(&format!(
        ". {}/bin/activate && echo \"$VIRTUAL_ENV\"",
        pkg.display()
    ));
    assert_eq!(o.stdout.trim(), pkg.to_str().unwrap(), "{}", o.stderr);
    for f in ["activate.csh", "activate.fish", "Activate.ps1"] {
        assert!(
            !pkg.join("bin").join(f).exists(),
            "{f} names the original path"
        );
    }
    // the modulefiles: Lmod and Environment Modules put the env on PATH and set VIRTUAL_ENV
    let script = format!(
        "module use {}/modulefiles; module load proj/1; echo \"$VIRTUAL_ENV\"; python -c 'import swpdemo, sys; print(sys.prefix)'",
        moved.display()
    );
    for (what, init) in [
        ("Lmod", format!("source {LMOD_INIT}")),
        ("Environment Modules", envmod_init()),
    ] {
        let o = sh(&format!(
            "set -e; {init}; export MODULEPATH=; unset SW_POOL_MOUNT GWDG_SW_MOUNT; {script}"
        ));
        assert_eq!(o.code, 0, "{what}: {}", o.stderr);
        let want = format!("{}\n{}\n", pkg.display(), pkg.display());
        assert_eq!(o.stdout, want, "{what}: {}", o.stderr);
    }
}

#[test]
fn bad_environments_exit_3_and_leave_nothing() {
    let d = scratch();
    let out = d.path().join("out");
    std::fs::create_dir(&out).unwrap();
    // not an environment
    let plain = d.path().join("plain");
    std::fs::create_dir_all(plain.join("bin")).unwrap();
    // a venv whose interpreter link points nowhere
    let broken = d.path().join("broken");
    std::fs::create_dir_all(broken.join("bin")).unwrap();
    std::fs::write(broken.join("pyvenv.cfg"), "home = /nonexistent/bin\n").unwrap();
    std::os::unix::fs::symlink("/nonexistent/bin/python3", broken.join("bin/python3")).unwrap();
    // a venv whose interpreter is not a Python that can be included
    let fake = d.path().join("fake");
    std::fs::create_dir_all(fake.join("bin")).unwrap();
    std::fs::write(fake.join("pyvenv.cfg"), "home = /x\n").unwrap();
    let exe = d.path().join("notpython");
    std::fs::write(&exe, "#!/bin/sh\necho nope\n").unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink(&exe, fake.join("bin/python3")).unwrap();
    // a conda environment whose interpreter is a link into the package cache (conda's
    // allow_softlinks): the pool would run the standard library of the host's tree
    let linked = d.path().join("linked");
    std::fs::create_dir_all(linked.join("conda-meta")).unwrap();
    std::fs::create_dir_all(linked.join("bin")).unwrap();
    let host_python = PathBuf::from(stdlib_python());
    std::os::unix::fs::symlink(&host_python, linked.join("bin/python3")).unwrap();
    std::os::unix::fs::symlink("python3", linked.join("bin/python")).unwrap();
    let cases: [(&Path, &[&str]); 4] = [
        (
            &linked,
            &[
                "points out of the environment",
                "conda environment",
                "conda create --copy",
            ],
        ),
        (
            &plain,
            &["is not a Python environment", "pyvenv.cfg", "conda-meta"],
        ),
        (
            &broken,
            &[
                "interpreter link is broken",
                "bin/python3",
                "/nonexistent/bin/python3",
                "repair the link",
            ],
        ),
        (
            &fake,
            &[
                "cannot include the interpreter",
                "notpython",
                "recreate the environment",
            ],
        ),
    ];
    for (env, wanted) in cases {
        let o = run(sw()
            .args(["build", "--from-env"])
            .arg(env)
            .arg(out.join("p.sqfs")));
        assert_eq!(o.code, 3, "{}: {}", env.display(), o.stderr);
        assert_contains_all(&o.stderr, wanted, &env.display().to_string());
        let left: Vec<_> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{}: left behind {left:?}", env.display());
    }
}

/// A CPython laid out as a stand-alone prefix, as conda and uv's managed Pythons have it:
/// `<prefix>/bin/python3.X` (a copy of the host's interpreter) and `<prefix>/lib/python3.X` (its
/// standard library, without tests and site-/dist-packages). The host's Debian interpreter reads
/// `dist-packages`: a `.pth` there adds `site-packages`, where conda and uv install. Returns X.Y.
fn standalone_python(prefix: &Path) -> String {
    let o = run(Command::new("python3").args([
        "-c",
        "import sys, sysconfig; print('%d.%d' % sys.version_info[:2]); print(sysconfig.get_paths()['stdlib']); print(sys.executable)",
    ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let l: Vec<&str> = o.stdout.lines().collect();
    let (v, stdlib, exe) = (l[0].to_string(), l[1], std::fs::canonicalize(l[2]).unwrap());
    let lib = prefix.join(format!("lib/python{v}"));
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::create_dir_all(prefix.join("lib")).unwrap();
    std::fs::copy(&exe, prefix.join(format!("bin/python{v}"))).unwrap();
    let o = run(Command::new("cp").arg("-a").arg(stdlib).arg(&lib));
    assert_eq!(o.code, 0, "{}", o.stderr);
    for x in ["test", "dist-packages", "site-packages"] {
        let _ = std::fs::remove_dir_all(lib.join(x));
    }
    std::fs::create_dir_all(lib.join("site-packages")).unwrap();
    std::fs::create_dir_all(lib.join("dist-packages")).unwrap();
    std::fs::write(
        lib.join("dist-packages/site-packages.pth"),
        "../site-packages\n",
    )
    .unwrap();
    v
}

/// Lines of an strace log that name `path` (as a path argument).
fn touching<'a>(log: &'a str, path: &Path) -> Vec<&'a str> {
    let p = format!("\"{}", path.display());
    log.lines().filter(|l| l.contains(&p)).collect()
}

/// A file of the hand-built conda package: path, bytes, (prefix placeholder, file mode).
type CondaFile<'a> = (String, Vec<u8>, Option<(&'a str, &'a str)>);

/// conda-pack's layout, built by hand (no conda or micromamba can be installed here):
/// `conda-meta/*.json` with `files` and `paths_data` (`prefix_placeholder`, `file_mode` text and
/// binary), the interpreter and its standard library in the tree, a text module, an entry point
/// and a binary file naming the environment's prefix or the build placeholder.
#[test]
fn conda_environment_prefix_placeholders_are_rewritten_as_conda_pack_does() {
    let d = scratch();
    let env = d
        .path()
        .join("conda/envs/an-environment-with-a-long-name-for-room");
    let v = standalone_python(&env);
    std::os::unix::fs::symlink(format!("python{v}"), env.join("bin/python3")).unwrap();
    std::os::unix::fs::symlink(format!("python{v}"), env.join("bin/python")).unwrap();
    let e = env.display().to_string();
    let ph = "/opt/anaconda1anaconda2anaconda3";
    let long_ph = format!("/home/build/_h_env_placehold{}", "_placehold".repeat(8));
    let sp = format!("lib/python{v}/site-packages");
    let files: Vec<CondaFile> = vec![
        (
            format!("{sp}/demo/__init__.py"),
            b"from ._paths import DATA, ETC\ndef main():\n    print(open(DATA).read().strip(), ETC)\n"
                .to_vec(),
            None,
        ),
        (
            format!("{sp}/demo/_paths.py"),
            format!("DATA = \"{e}/share/demo/data.txt\"\nETC = \"{ph}/etc\"\n").into_bytes(),
            Some((ph, "text")),
        ),
        (
            "share/demo/data.txt".into(),
            b"demo data\n".to_vec(),
            None,
        ),
        (
            "bin/demo".into(),
            format!("#!{e}/bin/python{v}\nimport demo\ndemo.main()\n").into_bytes(),
            Some((ph, "text")),
        ),
        (
            "lib/libdemo.so".into(),
            [
                b"\x7fELF\x02\x01\x01\0".as_slice(),
                format!("{e}/share/demo:{e}/lib\0").as_bytes(),
                b"\x01\x02\x03\0".as_slice(),
                format!("{long_ph}/etc\0").as_bytes(),
                b"end\0".as_slice(),
            ]
            .concat(),
            Some((long_ph.as_str(), "binary")),
        ),
    ];
    let mut paths = Vec::new();
    for (rel, data, ph) in &files {
        let p = env.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, data).unwrap();
        let mut entry =
            serde_json::json!({"_path": rel, "path_type": "hardlink", "size_in_bytes": data.len()});
        if let Some((ph, mode)) = ph {
            entry["prefix_placeholder"] = serde_json::json!(ph);
            entry["file_mode"] = serde_json::json!(mode);
        }
        paths.push(entry);
    }
    std::fs::set_permissions(
        env.join("bin/demo"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::create_dir_all(env.join("conda-meta")).unwrap();
    let meta = serde_json::json!({
        "name": "demo", "version": "1.0", "build": "0",
        "files": files.iter().map(|f| f.0.clone()).collect::<Vec<_>>(),
        "paths_data": {"paths_version": 1, "paths": paths},
    });
    std::fs::write(env.join("conda-meta/demo-1.0-0.json"), meta.to_string()).unwrap();
    let py = serde_json::json!({"name": "python", "version": v, "build": "0", "files": [format!("bin/python{v}")],
        "paths_data": {"paths_version": 1, "paths": [{"_path": format!("bin/python{v}"), "path_type": "hardlink"}]}});
    std::fs::write(env.join("conda-meta/python-0.json"), py.to_string()).unwrap();
    let o = run(&mut Command::new(env.join("bin/demo")));
    assert_eq!(o.stdout, format!("demo data {ph}/etc\n"), "{}", o.stderr);

    // a binary file cannot take a longer prefix: refused, naming it, nothing left behind
    let out = d.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let too_long = format!("/{}", "x".repeat(e.len() + 1));
    let o = run(sw()
        .args(["build", "--no-compress", "--name", "demo", "--from-env"])
        .arg(&env)
        .arg("--env-prefix")
        .arg(&too_long)
        .arg(out.join("demo.sqfs")));
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert_contains_all(
        &o.stderr,
        &[
            &format!("{e}/lib/libdemo.so"),
            "demo-1.0-0.json",
            "is longer than the original",
            &format!("at most {} bytes", e.len()),
        ],
        "longer prefix",
    );
    let left: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "left behind {left:?}");

    // where the package will be seen: the tree unpacked below, shorter than the original
    let moved = d.path().join("m");
    let pkg = moved.join("install/demo/1");
    let pool = out.join("demo.sqfs");
    let o = run(sw()
        .args(["build", "--no-compress", "--name", "demo", "--from-env"])
        .arg(&env)
        .arg("--env-prefix")
        .arg(&pkg)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_contains_all(
        &o.stdout,
        &[
            "conda environment, Python 3.",
            "2 packages",
            "2 files rewritten for their prefix placeholder",
        ],
        "build",
    );
    let i = sw_run(&["inspect", "--no-check", pool.to_str().unwrap()]);
    assert_eq!(i.code, 0, "{}", i.stderr);
    assert_contains_all(
        &i.stdout,
        &[
            "Python environment: conda (Python 3.",
            "2 packages",
            "inodes on shared storage as a tree, 1 as this pool",
        ],
        "inspect",
    );
    let o = run(Command::new("unsquashfs")
        .arg("-q")
        .arg("-d")
        .arg(&moved)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let gone = d.path().join("conda.gone");
    std::fs::rename(d.path().join("conda"), &gone).unwrap();

    // text: replaced; binary: replaced in its C strings, padded with NULs to the same length
    let p = pkg.display().to_string();
    let paths_py = std::fs::read_to_string(pkg.join(format!("{sp}/demo/_paths.py"))).unwrap();
    assert_eq!(
        paths_py,
        format!("DATA = \"{p}/share/demo/data.txt\"\nETC = \"{p}/etc\"\n")
    );
    let orig = &files[4].1;
    let bin = std::fs::read(pkg.join("lib/libdemo.so")).unwrap();
    assert_eq!(bin.len(), orig.len());
    let s1 = format!("{p}/share/demo:{p}/lib\0");
    let pad1 = 2 * (e.len() - p.len());
    let s2 = format!("{p}/etc\0");
    let pad2 = long_ph.len() - p.len();
    let want = [
        b"\x7fELF\x02\x01\x01\0".as_slice(),
        s1.as_bytes(),
        &vec![0u8; pad1],
        b"\x01\x02\x03\0",
        s2.as_bytes(),
        &vec![0u8; pad2],
        b"end\0",
    ]
    .concat();
    assert_eq!(bin, want);
    // the interpreter, the module and the entry point run from the moved tree, and nothing opens
    // the original one
    let trace = d.path().join("strace.log");
    let o = run(Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=%file", "-o"])
        .arg(&trace)
        .arg(pkg.join("bin/demo")));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, format!("demo data {p}/etc\n"));
    let log = std::fs::read_to_string(&trace).unwrap();
    let hits = touching(&log, &env);
    assert!(
        hits.is_empty(),
        "the moved pool touched {e}:\n{}",
        hits.join("\n")
    );
    let o = run(
        Command::new(pkg.join("bin/python")).args(["-c", "import os, sys; print(os.__file__)"])
    );
    assert!(
        o.stdout.starts_with(&format!("{p}/lib/python{v}/os.py")),
        "{}{}",
        o.stdout,
        o.stderr
    );
}

/// The interpreter uv would download, laid out by hand where uv's managed Pythons live
/// (`$HOME/.local/share/uv/python/cpython-3.X.Y-linux-x86_64-gnu/`: uv cannot download one
/// here), and `uv` itself from the package registry (cached under target/); without uv, a venv
/// over the same interpreter (its `home` points there all the same).
#[test]
fn uv_environment_over_a_managed_python_includes_it() {
    let d = scratch();
    let home = d.path().join("home");
    let o =
        run(Command::new("python3")
            .args(["-c", "import platform; print(platform.python_version())"]));
    let full = o.stdout.trim().to_string();
    let managed = home.join(format!(
        ".local/share/uv/python/cpython-{full}-linux-x86_64-gnu"
    ));
    let v = standalone_python(&managed);
    std::os::unix::fs::symlink(format!("python{v}"), managed.join("bin/python3")).unwrap();
    let uv_venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pyenv-uv");
    let uv = uv_venv.join("bin/uv");
    if !uv.exists() {
        let o = run(Command::new("python3").arg("-m").arg("venv").arg(&uv_venv));
        assert_eq!(o.code, 0, "{}", o.stderr);
        let o = run(Command::new(uv_venv.join("bin/pip")).args(["install", "-q", "uv"]));
        if o.code != 0 {
            eprintln!("uv is not installable from the registry: {}", o.stderr);
        }
    }
    let env = d.path().join("proj-uv");
    let py = managed.join(format!("bin/python{v}"));
    let kind = if uv.exists() {
        let o = run(Command::new(&uv)
            .arg("venv")
            .arg("--python")
            .arg(&py)
            .arg(&env)
            .env("HOME", &home)
            .env("UV_CACHE_DIR", d.path().join("uv-cache"))
            .env("UV_PYTHON_DOWNLOADS", "never")
            .env("UV_NO_CONFIG", "1"));
        assert_eq!(o.code, 0, "uv venv: {}", o.stderr);
        "uv"
    } else {
        skip("uv not available: a venv over the managed interpreter instead");
        let o = run(Command::new(&py)
            .arg("-m")
            .arg("venv")
            .arg("--without-pip")
            .arg(&env));
        assert_eq!(o.code, 0, "{}", o.stderr);
        "venv"
    };
    let cfg = std::fs::read_to_string(env.join("pyvenv.cfg")).unwrap();
    assert!(
        cfg.contains(&format!("{}", managed.join("bin").display())),
        "{cfg}"
    );
    let pool = d.path().join("proj-uv.sqfs");
    let o = run(sw()
        .args(["build", "--no-compress", "--from-env"])
        .arg(&env)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_contains_all(
        &o.stdout,
        &[
            &format!("{kind} environment, Python {full}"),
            &format!("interpreter included from {}", py.display()),
        ],
        "build",
    );
    // inspect: kind, version, and the inodes the tree takes on shared storage against 1
    let i = sw_run(&["inspect", "--no-check", pool.to_str().unwrap()]);
    assert_eq!(i.code, 0, "{}", i.stderr);
    assert_contains_all(
        &i.stdout,
        &[
            &format!("Python environment: {kind} (Python {full})"),
            "inodes on shared storage as a tree, 1 as this pool",
        ],
        "inspect",
    );
    let moved = d.path().join("elsewhere");
    let o = run(Command::new("unsquashfs")
        .arg("-q")
        .arg("-d")
        .arg(&moved)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    std::fs::rename(&home, d.path().join("home.gone")).unwrap();
    std::fs::rename(&env, d.path().join("proj-uv.gone")).unwrap();
    let pkg = moved.join("install/proj-uv/1");
    let trace = d.path().join("strace.log");
    let o = run(Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=%file", "-o"])
        .arg(&trace)
        .arg(pkg.join("bin/python"))
        .args([
            "-c",
            "import os, sys, json, decimal; print(os.__file__); print(sys.prefix)",
        ]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let l: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        Path::new(l[0]),
        pkg.join(format!("interpreter/lib/python{v}/os.py"))
    );
    assert_eq!(Path::new(l[1]), pkg);
    let log = std::fs::read_to_string(&trace).unwrap();
    for forbidden in [&home, &env] {
        let hits = touching(&log, forbidden);
        assert!(
            hits.is_empty(),
            "the moved pool touched {}:\n{}",
            forbidden.display(),
            hits.join("\n")
        );
    }
}

/// `bundle --python` with the interpreter in the bundle and `build --from-env` lay the standard
/// library out by one rule (`lib/pythonX.Y` two levels above the interpreter's real path, where
/// CPython looks): from either pool, `os` is imported from inside the pool.
#[test]
fn bundled_interpreter_and_env_pool_find_the_standard_library_in_the_pool() {
    let d = scratch();
    let probe = "import os, sys; print(os.__file__)";
    let exe = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let name = exe.file_name().unwrap().to_str().unwrap().to_string();
    let v = name.trim_start_matches("python").to_string();
    let out = d.path().join("b.sqfs");
    let o = run(sw()
        .args(["bundle", "--name", "pyb", "--version", "1", "-o"])
        .arg(&out)
        .arg(&exe)
        .args(["--python", "--trace", "--"])
        .arg(&exe)
        .args(["-c", probe]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let b = d.path().join("b");
    let o = run(Command::new("unsquashfs")
        .arg("-q")
        .arg("-d")
        .arg(&b)
        .arg(&out));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let pkg = b.join("install/pyb/1");
    let o = run(Command::new(pkg.join("bin").join(&name)).args(["-c", probe]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        Path::new(o.stdout.trim()),
        pkg.join(format!("lib/python{v}/os.py")),
        "bundle: {}",
        o.stderr
    );

    let env = d.path().join("e");
    let o = run(Command::new(&exe)
        .args(["-m", "venv", "--without-pip"])
        .arg(&env));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let pool = d.path().join("e.sqfs");
    let o = run(sw()
        .args(["build", "--no-compress", "--from-env"])
        .arg(&env)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let m = d.path().join("em");
    let o = run(Command::new("unsquashfs")
        .arg("-q")
        .arg("-d")
        .arg(&m)
        .arg(&pool));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let pkg = m.join("install/e/1");
    let o = run(Command::new(pkg.join("bin/python")).args(["-c", probe]));
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        Path::new(o.stdout.trim()),
        pkg.join(format!("interpreter/lib/python{v}/os.py")),
        "from-env: {}",
        o.stderr
    );
}
