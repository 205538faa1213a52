//! A round in flight: its buffers, its non-blocking requests, and how it progresses.

use std::time::Duration;

use super::ring::{Advance, Ctx, Ring};
use super::LocalResult;
use crate::plane::{DataPlane, PlaneError, Req};
use crate::transfer::plan::SlotHeader;
use crate::watchdog::Watchdog;
use swpool_format::status::ExitStatus;

/// Pending non-blocking requests of the data plane. Once one of them failed, every poll fails:
/// a buffer whose request failed never counts as sent or received.
pub(super) struct Reqs(Vec<Req>, Option<PlaneError>);

impl Reqs {
    pub(super) fn new() -> Reqs {
        Reqs(Vec::new(), None)
    }
    /// Keep a request just posted (or fail with the plane's error).
    pub(super) fn add(&mut self, posted: Result<Req, PlaneError>) -> LocalResult<()> {
        match posted {
            Ok(r) => self.0.push(r),
            Err(e) => {
                self.1.get_or_insert(e.clone());
                return Err(plane_err(e));
            }
        }
        Ok(())
    }
    /// Cancel every pending request (receives that will never match); [`Reqs::poll`] then
    /// completes them.
    pub(super) fn cancel(&self, plane: &dyn DataPlane) {
        for &r in &self.0 {
            plane.cancel(r);
        }
    }
    /// Test every request once; true when none is pending. A failed request is gone (its buffer
    /// free) and fails the poll.
    pub(super) fn poll(&mut self, plane: &dyn DataPlane, watch: &Watchdog) -> LocalResult<bool> {
        let mut failed = self.1.clone();
        self.0.retain(|&r| match plane.test(r) {
            Ok(true) => {
                watch.touch();
                false
            }
            Ok(false) => true,
            Err(e) => {
                failed.get_or_insert(e);
                false
            }
        });
        match failed {
            Some(e) => {
                self.1 = Some(e.clone());
                Err(plane_err(e))
            }
            None => Ok(self.0.is_empty()),
        }
    }
}

/// A data-plane failure as this leader's outcome.
pub(crate) fn plane_err(e: PlaneError) -> (ExitStatus, String) {
    (
        ExitStatus::Collective,
        format!("the transfer among the nodes failed: {e}; see the other nodes' messages"),
    )
}

/// Back off between polls: spin briefly, then sleep a little (8 leaders may share 2 cores).
pub(super) struct Backoff(pub(super) u32);

impl Backoff {
    pub(super) fn snooze(&mut self) {
        self.0 += 1;
        if self.0 < 50 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    pub(super) fn reset(&mut self) {
        self.0 = 0;
    }
    /// After a poll: start over when something moved, else back off.
    pub(super) fn after(&mut self, moved: bool) {
        if moved {
            self.reset();
        } else {
            self.snooze();
        }
    }
}

pub(super) struct Landed {
    pub(super) buf: Vec<u8>,
    pub(super) slots: Vec<(usize, SlotHeader, usize, usize)>,
}

/// A round in flight.
pub(super) struct Flight {
    pub(super) round: usize,
    /// The round buffer of all its chunks (allgather, bcast; empty for the ring, whose blocks come
    /// from the [`super::ring::BlockPool`]).
    pub(super) buf: Vec<u8>,
    /// This leader's chunk (allgather: MPI reads it from here until the round completes).
    pub(super) send: Option<Vec<u8>>,
    pub(super) hdr: Vec<u8>,
    pub(super) counts: Vec<i32>,
    pub(super) displs: Vec<i32>,
    pub(super) reqs: Reqs,
    pub(super) ring: Option<Ring>,
}

impl Flight {
    /// Drive the round on; true when its data has arrived everywhere it has to (on this leader).
    /// A ring hands each block to the writer itself (through `ctx`).
    pub(super) fn progress(
        &mut self,
        plane: &dyn DataPlane,
        watch: &Watchdog,
        ctx: &mut Ctx,
    ) -> LocalResult<bool> {
        loop {
            if !self.reqs.poll(plane, watch)? {
                return Ok(false);
            }
            let Some(ring) = self.ring.as_mut() else {
                return Ok(true);
            };
            match ring.advance(&mut self.reqs, plane, ctx)? {
                Advance::Started => continue,
                Advance::Waiting => return Ok(false),
                Advance::Done => return Ok(true),
            }
        }
    }
}
