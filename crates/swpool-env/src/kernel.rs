//! The namespace, mount and process calls an environment makes, behind one seam (youki's
//! `syscall/` pattern): [`Kernel`] is what pid 1 ([`crate::init`]) and a joining start
//! ([`crate::rendezvous::enter`]) ask of the system, step by step. [`RealKernel`] makes the calls;
//! the recording fake (unit tests) records each as a typed [`Step`] and fails the one a test
//! names, so that pid 1's set-up order and what each failure leaves are tested without root.
//!
//! The stages pid 1 delegates to its own modules (the `--base` pools' FUSE mounts, the layer's
//! overlay, the helper's idmapped views, the `--pool` pools) are steps of the seam as a whole:
//! their tools run through `swpool-sys` ([`swpool_sys::exec`]).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags};

use crate::base::Base;
use crate::idmap::{Handshake, Views};
use crate::layer::Layer;
use crate::overlay::Dirs;
use crate::plan::Method;
use crate::pools::EnvPool;

/// A namespace a descriptor of `/proc/PID/ns/*` is entered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ns {
    User,
    Mount,
    Pid,
}

impl Ns {
    fn flag(self) -> libc::c_int {
        match self {
            Ns::User => libc::CLONE_NEWUSER,
            Ns::Mount => libc::CLONE_NEWNS,
            Ns::Pid => libc::CLONE_NEWPID,
        }
    }
}

/// What the layer's overlay is made of, besides the layer.
#[derive(Debug, Clone, Copy)]
pub struct OverlayOf<'a> {
    /// The job's copy of the layer (a read-only lower above the host's tree).
    pub lower: Option<&'a Path>,
    pub bases: &'a [Base],
    pub fuse_overlayfs: Option<&'a Path>,
    pub method: Method,
}

/// The `--pool` pools and how they are mounted.
#[derive(Debug, Clone, Copy)]
pub struct PoolsOf<'a> {
    pub pools: &'a [EnvPool],
    pub readers: crate::reader::Readers<'a>,
    pub fuse2fs: Option<&'a Path>,
    pub verbose: bool,
}

/// What an environment asks of the system. Paths are as the caller sees them (relative ones are
/// below the working directory: the root being built).
pub trait Kernel {
    /// Make every mount of this namespace private (`mount --make-rprivate /`).
    fn make_private(&self) -> Result<(), Errno>;
    /// `proc` at `at` (`nosuid,nodev,noexec`).
    fn mount_proc(&self, at: &Path) -> Result<(), Errno>;
    /// `mount --rbind src at`.
    fn bind_recursive(&self, src: &Path, at: &Path) -> Result<(), Errno>;
    /// `mount --bind src at`.
    fn bind(&self, src: &Path, at: &Path) -> Result<(), Errno>;
    /// `umount -l at`.
    fn detach(&self, at: &Path) -> Result<(), Errno>;
    /// Move the mount at the working directory onto `/`.
    fn move_to_root(&self) -> Result<(), Errno>;
    /// `chroot(".")`.
    fn chroot_here(&self) -> Result<(), Errno>;
    fn fchdir(&self, dir: BorrowedFd<'_>) -> Result<(), Errno>;
    fn chdir(&self, p: &Path) -> Result<(), Errno>;
    /// `setns(2)` of a namespace descriptor.
    fn setns(&self, ns: BorrowedFd<'_>, kind: Ns) -> Result<(), Errno>;

    // pid 1's stages, made by its modules (their own messages)
    /// The launcher's word on the kernel path ([`crate::idmap::receive`]).
    fn receive_views(&self, fd: i32) -> Result<Handshake, String>;
    /// Enter the helper's namespace holding the views ([`crate::idmap::enter`]).
    fn enter_views(&self, v: &Views) -> Result<(), String>;
    /// `--root` on the rootless path after all: seed the layer's upper ([`crate::rootless_root`]).
    fn seed_rootless_root(&self, upper: &Path);
    /// The `--base` pools ([`crate::base::mount`]; `written`: a layer goes over them).
    fn mount_bases(
        &self,
        bases: &[Base],
        readers: crate::reader::Readers<'_>,
        written: bool,
    ) -> Result<(), String>;
    /// The layer's directories opened again here ([`crate::overlay::reopen`]).
    fn reopen_layer(
        &self,
        l: &Layer,
        checked: [i32; 4],
        held: &mut Vec<OwnedFd>,
    ) -> Result<Dirs, String>;
    /// The trees' overlays from the helper's views ([`crate::idmap::mount_trees`]): the new root
    /// when `/` is one of them.
    fn mount_trees(
        &self,
        v: &Views,
        d: &Dirs,
        lower: Option<&Path>,
    ) -> Result<Option<OwnedFd>, String>;
    /// The layer's overlay ([`crate::overlay::mount`]): its root.
    fn mount_overlay(&self, o: &OverlayOf<'_>, l: &Layer, d: &Dirs) -> Result<OwnedFd, String>;
    /// Where the top `--base` pool is mounted ([`crate::base::root`]).
    fn base_root(&self, bases: &[Base]) -> Result<PathBuf, String>;
    /// The `--pool` pools under `root` ([`crate::pools::mount`]).
    fn mount_pools(&self, p: &PoolsOf<'_>, root: &Path) -> Result<(), String>;
}

/// The system's calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealKernel;

impl Kernel for RealKernel {
    fn make_private(&self) -> Result<(), Errno> {
        rustix::mount::mount_change(
            "/",
            MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
        )
    }

    fn mount_proc(&self, at: &Path) -> Result<(), Errno> {
        let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
        rustix::mount::mount("proc", at, "proc", flags, "")
    }

    fn bind_recursive(&self, src: &Path, at: &Path) -> Result<(), Errno> {
        rustix::mount::mount_recursive_bind(src, at)
    }

    fn bind(&self, src: &Path, at: &Path) -> Result<(), Errno> {
        rustix::mount::mount_bind(src, at)
    }

    fn detach(&self, at: &Path) -> Result<(), Errno> {
        rustix::mount::unmount(at, rustix::mount::UnmountFlags::DETACH)
    }

    fn move_to_root(&self) -> Result<(), Errno> {
        rustix::mount::mount_move(".", "/")
    }

    fn chroot_here(&self) -> Result<(), Errno> {
        rustix::process::chroot(".")
    }

    fn fchdir(&self, dir: BorrowedFd<'_>) -> Result<(), Errno> {
        rustix::process::fchdir(dir)
    }

    fn chdir(&self, p: &Path) -> Result<(), Errno> {
        rustix::process::chdir(p)
    }

    fn setns(&self, ns: BorrowedFd<'_>, kind: Ns) -> Result<(), Errno> {
        use std::os::fd::AsRawFd;
        // SAFETY: setns(2) on a namespace descriptor; it touches no memory of ours
        if unsafe { libc::setns(ns.as_raw_fd(), kind.flag()) } == 0 {
            Ok(())
        } else {
            Err(Errno::from_raw_os_error(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL),
            ))
        }
    }

    fn receive_views(&self, fd: i32) -> Result<Handshake, String> {
        crate::idmap::receive(fd)
    }

    fn enter_views(&self, v: &Views) -> Result<(), String> {
        crate::idmap::enter(v, |ns| self.setns(ns, Ns::Mount))
    }

    fn seed_rootless_root(&self, upper: &Path) {
        crate::rootless_root::seed(upper)
    }

    fn mount_bases(
        &self,
        bases: &[Base],
        readers: crate::reader::Readers<'_>,
        written: bool,
    ) -> Result<(), String> {
        crate::base::mount(bases, readers, written)
    }

    fn reopen_layer(
        &self,
        l: &Layer,
        checked: [i32; 4],
        held: &mut Vec<OwnedFd>,
    ) -> Result<Dirs, String> {
        crate::overlay::reopen(l, checked, held)
    }

    fn mount_trees(
        &self,
        v: &Views,
        d: &Dirs,
        lower: Option<&Path>,
    ) -> Result<Option<OwnedFd>, String> {
        crate::idmap::mount_trees(v, d, lower)
    }

    fn mount_overlay(&self, o: &OverlayOf<'_>, l: &Layer, d: &Dirs) -> Result<OwnedFd, String> {
        crate::overlay::mount(o.lower, o.bases, o.fuse_overlayfs, l, d, o.method)
    }

    fn base_root(&self, bases: &[Base]) -> Result<PathBuf, String> {
        crate::base::root(bases)
    }

    fn mount_pools(&self, p: &PoolsOf<'_>, root: &Path) -> Result<(), String> {
        crate::pools::mount(p.pools, root, p.readers, p.fuse2fs, p.verbose)
    }
}

#[cfg(test)]
pub(crate) use fake::{FakeKernel, Step};

#[cfg(test)]
mod fake {
    use std::cell::RefCell;
    use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
    use std::path::{Path, PathBuf};

    use rustix::io::Errno;

    use super::{Kernel, Ns, OverlayOf, PoolsOf};
    use crate::base::Base;
    use crate::idmap::{Handshake, Views};
    use crate::layer::Layer;
    use crate::overlay::Dirs;
    use crate::plan::Method;

    /// One recorded call, typed.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Step {
        Private,
        Proc(PathBuf),
        BindRecursive {
            src: PathBuf,
            at: PathBuf,
        },
        Bind {
            src: PathBuf,
            at: PathBuf,
        },
        Detach(PathBuf),
        MoveToRoot,
        Chroot,
        /// `fchdir` to a descriptor the fake handed out (its number).
        Fchdir(i32),
        Chdir(PathBuf),
        /// `setns` of the descriptor with this number.
        Setns(i32, Ns),
        ReceiveViews(i32),
        EnterViews,
        SeedRootless(PathBuf),
        Bases,
        ReopenLayer,
        MountTrees,
        Overlay(Method),
        BaseRoot,
        Pools(PathBuf),
    }

    /// Records every step; the step equal to `fails` fails (with `errno`, or a message naming it
    /// for a stage), and every step after it still succeeds.
    #[derive(Default)]
    pub(crate) struct FakeKernel {
        pub steps: RefCell<Vec<Step>>,
        pub fails: Vec<(Step, Errno)>,
        /// The launcher's word on the kernel path.
        pub handshake: Option<Handshake>,
        /// `mount_trees` makes the root (`/` is one of the trees).
        pub trees_make_root: bool,
        /// Descriptors handed out (overlay roots), kept open while the fake lives.
        pub handed: RefCell<Vec<i32>>,
    }

    impl FakeKernel {
        pub fn failing(step: Step, errno: Errno) -> FakeKernel {
            FakeKernel {
                fails: vec![(step, errno)],
                ..FakeKernel::default()
            }
        }

        pub fn steps(&self) -> Vec<Step> {
            self.steps.borrow().clone()
        }

        fn call(&self, s: Step) -> Result<(), Errno> {
            self.steps.borrow_mut().push(s.clone());
            match self.fails.iter().find(|(f, _)| *f == s) {
                Some((_, e)) => Err(*e),
                None => Ok(()),
            }
        }

        fn stage(&self, s: Step) -> Result<(), String> {
            self.call(s.clone())
                .map_err(|e| format!("{s:?} failed: {e}"))
        }

        /// A descriptor to stand for a mount's root (an open `/`).
        fn fd(&self) -> OwnedFd {
            let fd: OwnedFd = std::fs::File::open("/").unwrap().into();
            self.handed.borrow_mut().push(fd.as_raw_fd());
            fd
        }
    }

    impl Kernel for FakeKernel {
        fn make_private(&self) -> Result<(), Errno> {
            self.call(Step::Private)
        }
        fn mount_proc(&self, at: &Path) -> Result<(), Errno> {
            self.call(Step::Proc(at.into()))
        }
        fn bind_recursive(&self, src: &Path, at: &Path) -> Result<(), Errno> {
            self.call(Step::BindRecursive {
                src: src.into(),
                at: at.into(),
            })
        }
        fn bind(&self, src: &Path, at: &Path) -> Result<(), Errno> {
            self.call(Step::Bind {
                src: src.into(),
                at: at.into(),
            })
        }
        fn detach(&self, at: &Path) -> Result<(), Errno> {
            self.call(Step::Detach(at.into()))
        }
        fn move_to_root(&self) -> Result<(), Errno> {
            self.call(Step::MoveToRoot)
        }
        fn chroot_here(&self) -> Result<(), Errno> {
            self.call(Step::Chroot)
        }
        fn fchdir(&self, dir: BorrowedFd<'_>) -> Result<(), Errno> {
            self.call(Step::Fchdir(dir.as_raw_fd()))
        }
        fn chdir(&self, p: &Path) -> Result<(), Errno> {
            self.call(Step::Chdir(p.into()))
        }
        fn setns(&self, ns: BorrowedFd<'_>, kind: Ns) -> Result<(), Errno> {
            self.call(Step::Setns(ns.as_raw_fd(), kind))
        }
        fn receive_views(&self, fd: i32) -> Result<Handshake, String> {
            self.stage(Step::ReceiveViews(fd))?;
            Ok(self.handshake.clone().expect("the test's handshake"))
        }
        fn enter_views(&self, _: &Views) -> Result<(), String> {
            self.stage(Step::EnterViews)
        }
        fn seed_rootless_root(&self, upper: &Path) {
            let _ = self.call(Step::SeedRootless(upper.into()));
        }
        fn mount_bases(
            &self,
            _: &[Base],
            _: crate::reader::Readers<'_>,
            _: bool,
        ) -> Result<(), String> {
            self.stage(Step::Bases)
        }
        fn reopen_layer(
            &self,
            _: &Layer,
            c: [i32; 4],
            _: &mut Vec<OwnedFd>,
        ) -> Result<Dirs, String> {
            self.stage(Step::ReopenLayer)?;
            Ok(Dirs {
                dir: c[0],
                upper: c[1],
                work: c[2],
                merged: c[3],
            })
        }
        fn mount_trees(
            &self,
            _: &Views,
            _: &Dirs,
            _: Option<&Path>,
        ) -> Result<Option<OwnedFd>, String> {
            self.stage(Step::MountTrees)?;
            Ok(self.trees_make_root.then(|| self.fd()))
        }
        fn mount_overlay(&self, o: &OverlayOf<'_>, _: &Layer, _: &Dirs) -> Result<OwnedFd, String> {
            self.stage(Step::Overlay(o.method))?;
            Ok(self.fd())
        }
        fn base_root(&self, bases: &[Base]) -> Result<PathBuf, String> {
            self.stage(Step::BaseRoot)?;
            Ok(bases.last().map(|b| b.at.clone()).unwrap_or_default())
        }
        fn mount_pools(&self, _: &PoolsOf<'_>, root: &Path) -> Result<(), String> {
            self.stage(Step::Pools(root.into()))
        }
    }
}
