//! Mounting with a record: a new mount (write-ahead record, then the helper) or one more reference.

use super::*;

/// What to mount where, for whom.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    /// Validated `-o` options (always read-only).
    pub options: mount::MountOptions,
    pub job_id: Option<String>,
    pub timeout: Duration,
    /// One reference per job: when the pool is already mounted there with a reference of
    /// `job_id`, nothing changes (the Slurm task prolog runs once per task).
    pub once_per_job: bool,
    /// The pool file on shared storage it came from (`load`), kept in the record.
    pub source: Option<PathBuf>,
    /// The lease a read-write mount of a user image holds (taken by the caller, kept in the
    /// record, given back when the record goes: [`StateDir::remove`]).
    pub lease: Option<crate::userimage::lease::Holder>,
    /// Serve the image from where it lies through the verifying chunk server (a pool the trust
    /// policy accepted with this digest), instead of mounting the file itself.
    pub serve: Option<mount::serve::InPlace>,
    /// The shell this is for (`load` through the shell function): when the pool is already
    /// mounted there with a reference of this shell, nothing changes (loading twice in one shell
    /// holds one reference).
    pub shell: Option<u32>,
    /// Which FUSE server reads a squashfs pool (config `fuse_reader`; see
    /// [`mount::ImageInfo::with_reader`]).
    pub reader: mount::FuseReader,
}

/// The result of [`acquire`].
#[derive(Debug, Clone, Serialize)]
pub struct Acquired {
    pub record: Record,
    /// The pool was already mounted there by this user: only the reference count went up.
    pub reused: bool,
    /// Time spent mounting (zero when reused).
    pub mount_seconds: f64,
    /// Things the user should know (a leftover record replaced, …).
    pub notes: Vec<String>,
}

/// The record of `mountpoint` when it is this user's live mount of the pool with manifest digest
/// `digest` (any image when `None`) and already carries a reference of `job_id`: what
/// [`acquire`] with `once_per_job` would leave unchanged. Reads the record and the mount table only
/// (no lock, no image), so that the Slurm task prolog of every task after the first on a node touches
/// neither the pool on shared storage nor the store's lock. `None` for anything else (no record, a
/// pending or stale one, another pool, another user, no reference of the job): the caller then takes
/// the full path.
pub fn held_by_job(
    sys: &dyn Sys,
    dir: &StateDir,
    mountpoint: &Path,
    digest: Option<&str>,
    job_id: &str,
) -> Result<Option<Record>, StateError> {
    let Some(rec) = dir.read(mountpoint)? else {
        return Ok(None);
    };
    let pool_ok = match (digest, &rec.pool) {
        (None, _) => true,
        (Some(d), Some(p)) => p.digest == d,
        (Some(_), None) => false,
    };
    if rec.pending
        || rec.uid != sys.euid()
        || !pool_ok
        || !rec.refs.iter().any(|r| r.job_id.as_deref() == Some(job_id))
    {
        return Ok(None);
    }
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    Ok(match rec.mount_state(sys, &mounts, &rec.mount_point) {
        MountState::Mounted => Some(rec),
        _ => None,
    })
}

/// Mount `req.image` at `req.mountpoint` and record it, or add a reference to the same pool already
/// mounted there. Everything happens under the store's lock.
pub fn acquire(
    sys: &dyn Sys,
    dir: &StateDir,
    req: &AcquireRequest,
) -> Result<Acquired, StateError> {
    let (image, mp) = inspect(dir, req)?;
    let _lock = dir.lock()?;
    let mut a = Acquisition {
        sys,
        dir,
        req,
        me: sys.euid(),
        mp,
        image,
        notes: Vec::new(),
    };
    if let Some(reused) = a.settle_record()? {
        return Ok(reused);
    }
    a.mount()
}

/// The image to mount (read-write as the options say, served through the chunk server when
/// `req.serve` asks, read by the configured FUSE reader) and the canonical mount point.
fn inspect(dir: &StateDir, req: &AcquireRequest) -> Result<(ImageInfo, PathBuf), StateError> {
    let mut image = ImageInfo::inspect(&req.image)?;
    image.writable = req.options.writable();
    let mp = mount::canonical_mountpoint(&req.mountpoint)?;
    if let Some(p) = &req.serve {
        image.serve = Some(mount::serve::Serve {
            dir: dir.serve_path(&mp),
            digest: p.digest.clone(),
            keep: p.keep.clone(),
            source: p.source.clone(),
        });
    }
    Ok((image.with_reader(req.reader), mp))
}

/// One [`acquire`] under the store's lock: what it mounts where, for whom, and the notes it
/// gathers on the way.
struct Acquisition<'a> {
    sys: &'a dyn Sys,
    dir: &'a StateDir,
    req: &'a AcquireRequest,
    /// The caller's effective uid.
    me: u32,
    /// The canonical mount point.
    mp: PathBuf,
    image: ImageInfo,
    notes: Vec<String>,
}

impl Acquisition<'_> {
    /// Deal with a record already at the mount point: one more reference to the same pool this
    /// user has mounted there (the result, reused), an error when the mount point is taken, or
    /// the leftover of an interrupted or vanished mount undone (with a note) so that a new mount
    /// can follow (`None`).
    fn settle_record(&mut self) -> Result<Option<Acquired>, StateError> {
        let (sys, dir, req) = (self.sys, self.dir, self.req);
        let mp = self.mp.clone();
        let Some(mut rec) = dir.read(&mp)? else {
            return Ok(None);
        };
        let mounts = sys.mounts().map_err(MountError::MountTable)?;
        // its mount, found by ID elsewhere: a user renamed a directory above it; the record stays
        // (it is how `umount` and `cleanup` find that mount), so this mount point waits
        let at = rec.located(&mounts);
        if at != mp && rec.mount_state(sys, &mounts, &at) != MountState::Absent {
            return Err(StateError::Conflict {
                mount_point: mp.clone(),
                reason: format!(
                    "its recorded mount of {} was moved to {} (a directory above it was renamed); unmount it first (`sw-pool umount {}`)",
                    rec.label(),
                    at.display(),
                    mp.display()
                ),
            });
        }
        match rec.mount_state(sys, &mounts, &mp) {
            MountState::Mounted if rec.pending => {
                // its writer held the lock and is gone: a mount whose record was never completed
                self.notes.push(format!(
                    "an interrupted mount of {} at {} (pid {} died while mounting) was undone",
                    rec.label(),
                    mp.display(),
                    rec.refs.first().map(|r| r.pid).unwrap_or(0)
                ));
                mount::unmount(sys, &mp, true)?;
                dir.remove(&mp)?;
            }
            MountState::Mounted => {
                if rec.uid != self.me {
                    return Err(StateError::Conflict {
                        mount_point: mp,
                        reason: format!("is mounted by uid {}, not by you", rec.uid),
                    });
                }
                if !rec.same_image(&self.image) {
                    return Err(StateError::Conflict {
                        mount_point: mp.clone(),
                        reason: format!(
                            "already has {} ({}) mounted; unmount it first or choose another mount point",
                            rec.label(),
                            rec.image.display()
                        ),
                    });
                }
                let has_job_ref =
                    req.job_id.is_some() && rec.refs.iter().any(|r| r.job_id == req.job_id);
                let has_shell_ref = req.shell.is_some()
                    && rec
                        .refs
                        .iter()
                        .any(|r| r.shell == req.shell && r.job_id == req.job_id);
                if !(has_shell_ref || req.once_per_job && has_job_ref) {
                    rec.refs.push(Ref {
                        job_id: req.job_id.clone(),
                        since: now(),
                        pid: std::process::id(),
                        shell: req.shell,
                    });
                    dir.write(&rec)?;
                }
                return Ok(Some(Acquired {
                    record: rec,
                    reused: true,
                    mount_seconds: 0.0,
                    notes: std::mem::take(&mut self.notes),
                }));
            }
            MountState::Stale if rec.pending => {
                self.notes.push(format!(
                    "a stale, interrupted mount of {} at {} was cleaned",
                    rec.label(),
                    mp.display()
                ));
                mount::unmount(sys, &mp, true)?;
                dir.remove(&mp)?;
            }
            MountState::Stale => {
                return Err(StateError::Conflict {
                    mount_point: mp.clone(),
                    reason: format!(
                        "holds a stale mount of {} (its FUSE helper, pid {}, died); clean it with `sw-pool umount --force {}`",
                        rec.label(),
                        rec.helper_pid,
                        mp.display()
                    ),
                });
            }
            MountState::Absent => {
                self.notes.push(format!(
                    "a record said {} was mounted at {} but it was not (unmounted by hand?); record replaced",
                    rec.label(),
                    mp.display()
                ));
                dir.remove(&mp)?;
            }
        }
        Ok(None)
    }

    /// Mount the image afresh: the record written first (pending), then the chunk server's
    /// directory and the helper, then the record completed. On any failure the record, the log
    /// and the chunk server's directory go, and a mount made is undone.
    fn mount(self) -> Result<Acquired, StateError> {
        let Acquisition {
            sys,
            dir,
            req,
            me,
            mp,
            image,
            notes,
        } = self;
        let log = dir.log_path(&mp);
        // from the helper's start until the record is written: an interrupt waits for this to finish
        let _critical = mount::critical_section();
        // write-ahead: the record exists (pending) before the helper starts, so that even a SIGKILL
        // between mount and record leaves something `cleanup` and the Slurm epilog can find
        let mut rec = Record {
            schema: SCHEMA,
            mount_point: mp.clone(),
            image: image.path.clone(),
            format: image.format,
            backend: image.backend,
            pool: image.pool.clone(),
            helper_pid: 0,
            uid: me,
            user: user_name(me),
            node: dir.node().to_string(),
            created: now(),
            refs: vec![Ref {
                job_id: req.job_id.clone(),
                since: now(),
                pid: std::process::id(),
                shell: req.shell,
            }],
            pending: true,
            source: req.source.clone(),
            mount_id: None,
            serving: None,
            lease: req.lease.clone(),
        };
        dir.write(&rec)?;
        if let Some(s) = &image.serve {
            if let Err(e) = mount::serve::prepare_dir(sys, &s.dir) {
                let _ = dir.remove(&mp);
                return Err(MountError::Staging {
                    reason: format!("the chunk server's directory {}: {e}", s.dir.display()),
                }
                .into());
            }
        }
        let m = match mount::mount(sys, &image, &mp, &log, req.timeout) {
            Ok(m) => m,
            Err(e) => {
                let _ = std::fs::remove_file(&log);
                if let Some(s) = &image.serve {
                    mount::serve::release_dir(sys, &s.dir, 0);
                }
                let _ = dir.remove(&mp);
                return Err(e.into());
            }
        };
        rec.pending = false;
        // the helper that mounted it (sw-pool's tree server may have handed an image to squashfuse_ll)
        rec.backend = m.backend;
        rec.helper_pid = m.helper_pid;
        rec.mount_id = m.mount_id;
        rec.serving = Some(match &image.serve {
            // one hop: the tree server is the chunk server and serves at the mount point itself;
            // its directory for a served file is not used
            Some(s) if m.backend == mount::Backend::SwPoolTree => {
                mount::serve::release_dir(sys, &s.dir, 0);
                Serving::ChunkServer {
                    pid: m.helper_pid,
                    dir: None,
                }
            }
            Some(s) => Serving::ChunkServer {
                pid: m.helper_pid,
                dir: Some(s.dir.clone()),
            },
            None => Serving::Fuse {
                helper: m.backend,
                pid: m.helper_pid,
            },
        });
        if let Err(e) = dir.write(&rec) {
            // no record, no mount: undo it
            let _ = mount::unmount(sys, &mp, true);
            let _ = dir.remove(&mp);
            return Err(e);
        }
        Ok(Acquired {
            record: rec,
            reused: false,
            mount_seconds: m.elapsed.as_secs_f64(),
            notes,
        })
    }
}
