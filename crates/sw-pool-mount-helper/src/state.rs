//! What the helper mounted on this node: one JSON file of records in root's `/run/sw-pool/helper`
//! (0700), read and rewritten whole under one lock (a temporary name, then a rename). A site pool's
//! record holds its references (user and job); a user image's record its owner. `cleanup` compares
//! the records with the mount table: a record whose mount is gone is dropped.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{HelperError, Refusal, Result};

pub const STATE_DIR: &str = "/run/sw-pool/helper";

/// This process's mount namespace (the inode of `/proc/self/ns/mnt`).
pub fn mount_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/mnt")
        .map(|m| m.ino())
        .unwrap_or(0)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub uid: u32,
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Taken by `shadow` (a module load): the pool's shadow mounts stay while one such is held.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
}

/// A bind of a pool's `install/<pkg>/<ver>` over the original software's directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShadowMount {
    pub target: PathBuf,
    pub mount_id: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A site pool, mounted once for everyone at `<pool_mount_root>/<name>/<version>`.
    Pool {
        name: String,
        version: String,
        digest: String,
        signer: String,
        cache_file: PathBuf,
        mount_point: PathBuf,
        mount_id: u64,
        loop_device: String,
        /// The mount namespace it was made in (`/proc/self/ns/mnt`'s inode).
        mnt_ns: u64,
        refs: Vec<Ref>,
        /// Its shadow mounts (made by the first `shadow`, removed with the last shadow reference).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        shadows: Vec<ShadowMount>,
    },
    /// A user's own image, under `<user_mount_root>/<user>/`.
    Image {
        image: PathBuf,
        dev: u64,
        ino: u64,
        owner: u32,
        user: String,
        rw: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        job: Option<String>,
        mount_point: PathBuf,
        mount_id: u64,
        loop_device: String,
        mnt_ns: u64,
    },
}

impl Record {
    pub fn mount_id(&self) -> u64 {
        match self {
            Record::Pool { mount_id, .. } | Record::Image { mount_id, .. } => *mount_id,
        }
    }
    /// Does its mount still exist? Only answerable in the namespace it was made in: a record of
    /// another namespace counts as alive (that namespace's own requests and clean-up see to it).
    /// The mount ID alone is not enough (IDs are reused): the mount must also be on its loop device.
    pub fn alive(&self, mounts: &[swpool_sys::proc::MountEntry], here: u64) -> bool {
        let (Record::Pool {
            mount_id,
            loop_device,
            mnt_ns,
            ..
        }
        | Record::Image {
            mount_id,
            loop_device,
            mnt_ns,
            ..
        }) = self;
        *mnt_ns != here
            || mounts.iter().any(|m| {
                u64::from(m.mount_id) == *mount_id && m.source == format!("/dev/{loop_device}")
            })
    }
    pub fn in_namespace(&self, here: u64) -> bool {
        let (Record::Pool { mnt_ns, .. } | Record::Image { mnt_ns, .. }) = self;
        *mnt_ns == here
    }
    pub fn mount_point(&self) -> &Path {
        match self {
            Record::Pool { mount_point, .. } | Record::Image { mount_point, .. } => mount_point,
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Records {
    pub mounts: Vec<Record>,
}

/// The records, locked for as long as this lives.
pub struct State {
    dir: PathBuf,
    _lock: swpool_sys::lock::FileLock,
    pub records: Records,
}

impl State {
    pub fn open() -> Result<State> {
        Self::open_in(Path::new(STATE_DIR))
    }

    pub fn open_in(dir: &Path) -> Result<State> {
        for d in [dir.parent().unwrap_or(dir), dir] {
            match std::fs::DirBuilder::new().mode(0o700).create(d) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(HelperError::system(d, e)),
            }
            let m = std::fs::symlink_metadata(d).map_err(|e| HelperError::system(d, e))?;
            if !m.is_dir()
                || m.uid() != rustix::process::geteuid().as_raw()
                || m.mode() & 0o022 != 0
            {
                return Err(HelperError::refused(
                    Refusal::MountPoint,
                    format!(
                        "{} is not a directory of root's that only root can write; remove it",
                        d.display()
                    ),
                ));
            }
        }
        let lock = swpool_sys::lock::FileLock::exclusive(&dir.join("lock"))
            .map_err(|e| HelperError::system(&dir.join("lock"), e))?;
        let file = dir.join("mounts.json");
        let records = match std::fs::read(&file) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                HelperError::invalid(format!(
                    "{}: {e}; move it away and run `sw-pool-mount-helper cleanup`",
                    file.display()
                ))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Records::default(),
            Err(e) => return Err(HelperError::system(&file, e)),
        };
        Ok(State {
            dir: dir.to_path_buf(),
            _lock: lock,
            records,
        })
    }

    /// [`State::open`], and the records of this mount namespace whose mount is gone dropped (a
    /// dropped pool's shadow mounts, which would hold its file system, removed); returns this
    /// namespace. An unreadable mount table is an error, never "every mount is gone".
    pub fn open_live() -> Result<(State, u64)> {
        let mut st = Self::open()?;
        let mounts = swpool_sys::proc::read_mountinfo()
            .map_err(|e| HelperError::system(Path::new("/proc/self/mountinfo"), e))?;
        let here = mount_namespace();
        st.records.mounts.retain_mut(|r| {
            let alive = r.alive(&mounts, here);
            if let (false, Record::Pool { shadows, .. }) = (alive, &mut *r) {
                let mut errors = Vec::new();
                crate::shadow::remove(shadows, &mut errors);
            }
            alive
        });
        Ok((st, here))
    }

    pub fn save(&self) -> Result<()> {
        let file = self.dir.join("mounts.json");
        let bytes = serde_json::to_vec_pretty(&self.records).expect("records serialise");
        swpool_sys::atomic::write_file(&file, &bytes, true)
            .map_err(|e| HelperError::system(&file, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_under_the_lock() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("helper");
        let mut s = State::open_in(&dir).unwrap();
        s.records.mounts.push(Record::Image {
            image: "/home/u/data.img".into(),
            dev: 1,
            ino: 2,
            owner: 1000,
            user: "u".into(),
            rw: true,
            job: None,
            mount_point: "/run/sw-pool-user/u/d".into(),
            mount_id: 77,
            loop_device: "loop3".into(),
            mnt_ns: 4026531841,
        });
        s.save().unwrap();
        drop(s);
        let s = State::open_in(&dir).unwrap();
        assert_eq!(s.records.mounts.len(), 1);
        assert_eq!(s.records.mounts[0].mount_id(), 77);
    }
}
