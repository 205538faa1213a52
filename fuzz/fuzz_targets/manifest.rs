#![no_main]
//! The manifest parser on untrusted bytes: never panics, and what it accepts round-trips.
use libfuzzer_sys::fuzz_target;
use swpool_format::pool::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::from_json(data) {
        let again = Manifest::from_json(&m.to_json()).expect("an accepted manifest must re-parse");
        assert_eq!(again, m);
        for i in 0..m.chunks.len().min(64) {
            let r = m.chunk_range(i as u64);
            assert!(r.start < r.end && r.end <= m.image_size);
        }
    }
});
