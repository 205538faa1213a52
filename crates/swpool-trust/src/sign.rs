//! `sw-pool sign`: a signature over the manifest in the trailer, and the paper-compatible detached
//! signature over the whole file. The pool is rewritten at a temporary name (image copied with its
//! holes kept, hashed on the way) and renamed over the old one only when complete.

use std::io::Write;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::sign::Signer as SslSigner;
use sha2::{Digest, Sha256};

use crate::keys::{fingerprint, Algorithm};
use crate::{SignatureBlock, TrustError};
use swpool_format::pool::trailer::trailer_bytes;
use swpool_format::pool::Pool;
use swpool_sys::atomic::TempOutput;

#[derive(Debug, Clone)]
pub struct SignReport {
    pub pool: PathBuf,
    pub detached: PathBuf,
    pub algorithm: Algorithm,
    pub fingerprint: String,
}

/// Sign the manifest bytes (Ed25519: pure EdDSA; RSA/ECDSA: SHA-256).
pub(crate) fn sign_bytes(
    key: &PKey<Private>,
    alg: Algorithm,
    data: &[u8],
) -> Result<Vec<u8>, TrustError> {
    Ok(match alg {
        Algorithm::Ed25519 => SslSigner::new_without_digest(key)?.sign_oneshot_to_vec(data)?,
        _ => {
            let mut s = SslSigner::new(MessageDigest::sha256(), key)?;
            s.update(data)?;
            s.sign_to_vec()?
        }
    })
}

/// The detached signature over a stream of bytes (the whole pool file).
enum Detached<'a> {
    /// RSA / ECDSA: `openssl dgst -sha256 -sign` compatible.
    Streaming(SslSigner<'a>),
    /// Ed25519 over the file's SHA-256 (`openssl pkeyutl -rawin` over `openssl dgst -sha256 -binary`).
    Ed25519OverSha256(Sha256, &'a PKey<Private>),
}

impl<'a> Detached<'a> {
    fn new(key: &'a PKey<Private>, alg: Algorithm) -> Result<Self, TrustError> {
        Ok(match alg {
            Algorithm::Ed25519 => Detached::Ed25519OverSha256(Sha256::new(), key),
            _ => Detached::Streaming(SslSigner::new(MessageDigest::sha256(), key)?),
        })
    }
    fn update(&mut self, b: &[u8]) -> Result<(), TrustError> {
        match self {
            Detached::Streaming(s) => s.update(b)?,
            Detached::Ed25519OverSha256(h, _) => h.update(b),
        }
        Ok(())
    }
    fn finish(self) -> Result<Vec<u8>, TrustError> {
        match self {
            Detached::Streaming(s) => Ok(s.sign_to_vec()?),
            Detached::Ed25519OverSha256(h, key) => {
                let digest = h.finalize();
                Ok(SslSigner::new_without_digest(key)?.sign_oneshot_to_vec(&digest)?)
            }
        }
    }
}

/// The detached signature's path for a pool: `POOL.sig`.
pub fn detached_path(pool: &Path) -> PathBuf {
    let mut s = pool.as_os_str().to_os_string();
    s.push(".sig");
    PathBuf::from(s)
}

/// Sign the pool at `path` with `key`, after checking every byte of its image against its manifest
/// (`progress` is told of each chunk checked).
pub fn sign_pool(
    path: &Path,
    key: &PKey<Private>,
    progress: swpool_format::pool::chunks::Progress,
) -> Result<SignReport, TrustError> {
    let alg = Algorithm::of(key)?;
    let fp = fingerprint(key)?;
    let pool = Pool::open(path)?;
    swpool_format::pool::fs_size::check_fits(&pool)?;
    let io = |what: &'static str| {
        move |source| TrustError::Io {
            path: path.to_path_buf(),
            what,
            source,
        }
    };

    let sig = sign_bytes(key, alg, &pool.manifest_bytes)?;
    let block = SignatureBlock {
        schema: 1,
        algorithm: alg,
        key_fingerprint: fp.clone(),
        public_key: String::from_utf8_lossy(&key.public_key_to_pem()?).into_owned(),
        signature: hex::encode(&sig),
    };
    let trailer = trailer_bytes(
        pool.manifest.image_size,
        &pool.manifest_bytes,
        &block.to_json(),
    );

    // copy the image (holes kept) to a temporary file, feeding every byte to the detached signer
    let src = swpool_format::pool::open_regular(path).map_err(io("cannot open"))?;
    let mode = src
        .metadata()
        .map_err(io("cannot stat"))?
        .permissions()
        .mode();
    let (tmp, out) =
        TempOutput::create(path).map_err(io("cannot create a temporary file beside"))?;
    out.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io("cannot set permissions on a temporary file beside"))?;
    let image_size = pool.manifest.image_size;
    out.set_len(image_size)
        .map_err(io("cannot size a temporary file beside"))?;
    let data = swpool_format::sparse::data_ranges(&src, image_size)
        .map_err(io("cannot map the data of"))?;
    // One pass, chunk by chunk: every byte is hashed against the manifest (a `null` chunk must be
    // all zeros), fed to the detached signer and copied. The signature vouches only for bytes
    // that were checked; a mismatch anywhere and nothing is signed. Memory: one 4 MiB buffer.
    let m = &pool.manifest;
    let mut detached = Detached::new(key, alg)?;
    let mut buf = vec![0u8; 4 << 20];
    let zeros = vec![0u8; 4 << 20];
    let mut hint = 0usize;
    let (mut bad, mut first_bad) = (0u64, None);
    for (i, want) in m.chunks.iter().enumerate() {
        let r = m.chunk_range(i as u64);
        let mut all_zero = true;
        let mut h = blake3::Hasher::new();
        if swpool_format::sparse::overlaps_data(&data, &r, &mut hint) {
            let mut off = r.start;
            while off < r.end {
                let n = ((r.end - off) as usize).min(buf.len());
                src.read_exact_at(&mut buf[..n], off)
                    .map_err(io("cannot read"))?;
                detached.update(&buf[..n])?;
                h.update(&buf[..n]);
                if !swpool_format::sparse::is_all_zero(&buf[..n]) {
                    all_zero = false;
                    out.write_all_at(&buf[..n], off)
                        .map_err(io("cannot write a temporary copy of"))?;
                }
                off += n as u64;
            }
        } else {
            feed_zeros(&mut detached, r.end - r.start, &zeros)?; // a hole reads as zeros
        }
        let same = match want {
            None => all_zero,
            Some(w) => !all_zero && hex::encode(h.finalize().as_bytes()) == *w,
        };
        if !same {
            bad += 1;
            first_bad.get_or_insert(r.start);
        }
        if let Some(p) = progress {
            p(r.end - r.start, image_size);
        }
    }
    if bad > 0 {
        drop(out);
        drop(tmp); // removes the temporary copy
        return Err(TrustError::SignMismatch {
            path: path.to_path_buf(),
            count: bad,
            total: m.chunks.len() as u64,
            first_offset: first_bad.unwrap_or(0),
        });
    }
    detached.update(&trailer)?;
    out.write_all_at(&trailer, image_size)
        .map_err(io("cannot write a temporary copy of"))?;
    let detached_sig = detached.finish()?;

    // the pool, then its detached signature (a crash in between leaves a POOL.sig that fails to verify, never a wrong pool)
    let sig_path = detached_path(path);
    let (sig_tmp, mut sf) =
        TempOutput::create(&sig_path).map_err(io("cannot write the detached signature beside"))?;
    sf.write_all(&detached_sig)
        .map_err(io("cannot write the detached signature beside"))?;
    tmp.commit(out).map_err(io("cannot replace"))?;
    sig_tmp
        .commit(sf)
        .map_err(io("cannot write the detached signature beside"))?;
    Ok(SignReport {
        pool: path.to_path_buf(),
        detached: sig_path,
        algorithm: alg,
        fingerprint: fp,
    })
}

fn feed_zeros(d: &mut Detached<'_>, mut n: u64, zeros: &[u8]) -> Result<(), TrustError> {
    while n > 0 {
        let k = n.min(zeros.len() as u64) as usize;
        d.update(&zeros[..k])?;
        n -= k as u64;
    }
    Ok(())
}
