//! The pool manifest: what a pool is, and a hash for every chunk of its image.
//!
//! A manifest describes the file-system image region of a pool file (`[0, image_size)`): its format,
//! sizes, a BLAKE3 hash per chunk of `chunk_size` bytes (`null` where the chunk is a hole or all zeros),
//! and a content digest over that chunk list. The digest is the pool's identity (the node-local cache
//! is keyed by it) and the broadcast engine verifies every chunk against its hash as it lands.
//!
//! Content digest (documented here and in `docs/pool-format.md`):
//! `blake3("sw-pool chunk-list v1\n" || le64(image_size) || le64(chunk_size) || H_0 || … || H_{n-1})`
//! where `H_i` is the BLAKE3 hash of chunk `i`'s bytes (zero chunks hashed as the zeros they stand for).
//! It is as strong as a hash over the whole image, but costs nothing for holes. BLAKE3 rather than
//! SHA-256: 3.8 GB/s against 1.5 GB/s (SHA-NI) per core on our machines, and every node hashes every
//! chunk it receives. (The paper-compatible detached signature over the whole file stays SHA-256.)

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::format::ImageFormat;

pub const MANIFEST_SCHEMA: u32 = 1;
/// The chunk hash algorithm (recorded in every manifest).
pub const CHUNK_HASH: &str = "blake3";
/// 1 MiB: measured against 2 and 4 MiB on the 8-node testbed (`bench/cp.sh`): 4 MiB chunks make
/// 4× longer rounds, so the pipeline fills and drains 4× slower and the step-synchronous ring
/// absorbs less jitter (1 GiB: 22.7 vs 26.4 s on 2 nodes, 25.1 vs 27.5 s on 8).
pub const DEFAULT_CHUNK_SIZE: u64 = 1 << 20;
pub const MIN_CHUNK_SIZE: u64 = 4096;
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;
/// Longest name or version accepted (bytes).
pub const MAX_NAME_LEN: usize = 128;

/// One package found in the pool's layout (`install/<name>/<version>/`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PackageRef {
    pub name: String,
    pub version: String,
    /// Whether `modulefiles/<name>/<version>.lua` exists in the pool.
    pub modulefile: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema: u32,
    pub name: String,
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub format: ImageFormat,
    /// Bytes of the file-system image region at the start of the pool file.
    pub image_size: u64,
    /// Bytes in chunks that hold data (not holes, not all zeros): what a broadcast must move.
    pub data_size: u64,
    /// `blake3:<hex>` over the chunk list (see the module docs).
    pub digest: String,
    pub chunk_size: u64,
    /// The chunk hash algorithm: `blake3`.
    pub hash: String,
    /// Hash (hex) of every chunk; `null` for a hole or all-zero chunk.
    pub chunks: Vec<Option<String>>,
    /// Build time (seconds since the epoch): `SOURCE_DATE_EPOCH`, else the newest mtime in the tree.
    pub created: u64,
    #[serde(default)]
    pub packages: Vec<PackageRef>,
    /// The tool that built it, e.g. `sw-pool 0.1.0`.
    pub builder: String,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid manifest: {0}")]
pub struct InvalidManifest(pub String);

impl Manifest {
    pub fn chunk_count(image_size: u64, chunk_size: u64) -> u64 {
        image_size.div_ceil(chunk_size)
    }

    /// The byte range of chunk `i`.
    pub fn chunk_range(&self, i: u64) -> std::ops::Range<u64> {
        let start = i * self.chunk_size;
        start..(start + self.chunk_size).min(self.image_size)
    }

    /// The raw 32-byte hash of chunk `i` (zero chunks give the hash of their zeros).
    pub fn chunk_hash(&self, i: usize, zero: &mut ZeroHashes) -> Option<[u8; 32]> {
        let range = self.chunk_range(i as u64);
        match self.chunks.get(i)? {
            Some(h) => decode_hash(h),
            None => Some(zero.get(range.end - range.start)),
        }
    }

    /// Check every field against the others; used on every manifest read from a file.
    pub fn validate(&self) -> Result<(), InvalidManifest> {
        let bad = |m: String| Err(InvalidManifest(m));
        if self.schema != MANIFEST_SCHEMA {
            return bad(format!(
                "schema {} is not supported by this sw-pool (it reads schema {MANIFEST_SCHEMA}); upgrade sw-pool",
                self.schema
            ));
        }
        if self.hash != CHUNK_HASH {
            return bad(format!(
                "chunk hash {:?} is not supported (this sw-pool uses {CHUNK_HASH})",
                self.hash
            ));
        }
        check_name("name", &self.name).map_err(InvalidManifest)?;
        check_name("version", &self.version).map_err(InvalidManifest)?;
        if let Some(d) = &self.description {
            if d.len() > 4096 {
                return bad("description longer than 4096 bytes".into());
            }
        }
        if !self.chunk_size.is_power_of_two()
            || !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&self.chunk_size)
        {
            return bad(format!(
                "chunk_size {} is not a power of two between 4 KiB and 1 GiB",
                self.chunk_size
            ));
        }
        let n = Self::chunk_count(self.image_size, self.chunk_size);
        if self.chunks.len() as u64 != n {
            return bad(format!(
                "{} chunk hashes for an image of {} bytes in {}-byte chunks (expected {n})",
                self.chunks.len(),
                self.image_size,
                self.chunk_size
            ));
        }
        let mut data = 0u64;
        for (i, c) in self.chunks.iter().enumerate() {
            if let Some(h) = c {
                if decode_hash(h).is_none() {
                    return bad(format!("chunk {i}: hash is not 64 lowercase hex digits"));
                }
                let r = self.chunk_range(i as u64);
                data += r.end - r.start;
            }
        }
        if data != self.data_size {
            return bad(format!(
                "data_size {} does not match the data chunks ({data} bytes)",
                self.data_size
            ));
        }
        let expected = digest_of(
            self.image_size,
            self.chunk_size,
            self,
            &mut ZeroHashes::default(),
        );
        if self.digest != expected {
            return bad("digest does not match the chunk hashes".into());
        }
        for p in &self.packages {
            check_name("package name", &p.name).map_err(InvalidManifest)?;
            check_name("package version", &p.version).map_err(InvalidManifest)?;
        }
        if self.packages.len() > 100_000 {
            return bad("more than 100000 packages".into());
        }
        Ok(())
    }

    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("manifest serialises");
        v.push(b'\n');
        v
    }

    /// Parse and validate untrusted bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Manifest, InvalidManifest> {
        let m: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| InvalidManifest(format!("not valid JSON: {e}")))?;
        m.validate()?;
        Ok(m)
    }
}

/// A name or version as it may appear in paths (`$SW_POOL_MOUNT/<name>/<version>`, module names).
pub fn check_name(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(format!("{what} is longer than {MAX_NAME_LEN} bytes"));
    }
    if s == "." || s == ".." || s.starts_with('-') || s.starts_with('.') {
        return Err(format!("{what} {s:?} may not start with '.' or '-'"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "._+-".contains(*c)))
    {
        return Err(format!(
            "{what} {s:?} contains {c:?}; use letters, digits, '.', '_', '+' and '-'"
        ));
    }
    Ok(())
}

pub fn decode_hash(h: &str) -> Option<[u8; 32]> {
    if h.len() != 64
        || !h
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(h, &mut out).ok()?;
    Some(out)
}

/// The hash of one chunk's bytes (BLAKE3).
pub fn hash_chunk(data: &[u8]) -> [u8; 32] {
    *blake3::hash(data).as_bytes()
}

/// Hashes of all-zero chunks, computed once per length.
#[derive(Default)]
pub struct ZeroHashes(HashMap<u64, [u8; 32]>);

impl ZeroHashes {
    pub fn get(&mut self, len: u64) -> [u8; 32] {
        *self.0.entry(len).or_insert_with(|| {
            let mut h = blake3::Hasher::new();
            let zeros = vec![0u8; 1 << 20];
            let mut left = len;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                h.update(&zeros[..n]);
                left -= n as u64;
            }
            *h.finalize().as_bytes()
        })
    }
}

fn digest_of(image_size: u64, chunk_size: u64, m: &Manifest, zero: &mut ZeroHashes) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"sw-pool chunk-list v1\n");
    h.update(&image_size.to_le_bytes());
    h.update(&chunk_size.to_le_bytes());
    for i in 0..m.chunks.len() {
        let c = m.chunk_hash(i, zero).unwrap_or([0u8; 32]); // None is unreachable after hash validation
        h.update(&c);
    }
    format!("{CHUNK_HASH}:{}", hex::encode(h.finalize().as_bytes()))
}

/// Builds the chunk list of an image as its chunks are read, in order.
pub struct ChunkListBuilder {
    image_size: u64,
    chunk_size: u64,
    chunks: Vec<Option<String>>,
    data_size: u64,
}

impl ChunkListBuilder {
    pub fn new(image_size: u64, chunk_size: u64) -> Self {
        let n = Manifest::chunk_count(image_size, chunk_size) as usize;
        ChunkListBuilder {
            image_size,
            chunk_size,
            chunks: Vec::with_capacity(n),
            data_size: 0,
        }
    }

    /// The range of the next chunk to add, or `None` when all are in.
    pub fn next_range(&self) -> Option<std::ops::Range<u64>> {
        let start = self.chunks.len() as u64 * self.chunk_size;
        (start < self.image_size).then(|| start..(start + self.chunk_size).min(self.image_size))
    }

    /// Add the next chunk: `None` for a hole / all-zero chunk, else its bytes' hash.
    pub fn push(&mut self, hash: Option<[u8; 32]>) {
        let r = self.next_range().expect("push past the last chunk");
        if hash.is_some() {
            self.data_size += r.end - r.start;
        }
        self.chunks.push(hash.map(hex::encode));
    }

    /// Fill in the sizes, chunk list and digest of `m`.
    pub fn finish_into(self, m: &mut Manifest) {
        assert!(self.next_range().is_none(), "chunk list incomplete");
        m.image_size = self.image_size;
        m.chunk_size = self.chunk_size;
        m.data_size = self.data_size;
        m.chunks = self.chunks;
        m.hash = CHUNK_HASH.to_string();
        m.digest = digest_of(
            self.image_size,
            self.chunk_size,
            m,
            &mut ZeroHashes::default(),
        );
    }
}

/// `epoch` seconds as UTC `YYYY-MM-DD HH:MM:SS UTC` (the proleptic Gregorian calendar; days from
/// the epoch to a civil date as in Howard Hinnant's `civil_from_days`).
pub fn utc(epoch: i64) -> String {
    let days = epoch.div_euclid(86_400);
    let secs = epoch.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// A manifest of `image` in `chunk`-byte chunks, as `build` would write it (tests of this crate
/// and, with the `testkit` feature, of others).
#[cfg(any(test, feature = "testkit"))]
pub fn sample(image: &[u8], chunk: u64) -> Manifest {
    let mut b = ChunkListBuilder::new(image.len() as u64, chunk);
    while let Some(r) = b.next_range() {
        let bytes = &image[r.start as usize..r.end as usize];
        let h = (!crate::sparse::is_all_zero(bytes)).then(|| hash_chunk(bytes));
        b.push(h);
    }
    let mut m = Manifest {
        schema: MANIFEST_SCHEMA,
        name: "demo".into(),
        version: "1.0".into(),
        description: None,
        format: ImageFormat::Squashfs,
        image_size: 0,
        data_size: 0,
        digest: String::new(),
        chunk_size: chunk,
        hash: CHUNK_HASH.into(),
        chunks: vec![],
        created: 0,
        packages: vec![PackageRef {
            name: "hello".into(),
            version: "1.0".into(),
            modulefile: true,
        }],
        builder: "sw-pool test".into(),
    };
    b.finish_into(&mut m);
    m
}

#[cfg(test)]
pub(crate) mod tests {
    pub use super::sample;
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_000_000), "2026-11-18 11:06:40 UTC");
        assert_eq!(utc(-1), "1969-12-31 23:59:59 UTC");
    }

    #[test]
    fn round_trip_and_validate() {
        let mut img = vec![0u8; 5 * 4096 + 100];
        img[4096] = 1;
        img[5 * 4096 + 5] = 9;
        let m = sample(&img, 4096);
        assert_eq!(m.chunks.len(), 6);
        assert!(
            m.chunks[0].is_none()
                && m.chunks[1].is_some()
                && m.chunks[2].is_none()
                && m.chunks[5].is_some()
        );
        assert_eq!(m.data_size, 4096 + 100);
        let back = Manifest::from_json(&m.to_json()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn digest_is_equal_for_hole_and_written_zeros() {
        // a zero chunk's identity does not depend on whether it was a hole
        let img = vec![0u8; 3 * 4096];
        let m = sample(&img, 4096);
        let mut zero = ZeroHashes::default();
        assert_eq!(m.chunk_hash(0, &mut zero), Some(hash_chunk(&[0u8; 4096])));
        assert!(m.digest.starts_with("blake3:"));
    }

    #[test]
    fn rejects_tampering() {
        let mut img = vec![3u8; 4 * 4096];
        img[0] = 0;
        let good = sample(&img, 4096);
        type Tamper = Box<dyn Fn(&mut Manifest)>;
        let cases: Vec<(&str, Tamper)> = vec![
            ("schema", Box::new(|m| m.schema = 2)),
            ("name", Box::new(|m| m.name = "../etc".into())),
            ("version", Box::new(|m| m.version = String::new())),
            ("chunk_size", Box::new(|m| m.chunk_size = 3000)),
            ("chunk hashes", Box::new(|m| m.image_size += 4096)),
            ("hex", Box::new(|m| m.chunks[1] = Some("XYZ".into()))),
            ("data_size", Box::new(|m| m.data_size += 1)),
            ("digest", Box::new(|m| m.chunks[1] = Some("0".repeat(64)))),
            ("hash", Box::new(|m| m.hash = "md5".into())),
            ("package", Box::new(|m| m.packages[0].name = "a/b".into())),
        ];
        for (what, f) in cases {
            let mut m = good.clone();
            f(&mut m);
            let e = m.validate().unwrap_err();
            assert!(!e.0.is_empty(), "{what}");
        }
        assert!(Manifest::from_json(b"{").unwrap_err().0.contains("JSON"));
        assert!(Manifest::from_json(b"[]").is_err());
    }

    #[test]
    fn names() {
        assert!(check_name("name", "gcc-12.2_1+cuda").is_ok());
        for bad in ["", ".", "..", "-x", "a/b", "a b", "ä", &"x".repeat(129)] {
            assert!(check_name("name", bad).is_err(), "{bad:?}");
        }
    }
}
