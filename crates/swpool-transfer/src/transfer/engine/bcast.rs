//! [`super::super::Algorithm::Bcast`]: one broadcast per reader per round (measured about twice as
//! slow as the ring at 8 nodes; kept for comparison).

use super::flight::Flight;
use super::LocalResult;
use crate::plane::DataPlane;

/// Start the round's data movement.
pub(super) fn start(f: &mut Flight, plane: &dyn DataPlane) -> LocalResult<()> {
    for k in 0..plane.size() {
        if f.counts[k] == 0 {
            continue;
        }
        // SAFETY: the block of reader k lies inside `f.buf`, which stays in the flight, untouched,
        // until its requests complete.
        let posted = unsafe {
            plane.ibcast(
                f.buf.as_mut_ptr().add(f.displs[k] as usize),
                f.counts[k] as usize,
                k,
            )
        };
        f.reqs.add(posted)?;
    }
    Ok(())
}
