//! Keys: generation, PEM files, fingerprints, and the trusted-keys directories.

use std::path::{Path, PathBuf};

use openssl::ec::{EcGroup, EcKey};
use openssl::nid::Nid;
use openssl::pkey::{Id, PKey, Private, Public};
use openssl::rsa::Rsa;
use serde::{Deserialize, Serialize};

use swpool_format::status::ExitStatus;
use swpool_sys::atomic::TempOutput;

/// System and user directories of trusted public keys (`NAME.pem`: NAME is the signer's name).
pub const SYSTEM_TRUSTED_KEYS: &str = "/etc/sw-pool/trusted-keys";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    /// Ed25519 (the default).
    Ed25519,
    /// RSA (at least 2048 bits), PKCS#1 v1.5 with SHA-256.
    RsaSha256,
    /// ECDSA on P-256 with SHA-256.
    EcdsaP256Sha256,
}

impl Algorithm {
    pub fn of(key: &PKey<impl openssl::pkey::HasPublic>) -> Result<Algorithm, KeyError> {
        match key.id() {
            Id::ED25519 => Ok(Algorithm::Ed25519),
            Id::RSA => {
                let bits = key.bits();
                if bits < 2048 {
                    return Err(KeyError::Unsupported(format!(
                        "an RSA key of {bits} bits (use at least 2048)"
                    )));
                }
                Ok(Algorithm::RsaSha256)
            }
            Id::EC => {
                let ec = key.ec_key().map_err(|e| {
                    KeyError::Unsupported(format!("an EC key openssl cannot read: {e}"))
                })?;
                match ec.group().curve_name() {
                    Some(Nid::X9_62_PRIME256V1) => Ok(Algorithm::EcdsaP256Sha256),
                    other => Err(KeyError::Unsupported(format!(
                        "an EC key on curve {other:?} (use P-256)"
                    ))),
                }
            }
            other => Err(KeyError::Unsupported(format!(
                "a key of type {other:?} (use Ed25519, RSA or ECDSA P-256)"
            ))),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "ed25519",
            Algorithm::RsaSha256 => "rsa-sha256",
            Algorithm::EcdsaP256Sha256 => "ecdsa-p256-sha256",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read key {}: {source}", swpool_sys::exec::show(path))]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a {what} key in PEM form ({reason}); make one with `sw-pool keygen --out NAME` or `openssl genpkey -algorithm ed25519 -out NAME.pem`", swpool_sys::exec::show(path))]
    Parse {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("unsupported key: {0}")]
    Unsupported(String),
    #[error(
        "{} already exists; use --force to replace it",
        swpool_sys::exec::show(path)
    )]
    Exists { path: PathBuf },
    #[error("cannot write {}: {source}", swpool_sys::exec::show(path))]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("openssl: {0}")]
    Ssl(#[from] openssl::error::ErrorStack),
}

impl KeyError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            KeyError::Read { source, .. } | KeyError::Write { source, .. } => {
                swpool_format::status::io_status(source)
            }
            KeyError::Ssl(_) => ExitStatus::Trust,
            _ => ExitStatus::BadInput,
        }
    }
}

/// `sha256:<hex>` of the public key's DER SubjectPublicKeyInfo (what `openssl pkey -pubout -outform DER | sha256sum` gives).
pub fn fingerprint(key: &PKey<impl openssl::pkey::HasPublic>) -> Result<String, KeyError> {
    let der = key.public_key_to_der()?;
    Ok(format!(
        "sha256:{}",
        hex::encode(openssl::sha::sha256(&der))
    ))
}

pub fn generate(alg: Algorithm) -> Result<PKey<Private>, KeyError> {
    Ok(match alg {
        Algorithm::Ed25519 => PKey::generate_ed25519()?,
        Algorithm::RsaSha256 => PKey::from_rsa(Rsa::generate(3072)?)?,
        Algorithm::EcdsaP256Sha256 => {
            let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1)?;
            PKey::from_ec_key(EcKey::generate(&group)?)?
        }
    })
}

/// Write `OUT.pem` (private, 0600, PKCS#8) and `OUT.pub.pem` (public); returns both paths.
pub fn write_keypair(
    key: &PKey<Private>,
    out: &Path,
    force: bool,
) -> Result<(PathBuf, PathBuf), KeyError> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let base = out.to_string_lossy().trim_end_matches(".pem").to_string();
    let private = PathBuf::from(format!("{base}.pem"));
    let public = PathBuf::from(format!("{base}.pub.pem"));
    for p in [&private, &public] {
        if p.symlink_metadata().is_ok() && !force {
            return Err(KeyError::Exists { path: p.clone() });
        }
    }
    for (path, pem, mode) in [
        (&private, key.private_key_to_pem_pkcs8()?, 0o600),
        (&public, key.public_key_to_pem()?, 0o644),
    ] {
        let werr = |source| KeyError::Write {
            path: path.clone(),
            source,
        };
        let (tmp, mut f) = TempOutput::create(path).map_err(werr)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(werr)?;
        f.write_all(&pem).map_err(werr)?;
        tmp.commit(f).map_err(werr)?;
    }
    Ok((private, public))
}

pub fn read_private(path: &Path) -> Result<PKey<Private>, KeyError> {
    let pem = std::fs::read(path).map_err(|source| KeyError::Read {
        path: path.into(),
        source,
    })?;
    PKey::private_key_from_pem(&pem).map_err(|e| KeyError::Parse {
        path: path.into(),
        what: "private",
        reason: e
            .errors()
            .first()
            .map(|x| x.to_string())
            .unwrap_or_else(|| "unreadable".into()),
    })
}

pub fn read_public(path: &Path) -> Result<PKey<Public>, KeyError> {
    let pem = std::fs::read(path).map_err(|source| KeyError::Read {
        path: path.into(),
        source,
    })?;
    parse_public(&pem).map_err(|reason| KeyError::Parse {
        path: path.into(),
        what: "public",
        reason,
    })
}

pub fn parse_public(pem: &[u8]) -> Result<PKey<Public>, String> {
    PKey::public_key_from_pem(pem).map_err(|e| {
        e.errors()
            .first()
            .map(|x| x.to_string())
            .unwrap_or_else(|| "unreadable".into())
    })
}

/// A trusted public key.
#[derive(Clone)]
pub struct TrustedKey {
    /// The signer's name: the key file's name without `.pem` / `.pub.pem`.
    pub name: String,
    pub path: PathBuf,
    pub fingerprint: String,
    pub key: PKey<Public>,
}

impl std::fmt::Debug for TrustedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrustedKey")
            .field("name", &self.name)
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// The trusted keys found in some directories.
#[derive(Debug, Clone, Default)]
pub struct TrustedKeys {
    pub keys: Vec<TrustedKey>,
    /// Files that could not be read as keys (reported, never trusted).
    pub skipped: Vec<(PathBuf, String)>,
}

impl TrustedKeys {
    pub fn load(dirs: &[PathBuf]) -> TrustedKeys {
        let mut t = TrustedKeys::default();
        for dir in dirs {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
            files.sort();
            for path in files {
                let fname = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let Some(stem) = fname.strip_suffix(".pem") else {
                    continue;
                };
                let name = stem.strip_suffix(".pub").unwrap_or(stem).to_string();
                match read_public(&path).and_then(|k| Ok((fingerprint(&k)?, k))) {
                    Ok((fp, key)) => t.keys.push(TrustedKey {
                        name,
                        path,
                        fingerprint: fp,
                        key,
                    }),
                    Err(e) => t.skipped.push((path, e.to_string())),
                }
            }
        }
        t
    }

    pub fn single(path: &Path) -> Result<TrustedKeys, KeyError> {
        let key = read_public(path)?;
        let name = path
            .file_name()
            .map(|n| {
                n.to_string_lossy()
                    .trim_end_matches(".pem")
                    .trim_end_matches(".pub")
                    .to_string()
            })
            .unwrap_or_default();
        Ok(TrustedKeys {
            keys: vec![TrustedKey {
                name,
                path: path.into(),
                fingerprint: fingerprint(&key)?,
                key,
            }],
            skipped: vec![],
        })
    }

    pub fn find(&self, fingerprint: &str) -> Option<&TrustedKey> {
        self.keys.iter().find(|k| k.fingerprint == fingerprint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_write_read_fingerprint() {
        let d = tempfile::tempdir().unwrap();
        for alg in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
            let k = generate(alg).unwrap();
            assert_eq!(Algorithm::of(&k).unwrap(), alg);
            let (priv_p, pub_p) = write_keypair(&k, &d.path().join(alg.as_str()), false).unwrap();
            assert!(write_keypair(&k, &d.path().join(alg.as_str()), false).is_err());
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&priv_p).unwrap().permissions().mode() & 0o777,
                0o600
            );
            let pk = read_public(&pub_p).unwrap();
            assert_eq!(
                fingerprint(&pk).unwrap(),
                fingerprint(&read_private(&priv_p).unwrap()).unwrap()
            );
        }
        let t = TrustedKeys::load(&[d.path().to_path_buf()]);
        // the private keys are not public keys: skipped, not trusted
        assert_eq!(t.keys.len(), 2);
        assert_eq!(t.skipped.len(), 2);
        assert!(t.keys.iter().any(|k| k.name == "ed25519"));
    }

    #[test]
    fn weak_keys_are_refused() {
        let rsa = PKey::from_rsa(Rsa::generate(1024).unwrap()).unwrap();
        assert!(Algorithm::of(&rsa)
            .unwrap_err()
            .to_string()
            .contains("2048"));
        let group = EcGroup::from_curve_name(Nid::SECP384R1).unwrap();
        let ec = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
        assert!(Algorithm::of(&ec)
            .unwrap_err()
            .to_string()
            .contains("P-256"));
    }
}
