#![no_main]
//! The squashfs reader on untrusted images: opening, every inode and directory listing it can
//! reach, every file's data blocks and fragments, every link target. Never a panic, never an
//! allocation beyond what the image's bytes can hold (`-rss_limit_mb`); what it returns is
//! consistent (a read never returns more than asked, nor bytes past a file's size).
use libfuzzer_sys::fuzz_target;
use swpool_squashfs::{Archive, InodeKind};

fuzz_target!(|data: &[u8]| {
    let n = data.len() as u64;
    let Ok(ar) = Archive::with_cache(data.to_vec(), n, 4 << 20) else {
        return;
    };
    let Ok(root) = ar.root() else { return };
    let mut stack = vec![root];
    // a crafted image may loop (a directory listing itself): bound the walk
    let mut budget = 2_000u32;
    let mut buf = vec![0u8; 300_000];
    while let Some(d) = stack.pop() {
        let Ok(entries) = ar.read_dir(&d) else { continue };
        for e in entries {
            budget = budget.saturating_sub(1);
            if budget == 0 {
                return;
            }
            let Ok(i) = ar.inode(e.inode) else { continue };
            let _ = ar.lookup(&d, &e.name);
            match &i.kind {
                InodeKind::Directory { .. } => stack.push(i),
                InodeKind::File(f) => {
                    let size = f.size;
                    for off in [0u64, size.saturating_sub(10), size / 2] {
                        if let Ok(got) = ar.read(&i, off, &mut buf) {
                            assert!(got <= buf.len());
                            assert!(off + got as u64 <= size);
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
});
