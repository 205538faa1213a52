//! `sw-pool list`: this node's mounts and records of the caller (like `list_images.py` of the University of Oslo disk-image tools), with
//! filters (`--job`, `--stale`, `--unreported`), and `--all-nodes` under mpirun/srun: every node
//! leader's list gathered to rank 0 and printed as one table.

use serde::{Deserialize, Serialize};
use swpool_core::cache;
use swpool_core::collective::Collective;
use swpool_core::mount::RealSys;
use swpool_core::state::{self, ListEntry, ListStatus, StateDir};
use swpool_core::transfer::Job;
use swpool_core::{Error, ExitStatus};

use crate::cli::{GlobalArgs, ListArgs};
use crate::output::Printer;

/// One node's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeList {
    node: String,
    state_dirs: Vec<std::path::PathBuf>,
    mounts: Vec<ListEntry>,
    /// `--unreported`: cache entries that nothing mounts.
    unused_cache: Vec<cache::Entry>,
    error: Option<String>,
}

fn keep(a: &ListArgs, e: &ListEntry) -> bool {
    if let Some(j) = &a.job {
        let has = e
            .record
            .as_ref()
            .is_some_and(|r| r.refs.iter().any(|x| x.job_id.as_deref() == Some(j)));
        if !has {
            return false;
        }
    }
    if a.stale && !matches!(e.status, ListStatus::Stale | ListStatus::Gone) {
        return false;
    }
    if a.unreported && !matches!(e.status, ListStatus::Unrecorded | ListStatus::Gone) {
        return false;
    }
    true
}

fn this_node(a: &ListArgs) -> Result<NodeList, Error> {
    let uid = rustix::process::geteuid().as_raw();
    let sys = RealSys::new();
    let mut dirs = state::candidate_dirs(uid);
    let def = StateDir::default_path(uid);
    if !dirs.contains(&def) {
        dirs.insert(0, def);
    }
    let mut mounts = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut used_dirs = Vec::new();
    for d in &dirs {
        let dir = StateDir::open(d, uid)?;
        used_dirs.push(dir.path().to_path_buf());
        for e in state::list(&sys, &dir)? {
            // an unrecorded mount shows up once, not once per store
            if e.record.is_none()
                && e.status != ListStatus::Corrupt
                && !seen.insert(e.mount_point.clone())
            {
                continue;
            }
            if e.record.is_some() {
                seen.insert(e.mount_point.clone());
            }
            mounts.push(e);
        }
    }
    // a mount recorded in one store is not "unrecorded" because another store lacks it
    let recorded: std::collections::HashSet<_> = mounts
        .iter()
        .filter(|e| e.record.is_some())
        .map(|e| e.mount_point.clone())
        .collect();
    mounts.retain(|e| e.record.is_some() || !recorded.contains(&e.mount_point));
    mounts.retain(|e| keep(a, e));
    let mut unused_cache = Vec::new();
    if a.unreported {
        let cfg = super::config()?;
        let base = cache::base_dir(a.cache_dir.as_deref(), cfg.cache_dir.value.as_deref());
        if let Ok(cdir) = cache::dir(&base, uid, false) {
            if let Ok(entries) = cache::list(&cdir, &super::cache::images_in_use()) {
                unused_cache = entries.into_iter().filter(|e| !e.in_use).collect();
            }
        }
    }
    Ok(NodeList {
        node: swpool_core::users::hostname(),
        state_dirs: used_dirs,
        mounts,
        unused_cache,
        error: None,
    })
}

pub fn run(g: &GlobalArgs, a: ListArgs) -> Result<(), Error> {
    if let Some(j) = &a.job {
        if !swpool_core::slurm::valid_job_id(j) {
            return Err(Error::other(
                ExitStatus::BadInput,
                format!("--job {j:?} is not a Slurm job id"),
            ));
        }
    }
    let p = Printer::new(g, a.json);
    if !a.all_nodes {
        let l = this_node(&a)?;
        print_table(&p, std::slice::from_ref(&l), false);
        p.json(&serde_json::to_value(&l).expect("json"));
        return Ok(());
    }
    let job = Job::init()?;
    if !job.is_leader() {
        return Ok(());
    }
    let mine = this_node(&a).unwrap_or_else(|e| NodeList {
        node: swpool_core::users::hostname(),
        state_dirs: vec![],
        mounts: vec![],
        unused_cache: vec![],
        error: Some(e.to_string()),
    });
    let bytes = serde_json::to_vec(&mine).expect("json");
    let Some(all) = job.gather_leaders(&bytes)? else {
        return Ok(());
    };
    let nodes: Vec<NodeList> = all
        .iter()
        .map(|b| {
            serde_json::from_slice(b).unwrap_or_else(|e| NodeList {
                node: "?".into(),
                state_dirs: vec![],
                mounts: vec![],
                unused_cache: vec![],
                error: Some(format!("undecodable answer: {e}")),
            })
        })
        .collect();
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
        && nodes
            .iter()
            .all(|n| n.unused_cache.is_empty() && n.error.is_none())
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
    }
}
