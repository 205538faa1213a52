//! The pipelined ring ([`super::super::Algorithm::Ring`]): in step `s` of a round every leader sends
//! block `me − s` to its right neighbour and receives block `me − s − 1` from its left one; block
//! `k` is reader `k`'s chunk. One TCP stream per neighbour instead of one per peer; measured the
//! fastest of the three on the testbed.

use std::os::raw::c_void;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::flight::{check, Reqs};
use super::LocalResult;

/// State of a pipelined ring for one round: in step `s` every leader sends block `me − s` to its
/// right neighbour and receives block `me − s − 1` from its left one; block `k` is reader `k`'s chunk.
pub(super) struct Ring {
    pub(super) step: usize,
    pub(super) tag: i32,
}

impl Ring {
    /// Start the next step's messages once the previous ones completed; false when the round's
    /// last step is done.
    pub(super) fn step(
        &mut self,
        buf: &mut [u8],
        counts: &[i32],
        displs: &[i32],
        reqs: &mut Reqs,
        comm: &SimpleCommunicator,
    ) -> LocalResult<bool> {
        let n = comm.size() as usize;
        if self.step + 1 >= n {
            return Ok(false);
        }
        let me = comm.rank() as usize;
        let s = self.step;
        self.step += 1;
        let send = (me + n - s) % n;
        let recv = (me + 2 * n - s - 1) % n;
        let right = ((me + 1) % n) as i32;
        let left = ((me + n - 1) % n) as i32;
        // SAFETY: reading an MPI datatype constant (MPI is initialised).
        let u8t = unsafe { ffi::RSMPI_UINT8_T };
        let tag = self.tag;
        if counts[recv] > 0 {
            let req = reqs.push();
            check(
                // SAFETY: `buf` holds counts[recv] bytes at displs[recv] (plan::Round sized it), and it
                // is neither read, moved nor dropped until `reqs` completes (the round is kept in flight until
                // then); `req` points at a handle slot that MPI fills during this call.
                unsafe {
                    ffi::MPI_Irecv(
                        buf.as_mut_ptr().add(displs[recv] as usize) as *mut c_void,
                        counts[recv],
                        u8t,
                        left,
                        tag,
                        comm.as_raw(),
                        req,
                    )
                },
                "MPI_Irecv",
            )?;
        }
        // the block `me − s` reaches the right neighbour unless it started there
        if counts[send] > 0 {
            let req = reqs.push();
            check(
                // SAFETY: the send block lies inside `buf` (counts/displs from the round plan) and `buf`
                // is not written, moved or dropped before `reqs` completes.
                unsafe {
                    ffi::MPI_Isend(
                        buf.as_ptr().add(displs[send] as usize) as *const c_void,
                        counts[send],
                        u8t,
                        right,
                        tag,
                        comm.as_raw(),
                        req,
                    )
                },
                "MPI_Isend",
            )?;
        }
        Ok(true)
    }
}
