//! One line to syslog (facility daemon, tag `sw-pool`): what root-run hooks and squat warnings leave
//! for the admin.

/// Send one line to syslog (facility daemon, `sw-pool[pid]`), where journald or rsyslog keep it.
/// Without a syslog socket it is dropped silently, like `logger`'s lines on such a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Notice,
    Warning,
    Error,
}

pub fn syslog(level: Level, msg: &str) {
    let priority = match level {
        Level::Notice => libc::LOG_NOTICE,
        Level::Warning => libc::LOG_WARNING,
        Level::Error => libc::LOG_ERR,
    };
    use std::sync::Once;
    static OPEN: Once = Once::new();
    OPEN.call_once(|| {
        // SAFETY: the ident is a static C string; openlog keeps the pointer
        // SAFETY: the ident is a 'static C string literal, as openlog requires (it keeps the pointer).
        unsafe { libc::openlog(c"sw-pool".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) };
    });
    let clean: String = msg
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if let Ok(c) = std::ffi::CString::new(clean) {
        // SAFETY: a constant "%s" format with one C string argument
        // SAFETY: a constant "%s" format with one NUL-terminated argument that lives across the call.
        unsafe { libc::syslog(priority, c"%s".as_ptr(), c.as_ptr()) };
    }
}
