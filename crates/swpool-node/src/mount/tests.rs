//! Ordering and clean-up of mount/unmount, with the recording fake.

use super::sys::{Call, FakeHelper, FakeScript, FakeSys, Mounts, Processes};
use super::*;
use crate::exec::Tool;

fn image() -> ImageInfo {
    ImageInfo {
        path: PathBuf::from("/pools/demo.sqfs"),
        format: ImageFormat::Squashfs,
        backend: Backend::SquashfuseLl,
        pool: None,
        writable: false,
        serve: None,
    }
}

fn setup(helper: FakeHelper) -> (tempfile::TempDir, PathBuf, FakeSys) {
    let d = tempfile::tempdir().unwrap();
    let mp = std::fs::canonicalize(d.path()).unwrap().join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let sys = FakeSys::new(FakeScript {
        helper,
        euid: 1000,
        ..Default::default()
    });
    (d, mp, sys)
}

fn any(sys: &FakeSys, f: impl Fn(&Call) -> bool) -> bool {
    sys.count(f) > 0
}

#[test]
fn options() {
    assert!(MountOptions::parse(None).is_ok());
    assert!(MountOptions::parse(Some("ro,nosuid")).is_ok());
    assert!(!MountOptions::parse(Some("ro,nosuid")).unwrap().writable());
    assert!(MountOptions::parse(Some("rw")).unwrap().writable());
    assert!(MountOptions::parse(Some("ro,suid")).is_err());
    assert!(MountOptions::parse(Some("exec,foo"))
        .unwrap_err()
        .to_string()
        .contains("unknown option"));
}

#[test]
fn backend_from_format_and_command_lines() {
    assert_eq!(Backend::for_format(ImageFormat::Ext2), Backend::Fuse2fs);
    assert_eq!(
        Backend::for_format(ImageFormat::Squashfs),
        Backend::SquashfuseLl
    );
    let c = Backend::SquashfuseLl.command(Path::new("/a/i.sqfs"), Path::new("/m"));
    assert_eq!(
        c.cmdline(),
        "squashfuse_ll -f -o ro,nosuid,nodev /a/i.sqfs /m"
    );
    let c = Backend::Fuse2fs.command(Path::new("/a/i.ext4"), Path::new("/m"));
    assert_eq!(
        c.cmdline(),
        "fuse2fs /a/i.ext4 /m -f -o ro,nosuid,nodev,fakeroot"
    );
}

#[test]
fn a_served_image_runs_its_helper_under_the_chunk_server_on_the_served_file() {
    let (_d, mp, sys) = setup(FakeHelper::MountsAfter(1));
    let mut img = image();
    img.serve = Some(serve::Serve {
        dir: PathBuf::from("/state/k.serve"),
        digest: "blake3:ab".into(),
        keep: None,
        source: None,
    });
    let m = mount(&sys, &img, &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(m.helper_pid, 4242);
    let calls = sys.calls();
    let Some(Call::Spawn { tool, args }) = calls.iter().find(|c| matches!(c, Call::Spawn { .. }))
    else {
        panic!("{calls:?}")
    };
    assert_eq!(*tool, Tool::ChunkServer);
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mpd = mp.display().to_string();
    assert_eq!(
        args,
        [
            "--pool",
            "/pools/demo.sqfs",
            "--digest",
            "blake3:ab",
            "--dir",
            "/state/k.serve",
            "--",
            "squashfuse_ll",
            "-f",
            "-o",
            "ro,nosuid,nodev",
            "/state/k.serve/image",
            mpd.as_str()
        ]
    );
}

#[test]
fn mount_checks_then_opens_fuse_then_spawns_then_waits() {
    let (_d, mp, sys) = setup(FakeHelper::MountsAfter(3));
    let m = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(m.helper_pid, 4242);
    assert!(
        matches!(
            sys.calls().as_slice(),
            [
                Call::OpenFuseDevice,
                Call::Spawn {
                    tool: Tool::SquashfuseLl,
                    ..
                },
                Call::Release(4242)
            ]
        ),
        "{:?}",
        sys.calls()
    );
    assert!(proc::mount_at(&sys.mount_table(), &mp).is_some());
}

#[test]
fn helper_failure_kills_only_our_child_and_reports_stderr_with_hint() {
    let (_d, mp, sys) = setup(FakeHelper::Exits(
        2,
        "Squashfs version 0.0 detected, only version 4.0 supported.".into(),
    ));
    let e = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains("version 0.0") && s.contains("damaged") && s.contains(&mp.display().to_string()),
        "{s}"
    );
    assert_eq!(e.exit_status(), ExitStatus::InvalidPool);
    assert!(
        matches!(
            sys.calls().as_slice(),
            [
                Call::OpenFuseDevice,
                Call::Spawn {
                    tool: Tool::SquashfuseLl,
                    ..
                },
                Call::Exited(4242),
                Call::KillHelper(4242)
            ]
        ),
        "{:?}",
        sys.calls()
    );
    assert!(sys.mount_table().is_empty());
}

#[test]
fn timeout_kills_the_helper_and_leaves_nothing_mounted() {
    let (_d, mp, sys) = setup(FakeHelper::Hangs);
    let e = mount(
        &sys,
        &image(),
        &mp,
        Path::new("/log"),
        Duration::from_millis(30),
    )
    .unwrap_err();
    assert!(
        matches!(&e, MountError::Helper(h) if h.status.is_none()),
        "{e}"
    );
    let k = sys.calls();
    assert_eq!(k.last(), Some(&Call::KillHelper(4242)), "{k:?}");
    assert!(sys.mount_table().is_empty());
    // the deadline passed on the fake's clock: no real waiting
    assert!(
        sys.slept() >= Duration::from_millis(30),
        "{:?}",
        sys.slept()
    );
}

#[test]
fn unusable_dev_fuse_fails_before_spawning() {
    let (_d, mp, sys) = setup(FakeHelper::Mounts);
    sys.script.lock().unwrap().fuse_device = Some(std::io::ErrorKind::PermissionDenied);
    let e = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
    assert!(e.to_string().contains("0666"), "{e}");
    assert_eq!(sys.calls(), [Call::OpenFuseDevice]);
    sys.script.lock().unwrap().fuse_device = Some(std::io::ErrorKind::NotFound);
    let e = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
    assert!(e.to_string().contains("modprobe fuse"), "{e}");
}

#[test]
fn helper_not_installed_names_the_package() {
    let (_d, mp, sys) = setup(FakeHelper::NotInstalled);
    let e = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
    assert!(e.to_string().contains("apt-get install squashfuse"), "{e}");
    assert_eq!(e.exit_status(), ExitStatus::Tool);
    assert!(!any(&sys, |c| matches!(c, Call::KillHelper(_))));
}

#[test]
fn bad_mount_points_are_refused_before_anything_runs() {
    let (d, mp, sys) = setup(FakeHelper::Mounts);
    // missing
    let missing = mp.join("nope");
    assert!(
        mount(&sys, &image(), &missing, Path::new("/l"), DEFAULT_TIMEOUT)
            .unwrap_err()
            .to_string()
            .contains("does not exist")
    );
    // a file
    let f = d.path().join("file");
    std::fs::write(&f, "x").unwrap();
    let f = std::fs::canonicalize(&f).unwrap();
    assert!(mount(&sys, &image(), &f, Path::new("/l"), DEFAULT_TIMEOUT)
        .unwrap_err()
        .to_string()
        .contains("not a directory"));
    // a symlink to a directory
    let l = mp.parent().unwrap().join("link");
    std::os::unix::fs::symlink(&mp, &l).unwrap();
    assert!(mount(&sys, &image(), &l, Path::new("/l"), DEFAULT_TIMEOUT)
        .unwrap_err()
        .to_string()
        .contains("symbolic link"));
    // not empty
    std::fs::write(mp.join("x"), "x").unwrap();
    assert!(mount(&sys, &image(), &mp, Path::new("/l"), DEFAULT_TIMEOUT)
        .unwrap_err()
        .to_string()
        .contains("not empty"));
    std::fs::remove_file(mp.join("x")).unwrap();
    // already a mount point
    sys.script.lock().unwrap().mounts.push(
        FakeSys::new(FakeScript::default())
            .mount_table()
            .pop()
            .unwrap_or(MountEntry {
                mount_id: 1,
                mount_point: mp.clone(),
                mount_options: "rw".into(),
                fstype: "tmpfs".into(),
                source: "tmpfs".into(),
                super_options: "rw".into(),
                dev: "0:0".into(),
            }),
    );
    let e = mount(&sys, &image(), &mp, Path::new("/l"), DEFAULT_TIMEOUT)
        .unwrap_err()
        .to_string();
    assert!(e.contains("already a mount point"), "{e}");
    // nothing was ever started
    assert!(
        !any(&sys, |c| matches!(c, Call::Spawn { .. })),
        "{:?}",
        sys.calls()
    );
}

#[test]
fn unmount_busy_names_holders_and_needs_force() {
    let (_d, mp, sys) = setup(FakeHelper::Mounts);
    mount(&sys, &image(), &mp, Path::new("/l"), DEFAULT_TIMEOUT).unwrap();
    sys.script.lock().unwrap().busy = true;
    let e = unmount(&sys, &mp, false).unwrap_err();
    assert!(
        matches!(e, MountError::Busy { .. }) && e.to_string().contains("--force"),
        "{e}"
    );
    assert!(proc::mount_at(&sys.mount_table(), &mp).is_some());
    let u = unmount(&sys, &mp, true).unwrap();
    assert!(u.lazy);
    assert!(
        sys.calls().last().is_some_and(|c| c.is_unmount_run(true)
            && matches!(
                c,
                Call::Run {
                    tool: Tool::Fusermount3,
                    ..
                }
            )),
        "{:?}",
        sys.calls()
    );
    assert!(sys.mount_table().is_empty());
    // not mounted any more
    assert!(matches!(
        unmount(&sys, &mp, false),
        Err(MountError::NotMounted { .. })
    ));
}

#[test]
fn a_transiently_busy_mount_is_unmounted_after_a_retry() {
    let (_d, mp, sys) = setup(FakeHelper::Mounts);
    mount(&sys, &image(), &mp, Path::new("/l"), DEFAULT_TIMEOUT).unwrap();
    sys.script.lock().unwrap().busy_transient = 2;
    let u = unmount(&sys, &mp, false).unwrap();
    assert!(!u.lazy, "no lazy detach for a transient holder");
    let tries = sys
        .calls()
        .iter()
        .filter(|c| c.is_unmount_run(false))
        .count();
    assert_eq!(tries, 3, "{:?}", sys.calls());
    assert!(sys.mount_table().is_empty());
}

#[test]
fn stale_mounts_are_detected_and_unmounted() {
    let (_d, mp, sys) = setup(FakeHelper::Mounts);
    mount(&sys, &image(), &mp, Path::new("/l"), DEFAULT_TIMEOUT).unwrap();
    sys.script.lock().unwrap().stale.push(mp.clone());
    let table = sys.mount_table();
    assert_eq!(state(&sys, &table, &mp), MountState::Stale);
    // a stale mount point cannot be mounted over
    let e = check_mountpoint(&sys, &mp).unwrap_err().to_string();
    assert!(e.contains("stale"), "{e}");
    let u = unmount(&sys, &mp, true).unwrap();
    assert!(u.was_stale && !u.lazy);
    assert_eq!(state(&sys, &sys.mount_table(), &mp), MountState::Absent);
}

#[test]
fn refuses_to_unmount_non_fuse() {
    let (_d, mp, sys) = setup(FakeHelper::Mounts);
    sys.script.lock().unwrap().mounts.push(MountEntry {
        mount_id: 1,
        mount_point: mp.clone(),
        mount_options: "rw".into(),
        fstype: "ext4".into(),
        source: "/dev/sda1".into(),
        super_options: "rw".into(),
        dev: "0:0".into(),
    });
    assert!(matches!(
        unmount(&sys, &mp, true),
        Err(MountError::NotOurs { .. })
    ));
    assert!(!any(&sys, |c| matches!(c, Call::Run { .. })));
}

#[test]
fn hints() {
    assert!(hint_for(
        "fuse: device not found, try 'modprobe fuse' first",
        Backend::SquashfuseLl,
        5
    )
    .contains("modprobe"));
    assert!(hint_for(
        "fusermount3: failed to open /dev/fuse: Permission denied",
        Backend::Fuse2fs,
        5
    )
    .contains("0666"));
    assert!(hint_for(
        "bad.ext4: Superblock checksum does not match superblock.",
        Backend::Fuse2fs,
        0
    )
    .contains("damaged"));
    assert!(hint_for(
        "fuse: failed to exec fusermount3: No such file or directory",
        Backend::SquashfuseLl,
        5
    )
    .contains("fuse3"));
}

/// The real implementation, with the real squashfuse_ll (root only: the host's /dev/fuse is 0600).
#[test]
fn real_sys_mounts_times_out_cleanly_and_unmounts() {
    let sys = RealSys::new(None); // root: tools from the system directories only
    if sys.euid() != 0 || sys.open_fuse_device().is_err() {
        // on the real stderr (not captured): `make test-unit` counts these lines
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIP real_sys_mounts_times_out_cleanly_and_unmounts: needs root and /dev/fuse"
        );
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    std::fs::create_dir(root.join("tree")).unwrap();
    std::fs::write(root.join("tree/f"), "real").unwrap();
    let img = root.join("i.sqfs");
    let st = std::process::Command::new("mksquashfs")
        .arg(root.join("tree"))
        .arg(&img)
        .args(["-quiet", "-noappend"])
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let info = ImageInfo::inspect(&img).unwrap();
    assert_eq!(info.backend, Backend::SquashfuseLl);
    let mp = root.join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let log = root.join("log");
    // unmount whatever is left if an assertion fails
    struct Guard(PathBuf);
    impl Drop for Guard {
        fn drop(&mut self) {
            let _ = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(&self.0)
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
    let _g = Guard(mp.clone());
    // a helper that hangs (its image is a FIFO nobody writes): stopped at the timeout, reaped
    let fifo = root.join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let hung = ImageInfo {
        path: fifo,
        ..info.clone()
    };
    let t0 = Instant::now();
    let e = mount(&sys, &hung, &mp, &log, Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(&e, MountError::Helper(h) if h.status.is_none()),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let s = e.to_string();
    assert!(s.contains("did not mount") && s.contains("stopped"), "{s}");
    let table = sys.mounts().unwrap();
    assert_eq!(state(&sys, &table, &mp), MountState::Absent);
    // a real mount
    let m = mount(&sys, &info, &mp, &log, DEFAULT_TIMEOUT).unwrap();
    assert_eq!(std::fs::read_to_string(mp.join("f")).unwrap(), "real");
    let table = sys.mounts().unwrap();
    let entry = proc::mount_at(&table, &mp).unwrap();
    assert!(entry.has_option("nosuid") && entry.has_option("nodev") && entry.has_option("ro"));
    assert_eq!(state(&sys, &table, &mp), MountState::Mounted);
    assert!(std::path::Path::new(&format!("/proc/{}", m.helper_pid)).exists());
    // busy: held by our own open directory? no — by a child's cwd
    let mut c = std::process::Command::new("sleep")
        .arg("30")
        .current_dir(&mp)
        .spawn()
        .unwrap();
    let e = unmount(&sys, &mp, false).unwrap_err();
    match &e {
        MountError::Busy { holders, .. } => assert!(holders.iter().any(|h| h.pid == c.id()), "{e}"),
        _ => panic!("{e}"),
    }
    c.kill().unwrap();
    c.wait().unwrap();
    let u = unmount(&sys, &mp, false).unwrap();
    assert!(!u.lazy && !u.was_stale);
    assert_eq!(state(&sys, &sys.mounts().unwrap(), &mp), MountState::Absent);
}

fn root(script: FakeScript) -> (tempfile::TempDir, PathBuf, FakeSys) {
    let (d, mp, _) = setup(FakeHelper::Mounts);
    let sys = FakeSys::new(FakeScript { euid: 0, ..script });
    (d, mp, sys)
}

#[test]
fn root_mounts_on_a_private_stage_then_moves_it_onto_the_checked_directory() {
    let (_d, mp, sys) = root(FakeScript::default());
    let m = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap();
    assert_eq!(m.mount_point, mp);
    let calls = sys.calls();
    let at = |f: &dyn Fn(&Call) -> bool| calls.iter().position(f).unwrap();
    let pin = at(&|c| matches!(c, Call::Pin(p) if *p == mp));
    let spawn = at(&|c| matches!(c, Call::Spawn { .. }));
    let attach = at(&|c| matches!(c, Call::Attach { to, .. } if *to == mp));
    assert!(pin < spawn && spawn < attach, "{calls:?}");
    // the helper never sees the user's path: it mounts on root's stage
    let Call::Spawn { args, .. } = &calls[spawn] else {
        unreachable!()
    };
    assert!(
        args.last().is_some_and(|a| a == "/run/sw-pool/stage-fake")
            && !args.iter().any(|a| Path::new(a).starts_with(&mp)),
        "{calls:?}"
    );
    assert!(
        calls.iter().any(|c| matches!(c, Call::RemoveStage(_))),
        "{calls:?}"
    );
    let t = sys.mount_table();
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0].mount_point, mp);
}

#[test]
fn root_mount_point_replaced_before_it_is_opened_mounts_nothing() {
    for script in [
        FakeScript {
            pin_errno: Some(libc::ELOOP),
            ..Default::default()
        },
        FakeScript {
            pin_other_inode: true,
            ..Default::default()
        },
    ] {
        let (_d, mp, sys) = root(script);
        let e = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
        assert!(matches!(e, MountError::Raced { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("the mount point changed while it was being mounted"),
            "{e}"
        );
        assert!(!e.to_string().contains("storage"), "{e}");
        assert_eq!(e.exit_status(), ExitStatus::System);
        assert!(
            !any(&sys, |c| matches!(c, Call::Spawn { .. })),
            "{:?}",
            sys.calls()
        );
        assert!(sys.mount_table().is_empty());
    }
}

#[test]
fn root_mount_that_cannot_land_on_the_checked_directory_is_undone() {
    for script in [
        FakeScript {
            attach_errno: Some(libc::ENOENT),
            ..Default::default()
        },
        FakeScript {
            attach_elsewhere: true,
            ..Default::default()
        },
        FakeScript {
            moved_after_attach: true,
            ..Default::default()
        },
    ] {
        let (_d, mp, sys) = root(script);
        let e = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
        assert!(matches!(e, MountError::Raced { .. }), "{e}");
        assert!(sys.mount_table().is_empty(), "{:?}", sys.mount_table());
        assert!(
            any(&sys, |c| matches!(c, Call::RemoveStage(_))),
            "{:?}",
            sys.calls()
        );
    }
}

/// Root's mount landed elsewhere (a user moved the checked directory) while an older FUSE mount of
/// root's, moved there by the same user, sits at the mount point's path: the new mount is undone,
/// and the older one is neither taken for it (recorded with its ID) nor touched.
#[test]
fn root_mount_is_known_by_its_own_id_not_by_what_sits_at_the_path() {
    let (_d, mp, sys) = root(FakeScript {
        attach_elsewhere: true,
        decoy_at_target: true,
        ..Default::default()
    });
    let e = mount(&sys, &image(), &mp, Path::new("/log"), DEFAULT_TIMEOUT).unwrap_err();
    assert!(matches!(e, MountError::Raced { .. }), "{e}");
    assert!(
        any(&sys, |c| matches!(c, Call::Detach(_))),
        "{:?}",
        sys.calls()
    );
    let table = sys.mount_table();
    assert_eq!(table.len(), 1, "{table:?}");
    assert_eq!(table[0].mount_id, super::sys::DECOY_ID);
    assert_eq!(table[0].mount_point, mp);
}

fn pool_image() -> ImageInfo {
    ImageInfo {
        pool: Some(PoolId {
            name: "demo".into(),
            version: "1".into(),
            digest: "blake3:cd".into(),
        }),
        ..image()
    }
}

fn spawned(sys: &FakeSys) -> Vec<(Tool, Vec<String>)> {
    sys.calls()
        .iter()
        .filter_map(|c| match c {
            Call::Spawn { tool, args } => Some((
                *tool,
                args.iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect(),
            )),
            _ => None,
        })
        .collect()
}

#[path = "tree_tests.rs"]
mod tree_tests;
