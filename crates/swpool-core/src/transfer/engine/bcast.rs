//! [`super::super::Algorithm::Bcast`]: one `MPI_Ibcast` per reader per round (measured about twice
//! as slow as the ring at 8 nodes; kept for comparison).

use std::os::raw::c_void;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;

use super::flight::{check, Flight};
use super::LocalResult;

/// Start the round's data movement.
pub(super) fn start(
    f: &mut Flight,
    comm: &SimpleCommunicator,
    n: usize,
    u8t: ffi::MPI_Datatype,
) -> LocalResult<()> {
    for k in 0..n {
        if f.counts[k] == 0 {
            continue;
        }
        let req = f.reqs.push();
        check(
            // SAFETY: the block of reader k lies inside `f.buf`, which stays in the flight, untouched,
            // until its requests complete.
            unsafe {
                ffi::MPI_Ibcast(
                    f.buf.as_mut_ptr().add(f.displs[k] as usize) as *mut c_void,
                    f.counts[k],
                    u8t,
                    k as i32,
                    comm.as_raw(),
                    req,
                )
            },
            "MPI_Ibcast",
        )?;
    }
    Ok(())
}
