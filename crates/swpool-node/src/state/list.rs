//! What this user has on this node: records, stale mounts, records without mounts, mounts without records.

use super::*;

/// What [`list`] makes of a mount point (serialized lowercase, as `sw-pool list --json` prints it;
/// [`ListStatus::as_str`] gives the same name for the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListStatus {
    Ok,
    Mounting,
    Stale,
    Gone,
    Unrecorded,
    Corrupt,
}

impl ListStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ListStatus::Ok => "ok",
            ListStatus::Mounting => "mounting",
            ListStatus::Stale => "stale",
            ListStatus::Gone => "gone",
            ListStatus::Unrecorded => "unrecorded",
            ListStatus::Corrupt => "corrupt",
        }
    }
}

impl std::fmt::Display for ListStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One line of [`list`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListEntry {
    pub mount_point: PathBuf,
    pub record: Option<Record>,
    pub state: MountState,
    /// `ok`, `mounting` (being mounted right now), `stale` (FUSE process died, or the mount was
    /// interrupted), `gone` (record without mount), `unrecorded` (a mount of this user made by a FUSE
    /// helper sw-pool uses, without a record), `corrupt` (unreadable record).
    pub status: ListStatus,
    pub problem: Option<String>,
}

/// This node's mounts and records of the calling user.
pub fn list(sys: &dyn Sys, dir: &StateDir) -> Result<Vec<ListEntry>, StateError> {
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in dir.records()? {
        match r {
            Ok(rec) => {
                // where the recorded mount is now (by its ID: a user may have renamed a parent)
                let at = rec.located(&mounts);
                let st = rec.mount_state(sys, &mounts, &at);
                seen.insert(rec.mount_point.clone());
                seen.insert(at.clone());
                // the verifying chunk server's own mount (in-place and lazy loads) is the record's
                if let Some(Serving::ChunkServer { dir: Some(d), .. }) = &rec.serving {
                    seen.insert(d.clone());
                }
                let moved = (at != rec.mount_point && st != MountState::Absent).then(|| {
                    format!(
                        "moved: a directory above it was renamed; the mount is now at {} (`sw-pool umount {}` unmounts it there)",
                        at.display(),
                        rec.mount_point.display()
                    )
                });
                let writer = rec.refs.first().map(|r| r.pid).unwrap_or(0);
                let (status, problem) = match st {
                    _ if rec.pending && sys.running(writer) => (ListStatus::Mounting, None),
                    _ if rec.pending => (
                        ListStatus::Stale,
                        Some(format!(
                            "pid {writer} was killed while mounting it; clean it with `sw-pool cleanup --stale`"
                        )),
                    ),
                    MountState::Mounted => (ListStatus::Ok, moved),
                    MountState::Stale => (
                        ListStatus::Stale,
                        Some(format!(
                            "its FUSE helper (pid {}) died; clean it with `sw-pool cleanup --stale` (or `sw-pool umount --force {}`)",
                            rec.helper_pid,
                            rec.mount_point.display()
                        )),
                    ),
                    MountState::Absent => (
                        ListStatus::Gone,
                        Some(format!(
                            "recorded but not mounted; remove the record with `sw-pool umount {}`",
                            rec.mount_point.display()
                        )),
                    ),
                };
                out.push(ListEntry {
                    mount_point: rec.mount_point.clone(),
                    record: Some(rec),
                    state: st,
                    status,
                    problem,
                });
            }
            Err(e) => {
                let path = match &e {
                    StateError::Corrupt { path, .. } => path.clone(),
                    _ => dir.path().to_path_buf(),
                };
                out.push(ListEntry {
                    mount_point: PathBuf::new(),
                    record: None,
                    state: MountState::Absent,
                    status: ListStatus::Corrupt,
                    problem: Some(format!("{e} ({})", path.display())),
                });
            }
        }
    }
    let me = sys.euid();
    for m in &mounts {
        if m.is_swpool_helper() && m.fuse_user_id() == Some(me) && !seen.contains(&m.mount_point) {
            seen.insert(m.mount_point.clone());
            let st = mount::state(sys, &mounts, &m.mount_point);
            out.push(ListEntry {
                mount_point: m.mount_point.clone(),
                record: None,
                state: st,
                status: if st == MountState::Stale {
                    ListStatus::Stale
                } else {
                    ListStatus::Unrecorded
                },
                problem: Some(format!(
                    "a {} mount of {} without a sw-pool record{}",
                    m.fstype,
                    m.source,
                    if st == MountState::Stale {
                        "; its FUSE process died: `sw-pool umount --force`"
                    } else {
                        ""
                    }
                )),
            });
        }
    }
    Ok(out)
}

/// One node's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeList {
    pub node: String,
    pub state_dirs: Vec<std::path::PathBuf>,
    pub mounts: Vec<ListEntry>,
    /// `--unreported`: cache entries that nothing mounts.
    pub unused_cache: Vec<crate::cache::Entry>,
    /// `--unreported` where the site's mount helper is configured: what it holds that no record
    /// of this user reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helper: Option<HelperUnreported>,
    /// The caller's environments running on this node (`sw-pool run`/`shell` with a layer or in a
    /// job step).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environments: Vec<swpool_env::rendezvous::Info>,
    pub error: Option<String>,
}

/// The site's mount helper's side of `list --unreported` (from `sudo -n HELPER list`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HelperUnreported {
    /// Kernel mounts where the helper holds a reference of this user that none of this user's
    /// records reports (`cleanup --all` gives them back).
    pub references: Vec<HelperRef>,
    /// Loop devices of the helper's that back no mount (root's `cleanup` frees them).
    pub orphan_loops: Vec<String>,
    /// The helper could not be asked (why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A reference the helper holds for the user: a site pool (`what` = NAME/VERSION) or an image
/// (`what` = its path).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HelperRef {
    pub pool: bool,
    pub what: String,
    pub mount_point: PathBuf,
}

impl std::fmt::Display for HelperRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.what, self.mount_point.display())
    }
}

/// Ask the helper what it holds; keep what `recorded` (this user's records' mount points) does
/// not report.
pub fn helper_unreported(
    sys: &dyn Sys,
    helper: &Path,
    uid: u32,
    recorded: &std::collections::HashSet<PathBuf>,
) -> HelperUnreported {
    let cmd = if sys.euid() == 0 {
        crate::exec::ToolCommand::new(crate::exec::Tool::MountHelper).program(helper)
    } else {
        super::helper_sudo(helper)
    };
    let out = match sys.run(&cmd.arg("list")) {
        Ok(o) => o.stdout,
        Err(e) => {
            return HelperUnreported {
                error: Some(e.helper_reason()),
                ..Default::default()
            }
        }
    };
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
    let mut h = HelperUnreported::default();
    for m in v["mounts"].as_array().into_iter().flatten() {
        let mp = PathBuf::from(m["mount_point"].as_str().unwrap_or_default());
        if recorded.contains(&mp) {
            continue;
        }
        let mine = match m["kind"].as_str() {
            Some("pool") => m["refs"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|r| r["uid"].as_u64() == Some(u64::from(uid))),
            _ => m["owner"].as_u64() == Some(u64::from(uid)),
        };
        if mine {
            let pool = m["kind"].as_str() == Some("pool");
            h.references.push(HelperRef {
                pool,
                what: if pool {
                    format!(
                        "{}/{}",
                        m["name"].as_str().unwrap_or("?"),
                        m["version"].as_str().unwrap_or("?")
                    )
                } else {
                    m["image"].as_str().unwrap_or("?").to_string()
                },
                mount_point: mp,
            });
        }
    }
    h.orphan_loops = v["orphan_loops"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l.as_str().map(|s| format!("/dev/{s}")))
        .collect();
    h
}

/// Which entries `list` shows.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only mounts with a reference of this job.
    pub job: Option<String>,
    /// Only stale mounts and records whose mount is gone.
    pub stale: bool,
    /// Only what no record reports (unrecorded mounts, records without mounts), and unused cache entries.
    pub unreported: bool,
    /// The cache's base directory (`--cache-dir`).
    pub cache_dir: Option<PathBuf>,
}

fn keep(a: &ListFilter, e: &ListEntry) -> bool {
    if let Some(j) = &a.job {
        let has = e
            .record
            .as_ref()
            .is_some_and(|r| r.refs.iter().any(|x| x.job_id.as_deref() == Some(j)));
        if !has {
            return false;
        }
    }
    if a.stale && !matches!(e.status, ListStatus::Stale | ListStatus::Gone) {
        return false;
    }
    if a.unreported && !matches!(e.status, ListStatus::Unrecorded | ListStatus::Gone) {
        return false;
    }
    true
}

/// This user's mounts, records and (with `unreported`) unused cache entries on this node, from
/// every store the user's records may be in.
pub fn node_list(
    sys: &dyn Sys,
    a: &ListFilter,
    cfg: &crate::config::Config,
    env: &crate::config::Environment,
) -> Result<NodeList, StateError> {
    let uid = sys.euid();
    let mut dirs = candidate_dirs(uid, env);
    // the store this user's commands use (a private fallback when /tmp/sw-pool-<uid> is squatted)
    let def = StateDir::open_default(env)?.path().to_path_buf();
    if !dirs.contains(&def) {
        dirs.insert(0, def);
    }
    let mut mounts = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut used_dirs = Vec::new();
    for d in &dirs {
        let dir = StateDir::open(d, uid)?;
        used_dirs.push(dir.path().to_path_buf());
        for e in list(sys, &dir)? {
            // an unrecorded mount shows up once, not once per store
            if e.record.is_none()
                && e.status != ListStatus::Corrupt
                && !seen.insert(e.mount_point.clone())
            {
                continue;
            }
            if e.record.is_some() {
                seen.insert(e.mount_point.clone());
            }
            mounts.push(e);
        }
    }
    // a mount recorded in one store is not "unrecorded" because another store lacks it
    let recorded: std::collections::HashSet<_> = mounts
        .iter()
        .filter(|e| e.record.is_some())
        .map(|e| e.mount_point.clone())
        .collect();
    mounts.retain(|e| e.record.is_some() || !recorded.contains(&e.mount_point));
    mounts.retain(|e| keep(a, e));
    let mut unused_cache = Vec::new();
    if a.unreported {
        let base =
            crate::cache::base_dir(a.cache_dir.as_deref(), cfg.cache_dir.value.as_deref(), env);
        let in_use = StateDir::open_default(env)
            .map(|d| images_in_use(&d))
            .unwrap_or_default();
        if let Ok(cdir) = crate::cache::dir(&base, uid, false) {
            if let Ok(entries) = crate::cache::list(&cdir, &in_use) {
                unused_cache = entries.into_iter().filter(|e| !e.in_use).collect();
            }
        }
    }
    let helper = match (&cfg.mount_helper.value, a.unreported) {
        (Some(h), true) => Some(helper_unreported(sys, h, uid, &recorded)),
        _ => None,
    };
    // the environments this user runs here meet their joiners in the state directories' envs/
    let mut environments = Vec::new();
    if a.job.is_none() && !a.stale {
        for d in &used_dirs {
            environments.extend(swpool_env::rendezvous::running(&d.join("envs")));
        }
    }
    Ok(NodeList {
        node: crate::users::hostname(),
        state_dirs: used_dirs,
        mounts,
        unused_cache,
        helper,
        environments,
        error: None,
    })
}

/// `cleanup --stale`/`--all` where the site's helper is configured: with `all`, give back the
/// references it holds for this user that no record reports (`release-pool`, `umount`) — not
/// with `--stale` alone, which the Prolog runs: a load of another job of the user's may be between
/// the helper's mount and its record; and, as root, have it clean up (forget mounts that are
/// gone, free its loop devices that back no mount).
pub fn clean_helper(
    sys: &dyn Sys,
    helper: &Path,
    all: bool,
    dry_run: bool,
    env: &crate::config::Environment,
) -> Vec<Action> {
    let uid = sys.euid();
    let recorded: std::collections::HashSet<PathBuf> = candidate_dirs(uid, env)
        .iter()
        .filter_map(|d| StateDir::open(d, uid).ok())
        .flat_map(|d| d.records().unwrap_or_default())
        .filter_map(|r| r.ok().map(|r| r.mount_point))
        .collect();
    let h = helper_unreported(sys, helper, uid, &recorded);
    let mut out = Vec::new();
    let act =
        |mp: PathBuf, pool: String, action: &'static str, detail: String, done: bool| Action {
            mount_point: mp,
            pool,
            jobs: Vec::new(),
            action,
            detail,
            done,
        };
    for r in h.references.iter().filter(|_| all) {
        if dry_run {
            out.push(act(
                r.mount_point.clone(),
                r.what.clone(),
                "released",
                "a reference of yours at the site's helper that no record reports".into(),
                false,
            ));
            continue;
        }
        let res = if r.pool {
            super::helper_release_spec(sys, helper, &r.what, None)
        } else {
            super::helper_umount(sys, helper, &r.mount_point)
        };
        out.push(match res {
            Ok(()) => act(
                r.mount_point.clone(),
                r.what.clone(),
                "released",
                "a reference of yours at the site's helper that no record reported".into(),
                true,
            ),
            Err(e) => act(
                r.mount_point.clone(),
                r.what.clone(),
                "failed",
                format!("the site's mount helper: {e}"),
                false,
            ),
        });
    }
    if uid == 0 && !h.orphan_loops.is_empty() {
        let detail = "loop devices of the site's helper that backed no mount".to_string();
        if dry_run {
            for l in &h.orphan_loops {
                out.push(act(
                    l.into(),
                    "-".into(),
                    "loop-freed",
                    detail.clone(),
                    false,
                ));
            }
        } else {
            let cmd = crate::exec::ToolCommand::new(crate::exec::Tool::MountHelper)
                .program(helper)
                .arg("cleanup");
            match sys.run(&cmd) {
                Ok(o) => {
                    let v: serde_json::Value =
                        serde_json::from_str(o.stdout.trim()).unwrap_or_default();
                    for l in v["loops_freed"].as_array().into_iter().flatten() {
                        out.push(act(
                            format!("/dev/{}", l.as_str().unwrap_or("?")).into(),
                            "-".into(),
                            "loop-freed",
                            detail.clone(),
                            true,
                        ));
                    }
                }
                Err(e) => out.push(act(
                    helper.to_path_buf(),
                    "-".into(),
                    "failed",
                    format!("the site's mount helper's cleanup: {e}"),
                    false,
                )),
            }
        }
    }
    out
}

#[cfg(test)]
mod helper_tests {
    use super::*;
    use crate::mount::sys::{FakeScript, FakeSys};

    const LIST: &str = r#"{"mounts": [
      {"kind": "pool", "name": "gcc", "version": "12", "mount_point": "/run/s/gcc/12",
       "refs": [{"uid": 1000, "user": "a", "job": "7"}, {"uid": 1001, "user": "b"}]},
      {"kind": "pool", "name": "zlib", "version": "1", "mount_point": "/run/s/zlib/1",
       "refs": [{"uid": 1000, "user": "a"}]},
      {"kind": "pool", "name": "mpi", "version": "4", "mount_point": "/run/s/mpi/4",
       "refs": [{"uid": 1001, "user": "b"}]},
      {"kind": "image", "image": "/home/a/d.img", "owner": 1000, "mount_point": "/run/u/a/d"},
      {"kind": "image", "image": "/home/b/e.img", "owner": 1001, "mount_point": "/run/u/b/e"}
    ], "orphan_loops": ["loop3"]}"#;

    /// Only this user's references that no record of theirs reports; every orphan loop device.
    #[test]
    fn unreported_keeps_this_users_unrecorded_references() {
        let sys = FakeSys::new(FakeScript {
            helper_answers: [Ok(LIST.to_string())].into(),
            euid: 1000,
            ..Default::default()
        });
        let recorded: std::collections::HashSet<PathBuf> =
            [PathBuf::from("/run/s/zlib/1")].into_iter().collect();
        let h = helper_unreported(&sys, Path::new("/h"), 1000, &recorded);
        let got: Vec<String> = h.references.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            got,
            ["gcc/12 at /run/s/gcc/12", "/home/a/d.img at /run/u/a/d"]
        );
        assert!(h.references[0].pool && !h.references[1].pool);
        assert_eq!(h.orphan_loops, ["/dev/loop3"]);
        assert!(h.error.is_none());
    }

    #[test]
    fn a_helper_that_cannot_be_asked_is_an_error_in_the_listing_not_a_failure() {
        let sys = FakeSys::new(FakeScript {
            helper_answers: [Err("sudo: a password is required".to_string())].into(),
            euid: 1000,
            ..Default::default()
        });
        let h = helper_unreported(&sys, Path::new("/h"), 1000, &Default::default());
        assert!(h.references.is_empty());
        assert_eq!(h.error.as_deref(), Some("sudo: a password is required"));
    }
}
