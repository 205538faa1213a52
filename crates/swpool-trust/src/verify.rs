//! `sw-pool verify` and the trust policy `load` applies before any byte is broadcast.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Public};
use openssl::sign::Verifier;
use sha2::{Digest, Sha256};

use crate::keys::{fingerprint, parse_public, Algorithm, TrustedKey, TrustedKeys};
use crate::sign::detached_path;
use crate::{SignatureBlock, TrustError};
use swpool_format::pool::chunks::verify_image;
use swpool_format::pool::Pool;

/// Who signed a pool, as far as this machine trusts it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Signer {
    /// The name of the trusted key (its file name).
    pub name: String,
    pub fingerprint: String,
    pub algorithm: Algorithm,
    pub key_file: PathBuf,
}

/// Which keys `verify` accepts.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// Exactly this public key (`--key PUB.pem`).
    Key(PathBuf),
    /// Any key in these directories (`--trusted DIR`, or the default trusted-keys directories).
    Dirs(Vec<PathBuf>),
}

/// Why the policy requires a signature, or does not.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum PolicyOrigin {
    /// `require_signature` was set (file, environment or flag): the setting's origin.
    Explicit(String),
    /// Not set, and trusted keys are installed: a site that has keys wants them used.
    KeysInstalled(usize),
    /// Not set, and no trusted key is installed.
    NoKeys,
}

impl std::fmt::Display for PolicyOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicyOrigin::Explicit(o) => write!(f, "set in {o}"),
            PolicyOrigin::KeysInstalled(n) => write!(
                f,
                "default: {n} trusted key(s) installed, so signatures are required (set require_signature = false to allow others)"
            ),
            PolicyOrigin::NoKeys => f.write_str("default: no trusted key installed"),
        }
    }
}

/// The policy `load`, `mount` and the TaskProlog enforce.
#[derive(Debug, Clone)]
pub struct TrustPolicy {
    pub require_signature: bool,
    pub keys: TrustedKeys,
    pub origin: PolicyOrigin,
}

impl TrustPolicy {
    /// Secure by default where a site has keys: unless `require_signature` is set explicitly
    /// (`explicit`: its value and where it was set), a signature by a trusted key is required as
    /// soon as any trusted key is installed.
    pub fn new(explicit: Option<(bool, String)>, keys: TrustedKeys) -> TrustPolicy {
        let (require, origin) = match explicit {
            Some((value, origin)) => (value, PolicyOrigin::Explicit(origin)),
            None if !keys.keys.is_empty() => (true, PolicyOrigin::KeysInstalled(keys.keys.len())),
            None => (false, PolicyOrigin::NoKeys),
        };
        TrustPolicy {
            require_signature: require,
            keys,
            origin,
        }
    }
}

/// What the policy says about a pool.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "trust", rename_all = "snake_case")]
pub enum Verdict {
    /// Signed by a trusted key; the manifest signature verified.
    Trusted { name: String, fingerprint: String },
    /// Not signed, and the policy allows that.
    Unsigned,
    /// Signed by a key this machine does not trust, and the policy allows that.
    UntrustedSigner { fingerprint: String },
}

impl Verdict {
    pub fn is_trusted(&self) -> bool {
        matches!(self, Verdict::Trusted { .. })
    }

    /// The warning for a pool nothing trusted vouches for (`None` when trusted): what it is,
    /// and how to trust its signer or to require signatures.
    pub fn warning(&self, pool: &std::path::Path) -> Option<String> {
        let require = "to refuse such pools, set require_signature = true (or SW_POOL_REQUIRE_SIGNATURE=1, --require-signature)";
        match self {
            Verdict::Trusted { .. } => None,
            Verdict::Unsigned => Some(format!(
                "{} is unsigned; nothing vouches for its content (sign it with `sw-pool sign`; {require})",
                pool.display()
            )),
            Verdict::UntrustedSigner { fingerprint } => Some(format!(
                "{} is signed by an untrusted key {fingerprint}; nothing vouches for its content (if you trust its owner, check the fingerprint with them and copy their public key into ~/.config/sw-pool/trusted-keys/ or /etc/sw-pool/trusted-keys/; {require})",
                pool.display()
            )),
        }
    }
}

impl Verdict {
    /// The one-line reminder given instead of [`Verdict::warning`] when that was shown on this
    /// node in the last day (`None` when trusted).
    pub fn reminder(&self, pool: &std::path::Path) -> Option<String> {
        let what = match self {
            Verdict::Trusted { .. } => return None,
            Verdict::Unsigned => "unsigned".to_string(),
            Verdict::UntrustedSigner { fingerprint } => {
                format!("signed by an untrusted key {fingerprint}")
            }
        };
        Some(format!(
            "{} is {what} (what to do about it: `sw-pool verify {}`)",
            pool.display(),
            pool.display()
        ))
    }

    /// A short name for what is wrong (a key for `StateDir::warning_due` in swpool-core).
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Trusted { .. } => "trusted",
            Verdict::Unsigned => "unsigned",
            Verdict::UntrustedSigner { .. } => "untrusted",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Trusted { name, fingerprint } => write!(f, "signed by {name} ({fingerprint})"),
            Verdict::Unsigned => f.write_str("unsigned"),
            Verdict::UntrustedSigner { fingerprint } => {
                write!(f, "signed by an untrusted key {fingerprint}")
            }
        }
    }
}

fn verify_bytes(
    key: &PKey<Public>,
    alg: Algorithm,
    data: &[u8],
    sig: &[u8],
) -> Result<bool, TrustError> {
    Ok(match alg {
        Algorithm::Ed25519 => Verifier::new_without_digest(key)?
            .verify_oneshot(sig, data)
            .unwrap_or(false),
        _ => {
            let mut v = Verifier::new(MessageDigest::sha256(), key)?;
            v.update(data)?;
            v.verify(sig).unwrap_or(false)
        }
    })
}

/// Parse the signature block and check that it is internally consistent.
fn read_block(pool: &Pool) -> Result<SignatureBlock, TrustError> {
    let bad = |reason: String| TrustError::BadBlock {
        path: pool.path.clone(),
        reason,
    };
    let block = SignatureBlock::parse(&pool.signature).map_err(bad)?;
    let embedded = parse_public(block.public_key.as_bytes())
        .map_err(|r| bad(format!("embedded public key: {r}")))?;
    if fingerprint(&embedded)? != block.key_fingerprint {
        return Err(bad(
            "the embedded public key does not have the recorded fingerprint".into(),
        ));
    }
    if Algorithm::of(&embedded)? != block.algorithm {
        return Err(bad("the recorded algorithm does not match the key".into()));
    }
    Ok(block)
}

/// Check the manifest signature of `pool` against `trusted`.
fn check_signature(
    pool: &Pool,
    block: &SignatureBlock,
    trusted: &TrustedKey,
) -> Result<Signer, TrustError> {
    let sig = hex::decode(&block.signature).map_err(|e| TrustError::BadBlock {
        path: pool.path.clone(),
        reason: e.to_string(),
    })?;
    let alg = Algorithm::of(&trusted.key)?;
    if !verify_bytes(&trusted.key, alg, &pool.manifest_bytes, &sig)? {
        return Err(TrustError::BadSignature {
            path: pool.path.clone(),
            fingerprint: trusted.fingerprint.clone(),
            name: trusted.name.clone(),
        });
    }
    Ok(Signer {
        name: trusted.name.clone(),
        fingerprint: trusted.fingerprint.clone(),
        algorithm: alg,
        key_file: trusted.path.clone(),
    })
}

/// The policy check `load` runs before anything is copied: the manifest signature only (the image is
/// checked chunk by chunk as it is broadcast). A bad signature is refused whatever the policy.
pub fn authorize(pool: &Pool, policy: &TrustPolicy) -> Result<Verdict, TrustError> {
    if pool.signature.is_empty() {
        if policy.require_signature {
            return Err(TrustError::Unsigned {
                path: pool.path.clone(),
                required: true,
            });
        }
        return Ok(Verdict::Unsigned);
    }
    let block = read_block(pool)?;
    match policy.keys.find(&block.key_fingerprint) {
        Some(k) => {
            let s = check_signature(pool, &block, k)?;
            Ok(Verdict::Trusted {
                name: s.name,
                fingerprint: s.fingerprint,
            })
        }
        None if policy.require_signature => Err(TrustError::Untrusted {
            path: pool.path.clone(),
            fingerprint: block.key_fingerprint,
        }),
        None => Ok(Verdict::UntrustedSigner {
            fingerprint: block.key_fingerprint,
        }),
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyReport {
    pub path: PathBuf,
    pub name: String,
    pub version: String,
    pub digest: String,
    pub signer: Signer,
    pub data_bytes: u64,
    /// Whether `POOL.sig` was checked too.
    pub detached: Option<PathBuf>,
    #[serde(skip)]
    pub elapsed: Duration,
}

/// `sw-pool verify`: the manifest signature, then the image against the manifest (one streaming
/// pass, holes not read), then optionally the detached signature.
pub fn verify_pool(
    path: &Path,
    source: &KeySource,
    check_detached: bool,
    progress: swpool_format::pool::chunks::Progress,
) -> Result<VerifyReport, TrustError> {
    let t0 = Instant::now();
    let pool = Pool::open(path)?;
    swpool_format::pool::fs_size::check_fits(&pool)?;
    if pool.signature.is_empty() {
        return Err(TrustError::Unsigned {
            path: path.into(),
            required: false,
        });
    }
    let block = read_block(&pool)?;
    let signer = match source {
        KeySource::Key(k) => {
            let keys = TrustedKeys::single(k)?;
            let key = &keys.keys[0];
            if key.fingerprint != block.key_fingerprint {
                return Err(TrustError::WrongKey {
                    path: path.into(),
                    signed_by: block.key_fingerprint.clone(),
                    given: format!("{} {}", k.display(), key.fingerprint),
                });
            }
            check_signature(&pool, &block, key)?
        }
        KeySource::Dirs(dirs) => {
            let keys = TrustedKeys::load(dirs);
            match keys.find(&block.key_fingerprint) {
                Some(k) => check_signature(&pool, &block, k)?,
                None => {
                    return Err(TrustError::Untrusted {
                        path: path.into(),
                        fingerprint: block.key_fingerprint.clone(),
                    })
                }
            }
        }
    };
    let m = &pool.manifest;
    let file = swpool_format::pool::open_regular(path).map_err(|source| TrustError::Io {
        path: path.into(),
        what: "cannot open",
        source,
    })?;
    if let Some(mm) = verify_image(&file, m, progress).map_err(|source| TrustError::Io {
        path: path.into(),
        what: "cannot read",
        source,
    })? {
        return Err(TrustError::ImageMismatch {
            path: path.into(),
            count: mm.count,
            total: m.chunks.len() as u64,
            data_chunks: m.chunks.iter().filter(|c| c.is_some()).count() as u64,
            first_offset: mm.chunks.first().copied().unwrap_or(0) * m.chunk_size,
        });
    }
    let detached = if check_detached {
        let sig_path = detached_path(path);
        let sig = std::fs::read(&sig_path).map_err(|source| TrustError::Io {
            path: sig_path.clone(),
            what: "cannot read the detached signature",
            source,
        })?;
        let key = match source {
            KeySource::Key(k) => TrustedKeys::single(k)?.keys.remove(0),
            KeySource::Dirs(d) => TrustedKeys::load(d)
                .find(&signer.fingerprint)
                .cloned()
                .expect("found above"),
        };
        if !verify_detached(path, &key.key, signer.algorithm, &sig)? {
            return Err(TrustError::DetachedMismatch {
                path: path.into(),
                sig: sig_path,
            });
        }
        Some(sig_path)
    } else {
        None
    };
    Ok(VerifyReport {
        path: path.into(),
        name: m.name.clone(),
        version: m.version.clone(),
        digest: m.digest.clone(),
        signer,
        data_bytes: m.data_size,
        detached,
        elapsed: t0.elapsed(),
    })
}

fn verify_detached(
    path: &Path,
    key: &PKey<Public>,
    alg: Algorithm,
    sig: &[u8],
) -> Result<bool, TrustError> {
    let io = |source| TrustError::Io {
        path: path.into(),
        what: "cannot read",
        source,
    };
    let mut f = swpool_format::pool::open_regular(path).map_err(io)?;
    let mut buf = vec![0u8; 4 << 20];
    match alg {
        Algorithm::Ed25519 => {
            let mut h = Sha256::new();
            loop {
                let n = f.read(&mut buf).map_err(io)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            verify_bytes(key, alg, &h.finalize(), sig)
        }
        _ => {
            let mut v = Verifier::new(MessageDigest::sha256(), key)?;
            loop {
                let n = f.read(&mut buf).map_err(io)?;
                if n == 0 {
                    break;
                }
                v.update(&buf[..n])?;
            }
            Ok(v.verify(sig).unwrap_or(false))
        }
    }
}
