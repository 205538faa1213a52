//! The stall watchdog: a dead or hung peer must become an error in bounded time.
//!
//! The engine calls [`touch`] whenever something moves (a request completes, bytes are read or
//! written). A background thread, armed for the duration of a collective copy, checks once a
//! second; when nothing moved for the stall timeout it prints one message naming this node, the
//! rank and the phase, removes every registered temporary file and directory, and exits with
//! status 8 (Collective). Exiting without `MPI_Finalize` makes the launcher (mpirun, srun) tear down
//! the other ranks, whose SIGTERM handler removes their temporaries too; ranks that are not torn
//! down time out the same way on their own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static LAST: AtomicU64 = AtomicU64::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);
static STARTED: AtomicBool = AtomicBool::new(false);
static PHASE: Mutex<&'static str> = Mutex::new("start");
static WHO: Mutex<String> = Mutex::new(String::new());
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(120_000);

fn epoch() -> Instant {
    use std::sync::OnceLock;
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// Record progress.
pub fn touch() {
    LAST.store(now_ms(), Ordering::Relaxed);
}

/// Default stall timeout: `SW_POOL_STALL_TIMEOUT` (seconds) or 120 s.
pub fn default_timeout() -> Duration {
    crate::config::EnvVar::StallTimeout
        .get()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|&s| s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(Duration::from_secs(120))
}

/// Name the current phase (for the timeout message); the previous name comes back on drop.
pub fn phase(name: &'static str) -> PhaseGuard {
    let prev = std::mem::replace(&mut *PHASE.lock().unwrap_or_else(|e| e.into_inner()), name);
    touch();
    PhaseGuard(prev)
}

pub struct PhaseGuard(&'static str);

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        *PHASE.lock().unwrap_or_else(|e| e.into_inner()) = self.0;
        touch();
    }
}

/// Arm the watchdog until the guard is dropped.
pub fn arm(who: String, timeout: Duration) -> ArmGuard {
    *WHO.lock().unwrap_or_else(|e| e.into_inner()) = who;
    TIMEOUT_MS.store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
    touch();
    ARMED.store(true, Ordering::SeqCst);
    if !STARTED.swap(true, Ordering::SeqCst) {
        std::thread::Builder::new()
            .name("sw-pool-watchdog".into())
            .spawn(run)
            .ok();
    }
    ArmGuard
}

pub struct ArmGuard;

impl Drop for ArmGuard {
    fn drop(&mut self) {
        ARMED.store(false, Ordering::SeqCst);
    }
}

fn run() {
    loop {
        std::thread::sleep(Duration::from_millis(250));
        if !ARMED.load(Ordering::SeqCst) {
            continue;
        }
        let idle = now_ms().saturating_sub(LAST.load(Ordering::Relaxed));
        let limit = TIMEOUT_MS.load(Ordering::Relaxed);
        if idle >= limit {
            let phase = *PHASE.lock().unwrap_or_else(|e| e.into_inner());
            let who = WHO.lock().unwrap_or_else(|e| e.into_inner()).clone();
            crate::atomic::remove_all_registered();
            eprintln!(
                "sw-pool: error: {who}: no progress for {:.0} s during {phase}: a peer node or rank \
                 probably died or hangs; temporary files removed on this node. Check the other \
                 ranks' messages and the launcher's report; raise SW_POOL_STALL_TIMEOUT if the \
                 storage or network is just very slow",
                limit as f64 / 1000.0
            );
            std::process::exit(swpool_format::status::ExitStatus::Collective.code());
        }
    }
}
