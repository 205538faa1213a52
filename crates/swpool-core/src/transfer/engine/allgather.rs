//! [`super::super::Algorithm::Allgather`]: one `MPI_Iallgatherv` per round, straight from the
//! reader's send buffer into every leader's round buffer.

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
    me: usize,
    u8t: ffi::MPI_Datatype,
) -> LocalResult<()> {
    let sp = f
        .send
        .as_ref()
        .map_or(std::ptr::null(), |s| s.as_ptr() as *const c_void);
    let req = f.reqs.push();
    check(
        // SAFETY: `sp` is null or this rank's counts[me] bytes; `f.buf` holds the sum of
        // `f.counts` at `f.displs`; both live in the flight until its requests complete; the count and
        // displacement arrays outlive the call (MPI may read them until completion: they belong to `f`).
        unsafe {
            ffi::MPI_Iallgatherv(
                sp,
                f.counts[me],
                u8t,
                f.buf.as_mut_ptr() as *mut c_void,
                f.counts.as_ptr(),
                f.displs.as_ptr(),
                u8t,
                comm.as_raw(),
                req,
            )
        },
        "MPI_Iallgatherv",
    )?;
    Ok(())
}
