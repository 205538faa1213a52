//! [`FakeSys`]: the recording fake of [`super::Sys`] — a scripted FUSE helper, mount table and
//! clock, every call recorded as a [`Call`].

use std::ffi::OsString;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Clock, FileMeta, Mounts, PinnedDir, Processes, RealSys};
use crate::exec::{ExecError, Output, Tool, ToolCommand};
use crate::proc::MountEntry;

/// One recorded call, typed: tests match on what happened, not on command-line text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Probe(PathBuf),
    OpenFuseDevice,
    /// A FUSE helper started: its tool and arguments.
    Spawn {
        tool: Tool,
        args: Vec<OsString>,
    },
    /// The helper with this pid was seen to exit.
    Exited(u32),
    /// A helper we started was ended.
    KillHelper(u32),
    /// A helper now serves its mount and was let go.
    Release(u32),
    /// A short tool run to completion.
    Run {
        tool: Tool,
        args: Vec<OsString>,
    },
    Pin(PathBuf),
    Stage,
    Attach {
        stage: PathBuf,
        to: PathBuf,
    },
    Detach(PathBuf),
    RemoveStage(PathBuf),
    /// Root's `umount2(UMOUNT_NOFOLLOW)`.
    Unmount {
        mount_point: PathBuf,
        lazy: bool,
    },
    /// A process proved ours was ended.
    Terminate(u32),
    Sleep(Duration),
}

impl Call {
    /// Is this a `fusermount3 -u` / `umount` run (`lazy`: with `-z` / `-l`)?
    pub fn is_unmount_run(&self, lazy: bool) -> bool {
        match self {
            Call::Run { tool, args } => {
                matches!(tool, Tool::Fusermount3 | Tool::Umount)
                    && args.iter().any(|a| a == "-z" || a == "-l") == lazy
            }
            Call::Unmount { lazy: l, .. } => *l == lazy,
            _ => false,
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |tool: &Tool, args: &[OsString]| {
            std::iter::once(tool.program().to_string())
                .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        match self {
            Call::Probe(p) => write!(f, "probe {}", p.display()),
            Call::OpenFuseDevice => write!(f, "open /dev/fuse"),
            Call::Spawn { tool, args } => write!(f, "spawn {}", line(tool, args)),
            Call::Exited(p) => write!(f, "exited {p}"),
            Call::KillHelper(p) => write!(f, "kill {p}"),
            Call::Release(p) => write!(f, "release {p}"),
            Call::Run { tool, args } => write!(f, "run {}", line(tool, args)),
            Call::Pin(p) => write!(f, "pin {}", p.display()),
            Call::Stage => write!(f, "stage"),
            Call::Attach { stage, to } => write!(f, "attach {} {}", stage.display(), to.display()),
            Call::Detach(p) => write!(f, "detach {}", p.display()),
            Call::RemoveStage(p) => write!(f, "remove stage {}", p.display()),
            Call::Unmount { mount_point, lazy } => {
                write!(
                    f,
                    "umount2 {}{}",
                    mount_point.display(),
                    if *lazy { " lazy" } else { "" }
                )
            }
            Call::Terminate(p) => write!(f, "terminate {p}"),
            Call::Sleep(d) => write!(f, "sleep {d:?}"),
        }
    }
}

/// How the fake helper behaves.
#[derive(Debug, Clone, Default)]
pub enum FakeHelper {
    /// The mount appears after this many polls.
    #[default]
    Mounts,
    MountsAfter(u32),
    /// The helper exits with this stderr after this many polls, mounting nothing.
    Exits(u32, String),
    /// A helper of this tool exits at its first poll with this exit code and stderr, mounting
    /// nothing (a server refusing an image); any other mounts (a wrapper running another
    /// helper, `sw-pool-serve ... -- squashfuse_ll ...`, counts as that helper).
    Refuses(Tool, i32, String),
    /// The helper never mounts and never exits (a hung helper).
    Hangs,
    /// The helper program is not installed.
    NotInstalled,
    /// This tool is not installed; any other mounts.
    Missing(Tool),
}

/// The script the fake plays.
#[derive(Debug, Clone, Default)]
pub struct FakeScript {
    pub helper: FakeHelper,
    /// `open("/dev/fuse")` fails with this.
    pub fuse_device: Option<io::ErrorKind>,
    /// The mount table before anything happens.
    pub mounts: Vec<MountEntry>,
    /// `fusermount3 -u` fails as busy (a lazy `-z` still works).
    pub busy: bool,
    /// `fusermount3 -u` fails as busy this many more times, then works (a transient holder).
    pub busy_transient: u32,
    /// Mount points whose FUSE process is dead (probe gives ENOTCONN).
    pub stale: Vec<PathBuf>,
    pub euid: u32,
    /// Root's pin of the mount point fails with this errno (a symlink appeared: `ELOOP`).
    pub pin_errno: Option<i32>,
    /// The pinned directory is another inode than the one checked (swapped in between).
    pub pin_other_inode: bool,
    /// Moving the staged mount onto the pinned directory fails with this errno.
    pub attach_errno: Option<i32>,
    /// The pinned directory was renamed before the mount was moved onto it.
    pub attach_elsewhere: bool,
    /// With `attach_elsewhere`: another FUSE mount of the helpers (another ID) sits at the
    /// mount point's path (a user moved an older mount of root's there).
    pub decoy_at_target: bool,
    /// The directory is renamed right after the mount was moved onto it (a rename that had
    /// checked it before): the first look at the mount table still shows it at the path.
    pub moved_after_attach: bool,
    /// Answers of the site's mount helper (`sudo -n HELPER …`, or HELPER run by root), in order:
    /// `Ok(stdout)` or `Err(stderr)` (exit status 3). A helper call with none left fails.
    pub helper_answers: std::collections::VecDeque<Result<String, String>>,
}

/// A recording fake: file metadata comes from the real file system (tests use temporary
/// directories), every operation is recorded as a [`Call`] and follows `script`; time is virtual
/// (`sleep` advances it at once), so a timeout is reached without waiting.
#[derive(Debug)]
pub struct FakeSys {
    pub script: Mutex<FakeScript>,
    calls: Mutex<Vec<Call>>,
    state: Mutex<FakeState>,
    /// The virtual clock: its start, and how far `sleep` moved it.
    epoch: Instant,
    elapsed: Mutex<Duration>,
    /// Pids `terminate` may end (processes the test says are ours and running).
    pub ours: Mutex<Vec<u32>>,
}

impl Default for FakeSys {
    fn default() -> FakeSys {
        FakeSys::new(FakeScript::default())
    }
}

/// The mount ID of the clone `attach` moves onto the pinned directory (a mount of its own).
const MOVED_ID: u32 = 901;
/// The ID of [`FakeScript::decoy_at_target`]'s mount.
pub const DECOY_ID: u32 = 902;

#[derive(Debug, Default)]
struct FakeState {
    /// Reads of the mount table since the attach (for `moved_after_attach`).
    reads_after_attach: Option<u32>,
    polls: u32,
    running: Option<(u32, PathBuf, String)>,
    next_pid: u32,
}

impl FakeSys {
    pub fn new(script: FakeScript) -> FakeSys {
        FakeSys {
            script: Mutex::new(script),
            calls: Mutex::default(),
            state: Mutex::new(FakeState {
                next_pid: 4242,
                ..Default::default()
            }),
            epoch: Instant::now(),
            elapsed: Mutex::new(Duration::ZERO),
            ours: Mutex::default(),
        }
    }
    fn rec(&self, c: Call) {
        self.calls.lock().unwrap().push(c);
    }
    /// The recorded calls, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
    /// How many calls match `f`.
    pub fn count(&self, f: impl Fn(&Call) -> bool) -> usize {
        self.calls.lock().unwrap().iter().filter(|c| f(c)).count()
    }
    /// How much virtual time passed.
    pub fn slept(&self) -> Duration {
        *self.elapsed.lock().unwrap()
    }
    /// The fake mount table now.
    pub fn mount_table(&self) -> Vec<MountEntry> {
        self.script.lock().unwrap().mounts.clone()
    }
    fn fake_entry(p: &Path, fstype: &str) -> MountEntry {
        MountEntry {
            mount_id: 900,
            mount_point: p.to_path_buf(),
            mount_options: "ro,nosuid,nodev,relatime".into(),
            fstype: fstype.into(),
            source: "fake".into(),
            super_options: "ro,user_id=0,group_id=0".into(),
            dev: "0:0".into(),
        }
    }
    /// Advance the fake helper by one poll.
    fn tick(&self) {
        let mut st = self.state.lock().unwrap();
        let Some((_, mp, fstype)) = st.running.clone() else {
            return;
        };
        st.polls += 1;
        let polls = st.polls;
        let mut sc = self.script.lock().unwrap();
        let appear = match &sc.helper {
            FakeHelper::Mounts => true,
            FakeHelper::MountsAfter(n) => polls >= *n,
            FakeHelper::Missing(_) => true,
            FakeHelper::Refuses(t, _, _) => fstype != format!("fuse.{}", t.program()),
            _ => false,
        };
        if appear && crate::proc::mount_at(&sc.mounts, &mp).is_none() {
            sc.mounts.push(Self::fake_entry(&mp, &fstype));
        }
    }
    /// Unmount `mp` from the fake table as `fusermount3 -u [-z]` / `umount [-l]` would.
    fn unmount(
        &self,
        tool: Tool,
        cmdline: String,
        mp: &Path,
        lazy: bool,
    ) -> Result<Output, ExecError> {
        let mut sc = self.script.lock().unwrap();
        let transient = sc.busy_transient > 0 && !lazy;
        if transient {
            sc.busy_transient -= 1;
        }
        if (sc.busy || transient) && !lazy && !sc.stale.iter().any(|s| s == mp) {
            return Err(ExecError::Failed {
                tool,
                cmdline,
                status: "exit status: 1".into(),
                stderr: format!(
                    "{tool}: failed to unmount {}: Device or resource busy",
                    mp.display()
                ),
            });
        }
        match sc.mounts.iter().rposition(|m| m.mount_point == mp) {
            Some(i) => {
                sc.mounts.remove(i);
                sc.stale.retain(|s| s != mp);
                Ok(Output {
                    stdout: String::new(),
                    stderr: String::new(),
                })
            }
            None => Err(ExecError::Failed {
                tool,
                cmdline,
                status: "exit status: 1".into(),
                stderr: format!("{tool}: entry for {} not found", mp.display()),
            }),
        }
    }
}

impl Mounts for FakeSys {
    fn lstat(&self, p: &Path) -> io::Result<FileMeta> {
        let m = RealSys::default().lstat(p)?;
        Ok(FileMeta {
            uid: self.euid(), // temporary directories in tests belong to the fake caller
            ..m
        })
    }
    fn dir_is_empty(&self, p: &Path) -> io::Result<bool> {
        RealSys::default().dir_is_empty(p)
    }
    fn probe(&self, p: &Path) -> io::Result<()> {
        self.rec(Call::Probe(p.to_path_buf()));
        if self.script.lock().unwrap().stale.iter().any(|s| s == p) {
            return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
        }
        Ok(())
    }
    fn mounts(&self) -> io::Result<Vec<MountEntry>> {
        self.tick();
        let mut st = self.state.lock().unwrap();
        if let Some(n) = st.reads_after_attach.as_mut() {
            *n += 1;
            if *n == 2 {
                // the rename completes: the attached mount now sits under another name
                let mut sc = self.script.lock().unwrap();
                if let Some(e) = sc.mounts.iter_mut().rev().find(|m| m.mount_id == MOVED_ID) {
                    e.mount_point = e.mount_point.with_extension("renamed");
                }
            }
        }
        drop(st);
        Ok(self.mount_table())
    }
    fn open_fuse_device(&self) -> io::Result<()> {
        self.rec(Call::OpenFuseDevice);
        match self.script.lock().unwrap().fuse_device {
            Some(k) => Err(io::Error::from(k)),
            None => Ok(()),
        }
    }
    fn pin(&self, p: &Path) -> io::Result<PinnedDir> {
        self.rec(Call::Pin(p.to_path_buf()));
        let sc = self.script.lock().unwrap().clone();
        if let Some(e) = sc.pin_errno {
            return Err(io::Error::from_raw_os_error(e));
        }
        let m = self.lstat(p)?;
        Ok(PinnedDir {
            path: p.to_path_buf(),
            dev: m.dev,
            ino: if sc.pin_other_inode { m.ino + 1 } else { m.ino },
            empty: self.dir_is_empty(p)?,
            real: None,
        })
    }
    fn stage(&self) -> io::Result<PathBuf> {
        self.rec(Call::Stage);
        Ok(PathBuf::from("/run/sw-pool/stage-fake"))
    }
    fn attach(&self, stage: &Path, to: &PinnedDir) -> io::Result<u32> {
        self.rec(Call::Attach {
            stage: stage.to_path_buf(),
            to: to.path.clone(),
        });
        let mut sc = self.script.lock().unwrap();
        if let Some(e) = sc.attach_errno {
            return Err(io::Error::from_raw_os_error(e));
        }
        let Some(i) = sc.mounts.iter().rposition(|m| m.mount_point == stage) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        let mut e = sc.mounts[i].clone();
        if sc.attach_elsewhere && sc.decoy_at_target {
            let mut decoy = e.clone();
            decoy.mount_id = DECOY_ID;
            decoy.mount_point = to.path.clone();
            sc.mounts.push(decoy);
        }
        e.mount_id = MOVED_ID;
        e.mount_point = if sc.attach_elsewhere {
            to.path.with_extension("renamed")
        } else {
            to.path.clone()
        };
        sc.mounts.push(e);
        if sc.moved_after_attach {
            self.state.lock().unwrap().reads_after_attach = Some(0);
        }
        Ok(MOVED_ID)
    }
    fn detach(&self, to: &PinnedDir) {
        self.rec(Call::Detach(to.path.clone()));
        let mut sc = self.script.lock().unwrap();
        let renamed = to.path.with_extension("renamed");
        sc.mounts.retain(|m| {
            m.mount_id == DECOY_ID || (m.mount_point != to.path && m.mount_point != renamed)
        });
    }
    fn remove_stage(&self, stage: &Path) {
        self.rec(Call::RemoveStage(stage.to_path_buf()));
        self.script
            .lock()
            .unwrap()
            .mounts
            .retain(|m| m.mount_point != stage);
    }
    fn unmount_nofollow(&self, mp: &Path, lazy: bool) -> Result<(), ExecError> {
        self.rec(Call::Unmount {
            mount_point: mp.to_path_buf(),
            lazy,
        });
        let line = format!(
            "umount2({}, UMOUNT_NOFOLLOW{})",
            mp.display(),
            if lazy { "|MNT_DETACH" } else { "" }
        );
        self.unmount(Tool::Umount, line, mp, lazy).map(drop)
    }
}

impl Processes for FakeSys {
    fn euid(&self) -> u32 {
        self.script.lock().unwrap().euid
    }
    fn spawn_helper(&self, cmd: &ToolCommand, _log: &Path) -> Result<u32, ExecError> {
        self.rec(Call::Spawn {
            tool: cmd.tool(),
            args: cmd.arguments().to_vec(),
        });
        let missing = match &self.script.lock().unwrap().helper {
            FakeHelper::NotInstalled => true,
            FakeHelper::Missing(t) => *t == cmd.tool(),
            _ => false,
        };
        if missing {
            return Err(ExecError::NotFound {
                tool: cmd.tool(),
                searched: vec![PathBuf::from("/fake/bin")],
            });
        }
        let mut st = self.state.lock().unwrap();
        let pid = st.next_pid;
        st.next_pid += 1;
        st.polls = 0;
        // the mount point is the helper's last argument
        let mp = cmd
            .arguments()
            .last()
            .map(PathBuf::from)
            .unwrap_or_default();
        // a wrapper's mount (`sw-pool-serve ... -- HELPER ...`) is its helper's
        let args = cmd.arguments();
        let inner = args
            .iter()
            .position(|a| a == "--")
            .and_then(|i| args.get(i + 1))
            .and_then(|p| Path::new(p).file_name())
            .map(|p| p.to_string_lossy().into_owned());
        let fstype = format!("fuse.{}", inner.as_deref().unwrap_or(cmd.tool().program()));
        st.running = Some((pid, mp, fstype));
        Ok(pid)
    }
    fn helper_exited(&self, pid: u32) -> io::Result<Option<String>> {
        let polls = self.state.lock().unwrap().polls;
        let r = match &self.script.lock().unwrap().helper {
            FakeHelper::Exits(n, _) if polls >= *n => Some("exit status: 1".to_string()),
            FakeHelper::Refuses(t, code, _)
                if self
                    .state
                    .lock()
                    .unwrap()
                    .running
                    .as_ref()
                    .map(|r| r.2.as_str())
                    == Some(format!("fuse.{}", t.program()).as_str()) =>
            {
                Some(format!("exit status: {code}"))
            }
            _ => None,
        };
        if r.is_some() {
            self.rec(Call::Exited(pid));
            self.state.lock().unwrap().running = None;
        }
        Ok(r)
    }
    fn kill_helper(&self, pid: u32) {
        self.rec(Call::KillHelper(pid));
        self.state.lock().unwrap().running = None;
    }
    fn release_helper(&self, pid: u32) -> bool {
        self.rec(Call::Release(pid));
        self.state.lock().unwrap().running = None;
        true
    }
    fn run(&self, cmd: &ToolCommand) -> Result<Output, ExecError> {
        self.rec(Call::Run {
            tool: cmd.tool(),
            args: cmd.arguments().to_vec(),
        });
        if matches!(cmd.tool(), Tool::Sudo | Tool::MountHelper) {
            let answer = self.script.lock().unwrap().helper_answers.pop_front();
            return match answer {
                Some(Ok(stdout)) => Ok(Output {
                    stdout,
                    stderr: String::new(),
                }),
                Some(Err(stderr)) => Err(ExecError::Failed {
                    tool: cmd.tool(),
                    cmdline: cmd.cmdline(),
                    status: "exit status: 3".into(),
                    stderr,
                }),
                None => Err(ExecError::Failed {
                    tool: cmd.tool(),
                    cmdline: cmd.cmdline(),
                    status: "exit status: 3".into(),
                    stderr: "the fake has no answer of the helper's left".into(),
                }),
            };
        }
        let args = cmd.arguments();
        let mp = args.last().map(PathBuf::from).unwrap_or_default();
        let lazy = args.iter().any(|a| a == "-z" || a == "-l");
        self.unmount(cmd.tool(), cmd.cmdline(), &mp, lazy)
    }
    fn read_log(&self, _log: &Path) -> String {
        match &self.script.lock().unwrap().helper {
            FakeHelper::Exits(_, s) | FakeHelper::Refuses(_, _, s) => s.clone(),
            _ => String::new(),
        }
    }
    fn is_our_helper(&self, pid: u32, _uid: u32, _mp: &Path) -> bool {
        self.ours.lock().unwrap().contains(&pid)
    }
    fn running(&self, pid: u32) -> bool {
        self.ours.lock().unwrap().contains(&pid)
    }
    fn terminate(&self, pid: u32, _grace: Duration) -> Result<(), String> {
        self.rec(Call::Terminate(pid));
        let mut ours = self.ours.lock().unwrap();
        match ours.iter().position(|&p| p == pid) {
            Some(i) => {
                ours.remove(i);
                Ok(())
            }
            None => Err(format!("refusing to signal pid {pid}: not ours")),
        }
    }
}

impl Clock for FakeSys {
    fn now(&self) -> Instant {
        self.epoch + *self.elapsed.lock().unwrap()
    }
    fn sleep(&self, d: Duration) {
        *self.elapsed.lock().unwrap() += d;
    }
}
