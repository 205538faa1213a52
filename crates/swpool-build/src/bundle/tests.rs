use super::*;

#[test]
fn globs() {
    assert!(glob_match("libmpi*", "libmpi.so.40"));
    assert!(glob_match("libc.so.*", "libc.so.6"));
    assert!(!glob_match("libc.so.*", "libcrypt.so.1"));
    assert!(glob_match("*verbs*", "libibverbs.so.1"));
    assert!(glob_match("libz.so.1", "libz.so.1"));
    assert!(!glob_match("libz.so.1", "libz.so.12"));
}

#[test]
fn origin_paths() {
    assert_eq!(
        origin_path(Path::new("bin/x"), Path::new("lib/liba.so.1")),
        "$ORIGIN/../lib/liba.so.1"
    );
    assert_eq!(
        origin_path(Path::new("lib/liba.so"), Path::new("lib/libb.so")),
        "$ORIGIN/libb.so"
    );
    assert_eq!(
        origin_path(Path::new("python/pkg/sub/m.so"), Path::new("lib/libm0.so")),
        "$ORIGIN/../../../lib/libm0.so"
    );
}

#[test]
fn excludes() {
    let o = BundleOptions {
        inputs: vec![],
        name: None,
        version: None,
        out: "x".into(),
        force: false,
        python: None,
        trace: None,
        trace_prefixes: vec![],
        exclude: vec!["libfoo*".into()],
        include: vec!["libm.so.6".into()],
        no_default_excludes: false,
        link: LinkMode::Needed,
        ld_library_path: None,
        pythonpath: None,
        path_var: None,
    };
    let e = Excludes::new(&o);
    assert!(e.reason(&["libc.so.6"]).unwrap().contains("C library"));
    assert!(e.reason(&["libmpi.so.40"]).unwrap().contains("MPI"));
    assert!(e.reason(&["libibverbs.so.1"]).is_some());
    assert!(e.reason(&["libfoo.so.3"]).unwrap().contains("--exclude"));
    assert!(e.reason(&["libm.so.6"]).is_none());
    assert!(e.reason(&["libz.so.1"]).is_none());
    // a traced file: by the name it was opened under or the one it resolves to
    let lib = Path::new("/opt/x/lib");
    assert!(traced_exclusion(&e, &lib.join("libc.so.6"), &lib.join("libc.so.6"), false).is_some());
    assert!(traced_exclusion(&e, &lib.join("app.so"), &lib.join("libfoo.so.3"), false).is_some());
    assert!(traced_exclusion(&e, &lib.join("libm.so.6"), &lib.join("libm.so.6"), false).is_none());
    assert!(traced_exclusion(&e, &lib.join("data.txt"), &lib.join("data.txt"), false).is_none());
}

fn options(out: PathBuf) -> BundleOptions {
    BundleOptions {
        inputs: vec![],
        name: None,
        version: None,
        out,
        force: false,
        python: None,
        trace: None,
        trace_prefixes: vec![],
        exclude: vec![],
        include: vec![],
        no_default_excludes: false,
        link: LinkMode::Needed,
        ld_library_path: None,
        pythonpath: None,
        path_var: None,
    }
}

fn image() -> ImageOptions {
    ImageOptions {
        chunk_size: 1 << 20,
        squashfs_level: None,
        source_date_epoch: None,
    }
}

#[test]
fn bad_requests_are_refused_before_anything_is_written() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("b.sqfs");
    let refused = |o: BundleOptions| match bundle(&o, &image()) {
        Err(e) => {
            // nothing beside OUT: no trace directory, no tree
            let left: Vec<_> = std::fs::read_dir(t.path()).unwrap().flatten().collect();
            assert!(left.is_empty(), "{e}: left {left:?}");
            e
        }
        Ok(_) => panic!("bundled"),
    };
    // `--trace --` with no command after it
    let e = refused(BundleOptions {
        trace: Some(vec![]),
        trace_prefixes: vec![t.path().into()],
        ..options(out.clone())
    });
    assert!(matches!(e, BundleError::Usage(_)), "{e}");
    assert!(e.to_string().contains("--trace needs a command"), "{e}");
    // nothing to bundle
    let e = refused(options(out.clone()));
    assert_eq!(e.exit_status(), ExitStatus::Usage, "{e}");
    // --python without a traced command
    let e = refused(BundleOptions {
        inputs: vec!["/bin/true".into()],
        python: Some(None),
        ..options(out.clone())
    });
    assert!(e.to_string().contains("add --trace"), "{e}");
    // an input that is not there: named
    let e = refused(BundleOptions {
        inputs: vec![t.path().join("nope")],
        ..options(out.clone())
    });
    assert!(e.to_string().contains("nope"), "{e}");
}

#[test]
fn python_is_probed_once() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("probes");
    let python = d.path().join("python3");
    std::fs::write(
        &python,
        format!(
            "#!/bin/sh\necho probe >> '{}'\n\
             echo '{{\"executable\": \"/nonexistent/python3\", \"version\": \"3.99\", \"path\": [], \"stdlib\": []}}'\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let o = BundleOptions {
        python: Some(Some(python)),
        trace: Some(vec!["/nonexistent/command".into()]),
        ..options(d.path().join("out"))
    };
    // the traced command does not exist: the bundle fails after the probe, leaving nothing
    let e = bundle(&o, &image()).unwrap_err();
    assert!(matches!(e, BundleError::Trace(_)), "{e}");
    let probes = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(probes.lines().count(), 1, "probes: {probes:?}");
    // the interpreter and its log only
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 2);
}
