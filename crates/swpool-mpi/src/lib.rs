//! sw-pool's MPI, behind the seams the transfer engine defines: [`Job`] is the
//! [`swpool_transfer::collective::Collective`] of a job launched by mpirun or srun (or a single
//! process), and [`plane::MpiPlane`] its [`swpool_transfer::plane::DataPlane`] among node leaders.
//! The only crate that links libmpi: the engine and its in-process N-rank tests build without it.

pub mod job;
pub mod plane;

pub use job::Job;
