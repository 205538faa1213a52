//! A round in flight: its buffers, its non-blocking requests, and how it progresses.

use std::time::Duration;

use mpi::ffi;
use mpi::topology::SimpleCommunicator;

use super::ring::{Advance, Ctx, Ring};
use super::LocalResult;
use crate::transfer::plan::SlotHeader;
use crate::transfer::watchdog;
use swpool_format::status::ExitStatus;

/// Pending non-blocking MPI requests.
pub(super) struct Reqs(Vec<ffi::MPI_Request>);

impl Reqs {
    pub(super) fn new() -> Reqs {
        Reqs(Vec::new())
    }
    pub(super) fn push(&mut self) -> *mut ffi::MPI_Request {
        // SAFETY: reading an MPI constant the MPI library initialised (MPI is initialised while a
        // Job exists). The pointer returned below is used only by the one MPI call that fills it.
        self.0.push(unsafe { ffi::RSMPI_REQUEST_NULL });
        self.0.last_mut().unwrap() as *mut _
    }
    /// Cancel every pending request (receives that will never match); [`Reqs::poll`] then
    /// completes them.
    pub(super) fn cancel(&mut self) {
        // SAFETY: reading an MPI constant (MPI is initialised while a Job exists).
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        for r in self.0.iter_mut().filter(|r| **r != null) {
            // SAFETY: `r` is a live request handle owned by this vector; MPI_Cancel only marks it
            // (it still has to be completed, by MPI_Test in `poll`). MPI thread only.
            unsafe { ffi::MPI_Cancel(r) };
        }
    }
    /// Test every request once; true when none is pending.
    pub(super) fn poll(&mut self) -> bool {
        // SAFETY: reading an MPI constant (MPI is initialised while a Job exists).
        let null = unsafe { ffi::RSMPI_REQUEST_NULL };
        let mut pending = false;
        for r in &mut self.0 {
            if *r == null {
                continue;
            }
            let mut flag = 0;
            // SAFETY: `r` is a live request handle owned by this vector (or MPI_REQUEST_NULL, skipped
            // above); MPI_Test sets it to MPI_REQUEST_NULL when it completes. Called from the MPI thread only
            // (MPI_THREAD_FUNNELED).
            unsafe { ffi::MPI_Test(r, &mut flag, ffi::RSMPI_STATUS_IGNORE) };
            if flag != 0 {
                watchdog::touch();
            } else {
                pending = true;
            }
        }
        if !pending {
            self.0.clear();
        }
        !pending
    }
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

pub(super) fn check(rc: i32, what: &str) -> LocalResult<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err((
            ExitStatus::Internal,
            format!("{what} failed with MPI error {rc}"),
        ))
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
        comm: &SimpleCommunicator,
        ctx: &mut Ctx,
    ) -> LocalResult<bool> {
        loop {
            if !self.reqs.poll() {
                return Ok(false);
            }
            let Some(ring) = self.ring.as_mut() else {
                return Ok(true);
            };
            match ring.advance(&mut self.reqs, comm, ctx)? {
                Advance::Started => continue,
                Advance::Waiting => return Ok(false),
                Advance::Done => return Ok(true),
            }
        }
    }
}
