//! keygen / sign / verify: compatibility with the openssl CLI in both directions, and the tamper
//! matrix (each case rejected with its own clear error).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

fn openssl(args: &[&str]) -> Out {
    run(Command::new("openssl").args(args))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A pool with data chunks and file-system metadata: an ext4 image of a small tree.
fn make_pool(dir: &Path, name: &str, seed: u8) -> PathBuf {
    let tree = dir.join(format!("tree-{name}"));
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let mut x = seed as u32 + 1;
    let data: Vec<u8> = (0..(9 << 20))
        .map(|_| {
            x = x.wrapping_mul(1103515245).wrapping_add(12345);
            (x >> 16) as u8
        })
        .collect();
    std::fs::write(tree.join("sub/data.bin"), data).unwrap();
    std::fs::write(tree.join("README"), format!("pool {name}\n")).unwrap();
    let pool = dir.join(format!("{name}.ext4"));
    let o = sw_run(&["build", "-s", "40MB", "--name", name, s(&pool), s(&tree)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    pool
}

#[test]
fn openssl_cli_compatibility_both_directions() {
    let d = scratch();
    let dir = d.path();
    let pool = make_pool(dir, "compat", 1);
    // sw-pool keygen (Ed25519) → sw-pool sign → openssl pkeyutl verifies POOL.sig over the SHA-256
    assert_eq!(sw_run(&["keygen", "--out", s(&dir.join("adm"))]).code, 0);
    let o = sw_run(&["sign", "--key", s(&dir.join("adm.pem")), s(&pool)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let digest = dir.join("pool.sha256");
    let o = openssl(&["dgst", "-sha256", "-binary", "-out", s(&digest), s(&pool)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = openssl(&[
        "pkeyutl",
        "-verify",
        "-pubin",
        "-inkey",
        s(&dir.join("adm.pub.pem")),
        "-rawin",
        "-in",
        s(&digest),
        "-sigfile",
        &format!("{}.sig", s(&pool)),
    ]);
    assert_eq!(
        o.code, 0,
        "openssl rejected sw-pool's Ed25519 signature: {}{}",
        o.stdout, o.stderr
    );
    // the openssl CLI's keys (RSA, ECDSA P-256, Ed25519) → sw-pool sign → openssl dgst / sw-pool verify
    for (alg, genargs) in [
        (
            "rsa",
            vec![
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ],
        ),
        (
            "ec",
            vec![
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ],
        ),
        ("ed", vec!["genpkey", "-algorithm", "ed25519"]),
    ] {
        let key = dir.join(format!("{alg}.pem"));
        let public = dir.join(format!("{alg}.pub.pem"));
        let mut a = genargs.clone();
        a.extend(["-out", s(&key)]);
        assert_eq!(openssl(&a).code, 0);
        assert_eq!(
            openssl(&["pkey", "-in", s(&key), "-pubout", "-out", s(&public)]).code,
            0
        );
        let o = sw_run(&["sign", "--key", s(&key), s(&pool)]);
        assert_eq!(o.code, 0, "{alg}: {}", o.stderr);
        if alg != "ed" {
            let o = openssl(&[
                "dgst",
                "-sha256",
                "-verify",
                s(&public),
                "-signature",
                &format!("{}.sig", s(&pool)),
                s(&pool),
            ]);
            assert!(
                o.code == 0 && o.stdout.contains("Verified OK"),
                "{alg}: {}{}",
                o.stdout,
                o.stderr
            );
        }
        let o = sw_run(&["verify", "--detached", "--key", s(&public), s(&pool)]);
        assert_eq!(o.code, 0, "{alg}: {}", o.stderr);
        assert!(
            o.stdout.contains(&format!("signed by {alg}")),
            "{}",
            o.stdout
        );
    }
    // the fingerprint sw-pool prints is openssl's DER SubjectPublicKeyInfo SHA-256
    let der = dir.join("ed.der");
    assert_eq!(
        openssl(&[
            "pkey",
            "-pubin",
            "-in",
            s(&dir.join("ed.pub.pem")),
            "-outform",
            "DER",
            "-out",
            s(&der)
        ])
        .code,
        0
    );
    let fp = openssl(&["dgst", "-sha256", "-r", s(&der)])
        .stdout
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let o = sw_run(&[
        "verify",
        "--json",
        "--key",
        s(&dir.join("ed.pub.pem")),
        s(&pool),
    ]);
    let j: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(j["signer"]["fingerprint"], format!("sha256:{fp}"));
}

fn expect(o: &Out, code: i32, needle: &str, what: &str) -> String {
    assert_eq!(o.code, code, "{what}: exit status; stderr: {}", o.stderr);
    assert!(
        o.stderr.contains(needle),
        "{what}: expected {needle:?} in: {}",
        o.stderr
    );
    o.stderr.clone()
}

#[test]
fn tamper_matrix() {
    let d = scratch();
    let dir = d.path();
    let trusted = dir.join("trusted");
    std::fs::create_dir(&trusted).unwrap();
    assert_eq!(sw_run(&["keygen", "--out", s(&dir.join("adm"))]).code, 0);
    assert_eq!(
        sw_run(&["keygen", "--out", s(&dir.join("mallory"))]).code,
        0
    );
    std::fs::copy(dir.join("adm.pub.pem"), trusted.join("site-admin.pem")).unwrap();
    let pool = make_pool(dir, "alpha", 1);
    let other = make_pool(dir, "beta", 2);
    for p in [&pool, &other] {
        assert_eq!(
            sw_run(&["sign", "--key", s(&dir.join("adm.pem")), s(p)]).code,
            0
        );
    }
    let verify = |p: &Path, extra: &[&str]| {
        let mut a = vec!["verify", "--trusted", s(&trusted)];
        a.extend_from_slice(extra);
        a.push(s(p));
        sw_run(&a)
    };
    let ok = verify(&pool, &["--detached"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(ok.stdout.contains("signed by site-admin"), "{}", ok.stdout);

    let good = std::fs::read(&pool).unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&sw_run(&["inspect", "--json", "--no-check", s(&pool)]).stdout)
            .unwrap();
    let image_size = j["manifest"]["image_size"].as_u64().unwrap() as usize;
    let chunk = j["manifest"]["chunk_size"].as_u64().unwrap() as usize;
    let case = |name: &str, bytes: &[u8]| -> PathBuf {
        let p = dir.join(format!("case-{name}.ext4"));
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let mut messages = std::collections::BTreeSet::new();

    // 1. a flipped byte at 20 pseudo-random offsets of the image: file-system metadata (first 64 KiB,
    //    group descriptors, inode tables), file data, and holes
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut offsets: Vec<usize> = vec![0, 1024 + 56, 4096, 65_536, image_size - 1];
    while offsets.len() < 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        offsets.push((x % image_size as u64) as usize);
    }
    for off in offsets {
        let mut b = good.clone();
        b[off] ^= 0x01;
        let p = case("flip", &b);
        // damage (4), as `load` and `mount` report the same bytes; not a trust failure (7)
        let e = expect(
            &verify(&p, &[]),
            4,
            "does not match its signed manifest",
            &format!("flip at {off}"),
        );
        assert!(
            e.contains(&format!("first at byte offset {}", off / chunk * chunk)),
            "offset {off}: {e}"
        );
        assert!(e.contains("1 of"), "offset {off}: {e}");
    }
    messages.insert("image");

    // 2. a flipped byte in the manifest (its footer hash catches it) ...
    let trailer_start = image_size;
    let mut b = good.clone();
    b[trailer_start + 40] ^= 0x04;
    expect(
        &verify(&case("manifest", &b), &[]),
        4,
        "manifest bytes do not match their hash",
        "manifest byte",
    );
    // ... and a manifest rewritten with a valid footer hash (the signature catches it)
    let t = swpool_core_trailer(&good);
    let forged = String::from_utf8(t.0.clone())
        .unwrap()
        .replace("\"alpha\"", "\"gamma\"");
    let p = case(
        "forged",
        &rebuild(&good[..image_size], forged.as_bytes(), &t.1),
    );
    expect(
        &verify(&p, &[]),
        7,
        "manifest signature does not verify",
        "forged manifest",
    );
    messages.insert("manifest");

    // 3. a flipped hex digit in the signature
    let sig = String::from_utf8(t.1.clone()).unwrap();
    let pos = sig.find("\"signature\"").unwrap() + 20;
    let mut sb = sig.clone().into_bytes();
    sb[pos] = if sb[pos] == b'0' { b'1' } else { b'0' };
    let p = case("sig", &rebuild(&good[..image_size], &t.0, &sb));
    expect(
        &verify(&p, &[]),
        7,
        "manifest signature does not verify",
        "signature digit",
    );
    // a damaged signature block
    let mut sb = sig.clone().into_bytes();
    sb[0] = b'[';
    let p = case("block", &rebuild(&good[..image_size], &t.0, &sb));
    expect(
        &verify(&p, &[]),
        7,
        "signature block is damaged",
        "signature block",
    );

    // 4. truncated by one byte, by one chunk; bytes appended
    expect(
        &verify(&case("trunc1", &good[..good.len() - 1]), &[]),
        4,
        "truncated",
        "truncated by 1 byte",
    );
    expect(
        &verify(&case("truncchunk", &good[..good.len() - chunk]), &[]),
        4,
        "no sw-pool trailer at its end",
        "truncated by a chunk",
    );
    let mut b = good.clone();
    b.extend_from_slice(b"appended");
    expect(
        &verify(&case("append", &b), &[]),
        4,
        "8 bytes were appended",
        "appended",
    );

    // 5. signed with a different key than the one given; re-signed by an untrusted key
    let p = case("mallory", &good);
    assert_eq!(
        sw_run(&["sign", "--key", s(&dir.join("mallory.pem")), s(&p)]).code,
        0
    );
    expect(
        &sw_run(&["verify", "--key", s(&dir.join("adm.pub.pem")), s(&p)]),
        7,
        "not by the key you gave",
        "different key",
    );
    let e = expect(
        &verify(&p, &[]),
        7,
        "which is not trusted here",
        "untrusted key",
    );
    assert!(
        e.contains("trusted-keys"),
        "the error says how to trust a key: {e}"
    );

    // 6. the (signed) manifest of another pool of the same size
    let other_bytes = std::fs::read(&other).unwrap();
    assert_eq!(swpool_core_image_size(&other_bytes), image_size);
    let p = case(
        "swapped",
        &[&good[..image_size], &other_bytes[image_size..]].concat(),
    );
    expect(
        &verify(&p, &[]),
        4,
        "the manifest belongs to another image",
        "swapped manifest",
    );

    // 7. the detached signature of another pool
    let p = case("othersig", &good);
    std::fs::copy(format!("{}.sig", s(&other)), format!("{}.sig", s(&p))).unwrap();
    expect(
        &verify(&p, &["--detached"]),
        7,
        "does not match the pool file",
        "other pool's .sig",
    );

    // 8. an unsigned pool
    let unsigned = make_pool(dir, "plain", 3);
    expect(&verify(&unsigned, &[]), 7, "is not signed", "unsigned");
    let _ = messages;
}

/// (manifest bytes, signature block bytes) of a pool file, parsed from its footer.
fn swpool_core_trailer(b: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let f = &b[b.len() - 80..];
    let u = |o: usize| u64::from_le_bytes(f[o..o + 8].try_into().unwrap()) as usize;
    let (image, mlen, slen) = (u(16), u(24), u(32));
    (
        b[image..image + mlen].to_vec(),
        b[image + mlen..image + mlen + slen].to_vec(),
    )
}

fn swpool_core_image_size(b: &[u8]) -> usize {
    let f = &b[b.len() - 80..];
    u64::from_le_bytes(f[16..24].try_into().unwrap()) as usize
}

/// A pool file from parts, with a correct footer (as an attacker who knows the format would write it).
fn rebuild(image: &[u8], manifest: &[u8], sig: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    let mut v = image.to_vec();
    v.extend_from_slice(manifest);
    v.extend_from_slice(sig);
    let mut f = [0u8; 80];
    f[0..8].copy_from_slice(b"SWPOOL\x00\x01");
    f[8..12].copy_from_slice(&1u32.to_le_bytes());
    f[16..24].copy_from_slice(&(image.len() as u64).to_le_bytes());
    f[24..32].copy_from_slice(&(manifest.len() as u64).to_le_bytes());
    f[32..40].copy_from_slice(&(sig.len() as u64).to_le_bytes());
    f[40..72].copy_from_slice(&sha2::Sha256::digest(manifest));
    f[72..80].copy_from_slice(b"SWPOOLFT");
    v.extend_from_slice(&f);
    v
}

/// A signed pool whose manifest covers only the first 8 MiB of a 40 MB ext4 file system (its file
/// data lies beyond): every bit of the file is signed and hashed, but the file system would read
/// bytes no hash covers. sign, verify, inspect, load and mount refuse it as damaged (status 4);
/// before, verify and load accepted it and reading the file gave EIO.
#[test]
fn a_signed_image_smaller_than_its_file_system_is_refused() {
    use swpool_core::pool::manifest::{hash_chunk, ChunkListBuilder, Manifest};
    let d = scratch();
    let dir = d.path();
    let big = make_pool(dir, "big", 7);
    let b = std::fs::read(&big).unwrap();
    let (mjson, _) = swpool_core_trailer(&b);
    let mut m = Manifest::from_json(&mjson).unwrap();
    let cut = 8 << 20;
    let image = &b[..cut];
    let mut cl = ChunkListBuilder::new(cut as u64, m.chunk_size);
    while let Some(r) = cl.next_range() {
        let bytes = &image[r.start as usize..r.end as usize];
        cl.push(bytes.iter().any(|&x| x != 0).then(|| hash_chunk(bytes)));
    }
    cl.finish_into(&mut m);
    let small = dir.join("small.ext4");
    std::fs::write(&small, rebuild(image, &m.to_json(), &[])).unwrap();
    // signing it is refused already (an admin is told before publishing)
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    assert_eq!(
        sw_run(&["keygen", "-q", "--out", s(&dir.join("adm"))]).code,
        0
    );
    let o = sw_run(&["sign", "-q", "--key", s(&dir.join("adm.pem")), s(&small)]);
    expect(&o, 4, "file system claims", "sign");
    // an attacker signs it by other means: a correct signature block over the manifest
    let signed = dir.join("signed.ext4");
    std::fs::copy(&big, &signed).unwrap();
    assert_eq!(
        sw_run(&["sign", "-q", "--key", s(&dir.join("adm.pem")), s(&signed)]).code,
        0
    );
    let (_, sig_of_big) = swpool_core_trailer(&std::fs::read(&signed).unwrap());
    let sig_block = {
        // the small manifest signed with the same (trusted) key by the openssl CLI; the
        // signature block of the big pool with that signature
        let mfile = dir.join("small.manifest");
        std::fs::write(&mfile, m.to_json()).unwrap();
        let sfile = dir.join("small.sig");
        let o = openssl(&[
            "pkeyutl",
            "-sign",
            "-inkey",
            s(&dir.join("adm.pem")),
            "-rawin",
            "-in",
            s(&mfile),
            "-out",
            s(&sfile),
        ]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        let mut v: serde_json::Value = serde_json::from_slice(&sig_of_big).unwrap();
        v["signature"] = hex::encode(std::fs::read(&sfile).unwrap()).into();
        serde_json::to_vec_pretty(&v).unwrap()
    };
    std::fs::write(&small, rebuild(image, &m.to_json(), &sig_block)).unwrap();
    std::fs::copy(dir.join("adm.pub.pem"), keys.join("adm.pem")).unwrap();
    let with_keys = |args: &[&str]| {
        run(sw()
            .env("SW_POOL_TRUSTED_KEYS", &keys)
            .env("SW_POOL_STATE_DIR", dir.join("state"))
            .env("LOCAL_TMPDIR", dir)
            .env("SW_POOL_MOUNT", dir.join("mnt"))
            .env("SW_POOL_SHELL_FUNCTION", "1")
            .args(args))
    };
    expect(
        &with_keys(&["verify", s(&small)]),
        4,
        "file system claims",
        "verify",
    );
    expect(
        &with_keys(&["inspect", s(&small)]),
        4,
        "file system claims",
        "inspect",
    );
    let o = with_keys(&[
        "load",
        "--require-signature",
        "-m",
        s(&dir.join("m")),
        s(&small),
    ]);
    expect(&o, 4, "file system claims", "load");
    std::fs::create_dir_all(dir.join("m2")).unwrap();
    let o = with_keys(&["mount", s(&small), s(&dir.join("m2"))]);
    expect(&o, 4, "file system claims", "mount");
}

/// Issue 32, point 6: `config` shows one value for require_signature: the one that applies (with a
/// trusted key installed and nothing set, `true`, as the trust policy line says).
#[test]
fn config_shows_the_require_signature_that_applies() {
    let t = tempfile::tempdir().unwrap();
    let keys = t.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let k = t.path().join("k");
    assert_eq!(
        sw_run(&["keygen", "-q", "--out", k.to_str().unwrap()]).code,
        0
    );
    std::fs::copy(t.path().join("k.pub.pem"), keys.join("site.pem")).unwrap();
    let o = run(sw().args(["config"]).env("SW_POOL_TRUSTED_KEYS", &keys));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let row = o
        .stdout
        .lines()
        .find(|l| l.starts_with("require_signature"))
        .unwrap();
    assert!(
        row.contains(" true ") && row.contains("trusted key(s) installed"),
        "{row}"
    );
}
