use swpool_core::mount::RealSys;
use swpool_core::state::{self, StateDir};
use swpool_core::Error;

use crate::cli::{GlobalArgs, ListArgs};
use crate::output::Printer;

pub fn run(g: &GlobalArgs, a: ListArgs) -> Result<(), Error> {
    let p = Printer::new(g, a.json);
    let dir = StateDir::open_default()?;
    let sys = RealSys::new();
    let l = state::list(&sys, &dir)?;
    if l.is_empty() {
        p.result(format!("no mounts on {}", state::hostname()));
    } else {
        p.result(format!(
            "{:<10} {:<20} {:<14} {:>4} {:<12} MOUNT POINT",
            "STATUS", "POOL", "DIGEST", "REFS", "JOBS"
        ));
        for e in &l {
            let (label, digest, refs, jobs) = match &e.record {
                Some(r) => (
                    r.label(),
                    r.pool
                        .as_ref()
                        .map(|p| {
                            let d = p.digest.split(':').next_back().unwrap_or("");
                            d.chars().take(12).collect::<String>()
                        })
                        .unwrap_or_else(|| "-".into()),
                    r.refcount().to_string(),
                    {
                        let j = r.job_ids();
                        if j.is_empty() {
                            "-".into()
                        } else {
                            j.join(",")
                        }
                    },
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            p.result(format!(
                "{:<10} {:<20} {:<14} {:>4} {:<12} {}",
                e.status,
                label,
                digest,
                refs,
                jobs,
                e.mount_point.display()
            ));
            if let Some(pr) = &e.problem {
                p.result(format!("           ! {pr}"));
            }
        }
    }
    p.json(&serde_json::json!({
        "node": state::hostname(),
        "state_dir": dir.path(),
        "mounts": l,
    }));
    Ok(())
}
