//! Who asked: the user who ran `sudo sw-pool-mount-helper …` (sudo's `SUDO_UID`, read once before
//! the environment is dropped, and trusted only because the real uid is root: only sudo or root
//! itself can start the helper that way), or root (the Slurm prolog, an admin). The helper touches
//! a caller's files with the caller's credentials ([`Caller::open_bounded`]), so it never opens for a
//! user what that user could not open.

use std::ffi::OsString;
use std::path::Path;

use crate::error::{HelperError, Refusal, Result};

#[derive(Debug, Clone)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub name: String,
    groups: Vec<libc::gid_t>,
}

impl Caller {
    /// Root, or the user sudo ran the helper for. `sudo_uid` is `SUDO_UID` as sudo set it.
    pub fn identify(sudo_uid: Option<OsString>) -> Result<Caller> {
        let (ruid, euid) = (rustix::process::getuid(), rustix::process::geteuid());
        if !euid.is_root() {
            return Err(HelperError::refused(Refusal::Caller,
                "sw-pool-mount-helper must run as root: through sudo (see its --help for the sudoers line) or from a root Slurm prolog",
            ));
        }
        let uid = if !ruid.is_root() {
            ruid.as_raw() // a setuid-root install: the real uid is the caller
        } else {
            match sudo_uid {
                None => 0,
                Some(v) => v.to_str().and_then(|s| s.parse().ok()).ok_or_else(|| {
                    HelperError::refused(
                        Refusal::Caller,
                        format!("SUDO_UID {v:?} is not a user id"),
                    )
                })?,
            }
        };
        Self::of_uid(uid)
    }

    pub fn of_uid(uid: u32) -> Result<Caller> {
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .ok_or_else(|| {
                HelperError::refused(Refusal::Caller, format!("uid {uid} has no passwd entry"))
            })?;
        let cname = std::ffi::CString::new(user.name.clone())
            .map_err(|_| HelperError::refused(Refusal::Caller, "user name with a NUL byte"))?;
        let groups = nix::unistd::getgrouplist(&cname, user.gid)
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|_| vec![user.gid.as_raw()]);
        Ok(Caller {
            uid,
            gid: user.gid.as_raw(),
            name: user.name,
            groups,
        })
    }

    /// The ids a thread takes to open the caller's files (`None`: root, as it is).
    pub fn ids(&self) -> Option<crate::bounded::As> {
        (!self.is_root()).then(|| crate::bounded::As {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        })
    }

    /// [`crate::bounded::open_as`] with the caller's ids: open `path` as the caller, within
    /// `limit`, refused with a message naming the file when it fails or does not finish.
    pub fn open_bounded<H: crate::host::Host>(
        &self,
        h: &H,
        what: &str,
        path: &Path,
        write: bool,
        limit: std::time::Duration,
    ) -> Result<crate::bounded::Opened> {
        use crate::bounded::OpenError;
        h.open_as(self.ids(), path, write, limit).map_err(|e| match e {
            OpenError::Stalled(d) => HelperError::refused(Refusal::Stalled, format!(
                "{what} {}: opening it did not finish within {:.1} s (its file system does not answer: a stopped FUSE daemon?); nothing was done (helper.toml: file_timeout_secs)",
                path.display(),
                d.as_secs_f64()
            )),
            OpenError::Io(e) => {
                let why = match e.raw_os_error() {
                    Some(libc::ELOOP) => "it is a symlink (refused: give the file itself)".to_string(),
                    Some(libc::EACCES) => "you cannot open it (permission denied)".to_string(),
                    _ => e.to_string(),
                };
                HelperError::refused(Refusal::FileOpen, format!("{what} {}: {why}; nothing was done", path.display()))
            }
        })
    }

    /// A caller with no passwd lookup (unit tests).
    #[cfg(test)]
    pub fn fake(uid: u32, name: &str) -> Caller {
        Caller {
            uid,
            gid: uid,
            name: name.into(),
            groups: vec![uid],
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// `gid` is the caller's primary group or one of their groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A path from the caller: absolute, with no `.`/`..` component, no control character (a newline
/// would forge lines in the mount table and the logs) and no more than 1024 bytes.
pub fn check_path(what: &str, p: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let b = p.as_os_str().as_bytes();
    if b.len() > 1024 {
        return Err(HelperError::refused(
            Refusal::Path,
            format!("{what} is longer than 1024 bytes"),
        ));
    }
    if b.iter().any(|c| c.is_ascii_control()) {
        return Err(HelperError::refused(
            Refusal::Path,
            format!(
                "{what} {:?} contains a control character (a newline?); refused",
                p
            ),
        ));
    }
    let dots = b
        .split(|c| *c == b'/')
        .any(|seg| seg == b"." || seg == b"..");
    if dots || !swpool_sys::kmount::is_absolute_clean(p) {
        return Err(HelperError::refused(
            Refusal::Path,
            format!(
                "{what} {} must be absolute, without '.' or '..' components",
                p.display()
            ),
        ));
    }
    Ok(())
}

/// A job id as Slurm writes them (digits, `_` for array tasks), before anything else looks at it.
pub fn check_job_form(job: &str) -> Result<()> {
    if job.is_empty() || job.len() > 32 || !job.bytes().all(|b| b.is_ascii_digit() || b == b'_') {
        return Err(HelperError::refused(
            Refusal::Job,
            format!("job id {job:?} is not a Slurm job id"),
        ));
    }
    Ok(())
}

/// `--job-id J`: accepted from a user only for a job Slurm says is theirs (root: any).
pub fn check_job<H: crate::host::Host>(
    h: &H,
    c: &Caller,
    job: &str,
    slurm_conf: Option<&Path>,
    limit: std::time::Duration,
) -> Result<()> {
    check_job_form(job)?;
    if c.is_root() {
        return Ok(());
    }
    let env: Vec<(&str, std::ffi::OsString)> = slurm_conf
        .map(|s| ("SLURM_CONF", s.as_os_str().to_os_string()))
        .into_iter()
        .collect();
    let args: Vec<std::ffi::OsString> = ["-h", "-j", job, "-o", "%U"]
        .iter()
        .map(Into::into)
        .collect();
    let out = match h.run_tool("squeue", &args, &env, limit)? {
        crate::bounded::ToolEnd::Done(out) => out,
        crate::bounded::ToolEnd::Killed(d) => {
            return Err(HelperError::tool(
                "squeue",
                format!(
                    "did not answer within {:.0} s and was killed; nothing was done: ask again, or an admin checks slurmctld (helper.toml: tool_timeout_secs)",
                    d.as_secs_f64()
                ),
            ))
        }
    };
    let owner = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || owner.is_empty() {
        return Err(HelperError::refused(
            Refusal::Job,
            format!(
                "job {job} is not a running Slurm job ({}); nothing was done",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    if owner != c.uid.to_string() {
        return Err(HelperError::refused(
            Refusal::Job,
            format!(
                "job {job} belongs to uid {owner}, not to you ({}, uid {}); nothing was done",
                c.name, c.uid
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caller_paths_are_checked() {
        assert!(check_path("p", Path::new("/a/b")).is_ok());
        for bad in ["a/b", "/a/../b", "/a/./b", "/a\nb", "/a\tb"] {
            assert!(check_path("p", Path::new(bad)).is_err(), "{bad}");
        }
        assert!(check_path("p", Path::new(&format!("/{}", "x".repeat(2000)))).is_err());
    }

    #[test]
    fn job_ids_are_checked_before_slurm_is_asked() {
        for bad in ["", "1;rm", "-j", "12 34", &"9".repeat(40)] {
            let e = check_job_form(bad).unwrap_err().to_string();
            assert!(e.contains("not a Slurm job id"), "{bad}: {e}");
        }
    }
}
