//! Opening files that come from users.

use std::fs::File;
use std::path::Path;

/// Open `path` for reading only if it is a regular file, without blocking on the way: the open is
/// non-blocking (a FIFO with no writer, a device, would otherwise hang it), then the opened file's
/// type is checked (`fstat`, so a path swapped in between cannot slip past), then reads block
/// again. Anything else is `InvalidInput` "not a regular file".
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    use rustix::fs::{FileType, Mode, OFlags};
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY)?;
    Ok(File::from(fd))
}
