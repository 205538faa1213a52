//! [`DataPlane`] over an MPI communicator (rsmpi's handle, the C functions called directly for the
//! non-blocking operations rsmpi does not expose with raw buffers).
//!
//! Requests live in a small table owned by the plane: an `MPI_Request` is a handle MPI writes only
//! during the call that fills it, so the table may grow (move) between calls.

use std::cell::RefCell;
use std::os::raw::c_void;

use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use swpool_transfer::plane::{DataPlane, PlaneError, Req};

/// The data plane of an MPI job: the leaders that need a file.
pub struct MpiPlane {
    comm: SimpleCommunicator,
    reqs: RefCell<Table>,
}

#[derive(Default)]
struct Table {
    slots: Vec<ffi::MPI_Request>,
    free: Vec<usize>,
}

fn u8t() -> ffi::MPI_Datatype {
    // SAFETY: reading an MPI datatype constant (MPI is initialised while a plane exists).
    unsafe { ffi::RSMPI_UINT8_T }
}

fn null() -> ffi::MPI_Request {
    // SAFETY: reading an MPI constant (MPI is initialised while a plane exists).
    unsafe { ffi::RSMPI_REQUEST_NULL }
}

fn check(rc: i32, what: &str) -> Result<(), PlaneError> {
    match rc {
        0 => Ok(()),
        rc => Err(PlaneError(format!("{what} failed with MPI error {rc}"))),
    }
}

fn count(len: usize, what: &str) -> Result<i32, PlaneError> {
    i32::try_from(len)
        .map_err(|_| PlaneError(format!("{what}: {len} bytes is too many for one MPI call")))
}

impl MpiPlane {
    pub fn new(comm: SimpleCommunicator) -> MpiPlane {
        MpiPlane {
            comm,
            reqs: RefCell::new(Table::default()),
        }
    }

    /// Run `post` with a fresh request slot; on success the slot is the returned [`Req`].
    fn post(
        &self,
        what: &str,
        post: impl FnOnce(*mut ffi::MPI_Request) -> i32,
    ) -> Result<Req, PlaneError> {
        let mut t = self.reqs.borrow_mut();
        let i = match t.free.pop() {
            Some(i) => i,
            None => {
                t.slots.push(null());
                t.slots.len() - 1
            }
        };
        t.slots[i] = null();
        let rc = post(&mut t.slots[i] as *mut _);
        if rc != 0 {
            t.free.push(i);
        }
        check(rc, what)?;
        Ok(Req(i))
    }
}

impl DataPlane for MpiPlane {
    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }
    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn min_u64(&self, mine: u64) -> Result<u64, PlaneError> {
        let mut all = u64::MAX;
        self.comm
            .all_reduce_into(&mine, &mut all, mpi::collective::SystemOperation::min());
        Ok(all)
    }

    unsafe fn iallgather(
        &self,
        send: *const u8,
        len: usize,
        recv: *mut u8,
    ) -> Result<Req, PlaneError> {
        let n = count(len, "MPI_Iallgather")?;
        self.post("MPI_Iallgather", |req| {
            // SAFETY: the caller keeps `send` (len bytes) and `recv` (len × size bytes) valid until
            // the request completes (trait contract).
            unsafe {
                ffi::MPI_Iallgather(
                    send as *const c_void,
                    n,
                    u8t(),
                    recv as *mut c_void,
                    n,
                    u8t(),
                    self.comm.as_raw(),
                    req,
                )
            }
        })
    }

    unsafe fn iallgatherv(
        &self,
        send: *const u8,
        counts: &[i32],
        displs: &[i32],
        recv: *mut u8,
    ) -> Result<Req, PlaneError> {
        let me = self.rank();
        self.post("MPI_Iallgatherv", |req| {
            // SAFETY: `send` is null or this rank's counts[me] bytes; `recv` holds every block at
            // its displacement; the caller keeps them and the count and displacement arrays
            // untouched until the request completes (trait contract).
            unsafe {
                ffi::MPI_Iallgatherv(
                    if send.is_null() {
                        std::ptr::null()
                    } else {
                        send as *const c_void
                    },
                    counts[me],
                    u8t(),
                    recv as *mut c_void,
                    counts.as_ptr(),
                    displs.as_ptr(),
                    u8t(),
                    self.comm.as_raw(),
                    req,
                )
            }
        })
    }

    unsafe fn ibcast(&self, buf: *mut u8, len: usize, root: usize) -> Result<Req, PlaneError> {
        let n = count(len, "MPI_Ibcast")?;
        self.post("MPI_Ibcast", |req| {
            // SAFETY: the caller keeps `buf` (len bytes) valid and untouched until completion.
            unsafe {
                ffi::MPI_Ibcast(
                    buf as *mut c_void,
                    n,
                    u8t(),
                    root as i32,
                    self.comm.as_raw(),
                    req,
                )
            }
        })
    }

    unsafe fn isend(
        &self,
        buf: *const u8,
        len: usize,
        dest: usize,
        tag: i32,
    ) -> Result<Req, PlaneError> {
        let n = count(len, "MPI_Isend")?;
        self.post("MPI_Isend", |req| {
            // SAFETY: the caller keeps `buf` (len bytes) valid and unwritten until completion.
            unsafe {
                ffi::MPI_Isend(
                    buf as *const c_void,
                    n,
                    u8t(),
                    dest as i32,
                    tag,
                    self.comm.as_raw(),
                    req,
                )
            }
        })
    }

    unsafe fn irecv(
        &self,
        buf: *mut u8,
        cap: usize,
        src: usize,
        tag: i32,
    ) -> Result<Req, PlaneError> {
        let n = count(cap, "MPI_Irecv")?;
        self.post("MPI_Irecv", |req| {
            // SAFETY: the caller keeps `buf` (cap bytes) valid and unread until completion.
            unsafe {
                ffi::MPI_Irecv(
                    buf as *mut c_void,
                    n,
                    u8t(),
                    src as i32,
                    tag,
                    self.comm.as_raw(),
                    req,
                )
            }
        })
    }

    fn test(&self, req: Req) -> Result<bool, PlaneError> {
        let mut t = self.reqs.borrow_mut();
        let mut flag = 0;
        // SAFETY: slot `req.0` holds a live request handle this plane created (or MPI_REQUEST_NULL,
        // which MPI_Test reports complete); MPI_Test sets it to MPI_REQUEST_NULL when it completes.
        let rc = unsafe { ffi::MPI_Test(&mut t.slots[req.0], &mut flag, ffi::RSMPI_STATUS_IGNORE) };
        if rc != 0 {
            t.free.push(req.0);
            return Err(PlaneError(format!("MPI_Test failed with MPI error {rc}")));
        }
        if flag != 0 {
            t.free.push(req.0);
        }
        Ok(flag != 0)
    }

    fn test_some(&self, reqs: &[Req]) -> Result<Vec<bool>, PlaneError> {
        let mut t = self.reqs.borrow_mut();
        let mut handles: Vec<ffi::MPI_Request> = reqs.iter().map(|r| t.slots[r.0]).collect();
        let mut done = vec![false; reqs.len()];
        let n = count(reqs.len(), "MPI_Testsome")?;
        let mut out = 0;
        let mut idx = vec![0i32; reqs.len()];
        // SAFETY: `handles` holds live request handles of this plane (or MPI_REQUEST_NULL, which
        // counts as complete below, as MPI_Test reports it); MPI_Testsome sets those that complete
        // to MPI_REQUEST_NULL and writes at most `n` indices.
        let rc = unsafe {
            ffi::MPI_Testsome(
                n,
                handles.as_mut_ptr(),
                &mut out,
                idx.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            )
        };
        // SAFETY: reading an MPI constant.
        let undefined = unsafe { ffi::RSMPI_UNDEFINED };
        if rc == 0 && out != undefined {
            for &k in &idx[..(out.max(0) as usize).min(idx.len())] {
                if let Some(d) = done.get_mut(k as usize) {
                    *d = true;
                }
            }
        }
        for (k, (r, h)) in reqs.iter().zip(&handles).enumerate() {
            if t.slots[r.0] == null() || *h == null() {
                done[k] = true;
            }
            t.slots[r.0] = *h;
            if done[k] || rc != 0 {
                t.free.push(r.0);
            }
        }
        check(rc, "MPI_Testsome")?;
        Ok(done)
    }

    fn cancel(&self, req: Req) {
        let mut t = self.reqs.borrow_mut();
        if t.slots[req.0] != null() {
            // SAFETY: a live request handle of this plane; MPI_Cancel only marks it (it is still
            // completed by MPI_Test).
            unsafe { ffi::MPI_Cancel(&mut t.slots[req.0]) };
        }
    }
}
