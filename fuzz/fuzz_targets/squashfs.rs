#![no_main]
//! The squashfs reader on untrusted images: the superblock (every table start and `bytes_used`
//! against the image's size, a source shorter than the size it claims), the id and fragment
//! tables, every inode and directory listing it can reach (each length field: metadata block
//! headers, listing sizes and entry counts, name sizes, link target sizes, block size words,
//! fragment entries), every data block of a file one by one and reads across block boundaries,
//! every link target, name lookups that hit and miss. Never a panic, never an allocation beyond
//! what the image's bytes can hold (`-rss_limit_mb`); what it returns is consistent (a read never
//! returns more than asked, nor bytes past a file's size; a block is the block size or the file's
//! tail).
use libfuzzer_sys::fuzz_target;
use swpool_squashfs::{Archive, InodeKind};

fn walk(ar: &Archive<Vec<u8>>) {
    let Ok(root) = ar.root() else { return };
    let bs = u64::from(ar.superblock().block_size);
    let mut stack = vec![root];
    // a crafted image may loop (a directory listing itself): bound the walk
    let mut budget = 2_000u32;
    let mut buf = vec![0u8; 300_000];
    while let Some(d) = stack.pop() {
        let Ok(entries) = ar.read_dir(&d) else { continue };
        let _ = ar.lookup(&d, b"no such name");
        for e in entries {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                return;
            }
            let Ok(i) = ar.inode(e.inode) else { continue };
            if let Ok(Some(found)) = ar.lookup(&d, &e.name) {
                assert_eq!(found.name, e.name);
            }
            match &i.kind {
                InodeKind::Directory { .. } => stack.push(i),
                InodeKind::File(f) => {
                    let size = f.size;
                    for idx in 0..size.div_ceil(bs).min(64) {
                        let _ = ar.block_cached(&i, idx);
                        if let Ok(b) = ar.file_block(&i, idx) {
                            assert_eq!(b.len() as u64, (size - idx * bs).min(bs));
                        }
                    }
                    for off in [0u64, size.saturating_sub(10), size / 2, bs - 1, bs + 1] {
                        if let Ok(got) = ar.read(&i, off, &mut buf) {
                            assert!(got <= buf.len());
                            assert!(off + got as u64 <= size.max(off));
                        }
                    }
                }
                InodeKind::Symlink { .. } => {
                    let _ = ar.read_link(&i);
                }
                _ => {}
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let n = data.len() as u64;
    if let Ok(ar) = Archive::with_cache(data.to_vec(), n, 4 << 20) {
        walk(&ar);
        let _ = ar.lookup_path(b"a/b/../c");
    }
    // a source that ends before the size it claims (a short read is an error, not a panic)
    if let Ok(ar) = Archive::with_cache(data.to_vec(), n + 4096, 1 << 20) {
        walk(&ar);
    }
});
