//! The granted image mount and unmount, and the mount point rows.

use super::*;

// --- the granted paths: the order of the calls

#[test]
fn a_granted_image_mount_opens_as_the_caller_checks_unlocked_and_mounts_on_roots_directory() {
    let h = node();
    let m = mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/x/y", false).unwrap();
    assert_eq!(m.loop_device, "loop7");
    let calls = h.calls();
    let open = Call::OpenAs {
        path: "/home/ann/a.img".into(),
        as_uid: Some(UID),
        write: false,
        locked: false,
    };
    assert_eq!(calls[0], open, "the caller's file first, as the caller");
    assert_eq!(
        calls[1..3],
        [Call::Lock, Call::Unlock],
        "records: only to check"
    );
    assert!(
        matches!(&calls[3], Call::Tool { tool, args, limit, locked: false }
            if tool == "e2fsck" && args[0] == "-fn" && *limit == Duration::from_secs(30)),
        "{:?}",
        calls[3]
    );
    let rest: Vec<_> = calls[4..]
        .iter()
        .filter(|c| !matches!(c, Call::Mkdir(_)))
        .cloned()
        .collect();
    assert_eq!(
        rest,
        [
            Call::AttachLoop {
                label: "/home/ann/a.img".into(),
                rw: false,
                locked: false
            },
            Call::Mount {
                at: "/run/u/ann/x/y".into(),
                fstype: "ext4".into(),
                source: "/dev/loop7".into(),
                read_only: true,
                noexec: true,
                locked: false,
            },
            Call::Lock,
            Call::Save,
            Call::Unlock,
        ]
    );
    // every directory of the mount point made by root, 0755
    for d in ["/run/u", HOME, "/run/u/ann/x", "/run/u/ann/x/y"] {
        assert_eq!(h.owner_mode(d), Some((0, 0o755)), "{d}");
    }
    assert_eq!(h.mounted(), [PathBuf::from("/run/u/ann/x/y")]);
    assert!(matches!(
        &h.f.records.borrow().mounts[..],
        [Record::Image {
            owner: UID,
            rw: false,
            ..
        }]
    ));

    // and the unmount: by its ID, under the lock, then the directories go (the user's stays)
    let before = h.calls().len();
    umount(&h, &cfg(""), &ann(), Path::new("/run/u/ann/x/y")).unwrap();
    let calls = h.calls()[before..].to_vec();
    assert_eq!(calls[0], Call::Lock);
    assert!(
        matches!(calls[1], Call::Unmount { lazy: false, .. }),
        "{calls:?}"
    );
    assert_eq!(calls[2], Call::Save);
    assert_eq!(
        calls[3..],
        [
            Call::Unlink("/run/u/ann/x/y".into()),
            Call::Unlink("/run/u/ann/x".into()),
            Call::Unlock
        ]
    );
    assert!(h.exists(HOME));
    nothing_left(&h);
}

#[test]
fn a_read_write_mount_is_opened_for_writing_and_exec_only_where_the_admin_allows_it() {
    let h = node();
    mount(
        &h,
        &cfg("user_images_exec = true"),
        "/home/ann/a.img",
        "/run/u/ann/w",
        true,
    )
    .unwrap();
    assert!(h.calls().contains(&Call::OpenAs {
        path: "/home/ann/a.img".into(),
        as_uid: Some(UID),
        write: true,
        locked: false
    }));
    assert!(h.calls().iter().any(|c| matches!(
        c,
        Call::Mount {
            read_only: false,
            noexec: false,
            ..
        }
    )));
}

// --- row: a mount point that is, or passes through, a symlink; `..`; one swapped or renamed

#[test]
fn row_mount_point_dots_and_control_characters_are_refused_before_anything_is_opened() {
    for mp in [
        "/run/u/ann/d/../../bob/x",
        "/run/u/ann/./x",
        "/run/u/ann/a\nb",
        "run/u/ann/x",
    ] {
        let h = node();
        refused(
            mount(&h, &cfg(""), "/home/ann/a.img", mp, false),
            Refusal::Path,
            "",
        );
        assert!(h.calls().is_empty(), "{mp:?}: {:?}", h.calls());
    }
    let h = node();
    refused(
        mount(
            &h,
            &cfg(""),
            "/home/ann/../bob/b.img",
            "/run/u/ann/x",
            false,
        ),
        Refusal::Path,
        "without '.' or '..'",
    );
    assert!(h.calls().is_empty());
}

#[test]
fn row_mount_point_a_symlink_on_the_way_is_removed_never_followed() {
    let h = node();
    h.make_dirs(HOME, UID);
    h.add("/run/u/ann/to-etc", FileKind::Symlink, UID, 0o777);
    mount(
        &h,
        &cfg(""),
        "/home/ann/a.img",
        "/run/u/ann/to-etc/x",
        false,
    )
    .unwrap();
    assert!(h
        .calls()
        .contains(&Call::Unlink("/run/u/ann/to-etc".into())));
    assert_eq!(
        h.owner_mode("/run/u/ann/to-etc"),
        Some((0, 0o755)),
        "made again, root's"
    );
    assert!(!h.exists("/etc/x"));
    assert_eq!(
        h.owner_mode(HOME),
        Some((0, 0o755)),
        "the older version's directory taken over"
    );
    assert!(h.calls().contains(&Call::Adopt(HOME.into())));
}

#[test]
fn row_mount_point_a_mount_on_the_way_or_a_users_non_empty_directory_is_refused() {
    // a mount (the user's FUSE) on a directory of the tree: refused, never entered
    let h = node();
    h.make_dirs("/run/u/ann/fuse", 0);
    h.mount_there("/run/u/ann/fuse");
    refused(
        mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/fuse/x", false),
        Refusal::MountPoint,
        "is a mount point already",
    );
    assert!(!h.exists("/run/u/ann/fuse/x"));
    assert!(h.mounted().is_empty() && h.loops_left() == 0);
    // the caller's own directory with their files in it: refused, left as it is
    let h = node();
    h.make_dirs("/run/u/ann/old", 0);
    h.add("/run/u/ann/old/full", FileKind::Dir, UID, 0o755);
    h.add("/run/u/ann/old/full/f", FileKind::File, UID, 0o644);
    refused(
        mount(
            &h,
            &cfg(""),
            "/home/ann/a.img",
            "/run/u/ann/old/full/x",
            false,
        ),
        Refusal::MountPoint,
        "not empty: its owner empties it",
    );
    assert_eq!(h.owner_mode("/run/u/ann/old/full"), Some((UID, 0o755)));
    nothing_left(&h);
    // a file where a directory should be
    let h = node();
    h.make_dirs(HOME, 0);
    h.add("/run/u/ann/f", FileKind::File, 0, 0o644);
    refused(
        mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/f/x", false),
        Refusal::MountPoint,
        "is not a directory",
    );
    // a mount point that is not empty
    let h = node();
    h.make_dirs("/run/u/ann/full", 0);
    h.add("/run/u/ann/full/f", FileKind::File, 0, 0o644);
    refused(
        mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/full", false),
        Refusal::MountPoint,
        "is not empty",
    );
    assert!(h.mounted().is_empty() && h.loops_left() == 0);
    // another user's directory in the caller's place; a root tree others can write
    let h = node();
    h.make_dirs(HOME, 777);
    refused(
        mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/x", false),
        Refusal::MountPoint,
        "belongs to uid 777",
    );
    let h = node();
    h.add("/run", FileKind::Dir, 0, 0o755);
    h.add("/run/u", FileKind::Dir, 0, 0o777);
    refused(
        mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/x", false),
        Refusal::MountPoint,
        "only root can write",
    );
    assert!(!h.exists(HOME));
}

// --- row: a mount point outside the configured roots

#[test]
fn row_outside_the_roots_etc_usr_and_another_users_directory_are_refused() {
    for mp in [
        "/etc",
        "/usr",
        "/run/u/bob/decoy",
        "/run/u/ann",
        "/run/u/annex/x",
        "/var/tmp/x",
    ] {
        let h = node();
        refused(
            mount(&h, &cfg(""), "/home/ann/a.img", mp, false),
            Refusal::OutsideRoot,
            "is not under /run/u/ann/",
        );
        assert!(
            !h.calls().iter().any(|c| matches!(
                c,
                Call::Mkdir(_) | Call::AttachLoop { .. } | Call::Mount { .. }
            )),
            "{mp}: {:?}",
            h.calls()
        );
        nothing_left(&h);
    }
}
