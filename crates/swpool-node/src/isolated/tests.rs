use super::*;

#[test]
fn root_path_adds_the_sbin_directories_before_their_bin() {
    let p = |s: &str| root_path(Some(s.as_ref())).into_string().unwrap();
    assert_eq!(
        p("/home/u/bin:/usr/local/bin:/usr/bin:/bin"),
        "/home/u/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    );
    // already there: unchanged
    let full = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    assert_eq!(p(full), full);
    // a merged-/usr PATH without /bin: /sbin at the end
    assert_eq!(p("/usr/bin"), "/usr/sbin:/usr/bin:/usr/local/sbin:/sbin");
    // no PATH: a usual one
    assert_eq!(root_path(None), std::ffi::OsString::from(full));
}

/// An environment of no config file, HOME in `home`, outside a job.
fn bare(home: &std::path::Path) -> Environment {
    use crate::config::EnvVar;
    Environment::default()
        .with(EnvVar::SystemConfig, "")
        .with(EnvVar::UserConfig, "")
        .with(HostVar::Home, home)
}

fn no_warning(m: String) {
    panic!("unexpected warning: {m}");
}

#[test]
fn a_plain_run_is_the_commands_alone_unshared_with_the_hosts_home() {
    let t = tempfile::tempdir().unwrap();
    let env = bare(t.path());
    let p = prepare(Options::default(), vec!["true".into()], &env, &no_warning).unwrap();
    let r = &p.request;
    assert_eq!(r.argv, vec![OsString::from("true")]);
    assert_eq!(r.home.as_deref(), Some(t.path()));
    assert!(r.layer.is_none() && !r.root && !r.verbose);
    // not a job step, not under a launcher: nobody joins it, so no meeting place
    assert!(r.step_key.is_none() && r.state_dir.is_none());
    assert!(r.synced.is_none() && r.shadows.is_empty() && r.bases.is_empty() && r.pools.is_empty());
    // the layer store's default is under the home directory
    assert!(
        p.store.paths("x").dir.starts_with(t.path()),
        "{:?}",
        p.store.paths("x").dir
    );
    let v = prepare(
        Options {
            voice: Voice::Verbose,
            layer_dir: Some(t.path().join("layers")),
            ..Options::default()
        },
        vec!["true".into()],
        &env,
        &no_warning,
    )
    .unwrap();
    assert!(v.request.verbose);
    assert!(v.store.paths("x").dir.starts_with(t.path().join("layers")));
}

#[test]
fn refusals_name_the_option_and_what_to_do() {
    let t = tempfile::tempdir().unwrap();
    let env = bare(t.path());
    let refused = |o: Options, env: &Environment| {
        let e = prepare(o, vec!["true".into()], env, &no_warning)
            .err()
            .expect("refused");
        assert_eq!(e.status, ExitStatus::BadInput, "{e}");
        e.message
    };
    // --keep-upper outside a job: there is no node-local copy whose upper could be kept
    let m = refused(
        Options {
            layer: Some("dev".into()),
            keep_upper: Some(t.path().into()),
            ..Options::default()
        },
        &env,
    );
    assert!(
        m.contains("--keep-upper") && m.contains("layer sync"),
        "{m}"
    );
    // --shadow without the site's shadow_root
    let m = refused(
        Options {
            shadow: vec!["gcc/12".into()],
            ..Options::default()
        },
        &env,
    );
    assert!(m.contains("shadow_root"), "{m}");
    // --cache of a directory that is not there (or, in this test binary's directory, without
    // the view server beside it: either names --cache)
    let m = refused(
        Options {
            cache: vec![t.path().join("nope")],
            ..Options::default()
        },
        &env,
    );
    assert!(m.contains("--cache"), "{m}");
    // no HOME and no --layer-dir: no layer store
    let m = refused(
        Options::default(),
        &Environment::default()
            .with(crate::config::EnvVar::SystemConfig, "")
            .with(crate::config::EnvVar::UserConfig, ""),
    );
    assert!(m.contains("--layer-dir"), "{m}");
}

#[test]
fn a_job_steps_tasks_meet_by_the_step() {
    let t = tempfile::tempdir().unwrap();
    let step = bare(t.path())
        .with(HostVar::SlurmJobId, "41")
        .with(HostVar::SlurmStepId, "2");
    let k = step_key(&step).expect("a step's key");
    assert_eq!(step_key(&step), Some(k.clone()));
    let other = bare(t.path())
        .with(HostVar::SlurmJobId, "41")
        .with(HostVar::SlurmStepId, "3");
    assert_ne!(step_key(&other), Some(k));
    // a batch script (no step) alone
    assert!(step_key(&bare(t.path()).with(HostVar::SlurmJobId, "41")).is_none());
}
