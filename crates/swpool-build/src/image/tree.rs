//! Walking a source tree before building: sizes for the image, and the problems mke2fs and
//! mksquashfs would otherwise report late or not at all (unreadable files, names they cannot store).

use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use rustix::fs::{access, Access};

/// Longest file name ext2/3/4 and squashfs can store (bytes).
pub const MAX_NAME_BYTES: usize = 255;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeStats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub others: u64,
    /// Sum of regular file sizes (hard links counted once).
    pub bytes: u64,
    /// 4 KiB blocks the regular files need (hard links counted once).
    pub blocks_4k: u64,
    /// Blocks that indirect-mapped files (ext2/ext3) need for their block maps.
    pub map_blocks_4k: u64,
    /// Directory entry bytes (for directory blocks).
    pub dirent_bytes: u64,
    /// Symlinks too long to live in the inode (need a block each).
    pub long_symlinks: u64,
    /// Newest modification time in the tree (seconds since the epoch).
    pub newest_mtime: i64,
    /// Setuid/setgid regular files and device nodes (not whiteouts), in walk order.
    pub special: Vec<Special>,
}

/// An entry that gives privileges to whoever owns it in an image mounted without nosuid/nodev:
/// what `--all-root` builds and `layer export` leave out or defuse unless root asks to keep them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Special {
    /// Relative to the tree's root.
    pub path: PathBuf,
    pub kind: SpecialKind,
    /// The permission bits (with setuid 0o4000, setgid 0o2000, sticky 0o1000).
    pub mode: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialKind {
    /// A regular file with the setuid and/or setgid bit.
    SetId,
    /// A character device other than 0/0 (0/0 is an overlay whiteout: kept, it opens nothing).
    CharDevice {
        major: u32,
        minor: u32,
    },
    BlockDevice {
        major: u32,
        minor: u32,
    },
}

impl Special {
    /// How a warning or `inspect` names it: `setuid file install/bin/x (mode 4755)`.
    pub fn describe(&self) -> String {
        let p = self.path.display();
        match self.kind {
            SpecialKind::SetId => {
                let what = match (self.mode & 0o4000 != 0, self.mode & 0o2000 != 0) {
                    (true, true) => "setuid+setgid",
                    (true, false) => "setuid",
                    _ => "setgid",
                };
                format!("{what} file {p} (mode {:o})", self.mode)
            }
            SpecialKind::CharDevice { major, minor } => {
                format!("character device {p} ({major},{minor})")
            }
            SpecialKind::BlockDevice { major, minor } => {
                format!("block device {p} ({major},{minor})")
            }
        }
    }

    pub fn is_device(&self) -> bool {
        !matches!(self.kind, SpecialKind::SetId)
    }
}

/// Classify one entry by its `st_mode` and `st_rdev`; `None` for everything harmless.
pub fn classify(path: PathBuf, st_mode: u32, rdev: u64) -> Option<Special> {
    let mode = st_mode & 0o7777;
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let kind = match st_mode & libc::S_IFMT {
        libc::S_IFREG if mode & 0o6000 != 0 => SpecialKind::SetId,
        libc::S_IFCHR if (major, minor) != (0, 0) => SpecialKind::CharDevice { major, minor },
        libc::S_IFBLK => SpecialKind::BlockDevice { major, minor },
        _ => return None,
    };
    Some(Special { path, kind, mode })
}

impl TreeStats {
    pub fn inodes(&self) -> u64 {
        self.files + self.dirs + self.symlinks + self.others
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    #[error("cannot read {}: {source}", crate::exec::show(path))]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{count} unreadable entr{} in the source tree, e.g. {}; fix the permissions (chmod -R u+rX) or remove them",
        if *count == 1 { "y" } else { "ies" },
        examples.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    Unreadable { count: u64, examples: Vec<PathBuf> },
    #[error(
        "{}: file name is {len} bytes long; images store at most {MAX_NAME_BYTES}",
        crate::exec::show(path)
    )]
    NameTooLong { path: PathBuf, len: usize },
    #[error("{}: ext images reserve the name lost+found at their root for a directory, and here it is not one; rename it, or build a squashfs pool (--format squashfs)", crate::exec::show(path))]
    LostFound { path: PathBuf },
}

/// Walk `root` (already resolved to a directory), without following symlinks.
pub fn scan(root: &Path, ext: bool) -> Result<TreeStats, TreeError> {
    let mut st = TreeStats::default();
    let mut seen_inodes: HashSet<(u64, u64)> = HashSet::new();
    let mut unreadable: Vec<PathBuf> = Vec::new();
    let mut unreadable_count = 0u64;
    if ext {
        let lf = root.join("lost+found");
        if let Ok(m) = std::fs::symlink_metadata(&lf) {
            if !m.is_dir() {
                return Err(TreeError::LostFound { path: lf });
            }
        }
    }
    let mut stack = vec![root.to_path_buf()];
    let root_meta = std::fs::metadata(root).map_err(|source| TreeError::Io {
        path: root.into(),
        source,
    })?;
    st.dirs += 1;
    st.newest_mtime = root_meta.mtime();
    let mut note_unreadable = |p: PathBuf, count: &mut u64| {
        *count += 1;
        if unreadable.len() < 5 {
            unreadable.push(p);
        }
    };
    while let Some(dir) = stack.pop() {
        if access(&dir, Access::READ_OK | Access::EXEC_OK).is_err() {
            note_unreadable(dir, &mut unreadable_count);
            continue;
        }
        let rd = std::fs::read_dir(&dir).map_err(|source| TreeError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut entries = Vec::new();
        for e in rd {
            let e = e.map_err(|source| TreeError::Io {
                path: dir.clone(),
                source,
            })?;
            entries.push(e.path());
        }
        entries.sort();
        for path in entries {
            let name_len = path.file_name().map(|n| n.len()).unwrap_or(0);
            if name_len > MAX_NAME_BYTES {
                return Err(TreeError::NameTooLong {
                    path,
                    len: name_len,
                });
            }
            st.dirent_bytes += 8 + (name_len as u64).div_ceil(4) * 4;
            let m = std::fs::symlink_metadata(&path).map_err(|source| TreeError::Io {
                path: path.clone(),
                source,
            })?;
            st.newest_mtime = st.newest_mtime.max(m.mtime());
            let ft = m.file_type();
            if let Some(sp) = classify(
                path.strip_prefix(root).unwrap_or(&path).to_path_buf(),
                m.mode(),
                m.rdev(),
            ) {
                st.special.push(sp);
            }
            if ft.is_dir() {
                st.dirs += 1;
                stack.push(path);
            } else if ft.is_file() {
                if access(&path, Access::READ_OK).is_err() {
                    note_unreadable(path.clone(), &mut unreadable_count);
                }
                if m.nlink() > 1 && !seen_inodes.insert((m.dev(), m.ino())) {
                    continue; // another name of a file already counted
                }
                st.files += 1;
                st.bytes += m.len();
                let blocks = m.len().div_ceil(4096);
                st.blocks_4k += blocks;
                if blocks > 12 {
                    // single, double (and triple) indirect blocks of an indirect-mapped file
                    st.map_blocks_4k +=
                        (blocks - 12).div_ceil(1024) + 1 + (blocks / (1024 * 1024)) + 1;
                }
            } else if ft.is_symlink() {
                st.symlinks += 1;
                if m.len() >= 60 {
                    st.long_symlinks += 1;
                }
            } else if ft.is_fifo() || ft.is_socket() || ft.is_char_device() || ft.is_block_device()
            {
                st.others += 1;
            }
        }
    }
    if unreadable_count > 0 {
        return Err(TreeError::Unreadable {
            count: unreadable_count,
            examples: unreadable,
        });
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::write(r.join("a/f"), vec![1u8; 5000]).unwrap();
        std::fs::hard_link(r.join("a/f"), r.join("a/b/g")).unwrap();
        std::os::unix::fs::symlink("f", r.join("a/l")).unwrap();
        std::os::unix::fs::symlink("loop", r.join("loop")).unwrap(); // a loop is stored as a link, not followed
        let s = scan(r, true).unwrap();
        assert_eq!((s.files, s.dirs, s.symlinks), (1, 3, 2));
        assert_eq!(s.bytes, 5000);
        assert_eq!(s.blocks_4k, 2);
    }

    #[test]
    fn lost_found_file_is_refused_for_ext_only() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("lost+found"), b"x").unwrap();
        assert!(matches!(
            scan(d.path(), true),
            Err(TreeError::LostFound { .. })
        ));
        assert!(scan(d.path(), false).is_ok());
    }
}
