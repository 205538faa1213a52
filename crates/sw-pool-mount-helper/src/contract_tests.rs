//! The refusals of the helper's contract (SECURITY.md, "The mount helper": one test or more per
//! row of its table, named after the row) and the order of the calls on the granted paths, driven
//! through the recording fake of the `Host` seam: no root, no loop device, no mount. Each refusal
//! checks the rule that refused it, the exit status, and that nothing was mounted or left (no
//! mount, no loop device, no directory, no record).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use swpool_format::status::ExitStatus;
use swpool_sys::sys::FileKind;

use crate::caller::Caller;
use crate::config::HelperConfig;
use crate::error::{HelperError, Refusal};
use crate::host::fake::{Call, FakeHost, UserFile};
use crate::host::Holder;
use crate::image::{mount_image, umount};
use crate::state::Record;

const UID: u32 = 1000;
const HOME: &str = "/run/u/ann";

fn cfg(extra: &str) -> HelperConfig {
    toml::from_str(&format!(
        "user_mount_root = \"/run/u\"\nfile_timeout_secs = 2\ntool_timeout_secs = 30\n{extra}"
    ))
    .unwrap()
}

fn ann() -> Caller {
    Caller::fake(UID, "ann")
}

/// A fake node with ann's image `/home/ann/a.img` (ino 10) on ext4.
fn node() -> FakeHost {
    let h = FakeHost::new();
    h.f.files
        .borrow_mut()
        .insert("/home/ann/a.img".into(), UserFile::own(UID, 10));
    h
}

fn refused(r: Result<impl std::fmt::Debug, HelperError>, rule: Refusal, text: &str) -> String {
    let e = r.expect_err("refused");
    assert_eq!(e.rule(), Some(rule), "{e}");
    assert_eq!(e.status(), ExitStatus::BadInput, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(text), "{msg:?} lacks {text:?}");
    msg
}

/// Nothing mounted, no loop device, no directory under the caller's, no record.
fn nothing_left(h: &FakeHost) {
    let calls = h.calls();
    assert!(
        !calls.iter().any(|c| matches!(c, Call::Mount { .. })) || h.mounted().is_empty(),
        "{calls:?}"
    );
    assert!(h.mounted().is_empty(), "left mounted: {:?}", h.mounted());
    assert_eq!(h.loops_left(), 0, "a loop device left: {calls:?}");
    let left: Vec<_> = h
        .beneath(HOME)
        .into_iter()
        .filter(|p| !p.starts_with(format!("{HOME}/old")))
        .collect();
    assert!(left.is_empty(), "directories left: {left:?}");
    assert!(h.f.records.borrow().mounts.is_empty());
}

fn mount(
    h: &FakeHost,
    cfg: &HelperConfig,
    img: &str,
    mp: &str,
    rw: bool,
) -> crate::error::Result<crate::image::ImageMounted> {
    mount_image(h, cfg, &ann(), Path::new(img), Path::new(mp), rw, None)
}

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

// --- row: a pool signed only by a user's own key, or unsigned (the keys' directory)

#[test]
fn row_trust_a_helper_without_site_keys_mounts_no_pool() {
    let d = tempfile::tempdir().unwrap();
    let cfg = cfg(&format!(
        "trusted_keys = {:?}",
        d.path().join("none").display().to_string()
    ));
    let e = crate::pool::site_keys(&cfg).unwrap_err();
    assert_eq!(e.status(), ExitStatus::Trust, "{e}");
    assert!(
        e.to_string().contains("only pools signed by a site key"),
        "{e}"
    );
}

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
    let e = crate::shadow::shadow(&cfg(""), &ann(), Path::new("/nonexistent/p.pool"), None)
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
