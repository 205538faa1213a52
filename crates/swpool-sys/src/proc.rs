//! What the kernel says about mounts and processes: `/proc/self/mountinfo` and the scan of `/proc/<pid>`
//! for processes that hold files under a mount point.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountEntry {
    pub mount_id: u32,
    pub mount_point: PathBuf,
    /// Per-mount options (`ro`, `nosuid`, `nodev`, …).
    pub mount_options: String,
    pub fstype: String,
    pub source: String,
    /// Per-superblock options (for FUSE: `user_id=…,group_id=…`).
    pub super_options: String,
    /// `MAJ:MIN` of the mounted device (a loop device's for a loop mount).
    pub dev: String,
}

impl MountEntry {
    pub fn is_fuse(&self) -> bool {
        self.fstype == "fuse" || self.fstype.starts_with("fuse.")
    }
    /// The uid that made a FUSE mount (`user_id=` in the super options).
    pub fn fuse_user_id(&self) -> Option<u32> {
        self.super_options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    }
    /// Made by one of the helpers sw-pool uses (squashfuse_ll/squashfuse report their name, fuse2fs the
    /// ext flavour; `sw-pool-serve` names its served image `sw-pool-serve` and its tree `sw-pool`:
    /// the subtype through fusermount3, only the source when root mounts it itself, as plain `fuse`).
    pub fn is_swpool_helper(&self) -> bool {
        if self.fstype == "fuse" {
            return matches!(self.source.as_str(), "sw-pool" | "sw-pool-serve");
        }
        matches!(
            self.fstype.as_str(),
            "fuse.squashfuse_ll"
                | "fuse.squashfuse"
                | "fuse.ext2"
                | "fuse.ext3"
                | "fuse.ext4"
                | "fuse.fuse2fs"
                | "fuse.sw-pool-serve"
                | "fuse.sw-pool"
        )
    }
    pub fn has_option(&self, o: &str) -> bool {
        self.mount_options.split(',').any(|x| x == o)
    }
}

fn unescape(s: &str) -> String {
    unescape_path(s).to_string_lossy().into_owned()
}

/// Undo mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape_path(s: &str) -> PathBuf {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = (oct[0] - b'0') as u32 * 64
                    + (oct[1] - b'0') as u32 * 8
                    + (oct[2] - b'0') as u32;
                out.push(v as u8);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Parse the text of a mountinfo file (lines that do not parse are skipped).
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut v = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let f: Vec<&str> = pre.split(' ').collect();
        let g: Vec<&str> = post.split(' ').collect();
        if f.len() < 6 || g.len() < 3 {
            continue;
        }
        let Ok(mount_id) = f[0].parse() else { continue };
        v.push(MountEntry {
            mount_id,
            mount_point: unescape_path(f[4]),
            mount_options: f[5].to_string(),
            fstype: g[0].to_string(),
            source: unescape(g[1]),
            super_options: g[2].to_string(),
            dev: f[2].to_string(),
        });
    }
    v
}

/// The uids of a `/proc/PID/status` text's `Uid:` line: real, effective, saved, file system.
pub fn status_uids(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The mounts this process sees.
pub fn read_mountinfo() -> std::io::Result<Vec<MountEntry>> {
    Ok(parse_mountinfo(&std::fs::read_to_string(
        "/proc/self/mountinfo",
    )?))
}

/// The last (topmost) mount at exactly `p`.
pub fn mount_at<'a>(mounts: &'a [MountEntry], p: &Path) -> Option<&'a MountEntry> {
    mounts.iter().rev().find(|m| m.mount_point == p)
}

/// A process that uses something under a mount point.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub pid: u32,
    pub uid: Option<u32>,
    pub command: String,
    /// What it holds: `cwd`, `root`, `fd 3 -> /path`, `maps /path`.
    pub what: Vec<String>,
}

fn under(p: &Path, mount: &Path) -> bool {
    p == mount || p.starts_with(mount)
}

/// Scan `/proc/*/{cwd,root,fd/*,maps}` for processes using paths under `mount`. Processes we may not
/// inspect (other users', when not root) are counted in the second value. Nobody is signalled.
pub fn holders(mount: &Path) -> (Vec<Holder>, usize) {
    let me = std::process::id();
    let mut found = Vec::new();
    let mut hidden = 0;
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return (found, 0);
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let base = e.path();
        let mut what = Vec::new();
        let mut denied = false;
        for link in ["cwd", "root"] {
            match std::fs::read_link(base.join(link)) {
                Ok(t) if under(&t, mount) => what.push(link.to_string()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied = true,
                Err(_) => {}
            }
        }
        match std::fs::read_dir(base.join("fd")) {
            Ok(fds) => {
                for fd in fds.flatten() {
                    if let Ok(t) = std::fs::read_link(fd.path()) {
                        if under(&t, mount) {
                            what.push(format!(
                                "fd {} -> {}",
                                fd.file_name().to_string_lossy(),
                                t.display()
                            ));
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied = true,
            Err(_) => {}
        }
        if let Ok(maps) = std::fs::read_to_string(base.join("maps")) {
            let mut seen = std::collections::BTreeSet::new();
            for l in maps.lines() {
                if let Some(i) = l.find(" /") {
                    let p = Path::new(l[i + 1..].trim_end_matches(" (deleted)"));
                    if under(p, mount) && seen.insert(p.to_path_buf()) {
                        what.push(format!("maps {}", p.display()));
                    }
                }
            }
        }
        if what.is_empty() {
            if denied {
                hidden += 1;
            }
            continue;
        }
        let command = std::fs::read(base.join("cmdline"))
            .ok()
            .map(|b| {
                b.split(|&c| c == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .filter(|s| !s.is_empty())
            .or_else(|| {
                std::fs::read_to_string(base.join("comm"))
                    .ok()
                    .map(|s| format!("[{}]", s.trim()))
            })
            .unwrap_or_default();
        let uid = std::fs::read_to_string(base.join("status"))
            .ok()
            .and_then(|s| status_uids(&s).first().copied());
        found.push(Holder {
            pid,
            uid,
            command,
            what,
        });
    }
    found.sort_by_key(|h| h.pid);
    (found, hidden)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_uids_reads_all_four() {
        let s = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t5\t5\t5\t5\n";
        assert_eq!(status_uids(s), [1000, 1001, 1002, 1003]);
        assert!(status_uids("Name:\tx\n").is_empty());
    }

    #[test]
    fn mountinfo_lines() {
        let t = "334 27 0:88 / /var/tmp/a\\040b ro,nosuid,nodev,relatime - fuse.squashfuse_ll squashfuse_ll ro,user_id=1000,group_id=1000\n\
                 22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw\n\
                 garbage line\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/var/tmp/a b"));
        assert!(m[0].is_fuse() && m[0].is_swpool_helper());
        assert_eq!(m[0].fuse_user_id(), Some(1000));
        assert!(m[0].has_option("nosuid") && m[0].has_option("ro"));
        assert_eq!(m[1].fstype, "ext4");
        assert!(!m[1].is_fuse());
        assert!(mount_at(&m, Path::new("/")).is_some());
        // sw-pool-serve --tree names its mounts fuse.sw-pool; another FUSE file system is not ours
        let t = "335 27 0:89 / /m ro,nosuid,nodev,noatime - fuse.sw-pool sw-pool ro,user_id=1000,group_id=1000\n\
                 336 27 0:90 / /n ro - fuse.sshfs host:/x ro,user_id=1000\n";
        let m = parse_mountinfo(t);
        assert!(m[0].is_swpool_helper());
        assert!(!m[1].is_swpool_helper());
        // root's own mount of it (no fusermount3): plain fuse, named by its source
        let t = "44 27 0:39 / /m ro,nosuid,nodev,noatime - fuse sw-pool ro,user_id=0,group_id=0\n\
                 45 27 0:40 / /n ro - fuse other ro,user_id=0\n";
        let m = parse_mountinfo(t);
        assert!(m[0].is_swpool_helper());
        assert!(!m[1].is_swpool_helper());
    }

    #[test]
    fn holders_finds_our_child_by_cwd() {
        let d = tempfile::tempdir().unwrap();
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .current_dir(d.path())
            .spawn()
            .unwrap();
        // the fork is visible before its chdir and exec, and the exec sets the name (`comm`)
        // before the new command line is readable (`[sleep]` in between): wait (bounded) until
        // /proc shows the command line itself
        let cmdline = format!("/proc/{}/cmdline", c.id());
        let t0 = std::time::Instant::now();
        while std::fs::read(&cmdline).map_or(true, |s| !s.starts_with(b"sleep\0"))
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (h, _) = holders(d.path());
        let _ = c.kill();
        let _ = c.wait();
        let mine = h.iter().find(|h| h.pid == c.id()).expect("child listed");
        assert!(mine.what.contains(&"cwd".to_string()), "{mine:?}");
        assert!(mine.command.starts_with("sleep"), "{mine:?}");
    }
}
