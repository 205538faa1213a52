//! Ending processes: the one place sw-pool signals a process.
//!
//! Only processes sw-pool started (its children, [`crate::exec`]) or proved to be its own (a FUSE
//! helper of the user's mount: [`is_our_helper`]) are signalled, never PID 0, 1 or sw-pool itself.
//! [`terminate`] is the one way to end one: SIGTERM, a grace period, then SIGKILL.

use std::path::Path;
use std::time::{Duration, Instant};

pub use rustix::process::Signal;

/// Send `sig` to `pid`. `Ok(false)`: no such process (it is gone). Refuses PID ≤ 1 and ourselves.
pub fn signal(pid: u32, sig: Signal) -> Result<bool, String> {
    if pid <= 1 || pid == std::process::id() {
        return Err(format!("refusing to signal pid {pid}"));
    }
    let p = rustix::process::Pid::from_raw(pid as i32).ok_or("pid 0")?;
    match rustix::process::kill_process(p, sig) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(format!("kill -{sig:?} {pid}: {e}")),
    }
}

/// Pass the signal numbered `sig` on to `pid` (a process sw-pool started: an environment's
/// command, its pid 1); `false` if it was not sent (no such process, or a refused pid or signal).
/// Refuses PID ≤ 1 and ourselves, as [`signal`] does; allocates nothing and takes no lock, so a
/// signal handler may call it.
pub fn forward(pid: u32, sig: i32) -> bool {
    if pid <= 1 || pid > i32::MAX as u32 || pid == std::process::id() {
        return false;
    }
    // SAFETY: kill(2) touches no memory of ours; both numbers are checked by the kernel
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}

/// SIGTERM; then up to `grace` for `gone()` to say it ended (polled every 20 ms); then SIGKILL.
/// `gone` reaps the process when it is our child, else looks at `/proc` ([`ended`]).
pub fn terminate(pid: u32, grace: Duration, gone: &mut dyn FnMut() -> bool) -> Result<(), String> {
    if !signal(pid, Signal::Term)? {
        return Ok(());
    }
    let t = Instant::now();
    while t.elapsed() < grace {
        if gone() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(pid, Signal::Kill).map(drop)
}

/// Does a process with this pid exist (PID ≤ 1 never counts)?
pub fn alive(pid: u32) -> bool {
    pid > 1 && Path::new(&format!("/proc/{pid}")).exists()
}

/// Has `pid` exited (gone, or a zombie its parent has not reaped)?
pub fn ended(pid: u32) -> bool {
    !alive(pid) || zombie(pid)
}

/// When `pid` started, in clock ticks after boot (field 22 of `/proc/PID/stat`): with the pid, an
/// identity of the process that a recycled pid does not share.
pub fn start_ticks(pid: u32) -> Option<u64> {
    start_ticks_of(&stat(pid)?)
}

/// [`start_ticks`] from the text of a `/proc/PID/stat`.
pub fn start_ticks_of(stat: &str) -> Option<u64> {
    // field 22 is the 20th from the state (field 3)
    fields_from_state(stat)?.split(' ').nth(19)?.parse().ok()
}

/// Is `pid` a zombie (ended, not yet reaped by its parent)?
pub fn zombie(pid: u32) -> bool {
    stat(pid)
        .as_deref()
        .and_then(fields_from_state)
        .is_some_and(|r| r.starts_with('Z'))
}

fn stat(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()
}

/// The fields of a `/proc/PID/stat` from the state (field 3) on: the command name before it, in
/// parentheses, may hold spaces and parentheses itself, so they begin after its last `) `.
fn fields_from_state(stat: &str) -> Option<&str> {
    stat.rsplit_once(") ").map(|(_, rest)| rest)
}

/// Is `pid` a FUSE helper of ours for `mp`: owned by `uid`, a helper sw-pool starts, with the mount
/// point on its command line? (A recycled PID fails at least one of these.)
pub fn is_our_helper(pid: u32, uid: u32, mp: &Path) -> bool {
    if pid <= 1 || pid == std::process::id() {
        return false;
    }
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    if crate::proc::status_uids(&status).first() != Some(&uid) {
        return false;
    }
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    use std::os::unix::ffi::OsStrExt;
    let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
    let prog = args
        .first()
        .map(|a| Path::new(std::ffi::OsStr::from_bytes(a)))
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let helper = matches!(
        prog.as_str(),
        "squashfuse_ll" | "squashfuse" | "fuse2fs" | "fusermount3" | "sw-pool-serve"
    );
    let mpb = mp.as_os_str().as_bytes();
    helper && args.contains(&mpb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_ticks_count_fields_after_the_last_parenthesis() {
        let stat =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1 2 3";
        assert_eq!(start_ticks_of(stat), Some(987654));
        assert_eq!(start_ticks_of("4242 (x) S 1"), None);
        assert_eq!(start_ticks_of("garbage"), None);
        // this process: a value, the same twice
        let me = std::process::id();
        assert!(start_ticks(me).is_some());
        assert_eq!(start_ticks(me), start_ticks(me));
    }

    #[test]
    fn refuses_init_zero_and_itself() {
        for pid in [0, 1, std::process::id()] {
            assert!(signal(pid, Signal::Term).is_err(), "{pid}");
            assert!(
                terminate(pid, Duration::ZERO, &mut || true).is_err(),
                "{pid}"
            );
            assert!(!forward(pid, libc::SIGCONT), "{pid}");
        }
    }

    #[test]
    fn terminates_a_child_that_ignores_sigterm() {
        let mut c = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM; sleep 30"])
            .spawn()
            .unwrap();
        let pid = c.id();
        std::thread::sleep(Duration::from_millis(100)); // the trap is set
        let t = Instant::now();
        terminate(pid, Duration::from_millis(300), &mut || {
            matches!(c.try_wait(), Ok(Some(_)))
        })
        .unwrap();
        let st = c.wait().unwrap();
        assert!(t.elapsed() < Duration::from_secs(5));
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(9), "SIGKILL after the grace period");
        assert!(!is_our_helper(pid, 0, Path::new("/x")));
    }
}
