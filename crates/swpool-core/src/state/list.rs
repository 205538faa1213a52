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
pub fn list(sys: &dyn Sys, dir: &StateDir) -> Result<Vec<ListEntry>, Error> {
    let mounts = sys.mounts().map_err(MountError::MountTable)?;
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in dir.records()? {
        match r {
            Ok(rec) => {
                let st = mount::state(sys, &mounts, &rec.mount_point);
                seen.insert(rec.mount_point.clone());
                let writer = rec.refs.first().map(|r| r.pid).unwrap_or(0);
                let (status, problem) = match st {
                    _ if rec.pending && clean::alive(writer) => (ListStatus::Mounting, None),
                    _ if rec.pending => (
                        ListStatus::Stale,
                        Some(format!(
                            "pid {writer} was killed while mounting it; clean it with `sw-pool cleanup --stale`"
                        )),
                    ),
                    MountState::Mounted => (ListStatus::Ok, None),
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
