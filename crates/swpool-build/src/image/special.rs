//! The setuid/setgid files and device nodes of a built image, read from the image itself (what
//! `sw-pool inspect` shows): squashfs through `unsquashfs -lln`, ext through its inode tables
//! (names by `debugfs ncheck`). Overlay whiteouts (character devices 0/0) are not listed.

use std::path::{Path, PathBuf};

use super::tree::{classify, Special};
use super::ImageFormat;
use crate::exec::{ExecError, Tool, ToolCommand};

#[derive(Debug, thiserror::Error)]
pub enum SpecialError {
    #[error(transparent)]
    Tool(#[from] ExecError),
    #[error(
        "cannot read the inode tables of {}: {source}",
        crate::exec::show(path)
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{format} images are not read for setuid files and device nodes (squashfs and ext are)"
    )]
    Unsupported { format: ImageFormat },
}

/// The image's setuid/setgid regular files and device nodes, paths relative to its root.
pub fn list(
    pool: &Path,
    format: ImageFormat,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<Vec<Special>, SpecialError> {
    match format {
        ImageFormat::Squashfs => {
            let o = ToolCommand::new(Tool::Unsquashfs)
                .arg("-lln")
                .path(pool)
                .run(path_var)?;
            Ok(parse_lln(&o.stdout))
        }
        f if f.is_ext() => ext(pool, path_var),
        format => Err(SpecialError::Unsupported { format }),
    }
}

fn ext(pool: &Path, path_var: Option<&std::ffi::OsStr>) -> Result<Vec<Special>, SpecialError> {
    let io = |source| SpecialError::Io {
        path: pool.into(),
        source,
    };
    let f = std::fs::File::open(pool).map_err(io)?;
    let found: Vec<(u64, Special)> = super::ext_times::inode_modes(&f)
        .map_err(io)?
        .into_iter()
        .filter_map(|(n, mode, rdev)| classify(PathBuf::new(), mode, rdev).map(|s| (n, s)))
        .collect();
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let inodes: Vec<String> = found.iter().map(|(n, _)| n.to_string()).collect();
    let o = ToolCommand::new(Tool::Debugfs)
        .arg("-R")
        .arg(format!("ncheck -c {}", inodes.join(" ")))
        .path(pool)
        .run(path_var)?;
    let mut out = Vec::new();
    for (n, s) in &found {
        let names: Vec<&str> = o
            .stdout
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter(|(i, _)| i.trim() == n.to_string())
            .map(|(_, p)| p)
            .collect();
        if names.is_empty() {
            out.push(Special {
                path: PathBuf::from(format!("<inode {n}, no name found>")),
                ..s.clone()
            });
        }
        for p in names {
            out.push(Special {
                path: PathBuf::from(p.trim_start_matches('/')),
                ..s.clone()
            });
        }
    }
    Ok(out)
}

/// `unsquashfs -lln` lines: `crw-r--r-- 0/0  1,  3 2026-11-28 05:44 squashfs-root/d/dev`.
fn parse_lln(out: &str) -> Vec<Special> {
    out.lines().filter_map(parse_line).collect()
}

fn parse_line(l: &str) -> Option<Special> {
    let perm = l.get(..10)?;
    let b = perm.as_bytes();
    let t = match b[0] {
        b'-' => libc::S_IFREG,
        b'c' => libc::S_IFCHR,
        b'b' => libc::S_IFBLK,
        _ => return None,
    };
    let bit = |i: usize, on: &[u8], v: u32| if on.contains(&b[i]) { v } else { 0 };
    let mut mode = 0;
    for (i, v) in [
        (1, 0o400),
        (2, 0o200),
        (4, 0o40),
        (5, 0o20),
        (7, 0o4),
        (8, 0o2),
    ] {
        mode |= bit(i, b"rw", v);
    }
    mode |= bit(3, b"xs", 0o100) | bit(6, b"xs", 0o10) | bit(9, b"xt", 0o1);
    mode |= bit(3, b"sS", 0o4000) | bit(6, b"sS", 0o2000) | bit(9, b"tT", 0o1000);
    // the name follows the date and time; the fields before it hold no letters
    let start = l.find(" squashfs-root/")?;
    let fields: Vec<&str> = l[..start].split_whitespace().collect();
    let rdev = if t == libc::S_IFREG {
        0
    } else {
        // perm, owner, "MAJOR," MINOR, date, time
        let major = fields.get(2)?.trim_end_matches(',').parse().ok()?;
        let minor = fields.get(3)?.parse().ok()?;
        libc::makedev(major, minor)
    };
    classify(
        PathBuf::from(&l[start + " squashfs-root/".len()..]),
        t | mode,
        rdev,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::tree::SpecialKind;

    #[test]
    fn lln_lines() {
        let out = "drwxr-xr-x 0/0    43 2026-11-28 05:44 squashfs-root\n\
                   -rwsr-xr-x 0/0     2 2026-11-28 05:44 squashfs-root/d/s u\n\
                   -rwxr-sr-x 1000/1000 2 2026-11-28 05:44 squashfs-root/g\n\
                   -rwxr-xr-x 0/0     2 2026-11-28 05:44 squashfs-root/plain\n\
                   crw-r--r-- 0/0   1,  3 2026-11-28 05:44 squashfs-root/d/dev\n\
                   crw-r--r-- 0/0   0,  0 2026-11-28 05:44 squashfs-root/wh\n\
                   brw-rw---- 0/6   7,  0 2026-11-28 05:44 squashfs-root/loop0\n";
        let v = parse_lln(out);
        let got: Vec<(String, SpecialKind, u32)> = v
            .iter()
            .map(|s| (s.path.display().to_string(), s.kind, s.mode))
            .collect();
        assert_eq!(
            got,
            vec![
                ("d/s u".into(), SpecialKind::SetId, 0o4755),
                ("g".into(), SpecialKind::SetId, 0o2755),
                (
                    "d/dev".into(),
                    SpecialKind::CharDevice { major: 1, minor: 3 },
                    0o644
                ),
                (
                    "loop0".into(),
                    SpecialKind::BlockDevice { major: 7, minor: 0 },
                    0o660
                ),
            ]
        );
    }
}
