//! Loop devices for root's kernel mounts of image files (the privileged mount helper).
//!
//! A device is attached to a file the caller already opened (so what was checked is what backs the
//! device), with `LOOP_CONFIGURE` in one call, and always with `LO_FLAGS_AUTOCLEAR`: the kernel
//! detaches it when its last user goes. The helper keeps the [`LoopDevice`] open until the mount
//! holds the device, then drops it; so a device never outlives its mount, and a helper that dies
//! between attach and mount leaves nothing behind (its descriptor closes, the device clears).
//! [`orphans`] finds devices that back no mount all the same (attached by something without
//! autoclear, or by an older helper): the clean-up frees those whose backing file it can prove is
//! its own.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_NAME_SIZE: usize = 64;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; LO_NAME_SIZE],
    lo_crypt_name: [u8; LO_NAME_SIZE],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h, Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// An attached loop device, open; dropping it closes the descriptor (the device clears itself once
/// nothing else holds it).
#[derive(Debug)]
pub struct LoopDevice {
    pub path: PathBuf,
    dev: File,
}

impl LoopDevice {
    /// Attach a free loop device to `backing` (bytes `0..size_limit`, all of them when 0),
    /// read-only unless `writable`, with autoclear. Retries when another process takes the
    /// device `LOOP_CTL_GET_FREE` offered first.
    pub fn attach(
        backing: BorrowedFd<'_>,
        size_limit: u64,
        writable: bool,
        name: &str,
    ) -> io::Result<LoopDevice> {
        let ctl = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/loop-control")?;
        for _ in 0..32 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
            let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let path = PathBuf::from(format!("/dev/loop{n}"));
            let dev = std::fs::OpenOptions::new()
                .read(true)
                .write(writable)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)?;
            let mut file_name = [0u8; LO_NAME_SIZE];
            let b = name.as_bytes();
            let l = b.len().min(LO_NAME_SIZE - 1);
            file_name[..l].copy_from_slice(&b[..l]);
            let cfg = LoopConfig {
                fd: backing.as_raw_fd() as u32,
                block_size: 0,
                info: LoopInfo64 {
                    lo_device: 0,
                    lo_inode: 0,
                    lo_rdevice: 0,
                    lo_offset: 0,
                    lo_sizelimit: size_limit,
                    lo_number: 0,
                    lo_encrypt_type: 0,
                    lo_encrypt_key_size: 0,
                    lo_flags: LO_FLAGS_AUTOCLEAR | if writable { 0 } else { LO_FLAGS_READ_ONLY },
                    lo_file_name: file_name,
                    lo_crypt_name: [0; LO_NAME_SIZE],
                    lo_encrypt_key: [0; 32],
                    lo_init: [0; 2],
                },
                reserved: [0; 8],
            };
            // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `cfg` is, laid out as
            // the kernel's (repr(C), same field order and widths); it lives across the call.
            let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const _) };
            if r == 0 {
                return Ok(LoopDevice { path, dev });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(e);
            }
        }
        Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            "every free loop device was taken by someone else first (32 tries)",
        ))
    }

    /// Detach now (when the mount that was to hold it failed).
    pub fn detach(self) {
        // SAFETY: LOOP_CLR_FD takes no argument.
        unsafe { libc::ioctl(self.dev.as_raw_fd(), LOOP_CLR_FD) };
    }
}

use std::os::unix::fs::OpenOptionsExt;

/// A loop device that is attached, as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub name: String,
    pub backing_file: PathBuf,
    pub autoclear: bool,
    /// `MAJ:MIN` of the device.
    pub devno: String,
}

/// Every attached loop device (`/sys/block/loopN/loop/backing_file`).
pub fn attached() -> Vec<Attached> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return v;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let dir = e.path();
        let Ok(b) = std::fs::read_to_string(dir.join("loop/backing_file")) else {
            continue;
        };
        let autoclear = std::fs::read_to_string(dir.join("loop/autoclear"))
            .map(|s| s.trim() == "1")
            .unwrap_or(false);
        let devno = std::fs::read_to_string(dir.join("dev"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        v.push(Attached {
            name,
            backing_file: PathBuf::from(b.trim_end_matches('\n')),
            autoclear,
            devno,
        });
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// The device and inode of the file `/dev/NAME` is attached to (`LOOP_GET_STATUS64`).
pub fn backing_id(name: &str) -> Option<(u64, u64)> {
    let dev = std::fs::File::open(format!("/dev/{name}")).ok()?;
    // SAFETY: all-zero is a valid `loop_info64` (integers and byte arrays).
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: LOOP_GET_STATUS64 writes one `struct loop_info64` into `info`, laid out as the
    // kernel's.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64, &mut info as *mut _) };
    (r == 0).then_some((info.lo_device, info.lo_inode))
}

/// Is the file at `path` (in this mount namespace) the very file `a` is attached to? Loop devices
/// are the machine's, and a path names different files in different namespaces (the testbed's
/// nodes share one kernel), so the path alone proves nothing.
pub fn backs(a: &Attached, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    // the kernel reports the backing device in its old 16-bit encoding when it fits
    let dev = m.dev();
    let old = (libc::major(dev) as u64) << 8 | libc::minor(dev) as u64;
    backing_id(&a.name).is_some_and(|(d, i)| i == m.ino() && (d == dev || d == old))
}

/// Attached devices that back no mount in `mounts` (by device number) and whose backing file is
/// under `dir` **in this namespace** (the same device and inode, [`backs`]).
pub fn orphans(mounts: &[crate::proc::MountEntry], dir: &Path) -> Vec<Attached> {
    attached()
        .into_iter()
        .filter(|a| a.backing_file.starts_with(dir) && backs(a, &a.backing_file))
        .filter(|a| !mounts.iter().any(|m| m.dev == a.devno))
        .collect()
}

/// Detach `/dev/NAME` (a device [`orphans`] found).
pub fn clear(name: &str) -> io::Result<()> {
    if !name.starts_with("loop") || !name[4..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name} is not a loop device"),
        ));
    }
    let dev = std::fs::File::open(format!("/dev/{name}"))?;
    // SAFETY: LOOP_CLR_FD takes no argument.
    if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CLR_FD) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
