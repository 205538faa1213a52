//! The one runner for external tools.
//!
//! Every program sw-pool calls is named in [`Tool`] (an allow-list). Programs are looked up in a fixed
//! list of system directories when running as root, and in `PATH` first otherwise (so that a user may
//! bring a newer squashfuse). This crate reads no environment variable: the caller passes the value
//! of `PATH` it read (sw-pool's configuration layer, `swpool_core::config::Environment`), or `None`. The full command line is logged at debug level, stdin is closed, stderr
//! is kept in the error. User paths are passed as absolute paths (so they can never be read as
//! options) and after `--` where the tool understands it.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use swpool_format::status::ExitStatus;

pub use swpool_format::show::{show, Shown};

static CHILDREN: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Set (under the `CHILDREN` lock) once the signal handler started terminating our tools: from
/// then on no helper can be released to outlive us (see [`release`]).
static TERMINATING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Send SIGTERM to every tool this process started that is still running (from the signal handler
/// thread: an interrupted sw-pool leaves no mke2fs or mksquashfs behind). Only our own children.
/// Holds the list's lock while signalling, so that a helper is either released before (and never
/// signalled) or refused its release after (and cleaned up by the code that started it) — never
/// signalled after its mount was recorded.
pub fn terminate_children() {
    let Ok(l) = CHILDREN.lock() else { return };
    TERMINATING.store(true, std::sync::atomic::Ordering::SeqCst);
    for &pid in l.iter() {
        let _ = crate::process::signal(pid, crate::process::Signal::Term);
    }
}

pub(crate) fn track(pid: u32, on: bool) {
    if let Ok(mut l) = CHILDREN.lock() {
        if on {
            l.push(pid);
        } else {
            l.retain(|&p| p != pid);
        }
    }
}

/// Stop tracking a helper that must outlive us: `false` when an interrupt already signalled it
/// (the caller then undoes its mount instead of recording it).
pub(crate) fn release(pid: u32) -> bool {
    let Ok(mut l) = CHILDREN.lock() else {
        return false;
    };
    if TERMINATING.load(std::sync::atomic::Ordering::SeqCst) {
        return false;
    }
    l.retain(|&p| p != pid);
    true
}

/// Directories searched for tools when running as root (never the user's `PATH`).
pub const SYSTEM_DIRS: &[&str] = &["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// The external programs sw-pool may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tool {
    Mke2fs,
    E2fsck,
    Dumpe2fs,
    /// `sw-pool inspect`: `ncheck` names an ext image's setuid files and device nodes.
    Debugfs,
    /// `sw-pool image resize`: grows or shrinks a user image offline.
    Resize2fs,
    Mksquashfs,
    Unsquashfs,
    SquashfuseLl,
    Squashfuse,
    Fuse2fs,
    Fusermount3,
    Umount,
    Openssl,
    Logger,
    Srun,
    /// `sw-pool bundle`: rewrites DT_NEEDED / DT_RUNPATH of bundled objects.
    Patchelf,
    /// `sw-pool bundle --trace`: records every file the traced command opens.
    Strace,
    /// `sw-pool bundle`: `ldconfig -p` lists the loader's cache.
    Ldconfig,
    /// `sw-pool bundle`: `ld.so --help` names the default directories and hwcap subdirectories.
    LdSo,
    /// `sw-pool bundle --python`: the interpreter's module search path.
    Python3,
    /// `sw-pool run/shell --layer` without the site's helper: the rootless writable overlay.
    FuseOverlayfs,
    /// `sudo -n sw-pool-mount-helper …`: the site's privileged mount helper.
    Sudo,
    /// The site's mount helper run directly by root (the Slurm epilog's `cleanup --job-id`).
    MountHelper,
    /// Mkfs.erofs: `build --format erofs`.
    MkfsErofs,
    /// Fsck.erofs: `inspect --check` of an EROFS pool.
    FsckErofs,
    /// `sw-pool-serve`: the verifying chunk server (`mount --in-place`), beside sw-pool.
    ChunkServer,
    /// `sw-pool run --keep-upper` across file systems: `cp -a` keeps modes, times and whiteouts.
    Cp,
}

impl Tool {
    pub fn program(self) -> &'static str {
        match self {
            Tool::Mke2fs => "mke2fs",
            Tool::E2fsck => "e2fsck",
            Tool::Dumpe2fs => "dumpe2fs",
            Tool::Debugfs => "debugfs",
            Tool::Resize2fs => "resize2fs",
            Tool::Mksquashfs => "mksquashfs",
            Tool::Unsquashfs => "unsquashfs",
            Tool::SquashfuseLl => "squashfuse_ll",
            Tool::Squashfuse => "squashfuse",
            Tool::Fuse2fs => "fuse2fs",
            Tool::Fusermount3 => "fusermount3",
            Tool::Umount => "umount",
            Tool::Openssl => "openssl",
            Tool::Logger => "logger",
            Tool::Srun => "srun",
            Tool::Patchelf => "patchelf",
            Tool::Strace => "strace",
            Tool::Ldconfig => "ldconfig",
            Tool::LdSo => "ld.so",
            Tool::Python3 => "python3",
            Tool::FuseOverlayfs => "fuse-overlayfs",
            Tool::Sudo => "sudo",
            Tool::MountHelper => "sw-pool-mount-helper",
            Tool::MkfsErofs => "mkfs.erofs",
            Tool::FsckErofs => "fsck.erofs",
            Tool::ChunkServer => "sw-pool-serve",
            Tool::Cp => "cp",
        }
    }

    /// The Debian package that provides the tool (for the "how to fix" hint).
    pub fn package(self) -> &'static str {
        match self {
            Tool::Mke2fs | Tool::E2fsck | Tool::Dumpe2fs | Tool::Debugfs | Tool::Resize2fs => {
                "e2fsprogs"
            }
            Tool::Mksquashfs | Tool::Unsquashfs => "squashfs-tools",
            Tool::SquashfuseLl | Tool::Squashfuse => "squashfuse",
            Tool::Fuse2fs => "fuse2fs",
            Tool::Fusermount3 => "fuse3",
            Tool::Umount => "mount",
            Tool::Openssl => "openssl",
            Tool::Logger => "bsdutils",
            Tool::Srun => "slurm-client",
            Tool::Patchelf => "patchelf",
            Tool::Strace => "strace",
            Tool::Ldconfig | Tool::LdSo => "libc-bin",
            Tool::Python3 => "python3",
            Tool::FuseOverlayfs => "fuse-overlayfs",
            Tool::MountHelper | Tool::ChunkServer => "sw-pool",
            Tool::Sudo => "sudo",
            Tool::MkfsErofs | Tool::FsckErofs => "erofs-utils",
            Tool::Cp => "coreutils",
        }
    }

    /// Find the tool's executable: in the absolute directories of `path_var` (the value of `PATH`
    /// as the caller read it; ignored when running as root), then in [`SYSTEM_DIRS`].
    pub fn locate(self, path_var: Option<&OsStr>) -> Result<PathBuf, ExecError> {
        let name = self.program();
        let privileged = rustix::process::geteuid().is_root();
        let mut dirs: Vec<PathBuf> = Vec::new();
        if !privileged {
            if let Some(path) = path_var {
                dirs.extend(std::env::split_paths(path).filter(|p| p.is_absolute()));
            }
        }
        dirs.extend(SYSTEM_DIRS.iter().map(PathBuf::from));
        for d in &dirs {
            let candidate = d.join(name);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
        Err(ExecError::NotFound {
            tool: self,
            searched: dirs,
        })
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.program())
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{tool} is not installed (looked in {}); install the Debian package '{}' (`apt-get install {}`)",
        display_dirs(searched), tool.package(), tool.package())]
    NotFound { tool: Tool, searched: Vec<PathBuf> },
    #[error("could not start {cmdline}: {source}")]
    Spawn {
        cmdline: String,
        source: std::io::Error,
    },
    #[error(
        "{tool} failed ({status}): {}\n  command: {cmdline}",
        stderr_summary(stderr)
    )]
    Failed {
        tool: Tool,
        cmdline: String,
        status: String,
        stderr: String,
    },
    #[error("{tool} did not finish within {}s and was killed\n  command: {cmdline}", timeout.as_secs())]
    Timeout {
        tool: Tool,
        cmdline: String,
        timeout: Duration,
    },
}

impl ExecError {
    pub fn exit_status(&self) -> ExitStatus {
        ExitStatus::Tool
    }
    /// The tool's standard error, when it ran and failed.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            ExecError::Failed { stderr, .. } => Some(stderr),
            _ => None,
        }
    }

    /// Why the site's mount helper refused or failed: its own words (its standard error, without
    /// its name in front), else how running it failed.
    pub fn helper_reason(&self) -> String {
        self.stderr()
            .map(|s| {
                s.trim()
                    .trim_start_matches("sw-pool-mount-helper: ")
                    .to_string()
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| self.to_string())
    }
}

fn display_dirs(d: &[PathBuf]) -> String {
    d.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

fn stderr_summary(s: &str) -> String {
    let t = s.trim();
    if t.is_empty() {
        "no error output".to_string()
    } else {
        // keep the last lines: tools print the reason last
        let lines: Vec<&str> = t.lines().collect();
        let start = lines.len().saturating_sub(8);
        lines[start..].join("\n  ")
    }
}

/// What a finished tool printed.
#[derive(Debug)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// A command line for one allow-listed tool.
#[derive(Debug, Clone)]
pub struct ToolCommand {
    tool: Tool,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    env_remove: Vec<OsString>,
    timeout: Option<Duration>,
    program: Option<PathBuf>,
    /// Arguments that are tools, located when the command is ([`ToolCommand::then_run`]).
    located: Vec<(usize, Tool)>,
}

impl ToolCommand {
    pub fn new(tool: Tool) -> Self {
        ToolCommand {
            tool,
            program: None,
            args: Vec::new(),
            envs: Vec::new(),
            env_remove: Vec::new(),
            timeout: None,
            located: Vec::new(),
        }
    }

    pub fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(mut self, it: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(it.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// A user-supplied path: made absolute, so that it can never be taken for an option.
    pub fn path(mut self, p: impl AsRef<Path>) -> Self {
        self.args.push(absolute(p.as_ref()).into_os_string());
        self
    }

    /// `--`: the end of options, for tools whose parser understands it.
    pub fn end_of_options(self) -> Self {
        self.arg("--")
    }

    pub fn env(mut self, k: impl AsRef<OsStr>, v: impl AsRef<OsStr>) -> Self {
        self.envs
            .push((k.as_ref().to_os_string(), v.as_ref().to_os_string()));
        self
    }

    pub fn env_remove(mut self, k: impl AsRef<OsStr>) -> Self {
        self.env_remove.push(k.as_ref().to_os_string());
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    pub fn tool(&self) -> Tool {
        self.tool
    }

    /// Append `inner` as the command this one runs (a wrapper's `-- PROGRAM ARGS...`): its program
    /// is located when this command is ([`Tool::locate`]: never by a root caller's `PATH`), its
    /// environment changes are this command's.
    pub fn then_run(mut self, inner: ToolCommand) -> Self {
        match inner.program {
            Some(p) => self.args.push(p.into_os_string()),
            None => {
                self.located.push((self.args.len(), inner.tool));
                self.args.push(inner.tool.program().into());
            }
        }
        self.args.extend(inner.args);
        self.envs.extend(inner.envs);
        self.env_remove.extend(inner.env_remove);
        self
    }

    /// The arguments, as passed.
    pub fn arguments(&self) -> &[OsString] {
        &self.args
    }

    /// Run this executable in the tool's role instead of the one found on the search path (a
    /// user's own choice on the command line, e.g. `bundle --python=/sw/python/bin/python3`).
    pub fn program(mut self, p: impl AsRef<Path>) -> Self {
        self.program = Some(absolute(p.as_ref()));
        self
    }

    /// The command line as a shell would show it (for logs and errors).
    pub fn cmdline(&self) -> String {
        let prog = match &self.program {
            Some(p) => p.display().to_string(),
            None => self.tool.program().to_string(),
        };
        std::iter::once(prog)
            .chain(self.args.iter().map(|a| shell_quote(&a.to_string_lossy())))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A `std::process::Command` for the located program (for callers that supervise the child);
    /// `path_var` is the value of `PATH` to search ([`Tool::locate`]).
    pub fn command(&self, path_var: Option<&OsStr>) -> Result<Command, ExecError> {
        let program = match &self.program {
            Some(p) => p.clone(),
            None => self.tool.locate(path_var)?,
        };
        let mut c = Command::new(program);
        c.stdin(Stdio::null());
        for (i, a) in self.args.iter().enumerate() {
            match self.located.iter().find(|(k, _)| *k == i) {
                // the inner command of a wrapper: found here, like the wrapper itself
                Some((_, t)) => c.arg(t.locate(path_var)?),
                None => c.arg(a),
            };
        }
        for k in &self.env_remove {
            c.env_remove(k);
        }
        for (k, v) in &self.envs {
            c.env(k, v);
        }
        Ok(c)
    }

    /// Run to completion; a non-zero exit becomes [`ExecError::Failed`] with the tool's stderr.
    /// `path_var` is the value of `PATH` to search ([`Tool::locate`]).
    pub fn run(&self, path_var: Option<&OsStr>) -> Result<Output, ExecError> {
        let cmdline = self.cmdline();
        tracing::debug!(command = %cmdline, "running");
        let mut c = self.command(path_var)?;
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = c.spawn().map_err(|source| ExecError::Spawn {
            cmdline: cmdline.clone(),
            source,
        })?;
        let pid = child.id();
        track(pid, true);
        let waited = match self.timeout {
            None => child.wait_with_output().map_err(|source| ExecError::Spawn {
                cmdline: cmdline.clone(),
                source,
            }),
            Some(t) => match wait_bounded(child, t, usize::MAX) {
                Ok(ToolEnd::Done(out)) => Ok(out),
                Ok(ToolEnd::Killed(_)) => Err(ExecError::Timeout {
                    tool: self.tool,
                    cmdline: cmdline.clone(),
                    timeout: t,
                }),
                Err(source) => Err(ExecError::Spawn {
                    cmdline: cmdline.clone(),
                    source,
                }),
            },
        };
        track(pid, false); // reaped (or killed and reaped): never signal this pid again
        let out = waited?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() {
            tracing::debug!(command = %cmdline, status = %out.status, stderr = %stderr.trim(), "failed");
            return Err(ExecError::Failed {
                tool: self.tool,
                cmdline,
                status: out.status.to_string(),
                stderr,
            });
        }
        Ok(Output { stdout, stderr })
    }
}

/// How a bounded tool run ended.
#[derive(Debug)]
pub enum ToolEnd {
    Done(std::process::Output),
    /// Killed when its time was up.
    Killed(Duration),
}

/// Wait for `child` (its stdout and stderr piped by the caller) for at most `limit`, each pipe
/// drained on a thread of its own (a chatty tool never blocks on a full pipe) keeping at most
/// `keep` bytes of it; when its time is up it is killed with SIGKILL — by the PID of the child this
/// process started — and reaped, and the pipes' readers are not waited for (they end when the
/// tool, and anything it left holding its pipes, is gone). Root's helper runs every tool on a
/// user's file this way: it never waits on a user.
pub fn wait_bounded(
    mut child: std::process::Child,
    limit: Duration,
    keep: usize,
) -> std::io::Result<ToolEnd> {
    use std::io::Read;
    let start = std::time::Instant::now();
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        r.map(|mut r| {
            std::thread::spawn(move || {
                let mut b = Vec::new();
                // at most `keep` kept: the rest is read and dropped so the tool never blocks
                let mut chunk = [0u8; 8192];
                while let Ok(n) = r.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    let room = keep.saturating_sub(b.len()).min(n);
                    b.extend_from_slice(&chunk[..room]);
                }
                b
            })
        })
    };
    let out_t = pipe(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err_t = pipe(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let mut pause = Duration::from_millis(2);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() >= limit {
            let _ = child.kill(); // SIGKILL to our own child's PID
            let _ = child.wait();
            return Ok(ToolEnd::Killed(limit));
        }
        std::thread::sleep(pause.min(limit.saturating_sub(start.elapsed())));
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    let join = |t: Option<std::thread::JoinHandle<Vec<u8>>>| {
        t.and_then(|t| t.join().ok()).unwrap_or_default()
    };
    Ok(ToolEnd::Done(std::process::Output {
        status,
        stdout: join(out_t),
        stderr: join(err_t),
    }))
}

/// Make a path absolute without resolving symlinks (relative to the current directory).
/// `sudo -n HELPER`: how the unprivileged side calls the site's mount helper (load's site path,
/// release, list, environments' `idmap`).
pub fn helper_sudo(helper: &Path) -> ToolCommand {
    ToolCommand::new(Tool::Sudo).arg("-n").path(helper)
}

pub fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| Path::new("/").join(p))
    }
}

/// Quote a word for display the way a shell user would type it.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_wait_keeps_at_most_what_it_is_told_and_kills_at_its_limit() {
        use std::process::Stdio;
        let spawn = |script: &str| {
            Command::new("/bin/sh")
                .args(["-c", script])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        // a chatty tool is drained to its end, only `keep` bytes kept
        let c = spawn("head -c 300000 /dev/zero; echo err >&2; exit 4");
        match wait_bounded(c, Duration::from_secs(10), 1000).unwrap() {
            ToolEnd::Done(o) => {
                assert_eq!(o.status.code(), Some(4));
                assert_eq!((o.stdout.len(), o.stderr.as_slice()), (1000, &b"err\n"[..]));
            }
            ToolEnd::Killed(_) => panic!("killed"),
        }
        // past its time: killed by its PID, and the wait does not outlast the limit by much
        let t = std::time::Instant::now();
        let c = spawn("echo started; exec sleep 30");
        match wait_bounded(c, Duration::from_millis(300), usize::MAX).unwrap() {
            ToolEnd::Killed(d) => assert_eq!(d, Duration::from_millis(300)),
            ToolEnd::Done(o) => panic!("not killed: {o:?}"),
        }
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc-1.2"), "abc-1.2");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn user_paths_never_look_like_options() {
        let c = ToolCommand::new(Tool::E2fsck)
            .arg("-fn")
            .end_of_options()
            .path("-rf");
        let line = c.cmdline();
        assert!(line.starts_with("e2fsck -fn -- /"), "{line}");
        assert!(line.ends_with("/-rf"), "{line}");
    }

    #[test]
    fn failure_keeps_stderr() {
        // e2fsck on a file that is not a file system: a real tool, a real failure
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("junk.img");
        std::fs::write(&f, vec![7u8; 8192]).unwrap();
        match ToolCommand::new(Tool::E2fsck)
            .arg("-fn")
            .end_of_options()
            .path(&f)
            .run(None)
        {
            Err(ExecError::Failed {
                stderr, cmdline, ..
            }) => {
                assert!(cmdline.contains("junk.img"));
                assert!(!stderr.is_empty());
            }
            Err(ExecError::NotFound { .. }) => panic!("e2fsck must be installed (make setup)"),
            other => panic!("unexpected: {other:?}"),
        }
    }
}
