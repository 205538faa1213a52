//! The caller's file rows: whose it is, what it holds, a file or tool that stalls, the limits.

use super::*;

// --- row: an image owned by someone else, a symlink, a FIFO, a device, a file the caller cannot read

#[test]
fn row_image_not_the_callers_own_regular_file_is_refused_after_opening_it_as_the_caller() {
    let cases: [(UserFile, Refusal, &str); 5] = [
        (
            UserFile::own(2000, 11),
            Refusal::NotOwnImage,
            "belongs to uid 2000",
        ),
        (
            UserFile::Errno(libc::ELOOP),
            Refusal::FileOpen,
            "it is a symlink",
        ),
        (
            UserFile::File {
                kind: FileKind::Other,
                uid: UID,
                fs_type: 0xEF53,
                ino: 12,
            },
            Refusal::NotOwnImage,
            "not a regular file",
        ),
        (
            UserFile::Errno(libc::EACCES),
            Refusal::FileOpen,
            "you cannot open it",
        ),
        (
            UserFile::Errno(libc::ENOENT),
            Refusal::FileOpen,
            "nothing was done",
        ),
    ];
    for (file, rule, text) in cases {
        let h = node();
        h.f.files
            .borrow_mut()
            .insert("/home/ann/x.img".into(), file);
        refused(
            mount(&h, &cfg(""), "/home/ann/x.img", "/run/u/ann/d", false),
            rule,
            text,
        );
        assert_eq!(
            h.calls(),
            [Call::OpenAs {
                path: "/home/ann/x.img".into(),
                as_uid: Some(UID),
                write: false,
                locked: false
            }],
            "opened once, as the caller; nothing else"
        );
        nothing_left(&h);
    }
}

// --- row: a crafted, corrupt ext4 image

#[test]
fn row_corrupt_image_e2fsck_must_find_it_clean_before_the_kernel_sees_it() {
    for (answer, text) in [
        (
            (4, "e2fsck 1.47\nPass 1: inode 12 bad\nmore\n", ""),
            "sw-pool image check --repair /home/ann/a.img",
        ),
        (
            (8, "", "Bad magic number in super-block"),
            "is not an ext2/3/4 image",
        ),
    ] {
        let h = node();
        h.f.tools.borrow_mut().insert(
            "e2fsck".into(),
            vec![Ok((answer.0, answer.1.into(), answer.2.into()))],
        );
        let e = mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/d", false).unwrap_err();
        assert_eq!(e.status(), ExitStatus::InvalidPool, "{e}");
        assert!(e.to_string().contains(text), "{e}");
        assert!(!h
            .calls()
            .iter()
            .any(|c| matches!(c, Call::AttachLoop { .. } | Call::Mount { .. })));
        nothing_left(&h);
    }
}

// --- row: a user who stalls the helper, or fills the node's loop devices

#[test]
fn row_stall_a_file_that_does_not_answer_is_refused_naming_the_setting() {
    let h = node();
    h.f.files
        .borrow_mut()
        .insert("/home/ann/s.img".into(), UserFile::Stalls);
    refused(
        mount(&h, &cfg(""), "/home/ann/s.img", "/run/u/ann/d", false),
        Refusal::Stalled,
        "file_timeout_secs",
    );
    assert_eq!(h.calls().len(), 1);
    nothing_left(&h);
    // e2fsck past tool_timeout_secs: killed, refused, nothing made
    let h = node();
    h.f.tools
        .borrow_mut()
        .insert("e2fsck".into(), vec![Err(())]);
    refused(
        mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/d", false),
        Refusal::Stalled,
        "tool_timeout_secs",
    );
    nothing_left(&h);
}

#[test]
fn row_stall_images_on_fuse_are_refused_outright() {
    let h = node();
    h.f.files.borrow_mut().insert(
        "/home/ann/f.img".into(),
        UserFile::File {
            kind: FileKind::File,
            uid: UID,
            fs_type: crate::bounded::FUSE_SUPER_MAGIC,
            ino: 13,
        },
    );
    refused(
        mount(&h, &cfg(""), "/home/ann/f.img", "/run/u/ann/d", false),
        Refusal::OnFuse,
        "FUSE file system",
    );
    assert!(
        !h.calls().iter().any(|c| matches!(c, Call::Tool { .. })),
        "not even e2fsck reads it"
    );
    nothing_left(&h);
}

#[test]
fn row_stall_the_records_are_never_locked_while_a_users_bytes_are_read_or_a_tool_runs() {
    let h = node();
    mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/d", true).unwrap();
    for c in h.calls() {
        match c {
            Call::OpenAs { locked, .. }
            | Call::Tool { locked, .. }
            | Call::AttachLoop { locked, .. }
            | Call::Mount { locked, .. } => assert!(!locked, "{c:?} under the lock"),
            _ => {}
        }
    }
}

#[test]
fn row_stall_the_users_limit_and_a_second_mount_are_refused_naming_them() {
    let h = node();
    h.f.files
        .borrow_mut()
        .insert("/home/ann/b.img".into(), UserFile::own(UID, 11));
    let c = cfg("max_images_per_user = 1");
    mount(&h, &c, "/home/ann/a.img", "/run/u/ann/one", false).unwrap();
    let before = h.mounted();
    let msg = refused(
        mount(&h, &c, "/home/ann/b.img", "/run/u/ann/two", false),
        Refusal::Limit,
        "max_images_per_user = 1",
    );
    assert!(
        msg.contains("/run/u/ann/one") && msg.contains("unmount one first"),
        "{msg}"
    );
    assert!(!h.exists("/run/u/ann/two"));
    // the same image again, read-write beside read-only: refused
    let c = cfg("");
    refused(
        mount(&h, &c, "/home/ann/a.img", "/run/u/ann/two", true),
        Refusal::Limit,
        "already mounted",
    );
    assert!(!h.exists("/run/u/ann/two"));
    assert_eq!(h.mounted(), before);
    assert_eq!(h.f.records.borrow().mounts.len(), 1);
}

#[test]
fn row_stall_a_mount_made_meanwhile_is_found_by_the_second_check_and_undone() {
    let h = node();
    // while e2fsck runs (unlocked), another call of ann's mounts this same image read-write
    *h.f.meanwhile.borrow_mut() = Some(Box::new(|r: &mut crate::state::Records| {
        r.mounts.push(Record::Image {
            image: "/home/ann/a.img".into(),
            dev: 7,
            ino: 10,
            owner: UID,
            user: "ann".into(),
            rw: true,
            job: None,
            mount_point: "/run/u/ann/other".into(),
            mount_id: 9,
            loop_device: "loop3".into(),
            mnt_ns: 1,
        })
    }));
    refused(
        mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/d", false),
        Refusal::Limit,
        "already mounted",
    );
    let calls = h.calls();
    let mounted = calls
        .iter()
        .position(|c| matches!(c, Call::Mount { .. }))
        .unwrap();
    assert!(
        calls[mounted..].contains(&Call::Detach("/run/u/ann/d".into())),
        "{calls:?}"
    );
    assert!(!calls.contains(&Call::Save), "nothing recorded");
    assert!(h.mounted().is_empty());
    assert!(!h.exists("/run/u/ann/d"), "its directory removed");
    assert_eq!(
        h.f.records.borrow().mounts.len(),
        1,
        "only the other call's record"
    );
}

#[test]
fn row_stall_a_mount_the_kernel_refuses_frees_its_loop_device_and_directories() {
    let h = node();
    h.f.mount_fails.set(Some(libc::EINVAL));
    let e = mount(&h, &cfg(""), "/home/ann/a.img", "/run/u/ann/a/b", false).unwrap_err();
    assert_eq!(e.status(), ExitStatus::System, "{e}");
    assert!(e.to_string().contains("nothing was mounted"), "{e}");
    assert!(h.calls().contains(&Call::FreeLoop("loop7".into())));
    nothing_left(&h);
}

#[test]
fn row_turned_off_user_images_and_read_write_mounts_are_refused_first() {
    let h = node();
    refused(
        mount(
            &h,
            &cfg("user_images = false"),
            "/home/ann/a.img",
            "/run/u/ann/d",
            false,
        ),
        Refusal::TurnedOff,
        "user_images = false",
    );
    refused(
        mount(
            &h,
            &cfg("user_images_rw = false"),
            "/home/ann/a.img",
            "/run/u/ann/d",
            true,
        ),
        Refusal::TurnedOff,
        "user_images_rw = false",
    );
    assert!(h.calls().is_empty());
}
