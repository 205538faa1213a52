//! Pools: the layout of a pool's tree, its manifest, and the pool file that carries both.

pub mod chunks;
pub mod fs_size;
pub mod layout;
pub mod manifest;
pub mod modulefile;
pub mod spec;
pub mod trailer;

use std::fs::File;
use std::path::{Path, PathBuf};

pub use layout::{LayoutError, PoolLayout, PoolToml};
pub use manifest::{Manifest, PackageRef};

use crate::status::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {}: {source}", crate::show::show(path))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is not a sw-pool pool: {reason}; build one with `sw-pool build OUT SRC`",
        crate::show::show(path)
    )]
    NotAPool {
        path: PathBuf,
        reason: trailer::TrailerError,
    },
    #[error(
        "{} is not a regular file (a FIFO, a device or a directory); give a pool file",
        crate::show::show(path)
    )]
    NotRegular { path: PathBuf },
    #[error(
        "{} is a damaged pool: {reason}; rebuild it or copy it again from its source",
        crate::show::show(path)
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error("{} starts like a {format} image but has no sw-pool trailer at its end: it was truncated, or it is a bare image (build pools with `sw-pool build`)", crate::show::show(path))]
    NoTrailer {
        path: PathBuf,
        format: crate::format::ImageFormat,
    },
}

impl ManifestError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            ManifestError::Io { source, .. } => crate::status::io_status(source),
            _ => ExitStatus::InvalidPool,
        }
    }
}

pub use crate::file::open_regular;

/// An opened pool file: its manifest, read and validated from the trailer.
#[derive(Debug)]
pub struct Pool {
    pub path: PathBuf,
    pub file_len: u64,
    pub manifest: Manifest,
    /// The manifest exactly as stored (what a signature covers).
    pub manifest_bytes: Vec<u8>,
    /// The signature block (empty when unsigned).
    pub signature: Vec<u8>,
    /// The file as it was opened: every later read of this pool goes through this handle, so
    /// that what was checked is what is used (a path can be replaced; an open file cannot).
    /// `None` for a pool known from its trailer's bytes only ([`Pool::from_tail`]).
    pub file: Option<File>,
}

impl Pool {
    pub fn open(path: &Path) -> Result<Pool, ManifestError> {
        let f = open_regular(path).map_err(|source| match source.kind() {
            std::io::ErrorKind::InvalidInput => ManifestError::NotRegular {
                path: path.to_path_buf(),
            },
            _ => ManifestError::Io {
                path: path.to_path_buf(),
                source,
            },
        })?;
        Self::open_file(path, f)
    }

    /// [`Pool::open`] on a file already open (`path` names it in messages): no second open of a
    /// pool on shared storage, and what is checked is what the caller reads.
    pub fn open_file(path: &Path, mut f: File) -> Result<Pool, ManifestError> {
        let io = |source| ManifestError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = f.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(ManifestError::NotRegular {
                path: path.to_path_buf(),
            });
        }
        let raw = trailer::read_trailer(&mut f);
        Self::from_raw(path, meta.len(), raw, Some(f))
    }

    /// A pool known only from the bytes of its trailer (`tail`, the last `tail.len()` bytes of a
    /// `file_len`-byte pool file, as [`Pool::tail`] gives them): what a node leader receives from
    /// the leader that opened the file, so that only one node reads the trailer from shared
    /// storage. Parsed and checked exactly as [`Pool::open`] does; it has no file.
    pub fn from_tail(path: &Path, file_len: u64, tail: &[u8]) -> Result<Pool, ManifestError> {
        let mut r = TailReader {
            base: file_len.saturating_sub(tail.len() as u64),
            pos: 0,
            tail,
        };
        let raw = trailer::read_trailer_from(&mut r, file_len);
        Self::from_raw(path, file_len, raw, None)
    }

    fn from_raw(
        path: &Path,
        len: u64,
        raw: Result<trailer::RawTrailer, trailer::ReadError>,
        file: Option<File>,
    ) -> Result<Pool, ManifestError> {
        let io = |source| ManifestError::Io {
            path: path.to_path_buf(),
            source,
        };
        let raw = match raw {
            Ok(r) => r,
            Err(trailer::ReadError::Io(e)) => return Err(io(e)),
            Err(trailer::ReadError::Trailer(trailer::TrailerError::NoMagic)) => {
                if let Some(f) = &file {
                    // bytes past the end of its file system: a pool that lost its footer (cut
                    // off, or a copy that stopped short), never a bare image to mount unverified
                    if let Some(reason) = fs_size::bytes_past_fs(f, len).map_err(io)? {
                        return Err(ManifestError::Corrupt {
                            path: path.to_path_buf(),
                            reason,
                        });
                    }
                    if let Ok(format) = crate::format::detect(path) {
                        return Err(ManifestError::NoTrailer {
                            path: path.to_path_buf(),
                            format,
                        });
                    }
                }
                return Err(ManifestError::NotAPool {
                    path: path.to_path_buf(),
                    reason: trailer::TrailerError::NoMagic,
                });
            }
            Err(trailer::ReadError::Trailer(t @ trailer::TrailerError::TooShort(_))) => {
                return Err(ManifestError::NotAPool {
                    path: path.to_path_buf(),
                    reason: t,
                })
            }
            Err(trailer::ReadError::Trailer(t)) => {
                return Err(ManifestError::Corrupt {
                    path: path.to_path_buf(),
                    reason: t.to_string(),
                })
            }
        };
        let manifest = Manifest::from_json(&raw.manifest).map_err(|e| ManifestError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        if manifest.image_size != raw.footer.image_size {
            return Err(ManifestError::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "the manifest describes a {}-byte image but the file holds {} bytes before its trailer",
                    manifest.image_size, raw.footer.image_size
                ),
            });
        }
        Ok(Pool {
            path: path.to_path_buf(),
            file_len: len,
            manifest,
            manifest_bytes: raw.manifest,
            signature: raw.signature,
            file,
        })
    }

    /// The trailer's bytes (`[image_size, file_len)`: manifest, signature block, footer), as they
    /// are in the file: the footer's encoding is canonical and `open` checked every field of it (and
    /// that the lengths add up to the file), so they are rebuilt from what was read, not read again.
    pub fn tail(&self) -> Vec<u8> {
        trailer::trailer_bytes(
            self.manifest.image_size,
            &self.manifest_bytes,
            &self.signature,
        )
    }
}

/// The last bytes of a pool file, readable at their offsets in the file; anything before them
/// reads as an error (a trailer that points there is not in the bytes given).
struct TailReader<'a> {
    base: u64,
    pos: u64,
    tail: &'a [u8],
}

impl std::io::Read for TailReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos < self.base {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the trailer reaches before the bytes that were sent",
            ));
        }
        let off = (self.pos - self.base) as usize;
        let rest = self.tail.get(off..).unwrap_or(&[]);
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for TailReader<'_> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let end = self.base + self.tail.len() as u64;
        let p = match to {
            std::io::SeekFrom::Start(p) => Some(p),
            std::io::SeekFrom::End(d) => end.checked_add_signed(d),
            std::io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = p.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}
