//! Sparse files: where the data is (SEEK_DATA / SEEK_HOLE), and whether a buffer is all zeros.

use std::fs::File;
use std::io;
use std::ops::Range;

use rustix::fs::{seek, SeekFrom};

/// The byte ranges of `file` (of length `len`) that hold data, in order. Holes are left out.
/// File systems without hole support report the whole file as one data range.
pub fn data_ranges(file: &File, len: u64) -> io::Result<Vec<Range<u64>>> {
    let mut out = Vec::new();
    let mut pos = 0u64;
    while pos < len {
        let start = match seek(file, SeekFrom::Data(pos as i64)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break, // no data after pos
            Err(rustix::io::Errno::INVAL) if pos == 0 => {
                // no SEEK_DATA support: treat everything as data
                out.push(0..len);
                break;
            }
            Err(e) => return Err(e.into()),
        };
        if start >= len {
            break;
        }
        let end = match seek(file, SeekFrom::Hole(start as i64)) {
            Ok(e) => e.min(len),
            Err(rustix::io::Errno::NXIO) => len,
            Err(e) => return Err(e.into()),
        };
        if end <= start {
            break;
        }
        out.push(start..end);
        pos = end;
    }
    Ok(out)
}

/// Does `range` overlap any of the (sorted) data ranges? `hint` is advanced past ranges that end
/// before `range` (call with increasing ranges for linear total cost).
pub fn overlaps_data(ranges: &[Range<u64>], range: &Range<u64>, hint: &mut usize) -> bool {
    while *hint < ranges.len() && ranges[*hint].end <= range.start {
        *hint += 1;
    }
    *hint < ranges.len() && ranges[*hint].start < range.end
}

/// True if every byte of `buf` is zero.
pub fn is_all_zero(buf: &[u8]) -> bool {
    // SAFETY-free fast path: compare in u128 words; the compiler vectorises this loop
    // SAFETY: every bit pattern is a valid u128, and align_to only reinterprets the aligned middle.
    let (head, body, tail) = unsafe { buf.align_to::<u128>() };
    head.iter().all(|&b| b == 0) && body.iter().all(|&w| w == 0) && tail.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};

    #[test]
    fn finds_data_in_sparse_file() {
        let mut f = tempfile::tempfile().unwrap();
        let mib = 1u64 << 20;
        f.set_len(8 * mib).unwrap();
        f.seek(io::SeekFrom::Start(2 * mib)).unwrap();
        f.write_all(&vec![1u8; mib as usize]).unwrap();
        f.seek(io::SeekFrom::Start(6 * mib)).unwrap();
        f.write_all(&vec![1u8; 4096]).unwrap();
        f.flush().unwrap();
        let r = data_ranges(&f, 8 * mib).unwrap();
        // tmpfs/ext4 report page- or block-aligned extents
        assert!(!r.is_empty());
        let total: u64 = r.iter().map(|x| x.end - x.start).sum();
        assert!(total < 4 * mib, "expected holes to be skipped: {r:?}");
        let mut h = 0;
        assert!(!overlaps_data(&r, &(0..mib), &mut h));
        assert!(overlaps_data(&r, &(2 * mib..3 * mib), &mut h));
        assert!(!overlaps_data(&r, &(4 * mib..5 * mib), &mut h));
        assert!(overlaps_data(&r, &(6 * mib..7 * mib), &mut h));
        assert!(!overlaps_data(&r, &(7 * mib..8 * mib), &mut h));
    }

    #[test]
    fn empty_and_dense() {
        let f = tempfile::tempfile().unwrap();
        assert!(data_ranges(&f, 0).unwrap().is_empty());
        let mut g = tempfile::tempfile().unwrap();
        g.write_all(&[5u8; 10000]).unwrap();
        assert_eq!(data_ranges(&g, 10000).unwrap(), vec![0..10000]);
    }

    #[test]
    fn zero_detection() {
        assert!(is_all_zero(&[]));
        assert!(is_all_zero(&[0u8; 4097]));
        for i in [0usize, 1, 15, 16, 4000, 4096] {
            let mut v = vec![0u8; 4097];
            v[i] = 1;
            assert!(!is_all_zero(&v), "byte {i}");
        }
    }
}
