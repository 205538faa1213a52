//! Trust: keys, signatures and the policy `load` enforces.
//!
//! A signed pool carries a **signature block** in its trailer: the signer's public key, its
//! fingerprint (SHA-256 of the DER SubjectPublicKeyInfo) and a signature over the manifest bytes. The
//! manifest holds a hash of every chunk, so one signature check plus the per-chunk checks the
//! broadcast does anyway cover every byte: a pool is never read twice to be verified.
//!
//! For compatibility with the paper this tool implements (Dieterle, Nolte, Kunkel: *Scalable Software
//! Distribution for HPC-Systems with Software Pools*, which signed pools with the `openssl` CLI), `sign` also writes a
//! detached signature `POOL.sig` over the whole pool file:
//! - RSA and ECDSA P-256 keys: `openssl dgst -sha256 -verify PUB.pem -signature POOL.sig POOL`
//! - Ed25519 keys (pure EdDSA cannot stream a 1 GB file through `openssl dgst`): the signature is over
//!   the file's binary SHA-256, so `openssl dgst -sha256 -binary POOL > POOL.sha256 &&
//!   openssl pkeyutl -verify -pubin -inkey PUB.pem -rawin -in POOL.sha256 -sigfile POOL.sig`
//!
//! All cryptography is the system OpenSSL's, through the `openssl` crate.

pub mod keys;
mod sign;
mod verify;

pub use keys::{fingerprint, Algorithm, KeyError, TrustedKey, TrustedKeys};
pub use sign::detached_path;
pub use sign::{sign_pool, SignReport};
pub use verify::{
    authorize, verify_pool, KeySource, PolicyOrigin, Signer, TrustPolicy, Verdict, VerifyReport,
};

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use swpool_format::status::ExitStatus;

/// Longest public key PEM and signature accepted in a signature block.
const MAX_PEM: usize = 16 * 1024;
const MAX_SIG_HEX: usize = 2 * 1024;

/// The signature block stored in a pool's trailer (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureBlock {
    pub schema: u32,
    pub algorithm: Algorithm,
    /// `sha256:<hex>` of the signer's public key (DER SubjectPublicKeyInfo).
    pub key_fingerprint: String,
    /// The signer's public key (PEM): a hint for "who signed this"; trust comes only from trusted keys.
    pub public_key: String,
    /// Hex signature over the manifest bytes.
    pub signature: String,
}

impl SignatureBlock {
    /// Parse untrusted bytes, with every field checked for form and size.
    pub fn parse(bytes: &[u8]) -> Result<SignatureBlock, String> {
        let b: SignatureBlock =
            serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
        if b.schema != 1 {
            return Err(format!(
                "signature block schema {} is not supported; upgrade sw-pool",
                b.schema
            ));
        }
        let fp = b
            .key_fingerprint
            .strip_prefix("sha256:")
            .ok_or("key fingerprint does not start with sha256:")?;
        if fp.len() != 64
            || !fp
                .bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        {
            return Err("key fingerprint is not 64 lowercase hex digits".into());
        }
        if b.public_key.len() > MAX_PEM || !b.public_key.starts_with("-----BEGIN PUBLIC KEY-----") {
            return Err("public key is not a PEM public key".into());
        }
        if b.signature.is_empty()
            || b.signature.len() > MAX_SIG_HEX
            || hex::decode(&b.signature).is_err()
        {
            return Err("signature is not hex of a plausible length".into());
        }
        Ok(b)
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("signature block serialises")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error(transparent)]
    Manifest(#[from] swpool_format::pool::ManifestError),
    #[error("{} is not signed; sign it with `sw-pool sign --key PRIV.pem {}`{}", swpool_sys::exec::show(path), swpool_sys::exec::show(path),
        if *required { " (the trust policy requires a signature: require_signature / SW_POOL_REQUIRE_SIGNATURE / --require-signature)" } else { "" })]
    Unsigned { path: PathBuf, required: bool },
    #[error(
        "{}: the signature block is damaged ({reason}); sign the pool again",
        swpool_sys::exec::show(path)
    )]
    BadBlock { path: PathBuf, reason: String },
    #[error("{} is signed by key {fingerprint}, which is not trusted here; if you trust its owner, check the fingerprint with them and copy their public key into /etc/sw-pool/trusted-keys/NAME.pem (or ~/.config/sw-pool/trusted-keys/)", swpool_sys::exec::show(path))]
    Untrusted { path: PathBuf, fingerprint: String },
    #[error(
        "{} is signed by key {signed_by}, not by the key you gave ({given})",
        swpool_sys::exec::show(path)
    )]
    WrongKey {
        path: PathBuf,
        signed_by: String,
        given: String,
    },
    #[error("{}: the manifest signature does not verify with key {fingerprint} ({name}): the manifest or the signature was changed after signing; do not use this pool", swpool_sys::exec::show(path))]
    BadSignature {
        path: PathBuf,
        fingerprint: String,
        name: String,
    },
    #[error("{}: the image does not match its signed manifest: {count} of {total} chunks differ, first at byte offset {first_offset}{}; do not use this pool, copy it again from its source",
        swpool_sys::exec::show(path), if *count >= 2 && *count * 2 > *data_chunks { " (the manifest belongs to another image)" } else { "" })]
    ImageMismatch {
        path: PathBuf,
        count: u64,
        total: u64,
        data_chunks: u64,
        first_offset: u64,
    },
    #[error("refusing to sign {}: its image does not match its manifest: {count} of {total} chunks differ, first at byte offset {first_offset}; nothing was signed: rebuild the pool (`sw-pool build`) from the tree you checked", swpool_sys::exec::show(path))]
    SignMismatch {
        path: PathBuf,
        count: u64,
        total: u64,
        first_offset: u64,
    },
    #[error("{}: the detached signature {} does not match the pool file (made for another pool, or the pool changed)", swpool_sys::exec::show(path), swpool_sys::exec::show(sig))]
    DetachedMismatch { path: PathBuf, sig: PathBuf },
    #[error("{}: {what}: {source}", swpool_sys::exec::show(path))]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("openssl: {0}")]
    Ssl(#[from] openssl::error::ErrorStack),
}

impl TrustError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            TrustError::Manifest(e) => e.exit_status(),
            TrustError::Io { source, .. } => swpool_format::status::io_status(source),
            TrustError::Key(e) => e.exit_status(),
            // damage, as `load` and `mount` report the same bytes (a damaged pool, 4)
            TrustError::ImageMismatch { .. } | TrustError::SignMismatch { .. } => {
                ExitStatus::InvalidPool
            }
            _ => ExitStatus::Trust,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_parser_rejects_bad_fields() {
        let good = SignatureBlock {
            schema: 1,
            algorithm: Algorithm::Ed25519,
            key_fingerprint: format!("sha256:{}", "a".repeat(64)),
            public_key: "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n"
                .into(),
            signature: "ab".repeat(64),
        };
        assert_eq!(SignatureBlock::parse(&good.to_json()).unwrap(), good);
        let mut b = good.clone();
        b.schema = 9;
        assert!(SignatureBlock::parse(&b.to_json()).is_err());
        let mut b = good.clone();
        b.key_fingerprint = "md5:x".into();
        assert!(SignatureBlock::parse(&b.to_json()).is_err());
        let mut b = good.clone();
        b.signature = "zz".into();
        assert!(SignatureBlock::parse(&b.to_json()).is_err());
        let mut b = good.clone();
        b.public_key = "x".repeat(20_000);
        assert!(SignatureBlock::parse(&b.to_json()).is_err());
        assert!(SignatureBlock::parse(b"{\"schema\":1}").is_err());
        assert!(SignatureBlock::parse(b"\xff\xfe").is_err());
    }
}
