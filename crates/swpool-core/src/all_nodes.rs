//! `list --all-nodes`: each node's [`node_list`] gathered over the job's node leaders.

use swpool_node::mount::Sys;
use swpool_node::state::{node_list, ListFilter, NodeList};

/// `list --all-nodes` under mpirun/srun: every node leader's [`node_list`] (a node that cannot
/// list, or read its configuration, answers with its error), gathered in node order. Call on every rank; the list comes back
/// on world rank 0 only (`None` elsewhere). Each node lists itself; nothing is agreed: one node's
/// error is shown beside the others' lists.
pub fn all_nodes_list(
    job: &dyn crate::collective::Collective,
    sys: &dyn Sys,
    a: &ListFilter,
    cfg: Result<&swpool_node::config::Config, String>,
    env: &swpool_node::config::Environment,
) -> Result<Option<Vec<NodeList>>, crate::collective::Agreed> {
    if !job.is_leader() {
        return Ok(None);
    }
    let mine = cfg
        .and_then(|cfg| node_list(sys, a, cfg, env).map_err(|e| e.to_string()))
        .unwrap_or_else(|e| NodeList {
            node: swpool_node::users::hostname(),
            state_dirs: vec![],
            mounts: vec![],
            unused_cache: vec![],
            helper: None,
            environments: vec![],
            error: Some(e),
        });
    let bytes = serde_json::to_vec(&mine).expect("json");
    let all = job.leaders_all_gather(&bytes)?;
    if job.world_rank() != 0 {
        return Ok(None);
    }
    Ok(Some(
        all.iter()
            .enumerate()
            .map(|(i, b)| {
                serde_json::from_slice(b).unwrap_or_else(|e| NodeList {
                    node: job.leader_host(i),
                    state_dirs: vec![],
                    mounts: vec![],
                    unused_cache: vec![],
                    helper: None,
                    environments: vec![],
                    error: Some(format!("undecodable answer: {e}")),
                })
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use swpool_node::mount::sys::{FakeScript, FakeSys};

    #[test]
    fn all_nodes_list_answers_for_every_node_in_order_on_rank_0_only() {
        use crate::collective::fake::{FakeCluster, FakeRank};
        use crate::collective::Collective;
        let out = FakeCluster::run(3, 2, |r: &FakeRank| {
            let sys = FakeSys::new(FakeScript {
                euid: rustix::process::geteuid().as_raw(),
                ..Default::default()
            });
            let cfg = swpool_node::config::Config::default();
            let c = match r.node_index() {
                1 => Err("cannot read /etc/sw-pool/config.toml: bad".to_string()),
                _ => Ok(&cfg),
            };
            all_nodes_list(
                r,
                &sys,
                &ListFilter::default(),
                c,
                &swpool_node::config::Environment::default(),
            )
            .unwrap()
        });
        assert!(out.iter().skip(1).all(Option::is_none), "rank 0 only");
        let nodes = out[0].as_ref().unwrap();
        assert_eq!(nodes.len(), 3);
        assert!(nodes[1].error.as_deref().unwrap().contains("config.toml"));
        assert!(
            nodes[0].error.is_none() && nodes[2].error.is_none(),
            "{nodes:?}"
        );
    }
}
