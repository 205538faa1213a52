//! Records whose mount a user moved (renamed a parent) or whose mount ID was reused.

use super::*;

/// The recorded mount moved to `to` (a user renamed a parent) and another user's FUSE mount sits at
/// the recorded path now.
fn move_recorded_mount(e: &Env, to: &str) -> u32 {
    let id = e.dir.read(&e.mp).unwrap().unwrap().mount_id.unwrap();
    let uid = e.sys.euid();
    let mut sc = e.sys.script.lock().unwrap();
    let m = sc.mounts.iter_mut().find(|m| m.mount_id == id).unwrap();
    m.mount_point = PathBuf::from(to);
    let mut other = MountEntryFor(uid + 1, e.mp.to_str().unwrap());
    other.mount_id = id + 1000;
    sc.mounts.push(other);
    id
}

#[test]
fn a_moved_mount_is_listed_where_it_is_and_unmounted_by_its_id() {
    let e = env();
    acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    let id = move_recorded_mount(&e, "/elsewhere/mnt");
    let l = list(&e.sys, &e.dir).unwrap();
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0].status, ListStatus::Ok);
    let p = l[0].problem.clone().unwrap_or_default();
    assert!(p.contains("moved") && p.contains("/elsewhere/mnt"), "{p}");
    let r = release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
    assert_eq!(
        r.unmounted.unwrap().mount_point,
        PathBuf::from("/elsewhere/mnt")
    );
    let t = e.sys.mount_table();
    // ours is gone; what the user put at the recorded path is left alone
    assert!(!t.iter().any(|m| m.mount_id == id), "{t:?}");
    assert!(t.iter().any(|m| m.mount_point == e.mp), "{t:?}");
    assert!(e.dir.read(&e.mp).unwrap().is_none());
}

#[test]
fn a_reused_mount_id_is_not_taken_for_the_recorded_mount() {
    let e = env();
    acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    let id = move_recorded_mount(&e, "/elsewhere/mnt");
    // the mount went and its ID now names someone else's mount
    for m in e.sys.script.lock().unwrap().mounts.iter_mut() {
        if m.mount_id == id {
            m.fstype = "fuse.sshfs".into();
        }
    }
    let l = list(&e.sys, &e.dir).unwrap();
    assert_eq!(l[0].status, ListStatus::Gone, "{l:?}");
    let r = release(&e.sys, &e.dir, &e.mp, false, None).unwrap();
    assert!(r.unmounted.is_none());
    // neither the mount with the reused ID nor the one at the recorded path was touched
    assert_eq!(e.sys.mount_table().len(), 2);
    assert!(e.dir.read(&e.mp).unwrap().is_none());
}

/// A new mount at a path whose recorded mount a user moved elsewhere is refused, and the record
/// (how `umount` and `cleanup` find the moved mount) is kept: replacing it left root's moved mount
/// unrecorded under t_48's race.
#[test]
fn a_mount_at_a_path_whose_recorded_mount_moved_is_refused_and_the_record_kept() {
    let e = env();
    acquire(&e.sys, &e.dir, &req(&e, None)).unwrap();
    let id = {
        let id = e.dir.read(&e.mp).unwrap().unwrap().mount_id.unwrap();
        let mut sc = e.sys.script.lock().unwrap();
        let m = sc.mounts.iter_mut().find(|m| m.mount_id == id).unwrap();
        m.mount_point = PathBuf::from("/elsewhere/mnt");
        id
    };
    let err = acquire(&e.sys, &e.dir, &req(&e, None)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("moved to /elsewhere/mnt") && msg.contains("sw-pool umount"),
        "{msg}"
    );
    assert_eq!(e.dir.read(&e.mp).unwrap().unwrap().mount_id, Some(id));
    assert_eq!(e.sys.mount_table().len(), 1);
}
