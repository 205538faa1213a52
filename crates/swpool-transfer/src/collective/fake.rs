//! An in-process cluster: one thread per rank, `nodes × ranks_per_node` ranks, exchanging bytes
//! through shared memory. It implements [`Collective`] exactly as the MPI job does (same order of
//! calls, same blocking), so a use case's agreements are unit-tested without MPI. Its leaders have
//! a data plane ([`crate::plane::fake`]): a file is read once and moved among the fake
//! nodes by the same engine as in an MPI job ([`FakeCluster::run_without_data_plane`]: every
//! receiving node copies by itself, as in a job without MPI).
//!
//! A rank that does not arrive within [`FakeCluster::TIMEOUT`] makes the others panic: a test of a
//! collective that would hang fails instead.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::{Agreed, Collective};
use crate::plane::fake::{self as plane, FakePlane, Faults};
use crate::plane::DataPlane;

/// One group of ranks that exchange bytes (the world, the leaders, the ranks of one node).
struct Group {
    size: usize,
    state: Mutex<GroupState>,
    cv: Condvar,
}

/// A finished exchange: every member's bytes, and how many members have yet to take them.
type Done = (Arc<Vec<Vec<u8>>>, usize);

#[derive(Default)]
struct GroupState {
    generation: u64,
    arrived: usize,
    values: Vec<Option<Vec<u8>>>,
    /// Finished exchanges by generation, with how many members still have to pick theirs up.
    done: HashMap<u64, Done>,
}

impl Group {
    fn new(size: usize) -> Group {
        Group {
            size,
            state: Mutex::new(GroupState {
                values: vec![None; size],
                ..Default::default()
            }),
            cv: Condvar::new(),
        }
    }

    /// All-gather: blocks until every member passed its bytes; returns them in member order.
    fn exchange(&self, index: usize, mine: &[u8]) -> Vec<Vec<u8>> {
        let mut st = self.state.lock().unwrap();
        let generation = st.generation;
        assert!(
            st.values[index].is_none(),
            "fake cluster: member {index} entered an exchange twice"
        );
        st.values[index] = Some(mine.to_vec());
        st.arrived += 1;
        if st.arrived == self.size {
            let all: Vec<Vec<u8>> = st.values.iter_mut().map(|v| v.take().unwrap()).collect();
            st.done.insert(generation, (Arc::new(all), self.size));
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
        } else {
            while !st.done.contains_key(&generation) {
                let (g, t) = self.cv.wait_timeout(st, FakeCluster::TIMEOUT).unwrap();
                st = g;
                assert!(
                    !t.timed_out() || st.done.contains_key(&generation),
                    "fake cluster: a collective waited {:?} for the other members (a rank took another branch)",
                    FakeCluster::TIMEOUT
                );
            }
        }
        let entry = st.done.get_mut(&generation).unwrap();
        let out = entry.0.as_ref().clone();
        entry.1 -= 1;
        if entry.1 == 0 {
            st.done.remove(&generation);
        }
        out
    }
}

struct Shared {
    nodes: usize,
    ranks_per_node: usize,
    world: Group,
    leaders: Group,
    node: Vec<Group>,
    /// Whether the leaders have a data plane.
    plane: bool,
    /// The data planes of the leaders' splits, by split number: each member takes its own.
    planes: Mutex<HashMap<u64, Vec<Option<FakePlane>>>>,
}

/// Builds the ranks of a fake cluster.
pub struct FakeCluster;

impl FakeCluster {
    /// How long a rank waits for the others before the test fails.
    pub const TIMEOUT: Duration = Duration::from_secs(60);

    /// The ranks of a cluster of `nodes` nodes with `ranks_per_node` ranks each; hand one to each
    /// thread. Node `i` is called `fake<i>`.
    pub fn ranks(nodes: usize, ranks_per_node: usize) -> Vec<FakeRank> {
        Self::ranks_with(nodes, ranks_per_node, true)
    }

    fn ranks_with(nodes: usize, ranks_per_node: usize, plane: bool) -> Vec<FakeRank> {
        assert!(nodes > 0 && ranks_per_node > 0);
        let shared = Arc::new(Shared {
            nodes,
            ranks_per_node,
            world: Group::new(nodes * ranks_per_node),
            leaders: Group::new(nodes),
            node: (0..nodes).map(|_| Group::new(ranks_per_node)).collect(),
            plane,
            planes: Mutex::new(HashMap::new()),
        });
        (0..nodes * ranks_per_node)
            .map(|r| FakeRank {
                rank: r,
                host: format!("fake{}", r / ranks_per_node),
                shared: shared.clone(),
                splits: std::sync::atomic::AtomicU64::new(0),
                watchdog: Default::default(),
            })
            .collect()
    }

    /// Run `f` on every rank, one thread each, and return the results in world-rank order.
    pub fn run<T: Send>(
        nodes: usize,
        ranks_per_node: usize,
        f: impl Fn(&FakeRank) -> T + Sync,
    ) -> Vec<T> {
        Self::run_ranks(Self::ranks(nodes, ranks_per_node), f)
    }

    /// [`FakeCluster::run`] on a cluster whose leaders have no data plane.
    pub fn run_without_data_plane<T: Send>(
        nodes: usize,
        ranks_per_node: usize,
        f: impl Fn(&FakeRank) -> T + Sync,
    ) -> Vec<T> {
        Self::run_ranks(Self::ranks_with(nodes, ranks_per_node, false), f)
    }

    fn run_ranks<T: Send>(ranks: Vec<FakeRank>, f: impl Fn(&FakeRank) -> T + Sync) -> Vec<T> {
        std::thread::scope(|s| {
            let hs: Vec<_> = ranks.iter().map(|r| s.spawn(|| f(r))).collect();
            hs.into_iter()
                .map(|h| h.join().expect("a fake rank panicked"))
                .collect()
        })
    }
}

/// One rank of a [`FakeCluster`].
pub struct FakeRank {
    rank: usize,
    host: String,
    shared: Arc<Shared>,
    /// Leaders' splits so far (every leader splits in the same order).
    splits: std::sync::atomic::AtomicU64,
    /// Its own watchdog (ranks do not share one).
    watchdog: crate::watchdog::Watchdog,
}

impl FakeRank {
    fn local(&self) -> usize {
        self.rank % self.shared.ranks_per_node
    }
}

impl Collective for FakeRank {
    fn world_rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.nodes * self.shared.ranks_per_node
    }
    fn node_index(&self) -> usize {
        self.rank / self.shared.ranks_per_node
    }
    fn nodes(&self) -> usize {
        self.shared.nodes
    }
    fn is_leader(&self) -> bool {
        self.local() == 0
    }
    fn hostname(&self) -> &str {
        &self.host
    }
    fn watchdog(&self) -> &crate::watchdog::Watchdog {
        &self.watchdog
    }
    fn leader_host(&self, i: usize) -> String {
        format!("fake{i}")
    }
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Agreed> {
        Ok(self.shared.world.exchange(self.rank, mine))
    }
    fn leaders_all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Agreed> {
        assert!(self.is_leader(), "leaders_all_gather on a non-leader");
        Ok(self.shared.leaders.exchange(self.node_index(), mine))
    }
    fn leaders_bcast(&self, root: usize, mine: Option<&[u8]>) -> Result<Vec<u8>, Agreed> {
        let all = self.leaders_all_gather(mine.unwrap_or_default())?;
        Ok(all[root].clone())
    }
    fn from_leader(&self, mine: Option<&[u8]>) -> Result<Vec<u8>, Agreed> {
        let g = &self.shared.node[self.node_index()];
        let all = g.exchange(self.local(), mine.unwrap_or_default());
        Ok(all[0].clone())
    }
    fn has_data_plane(&self) -> bool {
        self.shared.plane
    }
    fn leaders_plane(&self, member: bool) -> Option<Box<dyn DataPlane + '_>> {
        if !self.shared.plane {
            return None;
        }
        // every leader learns who takes part (a collective among the leaders, like MPI_Comm_split)
        let all = self.leaders_all_gather(&[u8::from(member)]).ok()?;
        let split = self
            .splits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !member {
            return None;
        }
        let members: Vec<usize> = (0..all.len()).filter(|&i| all[i] == [1]).collect();
        let me = members.iter().position(|&i| i == self.node_index())?;
        let mut planes = self.shared.planes.lock().unwrap_or_else(|e| e.into_inner());
        let group = planes.entry(split).or_insert_with(|| {
            plane::group(members.len(), Faults::default())
                .into_iter()
                .map(Some)
                .collect()
        });
        let mine = group[me].take()?;
        if group.iter().all(Option::is_none) {
            planes.remove(&split);
        }
        Some(Box::new(mine))
    }
    fn node_path(&self, p: &Path) -> PathBuf {
        PathBuf::from(
            p.to_string_lossy()
                .replace("%n", &self.node_index().to_string()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use swpool_format::status::ExitStatus;

    #[test]
    fn agreement_fails_everywhere_alike() {
        let out = FakeCluster::run(4, 2, |r| {
            let local = if r.node_index() == 2 && r.is_leader() {
                Err((ExitStatus::System, "disk full".to_string()))
            } else {
                Ok(())
            };
            r.agree(local)
        });
        let msgs: Vec<String> = out
            .iter()
            .map(|o| o.as_ref().unwrap_err().to_string())
            .collect();
        assert!(
            msgs.iter().all(|m| m == "fake2 (rank 4): disk full"),
            "{msgs:?}"
        );
        assert_eq!(
            out[4].as_ref().unwrap_err().exit_status(),
            ExitStatus::System
        );
        assert_eq!(
            out[0].as_ref().unwrap_err().exit_status(),
            ExitStatus::Collective
        );
    }

    #[test]
    fn leader_values_reach_their_node_only() {
        let out = FakeCluster::run(3, 3, |r| {
            let mine = format!("node{}", r.node_index());
            let v = r
                .from_leader(r.is_leader().then_some(mine.as_bytes()))
                .unwrap();
            let all = if r.is_leader() {
                r.leaders_all_gather(&v).unwrap().len()
            } else {
                0
            };
            (String::from_utf8(v).unwrap(), all)
        });
        for (i, (v, n)) in out.iter().enumerate() {
            assert_eq!(v, &format!("node{}", i / 3));
            assert_eq!(*n, if i % 3 == 0 { 3 } else { 0 });
        }
    }

    #[test]
    fn many_rounds_in_a_row() {
        let out = FakeCluster::run(2, 2, |r| {
            (0..200u32)
                .map(|i| r.all_gather(&i.to_le_bytes()).unwrap().len())
                .sum::<usize>()
        });
        assert!(out.iter().all(|&n| n == 800));
    }
}
