//! The other requests' rows: trust, job ids, unmounts and cleanup, the environment, shadow, idmap.

use super::*;

// --- row: --job-id of someone else's job

#[test]
fn row_job_id_of_another_users_job_is_refused_as_slurm_says() {
    let limit = Duration::from_secs(30);
    let h = FakeHost::new();
    h.f.tools.borrow_mut().insert(
        "squeue".into(),
        vec![
            Ok((0, "2000\n".into(), String::new())),
            Ok((
                1,
                String::new(),
                "slurm_load_jobs error: Invalid job id specified".into(),
            )),
            Ok((0, "1000\n".into(), String::new())),
            Err(()),
        ],
    );
    let conf = Some(Path::new("/etc/slurm/slurm.conf"));
    refused(
        crate::caller::check_job(&h, &ann(), "77", conf, limit),
        Refusal::Job,
        "belongs to uid 2000",
    );
    refused(
        crate::caller::check_job(&h, &ann(), "999999", conf, limit),
        Refusal::Job,
        "not a running Slurm job",
    );
    crate::caller::check_job(&h, &ann(), "78_1", conf, limit).unwrap();
    // a squeue that does not answer is killed after the limit: refused as a tool failure
    let e = crate::caller::check_job(&h, &ann(), "79", conf, limit).unwrap_err();
    assert_eq!(e.status(), ExitStatus::Tool, "{e}");
    assert!(e.to_string().contains("tool_timeout_secs"), "{e}");
    for c in h.calls() {
        let Call::Tool {
            tool,
            args,
            limit: l,
            locked,
        } = c
        else {
            panic!("{c:?}")
        };
        assert_eq!((tool.as_str(), l, locked), ("squeue", limit, false));
        assert_eq!(
            args[..3],
            [OsString::from("-h"), "-j".into(), args[2].clone()]
        );
    }
    // a malformed id never reaches Slurm; root's jobs are not asked about
    let h = FakeHost::new();
    for bad in ["", "1;rm", "-j", "12 34"] {
        refused(
            crate::caller::check_job(&h, &ann(), bad, None, limit),
            Refusal::Job,
            "not a Slurm job id",
        );
    }
    crate::caller::check_job(&h, &Caller::fake(0, "root"), "5", None, limit).unwrap();
    assert!(h.calls().is_empty());
}

// --- row: records, loop devices and mounts left behind

#[test]
fn row_records_unmount_only_your_own_mount_by_its_id_and_never_lazily() {
    let h = node();
    mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/d", true).unwrap();
    let bob = Caller::fake(2000, "bob");
    refused(
        umount(&h, &cfg(""), &bob, Path::new("/run/u/ann/d")),
        Refusal::NotMounted,
        "is not yours",
    );
    refused(
        umount(&h, &cfg(""), &ann(), Path::new("/run/u/ann/e")),
        Refusal::NotMounted,
        "nothing the helper mounted",
    );
    // busy: left mounted and recorded, saying what to do
    h.f.busy.set(1);
    let e = umount(&h, &cfg(""), &ann(), Path::new("/run/u/ann/d")).unwrap_err();
    assert_eq!(e.status(), ExitStatus::System);
    assert!(e.to_string().contains("fuser -vm"), "{e}");
    assert_eq!(h.mounted(), [PathBuf::from("/run/u/ann/d")]);
    assert_eq!(h.f.records.borrow().mounts.len(), 1);
    assert!(h
        .calls()
        .iter()
        .all(|c| !matches!(c, Call::Unmount { lazy: true, .. })));
    // root may unmount anyone's
    umount(
        &h,
        &cfg(""),
        &Caller::fake(0, "root"),
        Path::new("/run/u/ann/d"),
    )
    .unwrap();
    nothing_left(&h);
}

#[test]
fn row_records_cleanup_kill_ends_only_the_owners_holders_in_this_namespace_and_retries_bounded() {
    use swpool_sys::sys::Call as SysCall;
    let h = node();
    mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/d", true).unwrap();
    let id = 500; // the fake's first mount
    let holder = |pid, uid, same_ns| Holder {
        pid,
        uid: Some(uid),
        command: "sh".into(),
        same_ns,
    };
    *h.f.holders.borrow_mut() = vec![
        holder(4001, UID, true),
        holder(4002, 2000, true), // another user's
        holder(4003, UID, false), // another mount namespace: another file maybe
        holder(1, UID, true),     // never PID 1
    ];
    h.f.sys.ours.lock().unwrap().push(4001);
    // without --kill: busy means left mounted
    h.f.busy.set(1);
    let mut killed = Vec::new();
    let e =
        crate::cleanup::unmount_image(&h, id, Path::new("/run/u/ann/d"), UID, false, &mut killed)
            .unwrap_err();
    assert!(e.to_string().contains("cleanup --kill"), "{e}");
    assert!(killed.is_empty() && h.f.sys.calls().is_empty());
    // with --kill: the owner's holder here is ended, then the unmount tried again (busy twice more)
    h.f.busy.set(3);
    crate::cleanup::unmount_image(&h, id, Path::new("/run/u/ann/d"), UID, true, &mut killed)
        .unwrap();
    assert_eq!(killed, ["4001 (sh)"]);
    assert_eq!(h.f.sys.calls(), [SysCall::Terminate(4001)]);
    assert!(h.mounted().is_empty());
    // a holder that never lets go: 50 tries, 100 ms apart on the (virtual) clock, then busy
    let h2 = node();
    mount(&h2, &cfg(""), "/home/ann/a.img", "/run/u/ann/d", true).unwrap();
    h2.f.busy.set(1000);
    let e = crate::cleanup::unmount_image(
        &h2,
        500,
        Path::new("/run/u/ann/d"),
        UID,
        true,
        &mut Vec::new(),
    )
    .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY));
    assert_eq!(h2.f.sys.slept(), Duration::from_secs(5));
    assert_eq!(
        h2.mounted(),
        [PathBuf::from("/run/u/ann/d")],
        "left mounted, never detached lazily"
    );
}

// --- row: the caller's environment (tools from the system directories, empty environment)

#[test]
fn row_environment_tools_come_from_the_system_directories_with_an_empty_environment() {
    let Ok(cmd) = crate::tools::command("sh") else {
        panic!("no sh in {}", crate::tools::SAFE_PATH)
    };
    let prog = Path::new(cmd.get_program());
    assert!(
        crate::tools::SAFE_PATH
            .split(':')
            .any(|d| prog.parent() == Some(Path::new(d))),
        "{prog:?}"
    );
    let env: Vec<_> = cmd.get_envs().collect();
    assert!(env.contains(&("PATH".as_ref(), Some(crate::tools::SAFE_PATH.as_ref()))));
    assert!(
        env.iter().all(|(k, _)| *k == "PATH" || *k == "LC_ALL"),
        "{env:?}"
    );
    let e = crate::tools::command("no-such-tool-of-sw-pool").unwrap_err();
    assert_eq!(e.status(), ExitStatus::Tool);
    assert!(e.to_string().contains("not installed in /usr/sbin"), "{e}");
}

// --- row: shadow mounts (only with a configured shadow_root)

#[test]
fn row_shadow_a_node_without_shadow_root_makes_no_shadow_and_opens_nothing() {
    let e = crate::shadow::shadow(
        &FakeHost::new(),
        &cfg(""),
        &ann(),
        Path::new("/nonexistent/p.pool"),
        None,
    )
    .unwrap_err();
    assert_eq!(e.rule(), Some(Refusal::TurnedOff), "{e}");
    assert!(e.to_string().contains("no shadow_root"), "{e}");
}

// --- row: idmap --pid P

#[test]
fn row_idmap_only_the_callers_own_environment_with_exact_maps() {
    let trees = cfg("environment_trees = [\"/usr\"]");
    refused(
        crate::environment::idmap(&cfg(""), &ann(), 4242),
        Refusal::TurnedOff,
        "no environment_trees",
    );
    refused(
        crate::environment::idmap(&trees, &Caller::fake(0, "root"), 4242),
        Refusal::Process,
        "root's own",
    );
    for pid in [1, 0, -5] {
        refused(
            crate::environment::idmap(&trees, &ann(), pid),
            Refusal::Process,
            "not an environment's first process",
        );
    }
    use crate::environment::{judge_maps, judge_uids};
    let c = ann();
    judge_uids(&c, 9, &[UID; 4]).unwrap();
    for uids in [vec![UID, UID, UID, 0], vec![2000; 4], vec![UID; 3]] {
        refused(
            judge_uids(&c, 9, &uids),
            Refusal::Process,
            "not a process of ann's",
        );
    }
    judge_maps(&c, 9, "0 1000 1\n", "0 1000 1\n").unwrap();
    for (u, g, text) in [
        (
            "0 1000 1\n1 100000 65536\n",
            "0 1000 1",
            "uid map must be exactly `0 1000 1`",
        ),
        ("0 1000 2\n", "0 1000 1", "uid map"),
        ("0 0 1\n", "0 1000 1", "uid map"),
        ("0 1000 1\n", "0 0 1", "gid map must be exactly"),
        ("0 1000 1\n", "0 1000 1\n1 100000 65536", "gid map"),
    ] {
        refused(judge_maps(&c, 9, u, g), Refusal::Process, text);
    }
}
