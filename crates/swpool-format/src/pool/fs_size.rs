//! The file system's own idea of its size, from its superblock, checked against the pool's image
//! size: a manifest (even a signed one) covers only `[0, image_size)`, so a file system that
//! extends past it would read bytes no chunk hash covers.
//!
//! - ext2/3/4: `s_blocks_count` (low 32 bits, plus the high 32 bits when the `64bit` feature is
//!   set) × `1024 << s_log_block_size`;
//! - squashfs: `bytes_used` (the kernel and squashfuse read nothing past it);
//! - EROFS: `blocks` × `1 << blkszbits`.

use std::os::unix::fs::FileExt;

use super::{ManifestError, Pool};

/// Bytes read from the start of the image: squashfs' superblock and ext's (at 1024).
const HEAD: usize = 2048;

/// Which file system a superblock describes, and the size it claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsSize {
    Ext(u64),
    Squashfs(u64),
    Erofs(u64),
    /// Neither: nothing to check (the mount helper will refuse it).
    Unknown,
}

fn le32(b: &[u8], at: usize) -> u64 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as u64
}

/// Parse the first [`HEAD`] bytes of an image (untrusted: any bytes are accepted; an implausible
/// superblock is an error).
pub fn parse(head: &[u8]) -> Result<FsSize, String> {
    if head.len() >= 96 && &head[0..4] == b"hsqs" {
        let used = u64::from_le_bytes(head[40..48].try_into().expect("8 bytes"));
        return Ok(FsSize::Squashfs(used));
    }
    if head.len() >= 1024 + 40 && head[1024..1028] == crate::format::EROFS_MAGIC {
        let sb = &head[1024..];
        let bits = sb[12];
        if !(9..=16).contains(&bits) {
            return Err(format!(
                "EROFS superblock: block size 1 << {bits} is not plausible"
            ));
        }
        return le32(sb, 36)
            .checked_mul(1u64 << bits)
            .map(FsSize::Erofs)
            .ok_or_else(|| "EROFS superblock: size overflows".to_string());
    }
    if head.len() >= 1024 + 0x160 && head[1024 + 0x38..1024 + 0x3a] == [0x53, 0xef] {
        let sb = &head[1024..];
        let log = le32(sb, 0x18);
        if log > 6 {
            return Err(format!(
                "ext superblock: block size 1024 << {log} is not plausible"
            ));
        }
        let block = 1024u64 << log;
        let incompat = le32(sb, 0x60);
        let mut blocks = le32(sb, 0x04);
        if incompat & 0x80 != 0 {
            blocks |= le32(sb, 0x150) << 32;
        }
        return blocks
            .checked_mul(block)
            .map(FsSize::Ext)
            .ok_or_else(|| "ext superblock: size overflows".to_string());
    }
    Ok(FsSize::Unknown)
}

/// A file without a pool footer: do bytes follow the end of its file system (squashfs:
/// `bytes_used` rounded up to the 4 KiB mksquashfs pads to; ext: its block count)? Then it is
/// not a bare image but a damaged pool (its trailer cut off) or an image with bytes appended: the
/// reason, to be reported as damage. `None` for a file that ends where its file system does (or
/// earlier), or that holds no known file system.
pub fn bytes_past_fs(file: &std::fs::File, len: u64) -> std::io::Result<Option<String>> {
    let mut head = vec![0u8; HEAD.min(len as usize)];
    file.read_exact_at(&mut head, 0)?;
    let (what, end) = match parse(&head) {
        // a superblock too damaged to say where its file system ends: the helper reports it
        Ok(FsSize::Squashfs(used)) if used >= 96 => {
            ("squashfs", used.div_ceil(4096).saturating_mul(4096))
        }
        Ok(FsSize::Ext(size)) if size >= 2048 => ("ext", size),
        Ok(FsSize::Erofs(size)) if size >= 2048 => ("EROFS", size),
        _ => return Ok(None),
    };
    Ok((len > end).then(|| {
        format!(
            "it has no pool footer, but {} bytes follow the end of its {what} file system (at byte {end}): a pool whose trailer was cut off, or an image with bytes appended. It is neither a pool that can be verified nor a bare image",
            len - end
        )
    }))
}

/// The pool's file system fits inside its (hashed, possibly signed) image.
pub fn check_fits(pool: &Pool) -> Result<FsSize, ManifestError> {
    let image = pool.manifest.image_size;
    let mut head = vec![0u8; HEAD.min(image as usize)];
    let Some(file) = &pool.file else {
        return Ok(FsSize::Unknown); // known from its trailer only: its opener checked the image
    };
    file.read_exact_at(&mut head, 0)
        .map_err(|source| ManifestError::Io {
            path: pool.path.clone(),
            source,
        })?;
    let corrupt = |reason: String| ManifestError::Corrupt {
        path: pool.path.clone(),
        reason,
    };
    let fs = parse(&head).map_err(corrupt)?;
    let size = match fs {
        FsSize::Ext(n) | FsSize::Squashfs(n) | FsSize::Erofs(n) => n,
        FsSize::Unknown => return Ok(fs),
    };
    if size > image {
        return Err(corrupt(format!(
            "its file system claims {size} bytes but the manifest covers only a {image}-byte image: \
             the file system would read bytes no chunk hash covers"
        )));
    }
    Ok(fs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erofs_size_is_blocks_times_block_size_and_implausible_ones_are_refused() {
        let mut head = vec![0u8; 2048];
        head[1024..1028].copy_from_slice(&crate::format::EROFS_MAGIC);
        head[1024 + 12] = 12; // 4 KiB blocks
        head[1024 + 36..1024 + 40].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(parse(&head), Ok(FsSize::Erofs(5 * 4096)));
        head[1024 + 12] = 40;
        assert!(parse(&head).is_err());
    }

    #[test]
    fn squashfs_and_ext_sizes() {
        let mut h = vec![0u8; HEAD];
        h[0..4].copy_from_slice(b"hsqs");
        h[40..48].copy_from_slice(&12345u64.to_le_bytes());
        assert_eq!(parse(&h), Ok(FsSize::Squashfs(12345)));
        let mut e = vec![0u8; HEAD];
        e[1024 + 0x38] = 0x53;
        e[1024 + 0x39] = 0xef;
        e[1024 + 0x04..1024 + 0x08].copy_from_slice(&16384u32.to_le_bytes());
        e[1024 + 0x18] = 2; // 4 KiB blocks
        assert_eq!(parse(&e), Ok(FsSize::Ext(16384 * 4096)));
        // 64bit feature: the high word counts
        e[1024 + 0x60] = 0x80;
        e[1024 + 0x150] = 1;
        assert_eq!(parse(&e), Ok(FsSize::Ext(((1u64 << 32) + 16384) * 4096)));
        e[1024 + 0x18] = 40;
        assert!(parse(&e).is_err());
        assert_eq!(parse(&[0u8; 10]), Ok(FsSize::Unknown));
        assert_eq!(parse(&[]), Ok(FsSize::Unknown));
    }
}
