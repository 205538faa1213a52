//! Per-user directories at predictable names in shared places: the record store and mount root
//! `/tmp/sw-pool-<uid>` (jobs have no `XDG_RUNTIME_DIR`) and the cache `<base>/sw-pool-<uid>`.
//!
//! Another user can create such a name first (a plain `mkdir`, a symlink). Refusing to use it is
//! right; being stuck is not. So when the predictable name is not the user's own private directory,
//! the user gets a fallback `<parent>/sw-pool-<uid>.<random>`: an existing one of the user's (found
//! by scanning `<parent>` for directories the user owns, so that later runs, `list` and the Slurm
//! hooks find it), else a new one with an unpredictable name (created 0700; a name someone else
//! took only makes us pick another). The squat is logged.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The predictable name.
pub fn predictable(parent: &Path, uid: u32) -> PathBuf {
    parent.join(format!("sw-pool-{uid}"))
}

/// Why a directory is not the user's own private one (`None`: it is, or it does not exist).
fn unusable(p: &Path, uid: u32) -> Option<String> {
    not_private(&std::fs::symlink_metadata(p).ok()?, uid)
}

/// The one rule for every place sw-pool keeps a user's state (the record store, the mount root,
/// the cache, `$XDG_RUNTIME_DIR`): a real directory (not a symlink), owned by `uid`, that no one
/// else can write. `None` when `m` is such a directory, else why not.
pub fn not_private(m: &std::fs::Metadata, uid: u32) -> Option<String> {
    if m.file_type().is_symlink() {
        Some("is a symbolic link".into())
    } else if !m.is_dir() {
        Some("is not a directory".into())
    } else if m.uid() != uid {
        Some(format!("belongs to uid {}", m.uid()))
    } else if m.mode() & 0o022 != 0 {
        Some(format!(
            "is writable by others (mode {:o})",
            m.mode() & 0o7777
        ))
    } else {
        None
    }
}

/// `$XDG_RUNTIME_DIR` (`xdg_runtime_dir`: its value, as the caller read it) when it is set and
/// passes [`not_private`]'s rule; otherwise (unset, another user's, world-writable, a symlink)
/// `None`, and the caller falls back to `/tmp/sw-pool-<uid>` (a warning names why, once).
pub fn runtime_dir(xdg_runtime_dir: Option<&std::ffi::OsStr>, uid: u32) -> Option<PathBuf> {
    let x = PathBuf::from(xdg_runtime_dir.filter(|v| !v.is_empty())?);
    match std::fs::symlink_metadata(&x) {
        Ok(m) => match not_private(&m, uid) {
            None => Some(x),
            Some(why) => {
                warn_once(&format!(
                    "$XDG_RUNTIME_DIR {} {why}; not using it (sw-pool keeps its state in /tmp/sw-pool-{uid} instead)",
                    crate::exec::show(&x)
                ));
                None
            }
        },
        Err(_) => None,
    }
}

/// Print `msg` as a warning (`sw-pool: warning: …`, one write) the first time this process sees
/// it: a squatted name is met by every step that looks for the user's directories.
pub fn warn_once(msg: &str) {
    use std::io::Write;
    static SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen.iter().any(|s| s == msg) {
        return;
    }
    seen.push(msg.to_string());
    let line = format!("sw-pool: warning: {msg}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// The user's fallback directories in `parent` (`sw-pool-<uid>.<suffix>`, owned by `uid`, private,
/// not symlinks), oldest name first.
pub fn fallbacks(parent: &Path, uid: u32) -> Vec<PathBuf> {
    let prefix = format!("sw-pool-{uid}.");
    let mut v: Vec<PathBuf> = std::fs::read_dir(parent)
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|n| n.starts_with(&prefix) && n.len() > prefix.len())
                })
                .map(|e| e.path())
                .filter(|p| {
                    std::fs::symlink_metadata(p)
                        .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o077 == 0)
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

pub fn random_suffix() -> String {
    let mut b = [0u8; 8];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut b))
        .is_ok();
    if !ok {
        // no /dev/urandom: time and pid (a collision only makes us try another name)
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let h = blake3::hash(format!("{t}:{}", std::process::id()).as_bytes());
        b.copy_from_slice(&h.as_bytes()[..8]);
    }
    hex::encode(b)
}

/// The user's directory in `parent`: the predictable name when it is missing (created 0700 when
/// `create`) or already the user's private directory; else a fallback (see the module docs).
/// Without `create`, a missing directory is returned as the predictable name.
pub fn resolve(parent: &Path, uid: u32, create: bool) -> io::Result<PathBuf> {
    let p = predictable(parent, uid);
    let Some(why) = unusable(&p, uid) else {
        if create {
            match std::fs::DirBuilder::new().mode(0o700).create(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // created in between: by us (fine) or by someone else (check again)
                    if unusable(&p, uid).is_some() {
                        return resolve(parent, uid, create);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        return Ok(p);
    };
    if let Some(f) = fallbacks(parent, uid).into_iter().next() {
        return Ok(f);
    }
    warn_once(&format!(
        "{} {why}: someone else took the name; using a private directory beside it",
        crate::exec::show(&p)
    ));
    crate::syslog::syslog(
        crate::syslog::Level::Warning,
        &format!(
            "uid={uid} {} {why}: squatted name, using a private fallback directory",
            p.display()
        ),
    );
    if !create {
        return Ok(p);
    }
    for _ in 0..16 {
        let f = parent.join(format!("sw-pool-{uid}.{}", random_suffix()));
        match std::fs::DirBuilder::new().mode(0o700).create(&f) {
            Ok(()) => return Ok(f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "cannot create a private directory in {}",
        parent.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_squatted_name_falls_back_and_is_found_again() {
        let d = tempfile::tempdir().unwrap();
        let parent = d.path();
        let uid = rustix::process::geteuid().as_raw();
        // free name: the predictable one
        let p = resolve(parent, uid, true).unwrap();
        assert_eq!(p, predictable(parent, uid));
        std::fs::remove_dir(&p).unwrap();
        // squatted by a symlink (and, as another user would, by a file): a fallback, the same
        // one on the next call, and the squat stays untouched
        std::os::unix::fs::symlink("/", predictable(parent, uid)).unwrap();
        let f = resolve(parent, uid, true).unwrap();
        assert_ne!(f, predictable(parent, uid));
        assert!(f
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&format!("sw-pool-{uid}.")));
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o700);
        assert_eq!(resolve(parent, uid, true).unwrap(), f);
        assert_eq!(fallbacks(parent, uid), vec![f.clone()]);
        assert!(std::fs::symlink_metadata(predictable(parent, uid))
            .unwrap()
            .file_type()
            .is_symlink());
        // a world-writable fallback is not ours to use
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        assert!(fallbacks(parent, uid).is_empty());
    }
}
