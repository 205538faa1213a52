//! The compressors this reader reads.

use std::cell::RefCell;

use crate::{Error, Result};

thread_local! {
    // one decompression context per thread, made once (making one per block costs an allocation
    // of its window tables on every small file)
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        RefCell::new(zstd::bulk::Decompressor::new().ok());
}

/// A squashfs image's compressor (superblock field `compression_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compressor {
    Gzip,
    Zstd,
}

impl Compressor {
    /// The compressor with squashfs id `id`; the others are named and refused.
    pub fn from_id(id: u16) -> Result<Compressor> {
        let name = match id {
            1 => return Ok(Compressor::Gzip),
            6 => return Ok(Compressor::Zstd),
            2 => "lzma",
            3 => "lzo",
            4 => "xz",
            5 => "lz4",
            _ => {
                return Err(Error::Corrupt(format!(
                    "compressor id {id} is not one squashfs defines"
                )))
            }
        };
        Err(Error::Unsupported(format!(
            "the image is compressed with {name} (squashfs compressor id {id}); sw-pool's reader reads zstd, gzip and uncompressed images"
        )))
    }

    pub fn name(self) -> &'static str {
        match self {
            Compressor::Gzip => "gzip",
            Compressor::Zstd => "zstd",
        }
    }

    /// Decompress `src` whole into at most `max` bytes; more is an error.
    pub fn decompress(self, src: &[u8], max: usize) -> std::result::Result<Vec<u8>, String> {
        let mut out = vec![0u8; max];
        let n = match self {
            Compressor::Zstd => ZSTD.with(|d| match &mut *d.borrow_mut() {
                Some(d) => d
                    .decompress_to_buffer(src, &mut out)
                    .map_err(|e| format!("zstd: {e}")),
                None => Err("zstd: cannot allocate a decompression context".to_string()),
            })?,
            Compressor::Gzip => {
                let mut d = flate2::Decompress::new(true);
                let st = d
                    .decompress(src, &mut out, flate2::FlushDecompress::Finish)
                    .map_err(|e| format!("gzip: {e}"))?;
                if st != flate2::Status::StreamEnd {
                    return Err(format!(
                        "gzip: the stream does not end within {max} bytes ({} of {} input bytes used)",
                        d.total_in(),
                        src.len()
                    ));
                }
                d.total_out() as usize
            }
        };
        out.truncate(n);
        Ok(out)
    }
}
