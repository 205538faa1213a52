//! [`super::super::Algorithm::Allgather`]: one all-gather of varying counts per round, straight from
//! the reader's send buffer into every leader's round buffer.

use super::flight::Flight;
use super::LocalResult;
use crate::plane::DataPlane;

/// Start the round's data movement.
pub(super) fn start(f: &mut Flight, plane: &dyn DataPlane) -> LocalResult<()> {
    let sp = f.send.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: `sp` is null or this rank's counts[me] bytes; `f.buf` holds the sum of `f.counts` at
    // `f.displs`; the buffers and the count and displacement arrays belong to the flight `f`, which
    // stays in the queue of flights, untouched, until its requests complete.
    let posted = unsafe { plane.iallgatherv(sp, &f.counts, &f.displs, f.buf.as_mut_ptr()) };
    f.reqs.add(posted)
}
