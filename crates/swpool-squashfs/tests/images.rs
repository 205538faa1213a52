//! Real images built with mksquashfs from a tree made here, read back through the reader and
//! compared with the tree: every file's bytes, mode, owner, mtime, link count, every symbolic
//! link's target, every directory's listing.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use swpool_squashfs::{Archive, Error, FileType, Inode, InodeKind};

fn is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Deterministic bytes that do not compress (xorshift).
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write(p: &Path, data: &[u8], mode: u32, mtime: u64) {
    let mut f = File::create(p).unwrap();
    f.write_all(data).unwrap();
    f.set_modified(UNIX_EPOCH + Duration::from_secs(mtime))
        .unwrap();
    drop(f);
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// The tree every image is built from.
fn make_tree(root: &Path) {
    fs::create_dir_all(root).unwrap();
    write(&root.join("empty"), b"", 0o644, 1_600_000_000);
    write(
        &root.join("small.txt"),
        b"hello squashfs\n",
        0o640,
        1_600_000_001,
    );
    write(
        &root.join("exe"),
        b"#!/bin/sh\necho hi\n",
        0o4755,
        1_600_000_002,
    );
    let bs = 128 * 1024;
    write(&root.join("one-block"), &noise(1, bs), 0o644, 1_600_000_003);
    write(
        &root.join("block-plus-one"),
        &noise(2, bs + 1),
        0o644,
        1_600_000_004,
    );
    // several blocks, part noise (stored) and part text (compressed), with a tail
    let mut big = noise(3, 5 * bs);
    big.extend(b"0123456789abcdef".iter().cycle().take(3 * bs + 777));
    write(&root.join("big"), &big, 0o600, 1_600_000_005);
    // sparse: a hole, data, a hole
    {
        let p = root.join("sparse");
        let f = File::create(&p).unwrap();
        f.set_len(4 * 1024 * 1024 + 5).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"in the middle", 2 * 1024 * 1024 + 3)
            .unwrap();
        f.set_modified(UNIX_EPOCH + Duration::from_secs(1_600_000_006))
            .unwrap();
    }
    // hard links
    write(
        &root.join("linked"),
        b"one inode, three names\n",
        0o644,
        1_600_000_007,
    );
    fs::create_dir(root.join("links")).unwrap();
    fs::hard_link(root.join("linked"), root.join("links/second")).unwrap();
    fs::hard_link(root.join("linked"), root.join("links/third")).unwrap();
    // symbolic links, one long
    std::os::unix::fs::symlink("small.txt", root.join("to-small")).unwrap();
    std::os::unix::fs::symlink("../nowhere/dangling", root.join("links/dangling")).unwrap();
    let long: String = (0..60).map(|i| format!("d{i:02}/")).collect::<String>() + "end";
    std::os::unix::fs::symlink(&long, root.join("long-link")).unwrap();
    // a deep tree
    let mut d = root.join("deep");
    for i in 0..40 {
        d = d.join(format!("level-{i}"));
    }
    fs::create_dir_all(&d).unwrap();
    write(&d.join("bottom"), b"at the bottom\n", 0o444, 1_600_000_008);
    // a wide directory: many headers, several metadata blocks, an indexed (extended) directory
    let wide = root.join("wide");
    fs::create_dir(&wide).unwrap();
    for i in 0..1500 {
        let name = format!("file-{i:05}-{}", "x".repeat(i % 90));
        write(
            &wide.join(name),
            format!("{i}\n").as_bytes(),
            0o644,
            1_600_001_000 + i as u64,
        );
    }
    fs::create_dir(root.join("empty-dir")).unwrap();
    fs::set_permissions(root.join("empty-dir"), fs::Permissions::from_mode(0o1777)).unwrap();
    let fifo = root.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    if is_root() {
        std::os::unix::fs::chown(root.join("small.txt"), Some(1234), Some(5678)).unwrap();
        std::os::unix::fs::lchown(root.join("to-small"), Some(4321), Some(8765)).unwrap();
        std::os::unix::fs::chown(root.join("wide"), Some(65534), Some(100)).unwrap();
    }
    // directories' mtimes last: making entries changes them
    for dir in ["links", "deep", "wide", "empty-dir"] {
        let f = File::open(root.join(dir)).unwrap();
        f.set_modified(UNIX_EPOCH + Duration::from_secs(1_600_002_000))
            .unwrap();
    }
}

fn mksquashfs(src: &Path, out: &Path, extra: &[&str]) {
    let o = Command::new("mksquashfs")
        .arg(src)
        .arg(out)
        .args(["-noappend", "-no-progress", "-quiet"])
        .args(extra)
        .output()
        .expect("mksquashfs runs");
    assert!(
        o.status.success(),
        "mksquashfs {extra:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn open(img: &Path) -> Archive<File> {
    let f = File::open(img).unwrap();
    let n = f.metadata().unwrap().len();
    Archive::open(f, n).unwrap_or_else(|e| panic!("{}: {e}", img.display()))
}

fn kind_of(m: &fs::Metadata) -> FileType {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else if t.is_file() {
        FileType::File
    } else if t.is_fifo() {
        FileType::Fifo
    } else if t.is_socket() {
        FileType::Socket
    } else if t.is_block_device() {
        FileType::BlockDevice
    } else {
        FileType::CharDevice
    }
}

fn read_all(ar: &Archive<File>, ino: &Inode, step: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; step];
    loop {
        let n = ar.read(ino, out.len() as u64, &mut buf).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

/// Compare the image with the tree; returns how many entries were checked.
fn compare(ar: &Archive<File>, src: &Path, uncompressed_mtime_of_root: bool) -> usize {
    let mut numbers: BTreeMap<u64, u32> = BTreeMap::new();
    let mut checked = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = src.join(&rel);
        let m = fs::symlink_metadata(&p).unwrap();
        let ino = ar
            .lookup_path(rel.as_os_str().as_encoded_bytes())
            .unwrap()
            .unwrap_or_else(|| panic!("{} is not in the image", rel.display()));
        let what = rel.display().to_string();
        assert_eq!(ino.file_type(), kind_of(&m), "{what}: type");
        assert_eq!(
            ino.mode(),
            m.mode(),
            "{what}: mode {:o} vs {:o}",
            ino.mode(),
            m.mode()
        );
        assert_eq!(ino.uid, m.uid(), "{what}: uid");
        assert_eq!(ino.gid, m.gid(), "{what}: gid");
        if !(rel.as_os_str().is_empty() && uncompressed_mtime_of_root) {
            assert_eq!(i64::from(ino.mtime), m.mtime(), "{what}: mtime");
        }
        match &ino.kind {
            InodeKind::File(_) => {
                assert_eq!(ino.nlink as u64, m.nlink(), "{what}: nlink");
                // hard links share one inode
                if let Some(n) = numbers.insert(m.ino(), ino.number) {
                    assert_eq!(n, ino.number, "{what}: hard link's inode number");
                }
                let want = fs::read(&p).unwrap();
                assert_eq!(ino.size(), want.len() as u64, "{what}: size");
                for step in [1 << 20, 4096, 131_071] {
                    assert!(
                        read_all(ar, &ino, step) == want,
                        "{what}: bytes read {step} at a time"
                    );
                }
                // a read across a block boundary, one at the end, one past it
                if want.len() > 131_100 {
                    let mut b = vec![0u8; 200];
                    assert_eq!(ar.read(&ino, 131_000, &mut b).unwrap(), 200);
                    assert_eq!(&b[..], &want[131_000..131_200], "{what}: across a block");
                }
                let mut b = vec![0u8; 10];
                assert_eq!(ar.read(&ino, want.len() as u64 + 5, &mut b).unwrap(), 0);
            }
            InodeKind::Symlink { .. } => {
                let t = fs::read_link(&p).unwrap();
                assert_eq!(
                    ar.read_link(&ino).unwrap(),
                    t.as_os_str().as_encoded_bytes(),
                    "{what}: target"
                );
                assert_eq!(ino.size(), t.as_os_str().len() as u64);
            }
            InodeKind::Directory { .. } => {
                let mut want: Vec<Vec<u8>> = fs::read_dir(&p)
                    .unwrap()
                    .map(|e| e.unwrap().file_name().as_encoded_bytes().to_vec())
                    .collect();
                want.sort();
                let got = ar.read_dir(&ino).unwrap();
                let names: Vec<Vec<u8>> = got.iter().map(|e| e.name.clone()).collect();
                assert_eq!(names, want, "{what}: listing");
                assert_eq!(ino.nlink as u64, m.nlink(), "{what}: nlink");
                for e in &got {
                    let child = ar.inode(e.inode).unwrap();
                    assert_eq!(child.number, e.number, "{what}: entry's inode number");
                    assert_eq!(child.file_type(), e.kind, "{what}: entry's type");
                    stack.push(
                        rel.join(std::ffi::OsStr::from_encoded_bytes_unchecked_safe(&e.name)),
                    );
                }
                assert!(ar.lookup(&ino, b"no-such-entry").unwrap().is_none());
            }
            _ => {}
        }
        checked += 1;
    }
    checked
}

trait FromBytes {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr;
}
impl FromBytes for std::ffi::OsStr {
    fn from_encoded_bytes_unchecked_safe(b: &[u8]) -> &std::ffi::OsStr {
        std::os::unix::ffi::OsStrExt::from_bytes(b)
    }
}

fn roundtrip(extra: &[&str]) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    make_tree(&src);
    let img = t.path().join("img.sqfs");
    mksquashfs(&src, &img, extra);
    let ar = open(&img);
    let n = compare(&ar, &src, false);
    assert!(n > 1550, "{n} entries checked");
}

#[test]
fn zstd_image_reads_back_as_the_tree() {
    roundtrip(&["-comp", "zstd"]);
}

#[test]
fn gzip_image_reads_back_as_the_tree() {
    roundtrip(&["-comp", "gzip"]);
}

#[test]
fn uncompressed_image_reads_back_as_the_tree() {
    // what `sw-pool build --no-compress` passes
    roundtrip(&["-comp", "zstd", "-noI", "-noId", "-noD", "-noF", "-noX"]);
}

#[test]
fn uncompressed_metadata_compressed_data() {
    roundtrip(&["-comp", "zstd", "-noI", "-noId"]);
    roundtrip(&["-comp", "gzip", "-noD"]);
}

#[test]
fn no_fragments_and_always_fragments() {
    roundtrip(&["-comp", "zstd", "-no-fragments"]);
    roundtrip(&["-comp", "zstd", "-always-use-fragments"]);
}

#[test]
fn small_and_large_blocks() {
    roundtrip(&["-comp", "zstd", "-b", "4096"]);
    roundtrip(&["-comp", "gzip", "-b", "1M"]);
}

#[test]
fn devices_from_a_pseudo_file() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let img = t.path().join("img.sqfs");
    mksquashfs(
        &src,
        &img,
        &[
            "-comp",
            "zstd",
            "-p",
            "null c 666 0 0 1 3",
            "-p",
            "disk b 640 0 6 8 17",
            "-p",
            "big c 600 0 0 300 70000",
        ],
    );
    let ar = open(&img);
    let null = ar.lookup_path(b"null").unwrap().unwrap();
    assert_eq!(null.file_type(), FileType::CharDevice);
    assert_eq!(null.mode(), 0o020666);
    assert_eq!(null.rdev(), 0x103);
    let disk = ar.lookup_path(b"disk").unwrap().unwrap();
    assert_eq!(disk.file_type(), FileType::BlockDevice);
    assert_eq!((disk.uid, disk.gid), (0, 6));
    assert_eq!(disk.rdev(), (8 << 8) | 17);
    // major 300, minor 70000 in the kernel's (new_encode_dev) encoding
    let big = ar.lookup_path(b"big").unwrap().unwrap();
    let (maj, min) = (300u32, 70000u32);
    assert_eq!(
        big.rdev(),
        (min & 0xff) | (maj << 8) | ((min & !0xff) << 12)
    );
}

#[test]
fn other_compressors_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    write(&src.join("f"), b"x", 0o644, 1);
    for comp in ["lzo", "xz", "lz4", "lzma"] {
        let img = t.path().join(format!("{comp}.sqfs"));
        mksquashfs(&src, &img, &["-comp", comp]);
        let f = File::open(&img).unwrap();
        let n = f.metadata().unwrap().len();
        match Archive::open(f, n) {
            Err(Error::Unsupported(m)) => {
                assert!(m.contains(comp), "{comp}: {m}");
                let full = Error::Unsupported(m).to_string();
                assert!(full.contains("squashfuse_ll"), "{full}");
            }
            Err(e) => panic!("{comp}: {e}"),
            Ok(_) => panic!("{comp}: opened"),
        }
    }
}

/// Every prefix and every single-byte change of a small image: an error or a result, never a
/// panic (the fuzz target does this at scale).
#[test]
fn truncated_and_flipped_images_are_errors_not_panics() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    write(&src.join("d/f"), &noise(9, 5000), 0o644, 1);
    write(&src.join("g"), b"gg", 0o644, 1);
    std::os::unix::fs::symlink("d/f", src.join("l")).unwrap();
    let img = t.path().join("img.sqfs");
    mksquashfs(&src, &img, &["-comp", "zstd", "-b", "4096"]);
    let bytes = fs::read(&img).unwrap();
    let walk = |b: Vec<u8>| {
        let n = b.len() as u64;
        if let Ok(ar) = Archive::open(b, n) {
            let _ = swpool_squashfs_walk(&ar);
        }
    };
    for cut in 0..bytes.len() {
        walk(bytes[..cut].to_vec());
    }
    for i in 0..bytes.len().min(4096) {
        for x in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= x;
            walk(b);
        }
    }
}

fn swpool_squashfs_walk(ar: &Archive<Vec<u8>>) -> Result<(), Error> {
    let mut stack = vec![ar.root()?];
    let mut budget = 10_000;
    while let Some(d) = stack.pop() {
        budget -= 1;
        if budget == 0 {
            break;
        }
        for e in ar.read_dir(&d)? {
            let i = ar.inode(e.inode)?;
            match i.kind {
                InodeKind::Directory { .. } => stack.push(i),
                InodeKind::File(_) => {
                    let mut b = vec![0u8; 70_000];
                    ar.read(&i, 0, &mut b)?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}
