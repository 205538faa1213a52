//! What SRC is (leader 0 inspects it and tells the others), the chunks that move, and whether a
//! node already holds an identical DEST (the stamp on plain files and directories, the trailer of
//! a pool).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{bad, dir, plan};
use crate::collective::Local;
use crate::pool::{Manifest, ManifestError, Pool};
use plan::Chunk;
use swpool_format::status::ExitStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Kind {
    File,
    Pool,
    Directory,
}

/// What leader 0 learns about SRC and tells the others.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct SrcInfo {
    pub(super) kind: Kind,
    pub(super) len: u64,
    pub(super) mtime_ns: i128,
    pub(super) mode: u32,
    /// Bytes that hold data (space needed on every node).
    pub(super) data_bytes: u64,
    pub(super) chunk_size: u64,
    /// Pool: its manifest and the hex of its trailer `[image_size, len)`.
    pub(super) manifest: Option<Manifest>,
    pub(super) tail_hex: Option<String>,
    /// Plain file: indices of chunks that overlap data (SEEK_DATA). Pool: indices of chunks its
    /// manifest calls `null` (all zeros) that hold data in SRC: they are read and checked too.
    pub(super) candidates: Vec<u64>,
    /// Directory: signature of the tree's metadata.
    pub(super) signature: String,
}

/// The stamp recorded on DEST at copy time (plain files and directories).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Stamp {
    pub(super) v: u32,
    pub(super) kind: Kind,
    pub(super) src_len: u64,
    pub(super) src_mtime_ns: i128,
    pub(super) signature: String,
    pub(super) dest_len: u64,
    pub(super) dest_mtime_ns: i128,
}

pub(super) const STAMP_XATTR: &str = "user.sw-pool.cp";

pub(super) fn mtime_ns(m: &std::fs::Metadata) -> i128 {
    m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128
}

/// Leader 0: what is SRC? With a file, also the open file itself: leader 0's transfer reads from
/// it (one open of SRC on shared storage, and the bytes read are those of the file inspected).
pub(super) fn inspect_src(
    src: &Path,
    chunk_opt: Option<u64>,
    opened: Option<&File>,
) -> Local<(SrcInfo, Option<File>)> {
    // SRC already open (`load`: the file the trust policy checked): no second open
    let opened = match opened.map(File::try_clone).transpose() {
        Ok(f) => f,
        Err(e) => {
            return Err(bad(
                ExitStatus::System,
                format!("cannot use the open SRC {}: {e}", src.display()),
            ))
        }
    };
    let meta = match &opened {
        Some(f) => f.metadata(),
        None => std::fs::metadata(src),
    };
    let meta = meta.map_err(|e| {
        bad(
            swpool_format::status::io_status(&e),
            format!(
                "cannot access SRC {}: {e}; check the path and that it is readable",
                src.display()
            ),
        )
    })?;
    let chunk_size = chunk_opt.unwrap_or(crate::pool::manifest::DEFAULT_CHUNK_SIZE);
    if !(plan::MIN_TRANSFER_CHUNK..=plan::MAX_TRANSFER_CHUNK).contains(&chunk_size) {
        return Err(bad(
            ExitStatus::BadInput,
            format!(
                "chunk size {chunk_size} is outside 4 KiB ..= {} MiB (bounded memory)",
                plan::MAX_TRANSFER_CHUNK >> 20
            ),
        ));
    }
    let mut info = SrcInfo {
        kind: Kind::File,
        len: meta.len(),
        mtime_ns: mtime_ns(&meta),
        mode: meta.mode(),
        data_bytes: 0,
        chunk_size,
        manifest: None,
        tail_hex: None,
        candidates: Vec::new(),
        signature: String::new(),
    };
    if meta.is_dir() {
        info.kind = Kind::Directory;
        let (sig, bytes) = dir::signature(src)?;
        info.signature = sig;
        info.data_bytes = bytes;
        return Ok((info, None));
    }
    if !meta.is_file() {
        return Err(bad(
            ExitStatus::BadInput,
            format!(
                "SRC {} is neither a regular file nor a directory",
                src.display()
            ),
        ));
    }
    let f = match opened {
        Some(f) => f,
        None => File::open(src).map_err(|e| {
            bad(
                swpool_format::status::io_status(&e),
                format!("cannot open SRC {}: {e}", src.display()),
            )
        })?,
    };
    // only a file ending in a pool footer is opened as a pool (Pool::open would scan the last MiB
    // of a plain file for a misplaced trailer: a MiB read from shared storage for nothing)
    let has_footer = {
        use crate::pool::trailer::{END_MAGIC, FOOTER_LEN, MAGIC};
        use std::os::unix::fs::FileExt;
        let mut fb = [0u8; FOOTER_LEN as usize];
        info.len >= FOOTER_LEN
            && f.read_exact_at(&mut fb, info.len - FOOTER_LEN).is_ok()
            && &fb[..8] == MAGIC
            && &fb[72..80] == END_MAGIC
    };
    let opened = if has_footer {
        f.try_clone()
            .map_err(|e| ManifestError::Io {
                path: src.to_path_buf(),
                source: e,
            })
            .and_then(|dup| Pool::open_file(src, dup))
    } else {
        Err(ManifestError::NotAPool {
            path: src.to_path_buf(),
            reason: crate::pool::trailer::TrailerError::NoMagic,
        })
    };
    match opened {
        Ok(p) => {
            let m = p.manifest;
            if m.chunk_size > plan::MAX_TRANSFER_CHUNK {
                return Err(bad(
                    ExitStatus::InvalidPool,
                    format!(
                        "pool {} has {}-byte chunks; cp moves at most {} MiB chunks: rebuild it with a smaller chunk size",
                        src.display(),
                        m.chunk_size,
                        plan::MAX_TRANSFER_CHUNK >> 20
                    ),
                ));
            }
            let mut tail = vec![0u8; (p.file_len - m.image_size) as usize];
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut tail, m.image_size).map_err(|e| {
                bad(
                    ExitStatus::System,
                    format!("cannot read the trailer of {}: {e}", src.display()),
                )
            })?;
            info.candidates = null_chunks_with_data(&f, &m);
            info.kind = Kind::Pool;
            info.chunk_size = m.chunk_size;
            info.data_bytes = m.data_size + tail.len() as u64;
            info.tail_hex = Some(hex::encode(&tail));
            info.len = p.file_len;
            info.manifest = Some(m);
        }
        Err(ManifestError::NotAPool { .. }) => {
            let ranges = crate::sparse::data_ranges(&f, info.len).map_err(|e| {
                bad(
                    ExitStatus::System,
                    format!("cannot map the data of {}: {e}", src.display()),
                )
            })?;
            let chunks = plan::plain_chunks(info.len, chunk_size, &ranges);
            info.data_bytes = chunks.iter().map(|c| c.len as u64).sum();
            info.candidates = chunks.iter().map(|c| c.offset / chunk_size).collect();
        }
        Err(e) => return Err(bad(e.exit_status(), e.to_string())),
    }
    Ok((info, Some(f)))
}

/// The chunks a pool's manifest calls `null` (a hole, or all zeros) that SRC stores data for, in
/// order: the copy reads them and checks that they are all zeros, as `verify` does, so that bytes
/// written into a hole after signing make the load fail instead of being served as zeros
/// unnoticed. Only where the file system reports holes (SEEK_DATA): one that does not (sshfs, NFSv3)
/// shows the whole file as data, and reading every hole of a sparse ext image from shared storage
/// would cost more than the pool's data; when the `null` chunks reported as data exceed an eighth
/// of the pool's data (at least four chunks), none are read. The mounted copy then holds zeros
/// there, which is what the signed manifest says (SECURITY.md, known gaps).
fn null_chunks_with_data(f: &File, m: &Manifest) -> Vec<u64> {
    if m.chunks.iter().all(|c| c.is_some()) {
        return Vec::new();
    }
    let Ok(data) = crate::sparse::data_ranges(f, m.image_size) else {
        return Vec::new();
    };
    let mut hint = 0usize;
    let mut out = Vec::new();
    let mut bytes = 0u64;
    for (i, c) in m.chunks.iter().enumerate() {
        let r = m.chunk_range(i as u64);
        if c.is_none() && crate::sparse::overlaps_data(&data, &r, &mut hint) {
            out.push(i as u64);
            bytes += r.end - r.start;
        }
    }
    let limit = (m.data_size / 8).max(4 * m.chunk_size);
    if bytes > limit {
        tracing::debug!(
            bytes,
            limit,
            "the file system reports the pool's holes as data; null chunks are not read"
        );
        return Vec::new();
    }
    out
}

/// The chunks that move, identical on every leader.
pub(super) fn chunk_list(info: &SrcInfo) -> Vec<Chunk> {
    match &info.manifest {
        Some(m) => {
            let mut zero = crate::pool::manifest::ZeroHashes::default();
            let mut out = Vec::new();
            let mut null_data = info.candidates.iter().peekable();
            for (i, h) in m.chunks.iter().enumerate() {
                let checked_null = null_data.next_if(|&&c| c == i as u64).is_some();
                if h.is_some() || checked_null {
                    let r = m.chunk_range(i as u64);
                    out.push(Chunk {
                        offset: r.start,
                        len: (r.end - r.start) as u32,
                        expect: m.chunk_hash(i, &mut zero),
                    });
                }
            }
            // the trailer is not among them: every leader has its bytes (node 0 read them, and
            // checked them against the authorized pool when there is one) and writes it itself
            // ([`known_tail`])
            out
        }
        None => info
            .candidates
            .iter()
            .map(|&i| {
                let off = i * info.chunk_size;
                Chunk {
                    offset: off,
                    len: ((off + info.chunk_size).min(info.len) - off) as u32,
                    expect: None,
                }
            })
            .collect(),
    }
}

/// A pool's trailer (manifest, signature block, footer) as node 0 read it, `(offset, bytes)`, from
/// the image's end to the file's end ([`inspect_src`] reads it whole); `None` for a plain file.
/// Every leader has these bytes with SRC's description, so each writes the trailer itself and no
/// leader reads it from shared storage.
pub(super) fn known_tail(info: &SrcInfo) -> Local<Option<(u64, Vec<u8>)>> {
    let Some(m) = &info.manifest else {
        return Ok(None);
    };
    info.tail_hex
        .as_deref()
        .and_then(|h| hex::decode(h).ok())
        .filter(|t| m.image_size.checked_add(t.len() as u64) == Some(info.len))
        .map(|t| Some((m.image_size, t)))
        .ok_or_else(|| {
            bad(
                ExitStatus::Internal,
                "SRC's description lacks the pool's trailer bytes".to_string(),
            )
        })
}

/// The path written on this node: DEST itself, or DEST/<name of SRC> when DEST is an existing
/// directory (or ends with `/`) and SRC is a file (like cp).
pub(super) fn target_path(src: &Path, dest: &Path, kind: Kind) -> PathBuf {
    if kind != Kind::Directory
        && (dest.is_dir() || dest.as_os_str().to_string_lossy().ends_with('/'))
    {
        if let Some(name) = src.file_name() {
            return dest.join(name);
        }
    }
    dest.to_path_buf()
}

pub(super) fn read_stamp(p: &Path) -> Option<Stamp> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::getxattr(p, STAMP_XATTR, &mut buf).ok()?;
    serde_json::from_slice(&buf[..n]).ok()
}

/// Does this node already hold an identical DEST?
pub(super) fn holds_identical(info: &SrcInfo, target: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(target) else {
        return false;
    };
    match info.kind {
        Kind::Pool => {
            if !meta.is_file() || meta.len() != info.len {
                return false;
            }
            let (Some(m), Some(tail_hex)) = (&info.manifest, &info.tail_hex) else {
                return false;
            };
            let Ok(f) = File::open(target) else {
                return false;
            };
            let mut tail = vec![0u8; (info.len - m.image_size) as usize];
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut tail, m.image_size).is_ok() && hex::encode(&tail) == *tail_hex
        }
        Kind::File | Kind::Directory => {
            if (info.kind == Kind::File) != meta.is_file()
                || (info.kind == Kind::Directory) != meta.is_dir()
            {
                return false;
            }
            let Some(s) = read_stamp(target) else {
                return false;
            };
            s.v == 1
                && s.kind == info.kind
                && s.src_len == info.len
                && (info.kind == Kind::Directory || s.src_mtime_ns == info.mtime_ns)
                && s.signature == info.signature
                && (info.kind == Kind::Directory || s.dest_len == meta.len())
                && s.dest_mtime_ns == mtime_ns(&meta)
        }
    }
}

pub(super) fn write_stamp(info: &SrcInfo, path: &Path) -> Local<()> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| {
        bad(
            ExitStatus::System,
            format!("cannot stat {}: {e}", path.display()),
        )
    })?;
    let s = Stamp {
        v: 1,
        kind: info.kind,
        src_len: info.len,
        src_mtime_ns: info.mtime_ns,
        signature: info.signature.clone(),
        dest_len: if info.kind == Kind::File {
            meta.len()
        } else {
            0
        },
        dest_mtime_ns: mtime_ns(&meta),
    };
    // best effort: without xattr support the next copy simply copies again
    if let Err(e) = rustix::fs::setxattr(
        path,
        STAMP_XATTR,
        &serde_json::to_vec(&s).expect("json"),
        rustix::fs::XattrFlags::empty(),
    ) {
        tracing::info!(path = %path.display(), error = %e, "no stamp recorded (xattrs unsupported?): a repeat copy will copy again");
    }
    Ok(())
}
