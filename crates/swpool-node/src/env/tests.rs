use super::*;
use std::process::Command;

fn pm(p: &str, nv: Option<(&str, &str)>) -> PoolMount {
    PoolMount {
        mount_point: PathBuf::from(p),
        pool: nv.map(|(n, v)| (n.to_string(), v.to_string())),
    }
}

/// Apply changes to a snapshot (what the shell would end up with).
fn apply(s: &Snapshot, ch: &[Change]) -> Snapshot {
    let mut s = s.clone();
    for c in ch {
        let k = match c {
            Change::Set(k, _) | Change::Unset(k) => *k,
        };
        assert!(
            [
                "MODULEPATH",
                "SW_POOL_MOUNT",
                "GWDG_SW_MOUNT",
                LOADED_VAR,
                SET_MOUNT_VAR,
                SET_GWDG_VAR
            ]
            .contains(&k),
            "{k}"
        );
        s.apply(c);
    }
    s
}

#[test]
fn load_then_unload_restores_exactly() {
    let before = Snapshot {
        modulepath: Some("/opt/mf:/site/mf".into()),
        ..Default::default()
    };
    let m = pm("/run/u/mnt/demo/1.0", Some(("demo", "1.0")));
    let after = apply(&before, &load_changes(&before, &m));
    assert_eq!(
        after.modulepath.as_deref(),
        Some("/run/u/mnt/demo/1.0/modulefiles:/opt/mf:/site/mf")
    );
    assert_eq!(after.sw_pool_mount.as_deref(), Some("/run/u/mnt"));
    assert_eq!(after.gwdg_sw_mount.as_deref(), Some("/run/u/mnt"));
    let back = apply(&after, &unload_changes(&after, &m));
    assert_eq!(back, before);
}

#[test]
fn two_pools_and_double_loads_are_counted() {
    let s0 = Snapshot::default();
    let a = pm("/m/a/1", Some(("a", "1")));
    let b = pm("/m/b/2", Some(("b", "2")));
    let s1 = apply(&s0, &load_changes(&s0, &a));
    let s2 = apply(&s1, &load_changes(&s1, &b));
    let s3 = apply(&s2, &load_changes(&s2, &a)); // a loaded twice
    assert_eq!(
        s3.modulepath.as_deref(),
        Some("/m/b/2/modulefiles:/m/a/1/modulefiles")
    );
    let s4 = apply(&s3, &unload_changes(&s3, &a));
    assert!(
        s4.modulepath
            .as_deref()
            .unwrap()
            .contains("/m/a/1/modulefiles"),
        "still loaded once"
    );
    let s5 = apply(&s4, &unload_changes(&s4, &a));
    assert_eq!(s5.modulepath.as_deref(), Some("/m/b/2/modulefiles"));
    assert_eq!(
        s5.sw_pool_mount.as_deref(),
        Some("/m"),
        "b still uses the root"
    );
    let s6 = apply(&s5, &unload_changes(&s5, &b));
    assert_eq!(s6, s0);
}

#[test]
fn user_settings_are_kept_and_elsewhere_mounts_do_not_set_the_root() {
    let s0 = Snapshot {
        sw_pool_mount: Some("/site/sw".into()),
        ..Default::default()
    };
    let m = pm("/tmp/x/mnt", Some(("demo", "1.0")));
    let ch = load_changes(&s0, &m);
    assert!(!ch.iter().any(|c| matches!(
        c,
        Change::Set("SW_POOL_MOUNT", _) | Change::Set("GWDG_SW_MOUNT", _)
    )));
    let s1 = apply(&s0, &ch);
    let s2 = apply(&s1, &unload_changes(&s1, &m));
    assert_eq!(s2, s0);
    // a user's SW_POOL_MOUNT equal to the root is not unset on unload
    let s0 = Snapshot {
        sw_pool_mount: Some("/m".into()),
        ..Default::default()
    };
    let m = pm("/m/a/1", Some(("a", "1")));
    let s1 = apply(&s0, &load_changes(&s0, &m));
    let s2 = apply(&s1, &unload_changes(&s1, &m));
    assert_eq!(s2, s0);
}

#[test]
fn unload_removes_the_entry_even_if_this_shell_did_not_add_it() {
    let s = Snapshot {
        modulepath: Some("/x/modulefiles:/m/a/1/modulefiles:/y".into()),
        ..Default::default()
    };
    let m = pm("/m/a/1", Some(("a", "1")));
    let s2 = apply(&s, &unload_changes(&s, &m));
    assert_eq!(s2.modulepath.as_deref(), Some("/x/modulefiles:/y"));
}

#[test]
fn shells_parse() {
    assert_eq!("/bin/bash".parse::<Shell>().unwrap(), Shell::Sh);
    assert_eq!("-zsh".parse::<Shell>().unwrap(), Shell::Sh);
    assert_eq!("tcsh".parse::<Shell>().unwrap(), Shell::Csh);
    assert_eq!("fish".parse::<Shell>().unwrap(), Shell::Fish);
    assert!("pwsh".parse::<Shell>().is_err());
}

const ODD: &str = "/tmp/it's a \"dir\" $HOME `x` !1 \\n;|&*";

#[test]
fn sh_quoting_survives_a_real_shell() {
    let code = render(
        Shell::Sh,
        &[
            Change::Set("MODULEPATH", ODD.into()),
            Change::Unset("GWDG_SW_MOUNT"),
        ],
    )
    .unwrap();
    for sh in ["sh", "bash"] {
        let o = Command::new(sh)
            .arg("-c")
            .arg(format!("GWDG_SW_MOUNT=x; {code} printf '%s|%s' \"$MODULEPATH\" \"${{GWDG_SW_MOUNT-unset}}\""))
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!("{ODD}|unset"),
            "{sh}: {code}"
        );
    }
}

#[test]
fn csh_quoting_survives_a_real_csh() {
    let code = render(Shell::Csh, &[Change::Set("MODULEPATH", ODD.into())]).unwrap();
    assert!(render(Shell::Csh, &[Change::Set("X", "a\nb".into())]).is_err());
    let Ok(o) = Command::new("csh")
        .arg("-f")
        .arg("-c")
        .arg(format!("{code} printf '%s' \"$MODULEPATH:q\""))
        .output()
    else {
        panic!("csh is needed for this test (apt-get install csh)");
    };
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        ODD,
        "{code} {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn fish_quoting_survives_a_real_fish() {
    let code = render(
        Shell::Fish,
        &[
            Change::Set("MODULEPATH", format!("{ODD}:/b")),
            Change::Unset("GWDG_SW_MOUNT"),
        ],
    )
    .unwrap();
    let o = Command::new("fish")
        .arg("--no-config")
        .arg("-c")
        .arg(format!("set -gx GWDG_SW_MOUNT x; {code} sh -c 'printf \"%s|%s\" \"$MODULEPATH\" \"${{GWDG_SW_MOUNT-unset}}\"'"))
        .output()
        .expect("fish is needed for this test (apt-get install fish)");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("{ODD}:/b|unset"),
        "{code} {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn fish_statements() {
    let code = render(
        Shell::Fish,
        &[Change::Set("A", "it's \\ x".into()), Change::Unset("B")],
    )
    .unwrap();
    assert_eq!(code, "set -gx A 'it\\'s \\\\ x';\nset -e B;\n");
}
