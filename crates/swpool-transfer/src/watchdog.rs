//! The stall watchdog: a dead or hung peer must become an error in bounded time.
//!
//! A [`Watchdog`] is a value: each collective job ([`crate::collective::Collective::watchdog`])
//! has its own, and everything that moves for that job (a request completes, bytes are read or
//! written, an agreement arrives) calls [`Watchdog::touch`] on it. While it is armed
//! ([`Watchdog::arm`], for the duration of a copy or a final barrier) a thread checks four times a
//! second; when nothing moved for the stall timeout it disarms and hands a [`Stall`] (this node and
//! rank, the phase, how long nothing moved) to the value's callback. The library never ends the
//! process: the `sw-pool` binary installs its callback with [`on_stall`] (every
//! [`Watchdog::default`] then uses it): it removes every registered temporary file and directory,
//! prints one message and exits with status 8 (Collective), so that the launcher (mpirun, srun)
//! tears down the other ranks, whose SIGTERM handler removes their temporaries too. A long-lived
//! server gives each request a [`Watchdog::new`] with its own callback; without any callback a
//! stall is logged as an error.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

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

/// The program's callback for [`Watchdog::default`] (once per process; the first call wins).
static ON_STALL: OnceLock<fn(&Stall)> = OnceLock::new();

/// What the program does when a default watchdog fires (once per process; the first call wins).
pub fn on_stall(f: fn(&Stall)) {
    let _ = ON_STALL.set(f);
}

type Callback = Box<dyn Fn(&Stall) + Send + Sync>;

struct Inner {
    epoch: Instant,
    /// Milliseconds since `epoch` of the last progress.
    last: AtomicU64,
    armed: AtomicBool,
    /// Arms so far: a monitor thread watches one arming only.
    generation: AtomicU64,
    timeout_ms: AtomicU64,
    phase: Mutex<&'static str>,
    who: Mutex<String>,
    on_stall: Callback,
}

/// The stall watchdog of one job (see the module's documentation). Clones share it.
#[derive(Clone)]
pub struct Watchdog(Arc<Inner>);

impl std::fmt::Debug for Watchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("armed", &self.0.armed.load(Ordering::Relaxed))
            .field(
                "phase",
                &*self.0.phase.lock().unwrap_or_else(|e| e.into_inner()),
            )
            .finish()
    }
}

impl Default for Watchdog {
    /// A watchdog that calls the program's [`on_stall`] callback (or logs the stall).
    fn default() -> Watchdog {
        Watchdog::new(|s: &Stall| match ON_STALL.get() {
            Some(f) => f(s),
            None => tracing::error!("{s}"),
        })
    }
}

impl Watchdog {
    /// A watchdog with its own callback.
    pub fn new(on_stall: impl Fn(&Stall) + Send + Sync + 'static) -> Watchdog {
        Watchdog(Arc::new(Inner {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            timeout_ms: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
            phase: Mutex::new("start"),
            who: Mutex::new(String::new()),
            on_stall: Box::new(on_stall),
        }))
    }

    fn now_ms(&self) -> u64 {
        self.0.epoch.elapsed().as_millis() as u64
    }

    /// Record progress.
    pub fn touch(&self) {
        self.0.last.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Name the current phase (for the timeout message); the previous name comes back on drop.
    pub fn phase(&self, name: &'static str) -> PhaseGuard {
        let prev = std::mem::replace(
            &mut *self.0.phase.lock().unwrap_or_else(|e| e.into_inner()),
            name,
        );
        self.touch();
        PhaseGuard(self.clone(), prev)
    }

    /// Arm until the guard is dropped: `who` names this node and rank in the stall's message.
    pub fn arm(&self, who: String, timeout: Duration) -> ArmGuard {
        *self.0.who.lock().unwrap_or_else(|e| e.into_inner()) = who;
        self.0
            .timeout_ms
            .store(timeout.as_millis().max(1) as u64, Ordering::Relaxed);
        self.touch();
        let generation = self.0.generation.fetch_add(1, Ordering::SeqCst) + 1;
        self.0.armed.store(true, Ordering::SeqCst);
        let weak = Arc::downgrade(&self.0);
        std::thread::Builder::new()
            .name("sw-pool-watchdog".into())
            .spawn(move || monitor(weak, generation))
            .ok();
        ArmGuard(self.clone())
    }

    /// Is it armed (not yet fired, not disarmed)?
    pub fn is_armed(&self) -> bool {
        self.0.armed.load(Ordering::SeqCst)
    }
}

/// Watches one arming of a watchdog; ends when it is disarmed, re-armed or dropped.
fn monitor(w: std::sync::Weak<Inner>, generation: u64) {
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let Some(inner) = w.upgrade() else { return };
        if !inner.armed.load(Ordering::SeqCst)
            || inner.generation.load(Ordering::SeqCst) != generation
        {
            return;
        }
        let wd = Watchdog(inner);
        let idle = wd
            .now_ms()
            .saturating_sub(wd.0.last.load(Ordering::Relaxed));
        let limit = wd.0.timeout_ms.load(Ordering::Relaxed);
        if idle >= limit {
            wd.0.armed.store(false, Ordering::SeqCst);
            let stall = Stall {
                who: wd.0.who.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                phase: *wd.0.phase.lock().unwrap_or_else(|e| e.into_inner()),
                idle: Duration::from_millis(limit),
            };
            (wd.0.on_stall)(&stall);
            return;
        }
    }
}

pub struct PhaseGuard(Watchdog, &'static str);

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        *self.0 .0.phase.lock().unwrap_or_else(|e| e.into_inner()) = self.1;
        self.0.touch();
    }
}

pub struct ArmGuard(Watchdog);

impl Drop for ArmGuard {
    fn drop(&mut self) {
        self.0 .0.armed.store(false, Ordering::SeqCst);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A stall reaches the watchdog's callback (the library does not end the process) once, and
    /// disarms; another watchdog of the same process is not disturbed.
    #[test]
    fn a_stall_calls_the_callback_once_and_disarms() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        let w = Watchdog::new(move |s| s2.lock().unwrap().push((s.who.clone(), s.phase)));
        let quiet = Watchdog::new(|_| panic!("this one never stalls"));
        let _q = quiet.arm("other".into(), Duration::from_secs(60));
        let _armed = w.arm("node9 rank 3".into(), Duration::from_millis(100));
        let _p = w.phase("testing");
        let _qp = quiet.phase("elsewhere");
        std::thread::sleep(Duration::from_millis(900));
        assert_eq!(
            *seen.lock().unwrap(),
            [("node9 rank 3".to_string(), "testing")]
        );
        assert!(!w.is_armed(), "disarmed after firing");
        assert!(quiet.is_armed());
    }

    #[test]
    fn progress_keeps_it_quiet() {
        let w = Watchdog::new(|_| panic!("no stall while things move"));
        let _a = w.arm("n".into(), Duration::from_millis(300));
        for _ in 0..12 {
            std::thread::sleep(Duration::from_millis(60));
            w.touch();
        }
        assert!(w.is_armed());
    }
}
