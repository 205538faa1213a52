//! Inodes and directory listings.

use crate::{corrupt, Archive, MetaReader, ReadAt, Result};

/// The kinds of file squashfs stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Directory,
    File,
    Symlink,
    BlockDevice,
    CharDevice,
    Fifo,
    Socket,
}

impl FileType {
    fn from_basic(t: u16) -> Option<FileType> {
        Some(match t {
            1 => FileType::Directory,
            2 => FileType::File,
            3 => FileType::Symlink,
            4 => FileType::BlockDevice,
            5 => FileType::CharDevice,
            6 => FileType::Fifo,
            7 => FileType::Socket,
            _ => return None,
        })
    }

    /// The `S_IF*` bits of a mode.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Directory => 0o040000,
            FileType::File => 0o100000,
            FileType::Symlink => 0o120000,
            FileType::BlockDevice => 0o060000,
            FileType::CharDevice => 0o020000,
            FileType::Fifo => 0o010000,
            FileType::Socket => 0o140000,
        }
    }
}

/// A regular file's data: its size, its blocks (size words as stored, and where each starts), and
/// its tail in a fragment (fragment index, offset in it).
#[derive(Debug, Clone)]
pub struct FileData {
    pub size: u64,
    pub blocks: Vec<u32>,
    pub starts: Vec<u64>,
    pub fragment: Option<(u32, u32)>,
}

#[derive(Debug, Clone)]
pub enum InodeKind {
    Directory {
        /// the listing's metadata block (relative to the directory table) and offset in it
        block: u32,
        offset: u16,
        /// the listing's size plus 3
        size: u32,
        parent: u32,
    },
    File(FileData),
    Symlink {
        target: Vec<u8>,
    },
    /// `rdev` in the kernel's encoding (as `stat` gives it)
    BlockDevice {
        rdev: u32,
    },
    CharDevice {
        rdev: u32,
    },
    Fifo,
    Socket,
}

/// An inode: its number (1..=inode count), its reference (where it is in the inode table), its
/// attributes and what it is.
#[derive(Debug, Clone)]
pub struct Inode {
    pub number: u32,
    pub reference: u64,
    /// permission bits (the low 12 bits of the mode)
    pub perm: u16,
    pub uid: u32,
    pub gid: u32,
    pub mtime: u32,
    pub nlink: u32,
    pub kind: InodeKind,
}

impl Inode {
    pub fn file_type(&self) -> FileType {
        match self.kind {
            InodeKind::Directory { .. } => FileType::Directory,
            InodeKind::File(_) => FileType::File,
            InodeKind::Symlink { .. } => FileType::Symlink,
            InodeKind::BlockDevice { .. } => FileType::BlockDevice,
            InodeKind::CharDevice { .. } => FileType::CharDevice,
            InodeKind::Fifo => FileType::Fifo,
            InodeKind::Socket => FileType::Socket,
        }
    }

    /// The full mode (`S_IF*` | permissions).
    pub fn mode(&self) -> u32 {
        self.file_type().mode_bits() | u32::from(self.perm & 0o7777)
    }

    /// The size `stat` gives: a file's bytes, a link's target length, a directory's listing size.
    pub fn size(&self) -> u64 {
        match &self.kind {
            InodeKind::File(f) => f.size,
            InodeKind::Symlink { target } => target.len() as u64,
            InodeKind::Directory { size, .. } => u64::from(*size),
            _ => 0,
        }
    }

    pub fn rdev(&self) -> u32 {
        match self.kind {
            InodeKind::BlockDevice { rdev } | InodeKind::CharDevice { rdev } => rdev,
            _ => 0,
        }
    }
}

/// One directory entry: its name, its inode's reference and number, what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub inode: u64,
    pub number: u32,
    pub kind: FileType,
}

/// A symbolic link's target is at most this long (PATH_MAX).
const MAX_TARGET: u32 = 4096;
const NO_FRAGMENT: u32 = u32::MAX;

pub(crate) fn parse<R: ReadAt>(
    ar: &Archive<R>,
    m: &mut MetaReader<'_, R>,
    reference: u64,
) -> Result<Inode> {
    let kind = m.u16()?;
    let perm = m.u16()?;
    let uid = ar.id(m.u16()?)?;
    let gid = ar.id(m.u16()?)?;
    let mtime = m.u32()?;
    let number = m.u32()?;
    if number == 0 || number > ar.superblock().inode_count {
        return corrupt(format!(
            "inode {reference:#x} has number {number} (1 to {})",
            ar.superblock().inode_count
        ));
    }
    let mut nlink = 1;
    let kind = match kind {
        1 => {
            let block = m.u32()?;
            nlink = m.u32()?;
            let size = u32::from(m.u16()?);
            let offset = m.u16()?;
            let parent = m.u32()?;
            InodeKind::Directory {
                block,
                offset,
                size,
                parent,
            }
        }
        8 => {
            nlink = m.u32()?;
            let size = m.u32()?;
            let block = m.u32()?;
            let parent = m.u32()?;
            let _index_count = m.u16()?;
            let offset = m.u16()?;
            let _xattr = m.u32()?;
            InodeKind::Directory {
                block,
                offset,
                size,
                parent,
            }
        }
        2 => {
            let start = u64::from(m.u32()?);
            let frag = m.u32()?;
            let off = m.u32()?;
            let size = u64::from(m.u32()?);
            InodeKind::File(file_data(ar, m, number, start, size, frag, off)?)
        }
        9 => {
            let start = m.u64()?;
            let size = m.u64()?;
            let _sparse = m.u64()?;
            nlink = m.u32()?;
            let frag = m.u32()?;
            let off = m.u32()?;
            let _xattr = m.u32()?;
            InodeKind::File(file_data(ar, m, number, start, size, frag, off)?)
        }
        3 | 10 => {
            nlink = m.u32()?;
            let n = m.u32()?;
            if n == 0 || n > MAX_TARGET {
                return corrupt(format!(
                    "symbolic link inode {number} has a {n}-byte target (1 to {MAX_TARGET})"
                ));
            }
            let target = m.bytes(n as usize)?;
            InodeKind::Symlink { target }
        }
        4 | 5 | 11 | 12 => {
            nlink = m.u32()?;
            let rdev = m.u32()?;
            if kind == 4 || kind == 11 {
                InodeKind::BlockDevice { rdev }
            } else {
                InodeKind::CharDevice { rdev }
            }
        }
        6 | 13 => {
            nlink = m.u32()?;
            InodeKind::Fifo
        }
        7 | 14 => {
            nlink = m.u32()?;
            InodeKind::Socket
        }
        t => return corrupt(format!("inode {number} has type {t} (1 to 14)")),
    };
    Ok(Inode {
        number,
        reference,
        perm,
        uid,
        gid,
        mtime,
        nlink,
        kind,
    })
}

fn file_data<R: ReadAt>(
    ar: &Archive<R>,
    m: &mut MetaReader<'_, R>,
    number: u32,
    start: u64,
    size: u64,
    frag: u32,
    off: u32,
) -> Result<FileData> {
    let sb = ar.superblock();
    let bs = u64::from(sb.block_size);
    let fragment = if frag == NO_FRAGMENT {
        None
    } else {
        if u64::from(off) >= bs || size % bs == 0 {
            return corrupt(format!(
                "file inode {number} has its tail at offset {off} of fragment {frag}, for {size} bytes"
            ));
        }
        Some((frag, off))
    };
    let n = if fragment.is_some() {
        size / bs
    } else {
        size.div_ceil(bs)
    };
    // the list is in the inode table: a crafted count ends at the table's end, not in memory
    let mut blocks = Vec::with_capacity(n.min(2048) as usize);
    let mut starts = Vec::with_capacity(n.min(2048) as usize);
    let mut at = start;
    for _ in 0..n {
        let w = m.u32()?;
        let disk = u64::from(w & 0x00ff_ffff);
        if w & !0x01ff_ffff != 0 || disk > bs {
            return corrupt(format!(
                "file inode {number}: block size word {w:#x} (at most the block size {bs}, flag bit 24)"
            ));
        }
        blocks.push(w);
        starts.push(at);
        at = match at.checked_add(disk) {
            Some(e) if e <= sb.bytes_used => e,
            _ => {
                return corrupt(format!(
                    "file inode {number}'s blocks run past the image's end ({})",
                    sb.bytes_used
                ))
            }
        };
    }
    Ok(FileData {
        size,
        blocks,
        starts,
        fragment,
    })
}

pub(crate) fn read_listing<R: ReadAt>(
    m: &mut MetaReader<'_, R>,
    len: u64,
    dir: u32,
) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut used = 0u64;
    while used < len {
        if len - used < 12 {
            return corrupt(format!(
                "directory inode {dir}: {} bytes left in its listing, less than a header",
                len - used
            ));
        }
        let count = m.u32()?;
        let start = m.u32()?;
        let base = m.u32()?;
        used += 12;
        if count >= 256 {
            return corrupt(format!(
                "directory inode {dir}: a header of {} entries (at most 256)",
                u64::from(count) + 1
            ));
        }
        for _ in 0..=count {
            if len - used < 8 {
                return corrupt(format!(
                    "directory inode {dir}: its listing ends inside an entry"
                ));
            }
            let offset = m.u16()?;
            let delta = m.u16()? as i16;
            let t = m.u16()?;
            let nsize = usize::from(m.u16()?) + 1;
            used += 8;
            if nsize > 256 || (len - used) < nsize as u64 {
                return corrupt(format!(
                    "directory inode {dir}: a {nsize}-byte name (at most 256, within the listing)"
                ));
            }
            let name = m.bytes(nsize)?;
            used += nsize as u64;
            if name == b"." || name == b".." || name.iter().any(|&c| c == b'/' || c == 0) {
                return corrupt(format!(
                    "directory inode {dir}: an entry named {:?}",
                    String::from_utf8_lossy(&name)
                ));
            }
            let Some(kind) = FileType::from_basic(t) else {
                return corrupt(format!("directory inode {dir}: an entry of type {t}"));
            };
            if u32::from(offset) >= crate::METADATA_SIZE as u32 {
                return corrupt(format!(
                    "directory inode {dir}: an entry at offset {offset} of its inode block"
                ));
            }
            out.push(DirEntry {
                name,
                inode: (u64::from(start) << 16) | u64::from(offset),
                number: base.wrapping_add(delta as i32 as u32),
                kind,
            });
        }
    }
    Ok(out)
}
