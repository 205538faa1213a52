//! The stall watchdog: a dead or hung peer must become an error in bounded time.
//!
//! The engine calls [`touch`] whenever something moves (a request completes, bytes are read or
//! written). A background thread, armed for the duration of a collective copy, checks four times a
//! second; when nothing moved for the stall timeout it disarms and hands a [`Stall`] (this node and
//! rank, the phase, how long nothing moved) to the callback the program installed with
//! [`on_stall`]. The library itself never ends the process: the `sw-pool` binary's callback removes
//! every registered temporary file and directory, prints one message and exits with status 8
//! (Collective), so that the launcher (mpirun, srun) tears down the other ranks, whose SIGTERM
//! handler removes their temporaries too. Without a callback a stall is logged as an error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static LAST: AtomicU64 = AtomicU64::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);
static STARTED: AtomicBool = AtomicBool::new(false);
static PHASE: Mutex<&'static str> = Mutex::new("start");
static WHO: Mutex<String> = Mutex::new(String::new());
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(120_000);

/// Tests that arm the watchdog or run the engine take this lock: the watchdog is one per process.
#[cfg(test)]
pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

fn epoch() -> Instant {
    use std::sync::OnceLock;
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// What the watchdog saw when it fired.
#[derive(Debug, Clone)]
pub struct Stall {
    /// This node and rank (as given to [`arm`]).
    pub who: String,
    /// The phase nothing moved in.
    pub phase: &'static str,
    /// How long nothing moved (the stall timeout).
    pub idle: Duration,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: no progress for {:.0} s during {}: a peer node or rank probably died or hangs. Check \
             the other ranks' messages and the launcher's report; raise SW_POOL_STALL_TIMEOUT if the \
             storage or network is just very slow",
            self.who,
            self.idle.as_secs_f64(),
            self.phase
        )
    }
}

static ON_STALL: std::sync::OnceLock<fn(&Stall)> = std::sync::OnceLock::new();

/// What the program does when the watchdog fires (once per process; the first call wins).
pub fn on_stall(f: fn(&Stall)) {
    let _ = ON_STALL.set(f);
}

/// Record progress.
pub fn touch() {
    LAST.store(now_ms(), Ordering::Relaxed);
}

/// The stall timeout when `SW_POOL_STALL_TIMEOUT` does not set one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The stall timeout: `SW_POOL_STALL_TIMEOUT` in `env` (seconds), else [`DEFAULT_TIMEOUT`].
pub fn default_timeout(env: &crate::config::Environment) -> Duration {
    env.get(crate::config::EnvVar::StallTimeout)
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|&s| s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_TIMEOUT)
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
            ARMED.store(false, Ordering::SeqCst);
            let stall = Stall {
                who: WHO.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                phase: *PHASE.lock().unwrap_or_else(|e| e.into_inner()),
                idle: Duration::from_millis(limit),
            };
            match ON_STALL.get() {
                Some(f) => f(&stall),
                None => tracing::error!("{stall}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static SEEN: Mutex<Option<(String, &'static str)>> = Mutex::new(None);

    /// A stall reaches the program's callback (the library does not end the process) and disarms.
    #[test]
    fn a_stall_calls_the_callback_once_and_disarms() {
        let _one = TEST_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        on_stall(|s| *SEEN.lock().unwrap() = Some((s.who.clone(), s.phase)));
        let _armed = arm("node9 rank 3".into(), Duration::from_millis(100));
        let _p = phase("testing");
        std::thread::sleep(Duration::from_millis(900));
        let seen = SEEN.lock().unwrap().clone();
        assert_eq!(seen, Some(("node9 rank 3".to_string(), "testing")));
        assert!(!ARMED.load(Ordering::SeqCst), "disarmed after firing");
    }
}
