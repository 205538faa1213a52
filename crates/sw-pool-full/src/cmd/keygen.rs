use swpool_core::trust::{fingerprint, keys, Algorithm};
use swpool_core::Error;

use crate::cli::{GlobalArgs, KeyTypeArg, KeygenArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: KeygenArgs) -> Result<(), Error> {
    let alg = match a.key_type {
        KeyTypeArg::Ed25519 => Algorithm::Ed25519,
        KeyTypeArg::Rsa => Algorithm::RsaSha256,
        KeyTypeArg::EcdsaP256 => Algorithm::EcdsaP256Sha256,
    };
    let key = keys::generate(alg)?;
    let (private, public) = keys::write_keypair(&key, &a.out, a.force)?;
    let p = Printer::new(g, false);
    p.result(format!(
        "private key {} (keep it secret)",
        private.display()
    ));
    p.result(format!("public key  {}", public.display()));
    p.result(format!(
        "fingerprint {} ({})",
        fingerprint(&key)?,
        alg.as_str()
    ));
    Ok(())
}
