//! Reproducible ext images: `mke2fs -d` copies every source file's atime and ctime into the image,
//! and reading the tree (mke2fs itself reads it) moves the atimes on. So the same tree would give a
//! different image on the next build. After mke2fs, sw-pool sets every used inode's atime and ctime to
//! its mtime, in place, in the inode tables (the only fields touched). Images are built without
//! `metadata_csum` (the manifest's chunk hashes protect a pool far better), so no inode checksum
//! needs recomputing; an image with it is refused here rather than corrupted.

use std::fs::File;
use std::os::unix::fs::FileExt;

const SB_OFFSET: u64 = 1024;
const EXT_MAGIC: u16 = 0xEF53;
const INCOMPAT_64BIT: u32 = 0x80;
const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
const RO_COMPAT_GDT_CSUM: u32 = 0x10;
const BG_INODE_UNINIT: u16 = 0x1;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}

fn bad(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// Call `visit(inode number, inode bytes)` for every used inode of the ext2/3/4 image in `f`;
/// with `write`, the inode tables `visit` changed (it returns true) are written back.
fn walk_inodes(
    f: &File,
    write: bool,
    mut visit: impl FnMut(u64, &mut [u8]) -> bool,
) -> std::io::Result<()> {
    let mut sb = [0u8; 1024];
    f.read_exact_at(&mut sb, SB_OFFSET)?;
    if le16(&sb, 0x38) != EXT_MAGIC {
        return Err(bad("not an ext2/3/4 image (no superblock magic)".into()));
    }
    let inodes_count = le32(&sb, 0x0) as u64;
    let first_data_block = le32(&sb, 0x14) as u64;
    let log_block = le32(&sb, 0x18);
    if log_block > 6 {
        return Err(bad(format!("implausible block size 2^(10+{log_block})")));
    }
    let block_size = 1024u64 << log_block;
    let inodes_per_group = le32(&sb, 0x28) as u64;
    let rev = le32(&sb, 0x4C);
    let inode_size = if rev == 0 {
        128
    } else {
        le16(&sb, 0x58) as u64
    };
    let incompat = le32(&sb, 0x60);
    let ro_compat = le32(&sb, 0x64);
    if ro_compat & RO_COMPAT_METADATA_CSUM != 0 {
        return Err(bad(
            "the image has metadata_csum; sw-pool builds ext images without it".into(),
        ));
    }
    if inodes_per_group == 0 || !(128..=4096).contains(&inode_size) || !inode_size.is_power_of_two()
    {
        return Err(bad("implausible inode geometry in the superblock".into()));
    }
    let desc_size = if incompat & INCOMPAT_64BIT != 0 {
        (le16(&sb, 0xFE) as u64).max(32)
    } else {
        32
    };
    let groups = inodes_count.div_ceil(inodes_per_group);
    let file_len = f.metadata()?.len();
    if groups * desc_size > file_len || inodes_per_group * inode_size > file_len.min(1 << 30) {
        return Err(bad(format!(
            "implausible geometry in the superblock ({groups} groups of {inodes_per_group} inodes) for an image of {file_len} bytes"
        )));
    }
    let mut gdt = vec![0u8; (groups * desc_size) as usize];
    f.read_exact_at(&mut gdt, (first_data_block + 1) * block_size)?;
    let mut table = vec![0u8; (inodes_per_group * inode_size) as usize];
    for g in 0..groups as usize {
        let d = &gdt[g * desc_size as usize..(g + 1) * desc_size as usize];
        let mut itable = le32(d, 0x8) as u64;
        if desc_size >= 64 {
            itable |= (le32(d, 0x28) as u64) << 32;
        }
        let flags = le16(d, 0x12);
        if ro_compat & RO_COMPAT_GDT_CSUM != 0 && flags & BG_INODE_UNINIT != 0 {
            continue;
        }
        let mut used = inodes_per_group;
        if ro_compat & RO_COMPAT_GDT_CSUM != 0 {
            used -= (le16(d, 0x1C) as u64).min(inodes_per_group);
        }
        if used == 0 {
            continue;
        }
        let len = (used * inode_size) as usize;
        let at = itable
            .checked_mul(block_size)
            .filter(|at| at.saturating_add(len as u64) <= file_len)
            .ok_or_else(|| {
                bad(format!(
                    "group {g}'s inode table (block {itable}) lies outside the image of {file_len} bytes"
                ))
            })?;
        f.read_exact_at(&mut table[..len], at)?;
        let mut changed = false;
        for i in 0..used as usize {
            let ino = &mut table[i * inode_size as usize..(i + 1) * inode_size as usize];
            if le16(ino, 0x0) == 0 && le16(ino, 0x1A) == 0 {
                continue; // free inode
            }
            changed |= visit(g as u64 * inodes_per_group + i as u64 + 1, ino);
        }
        if changed && write {
            f.write_all_at(&table[..len], at)?;
        }
    }
    Ok(())
}

/// Set atime and ctime to mtime in every used inode of the ext2/3/4 image in `f`.
/// Returns the number of inodes rewritten.
pub fn normalize_times(f: &File) -> std::io::Result<u64> {
    let mut rewritten = 0u64;
    walk_inodes(f, true, |_, ino| {
        let inode_size = ino.len();
        let mtime = [ino[0x10], ino[0x11], ino[0x12], ino[0x13]];
        let mut dirty = ino[0x8..0xC] != mtime || ino[0xC..0x10] != mtime;
        ino[0x8..0xC].copy_from_slice(&mtime); // i_atime
        ino[0xC..0x10].copy_from_slice(&mtime); // i_ctime
        if inode_size > 128 {
            let extra = le16(ino, 0x80) as usize;
            // i_ctime_extra 0x84, i_mtime_extra 0x88, i_atime_extra 0x8C (present when extra_isize covers them)
            if 0x80 + extra >= 0x90 {
                let mx = [ino[0x88], ino[0x89], ino[0x8A], ino[0x8B]];
                dirty |= ino[0x84..0x88] != mx || ino[0x8C..0x90] != mx;
                ino[0x84..0x88].copy_from_slice(&mx);
                ino[0x8C..0x90].copy_from_slice(&mx);
            }
        }
        rewritten += u64::from(dirty);
        dirty
    })?;
    Ok(rewritten)
}

/// Every used inode's number, `i_mode` and device number (`st_rdev`, for device inodes; 0
/// otherwise), read from the inode tables of the ext2/3/4 image at the start of `f`.
pub fn inode_modes(f: &File) -> std::io::Result<Vec<(u64, u32, u64)>> {
    let mut v = Vec::new();
    walk_inodes(f, false, |n, ino| {
        let mode = u32::from(le16(ino, 0x0));
        let t = mode & libc::S_IFMT;
        let rdev = if t == libc::S_IFCHR || t == libc::S_IFBLK {
            // i_block[0]: the old 8:8 encoding; else i_block[1]: the new 12:20 one
            let (old, new) = (le32(ino, 0x28), le32(ino, 0x2C));
            if old != 0 {
                libc::makedev((old >> 8) & 0xff, old & 0xff)
            } else {
                libc::makedev((new & 0xfff00) >> 8, (new & 0xff) | ((new >> 12) & 0xfff00))
            }
        } else {
            0
        };
        v.push((n, mode, rdev));
        false
    })?;
    Ok(v)
}
