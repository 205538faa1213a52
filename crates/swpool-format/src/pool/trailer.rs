//! The pool file: `[image][manifest JSON][signature block][footer]`.
//!
//! The manifest travels *inside* the pool file, after the end of the file system, so that a pool is
//! always one file: `cp`, `sbcast`, `scp` or our broadcast cannot separate an image from its manifest
//! or pair it with the wrong one. File-system tools ignore the trailer (squashfs and ext2/3/4 know
//! their own size from the superblock). The footer is the last [`FOOTER_LEN`] bytes:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SWPOOL\0\x01` |
//! | 4 | footer version (1), little endian |
//! | 4 | reserved (0) |
//! | 8 | image size |
//! | 8 | manifest length |
//! | 8 | signature block length (0 = unsigned) |
//! | 32 | SHA-256 of the manifest bytes |
//! | 8 | end magic `SWPOOLFT` |

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

pub const FOOTER_LEN: u64 = 80;
pub const MAGIC: &[u8; 8] = b"SWPOOL\x00\x01";
pub const END_MAGIC: &[u8; 8] = b"SWPOOLFT";
pub const FOOTER_VERSION: u32 = 1;
/// Upper bounds for untrusted lengths.
pub const MAX_MANIFEST_LEN: u64 = 64 << 20;
pub const MAX_SIG_LEN: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub image_size: u64,
    pub manifest_len: u64,
    pub sig_len: u64,
    pub manifest_sha256: [u8; 32],
}

/// Why a file's trailer could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrailerError {
    #[error("no sw-pool trailer (the file is {0} bytes, too short)")]
    TooShort(u64),
    #[error("no sw-pool trailer at the end of the file")]
    NoMagic,
    #[error("trailer version {0} is newer than this sw-pool understands; upgrade sw-pool")]
    Version(u32),
    #[error("trailer is corrupt: {0}")]
    Corrupt(String),
}

impl Footer {
    pub fn encode(&self) -> [u8; FOOTER_LEN as usize] {
        let mut b = [0u8; FOOTER_LEN as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&FOOTER_VERSION.to_le_bytes());
        b[16..24].copy_from_slice(&self.image_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.manifest_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.sig_len.to_le_bytes());
        b[40..72].copy_from_slice(&self.manifest_sha256);
        b[72..80].copy_from_slice(END_MAGIC);
        b
    }

    /// Decode the last bytes of a file of `file_len` bytes; every length is checked against the file.
    pub fn decode(b: &[u8], file_len: u64) -> Result<Footer, TrailerError> {
        if file_len < FOOTER_LEN || b.len() != FOOTER_LEN as usize {
            return Err(TrailerError::TooShort(file_len));
        }
        if &b[0..8] != MAGIC || &b[72..80] != END_MAGIC {
            return Err(TrailerError::NoMagic);
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let version = u32_at(8);
        if version != FOOTER_VERSION {
            return Err(TrailerError::Version(version));
        }
        if u32_at(12) != 0 {
            return Err(TrailerError::Corrupt("reserved field is not zero".into()));
        }
        let f = Footer {
            image_size: u64_at(16),
            manifest_len: u64_at(24),
            sig_len: u64_at(32),
            manifest_sha256: b[40..72].try_into().unwrap(),
        };
        if f.manifest_len == 0 || f.manifest_len > MAX_MANIFEST_LEN {
            return Err(TrailerError::Corrupt(format!(
                "manifest length {} out of range",
                f.manifest_len
            )));
        }
        if f.sig_len > MAX_SIG_LEN {
            return Err(TrailerError::Corrupt(format!(
                "signature length {} out of range",
                f.sig_len
            )));
        }
        let total = f
            .image_size
            .checked_add(f.manifest_len)
            .and_then(|x| x.checked_add(f.sig_len))
            .and_then(|x| x.checked_add(FOOTER_LEN));
        if total != Some(file_len) {
            return Err(TrailerError::Corrupt(format!(
                "sizes do not add up to the file length (image {} + manifest {} + signature {} + footer {FOOTER_LEN} != {file_len}): truncated or appended to",
                f.image_size, f.manifest_len, f.sig_len
            )));
        }
        Ok(f)
    }
}

/// The trailer of an open pool file, read and checked (manifest bytes match their hash).
#[derive(Debug, Clone)]
pub struct RawTrailer {
    pub footer: Footer,
    pub manifest: Vec<u8>,
    pub signature: Vec<u8>,
}

pub enum ReadError {
    Io(io::Error),
    Trailer(TrailerError),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

pub fn read_trailer(f: &mut File) -> Result<RawTrailer, ReadError> {
    let len = f.metadata()?.len();
    read_trailer_from(f, len)
}

/// Read the trailer of `len` bytes of pool data from any seekable reader (a file, or bytes in memory).
pub fn read_trailer_from<R: Read + Seek>(f: &mut R, len: u64) -> Result<RawTrailer, ReadError> {
    if len < FOOTER_LEN {
        return Err(ReadError::Trailer(TrailerError::TooShort(len)));
    }
    let mut fb = [0u8; FOOTER_LEN as usize];
    f.seek(SeekFrom::Start(len - FOOTER_LEN))?;
    f.read_exact(&mut fb)?;
    let footer = match Footer::decode(&fb, len) {
        Ok(f) => f,
        Err(TrailerError::NoMagic) => return Err(ReadError::Trailer(misplaced_footer(f, len)?)),
        Err(e) => return Err(ReadError::Trailer(e)),
    };
    f.seek(SeekFrom::Start(footer.image_size))?;
    let mut manifest = vec![0u8; footer.manifest_len as usize];
    f.read_exact(&mut manifest)?;
    if <[u8; 32]>::from(Sha256::digest(&manifest)) != footer.manifest_sha256 {
        return Err(ReadError::Trailer(TrailerError::Corrupt(
            "manifest bytes do not match their hash".into(),
        )));
    }
    let mut signature = vec![0u8; footer.sig_len as usize];
    f.read_exact(&mut signature)?;
    Ok(RawTrailer {
        footer,
        manifest,
        signature,
    })
}

/// No footer at the end: is there one near the end (the file was truncated or appended to)?
fn misplaced_footer<R: Read + Seek>(f: &mut R, len: u64) -> io::Result<TrailerError> {
    let window = len.min(1 << 20);
    let mut tail = vec![0u8; window as usize];
    f.seek(SeekFrom::Start(len - window))?;
    f.read_exact(&mut tail)?;
    let found = tail.windows(MAGIC.len()).rposition(|w| w == MAGIC);
    Ok(match found {
        Some(pos) => {
            let at = len - window + pos as u64;
            let expected_end = at + FOOTER_LEN;
            if expected_end > len {
                TrailerError::Corrupt(format!(
                    "the file was truncated: it ends {} bytes before its trailer does",
                    expected_end - len
                ))
            } else {
                TrailerError::Corrupt(format!(
                    "{} bytes were appended after the trailer",
                    len - expected_end
                ))
            }
        }
        None => TrailerError::NoMagic,
    })
}

/// The trailer bytes (manifest, signature block, footer) for an image of `image_size` bytes.
pub fn trailer_bytes(image_size: u64, manifest: &[u8], signature: &[u8]) -> Vec<u8> {
    let footer = Footer {
        image_size,
        manifest_len: manifest.len() as u64,
        sig_len: signature.len() as u64,
        manifest_sha256: Sha256::digest(manifest).into(),
    };
    let mut v = Vec::with_capacity(manifest.len() + signature.len() + FOOTER_LEN as usize);
    v.extend_from_slice(manifest);
    v.extend_from_slice(signature);
    v.extend_from_slice(&footer.encode());
    v
}

/// Write the trailer after the image (truncating anything already there) and return the file's new length.
pub fn write_trailer(
    f: &mut File,
    image_size: u64,
    manifest: &[u8],
    signature: &[u8],
) -> io::Result<u64> {
    // never write a pool that every reader would refuse (about 1 M chunks: 1 TiB at 1 MiB chunks)
    if manifest.len() as u64 > MAX_MANIFEST_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "the manifest would take {} bytes, more than the {} MiB a pool may carry; \
                 build with a larger --chunk",
                manifest.len(),
                MAX_MANIFEST_LEN >> 20
            ),
        ));
    }
    f.set_len(image_size)?;
    f.seek(SeekFrom::Start(image_size))?;
    let t = trailer_bytes(image_size, manifest, signature);
    f.write_all(&t)?;
    f.flush()?;
    Ok(image_size + t.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footer_round_trip() {
        let f = Footer {
            image_size: 4096,
            manifest_len: 10,
            sig_len: 0,
            manifest_sha256: [7; 32],
        };
        let b = f.encode();
        assert_eq!(Footer::decode(&b, 4096 + 10 + FOOTER_LEN), Ok(f));
    }

    #[test]
    fn footer_rejects_bad_lengths() {
        let f = Footer {
            image_size: 4096,
            manifest_len: 10,
            sig_len: 0,
            manifest_sha256: [7; 32],
        };
        let b = f.encode();
        assert!(matches!(
            Footer::decode(&b, 4096 + 10 + FOOTER_LEN + 1),
            Err(TrailerError::Corrupt(_))
        ));
        assert!(matches!(
            Footer::decode(&b, 4096 + 9 + FOOTER_LEN),
            Err(TrailerError::Corrupt(_))
        ));
        assert!(matches!(
            Footer::decode(&b, 10),
            Err(TrailerError::TooShort(10))
        ));
        let huge = Footer {
            image_size: u64::MAX,
            manifest_len: 10,
            sig_len: 0,
            manifest_sha256: [0; 32],
        };
        assert!(matches!(
            Footer::decode(&huge.encode(), 1000),
            Err(TrailerError::Corrupt(_))
        ));
        let mut nomagic = b;
        nomagic[0] = b'X';
        assert_eq!(
            Footer::decode(&nomagic, 4096 + 10 + FOOTER_LEN),
            Err(TrailerError::NoMagic)
        );
        let mut v2 = b;
        v2[8] = 2;
        assert_eq!(
            Footer::decode(&v2, 4096 + 10 + FOOTER_LEN),
            Err(TrailerError::Version(2))
        );
    }

    #[test]
    fn write_then_read() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&[1u8; 8192]).unwrap();
        let n = write_trailer(&mut f, 8192, b"{\"x\":1}", b"").unwrap();
        assert_eq!(f.metadata().unwrap().len(), n);
        let t = read_trailer(&mut f).ok().unwrap();
        assert_eq!(t.manifest, b"{\"x\":1}");
        assert!(t.signature.is_empty());
        // rewriting (as `sign` will) replaces the old trailer
        write_trailer(&mut f, 8192, b"{\"x\":2}", b"SIG").unwrap();
        let t = read_trailer(&mut f).ok().unwrap();
        assert_eq!(
            (t.manifest.as_slice(), t.signature.as_slice()),
            (&b"{\"x\":2}"[..], &b"SIG"[..])
        );
    }
}
