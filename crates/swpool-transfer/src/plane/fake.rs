//! An in-process [`DataPlane`]: a group of planes, one per thread, exchanging bytes through shared
//! memory with MPI's rules, so that the engine runs in unit tests without MPI.
//!
//! - **Sends are eager**: the bytes are copied when posted and the send completes at once (MPI may
//!   do either; the engine must not rely on a send completing late or early).
//! - **Receives match in order**: messages from one source on one tag are queued in send order; the
//!   receives a member posted for that source and tag take them in posting order (MPI's
//!   non-overtaking rule), whichever of them is tested first.
//! - **Collectives match in call order**: the `k`-th collective of every member is one operation;
//!   it completes on a member once every member posted it.
//! - **Faults** ([`Faults`]): a member that *dies* after a number of operations (from then on every
//!   operation of every member fails, naming it, as MPI's default error handler ends the whole job),
//!   and one payload of a member *damaged in transit* (its last byte flipped).

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{DataPlane, PlaneError, Req};

/// Faults to inject into a group.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Member `.0` dies when posting its operation number `.1 + 1`.
    pub die: Option<(usize, u64)>,
    /// The first payload larger than 4 KiB that this member sends (point-to-point, all-gather of
    /// varying counts or broadcast root) arrives with its last byte flipped.
    pub damage_from: Option<usize>,
}

struct Shared {
    n: usize,
    st: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// (source, destination, tag) → payloads in send order.
    msgs: HashMap<(usize, usize, i32), VecDeque<Vec<u8>>>,
    /// Collectives by sequence number.
    colls: HashMap<u64, Coll>,
    /// Set when a member died: every operation fails with it.
    dead: Option<String>,
    faults: Faults,
    damaged: bool,
}

struct Coll {
    contrib: Vec<Option<Vec<u8>>>,
    /// The member whose part arrives damaged on the other members.
    damaged: Option<usize>,
    arrived: usize,
    picked: usize,
}

enum Kind {
    Gather { len: usize },
    Gatherv { counts: Vec<i32>, displs: Vec<i32> },
    Bcast { len: usize, root: usize },
}

enum Pending {
    Done,
    Recv {
        buf: *mut u8,
        cap: usize,
        src: usize,
        tag: i32,
        order: u64,
    },
    Coll {
        seq: u64,
        kind: Kind,
        recv: *mut u8,
    },
}

/// One member of a fake group.
pub struct FakePlane {
    me: usize,
    shared: Arc<Shared>,
    reqs: RefCell<Vec<Option<Pending>>>,
    /// The next collective's sequence number.
    seq: Cell<u64>,
    /// The next receive's posting order.
    order: Cell<u64>,
    ops: Cell<u64>,
    /// Calls of `test_some`: the turns of a loop that drives the plane ([`FakePlane::turns`]).
    turns: Arc<AtomicU64>,
}

// SAFETY: the raw pointers in `reqs` are buffers of the thread that owns the plane; the plane is
// moved to that thread before any operation is posted and used by it alone (not `Sync`).
unsafe impl Send for FakePlane {}

/// A group of `n` members; hand one to each thread.
pub fn group(n: usize, faults: Faults) -> Vec<FakePlane> {
    assert!(n > 0);
    let shared = Arc::new(Shared {
        n,
        st: Mutex::new(State {
            faults,
            ..Default::default()
        }),
    });
    (0..n)
        .map(|me| FakePlane {
            me,
            shared: shared.clone(),
            reqs: RefCell::new(Vec::new()),
            seq: Cell::new(0),
            order: Cell::new(0),
            ops: Cell::new(0),
            turns: Arc::new(AtomicU64::new(0)),
        })
        .collect()
}

impl FakePlane {
    /// How many times this member's `test_some` was called: the turns of the loop that drives
    /// it (readable from another thread while the member runs).
    pub fn turns(&self) -> Arc<AtomicU64> {
        self.turns.clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // a panicking member must not hide the others' results behind a poisoned lock
        self.shared.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count an operation; fail when the group is dead or this member dies now.
    fn op(&self, st: &mut State) -> Result<(), PlaneError> {
        if let Some(d) = &st.dead {
            return Err(PlaneError(d.clone()));
        }
        let k = self.ops.get();
        self.ops.set(k + 1);
        if let Some((who, after)) = st.faults.die {
            if who == self.me && k >= after {
                let m =
                    format!("data plane: member {who} died (injected after {after} operations)");
                st.dead = Some(m.clone());
                return Err(PlaneError(m));
            }
        }
        Ok(())
    }

    /// Whether this payload of this member is the one to damage (it then is, on the way to the
    /// other members; the sender's own copy stays intact, as a local copy would).
    fn damage_now(&self, st: &mut State, len: usize) -> bool {
        let now = st.faults.damage_from == Some(self.me) && !st.damaged && len > 4096;
        st.damaged |= now;
        now
    }

    fn add(&self, p: Pending) -> Req {
        let mut r = self.reqs.borrow_mut();
        match r.iter().position(Option::is_none) {
            Some(i) => {
                r[i] = Some(p);
                Req(i)
            }
            None => {
                r.push(Some(p));
                Req(r.len() - 1)
            }
        }
    }

    /// Post this member's part of the next collective.
    fn collective(&self, mine: Vec<u8>, kind: Kind, recv: *mut u8) -> Result<Req, PlaneError> {
        let mut st = self.state();
        self.op(&mut st)?;
        let damage = !matches!(kind, Kind::Gather { .. }) && self.damage_now(&mut st, mine.len());
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let n = self.shared.n;
        let c = st.colls.entry(seq).or_insert_with(|| Coll {
            contrib: vec![None; n],
            damaged: None,
            arrived: 0,
            picked: 0,
        });
        c.contrib[self.me] = Some(mine);
        if damage {
            c.damaged = Some(self.me);
        }
        c.arrived += 1;
        drop(st);
        Ok(self.add(Pending::Coll { seq, kind, recv }))
    }

    /// Match this member's posted receives, in posting order, against the queued messages.
    fn match_receives(&self, st: &mut State) -> Result<(), PlaneError> {
        let mut reqs = self.reqs.borrow_mut();
        let mut posted: Vec<(u64, usize)> = reqs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Some(Pending::Recv { order, .. }) => Some((*order, i)),
                _ => None,
            })
            .collect();
        posted.sort_unstable();
        for (_, i) in posted {
            let Some(Pending::Recv {
                buf, cap, src, tag, ..
            }) = reqs[i]
            else {
                continue;
            };
            let Some(m) = st
                .msgs
                .get_mut(&(src, self.me, tag))
                .and_then(VecDeque::pop_front)
            else {
                continue;
            };
            if m.len() > cap {
                let e = format!(
                    "data plane: member {} sent {} bytes on tag {tag} to member {}, which posted a receive of {cap}",
                    src, m.len(), self.me
                );
                st.dead = Some(e.clone());
                return Err(PlaneError(e));
            }
            // SAFETY: the receive's buffer holds `cap >= m.len()` bytes and stays valid and
            // untouched until the request completes (trait contract); this thread owns it.
            unsafe { std::ptr::copy_nonoverlapping(m.as_ptr(), buf, m.len()) };
            reqs[i] = Some(Pending::Done);
        }
        Ok(())
    }
}

impl DataPlane for FakePlane {
    fn rank(&self) -> usize {
        self.me
    }
    fn size(&self) -> usize {
        self.shared.n
    }

    fn min_u64(&self, mine: u64) -> Result<u64, PlaneError> {
        let mut all = vec![0u8; 8 * self.shared.n];
        let b = mine.to_le_bytes();
        // SAFETY: `b` and `all` live until the request completed or failed (we wait here).
        let r = unsafe { self.iallgather(b.as_ptr(), 8, all.as_mut_ptr())? };
        super::wait(self, r)?;
        Ok(all
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .min()
            .unwrap_or(u64::MAX))
    }

    unsafe fn iallgather(
        &self,
        send: *const u8,
        len: usize,
        recv: *mut u8,
    ) -> Result<Req, PlaneError> {
        // SAFETY: the caller's `send` holds `len` bytes (trait contract).
        let mine = unsafe { std::slice::from_raw_parts(send, len) }.to_vec();
        self.collective(mine, Kind::Gather { len }, recv)
    }

    unsafe fn iallgatherv(
        &self,
        send: *const u8,
        counts: &[i32],
        displs: &[i32],
        recv: *mut u8,
    ) -> Result<Req, PlaneError> {
        let n = counts[self.me] as usize;
        let mine = if n == 0 || send.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller's `send` holds counts[me] bytes (trait contract).
            unsafe { std::slice::from_raw_parts(send, n) }.to_vec()
        };
        let kind = Kind::Gatherv {
            counts: counts.to_vec(),
            displs: displs.to_vec(),
        };
        self.collective(mine, kind, recv)
    }

    unsafe fn ibcast(&self, buf: *mut u8, len: usize, root: usize) -> Result<Req, PlaneError> {
        let mine = if self.me == root {
            // SAFETY: the caller's `buf` holds `len` bytes (trait contract).
            unsafe { std::slice::from_raw_parts(buf, len) }.to_vec()
        } else {
            Vec::new()
        };
        self.collective(mine, Kind::Bcast { len, root }, buf)
    }

    unsafe fn isend(
        &self,
        buf: *const u8,
        len: usize,
        dest: usize,
        tag: i32,
    ) -> Result<Req, PlaneError> {
        assert!(
            dest < self.shared.n,
            "isend to member {dest} of {}",
            self.shared.n
        );
        let mut st = self.state();
        self.op(&mut st)?;
        // SAFETY: the caller's `buf` holds `len` bytes (trait contract); copied now (eager send).
        let mut m = unsafe { std::slice::from_raw_parts(buf, len) }.to_vec();
        if self.damage_now(&mut st, len) {
            *m.last_mut().unwrap() ^= 0x01;
        }
        st.msgs
            .entry((self.me, dest, tag))
            .or_default()
            .push_back(m);
        drop(st);
        Ok(self.add(Pending::Done))
    }

    unsafe fn irecv(
        &self,
        buf: *mut u8,
        cap: usize,
        src: usize,
        tag: i32,
    ) -> Result<Req, PlaneError> {
        assert!(
            src < self.shared.n,
            "irecv from member {src} of {}",
            self.shared.n
        );
        let mut st = self.state();
        self.op(&mut st)?;
        drop(st);
        let order = self.order.get();
        self.order.set(order + 1);
        Ok(self.add(Pending::Recv {
            buf,
            cap,
            src,
            tag,
            order,
        }))
    }

    fn test_some(&self, reqs: &[Req]) -> Result<Vec<bool>, PlaneError> {
        self.turns.fetch_add(1, Ordering::Relaxed);
        reqs.iter().map(|r| self.test(*r)).collect()
    }

    fn test(&self, req: Req) -> Result<bool, PlaneError> {
        let mut st = self.state();
        let finish = |me: &Self, done: bool| {
            if done {
                me.reqs.borrow_mut()[req.0] = None;
            }
        };
        if matches!(self.reqs.borrow()[req.0], Some(Pending::Done)) {
            finish(self, true);
            return Ok(true);
        }
        if let Some(d) = st.dead.clone() {
            finish(self, true);
            return Err(PlaneError(d));
        }
        let coll = match &self.reqs.borrow()[req.0] {
            Some(Pending::Recv { .. }) => None,
            Some(Pending::Coll { seq, .. }) => Some(*seq),
            Some(Pending::Done) => unreachable!("handled above"),
            None => panic!("data plane: request {} tested after it completed", req.0),
        };
        let Some(seq) = coll else {
            if let Err(e) = self.match_receives(&mut st) {
                finish(self, true);
                return Err(e);
            }
            let done = matches!(self.reqs.borrow()[req.0], Some(Pending::Done));
            finish(self, done);
            return Ok(done);
        };
        let n = self.shared.n;
        let c = st.colls.get_mut(&seq).expect("a posted collective");
        if c.arrived < n {
            return Ok(false);
        }
        let reqs = self.reqs.borrow();
        let Some(Pending::Coll { kind, recv, .. }) = &reqs[req.0] else {
            unreachable!()
        };
        let mut parts: Vec<std::borrow::Cow<[u8]>> = c
            .contrib
            .iter()
            .map(|p| std::borrow::Cow::Borrowed(p.as_deref().unwrap_or(&[])))
            .collect();
        if let Some(d) = c.damaged.filter(|&d| d != self.me) {
            let mut v = parts[d].to_vec();
            *v.last_mut().unwrap() ^= 0x01;
            parts[d] = std::borrow::Cow::Owned(v);
        }
        let mismatch = |what: &str| {
            PlaneError(format!(
                "data plane: collective {seq} on member {}: {what}",
                self.me
            ))
        };
        // SAFETY (each copy below): `recv` is the caller's receive buffer, valid for the sizes the
        // trait contract states (len × n; every displs[k] + counts[k]; len), until completion.
        let r = match kind {
            Kind::Gather { len } => {
                if parts.iter().any(|p| p.len() != *len) {
                    Err(mismatch(
                        "members passed different lengths to an all-gather",
                    ))
                } else {
                    for (k, p) in parts.iter().enumerate() {
                        unsafe {
                            std::ptr::copy_nonoverlapping(p.as_ptr(), recv.add(k * len), *len)
                        };
                    }
                    Ok(())
                }
            }
            Kind::Gatherv { counts, displs } => {
                if parts
                    .iter()
                    .zip(counts)
                    .any(|(p, &c)| p.len() != c as usize)
                {
                    Err(mismatch(
                        "a member sent another count than the others expect",
                    ))
                } else {
                    for (k, p) in parts.iter().enumerate() {
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                p.as_ptr(),
                                recv.add(displs[k] as usize),
                                p.len(),
                            )
                        };
                    }
                    Ok(())
                }
            }
            Kind::Bcast { len, root } => {
                if parts[*root].len() != *len {
                    Err(mismatch("the root broadcast another length"))
                } else {
                    if self.me != *root {
                        unsafe {
                            std::ptr::copy_nonoverlapping(parts[*root].as_ptr(), *recv, *len)
                        };
                    }
                    Ok(())
                }
            }
        };
        drop(reqs);
        c.picked += 1;
        if c.picked == n {
            st.colls.remove(&seq);
        }
        if let Err(e) = &r {
            st.dead = Some(e.0.clone());
        }
        finish(self, true);
        r.map(|()| true)
    }

    fn cancel(&self, req: Req) {
        let mut reqs = self.reqs.borrow_mut();
        if matches!(reqs[req.0], Some(Pending::Recv { .. })) {
            reqs[req.0] = Some(Pending::Done);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::wait;
    use super::*;

    fn run<T: Send>(n: usize, faults: Faults, f: impl Fn(FakePlane) -> T + Sync) -> Vec<T> {
        let planes = group(n, faults);
        std::thread::scope(|s| {
            let hs: Vec<_> = planes.into_iter().map(|p| s.spawn(|| f(p))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn receives_match_in_posting_order_whichever_is_tested_first() {
        let out = run(2, Faults::default(), |p| {
            if p.rank() == 0 {
                for i in 0..3u8 {
                    let b = [i; 5];
                    let r = unsafe { p.isend(b.as_ptr(), 5, 1, 7) }.unwrap();
                    wait(&p, r).unwrap();
                }
                vec![]
            } else {
                let mut bufs = [[9u8; 5]; 3];
                let rs: Vec<Req> = bufs
                    .iter_mut()
                    .map(|b| unsafe { p.irecv(b.as_mut_ptr(), 5, 0, 7) }.unwrap())
                    .collect();
                for &r in rs.iter().rev() {
                    wait(&p, r).unwrap();
                }
                bufs.iter().map(|b| b[0]).collect()
            }
        });
        assert_eq!(out[1], vec![0, 1, 2]);
    }

    #[test]
    fn collectives_gather_broadcast_and_reduce() {
        let out = run(3, Faults::default(), |p| {
            let all = p.all_gather_byte(p.rank() as u8 + 10).unwrap();
            let mut b = vec![p.rank() as u8; 4];
            p.bcast(&mut b, 2).unwrap();
            let m = p.min_u64(100 - p.rank() as u64).unwrap();
            (all, b, m)
        });
        for (all, b, m) in out {
            assert_eq!(all, vec![10, 11, 12]);
            assert_eq!(b, vec![2; 4]);
            assert_eq!(m, 98);
        }
    }

    #[test]
    fn a_dead_member_fails_everyone_without_hanging() {
        let out = run(
            3,
            Faults {
                die: Some((1, 2)),
                damage_from: None,
            },
            |p| (0..10).try_for_each(|_| p.all_gather_byte(1).map(|_| ())),
        );
        for o in out {
            let e = o.unwrap_err();
            assert!(e.0.contains("member 1 died"), "{e}");
        }
    }

    #[test]
    fn a_truncating_receive_is_an_error_not_a_overflow() {
        let out = run(2, Faults::default(), |p| {
            if p.rank() == 0 {
                let b = [1u8; 16];
                let r = unsafe { p.isend(b.as_ptr(), 16, 1, 1) }.unwrap();
                wait(&p, r)
            } else {
                let mut b = [0u8; 8];
                let r = unsafe { p.irecv(b.as_mut_ptr(), 8, 0, 1) }.unwrap();
                wait(&p, r)
            }
        });
        assert!(out[1]
            .as_ref()
            .unwrap_err()
            .0
            .contains("posted a receive of 8"));
    }
}
