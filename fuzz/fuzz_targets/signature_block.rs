#![no_main]
//! The signature block parser and the embedded public key (OpenSSL's PEM parser) on untrusted bytes.
use libfuzzer_sys::fuzz_target;
use swpool_trust::{keys::parse_public, SignatureBlock};

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = SignatureBlock::parse(data) {
        let _ = parse_public(b.public_key.as_bytes());
        assert!(hex::decode(&b.signature).is_ok());
    }
});
