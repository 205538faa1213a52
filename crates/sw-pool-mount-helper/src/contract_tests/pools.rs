//! The site pool's rows: only a site key's signature counts, and the kernel mounts only a copy
//! whose every chunk matched the signed manifest as it was read. Real pool files, real signatures.

use super::*;

use swpool_format::pool::Pool;
use swpool_trust::keys;

const CS: u64 = 4096;

type Sign = dyn Fn(&Path);

/// A signer with a key of its own that no site trusts (`signed = false`: it leaves the pool
/// unsigned).
fn signer(signed: bool) -> impl Fn(&Path) {
    let key = signed.then(|| keys::generate(keys::Algorithm::Ed25519).unwrap());
    move |p: &Path| {
        if let Some(k) = &key {
            swpool_trust::sign_pool(p, k, None).unwrap();
            let _ = std::fs::remove_file(swpool_trust::detached_path(p));
        }
    }
}

/// A pool of 4 chunks at `path`, signed by `sign`.
fn write_pool(path: &Path, sign: &Sign) -> Vec<u8> {
    let image: Vec<u8> = (0..4 * CS).map(|i| (i * 7 % 251) as u8 + 1).collect();
    let m = swpool_format::pool::manifest::sample(&image, CS);
    let mut f = std::fs::File::create(path).unwrap();
    std::io::Write::write_all(&mut f, &image).unwrap();
    swpool_format::pool::trailer::write_trailer(&mut f, image.len() as u64, &m.to_json(), &[])
        .unwrap();
    drop(f);
    sign(path);
    image
}

/// A site whose `trusted_keys` holds one key's public half; returns its config and a signer
/// with that key.
fn site(d: &Path) -> (HelperConfig, impl Fn(&Path)) {
    let key = keys::generate(keys::Algorithm::Ed25519).unwrap();
    std::fs::create_dir_all(d.join("private")).unwrap();
    std::fs::create_dir_all(d.join("trusted")).unwrap();
    let (_, public) = keys::write_keypair(&key, &d.join("private/site"), false).unwrap();
    std::fs::copy(&public, d.join("trusted/site.pub.pem")).unwrap();
    let cfg = cfg(&format!(
        "trusted_keys = {:?}",
        d.join("trusted").display().to_string()
    ));
    let sign = move |p: &Path| {
        swpool_trust::sign_pool(p, &key, None).unwrap();
        let _ = std::fs::remove_file(swpool_trust::detached_path(p));
    };
    (cfg, sign)
}

#[test]
fn row_trust_only_a_site_keys_signature_counts() {
    let d = tempfile::tempdir().unwrap();
    let (cfg, site_key) = site(d.path());
    let user_key = signer(true);
    let unsigned = signer(false);
    let cases: [(&str, &Sign, bool); 3] = [
        ("site.pool", &site_key, true),
        ("mine.pool", &user_key, false),
        ("unsigned.pool", &unsigned, false),
    ];
    for (name, sign, ok) in cases {
        let p = d.path().join(name);
        write_pool(&p, sign);
        let pool = Pool::open(&p).unwrap();
        match crate::pool::site_verdict(&cfg, &pool) {
            Ok(signer) => assert!(ok, "{name} accepted: {signer}"),
            Err(e) => {
                assert!(!ok, "{name}: {e}");
                assert_eq!(e.status(), ExitStatus::Trust, "{e}");
                assert!(e.to_string().contains("trusted"), "{name}: {e}");
            }
        }
    }
}

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

#[test]
fn row_verified_copy_a_chunk_that_differs_from_the_signed_manifest_fails_the_copy_and_leaves_nothing(
) {
    let d = tempfile::tempdir().unwrap();
    let (_, sign) = site(d.path());
    let p = d.path().join("p.pool");
    let image = write_pool(&p, &sign);
    // the copy of an intact pool: the same bytes, under its name only once complete
    let cache = d.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let pool = std::sync::Arc::new(Pool::open(&p).unwrap());
    crate::pool::copy_bounded(pool, &cache.join("good.pool"), Duration::from_secs(10)).unwrap();
    let copied = std::fs::read(cache.join("good.pool")).unwrap();
    assert_eq!(copied, std::fs::read(&p).unwrap());
    assert_eq!(&copied[..image.len()], &image[..]);
    // the user changes one byte of chunk 2 (after the signature): the copy fails naming the chunk
    let pool = std::sync::Arc::new(Pool::open(&p).unwrap());
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\0", 2 * CS + 5).unwrap();
    let e = crate::pool::copy_bounded(pool, &cache.join("bad.pool"), Duration::from_secs(10))
        .unwrap_err();
    assert_eq!(e.status(), ExitStatus::InvalidPool, "{e}");
    assert!(
        e.to_string().contains("chunk 2")
            && e.to_string().contains("does not match the signed manifest"),
        "{e}"
    );
    let names: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["good.pool"],
        "nothing of the failed copy is named in the cache"
    );
}

/// A fake node whose cache (`/c`) holds `pool`'s copy; site pools mount under `/p`.
fn pool_node(pool: &Pool) -> (FakeHost, HelperConfig) {
    let h = FakeHost::new();
    h.make_dirs("/c", 0);
    let cached = format!("/c/{}", crate::pool::cache_name(pool));
    h.add(&cached, FileKind::File, 0, 0o644);
    (h, cfg("cache_dir = \"/c\"\npool_mount_root = \"/p\""))
}

fn no_mkdir(calls: &[Call]) -> Vec<Call> {
    calls
        .iter()
        .filter(|c| !matches!(c, Call::Mkdir(_)))
        .cloned()
        .collect()
}

#[test]
fn a_granted_site_pool_is_one_read_only_mount_of_roots_copy_shared_by_reference() {
    let d = tempfile::tempdir().unwrap();
    let (_, sign) = site(d.path());
    let p = d.path().join("p.pool");
    write_pool(&p, &sign);
    let pool = Pool::open(&p).unwrap();
    let (h, cfg) = pool_node(&pool);
    let cached = format!("/c/{}", crate::pool::cache_name(&pool));
    let m =
        crate::pool::mount_verified(&h, &cfg, &ann(), &pool, "site".into(), (None, false), true)
            .unwrap();
    assert_eq!(
        (m.mount_point.as_path(), m.refs, m.shared),
        (Path::new("/p/demo/1.0"), 1, false)
    );
    assert_eq!(
        no_mkdir(&h.calls()),
        [
            Call::Lock,
            Call::AttachLoop {
                label: cached,
                rw: false,
                locked: true
            },
            Call::Mount {
                at: "/p/demo/1.0".into(),
                fstype: "squashfs".into(),
                source: "/dev/loop7".into(),
                read_only: true,
                noexec: false,
                locked: true,
            },
            Call::Save,
            Call::Unlock,
        ],
        "root's own copy, never the caller's file"
    );
    for dir in ["/p", "/p/demo", "/p/demo/1.0"] {
        assert_eq!(h.owner_mode(dir), Some((0, 0o755)), "{dir}");
    }
    // another user: a reference to the same mount, nothing mounted again
    let n = h.calls().len();
    let bob = Caller::fake(2000, "bob");
    let m = crate::pool::mount_verified(
        &h,
        &cfg,
        &bob,
        &pool,
        "site".into(),
        (Some("7"), false),
        false,
    )
    .unwrap();
    assert_eq!((m.refs, m.shared), (2, true));
    assert_eq!(h.calls()[n..], [Call::Lock, Call::Save, Call::Unlock]);
    // another build of the same NAME/VERSION mounted: refused, the mount stays as it is
    if let Record::Pool { digest, .. } = &mut h.f.records.borrow_mut().mounts[0] {
        *digest = "blake3:another".into();
    }
    refused(
        crate::pool::mount_verified(&h, &cfg, &ann(), &pool, "site".into(), (None, false), false),
        Refusal::Conflict,
        "another build of demo/1.0",
    );
    assert_eq!(h.mounted(), [PathBuf::from("/p/demo/1.0")]);
    assert_eq!(h.loops_left(), 0);
}

#[test]
fn a_site_pool_whose_copy_went_or_the_kernel_refuses_leaves_no_mount_loop_or_record() {
    let d = tempfile::tempdir().unwrap();
    let (_, sign) = site(d.path());
    let p = d.path().join("p.pool");
    write_pool(&p, &sign);
    let pool = Pool::open(&p).unwrap();
    let (h, cfg) = pool_node(&pool);
    h.f.mount_fails.set(Some(libc::EINVAL));
    let e =
        crate::pool::mount_verified(&h, &cfg, &ann(), &pool, "site".into(), (None, false), true)
            .unwrap_err();
    assert_eq!(e.status(), ExitStatus::System, "{e}");
    assert!(h.calls().contains(&Call::FreeLoop("loop7".into())));
    assert!(!h.calls().contains(&Call::Save));
    assert!(h.mounted().is_empty() && h.f.records.borrow().mounts.is_empty());
    // the cached copy removed meanwhile: refused before any loop device
    let h = FakeHost::new();
    h.make_dirs("/c", 0);
    refused(
        crate::pool::mount_verified(&h, &cfg, &ann(), &pool, "site".into(), (None, false), true),
        Refusal::Conflict,
        "is not cached on this node",
    );
    assert!(!h
        .calls()
        .iter()
        .any(|c| matches!(c, Call::AttachLoop { .. } | Call::Mount { .. })));
}
