//! The rewrites that make an environment's files independent of where it lies: shebangs,
//! `activate`, `.pth` lines, `RECORD` entries (the rules are in the parent module's docs).

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{io, write_file, PyEnvError};

/// The relocatable form of a script whose shebang names an interpreter under `prefix`: `/bin/sh`
/// runs the `python` beside the script's real path (pip's form for long shebangs).
pub fn relocate_shebang(data: &[u8], prefix: &[u8]) -> Option<Vec<u8>> {
    let rest = data.strip_prefix(b"#!")?;
    let end = rest.iter().position(|&b| b == b'\n')?;
    let line = &rest[..end];
    let line = line.strip_prefix(b" ").unwrap_or(line);
    if !line.starts_with(prefix) || line.get(prefix.len()) != Some(&b'/') {
        return None;
    }
    let exe = line.split(|&b| b == b' ').next()?;
    let base = exe.rsplit(|&b| b == b'/').next()?;
    if !base.starts_with(b"python") {
        return None;
    }
    let mut out = b"#!/bin/sh\n'''exec' \"$(dirname -- \"$(realpath -- \"$0\")\")/".to_vec();
    out.extend_from_slice(base);
    out.extend_from_slice(b"\" \"$0\" \"$@\"\n' '''\n");
    out.extend_from_slice(&rest[end + 1..]);
    Some(out)
}

/// `bin/activate` with `VIRTUAL_ENV` taken from the script's own location.
pub fn relocate_activate(data: &[u8], prefix: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(data);
    let prefix = String::from_utf8_lossy(prefix);
    let mut changed = false;
    let mut out = String::new();
    for l in text.split_inclusive('\n') {
        let t = l.trim_start();
        let t = t.strip_prefix("export ").unwrap_or(t);
        if t.starts_with("VIRTUAL_ENV=") && l.contains(prefix.as_ref()) {
            out.push_str(
                "VIRTUAL_ENV=\"$(cd \"$(dirname -- \"${BASH_SOURCE[0]:-${(%):-%x}}\")/..\" && pwd)\"\n",
            );
            if l.trim_start().starts_with("export ") {
                out.push_str("export VIRTUAL_ENV\n");
            }
            changed = true;
        } else {
            out.push_str(l);
        }
    }
    changed.then(|| out.into_bytes())
}

/// A `.pth` file with directories under the environment `env` made relative to its
/// `site-packages` directory `sp` (Python resolves relative `.pth` lines against it).
pub fn relocate_pth(text: &str, env: &Path, sp: &Path) -> Option<String> {
    let mut changed = false;
    let mut out = String::new();
    for l in text.split_inclusive('\n') {
        let line = l.trim_end_matches('\n');
        let p = Path::new(line);
        if !line.starts_with("import") && p.is_absolute() {
            if let Ok(rel) = normalize(p).strip_prefix(env) {
                let from = sp.strip_prefix(env).unwrap_or(sp);
                out.push_str(&relative_to(rel, from).to_string_lossy());
                out.push('\n');
                changed = true;
                continue;
            }
        }
        out.push_str(l);
    }
    changed.then_some(out)
}

/// RECORD's hash form: `sha256=` and urlsafe base64 without padding.
pub fn record_hash(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let d = Sha256::digest(data);
    let mut s = String::from("sha256=");
    for ch in d.chunks(3) {
        let b = [ch[0], *ch.get(1).unwrap_or(&0), *ch.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let k = ch.len() + 1;
        for i in 0..k {
            s.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    s
}

/// Update the RECORD of every `*.dist-info` in `sp` for the files in `rewritten`; returns the
/// number of installed distributions (`*.dist-info` and `*.egg-info`).
pub(super) fn fix_records(
    sp: &Path,
    rewritten: &HashMap<PathBuf, ()>,
) -> Result<usize, PyEnvError> {
    let mut n = 0;
    let rd = std::fs::read_dir(sp).map_err(io("cannot be read", sp))?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".egg-info") {
            n += 1;
        }
        if !name.ends_with(".dist-info") {
            continue;
        }
        n += 1;
        let rec = e.path().join("RECORD");
        let Ok(text) = std::fs::read_to_string(&rec) else {
            continue;
        };
        let mut changed = false;
        let mut out = String::new();
        for l in text.lines() {
            let parts: Vec<&str> = l.rsplitn(3, ',').collect();
            if parts.len() == 3 {
                let path = parts[2].trim_matches('"');
                let f = normalize(&sp.join(path));
                if rewritten.contains_key(&f) {
                    if let Ok(data) = std::fs::read(&f) {
                        out.push_str(&format!(
                            "{},{},{}\n",
                            parts[2],
                            record_hash(&data),
                            data.len()
                        ));
                        changed = true;
                        continue;
                    }
                }
            }
            out.push_str(l);
            out.push('\n');
        }
        if changed {
            write_file(&rec, out.as_bytes())?;
        }
    }
    Ok(n)
}

pub(super) fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// `target` (relative to the tree's top) as seen from the directory `from` (also relative).
pub(super) fn relative_to(target: &Path, from: &Path) -> PathBuf {
    let mut r = PathBuf::new();
    for _ in from.components() {
        r.push("..");
    }
    r.join(target)
}

/// Every occurrence of `old` in a text file replaced by `new` (conda's `file_mode: text`).
pub fn replace_prefix_text(data: &[u8], old: &[u8], new: &[u8]) -> Option<Vec<u8>> {
    if old.is_empty() || !data.windows(old.len()).any(|w| w == old) {
        return None;
    }
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while let Some(p) = find(&data[i..], old) {
        out.extend_from_slice(&data[i..i + p]);
        out.extend_from_slice(new);
        i += p + old.len();
    }
    out.extend_from_slice(&data[i..]);
    Some(out)
}

/// A binary file (conda's `file_mode: binary`) with `old` replaced by `new` in each C string that
/// holds it, the string padded with NULs after its terminator so that every offset in the file
/// stays where it was. `Ok(None)`: nothing to replace. `Err` (the reason) when `new` is longer
/// than `old`: the string cannot grow in place.
pub fn replace_prefix_binary(
    data: &[u8],
    old: &[u8],
    new: &[u8],
) -> Result<Option<Vec<u8>>, String> {
    if old.is_empty() || find(data, old).is_none() {
        return Ok(None);
    }
    if new.len() > old.len() {
        return Err(format!(
            "it is a binary file holding the prefix in a C string of fixed size: the new prefix \
             ({} bytes) is longer than the original ({} bytes), and a binary string can only \
             shrink in place",
            new.len(),
            old.len()
        ));
    }
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    let mut changed = false;
    while let Some(p) = find(&data[i..], old) {
        let start = i + p;
        // the C string runs to its NUL terminator; without one this is not a string: leave it
        let Some(nul) = data[start..].iter().position(|&b| b == 0) else {
            break;
        };
        let end = start + nul;
        let seg = &data[start..end];
        let mut n = 0;
        let mut j = 0;
        out.extend_from_slice(&data[i..start]);
        while let Some(q) = find(&seg[j..], old) {
            out.extend_from_slice(&seg[j..j + q]);
            out.extend_from_slice(new);
            j += q + old.len();
            n += 1;
        }
        out.extend_from_slice(&seg[j..]);
        out.push(0);
        out.extend(std::iter::repeat_n(0u8, n * (old.len() - new.len())));
        i = end + 1;
        changed = true;
    }
    out.extend_from_slice(&data[i..]);
    debug_assert_eq!(out.len(), data.len());
    Ok(changed.then_some(out))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
