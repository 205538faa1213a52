//! The front `make` builds and `make install` / the Debian package ship is linked statically: no
//! program interpreter, no shared library (every library an environment start loads is paid on
//! every start), and it still starts an environment and hands the other subcommands on.

use std::path::PathBuf;
use std::process::Command;

/// The static front: `$SWPOOL_STATIC_FRONT`, else where `make` puts it
/// (`target/<host triple>/release/sw-pool`, beside cargo's own `target/release`).
fn static_front() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("SWPOOL_STATIC_FRONT").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let own = PathBuf::from(env!("CARGO_BIN_EXE_sw-pool"));
    let target = own.parent()?.parent()?;
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let p = target.join(triple).join("release/sw-pool");
    p.is_file().then_some(p)
}

/// The ELF64 program header types of `bytes`.
fn program_headers(bytes: &[u8]) -> Vec<u32> {
    assert_eq!(&bytes[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(bytes[4], 2, "not ELF64");
    let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    (0..count)
        .map(|i| {
            let o = phoff + i * size;
            u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap())
        })
        .collect()
}

const PT_INTERP: u32 = 3;

#[test]
fn the_front_make_builds_is_static_and_runs() {
    let Some(front) = static_front() else {
        eprintln!(
            "SKIP the_front_make_builds_is_static_and_runs: no static front: `make build` puts it \
             at target/<host>/release/sw-pool (or set SWPOOL_STATIC_FRONT)"
        );
        return;
    };
    let bytes = std::fs::read(&front).unwrap();
    let headers = program_headers(&bytes);
    assert!(
        !headers.contains(&PT_INTERP),
        "{} has a program interpreter: it is linked dynamically (the front ships static: \
         RUSTFLAGS=\"-C target-feature=+crt-static\", see the Makefile's build target)",
        front.display()
    );
    // ldd agrees (glibc's says "statically linked", older ones "not a dynamic executable")
    if let Ok(o) = Command::new("ldd").arg(&front).output() {
        let said =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        assert!(
            said.contains("statically linked") || said.contains("not a dynamic executable"),
            "ldd {}: {said}",
            front.display()
        );
    }
    // it runs: `run --help` itself, `--version` through the full program beside it (a copy of
    // the front next to the workspace's sw-pool-full, as `make install` places them)
    let d = tempfile::tempdir().unwrap();
    let here = d.path().join("sw-pool");
    std::fs::copy(&front, &here).unwrap();
    let full = PathBuf::from(env!("CARGO_BIN_EXE_sw-pool")).with_file_name("sw-pool-full");
    std::os::unix::fs::symlink(&full, d.path().join("sw-pool-full")).unwrap();
    let out = Command::new(&here)
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("--layer"),
        "{out:?}"
    );
    let out = Command::new(&here).arg("--version").output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("sw-pool "),
        "{out:?}"
    );
}
