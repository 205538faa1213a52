//! `sw-pool cp SRC DEST` (`scalable-fs-cp`): the broadcast engine, run under mpirun/srun.
//!
//! Every rank calls [`swpool_core::transfer::copy`]; only world rank 0 prints (result, `-v` phase
//! timings like the paper's MPI_Wtime breakdown, `--json`) and draws the progress bar (indicatif,
//! only on a terminal). On failure every rank prints the same message and exits non-zero.

use std::time::Duration;

use swpool_core::config::{parse_chunk_size, Environment};
use swpool_core::size::Bytes;
use swpool_core::transfer::{copy, Algorithm, CopyOptions, CopyReport};
use swpool_core::Job;
use swpool_core::{collective::Collective, Error, ExitStatus};

use crate::cli::{CpArgs, GlobalArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: CpArgs, env: &Environment) -> Result<(), Error> {
    let cfg = super::config(env)?;
    let chunk = match &a.chunk {
        Some(s) => parse_chunk_size(s)
            .map_err(|e| Error::other(ExitStatus::BadInput, format!("--chunk {s}: {e}")))?,
        None => cfg.chunk_size.value,
    };
    let job = Job::init(env)?;
    let rank0 = job.world_rank() == 0;
    let p = Printer::new(g, a.json);
    let bar = crate::output::progress(rank0 && !a.no_progress && !a.json && !g.quiet);
    let opts = CopyOptions {
        chunk_size: Some(chunk),
        progress: bar.is_some(),
        progress_sink: bar.as_ref().map(crate::output::progress_sink),
        // the benchmark switch (bench/cp-verify.sh); `load` never honours it
        verify_chunks: !swpool_core::transfer::bench_no_verify(env),
        ..CopyOptions::from_env(env)
    };
    if !opts.verify_chunks && job.world_rank() == 0 {
        eprintln!(
            "sw-pool: warning: SW_POOL_BENCH_NO_VERIFY=1: chunks are NOT verified (a benchmark switch; unset it)"
        );
    }
    let res = copy(&job, &a.src, &a.dest, &opts);
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    // every rank returns the same outcome and prints the same message on failure; all print before
    // any exits (the first non-zero exit makes mpirun kill the rest)
    let report = match res {
        Ok(r) => r,
        Err(e) => {
            let e: Error = e.into();
            crate::output::print_error(&e);
            job.exit_barrier();
            drop(job);
            std::process::exit(e.exit_status().code());
        }
    };
    if rank0 {
        print_report(&p, &job, &report);
    }
    Ok(())
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn print_report(p: &Printer, job: &Job, r: &CopyReport) {
    let ph = &r.phases;
    if p.json {
        p.json(&serde_json::json!({
            "dest": r.dest,
            "kind": r.kind,
            "skipped_all": r.skipped_all,
            "nodes": r.nodes,
            "nodes_received": r.nodes_received,
            "ranks": job.world_size(),
            "bytes_total": r.bytes_total,
            "bytes_data": r.bytes_data,
            "bytes_read_from_src": r.bytes_read_from_src,
            "bytes_sent": r.bytes_sent,
            "bytes_written": r.bytes_written,
            "chunk_size": r.chunk_size,
            "algorithm": r.algorithm,
            "phases": {
                "preflight": secs(ph.preflight),
                "read": secs(ph.read),
                "distribute": secs(ph.distribute),
                "write": secs(ph.write),
                "verify": secs(ph.verify),
                "commit": secs(ph.commit),
                "total": secs(ph.total),
                "overlapped": ph.overlapped,
                "wait_src": secs(ph.wait_src),
                "wait_dest": secs(ph.wait_dest),
            },
        }));
        return;
    }
    if r.skipped_all {
        p.result(format!(
            "{}: already present and identical on all {} node(s); nothing copied",
            r.dest.display(),
            r.nodes
        ));
    } else {
        let rate = r.bytes_data as f64 / ph.total.as_secs_f64().max(1e-9) / 1e6;
        p.result(format!(
            "{}: {} ({} of data) to {} of {} node(s) in {:.2} s ({rate:.1} MB/s); read {} from SRC",
            r.dest.display(),
            Bytes(r.bytes_total),
            Bytes(r.bytes_data),
            r.nodes_received,
            r.nodes,
            secs(ph.total),
            Bytes(r.bytes_read_from_src),
        ));
    }
    p.verbose(format!("preflight  {:9.3} s", secs(ph.preflight)));
    if ph.overlapped {
        // read, verify and write ran in their own threads during the distribution
        p.verbose(format!(
            "distribute {:9.3} s  (wall; read, verify and write below overlap it)",
            secs(ph.distribute)
        ));
        p.verbose(format!(
            "  waiting for own SRC reads {:7.3} s",
            secs(ph.wait_src)
        ));
        p.verbose(format!(
            "  waiting for verify+write  {:7.3} s",
            secs(ph.wait_dest)
        ));
        p.verbose(format!(
            "read       {:9.3} s  (reader thread)",
            secs(ph.read)
        ));
        p.verbose(format!(
            "verify     {:9.3} s  (both threads)",
            secs(ph.verify)
        ));
        p.verbose(format!(
            "write      {:9.3} s  (writer thread)",
            secs(ph.write)
        ));
    } else {
        p.verbose(format!("read       {:9.3} s", secs(ph.read)));
        p.verbose(format!("distribute {:9.3} s", secs(ph.distribute)));
        p.verbose(format!("write      {:9.3} s", secs(ph.write)));
        p.verbose(format!("verify     {:9.3} s", secs(ph.verify)));
    }
    p.verbose(format!("commit     {:9.3} s", secs(ph.commit)));
    p.verbose(format!("total      {:9.3} s", secs(ph.total)));
    p.verbose(format!(
        "bytes read from SRC {}, sent {}, written {} (all nodes); chunk {}; algorithm {}",
        r.bytes_read_from_src,
        r.bytes_sent,
        r.bytes_written,
        Bytes(r.chunk_size),
        r.algorithm.map(Algorithm::name).unwrap_or("local")
    ));
}
