//! The data plane: how the node leaders that need a file move its bytes among themselves.
//!
//! The broadcast engine (`transfer::engine`) and the directory stream (`transfer::dir`) never call
//! MPI themselves; they call a [`DataPlane`]: the few non-blocking operations they need (a small
//! all-gather per round, an all-gather of varying counts, a broadcast, point-to-point sends and
//! receives with tags, test and cancel), with MPI's buffer rules (a buffer handed to a
//! non-blocking operation is neither touched nor freed until its request completed). Two
//! implementations:
//! - `swpool_mpi::plane::MpiPlane` (crate swpool-mpi): an rsmpi communicator (the leaders that need the file, split from the
//!   leaders' communicator), calling the MPI C functions directly (`MPI_THREAD_FUNNELED`: the
//!   engine's main thread alone calls it);
//! - [`fake::FakePlane`]: an in-process group of planes, one per thread, with MPI's matching rules
//!   (messages between two ranks on one tag arrive in order; collectives match in call order) and
//!   faults to inject (a rank that dies after some operations, a payload damaged in transit), so
//!   that the ring, the two trees, the all-gather and the broadcast run in unit tests
//!   (`engine/tests.rs`) on 1 to 8 "nodes" without MPI.
//!
//! A later on-demand mode adds one-sided gets here (`MPI_Get` on a window); the engine's callers
//! do not change.
//!
//! Failures: with MPI's default error handler a failed operation aborts the job (the launcher
//! then ends every rank); an implementation that returns errors (the fake, or MPI with
//! `MPI_ERRORS_RETURN`) reports a [`PlaneError`], after which the request is finished (its buffer
//! is free) and every later operation of the group fails too, so that no rank waits forever.

pub mod fake;

use std::fmt;

/// A non-blocking operation in progress (an index into the table of the plane that made it; planes
/// in other crates, such as swpool-mpi's, make and read it). Complete it with
/// [`DataPlane::test`]; after `test` returned `Ok(true)` or an error it is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Req(pub usize);

/// A failed data-plane operation: what failed, naming the peer when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaneError(pub String);

impl fmt::Display for PlaneError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PlaneError {}

/// The operations the engine needs among `size()` members ranked `0 .. size()`.
///
/// # Safety (for the `unsafe` methods)
/// Every pointer must be valid for its length (reads for send buffers, writes for receive buffers)
/// from the call until the returned request completed ([`DataPlane::test`] returned `Ok(true)`)
/// or failed; the caller neither reads a receive buffer nor writes a send buffer meanwhile, and
/// does not move or free them. Collectives are called by every member in the same order.
pub trait DataPlane {
    /// This member's rank.
    fn rank(&self) -> usize;
    /// Number of members.
    fn size(&self) -> usize;

    /// Blocking: the smallest of every member's `mine`.
    fn min_u64(&self, mine: u64) -> Result<u64, PlaneError>;

    /// Every member's `len` bytes at `send`, in rank order, into `recv` (`len × size()` bytes).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn iallgather(
        &self,
        send: *const u8,
        len: usize,
        recv: *mut u8,
    ) -> Result<Req, PlaneError>;

    /// Member `k`'s `counts[k]` bytes to `recv + displs[k]` on every member; this member sends
    /// `counts[rank()]` bytes from `send`. `counts` and `displs` must stay untouched until
    /// completion, like the buffers.
    ///
    /// # Safety
    /// See the trait; `recv` holds every `displs[k] + counts[k]`.
    unsafe fn iallgatherv(
        &self,
        send: *const u8,
        counts: &[i32],
        displs: &[i32],
        recv: *mut u8,
    ) -> Result<Req, PlaneError>;

    /// `len` bytes at `buf` on member `root` to `buf` on every member.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn ibcast(&self, buf: *mut u8, len: usize, root: usize) -> Result<Req, PlaneError>;

    /// Send `len` bytes to member `dest` with `tag`.
    ///
    /// # Safety
    /// See the trait.
    unsafe fn isend(
        &self,
        buf: *const u8,
        len: usize,
        dest: usize,
        tag: i32,
    ) -> Result<Req, PlaneError>;

    /// Receive at most `cap` bytes from member `src` with `tag` (receives posted for one source and
    /// tag match its messages in order).
    ///
    /// # Safety
    /// See the trait.
    unsafe fn irecv(
        &self,
        buf: *mut u8,
        cap: usize,
        src: usize,
        tag: i32,
    ) -> Result<Req, PlaneError>;

    /// Whether `req` completed (then it is gone). An error also ends it.
    fn test(&self, req: Req) -> Result<bool, PlaneError>;

    /// Which of `reqs` completed (those are gone; an error ends them all), with one step of
    /// progress for all of them. The MPI plane asks MPI once (`MPI_Testsome`): testing each
    /// request makes Open MPI poll every peer's socket once per request (measured on 8 nodes: the
    /// on-demand exchange's polling was 4.5 s of CPU in a 70 s run). By default, each is tested.
    fn test_some(&self, reqs: &[Req]) -> Result<Vec<bool>, PlaneError> {
        reqs.iter().map(|r| self.test(*r)).collect()
    }

    /// Ask that a posted receive that will never match be cancelled; [`DataPlane::test`] then
    /// completes it.
    fn cancel(&self, req: Req);

    /// Blocking broadcast of `buf` from `root` (the directory stream).
    fn bcast(&self, buf: &mut [u8], root: usize) -> Result<(), PlaneError> {
        // SAFETY: `buf` is borrowed mutably until the request completed or failed (we wait here).
        let r = unsafe { self.ibcast(buf.as_mut_ptr(), buf.len(), root)? };
        wait(self, r)
    }

    /// Blocking all-gather of one byte per member.
    fn all_gather_byte(&self, mine: u8) -> Result<Vec<u8>, PlaneError> {
        let mut all = vec![0u8; self.size()];
        let send = [mine];
        // SAFETY: `send` and `all` live until the request completed or failed (we wait here).
        let r = unsafe { self.iallgather(send.as_ptr(), 1, all.as_mut_ptr())? };
        wait(self, r)?;
        Ok(all)
    }
}

/// Wait for `req`, backing off while it is pending.
pub fn wait<P: DataPlane + ?Sized>(plane: &P, req: Req) -> Result<(), PlaneError> {
    let mut spins = 0u32;
    loop {
        if plane.test(req)? {
            return Ok(());
        }
        spins += 1;
        if spins < 50 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }
}
