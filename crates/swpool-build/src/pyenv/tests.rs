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

#[test]
fn text_prefix_is_replaced_everywhere() {
    let r =
        replace_prefix_text(b"a=/old/env/x\nb=/old/env\n", b"/old/env", b"/new/longer/p").unwrap();
    assert_eq!(r, b"a=/new/longer/p/x\nb=/new/longer/p\n");
    assert!(replace_prefix_text(b"nothing here", b"/old/env", b"/n").is_none());
}

#[test]
fn binary_prefix_is_replaced_in_its_c_string_padded_to_the_same_length() {
    let data = b"\x7fELF\0/old/env/lib:/old/env/share\0tail\0/old/env\0";
    let r = replace_prefix_binary(data, b"/old/env", b"/n")
        .unwrap()
        .unwrap();
    assert_eq!(r.len(), data.len());
    let want: &[u8] = b"\x7fELF\0/n/lib:/n/share\0\0\0\0\0\0\0\0\0\0\0\0\0tail\0/n\0\0\0\0\0\0\0";
    assert_eq!(r, want);
    // the same length is fine, nothing to replace is Ok(None)
    let same = replace_prefix_binary(data, b"/old/env", b"/abc/de")
        .unwrap()
        .unwrap();
    assert_eq!(same.len(), data.len());
    assert!(replace_prefix_binary(b"\0x\0", b"/old/env", b"/n")
        .unwrap()
        .is_none());
    // a longer prefix cannot fit: refused with the reason
    let e = replace_prefix_binary(data, b"/old/env", b"/much/longer/prefix").unwrap_err();
    assert!(e.contains("19 bytes") && e.contains("8 bytes"), "{e}");
}
