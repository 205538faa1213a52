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
        "import swpdemo, scipy.stats, scipy; print(swpdemo.VERSION, scipy.__version__)"
    } else {
        "import swpdemo; print(swpdemo.VERSION)"
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
    let cases: [(&Path, &[&str]); 3] = [
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
