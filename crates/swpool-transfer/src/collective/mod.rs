//! Collectives: the few operations by which the ranks of a job agree, behind one trait.
//!
//! Every step of a collective use case (`load`, `cp`) that can fail on one node ends in an
//! agreement: each rank passes its local outcome, and every rank gets `Ok` only if all were `Ok`,
//! else the same [`Agreed`] error naming every failing node. No rank takes a different branch,
//! no rank hangs (the rule of mpiFileUtils' `mfu_alltrue`; unlike dbcast, any failure gives a
//! non-zero exit). See `docs/architecture.md`, "The collective rule".
//!
//! Two implementations: `swpool_mpi::Job` (MPI through rsmpi, or a single process), and
//! [`fake::FakeCluster`], an in-process cluster of threads, so that "one node fails → every node
//! fails the same way, nothing is left" is a unit test of every step without MPI.

pub mod fake;

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::plane::DataPlane;
use swpool_format::status::ExitStatus;

/// One rank's failure, as every rank learns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The node's hostname.
    pub host: String,
    /// World rank of the process that failed.
    pub rank: usize,
    /// Its exit status (the failing rank exits with it; the others with 8).
    #[serde(with = "status_code")]
    pub status: ExitStatus,
    /// What went wrong, with the path and what to do.
    pub message: String,
}

mod status_code {
    use serde::{Deserialize, Deserializer, Serializer};
    use swpool_format::status::ExitStatus;
    pub fn serialize<S: Serializer>(s: &ExitStatus, ser: S) -> Result<S::Ok, S::Error> {
        ser.serialize_u8(*s as u8)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ExitStatus, D::Error> {
        Ok(ExitStatus::from_code(u8::deserialize(d)?))
    }
}

/// The outcome of a failed agreement: every failure of every rank, the same on all ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreed {
    pub failures: Vec<Failure>,
    /// This rank's own status when it failed itself.
    pub own: Option<ExitStatus>,
    /// Name the rank of each failure (several processes took part).
    pub show_rank: bool,
}

impl Agreed {
    /// The failing rank keeps its own status; the others get [`ExitStatus::Collective`].
    pub fn exit_status(&self) -> ExitStatus {
        self.own.unwrap_or(ExitStatus::Collective)
    }
}

impl fmt::Display for Agreed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // one failure per node is enough: the ranks of a node share their leader's outcome
        let mut seen: Vec<&Failure> = Vec::new();
        for x in &self.failures {
            if !seen
                .iter()
                .any(|s| s.host == x.host && s.message == x.message)
            {
                seen.push(x);
            }
        }
        // the line starts with the node: a message that names it too ("… on node HOST …", as the
        // errors of one node's steps do) does not say it twice
        let line = |x: &Failure| {
            let message = without_host(&x.message, &x.host);
            match self.show_rank {
                true => format!("{} (rank {}): {message}", x.host, x.rank),
                false => format!("{}: {message}", x.host),
            }
        };
        match seen.as_slice() {
            [one] => write!(f, "{}", line(one)),
            many => write!(
                f,
                "failed on {} nodes: {}",
                many.len(),
                many.iter().map(|x| line(x)).collect::<Vec<_>>().join("; ")
            ),
        }
    }
}

impl std::error::Error for Agreed {}

/// `message` without the words that name `host` (` on node HOST`, as a step on one node says
/// where it failed).
fn without_host(message: &str, host: &str) -> String {
    message.replace(&format!(" on node {host}"), "")
}

/// A rank's local outcome of a step: `Ok`, or the status and message it failed with.
pub type Local<T> = Result<T, (ExitStatus, String)>;

/// The operations a collective use case needs. Every rank of the job calls each one in the same
/// order (they block until all participants arrived); "leaders" methods are called on node leaders
/// only.
pub trait Collective {
    fn world_rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// This node's index among the nodes (its leader's rank among the leaders).
    fn node_index(&self) -> usize;
    /// Number of nodes (= number of leaders).
    fn nodes(&self) -> usize;
    /// One rank per node reads, writes and mounts for it.
    fn is_leader(&self) -> bool;
    fn hostname(&self) -> &str;
    /// Hostname of the leader of node `i` (known on leaders).
    fn leader_host(&self, i: usize) -> String;
    /// This job's stall watchdog: everything that moves for the job touches it.
    fn watchdog(&self) -> &crate::watchdog::Watchdog;
    /// Whether several processes take part (messages then name the node).
    fn is_collective(&self) -> bool {
        self.world_size() > 1
    }
    /// `host (rank R)` for messages.
    fn whoami(&self) -> String {
        format!("{} (rank {})", self.hostname(), self.world_rank())
    }

    /// Every rank's bytes, in world-rank order, on every rank.
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Agreed>;
    /// Every leader's bytes, in node order, on every leader (call on leaders).
    fn leaders_all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Agreed>;
    /// Node `root`'s leader's bytes to every leader (call on leaders).
    fn leaders_bcast(&self, root: usize, mine: Option<&[u8]>) -> Result<Vec<u8>, Agreed>;
    /// The leader's bytes to every rank of its node: the leader passes `Some`, the others `None`.
    #[allow(clippy::wrong_self_convention)] // "from the leader", not a conversion
    fn from_leader(&self, mine: Option<&[u8]>) -> Result<Vec<u8>, Agreed>;

    /// Whether the node leaders have a data plane (an MPI job, or a fake cluster built with one):
    /// then a file is read once and moved among them; without one every receiving node copies by
    /// itself.
    fn has_data_plane(&self) -> bool {
        false
    }
    /// Call on every leader: the data plane among the leaders that pass `member`, ranked in node
    /// order (`None` on the others, and without a data plane).
    fn leaders_plane(&self, member: bool) -> Option<Box<dyn DataPlane + '_>> {
        let _ = member;
        None
    }
    /// `%n` in a path stands for the node index where several "nodes" share one machine (tests).
    fn node_path(&self, p: &Path) -> PathBuf {
        p.to_path_buf()
    }

    /// Agreement among all ranks.
    fn agree(&self, local: Local<()>) -> Result<(), Agreed> {
        let show = self.is_collective();
        agree_with(local, show, self.world_rank(), self.hostname(), |b| {
            self.all_gather(b)
        })
    }
    /// Agreement among the node leaders (call on leaders).
    fn leaders_agree(&self, local: Local<()>) -> Result<(), Agreed> {
        let show = self.is_collective();
        agree_with(local, show, self.world_rank(), self.hostname(), |b| {
            self.leaders_all_gather(b)
        })
    }
}

/// A value the leader decided, to every rank of its node, as JSON.
pub fn leader_value<T: Serialize + for<'de> Deserialize<'de>>(
    job: &dyn Collective,
    mine: Option<&T>,
) -> Result<T, Agreed> {
    let bytes = mine.map(|v| serde_json::to_vec(v).expect("serialises"));
    let got = job.from_leader(bytes.as_deref())?;
    serde_json::from_slice(&got).map_err(|e| Agreed {
        failures: vec![Failure {
            host: job.hostname().to_string(),
            rank: job.world_rank(),
            status: ExitStatus::Internal,
            message: format!("cannot decode the node leader's value: {e}"),
        }],
        own: Some(ExitStatus::Internal),
        show_rank: job.is_collective(),
    })
}

fn agree_with(
    local: Local<()>,
    show_rank: bool,
    rank: usize,
    host: &str,
    gather: impl FnOnce(&[u8]) -> Result<Vec<Vec<u8>>, Agreed>,
) -> Result<(), Agreed> {
    let mine: Option<Failure> = local.as_ref().err().map(|(s, m)| Failure {
        host: host.to_string(),
        rank,
        status: *s,
        message: m.clone(),
    });
    let bytes = serde_json::to_vec(&mine).expect("serialises");
    let all = gather(&bytes)?;
    let mut failures = Vec::new();
    for b in all {
        match serde_json::from_slice::<Option<Failure>>(&b) {
            Ok(Some(f)) => failures.push(f),
            Ok(None) => {}
            Err(e) => failures.push(Failure {
                host: "?".into(),
                rank: usize::MAX,
                status: ExitStatus::Internal,
                message: format!("undecodable agreement message: {e}"),
            }),
        }
    }
    if failures.is_empty() {
        return Ok(());
    }
    Err(Agreed {
        failures,
        own: local.err().map(|(s, _)| s),
        show_rank,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreed_names_each_node_once() {
        let f = |h: &str, r, m: &str| Failure {
            host: h.into(),
            rank: r,
            status: ExitStatus::System,
            message: m.into(),
        };
        let a = Agreed {
            failures: vec![f("n1", 1, "disk full"), f("n1", 2, "disk full")],
            own: None,
            show_rank: true,
        };
        assert_eq!(a.to_string(), "n1 (rank 1): disk full");
        assert_eq!(a.exit_status(), ExitStatus::Collective);
        let b = Agreed {
            failures: vec![f("n1", 1, "x"), f("n3", 3, "y")],
            own: Some(ExitStatus::Trust),
            show_rank: true,
        };
        assert_eq!(
            b.to_string(),
            "failed on 2 nodes: n1 (rank 1): x; n3 (rank 3): y"
        );
        assert_eq!(b.exit_status(), ExitStatus::Trust);
        // the node once per message (issue 32, point 8)
        let c = Agreed {
            failures: vec![f("n2", 0, "mount point /x on node n2: cannot create it")],
            own: None,
            show_rank: false,
        };
        assert_eq!(c.to_string(), "n2: mount point /x: cannot create it");
    }
}
