//! Records and reference counts, with the recording fake for the mount itself.

use super::*;
use crate::mount::sys::{Call, FakeHelper, FakeScript, FakeSys, Processes};
use std::sync::Arc;

struct Env {
    _d: tempfile::TempDir,
    dir: StateDir,
    image: PathBuf,
    mp: PathBuf,
    sys: FakeSys,
}

fn env() -> Env {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let image = root.join("img.sqfs");
    let mut b = b"hsqs".to_vec();
    b.resize(8192, 0);
    std::fs::write(&image, b).unwrap();
    let mp = root.join("mnt");
    std::fs::create_dir(&mp).unwrap();
    let uid = rustix::process::geteuid().as_raw();
    let dir = StateDir::open(&root.join("state"), uid).unwrap();
    let sys = FakeSys::new(FakeScript {
        helper: FakeHelper::Mounts,
        euid: uid,
        ..Default::default()
    });
    Env {
        _d: d,
        dir,
        image,
        mp,
        sys,
    }
}

fn req(e: &Env, job: Option<&str>) -> AcquireRequest {
    AcquireRequest {
        image: e.image.clone(),
        mountpoint: e.mp.clone(),
        options: mount::MountOptions::default(),
        job_id: job.map(String::from),
        timeout: Duration::from_secs(5),
        once_per_job: false,
        shell: None,
        source: None,
        lease: None,
        serve: None,
        reader: mount::FuseReader::SquashfuseLl,
    }
}

fn spawns(sys: &FakeSys) -> usize {
    sys.count(|c| matches!(c, Call::Spawn { .. }))
}

#[test]
fn second_acquire_shares_the_mount_and_last_release_unmounts() {
    let e = env();
    let a = acquire(&e.sys, &e.dir, &req(&e, Some("11"))).unwrap();
    assert!(!a.reused && a.record.refcount() == 1);
    let b = acquire(&e.sys, &e.dir, &req(&e, Some("12"))).unwrap();
    assert!(b.reused && b.record.refcount() == 2);
    assert_eq!(b.record.job_ids(), ["11", "12"]);
    assert_eq!(spawns(&e.sys), 1);
    let r = release(&e.sys, &e.dir, &e.mp, false, Some("11")).unwrap();
    assert_eq!(r.remaining, 1);
    assert!(r.unmounted.is_none());
    assert_eq!(e.dir.read(&e.mp).unwrap().unwrap().job_ids(), ["12"]);
    let r = release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
    assert_eq!(r.remaining, 0);
    assert!(r.unmounted.is_some());
    assert!(e.dir.read(&e.mp).unwrap().is_none());
    assert!(e.sys.mount_table().is_empty());
    // nothing left to release
    let err = release(&e.sys, &e.dir, &e.mp, false, None).unwrap_err();
    assert!(err.to_string().contains("not mounted"), "{err}");
    assert_eq!(
        std::fs::read_dir(e.dir.path().join("mounts"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn find_pool_by_name_and_version() {
    let e = env();
    // the test image is a bare one: give its record a pool identity
    let mut rec = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap().record;
    assert!(e.dir.find_pool("demo", "1.0").unwrap().is_empty());
    rec.pool = Some(mount::PoolId {
        name: "demo".into(),
        version: "1.0".into(),
        digest: "sha256:00".into(),
    });
    e.dir.write(&rec).unwrap();
    let f = e.dir.find_pool("demo", "1.0").unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].mount_point, e.mp);
    assert!(e.dir.find_pool("demo", "2.0").unwrap().is_empty());
    release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
}

#[test]
fn failed_mount_leaves_no_record_and_no_log() {
    let e = env();
    e.sys.script.lock().unwrap().helper = FakeHelper::Exits(1, "boom".into());
    assert!(acquire(&e.sys, &e.dir, &req(&e, None)).is_err());
    assert_eq!(
        std::fs::read_dir(e.dir.path().join("mounts"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn different_image_at_the_same_mount_point_is_a_conflict() {
    let e = env();
    acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    let other = e.image.with_file_name("other.sqfs");
    std::fs::copy(&e.image, &other).unwrap();
    let mut r = req(&e, None);
    r.image = other;
    let err = acquire(&e.sys, &e.dir, &r).unwrap_err().to_string();
    assert!(
        err.contains("already has img.sqfs (") && err.contains("mounted"),
        "{err}"
    );
    release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
}

#[test]
fn stale_and_gone_mounts_are_listed_and_cleaned() {
    let e = env();
    acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    e.sys.script.lock().unwrap().stale.push(e.mp.clone());
    let l = list(&e.sys, &e.dir).unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].status, ListStatus::Stale);
    // a new acquire refuses, naming the fix
    let err = acquire(&e.sys, &e.dir, &req(&e, None))
        .unwrap_err()
        .to_string();
    assert!(err.contains("umount --force"), "{err}");
    let r = release(&e.sys, &e.dir, &e.mp, true, None).unwrap();
    assert!(r.unmounted.unwrap().was_stale);
    assert!(list(&e.sys, &e.dir).unwrap().is_empty());
    // a record whose mount disappeared
    acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    e.sys.script.lock().unwrap().mounts.clear();
    assert_eq!(list(&e.sys, &e.dir).unwrap()[0].status, ListStatus::Gone);
    let a = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    assert!(
        !a.reused && a.notes[0].contains("record replaced"),
        "{:?}",
        a.notes
    );
    release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
}

#[test]
fn unrecorded_fuse_mounts_are_listed() {
    let e = env();
    let uid = e.sys.euid();
    e.sys
        .script
        .lock()
        .unwrap()
        .mounts
        .push(MountEntryFor(uid, "/x/y"));
    let l = list(&e.sys, &e.dir).unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l[0].status, ListStatus::Unrecorded);
    // someone else's is not ours to report
    e.sys.script.lock().unwrap().mounts[0] = MountEntryFor(uid + 1, "/x/y");
    assert!(list(&e.sys, &e.dir).unwrap().is_empty());
}

#[allow(non_snake_case)]
fn MountEntryFor(uid: u32, p: &str) -> mount::MountEntry {
    mount::MountEntry {
        mount_id: 7,
        mount_point: PathBuf::from(p),
        mount_options: "ro,nosuid,nodev".into(),
        fstype: "fuse.squashfuse_ll".into(),
        source: "squashfuse_ll".into(),
        super_options: format!("ro,user_id={uid},group_id=0"),
        dev: "0:0".into(),
    }
}

#[test]
fn corrupt_foreign_and_symlinked_records_are_refused_clearly() {
    let e = env();
    let p = e.dir.record_path(&e.mp);
    std::fs::write(&p, "{ not json").unwrap();
    let err = acquire(&e.sys, &e.dir, &req(&e, None))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unreadable") && err.contains(&p.display().to_string()),
        "{err}"
    );
    assert_eq!(spawns(&e.sys), 0);
    assert_eq!(list(&e.sys, &e.dir).unwrap()[0].status, ListStatus::Corrupt);
    // a symlink in its place is never followed
    std::fs::remove_file(&p).unwrap();
    let target = e.dir.path().join("elsewhere.json");
    std::fs::write(&target, "{}").unwrap();
    std::os::unix::fs::symlink(&target, &p).unwrap();
    let err = acquire(&e.sys, &e.dir, &req(&e, None))
        .unwrap_err()
        .to_string();
    assert!(err.contains("symbolic link"), "{err}");
    std::fs::remove_file(&p).unwrap();
    // a valid record for another mount point under this name
    let mut a = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap().record;
    a.mount_point = PathBuf::from("/somewhere/else");
    std::fs::write(&p, serde_json::to_vec(&a).unwrap()).unwrap();
    let err = release(&e.sys, &e.dir, &e.mp, false, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("/somewhere/else"), "{err}");
    // --force cleans it
    release(&e.sys, &e.dir, &e.mp, true, None).unwrap();
}

#[test]
fn unsafe_state_directories_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let uid = rustix::process::geteuid().as_raw();
    let open = std::fs::canonicalize(d.path()).unwrap().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let e = StateDir::open(&open, uid).unwrap_err().to_string();
    assert!(e.contains("writable by others"), "{e}");
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&open, &link).unwrap();
    assert!(StateDir::open(&link, uid)
        .unwrap_err()
        .to_string()
        .contains("symbolic link"));
    let e = StateDir::open(&d.path().join("x"), uid + 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not to you"), "{e}");
    // a fresh one is created private
    let p = d.path().join("fresh");
    StateDir::open(&p, uid).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o700);
}

#[test]
fn fifty_threads_acquire_and_release_one_mount() {
    let e = Arc::new(env());
    let n = 50;
    let hs: Vec<_> = (0..n)
        .map(|i| {
            let e = e.clone();
            std::thread::spawn(move || {
                let job = format!("{i}");
                let a = acquire(&e.sys, &e.dir, &req(&e, Some(&job))).unwrap();
                assert!(a.record.refcount() >= 1);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let rec = e.dir.read(&e.mp).unwrap().unwrap();
    assert_eq!(rec.refcount(), n);
    assert_eq!(spawns(&e.sys), 1);
    let hs: Vec<_> = (0..n)
        .map(|i| {
            let e = e.clone();
            std::thread::spawn(move || {
                release(&e.sys, &e.dir, &e.mp, false, Some(&format!("{i}"))).unwrap()
            })
        })
        .collect();
    let unmounts = hs
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|r| r.unmounted.is_some())
        .count();
    assert_eq!(unmounts, 1);
    assert!(e.dir.read(&e.mp).unwrap().is_none());
    assert!(e.sys.mount_table().is_empty());
    // no temporary file left behind
    assert_eq!(
        std::fs::read_dir(e.dir.path().join("mounts"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn records_of_other_nodes_in_a_shared_directory_are_left_alone() {
    let e = env();
    let mut rec = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap().record;
    // node2's record for the same mount point, as if /run were shared
    rec.node = "node2-elsewhere".into();
    let other = e.dir.path().join("mounts").join(format!(
        "{}.json",
        StateDir::key(&rec.node, &rec.mount_point)
    ));
    std::fs::write(&other, serde_json::to_vec(&rec).unwrap()).unwrap();
    let l = list(&e.sys, &e.dir).unwrap();
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0].record.as_ref().unwrap().node, hostname());
    release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
    assert!(other.exists(), "another node's record must survive");
    assert!(list(&e.sys, &e.dir).unwrap().is_empty());
}

fn sel_job(j: &str) -> Selection {
    Selection {
        job: Some(j.into()),
        ..Default::default()
    }
}

#[test]
fn cleanup_of_one_job_keeps_the_mount_another_job_uses() {
    let e = env();
    acquire(&e.sys, &e.dir, &req(&e, Some("11"))).unwrap();
    acquire(&e.sys, &e.dir, &req(&e, Some("12"))).unwrap();
    acquire(&e.sys, &e.dir, &req(&e, Some("11"))).unwrap();
    let a = clean(&e.sys, &e.dir, &sel_job("11")).unwrap();
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0].action, "released");
    assert!(
        a[0].detail.contains("dropped 2 reference(s) of job 11"),
        "{a:?}"
    );
    let rec = e.dir.read(&e.mp).unwrap().unwrap();
    assert_eq!(rec.job_ids(), ["12"]);
    assert_eq!(e.sys.mount_table().len(), 1);
    // a job that holds nothing here: nothing happens
    assert!(clean(&e.sys, &e.dir, &sel_job("99")).unwrap().is_empty());
    let a = clean(&e.sys, &e.dir, &sel_job("12")).unwrap();
    let kinds: Vec<&str> = a.iter().map(|x| x.action).collect();
    assert_eq!(kinds, ["unmounted", "record-removed"], "{a:?}");
    assert!(e.sys.mount_table().is_empty());
    assert!(e.dir.read(&e.mp).unwrap().is_none());
    // twice is harmless
    assert!(clean(&e.sys, &e.dir, &sel_job("12")).unwrap().is_empty());
}

#[test]
fn cleanup_dry_run_changes_nothing_then_stale_is_cleaned() {
    let e = env();
    acquire(&e.sys, &e.dir, &req(&e, Some("5"))).unwrap();
    e.sys.script.lock().unwrap().stale.push(e.mp.clone());
    let before = (e.dir.read(&e.mp).unwrap(), e.sys.mount_table());
    let sel = Selection {
        stale: true,
        dry_run: true,
        ..Default::default()
    };
    let a = clean(&e.sys, &e.dir, &sel).unwrap();
    assert!(!a.is_empty() && a.iter().all(|x| !x.done), "{a:?}");
    assert_eq!(before, (e.dir.read(&e.mp).unwrap(), e.sys.mount_table()));
    // a healthy mount is not "stale"
    let e2 = env();
    acquire(&e2.sys, &e2.dir, &req(&e2, None)).unwrap();
    let sel2 = Selection {
        stale: true,
        ..Default::default()
    };
    assert!(clean(&e2.sys, &e2.dir, &sel2).unwrap().is_empty());
    release(&e2.sys, &e2.dir, &e2.mp, false, None).unwrap();
    // the real thing
    let a = clean(&e.sys, &e.dir, &sel2).unwrap();
    assert!(a.iter().any(|x| x.action == "unmounted"), "{a:?}");
    assert!(e.dir.read(&e.mp).unwrap().is_none());
    assert!(list(&e.sys, &e.dir).unwrap().is_empty());
}

#[test]
fn a_mount_whose_writer_was_killed_is_found_and_undone() {
    let e = env();
    let mut rec = acquire(&e.sys, &e.dir, &req(&e, Some("9"))).unwrap().record;
    // as if the writer had been SIGKILLed between starting the helper and completing the record
    rec.pending = true;
    rec.refs[0].pid = 999_999_999;
    e.dir.write(&rec).unwrap();
    let l = list(&e.sys, &e.dir).unwrap();
    assert_eq!(l[0].status, ListStatus::Stale);
    assert!(l[0]
        .problem
        .as_deref()
        .unwrap()
        .contains("killed while mounting"));
    // the job's epilog finds it by job id
    let a = clean(&e.sys, &e.dir, &sel_job("9")).unwrap();
    assert!(
        a.iter()
            .any(|x| x.action == "record-removed" && x.detail.contains("interrupted")),
        "{a:?}"
    );
    assert!(e.sys.mount_table().is_empty());
    // and a new acquire over such a leftover undoes it first
    let mut rec = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap().record;
    rec.pending = true;
    rec.refs[0].pid = 999_999_999;
    e.dir.write(&rec).unwrap();
    let a = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    assert!(
        !a.reused && a.notes[0].contains("interrupted"),
        "{:?}",
        a.notes
    );
    release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
}

#[test]
fn the_task_prolog_takes_one_reference_per_job() {
    let e = env();
    let mut r = req(&e, Some("77"));
    r.once_per_job = true;
    for _ in 0..3 {
        acquire(&e.sys, &e.dir, &r).unwrap();
    }
    assert_eq!(e.dir.read(&e.mp).unwrap().unwrap().refcount(), 1);
    let mut other = req(&e, Some("78"));
    other.once_per_job = true;
    acquire(&e.sys, &e.dir, &other).unwrap();
    assert_eq!(e.dir.read(&e.mp).unwrap().unwrap().refcount(), 2);
    assert_eq!(spawns(&e.sys), 1);
    clean(&e.sys, &e.dir, &sel_job("77")).unwrap();
    clean(&e.sys, &e.dir, &sel_job("78")).unwrap();
    assert!(e.sys.mount_table().is_empty());
}

#[test]
fn held_by_job_is_the_task_prolog_fast_path() {
    let e = env();
    assert!(held_by_job(&e.sys, &e.dir, &e.mp, None, "77")
        .unwrap()
        .is_none());
    let mut r = req(&e, Some("77"));
    r.once_per_job = true;
    acquire(&e.sys, &e.dir, &r).unwrap();
    let calls = e.sys.calls().len();
    let rec = held_by_job(&e.sys, &e.dir, &e.mp, None, "77")
        .unwrap()
        .unwrap();
    assert_eq!(rec.mount_point, e.mp);
    // it neither mounts nor changes the record
    assert_eq!(spawns(&e.sys), 1);
    assert_eq!(e.dir.read(&e.mp).unwrap().unwrap().refcount(), 1);
    assert!(e.sys.calls()[calls..]
        .iter()
        .all(|c| !matches!(c, Call::Spawn { .. })));
    // another job, another pool: the full path
    assert!(held_by_job(&e.sys, &e.dir, &e.mp, None, "78")
        .unwrap()
        .is_none());
    assert!(held_by_job(&e.sys, &e.dir, &e.mp, Some("abc"), "77")
        .unwrap()
        .is_none());
    let mut rec2 = rec.clone();
    rec2.pool = Some(mount::PoolId {
        name: "demo".into(),
        version: "1.0".into(),
        digest: "abc".into(),
    });
    e.dir.write(&rec2).unwrap();
    assert!(held_by_job(&e.sys, &e.dir, &e.mp, Some("abc"), "77")
        .unwrap()
        .is_some());
    assert!(held_by_job(&e.sys, &e.dir, &e.mp, Some("abd"), "77")
        .unwrap()
        .is_none());
    // a pending record (its writer may still be mounting) is never taken as done
    let mut rec3 = rec2.clone();
    rec3.pending = true;
    e.dir.write(&rec3).unwrap();
    assert!(held_by_job(&e.sys, &e.dir, &e.mp, Some("abc"), "77")
        .unwrap()
        .is_none());
    e.dir.write(&rec).unwrap();
    // gone once the job's reference is released
    clean(&e.sys, &e.dir, &sel_job("77")).unwrap();
    assert!(held_by_job(&e.sys, &e.dir, &e.mp, None, "77")
        .unwrap()
        .is_none());
    assert!(e.sys.mount_table().is_empty());
}

#[test]
fn list_status_prints_as_its_json_name() {
    for st in [
        ListStatus::Ok,
        ListStatus::Mounting,
        ListStatus::Stale,
        ListStatus::Gone,
        ListStatus::Unrecorded,
        ListStatus::Corrupt,
    ] {
        assert_eq!(serde_json::to_value(st).unwrap(), st.as_str());
        assert_eq!(format!("{st:<10}|"), format!("{:<10}|", st.as_str()));
    }
}

/// Records across versions: an earlier record (no `mount_id`, no `serving`) and one with fields a
/// newer sw-pool added are read; a kind of mount or a schema this version does not know is refused
/// with "newer sw-pool", never taken for damage, and nothing is changed.
#[test]
fn records_of_other_versions_are_read_or_refused_as_newer() {
    let e = env();
    let a = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    assert!(matches!(
        a.record.serving,
        Some(Serving::Fuse {
            helper: Backend::SquashfuseLl,
            ..
        })
    ));
    let file = std::fs::read_dir(e.dir.path().join("mounts"))
        .unwrap()
        .flatten()
        .map(|f| f.path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let put =
        |v: &serde_json::Value| std::fs::write(&file, serde_json::to_vec(v).unwrap()).unwrap();

    // a FUSE mount's record is written in the earlier shape (an earlier sw-pool, which refused
    // unknown fields, reads it as its own): no `serving`, the mount ID in a sidecar
    let keys: Vec<&String> = written.as_object().unwrap().keys().collect();
    for k in &keys {
        assert!(
            [
                "schema",
                "mount_point",
                "image",
                "format",
                "backend",
                "pool",
                "helper_pid",
                "uid",
                "user",
                "node",
                "created",
                "refs",
                "pending",
                "source"
            ]
            .contains(&k.as_str()),
            "{k} is not a field of the earlier record shape"
        );
    }
    let side = file.with_extension("mid");
    let line = std::fs::read_to_string(&side).unwrap();
    assert!(line.starts_with("901 "), "{line}");
    let r = e.dir.read(&e.mp).unwrap().unwrap();
    assert_eq!(
        (r.serving, r.mount_id),
        (None, Some(901)),
        "the ID comes back"
    );

    // a sidecar left behind by an earlier sw-pool's clean-up lends its ID to no other record
    let mut later = written.clone();
    later["created"] = serde_json::json!(written["created"].as_u64().unwrap() + 1);
    put(&later);
    assert_eq!(e.dir.read(&e.mp).unwrap().unwrap().mount_id, None);

    // an earlier version's record (no sidecar either)
    std::fs::remove_file(&side).unwrap();
    put(&written);
    let r = e.dir.read(&e.mp).unwrap().unwrap();
    assert_eq!((r.serving, r.mount_id), (None, None));

    // a newer version's extra field
    let mut newer = written.clone();
    newer["added_later"] = serde_json::json!({"x": 1});
    put(&newer);
    assert!(e.dir.read(&e.mp).unwrap().is_some());

    // a kind of mount this version does not know: read, but never acted on
    let mut kind = written.clone();
    kind["serving"] = serde_json::json!({"kind": "warp-drive", "pid": 7});
    put(&kind);
    let r = e.dir.read(&e.mp).unwrap().unwrap();
    assert_eq!(r.serving, Some(Serving::Unknown));
    let err = release(&e.sys, &e.dir, &e.mp, false, None).unwrap_err();
    assert!(err.to_string().contains("newer sw-pool"), "{err}");
    assert!(e.dir.read(&e.mp).unwrap().is_some(), "the record stays");

    // a newer schema
    let mut schema = written.clone();
    schema["schema"] = serde_json::json!(SCHEMA + 1);
    put(&schema);
    let err = e.dir.read(&e.mp).unwrap_err();
    assert!(matches!(err, StateError::Newer { .. }), "{err}");
    assert!(err.to_string().contains("newer sw-pool"), "{err}");

    put(&written);
    release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
}

#[test]
fn a_helper_that_outlives_its_unmount_is_waited_for_then_ended() {
    let e = env();
    let rec = acquire(&e.sys, &e.dir, &req(&e, Some("3"))).unwrap().record;
    // its helper is still running after the unmount (the fake proves it ours)
    e.sys.ours.lock().unwrap().push(rec.helper_pid);
    let a = clean(&e.sys, &e.dir, &sel_job("3")).unwrap();
    assert!(a.iter().any(|x| x.action == "helper-killed"), "{a:?}");
    assert_eq!(e.sys.count(|c| *c == Call::Terminate(rec.helper_pid)), 1);
    // it was given 2 s to exit on its own first (on the fake's clock: no real waiting)
    assert!(
        e.sys.slept() >= Duration::from_secs(2),
        "{:?}",
        e.sys.slept()
    );
    assert!(e.dir.read(&e.mp).unwrap().is_none());
    // a helper that is not proved ours is never signalled
    let rec = acquire(&e.sys, &e.dir, &req(&e, Some("4"))).unwrap().record;
    clean(&e.sys, &e.dir, &sel_job("4")).unwrap();
    assert_eq!(e.sys.count(|c| *c == Call::Terminate(rec.helper_pid)), 0);
}

#[test]
fn a_selection_becomes_the_same_cleanup_arguments() {
    let s = Selection {
        job: Some("77".into()),
        stale: true,
        kill: true,
        ..Default::default()
    };
    assert_eq!(s.cleanup_args(), ["--job", "77", "--stale", "--kill"]);
    let s = Selection {
        all: true,
        dry_run: true,
        ..Default::default()
    };
    assert_eq!(s.cleanup_args(), ["--all", "--dry-run"]);
}

#[test]
fn the_socket_of_an_on_demand_server_that_is_gone_is_removed_by_cleanup() {
    let e = env();
    let gone = e.dir.path().join("lazy-999999999.sock");
    let other = e.dir.path().join("lazy-x.sock");
    std::fs::write(&gone, b"").unwrap();
    std::fs::write(&other, b"").unwrap();
    // a dry run says so and keeps it
    let dry = Selection {
        stale: true,
        dry_run: true,
        ..Default::default()
    };
    let a = clean(&e.sys, &e.dir, &dry).unwrap();
    assert!(
        a.iter()
            .any(|x| x.action == "socket-removed" && x.mount_point == gone && !x.done),
        "{a:?}"
    );
    assert!(gone.exists());
    // the epilog's (one job) and `cleanup --stale` remove it; a name not of a server stays
    let job = Selection {
        job: Some("7".into()),
        ..Default::default()
    };
    let a = clean(&e.sys, &e.dir, &job).unwrap();
    assert!(
        a.iter().any(|x| x.action == "socket-removed" && x.done),
        "{a:?}"
    );
    assert!(!gone.exists() && other.exists());
    // nothing is selected: nothing is touched
    std::fs::write(&gone, b"").unwrap();
    assert!(clean(&e.sys, &e.dir, &Selection::default())
        .unwrap()
        .is_empty());
    assert!(gone.exists());
}

#[test]
fn cache_bases_are_remembered_once_per_node_and_read_without_changing_the_store() {
    let e = env();
    assert!(e.dir.remembered_bases().is_empty());
    e.dir.remember_base(Path::new("/local/tmp"));
    e.dir.remember_base(Path::new("/local/tmp"));
    e.dir.remember_base(Path::new("/scratch/me"));
    e.dir.remember_base(Path::new("/bad\nname"));
    let want = vec![PathBuf::from("/local/tmp"), PathBuf::from("/scratch/me")];
    assert_eq!(e.dir.remembered_bases(), want);
    assert_eq!(StateDir::remembered_bases_in(e.dir.path()), want);
    // a relative line (hand-edited, or another program's) is skipped
    let f = std::fs::read_dir(e.dir.path())
        .unwrap()
        .flatten()
        .find(|d| d.file_name().to_string_lossy().starts_with("cache-bases."))
        .unwrap()
        .path();
    let mut text = std::fs::read_to_string(&f).unwrap();
    text.push_str("relative/x\n");
    std::fs::write(&f, text).unwrap();
    assert_eq!(e.dir.remembered_bases(), want);
    // bounded
    for i in 0..(MAX_BASES + 10) {
        e.dir.remember_base(Path::new(&format!("/b/{i}")));
    }
    assert_eq!(e.dir.remembered_bases().len(), MAX_BASES);
    // a store that does not exist: nothing, and nothing made
    let none = e.dir.path().join("absent");
    assert!(StateDir::remembered_bases_in(&none).is_empty());
    assert!(!none.exists());
}

mod moved;
