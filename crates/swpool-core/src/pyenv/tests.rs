//! Unit tests of the relocation rules.

use super::relocate::*;
use std::path::Path;

#[test]
fn shebang_of_an_entry_point_runs_the_python_beside_it() {
    let s = b"#!/old/env/bin/python3\n# -*- coding: utf-8 -*-\nimport sys\n";
    let r = relocate_shebang(s, b"/old/env").unwrap();
    let r = String::from_utf8(r).unwrap();
    assert!(r.starts_with("#!/bin/sh\n'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")/python3\" \"$0\" \"$@\"\n' '''\n# -*- coding"), "{r}");
    assert!(relocate_shebang(b"#!/usr/bin/env python3\n", b"/old/env").is_none());
    assert!(relocate_shebang(b"#!/old/envx/bin/python\n", b"/old/env").is_none());
    assert!(relocate_shebang(b"#!/old/env/bin/perl\n", b"/old/env").is_none());
}

#[test]
fn record_hash_matches_pip() {
    // python3 -c 'import hashlib,base64;print(base64.urlsafe_b64encode(hashlib.sha256(b"abc").digest()).rstrip(b"="))'
    assert_eq!(
        record_hash(b"abc"),
        "sha256=ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"
    );
}

#[test]
fn pth_lines_under_the_env_become_relative() {
    let env = Path::new("/e");
    let sp = Path::new("/e/lib/python3.11/site-packages");
    let r = relocate_pth("/e/src/pkg\nimport x\n/other\n", env, sp).unwrap();
    assert_eq!(r, "../../../src/pkg\nimport x\n/other\n");
    assert!(relocate_pth("/other\n", env, sp).is_none());
}

#[test]
fn activate_takes_its_own_location() {
    let a = b"deactivate nondestructive\nVIRTUAL_ENV=\"/old/env\"\nexport VIRTUAL_ENV\n";
    let r = String::from_utf8(relocate_activate(a, b"/old/env").unwrap()).unwrap();
    assert!(!r.contains("/old/env"), "{r}");
    assert!(r.contains("BASH_SOURCE"));
}
