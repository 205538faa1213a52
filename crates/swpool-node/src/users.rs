//! Users, groups and this host, as the system knows them: the one place sw-pool asks.
//!
//! Users and groups come from NSS (`getpwuid_r`, `getpwnam_r` through the `nix` crate), so users
//! from LDAP, SSSD or any other NSS source are found, not only those in `/etc/passwd`. Switching a
//! child process to a user ([`Credentials::apply_to`]) sets exactly the ids meant and checks them
//! afterwards, refusing to run the child if it still has root's ids or any other id.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use nix::unistd::{Uid, User};

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("uid {0} is not known to the user database (NSS: /etc/passwd, LDAP, SSSD, ...)")]
    UnknownUid(u32),
    #[error("user {0:?} is not known to the user database (NSS: /etc/passwd, LDAP, SSSD, ...)")]
    UnknownName(String),
    #[error("cannot look up {what} in the user database: {source}")]
    Lookup { what: String, source: nix::Error },
    #[error("refusing to run a program as uid 0 where a user's ids were meant")]
    Root,
    /// Running `sw-pool SUB` as a user (the Slurm hooks' clean-up) failed before it could start.
    #[error("cannot run sw-pool {sub} as uid {uid}: {reason}")]
    RunAs {
        sub: String,
        uid: u32,
        reason: String,
    },
}

impl UserError {
    pub fn exit_status(&self) -> swpool_format::status::ExitStatus {
        swpool_format::status::ExitStatus::System
    }
}

/// A user's entry in the user database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: u32,
    /// The primary group.
    pub gid: u32,
    pub home: PathBuf,
}

impl From<User> for UserInfo {
    fn from(u: User) -> Self {
        UserInfo {
            name: u.name,
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            home: u.dir,
        }
    }
}

/// The user with id `uid`.
pub fn by_uid(uid: u32) -> Result<UserInfo, UserError> {
    match User::from_uid(Uid::from_raw(uid)) {
        Ok(Some(u)) => Ok(u.into()),
        Ok(None) => Err(UserError::UnknownUid(uid)),
        Err(source) => Err(UserError::Lookup {
            what: format!("uid {uid}"),
            source,
        }),
    }
}

/// The user named `name`.
pub fn by_name(name: &str) -> Result<UserInfo, UserError> {
    match User::from_name(name) {
        Ok(Some(u)) => Ok(u.into()),
        Ok(None) => Err(UserError::UnknownName(name.into())),
        Err(source) => Err(UserError::Lookup {
            what: format!("user {name:?}"),
            source,
        }),
    }
}

/// A user given as a name or a number (`alice`, `1000`). A number is taken as a uid even if no
/// user has it (the caller may clean up after a user removed from the database).
pub fn uid_of(spec: &str) -> Result<u32, UserError> {
    match spec.parse::<u32>() {
        Ok(n) => Ok(n),
        Err(_) => by_name(spec).map(|u| u.uid),
    }
}

/// The name of `uid` for messages and records: the user database's name, else the number.
pub fn name_of(uid: u32) -> String {
    by_uid(uid)
        .map(|u| u.name)
        .unwrap_or_else(|_| uid.to_string())
}

/// This host's name (the kernel's node name, `uname -n`), as every message and record names it.
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// The ids a child process runs with after dropping root: a user, a group and supplementary groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// `errno` a child reports when its ids are not the ones meant after switching (see
/// [`Credentials::apply_to`]); no system call of the switch returns it.
const IDS_MISMATCH: i32 = libc::ENOTRECOVERABLE;

impl Credentials {
    /// `uid` with primary group `gid` and no supplementary groups. Refuses uid 0.
    pub fn without_groups(uid: u32, gid: u32) -> Result<Credentials, UserError> {
        if uid == 0 {
            return Err(UserError::Root);
        }
        Ok(Credentials {
            uid,
            gid,
            groups: Vec::new(),
        })
    }

    /// Make `cmd`'s child switch to these ids before it runs the program: supplementary groups,
    /// then the group, then the user (real, effective and saved ids alike). Then the child checks
    /// that its real and effective uid are not 0 and that every id is the one meant; if not, the
    /// program is not run and spawning fails with an error that [`Credentials::explain`] turns into
    /// a message.
    pub fn apply_to(&self, cmd: &mut Command) {
        let me = self.clone();
        // SAFETY: the closure runs in the forked child before exec. It only makes system calls
        // that are async-signal-safe (setgroups, setresgid, setresuid, getresuid, getresgid,
        // getgroups), reads `me` (allocated before the fork) and a stack buffer, and allocates
        // nothing; errors are plain OS error codes.
        unsafe {
            cmd.pre_exec(move || me.switch_in_child());
        }
    }

    fn switch_in_child(&self) -> std::io::Result<()> {
        let os = std::io::Error::last_os_error;
        // SAFETY: plain system calls on ids; `groups` is a valid slice for its length.
        unsafe {
            if libc::setgroups(self.groups.len(), self.groups.as_ptr()) != 0 {
                return Err(os());
            }
            if libc::setresgid(self.gid, self.gid, self.gid) != 0 {
                return Err(os());
            }
            if libc::setresuid(self.uid, self.uid, self.uid) != 0 {
                return Err(os());
            }
        }
        if self.uid != 0 && ids_are(self) {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(IDS_MISMATCH))
        }
    }

    /// A message for an error from spawning a command these credentials were applied to.
    pub fn explain(&self, e: &std::io::Error) -> String {
        if e.raw_os_error() == Some(IDS_MISMATCH) {
            format!(
                "after switching to uid {} gid {} the process did not have exactly those ids \
                 (and groups {:?}); refused to run it",
                self.uid, self.gid, self.groups
            )
        } else {
            e.to_string()
        }
    }
}

/// Does the calling process have exactly `c`'s ids: real, effective and saved uid and gid, and
/// the supplementary groups (in any order)? Allocates nothing (it runs between fork and exec).
fn ids_are(c: &Credentials) -> bool {
    let (mut ru, mut eu, mut su) = (0, 0, 0);
    let (mut rg, mut eg, mut sg) = (0, 0, 0);
    // SAFETY: the out-pointers are valid local variables.
    let ok = unsafe {
        libc::getresuid(&mut ru, &mut eu, &mut su) == 0
            && libc::getresgid(&mut rg, &mut eg, &mut sg) == 0
    };
    if !ok || [ru, eu, su] != [c.uid; 3] || [rg, eg, sg] != [c.gid; 3] {
        return false;
    }
    let mut buf = [0 as libc::gid_t; 256];
    // SAFETY: `buf` holds `buf.len()` gids; getgroups writes at most that many.
    let n = unsafe { libc::getgroups(buf.len() as libc::c_int, buf.as_mut_ptr()) };
    if n < 0 {
        return false;
    }
    let have = &buf[..n as usize];
    // the kernel may list the primary group among the supplementary ones; no other extra group
    have.iter().all(|g| c.groups.contains(g) || *g == c.gid)
        && c.groups.iter().all(|g| have.contains(g))
}

/// Run `sw-pool SUB ARGS` as `uid` with a clean environment: PATH, HOME, USER, LOGNAME,
/// `SW_POOL_SYSTEM_CONFIG` and `RUST_LOG` when `env` has them, plus `extra`. Returns its exit status.
///
/// The user comes from the user database (NSS); the primary group is `gid` (Slurm's job gid) or the
/// user's own, never one made up. No supplementary groups: the cleanup only touches what the uid
/// owns (its state directories, its FUSE mounts and helpers). The child checks after switching that
/// it is not root and has exactly these ids, else it does not run (see [`Credentials`]).
pub fn run_self_as(
    uid: u32,
    gid: Option<u32>,
    sub: &str,
    args: &[String],
    extra: &[(&str, String)],
    env: &crate::config::Environment,
) -> Result<i32, UserError> {
    use crate::config::{EnvVar, HostVar};
    let fail = |reason: String| UserError::RunAs {
        sub: sub.to_string(),
        uid,
        reason,
    };
    let who = by_uid(uid).map_err(|e| fail(e.to_string()))?;
    let gid = gid.unwrap_or(who.gid);
    let creds = Credentials::without_groups(uid, gid).map_err(|e| fail(e.to_string()))?;
    let exe = std::env::current_exe()
        .map_err(|e| fail(format!("cannot find our own executable: {e}")))?;
    let user = who.name;
    let mut c = std::process::Command::new(&exe);
    c.arg(sub)
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", &who.home)
        .env("USER", &user)
        .env("LOGNAME", &user)
        .current_dir("/");
    creds.apply_to(&mut c);
    if let Some(v) = env.get_os(EnvVar::SystemConfig) {
        c.env(EnvVar::SystemConfig.name(), v);
    }
    if let Some(v) = env.get_os(HostVar::RustLog) {
        c.env(HostVar::RustLog.name(), v);
    }
    for (k, v) in extra {
        c.env(k, v);
    }
    tracing::debug!(
        "as uid {uid} gid {gid}: {} {sub} {}",
        exe.display(),
        args.join(" ")
    );
    let st = c
        .status()
        .map_err(|e| fail(format!("{}: {}", exe.display(), creds.explain(&e))))?;
    Ok(st
        .code()
        .unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&st).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_resolves_by_uid_and_name() {
        let r = by_uid(0).unwrap();
        assert_eq!((r.uid, r.gid, r.name.as_str()), (0, 0, "root"));
        assert_eq!(by_name("root").unwrap(), r);
        assert_eq!(uid_of("root").unwrap(), 0);
        assert_eq!(name_of(0), "root");
    }

    #[test]
    fn the_current_user_resolves() {
        let uid = rustix::process::getuid().as_raw();
        let u = by_uid(uid).unwrap();
        assert_eq!(u.uid, uid);
        assert_eq!(by_name(&u.name).unwrap().uid, uid);
        assert_eq!(uid_of(&u.name).unwrap(), uid);
    }

    #[test]
    fn an_unknown_user_is_a_clear_error() {
        // uid 4294967294 is (uint32)-2, "nobody" on no system we know; 4294967295 is -1 (invalid)
        let e = by_uid(4_294_967_294).unwrap_err().to_string();
        assert!(
            e.contains("uid 4294967294 is not known to the user database"),
            "{e}"
        );
        let e = by_name("no-such-user-swpool").unwrap_err().to_string();
        assert!(e.contains("\"no-such-user-swpool\" is not known"), "{e}");
        assert!(uid_of("no-such-user-swpool").is_err());
        assert_eq!(uid_of("4294967294").unwrap(), 4_294_967_294);
        assert_eq!(name_of(4_294_967_294), "4294967294");
    }

    #[test]
    fn credentials_refuse_root_and_check_ids() {
        assert!(matches!(
            Credentials::without_groups(0, 0),
            Err(UserError::Root)
        ));
        let uid = rustix::process::getuid().as_raw();
        let gid = rustix::process::getgid().as_raw();
        let groups: Vec<u32> = rustix::process::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        let me = Credentials { uid, gid, groups };
        assert!(ids_are(&me));
        let other = Credentials {
            uid: uid.wrapping_add(1),
            ..me.clone()
        };
        assert!(!ids_are(&other));
        let more = Credentials {
            groups: vec![4_294_967_000],
            ..me.clone()
        };
        assert!(!ids_are(&more));
    }

    #[test]
    fn a_child_that_cannot_switch_does_not_run() {
        // unprivileged, switching to another uid fails (EPERM); as root it succeeds and the
        // child runs as that uid; either way the program never runs with the wrong ids
        let target = Credentials::without_groups(4_294_967_000, 4_294_967_000).unwrap();
        let mut c = Command::new("id");
        c.arg("-u");
        target.apply_to(&mut c);
        match c.output() {
            Ok(o) => assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "4294967000"),
            Err(e) => assert!(
                rustix::process::geteuid().as_raw() != 0,
                "{}",
                target.explain(&e)
            ),
        }
    }

    #[test]
    fn hostname_is_the_node_name() {
        let h = hostname();
        assert!(!h.is_empty());
        assert_eq!(
            h,
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .unwrap()
                .trim()
        );
    }
}
