//! mpi-selftest: a check program for the virtual cluster (testbed).
//!
//! Rank 0 fills a 64 MiB buffer with a deterministic pattern, broadcasts it to every rank
//! with `MPI_Bcast`, and every rank prints
//! `rank R/S host H sha256 HEX` on stdout (timing goes to stderr),
//! so that a test can check that all ranks received identical bytes.
//! Optional argument: the size in MiB (default 64).

use mpi::traits::*;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::time::Instant;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string())
}

/// Deterministic, non-trivial pattern (xorshift64), so a corrupted or partial
/// transfer changes the digest.
fn fill(buf: &mut [u8]) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

fn main() {
    let mib: usize = match std::env::args().nth(1) {
        None => 64,
        Some(a) => match a.parse() {
            Ok(v) if v > 0 => v,
            _ => {
                eprintln!("usage: mpi-selftest [SIZE_MIB]");
                std::process::exit(2);
            }
        },
    };
    let universe = match mpi::initialize() {
        Some(u) => u,
        None => {
            eprintln!("mpi-selftest: MPI was already initialised");
            std::process::exit(1);
        }
    };
    let world = universe.world();
    let rank = world.rank();
    let size = world.size();
    let root = world.process_at_rank(0);

    let mut buf = vec![0u8; mib << 20];
    if rank == 0 {
        fill(&mut buf);
    }
    world.barrier();
    let t0 = Instant::now();
    root.broadcast_into(&mut buf[..]);
    let secs = t0.elapsed().as_secs_f64();

    let digest = Sha256::digest(&buf);
    let mut hex = String::with_capacity(64);
    for b in digest.iter() {
        let _ = write!(hex, "{b:02x}");
    }
    println!("rank {rank}/{size} host {} sha256 {hex}", hostname());
    eprintln!("mpi-selftest: rank {rank} bcast {mib} MiB in {secs:.3} s");
}
