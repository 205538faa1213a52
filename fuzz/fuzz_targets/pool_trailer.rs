#![no_main]
//! A whole pool file's tail on untrusted bytes: footer, manifest (hash-checked, then parsed),
//! signature block. Never panics; lengths are always checked against the data.
use libfuzzer_sys::fuzz_target;
use swpool_format::pool::trailer::{read_trailer_from, ReadError};
use swpool_format::pool::Manifest;
use swpool_trust::SignatureBlock;

fuzz_target!(|data: &[u8]| {
    let mut c = std::io::Cursor::new(data);
    match read_trailer_from(&mut c, data.len() as u64) {
        Ok(t) => {
            assert!(t.footer.image_size as usize <= data.len());
            let _ = Manifest::from_json(&t.manifest);
            let _ = SignatureBlock::parse(&t.signature);
        }
        Err(ReadError::Io(_)) | Err(ReadError::Trailer(_)) => {}
    }
});
