//! File-system formats of pool images, detected from their superblock's magic, never from a name.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::status::ExitStatus;

/// A pool's file-system format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Squashfs,
    Ext2,
    Ext3,
    Ext4,
    /// EROFS (`mkfs.erofs`): mounted by the kernel only (there is no FUSE server for it here), so
    /// through the site's mount helper.
    Erofs,
}

impl ImageFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Squashfs => "squashfs",
            ImageFormat::Ext2 => "ext2",
            ImageFormat::Ext3 => "ext3",
            ImageFormat::Ext4 => "ext4",
            ImageFormat::Erofs => "erofs",
        }
    }

    pub fn is_ext(self) -> bool {
        matches!(
            self,
            ImageFormat::Ext2 | ImageFormat::Ext3 | ImageFormat::Ext4
        )
    }

    /// Built by a tool that sizes the image itself (squashfs, EROFS), not into a preset size.
    pub fn is_packed(self) -> bool {
        matches!(self, ImageFormat::Squashfs | ImageFormat::Erofs)
    }

    /// The format implied by an output file name (`.sqfs`, `.squashfs`, `.ext2`, `.ext3`, `.ext4`).
    pub fn from_extension(p: &Path) -> Option<ImageFormat> {
        match p.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "sqfs" | "squashfs" => Some(ImageFormat::Squashfs),
            "ext2" => Some(ImageFormat::Ext2),
            "ext3" => Some(ImageFormat::Ext3),
            "ext4" => Some(ImageFormat::Ext4),
            "erofs" => Some(ImageFormat::Erofs),
            _ => None,
        }
    }
}

impl fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ImageFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "squashfs" | "sqfs" => Ok(ImageFormat::Squashfs),
            "ext2" => Ok(ImageFormat::Ext2),
            "ext3" => Ok(ImageFormat::Ext3),
            "ext4" => Ok(ImageFormat::Ext4),
            "erofs" => Ok(ImageFormat::Erofs),
            _ => Err(format!(
                "unknown format {s:?} (use squashfs, ext4, ext3, ext2 or erofs)"
            )),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("cannot read {}: {source}", crate::show::show(path))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is not a squashfs, ext2/3/4 or EROFS image (no file-system magic found)",
        crate::show::show(path)
    )]
    Unknown { path: PathBuf },
}

impl DetectError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            DetectError::Io { source, .. } => crate::status::io_status(source),
            DetectError::Unknown { .. } => ExitStatus::InvalidPool,
        }
    }
}

const SQUASHFS_MAGIC: &[u8; 4] = b"hsqs";
/// EROFS: `EROFS_SUPER_MAGIC_V1` (0xE0F5E1E2, little-endian) at byte 1024.
pub const EROFS_MAGIC: [u8; 4] = [0xE2, 0xE1, 0xF5, 0xE0];
const EXT_MAGIC_OFFSET: usize = 1024 + 56;
const EXT_FEATURE_COMPAT_HAS_JOURNAL: u32 = 0x4;
const EXT_FEATURE_INCOMPAT_EXTENTS: u32 = 0x40;
const EXT_FEATURE_INCOMPAT_64BIT: u32 = 0x80;
const EXT_FEATURE_INCOMPAT_FLEX_BG: u32 = 0x200;

/// Detect the format from the first bytes of an image (the superblock), never from its name.
pub fn detect_bytes(head: &[u8]) -> Option<ImageFormat> {
    if head.len() >= 4 && &head[..4] == SQUASHFS_MAGIC {
        return Some(ImageFormat::Squashfs);
    }
    if head.len() >= 1028 && head[1024..1028] == EROFS_MAGIC {
        return Some(ImageFormat::Erofs);
    }
    if head.len() >= 1024 + 104 && head[EXT_MAGIC_OFFSET..EXT_MAGIC_OFFSET + 2] == [0x53, 0xEF] {
        let le32 = |o: usize| u32::from_le_bytes(head[1024 + o..1024 + o + 4].try_into().unwrap());
        let compat = le32(0x5C);
        let incompat = le32(0x60);
        if incompat
            & (EXT_FEATURE_INCOMPAT_EXTENTS
                | EXT_FEATURE_INCOMPAT_64BIT
                | EXT_FEATURE_INCOMPAT_FLEX_BG)
            != 0
        {
            return Some(ImageFormat::Ext4);
        }
        if compat & EXT_FEATURE_COMPAT_HAS_JOURNAL != 0 {
            return Some(ImageFormat::Ext3);
        }
        return Some(ImageFormat::Ext2);
    }
    None
}

/// Detect the format of the image at `path`.
pub fn detect(path: &Path) -> Result<ImageFormat, DetectError> {
    let mut f = crate::file::open_regular(path).map_err(|source| DetectError::Io {
        path: path.into(),
        source,
    })?;
    let mut head = vec![0u8; 2048];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(source) => {
                return Err(DetectError::Io {
                    path: path.into(),
                    source,
                })
            }
        }
    }
    detect_bytes(&head[..n]).ok_or_else(|| DetectError::Unknown { path: path.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erofs_is_detected_by_its_magic_and_is_not_ext() {
        let mut head = vec![0u8; 2048];
        head[1024..1028].copy_from_slice(&EROFS_MAGIC);
        assert_eq!(detect_bytes(&head), Some(ImageFormat::Erofs));
        assert!(!ImageFormat::Erofs.is_ext() && ImageFormat::Erofs.is_packed());
        assert_eq!("erofs".parse::<ImageFormat>(), Ok(ImageFormat::Erofs));
        assert_eq!(
            ImageFormat::from_extension(Path::new("p.erofs")),
            Some(ImageFormat::Erofs)
        );
        head[1027] = 0;
        assert_eq!(detect_bytes(&head), None);
    }

    #[test]
    fn extensions() {
        assert_eq!(
            ImageFormat::from_extension(Path::new("a/test-pool.ext2")),
            Some(ImageFormat::Ext2)
        );
        assert_eq!(
            ImageFormat::from_extension(Path::new("x.SQFS")),
            Some(ImageFormat::Squashfs)
        );
        assert_eq!(ImageFormat::from_extension(Path::new("x.img")), None);
        assert_eq!("ext4".parse::<ImageFormat>(), Ok(ImageFormat::Ext4));
        assert!("xfs".parse::<ImageFormat>().is_err());
    }

    #[test]
    fn magic() {
        assert_eq!(detect_bytes(b"hsqs\0\0\0\0"), Some(ImageFormat::Squashfs));
        let mut ext = vec![0u8; 2048];
        ext[EXT_MAGIC_OFFSET] = 0x53;
        ext[EXT_MAGIC_OFFSET + 1] = 0xEF;
        assert_eq!(detect_bytes(&ext), Some(ImageFormat::Ext2));
        ext[1024 + 0x5C] = 0x4;
        assert_eq!(detect_bytes(&ext), Some(ImageFormat::Ext3));
        ext[1024 + 0x60] = 0x40;
        assert_eq!(detect_bytes(&ext), Some(ImageFormat::Ext4));
        assert_eq!(detect_bytes(&[0u8; 2048]), None);
        assert_eq!(detect_bytes(&[0x53u8; 100]), None);
    }
}
