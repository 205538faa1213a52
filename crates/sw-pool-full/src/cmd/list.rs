//! `sw-pool list`: this node's mounts and records of the caller (like `list_images.py` of the University of Oslo disk-image tools), with
//! filters (`--job`, `--stale`, `--unreported`), and `--all-nodes` under mpirun/srun: every node
//! leader's list gathered to rank 0 and printed as one table.

use swpool_core::config::Environment;
use swpool_core::mount::RealSys;
use swpool_core::state::{self, ListFilter, NodeList};
use swpool_core::Job;
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, ListArgs};
use crate::output::Printer;

fn filter(a: &ListArgs) -> ListFilter {
    ListFilter {
        job: a.job.clone(),
        stale: a.stale,
        unreported: a.unreported,
        cache_dir: a.cache_dir.clone(),
    }
}

pub fn run(g: &GlobalArgs, a: ListArgs, env: &Environment) -> Result<(), Error> {
    if let Some(j) = &a.job {
        if !swpool_core::slurm::valid_job_id(j) {
            return Err(Error::other(
                ExitStatus::BadInput,
                format!("--job {j:?} is not a Slurm job id"),
            ));
        }
    }
    let p = Printer::new(g, a.json);
    let sys = RealSys::new(env.path_var());
    if !a.all_nodes {
        let l = state::node_list(&sys, &filter(&a), &super::config(env)?, env)?;
        print_table(&p, std::slice::from_ref(&l), false);
        p.json(&serde_json::to_value(&l).expect("json"));
        return Ok(());
    }
    let job = Job::init(env)?;
    let cfg = super::config(env).map_err(|e| e.to_string());
    let Some(nodes) = swpool_core::all_nodes::all_nodes_list(
        &job,
        &sys,
        &filter(&a),
        cfg.as_ref().map_err(Clone::clone),
        env,
    )?
    else {
        return Ok(());
    };
    print_table(&p, &nodes, true);
    p.json(&serde_json::json!({ "nodes": nodes }));
    if let Some(bad) = nodes.iter().find(|n| n.error.is_some()) {
        return Err(Error::other(
            ExitStatus::System,
            format!("{}: {}", bad.node, bad.error.as_deref().unwrap_or_default()),
        ));
    }
    Ok(())
}

fn print_table(p: &Printer, nodes: &[NodeList], node_col: bool) {
    let total: usize = nodes.iter().map(|n| n.mounts.len()).sum();
    if total == 0
        && nodes.iter().all(|n| {
            n.unused_cache.is_empty()
                && n.environments.is_empty()
                && n.error.is_none()
                && n.helper.as_ref().is_none_or(|h| {
                    h.references.is_empty() && h.orphan_loops.is_empty() && h.error.is_none()
                })
        })
    {
        let names: Vec<&str> = nodes.iter().map(|n| n.node.as_str()).collect();
        p.result(format!("no mounts on {}", names.join(", ")));
        return;
    }
    let nc = |n: &str| {
        if node_col {
            format!("{n:<10} ")
        } else {
            String::new()
        }
    };
    if total > 0 {
        p.result(format!(
            "{}{:<10} {:<20} {:<14} {:>4} {:<12} MOUNT POINT",
            nc("NODE"),
            "STATUS",
            "POOL",
            "DIGEST",
            "REFS",
            "JOBS"
        ));
    }
    for n in nodes {
        if let Some(e) = &n.error {
            p.result(format!("{}error: {e}", nc(&n.node)));
        }
        for m in &n.mounts {
            let rec = m.record.as_ref();
            let label = rec
                .map(|r| match &r.pool {
                    Some(pool) => format!("{}/{}", pool.name, pool.version),
                    None => r
                        .image
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                        .unwrap_or_else(|| "-".into()),
                })
                .unwrap_or_else(|| "-".into());
            // a user image says how it holds its lease: read-write here, or one reader of many
            let label = match rec.and_then(|r| r.lease.as_ref()) {
                Some(h) if h.mode == swpool_core::userimage::lease::Mode::Rw => {
                    format!("{label} (rw)")
                }
                Some(_) => format!("{label} (ro)"),
                None => label,
            };
            let digest: String = rec
                .and_then(|r| r.pool.as_ref())
                .map(|p| {
                    p.digest
                        .split(':')
                        .next_back()
                        .unwrap_or("")
                        .chars()
                        .take(12)
                        .collect()
                })
                .unwrap_or_else(|| "-".into());
            let mut jobs: Vec<&str> = rec
                .map(|r| r.refs.iter().filter_map(|x| x.job_id.as_deref()).collect())
                .unwrap_or_default();
            jobs.dedup();
            p.result(format!(
                "{}{:<10} {:<20} {:<14} {:>4} {:<12} {}",
                nc(&n.node),
                m.status,
                label,
                digest,
                rec.map(|r| r.refs.len().to_string())
                    .unwrap_or_else(|| "-".into()),
                if jobs.is_empty() {
                    "-".into()
                } else {
                    jobs.join(",")
                },
                m.mount_point.display()
            ));
            if let Some(pr) = &m.problem {
                p.result(format!("{}           ! {pr}", nc("")));
            }
        }
        for c in &n.unused_cache {
            p.result(format!(
                "{}{:<10} {:<20} {} (cached, not mounted; `sw-pool cache prune` may evict it)",
                nc(&n.node),
                "unused",
                c.pool.as_deref().unwrap_or("(damaged)"),
                c.path.display()
            ));
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for e in &n.environments {
            p.result(format!(
                "{}{:<10} {:<20} pid {}, up {} s: {} ({})",
                nc(&n.node),
                "env",
                e.layer,
                e.pid,
                now.saturating_sub(e.started),
                e.method,
                e.key
            ));
        }
        if let Some(h) = &n.helper {
            if let Some(e) = &h.error {
                p.result(format!("{}the site's mount helper: {e}", nc(&n.node)));
            }
            for r in &h.references {
                p.result(format!(
                    "{}{:<10} {r} (the site's helper holds a reference of yours that no record reports; `sw-pool cleanup --all` gives it back)",
                    nc(&n.node),
                    "helper"
                ));
            }
            for l in &h.orphan_loops {
                p.result(format!(
                    "{}{:<10} {l} (a loop device of the site's helper that backs no mount; root's `sw-pool cleanup --stale` frees it)",
                    nc(&n.node),
                    "loop"
                ));
            }
        }
    }
}
