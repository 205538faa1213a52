//! The recording fake of [`Host`]: a file tree of directories (with owners, modes, symlinks,
//! mounts), the caller's files and the tools' answers as a script, the records in memory. Every
//! call is recorded as a typed [`Call`], with whether the records were locked at the time.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use swpool_sys::kmount::KernelMount;
use swpool_sys::sys::{FakeSys, FileKind, FileMeta};

use super::{Holder, Host, Locked, Target};
use crate::bounded::{As, OpenError, Opened, ToolEnd};
use crate::error::Result;
use crate::state::Records;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// The caller's file opened (`as_uid`: the ids it was opened with; `None`: root's).
    OpenAs {
        path: PathBuf,
        as_uid: Option<u32>,
        write: bool,
        locked: bool,
    },
    Tool {
        tool: String,
        args: Vec<OsString>,
        limit: Duration,
        locked: bool,
    },
    Lock,
    Save,
    Unlock,
    /// A directory made (by root, 0755).
    Mkdir(PathBuf),
    Adopt(PathBuf),
    Unlink(PathBuf),
    AttachLoop {
        label: String,
        rw: bool,
        locked: bool,
    },
    FreeLoop(String),
    Mount {
        at: PathBuf,
        fstype: String,
        source: String,
        read_only: bool,
        noexec: bool,
        locked: bool,
    },
    Detach(PathBuf),
    Unmount {
        id: u64,
        lazy: bool,
    },
}

/// A file the caller names, as the fake opens it.
#[derive(Debug, Clone)]
pub enum UserFile {
    File {
        kind: FileKind,
        uid: u32,
        fs_type: i64,
        ino: u64,
    },
    Errno(i32),
    Stalls,
}

impl UserFile {
    /// A regular file of `uid` on ext4.
    pub fn own(uid: u32, ino: u64) -> UserFile {
        UserFile::File {
            kind: FileKind::File,
            uid,
            fs_type: 0xEF53,
            ino,
        }
    }
}

/// A tool's answer: `Ok((status, stdout, stderr))`, or `Err(())`: killed after its limit.
pub type ToolAnswer = std::result::Result<(i32, String, String), ()>;

#[derive(Debug, Clone)]
struct Node {
    kind: FileKind,
    uid: u32,
    mode: u32,
    ino: u64,
    /// A mount ID when something is mounted on it.
    mounted: Option<u64>,
}

#[derive(Default)]
pub struct Fake {
    tree: RefCell<BTreeMap<PathBuf, Node>>,
    next_ino: Cell<u64>,
    next_id: Cell<u64>,
    pub files: RefCell<BTreeMap<PathBuf, UserFile>>,
    /// Each tool's answers, in order: `Ok((status, stdout, stderr))` or `Err(())` (killed).
    pub tools: RefCell<BTreeMap<String, Vec<ToolAnswer>>>,
    pub records: Rc<RefCell<Records>>,
    locked: Rc<Cell<bool>>,
    /// `mount_on` fails with this errno.
    pub mount_fails: Cell<Option<i32>>,
    /// `unmount_id` answers `EBUSY` this many times.
    pub busy: Cell<u32>,
    pub holders: RefCell<Vec<Holder>>,
    /// Run on the records at the next tool run: another request, meanwhile.
    #[allow(clippy::type_complexity)]
    pub meanwhile: RefCell<Option<Box<dyn FnOnce(&mut Records)>>>,
    pub sys: FakeSys,
}

pub struct FakeLocked {
    records: Records,
    shared: Rc<RefCell<Records>>,
    locked: Rc<Cell<bool>>,
    calls: Rc<RefCell<Vec<Call>>>,
}

impl Locked for FakeLocked {
    fn records(&mut self) -> &mut Records {
        &mut self.records
    }
    fn save(&mut self) -> Result<()> {
        self.calls.borrow_mut().push(Call::Save);
        *self.shared.borrow_mut() = clone_records(&self.records);
        Ok(())
    }
}

impl Drop for FakeLocked {
    fn drop(&mut self) {
        self.locked.set(false);
        self.calls.borrow_mut().push(Call::Unlock);
    }
}

fn clone_records(r: &Records) -> Records {
    serde_json::from_value(serde_json::to_value(r).unwrap()).unwrap()
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// The fake keeps its calls behind an `Rc` for the lock's guard; tests read them here.
pub struct FakeHost {
    pub f: Fake,
    calls: Rc<RefCell<Vec<Call>>>,
}

impl FakeHost {
    pub fn new() -> FakeHost {
        let h = FakeHost {
            f: Fake::default(),
            calls: Rc::default(),
        };
        h.f.next_ino.set(100);
        h.f.next_id.set(500);
        h.add("/", FileKind::Dir, 0, 0o755);
        h
    }
    pub fn calls(&self) -> Vec<Call> {
        self.calls.borrow().clone()
    }
    fn rec(&self, c: Call) {
        self.calls.borrow_mut().push(c);
    }
    fn locked(&self) -> bool {
        self.f.locked.get()
    }
    /// Put an entry in the tree (its parents must be there).
    pub fn add(&self, p: &str, kind: FileKind, uid: u32, mode: u32) {
        let ino = self.f.next_ino.get();
        self.f.next_ino.set(ino + 1);
        self.f.tree.borrow_mut().insert(
            PathBuf::from(p),
            Node {
                kind,
                uid,
                mode,
                ino,
                mounted: None,
            },
        );
    }
    /// `/run/u` (root's, 0755) and each directory of `p` under it, of `uid`, 0755.
    pub fn make_dirs(&self, p: &str, uid: u32) {
        let mut at = PathBuf::from("/");
        for c in Path::new(p).components().skip(1) {
            at.push(c);
            if !self.exists(&at.to_string_lossy()) {
                let owner = if at.starts_with("/run/u") && at.components().count() > 3 {
                    uid
                } else {
                    0
                };
                self.add(&at.to_string_lossy(), FileKind::Dir, owner, 0o755);
            }
        }
    }
    /// Mark `p` a mount point (of something else).
    pub fn mount_there(&self, p: &str) {
        if let Some(n) = self.f.tree.borrow_mut().get_mut(Path::new(p)) {
            n.mounted = Some(1);
        }
    }
    /// The entries beneath `p` (not `p` itself).
    pub fn beneath(&self, p: &str) -> Vec<PathBuf> {
        self.f
            .tree
            .borrow()
            .keys()
            .filter(|k| k.starts_with(p) && k.as_path() != Path::new(p))
            .cloned()
            .collect()
    }
    pub fn exists(&self, p: &str) -> bool {
        self.f.tree.borrow().contains_key(Path::new(p))
    }
    pub fn owner_mode(&self, p: &str) -> Option<(u32, u32)> {
        self.f
            .tree
            .borrow()
            .get(Path::new(p))
            .map(|n| (n.uid, n.mode & 0o7777))
    }
    /// Mounts the fake holds now (made by the helper).
    pub fn mounted(&self) -> Vec<PathBuf> {
        self.f
            .tree
            .borrow()
            .iter()
            .filter(|(_, n)| n.mounted.is_some_and(|id| id >= 500))
            .map(|(p, _)| p.clone())
            .collect()
    }
    /// Loop devices attached and not freed nor handed to a mount.
    pub fn loops_left(&self) -> usize {
        let calls = self.calls();
        let attached = calls
            .iter()
            .filter(|c| matches!(c, Call::AttachLoop { .. }))
            .count();
        let freed = calls
            .iter()
            .filter(|c| matches!(c, Call::FreeLoop(_)))
            .count();
        let mounted = calls
            .iter()
            .filter(|c| matches!(c, Call::Mount { .. }))
            .count();
        attached.saturating_sub(freed + mounted.min(attached))
    }
    fn has_children(&self, p: &Path) -> bool {
        self.f
            .tree
            .borrow()
            .keys()
            .any(|k| k != p && k.parent() == Some(p))
    }
    fn node(&self, p: &Path) -> io::Result<Node> {
        self.f
            .tree
            .borrow()
            .get(p)
            .cloned()
            .ok_or_else(|| errno(libc::ENOENT))
    }
    fn meta_of(n: &Node) -> FileMeta {
        FileMeta {
            kind: n.kind,
            uid: n.uid,
            mode: n.mode
                | match n.kind {
                    FileKind::Dir => 0o040000,
                    FileKind::Symlink => 0o120000,
                    _ => 0o100000,
                },
            dev: 1,
            ino: n.ino,
        }
    }
    fn dir(&self, p: &Path) -> io::Result<Node> {
        let n = self.node(p)?;
        match n.kind {
            FileKind::Symlink => Err(errno(libc::ELOOP)),
            FileKind::Dir => Ok(n),
            _ => Err(errno(libc::ENOTDIR)),
        }
    }
}

impl Host for FakeHost {
    type Dir = PathBuf;
    type Target = PathBuf;
    type Loop = String;
    type Locked = FakeLocked;
    type Sys = FakeSys;

    fn sys(&self) -> &FakeSys {
        &self.f.sys
    }

    fn open_as(
        &self,
        who: Option<As>,
        path: &Path,
        write: bool,
        _limit: Duration,
    ) -> std::result::Result<Opened, OpenError> {
        self.rec(Call::OpenAs {
            path: path.to_path_buf(),
            as_uid: who.map(|w| w.uid),
            write,
            locked: self.locked(),
        });
        match self.f.files.borrow().get(path).cloned() {
            None => Err(OpenError::Io(errno(libc::ENOENT))),
            Some(UserFile::Errno(e)) => Err(OpenError::Io(errno(e))),
            Some(UserFile::Stalls) => Err(OpenError::Stalled(_limit)),
            Some(UserFile::File {
                kind,
                uid,
                fs_type,
                ino,
            }) => Ok(Opened {
                file: tempfile::tempfile().unwrap(),
                meta: FileMeta {
                    kind,
                    uid,
                    mode: 0o644,
                    dev: 7,
                    ino,
                },
                fs_type,
            }),
        }
    }

    fn run_tool(
        &self,
        tool: &str,
        args: &[OsString],
        _env: &[(&str, OsString)],
        limit: Duration,
    ) -> Result<ToolEnd> {
        self.rec(Call::Tool {
            tool: tool.into(),
            args: args.to_vec(),
            limit,
            locked: self.locked(),
        });
        if let Some(f) = self.f.meanwhile.borrow_mut().take() {
            f(&mut self.f.records.borrow_mut());
        }
        let mut tools = self.f.tools.borrow_mut();
        let answers = tools.entry(tool.into()).or_default();
        let a = if answers.is_empty() {
            Ok((0, String::new(), String::new()))
        } else {
            answers.remove(0)
        };
        Ok(match a {
            Ok((code, out, err)) => ToolEnd::Done(std::process::Output {
                status: std::process::ExitStatus::from_raw(code << 8),
                stdout: out.into_bytes(),
                stderr: err.into_bytes(),
            }),
            Err(()) => ToolEnd::Killed(limit),
        })
    }

    fn records(&self) -> Result<(FakeLocked, u64)> {
        assert!(!self.locked(), "the records' lock taken twice");
        self.rec(Call::Lock);
        self.f.locked.set(true);
        Ok((
            FakeLocked {
                records: clone_records(&self.f.records.borrow()),
                shared: self.f.records.clone(),
                locked: self.f.locked.clone(),
                calls: self.calls.clone(),
            },
            1,
        ))
    }

    fn make_root_dir(&self, p: &Path, mode: u32) -> io::Result<()> {
        let mut at = PathBuf::from("/");
        for c in p.components().skip(1) {
            at.push(c);
            match self.node(&at) {
                Ok(n) if n.kind == FileKind::Dir => {}
                Ok(_) => return Err(errno(libc::ENOTDIR)),
                Err(_) => {
                    self.add(&at.to_string_lossy(), FileKind::Dir, 0, mode);
                    self.rec(Call::Mkdir(at.clone()));
                }
            }
        }
        Ok(())
    }

    fn open_root(&self, p: &Path) -> io::Result<PathBuf> {
        self.dir(p)?;
        Ok(p.to_path_buf())
    }

    fn meta(&self, d: &PathBuf) -> io::Result<FileMeta> {
        Ok(Self::meta_of(&self.node(d)?))
    }

    fn mkdir_open(&self, d: &PathBuf, name: &str) -> io::Result<PathBuf> {
        let p = d.join(name);
        if self.node(&p).is_err() {
            self.add(&p.to_string_lossy(), FileKind::Dir, 0, 0o755);
            self.rec(Call::Mkdir(p.clone()));
        }
        let n = self.dir(&p)?;
        if n.mounted.is_some() {
            return Err(errno(libc::EXDEV));
        }
        Ok(p)
    }

    fn adopt(&self, d: &PathBuf) -> io::Result<()> {
        self.rec(Call::Adopt(d.clone()));
        let mut t = self.f.tree.borrow_mut();
        let n = t.get_mut(d).ok_or_else(|| errno(libc::ENOENT))?;
        n.uid = 0;
        n.mode = 0o755;
        Ok(())
    }

    fn entry(&self, d: &PathBuf, name: &str) -> io::Result<Option<FileMeta>> {
        Ok(self.node(&d.join(name)).ok().map(|n| Self::meta_of(&n)))
    }

    fn unlink(&self, d: &PathBuf, name: &str, dir: bool) -> io::Result<()> {
        let p = d.join(name);
        let n = self.node(&p)?;
        if dir && n.kind != FileKind::Dir {
            return Err(errno(libc::ENOTDIR));
        }
        if dir && self.has_children(&p) {
            return Err(errno(libc::ENOTEMPTY));
        }
        if n.mounted.is_some() {
            return Err(errno(libc::EBUSY));
        }
        self.rec(Call::Unlink(p.clone()));
        self.f.tree.borrow_mut().remove(&p);
        Ok(())
    }

    fn dir_beneath(&self, d: &PathBuf, rel: &Path) -> io::Result<PathBuf> {
        let mut at = d.clone();
        for c in rel.components() {
            at.push(c);
            self.dir(&at)?;
        }
        Ok(at)
    }

    fn open_root_file(&self, p: &Path) -> io::Result<std::fs::File> {
        match self.node(p)?.kind {
            FileKind::File => Ok(tempfile::tempfile().unwrap()),
            FileKind::Symlink => Err(errno(libc::ELOOP)),
            _ => Err(errno(libc::EISDIR)),
        }
    }

    fn is_file(&self, p: &Path) -> bool {
        self.node(p).is_ok_and(|n| n.kind == FileKind::File)
    }

    fn open_target(&self, d: &PathBuf, name: &str) -> io::Result<Target<PathBuf>> {
        let p = d.join(name);
        let n = self.dir(&p)?;
        Ok(Target {
            dev: 1,
            ino: n.ino,
            empty: !self.has_children(&p),
            handle: p,
        })
    }

    fn attach_loop(
        &self,
        _backing: BorrowedFd<'_>,
        _size: u64,
        rw: bool,
        label: &str,
    ) -> io::Result<String> {
        self.rec(Call::AttachLoop {
            label: label.into(),
            rw,
            locked: self.locked(),
        });
        Ok("loop7".into())
    }

    fn loop_name(&self, l: &String) -> String {
        l.clone()
    }

    fn free_loop(&self, l: String) {
        self.rec(Call::FreeLoop(l));
    }

    fn hand_over_loop(&self, _l: String) {}

    fn mount_on(&self, t: &PathBuf, m: &KernelMount<'_>) -> io::Result<u64> {
        self.rec(Call::Mount {
            at: t.clone(),
            fstype: m.fstype.into(),
            source: m.source.into(),
            read_only: m.read_only,
            noexec: m.noexec,
            locked: self.locked(),
        });
        if let Some(e) = self.f.mount_fails.get() {
            return Err(errno(e));
        }
        let id = self.f.next_id.get();
        self.f.next_id.set(id + 1);
        let mut tree = self.f.tree.borrow_mut();
        let n = tree.get_mut(t).ok_or_else(|| errno(libc::ENOENT))?;
        n.mounted = Some(id);
        Ok(id)
    }

    fn detach(&self, t: &PathBuf) {
        self.rec(Call::Detach(t.clone()));
        if let Some(n) = self.f.tree.borrow_mut().get_mut(t) {
            n.mounted = None;
        }
    }

    fn unmount_id(&self, id: u64, lazy: bool) -> io::Result<()> {
        self.rec(Call::Unmount { id, lazy });
        if self.f.busy.get() > 0 {
            self.f.busy.set(self.f.busy.get() - 1);
            return Err(errno(libc::EBUSY));
        }
        let mut tree = self.f.tree.borrow_mut();
        match tree.values_mut().find(|n| n.mounted == Some(id)) {
            Some(n) => {
                n.mounted = None;
                Ok(())
            }
            None => Err(errno(libc::EINVAL)),
        }
    }

    fn mount_point_of(&self, id: u64) -> Option<PathBuf> {
        self.f
            .tree
            .borrow()
            .iter()
            .find(|(_, n)| n.mounted == Some(id))
            .map(|(p, _)| p.clone())
    }

    fn holders(&self, _mp: &Path) -> Vec<Holder> {
        self.f.holders.borrow().clone()
    }
}
