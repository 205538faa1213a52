#![no_main]
//! A layer's list (`swpool_env::sync::Manifest`: node 0's broadcast, or a node's own file of a
//! cached state) on untrusted bytes: never panics; what it accepts holds only plain relative
//! paths, parents before children, and round-trips to the same list and generation.
use libfuzzer_sys::fuzz_target;
use std::path::Component;
use swpool_env::sync::{Kind, Manifest};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = Manifest::decode(data) {
        let again = Manifest::decode(&m.encode()).expect("an accepted list must re-parse");
        assert_eq!(again, m);
        assert_eq!(again.generation(), m.generation());
        let mut dirs = std::collections::HashSet::new();
        for e in &m.entries {
            assert!(e.path.components().all(|c| matches!(c, Component::Normal(_))));
            if let Some(p) = e.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                assert!(dirs.contains(p), "an entry before its directory");
            }
            if e.kind == Kind::Dir {
                dirs.insert(e.path.clone());
            }
        }
        let _ = m.needs(None);
        let _ = m.needs(Some(&again));
    }
});
