use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::*;

fn tree() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let u = t.path();
    fs::create_dir_all(u.join("usr/local/bin")).unwrap();
    fs::write(u.join("usr/local/bin/hello"), b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(
        u.join("usr/local/bin/hello"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    fs::write(u.join("usr/local/data"), vec![7u8; 10_000]).unwrap();
    std::os::unix::fs::symlink("bin/hello", u.join("usr/local/h")).unwrap();
    fs::create_dir(u.join("etc")).unwrap();
    fs::write(u.join("etc/.wh.motd"), b"").unwrap();
    t
}

#[test]
fn manifest_round_trips_and_names_a_state() {
    let t = tree();
    let m = Manifest::scan(t.path()).unwrap();
    assert_eq!(m.entries.len(), 8);
    let d = Manifest::decode(&m.encode()).unwrap();
    assert_eq!(d, m);
    assert_eq!(d.generation(), m.generation());
    assert_eq!(m.file_bytes(), 10_000 + 18);
}

#[test]
fn hostile_manifests_are_refused() {
    let ok = format!("{MAGIC}\nd 755 0 0 {}\n", hex(b"a"));
    assert!(Manifest::decode(ok.as_bytes()).is_ok());
    for bad in [
        format!("{MAGIC}\nf 644 1 0 {}\n", hex(b"../x")),
        format!("{MAGIC}\nf 644 1 0 {}\n", hex(b"/etc/passwd")),
        format!("{MAGIC}\nf 644 1 0 {}\n", hex(b"a/b")), // parent not listed
        format!(
            "{MAGIC}\nf 644 1 0 {}\nf 644 1 0 {}\n",
            hex(b"x"),
            hex(b"x")
        ),
        format!("{MAGIC}\nf 99999 1 0 {}\n", hex(b"x")),
        format!("{MAGIC}\nw 0 0 0 {}\n", hex(b"x")),
        format!("{MAGIC}\nl 777 0 0 {}\n", hex(b"x")),
        format!("{MAGIC}\nf 644 1 0 zz\n"),
        "not a manifest\n".to_string(),
    ] {
        assert!(Manifest::decode(bad.as_bytes()).is_err(), "{bad}");
    }
}

#[test]
fn needs_only_changed_files() {
    let t = tree();
    let a = Manifest::scan(t.path()).unwrap();
    assert_eq!(a.needs(None).len(), 2);
    assert!(a.needs(Some(&a)).is_empty());
    fs::write(t.path().join("usr/local/data"), vec![8u8; 10_001]).unwrap();
    let b = Manifest::scan(t.path()).unwrap();
    let n = b.needs(Some(&a));
    assert_eq!(n.len(), 1);
    assert_eq!(b.entries[n[0]].path, Path::new("usr/local/data"));
    assert_ne!(a.generation(), b.generation());
}

#[test]
fn sets_encode_and_join() {
    let s1 = encode_set(10, &[0, 9]);
    let s2 = encode_set(10, &[3]);
    assert_eq!(union_sets(10, &[s1.clone(), s2]).unwrap(), vec![0, 3, 9]);
    assert!(union_sets(20, &[s1]).is_err());
}

/// A node's new state reuses unchanged files (hard links) and is checked before it is used.
#[test]
fn states_are_made_linked_checked_and_switched() {
    let t = tree();
    let node = tempfile::tempdir().unwrap();
    let nc = NodeCopies::open(&node.path().join("layers"), "dev", t.path()).unwrap();
    let m1 = Manifest::scan(t.path()).unwrap();
    // first state: both files arrive (copied here as the stream would extract them)
    let all: HashSet<usize> = m1.needs(None).into_iter().collect();
    let tmp = nc.prepare(&m1, None, &all).unwrap();
    for &i in &all {
        let e = &m1.entries[i];
        fs::copy(t.path().join(&e.path), tmp.path().join(&e.path)).unwrap();
        set_mtime(&tmp.path().join(&e.path), e.mtime_ns);
    }
    let g1 = m1.generation();
    nc.commit(tmp, &m1, &g1).unwrap();
    let cur = nc.current().unwrap();
    assert_eq!(cur.0, g1);
    // the upper's deletion (`.wh.motd` here) is the kernel's form in the copy (a character
    // device 0/0 at `motd`), which the kernel's overlay reads too: the plan need not fall back
    let s1 = nc.state(&g1);
    let wh = fs::symlink_metadata(s1.join("etc/motd")).unwrap();
    assert!(
        std::os::unix::fs::FileTypeExt::is_char_device(&wh.file_type()) && wh.rdev() == 0,
        "{wh:?}"
    );
    assert!(!s1.join("etc/.wh.motd").exists());
    assert!(!nc.has_whiteouts(&s1));
    // second state: one file changed; the other is a link to the first state's
    fs::write(t.path().join("usr/local/data"), b"new").unwrap();
    let m2 = Manifest::scan(t.path()).unwrap();
    let need: HashSet<usize> = m2.needs(Some(&cur.1)).into_iter().collect();
    assert_eq!(need.len(), 1);
    let tmp = nc.prepare(&m2, Some(&cur), &need).unwrap();
    // a tree that is not the manifest's (the incoming file never written: the transfer creates
    // it) fails the check and leaves the current state as it was
    let g2 = m2.generation();
    assert!(!tmp.path().join("usr/local/data").exists());
    assert!(nc.commit(tmp, &m2, &g2).is_err());
    assert_eq!(nc.current().unwrap().0, g1);
    let tmp = nc.prepare(&m2, Some(&cur), &need).unwrap();
    for &i in &need {
        let e = &m2.entries[i];
        fs::copy(t.path().join(&e.path), tmp.path().join(&e.path)).unwrap();
        set_mtime(&tmp.path().join(&e.path), e.mtime_ns);
    }
    let s2 = nc.commit(tmp, &m2, &g2).unwrap();
    assert_eq!(nc.current().unwrap().0, g2);
    let a = fs::metadata(nc.state(&g1).join("usr/local/bin/hello")).unwrap();
    let b = fs::metadata(s2.join("usr/local/bin/hello")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(fs::read(s2.join("usr/local/data")).unwrap(), b"new");
    // jobs, holds and pruning
    nc.mark_job("42", &g2).unwrap();
    assert_eq!(nc.for_job("42"), Some(s2.clone()));
    assert_eq!(nc.for_job("43"), None);
    assert_eq!(nc.for_job("../x"), None);
    // a copy holding the other form (made where the kernel refused the device) is named as one
    // only fuse-overlayfs reads
    let s1 = nc.state(&g1);
    fs::remove_file(s1.join("etc/motd")).unwrap();
    fs::write(s1.join("etc/.wh.motd"), b"").unwrap();
    assert!(nc.has_whiteouts(&s1));
    let held = nc.hold(&nc.state(&g1)).unwrap();
    nc.prune(&[&g2]);
    assert!(nc.state(&g1).is_dir(), "a held state stays");
    drop(held);
    nc.prune(&[&g2]);
    assert!(!nc.state(&g1).exists());
    assert!(s2.is_dir());
}

fn set_mtime(p: &Path, ns: i128) {
    swpool_sys::atomic::set_mtime(p, ns).unwrap();
}

/// A whiteout sorts by the name the copy gives it (`.wh.NAME`), so a copy scans to the same list.
#[test]
fn whiteouts_sort_as_in_the_copy() {
    if !rustix::process::geteuid().is_root() {
        return; // a character device 0/0 needs root outside a user namespace
    }
    let t = tempfile::tempdir().unwrap();
    let d = t.path().join("info");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("a"), b"1").unwrap();
    fs::write(d.join("z"), b"2").unwrap();
    let dev = rustix::fs::makedev(0, 0);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        d.join("m"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::empty(),
        dev,
    )
    .unwrap();
    let m = Manifest::scan(t.path()).unwrap();
    let names: Vec<String> = m
        .entries
        .iter()
        .map(|e| e.path.display().to_string())
        .collect();
    assert_eq!(names, ["info", "info/.wh.m", "info/a", "info/z"]);
    // the copy's form scans to the same list
    let c = tempfile::tempdir().unwrap();
    fs::create_dir(c.path().join("info")).unwrap();
    for (n, b) in [("a", b"1"), ("z", b"2")] {
        fs::write(c.path().join("info").join(n), b).unwrap();
    }
    fs::write(c.path().join("info/.wh.m"), b"").unwrap();
    let mc = Manifest::scan(c.path()).unwrap();
    let kinds: Vec<Kind> = mc.entries.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, m.entries.iter().map(|e| e.kind).collect::<Vec<_>>());
}

#[test]
fn the_fuzz_seed_is_a_valid_list() {
    // fuzz/fuzz_targets/layer_manifest.rs starts from this file: it must stay accepted
    let seed = include_bytes!("../../../../fuzz/seeds/layer_manifest/valid.txt");
    let m = Manifest::decode(seed).unwrap();
    assert_eq!(m.entries.len(), 5);
    assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
}

#[test]
fn job_marks_go_with_their_job_and_with_age() {
    let t = tree();
    let node = tempfile::tempdir().unwrap();
    let layers = node.path().join("layers");
    let nc = NodeCopies::open(&layers, "dev", t.path()).unwrap();
    let gen = "0123456789abcdef0123456789abcdef";
    fs::create_dir(nc.state(gen)).unwrap();
    nc.mark_job("42", gen).unwrap();
    nc.mark_job("420", gen).unwrap();
    nc.mark_failed("42.3", "node2: no room").unwrap();
    assert!(nc.for_job("42").is_some() && nc.failed("42.3").is_some());
    // the epilog of job 42: its mark and its step's failure go, job 420's mark stays
    assert_eq!(remove_job_marks(&layers, "42"), 2);
    assert!(nc.for_job("42").is_none() && nc.failed("42.3").is_none());
    assert!(nc.for_job("420").is_some());
    for bad in ["", "..", "42.3", "../x"] {
        assert_eq!(remove_job_marks(&layers, bad), 0, "{bad}");
    }
    // a mark nobody removed (no epilog saw this cache base) goes when it is older than
    // MARK_MAX_AGE and another job marks
    let old = nc.dir().join("jobs/420");
    let day = 24 * 3600 * 1_000_000_000i128;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i128;
    set_mtime(&old, now - 29 * day);
    nc.mark_job("421", gen).unwrap();
    assert!(old.exists(), "29 days: kept");
    set_mtime(&old, now - 31 * day);
    nc.mark_job("422", gen).unwrap();
    assert!(!old.exists(), "31 days: removed");
    assert!(nc.for_job("421").is_some() && nc.for_job("422").is_some());
}
