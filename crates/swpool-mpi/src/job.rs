//! The job: an MPI context (world, one communicator per node, one among the node leaders) or a
//! single process without MPI at all.

use std::os::raw::c_void;
use std::time::Duration;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;

use crate::plane::MpiPlane;
use swpool_transfer::plane::DataPlane;

use swpool_format::status::ExitStatus;
use swpool_node::config::{EnvVar, Environment};
use swpool_transfer::collective::{Agreed, Collective, Failure};
use swpool_transfer::transfer::TransferError;
use swpool_transfer::watchdog::Watchdog;

/// Longest hostname kept in the leader table.
const HOST_LEN: usize = 64;

pub(crate) struct Mpi {
    pub(crate) world: SimpleCommunicator,
    pub(crate) node: SimpleCommunicator,
    /// Present on leaders only: the communicator of all node leaders (rank = node index).
    pub(crate) leaders: Option<SimpleCommunicator>,
    // dropped last: finalises MPI
    _universe: mpi::environment::Universe,
}

/// Who and where this process is: an MPI job (any number of ranks per node) or a single process.
///
/// Created once per process with [`Job::init`]; MPI is finalised when it is dropped.
pub struct Job {
    pub(crate) mpi: Option<Mpi>,
    world_rank: usize,
    world_size: usize,
    node_index: usize,
    nodes: usize,
    local_rank: usize,
    hostname: String,
    /// Hostname of every node leader, by node index.
    leader_hosts: Vec<String>,
    /// The pid of this node's leader, when this process can see it (liveness check).
    leader_pid: Option<i32>,
    /// `SW_POOL_FAKE_NODES=1`: one "node" per rank (testing on one machine).
    pub(crate) fake: bool,
    watchdog: Watchdog,
}

pub use swpool_node::slurm::launched_by_launcher;

pub use swpool_node::users::hostname;

impl Job {
    /// Initialise MPI only when launched by a launcher (`OMPI_COMM_WORLD_SIZE`, `PMIX_RANK`,
    /// `PMI_RANK`, `PMI_SIZE`, or `SLURM_STEP_ID` with `SLURM_NTASKS` > 1, which is refused without a PMI
    /// plugin); otherwise a single-process Job with no MPI at all (build/inspect never touch MPI).
    /// The variables come from `env`, as does `SW_POOL_FAKE_NODES`.
    pub fn init(env: &Environment) -> Result<Job, TransferError> {
        let launched = launched_by_launcher(env).map_err(TransferError::Mpi)?;
        if !launched {
            return Ok(Job::single());
        }
        // MPI start-up (MPI_Init, the communicator splits, the leaders' table) is collective: a
        // node that cannot reach another would otherwise hang here for ever. The job's watchdog is
        // armed around it, so that such a hang ends with exit status 8 in bounded time.
        let watchdog = Watchdog::default();
        let _armed = watchdog.arm(
            format!("{} (MPI start-up)", hostname()),
            swpool_transfer::watchdog::default_timeout(env),
        );
        let _phase = watchdog.phase("MPI start-up (MPI_Init and the first collectives)");
        let mut job = Job::init_mpi(env.is_one(EnvVar::FakeNodes))?;
        job.watchdog = watchdog.clone();
        Ok(job)
    }

    /// A single-process job (no MPI).
    pub fn single() -> Job {
        let h = hostname();
        Job {
            mpi: None,
            world_rank: 0,
            world_size: 1,
            node_index: 0,
            nodes: 1,
            local_rank: 0,
            leader_hosts: vec![h.clone()],
            hostname: h,
            leader_pid: None,
            fake: false,
            watchdog: Watchdog::default(),
        }
    }

    /// `fake`: `SW_POOL_FAKE_NODES=1`.
    fn init_mpi(fake: bool) -> Result<Job, TransferError> {
        // MPI is only ever called from the main thread; helper threads do file I/O.
        let (universe, _) =
            mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or_else(|| {
                TransferError::Mpi("MPI was already initialised in this process".into())
            })?;
        let world = universe.world();
        let world_rank = world.rank() as usize;
        let world_size = world.size() as usize;
        // SW_POOL_FAKE_NODES=1 (tests on one machine only): every rank is its own "node"
        let node = if fake {
            world
                .split_by_color(Color::with_value(world.rank()))
                .expect("a color was given")
        } else {
            world.split_shared(world.rank())
        };
        let local_rank = node.rank() as usize;
        let is_leader = local_rank == 0;
        let leaders = world.split_by_color_with_key(
            if is_leader {
                Color::with_value(0)
            } else {
                Color::undefined()
            },
            world.rank(),
        );
        let host = if fake {
            format!("{}-fake{}", hostname(), world_rank)
        } else {
            hostname()
        };
        // leaders learn every leader's hostname; the node learns its index, the node count and
        // its leader's pid
        let mut info = [0u64; 3];
        let mut leader_hosts = Vec::new();
        if let Some(l) = &leaders {
            let n = l.size() as usize;
            let mut mine = [0u8; HOST_LEN];
            let hb = host.as_bytes();
            let k = hb.len().min(HOST_LEN);
            mine[..k].copy_from_slice(&hb[..k]);
            let mut all = vec![0u8; HOST_LEN * n];
            l.all_gather_into(&mine[..], &mut all[..]);
            leader_hosts = all
                .chunks(HOST_LEN)
                .map(|c| {
                    let end = c.iter().position(|&b| b == 0).unwrap_or(HOST_LEN);
                    String::from_utf8_lossy(&c[..end]).into_owned()
                })
                .collect();
            info = [l.rank() as u64, n as u64, std::process::id() as u64];
        }
        node.process_at_rank(0).broadcast_into(&mut info[..]);
        let leader_pid = info[2] as i32;
        // the leader's pid is only useful if this process can see it (same pid namespace)
        let visible = is_leader
            || rustix::process::Pid::from_raw(leader_pid)
                .is_some_and(|p| rustix::process::test_kill_process(p).is_ok());
        Ok(Job {
            world_rank,
            world_size,
            node_index: info[0] as usize,
            nodes: info[1] as usize,
            local_rank,
            hostname: host,
            leader_hosts,
            leader_pid: visible.then_some(leader_pid),
            fake,
            watchdog: Watchdog::default(),
            mpi: Some(Mpi {
                world,
                node,
                leaders,
                _universe: universe,
            }),
        })
    }

    /// Rank within the node (0 = the leader).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }
    /// True when MPI was initialised (launched by mpirun/srun).
    pub fn is_mpi(&self) -> bool {
        self.mpi.is_some()
    }
    /// Hostname of the leader of node `i` (known on leaders; elsewhere `node<i>`).
    fn host_of_leader(&self, i: usize) -> String {
        self.leader_hosts
            .get(i)
            .cloned()
            .unwrap_or_else(|| format!("node #{i}"))
    }

    /// A world barrier before a failing exit, so that every rank has printed its message before
    /// the first non-zero exit makes the launcher kill the others. Bounded by the watchdog (10 s).
    pub fn exit_barrier(&self) {
        if let Some(m) = &self.mpi {
            let _arm = self
                .watchdog
                .arm(Collective::whoami(self), Duration::from_secs(10));
            let _p = self.watchdog.phase("the final barrier");
            m.world.barrier();
        }
    }

    /// Every leader's bytes, in node order, on world rank 0 (`Some`); `None` on the other leaders.
    /// Call on leaders only (e.g. `list --all-nodes`: one table for the job).
    pub fn gather_leaders(&self, value: &[u8]) -> Result<Option<Vec<Vec<u8>>>, TransferError> {
        let Some(l) = self.mpi.as_ref().and_then(|m| m.leaders.as_ref()) else {
            return Ok(Some(vec![value.to_vec()]));
        };
        let root = l.process_at_rank(0);
        let len = i32::try_from(value.len())
            .map_err(|_| TransferError::Mpi(format!("{} bytes to gather", value.len())))?;
        if l.rank() != 0 {
            root.gather_into(&len);
            root.gather_varcount_into(value);
            return Ok(None);
        }
        let mut lens = vec![0i32; l.size() as usize];
        root.gather_into_root(&len, &mut lens[..]);
        let displs: Vec<i32> = lens
            .iter()
            .scan(0i32, |acc, &x| {
                let d = *acc;
                *acc += x;
                Some(d)
            })
            .collect();
        let total: usize = lens.iter().map(|&x| x as usize).sum();
        let mut buf = vec![0u8; total];
        {
            let mut part = mpi::datatype::PartitionMut::new(&mut buf[..], &lens[..], &displs[..]);
            root.gather_varcount_into_root(value, &mut part);
        }
        Ok(Some(
            lens.iter()
                .zip(&displs)
                .map(|(&n, &d)| buf[d as usize..(d + n) as usize].to_vec())
                .collect(),
        ))
    }

    /// The leader's value to every rank of its node (e.g. the leader's outcome). The leader
    /// passes `Some(bytes)`, the other ranks `None`; every rank returns the leader's bytes.
    /// Non-leaders wait without a time limit while the leader works, but notice within a second
    /// when the leader process has died (when it is visible in this pid namespace).
    fn bytes_from_leader(&self, value: Option<&[u8]>) -> Result<Vec<u8>, TransferError> {
        let Some(m) = &self.mpi else {
            return Ok(value.unwrap_or_default().to_vec());
        };
        let mut len = [value.map_or(0, |v| v.len() as u64)];
        self.node_bcast_wait(&m.node, &mut len[..])?;
        let mut buf = match value {
            Some(v) => v.to_vec(),
            None => vec![0u8; len[0] as usize],
        };
        self.node_bcast_wait(&m.node, &mut buf[..])?;
        Ok(buf)
    }

    fn node_bcast_wait<T: Equivalence>(
        &self,
        node: &SimpleCommunicator,
        buf: &mut [T],
    ) -> Result<(), TransferError> {
        // SAFETY: reading an MPI constant (MPI is initialised while this Job exists).
        let mut req: ffi::MPI_Request = unsafe { ffi::RSMPI_REQUEST_NULL };
        // SAFETY: `buf` is a live exclusive slice of `buf.len()` elements of T's MPI datatype,
        // borrowed for this whole function, which does not return before the request completed.
        let rc = unsafe {
            ffi::MPI_Ibcast(
                buf.as_mut_ptr() as *mut c_void,
                buf.len() as i32,
                T::equivalent_datatype().as_raw(),
                0,
                node.as_raw(),
                &mut req,
            )
        };
        if rc != 0 {
            return Err(TransferError::Mpi(format!("MPI_Ibcast failed ({rc})")));
        }
        let mut spins = 0u32;
        loop {
            let mut flag = 0;
            // SAFETY: `req` is the live request started above; called from the main thread only.
            unsafe { ffi::MPI_Test(&mut req, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if flag != 0 {
                return Ok(());
            }
            spins += 1;
            if spins & 63 == 0 {
                if let Some(pid) = self
                    .leader_pid
                    .filter(|_| !self.is_leader())
                    .and_then(rustix::process::Pid::from_raw)
                {
                    let alive = rustix::process::test_kill_process(pid).is_ok()
                        && !swpool_sys::process::zombie(pid.as_raw_nonzero().get() as u32);
                    if !alive {
                        return Err(TransferError::Failed {
                            message: format!(
                                "the leader of node {} (pid {}) died; this rank ({}) gives up",
                                self.hostname,
                                pid.as_raw_nonzero(),
                                self.whoami()
                            ),
                            status: ExitStatus::Collective,
                        });
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(if self.local_rank == 0 {
                1
            } else {
                20
            }));
        }
    }
}

/// Every member's bytes, in rank order, on every member of `comm` (two `MPI_Allgather(v)` calls).
fn all_gather_bytes(comm: &SimpleCommunicator, mine: &[u8], watch: &Watchdog) -> Vec<Vec<u8>> {
    let _w = watch.phase("agreement");
    let n = comm.size() as usize;
    let len = mine.len() as i32;
    let mut counts = vec![0i32; n];
    comm.all_gather_into(&len, &mut counts[..]);
    watch.touch();
    let displs: Vec<i32> = counts
        .iter()
        .scan(0, |acc, &x| {
            let t = *acc;
            *acc += x;
            Some(t)
        })
        .collect();
    let total: usize = counts.iter().map(|&c| c as usize).sum();
    if total == 0 {
        // nothing to move: Open MPI refuses an all-gather of varying counts into an empty buffer
        // (MPI_ERR_ARG, fatal)
        return vec![Vec::new(); n];
    }
    let mut buf = vec![0u8; total];
    {
        let mut part = mpi::datatype::PartitionMut::new(&mut buf[..], &counts[..], &displs[..]);
        comm.all_gather_varcount_into(mine, &mut part);
    }
    watch.touch();
    counts
        .iter()
        .zip(&displs)
        .map(|(&c, &d)| buf[d as usize..(d + c) as usize].to_vec())
        .collect()
}

impl Collective for Job {
    fn world_rank(&self) -> usize {
        self.world_rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn node_index(&self) -> usize {
        self.node_index
    }
    fn nodes(&self) -> usize {
        self.nodes
    }
    fn is_leader(&self) -> bool {
        self.local_rank == 0
    }
    fn hostname(&self) -> &str {
        &self.hostname
    }
    fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }
    fn leader_host(&self, i: usize) -> String {
        self.host_of_leader(i)
    }
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Agreed> {
        Ok(match &self.mpi {
            None => vec![mine.to_vec()],
            Some(m) => all_gather_bytes(&m.world, mine, &self.watchdog),
        })
    }
    fn leaders_all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, Agreed> {
        Ok(match self.mpi.as_ref().and_then(|m| m.leaders.as_ref()) {
            None => vec![mine.to_vec()],
            Some(l) => all_gather_bytes(l, mine, &self.watchdog),
        })
    }
    fn leaders_bcast(&self, root: usize, mine: Option<&[u8]>) -> Result<Vec<u8>, Agreed> {
        Ok(match self.mpi.as_ref().and_then(|m| m.leaders.as_ref()) {
            None => mine.unwrap_or_default().to_vec(),
            Some(l) => {
                let mut len = [mine.map_or(0u64, |v| v.len() as u64)];
                l.process_at_rank(root as i32).broadcast_into(&mut len[..]);
                let mut buf = match mine {
                    Some(v) => v.to_vec(),
                    None => vec![0u8; len[0] as usize],
                };
                l.process_at_rank(root as i32).broadcast_into(&mut buf[..]);
                self.watchdog.touch();
                buf
            }
        })
    }
    fn from_leader(&self, mine: Option<&[u8]>) -> Result<Vec<u8>, Agreed> {
        self.bytes_from_leader(mine).map_err(|e| Agreed {
            failures: vec![Failure {
                host: self.hostname.clone(),
                rank: self.world_rank,
                status: e.exit_status(),
                message: e.to_string(),
            }],
            own: Some(e.exit_status()),
            show_rank: true,
        })
    }
    fn has_data_plane(&self) -> bool {
        self.mpi.as_ref().is_some_and(|m| m.leaders.is_some())
    }
    fn leaders_plane(&self, member: bool) -> Option<Box<dyn DataPlane + '_>> {
        let leaders = self.mpi.as_ref().and_then(|m| m.leaders.as_ref())?;
        let color = match member {
            true => Color::with_value(0),
            false => Color::undefined(),
        };
        let comm = leaders.split_by_color_with_key(color, self.node_index as i32)?;
        Some(Box::new(MpiPlane::new(comm)))
    }
    fn node_path(&self, p: &std::path::Path) -> std::path::PathBuf {
        if self.fake {
            std::path::PathBuf::from(
                p.to_string_lossy()
                    .replace("%n", &self.node_index.to_string()),
            )
        } else {
            p.to_path_buf()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Environment {
        Environment::from_vars(pairs.iter().copied())
    }

    #[test]
    fn launcher_detection() {
        assert_eq!(launched_by_launcher(&env(&[])), Ok(false));
        assert_eq!(
            launched_by_launcher(&env(&[("OMPI_COMM_WORLD_SIZE", "4")])),
            Ok(true)
        );
        assert_eq!(launched_by_launcher(&env(&[("PMIX_RANK", "0")])), Ok(true));
        assert_eq!(launched_by_launcher(&env(&[("PMI_RANK", "1")])), Ok(true));
        // one srun task: a plain process
        assert_eq!(
            launched_by_launcher(&env(&[("SLURM_STEP_ID", "0"), ("SLURM_NTASKS", "1")])),
            Ok(false)
        );
        // several srun tasks without PMI: refused with a hint
        let e = launched_by_launcher(&env(&[("SLURM_STEP_ID", "0"), ("SLURM_NTASKS", "4")]))
            .unwrap_err();
        assert!(e.contains("--mpi=pmix"), "{e}");
        assert_eq!(
            launched_by_launcher(&env(&[
                ("SLURM_STEP_ID", "0"),
                ("SLURM_NTASKS", "4"),
                ("PMIX_RANK", "2")
            ])),
            Ok(true)
        );
    }
}
