#![no_main]
//! The superblock size reader on untrusted image heads: never panics; a size it reports is what the
//! superblock's fields say (squashfs `bytes_used`, EROFS and ext blocks × block size without
//! overflow).
use libfuzzer_sys::fuzz_target;
use swpool_format::pool::fs_size::{parse, FsSize};

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(FsSize::Squashfs(n)) => {
            assert!(data.len() >= 96 && &data[0..4] == b"hsqs");
            assert_eq!(n, u64::from_le_bytes(data[40..48].try_into().unwrap()));
        }
        Ok(FsSize::Ext(n)) => {
            assert!(data.len() >= 1024 + 0x160);
            let log = u32::from_le_bytes(data[1024 + 0x18..1024 + 0x1c].try_into().unwrap());
            assert!(log <= 6 && n % (1024u64 << log) == 0);
        }
        Ok(FsSize::Erofs(n)) => {
            assert!(data.len() >= 1024 + 40);
            let bits = data[1024 + 12];
            assert!((9..=16).contains(&bits) && n % (1u64 << bits) == 0);
            let blocks = u32::from_le_bytes(data[1024 + 36..1024 + 40].try_into().unwrap());
            assert_eq!(n, u64::from(blocks) << bits);
        }
        Ok(FsSize::Unknown) | Err(_) => {}
    }
});
