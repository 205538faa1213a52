//! A squashfs (4.0) reader with random access, for serving a pool's tree over FUSE in one hop.
//!
//! It reads the image through [`ReadAt`] (a positional read), so it sits on a plain file (a cached
//! pool) or on the verifying chunk store (`mount --in-place`, `load --lazy`: only bytes hashed
//! against the authorized manifest reach it). It parses with bounds: every offset and length it
//! reads is checked against the image's size before it is used, every allocation is bounded by
//! bytes that are really in the image (or by a fixed cap), and a malformed image is an
//! [`Error::Corrupt`] naming what was wrong and where, never a panic (`fuzz/fuzz_targets/squashfs.rs`).
//!
//! Compressors: zstd (sw-pool's default), gzip, and uncompressed blocks (`--no-compress`). Any
//! other is refused when opening ([`Error::Unsupported`], naming it), so the caller falls back to
//! squashfuse_ll. Extended attributes are not read.

mod cache;
mod decompress;
mod inode;

use std::io;
use std::sync::Arc;

pub use cache::BlockCache;
pub use decompress::Compressor;
pub use inode::{DirEntry, FileType, Inode, InodeKind};

/// The image's bytes at an offset. `buf` is filled whole or the read fails.
pub trait ReadAt: Send + Sync {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
}

impl ReadAt for std::fs::File {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let start = usize::try_from(offset).ok().filter(|&s| s <= self.len());
        match start.and_then(|s| self.get(s..s.checked_add(buf.len())?)) {
            Some(src) => {
                buf.copy_from_slice(src);
                Ok(())
            }
            None => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the image",
            )),
        }
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.as_slice().read_at(offset, buf)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for Arc<T> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(offset, buf)
    }
}

impl<T: ReadAt + ?Sized> ReadAt for Box<T> {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        (**self).read_at(offset, buf)
    }
}

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The source failed (for the chunk store: a chunk that did not verify).
    #[error("reading {len} bytes of the image at byte {offset}: {source}")]
    Io {
        offset: u64,
        len: usize,
        source: io::Error,
    },
    /// The image is not a valid squashfs image (or not one this reader accepts).
    #[error("not a valid squashfs image: {0}")]
    Corrupt(String),
    /// A valid image this reader does not read (another compressor): use squashfuse_ll.
    #[error("{0}; serve it with squashfuse_ll instead")]
    Unsupported(String),
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn corrupt<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Corrupt(msg.into()))
}

/// Metadata blocks hold at most this many bytes once decompressed.
pub const METADATA_SIZE: usize = 8192;
const MAGIC: u32 = 0x7371_7368;
const SUPERBLOCK_SIZE: u64 = 96;
const NO_TABLE: u64 = u64::MAX;
/// A directory's listing is read whole; larger ones are refused (a million entries with 200-byte
/// names is 220 MiB).
const MAX_LISTING: u64 = 256 << 20;

/// The fields of the superblock this reader uses, checked.
#[derive(Debug, Clone)]
pub struct Superblock {
    pub inode_count: u32,
    pub mkfs_time: u32,
    pub block_size: u32,
    pub fragment_count: u32,
    pub compressor: Compressor,
    pub flags: u16,
    pub id_count: u16,
    pub root_inode: u64,
    pub bytes_used: u64,
    pub id_table: u64,
    pub inode_table: u64,
    pub directory_table: u64,
    pub fragment_table: u64,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Superblock {
    /// Parse and check the first 96 bytes of an image of `image_size` bytes.
    pub fn parse(b: &[u8; 96], image_size: u64) -> Result<Superblock> {
        if le32(b, 0) != MAGIC {
            return corrupt("no squashfs magic at byte 0");
        }
        let (major, minor) = (le16(b, 28), le16(b, 30));
        if (major, minor) != (4, 0) {
            return Err(Error::Unsupported(format!(
                "squashfs version {major}.{minor} (this reader reads 4.0)"
            )));
        }
        let compressor = Compressor::from_id(le16(b, 20))?;
        let block_size = le32(b, 12);
        let block_log = le16(b, 22);
        if !(4096..=(1 << 20)).contains(&block_size)
            || !block_size.is_power_of_two()
            || 1u32.checked_shl(block_log as u32) != Some(block_size)
        {
            return corrupt(format!(
                "block size {block_size} (log {block_log}) is not a power of two from 4 KiB to 1 MiB"
            ));
        }
        let sb = Superblock {
            inode_count: le32(b, 4),
            mkfs_time: le32(b, 8),
            block_size,
            fragment_count: le32(b, 16),
            compressor,
            flags: le16(b, 24),
            id_count: le16(b, 26),
            root_inode: le64(b, 32),
            bytes_used: le64(b, 40),
            id_table: le64(b, 48),
            inode_table: le64(b, 64),
            directory_table: le64(b, 72),
            fragment_table: le64(b, 80),
        };
        if sb.bytes_used > image_size || sb.bytes_used < SUPERBLOCK_SIZE {
            return corrupt(format!(
                "the superblock says {} bytes are used; the image has {image_size}",
                sb.bytes_used
            ));
        }
        if sb.id_count == 0 {
            return corrupt("the id table is empty");
        }
        let within = |name: &str, at: u64| {
            if at < SUPERBLOCK_SIZE || at >= sb.bytes_used {
                corrupt(format!(
                    "the {name} table's start ({at}) is outside the image's {} bytes",
                    sb.bytes_used
                ))
            } else {
                Ok(())
            }
        };
        within("inode", sb.inode_table)?;
        within("directory", sb.directory_table)?;
        within("id", sb.id_table)?;
        if sb.fragment_table != NO_TABLE && sb.fragment_count > 0 {
            within("fragment", sb.fragment_table)?;
        }
        if sb.directory_table <= sb.inode_table {
            return corrupt("the directory table does not follow the inode table");
        }
        Ok(sb)
    }

    fn table_end(&self, start: u64) -> u64 {
        // the tables are written in order; each ends where the next metadata begins
        [self.id_table, self.fragment_table, self.directory_table]
            .into_iter()
            .filter(|&t| t != NO_TABLE && t > start)
            .min()
            .unwrap_or(self.bytes_used)
            .min(self.bytes_used)
    }
}

/// A fragment block: where it is, its size on disk, whether it is stored uncompressed.
#[derive(Debug, Clone, Copy)]
struct Fragment {
    start: u64,
    size: u32,
    raw: bool,
}

/// An open squashfs image. Shared by threads (`&self` everywhere); decompressed blocks are kept in
/// a bounded [`BlockCache`].
pub struct Archive<R: ReadAt> {
    src: R,
    sb: Superblock,
    ids: Vec<u32>,
    meta: BlockCache,
    data: BlockCache,
}

/// Where a metadata block (or a run of them) may lie: `[lo, hi)`.
#[derive(Clone, Copy)]
struct Span {
    lo: u64,
    hi: u64,
}

/// Reads a stream of metadata blocks from a position, crossing block boundaries.
pub(crate) struct MetaReader<'a, R: ReadAt> {
    ar: &'a Archive<R>,
    span: Span,
    data: Arc<Vec<u8>>,
    next: u64,
    off: usize,
}

impl<'a, R: ReadAt> MetaReader<'a, R> {
    pub(crate) fn read(&mut self, out: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < out.len() {
            if self.off >= self.data.len() {
                let (d, n) = self.ar.metadata(self.next, self.span)?;
                self.data = d;
                self.next = n;
                self.off = 0;
            }
            let n = (self.data.len() - self.off).min(out.len() - done);
            out[done..done + n].copy_from_slice(&self.data[self.off..self.off + n]);
            self.off += n;
            done += n;
        }
        Ok(())
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        let mut b = [0; 2];
        self.read(&mut b)?;
        Ok(u16::from_le_bytes(b))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        let mut b = [0; 4];
        self.read(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        let mut b = [0; 8];
        self.read(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    /// `n` bytes into a new vector, grown only as the bytes are read (a crafted length cannot
    /// allocate more than the image holds).
    pub(crate) fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut v = Vec::with_capacity(n.min(METADATA_SIZE));
        let mut chunk = [0u8; 512];
        while v.len() < n {
            let k = (n - v.len()).min(chunk.len());
            self.read(&mut chunk[..k])?;
            v.extend_from_slice(&chunk[..k]);
        }
        Ok(v)
    }
}

impl<R: ReadAt> Archive<R> {
    /// Open the image `src` of `size` bytes: check the superblock, read the id table.
    pub fn open(src: R, size: u64) -> Result<Archive<R>> {
        Archive::with_cache(src, size, 64 << 20)
    }

    /// As [`Archive::open`], keeping up to `cache_bytes` of decompressed data blocks.
    pub fn with_cache(src: R, size: u64, cache_bytes: usize) -> Result<Archive<R>> {
        let mut b = [0u8; 96];
        if size < SUPERBLOCK_SIZE {
            return corrupt(format!(
                "{size} bytes is shorter than a squashfs superblock"
            ));
        }
        src.read_at(0, &mut b).map_err(|e| Error::Io {
            offset: 0,
            len: 96,
            source: e,
        })?;
        let sb = Superblock::parse(&b, size)?;
        let mut ar = Archive {
            src,
            sb,
            ids: Vec::new(),
            meta: BlockCache::new(8 << 20),
            data: BlockCache::new(cache_bytes),
        };
        ar.ids = ar.read_ids()?;
        Ok(ar)
    }

    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The decompressed-data cache (for statistics and read-ahead).
    pub fn data_cache(&self) -> &BlockCache {
        &self.data
    }

    fn raw(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let end = offset.checked_add(len as u64);
        if !matches!(end, Some(e) if e <= self.sb.bytes_used) {
            return corrupt(format!(
                "{len} bytes at byte {offset} run past the image's end ({})",
                self.sb.bytes_used
            ));
        }
        let mut v = vec![0u8; len];
        self.src.read_at(offset, &mut v).map_err(|e| Error::Io {
            offset,
            len,
            source: e,
        })?;
        Ok(v)
    }

    /// The metadata block at `pos` (within `span`), decompressed, and where the next one starts.
    fn metadata(&self, pos: u64, span: Span) -> Result<(Arc<Vec<u8>>, u64)> {
        if let Some((d, n)) = self.meta.get_meta(pos) {
            return Ok((d, n));
        }
        if pos < span.lo || pos.saturating_add(2) > span.hi {
            return corrupt(format!(
                "a metadata block at byte {pos} lies outside its table ({}..{})",
                span.lo, span.hi
            ));
        }
        let h = self.raw(pos, 2)?;
        let h = u16::from_le_bytes([h[0], h[1]]);
        let len = (h & 0x7fff) as usize;
        if len == 0 || len > METADATA_SIZE {
            return corrupt(format!(
                "the metadata block at byte {pos} says it holds {len} bytes (1 to 8192)"
            ));
        }
        let next = pos + 2 + len as u64;
        if next > span.hi {
            return corrupt(format!(
                "the metadata block at byte {pos} ({len} bytes) runs past its table's end ({})",
                span.hi
            ));
        }
        let disk = self.raw(pos + 2, len)?;
        let data = if h & 0x8000 != 0 {
            disk
        } else {
            self.sb
                .compressor
                .decompress(&disk, METADATA_SIZE)
                .map_err(|e| Error::Corrupt(format!("the metadata block at byte {pos}: {e}")))?
        };
        if data.is_empty() {
            return corrupt(format!("the metadata block at byte {pos} is empty"));
        }
        let data = Arc::new(data);
        self.meta.put_meta(pos, data.clone(), next);
        Ok((data, next))
    }

    pub(crate) fn meta_reader(
        &self,
        span: Span,
        block: u64,
        off: usize,
    ) -> Result<MetaReader<'_, R>> {
        let (data, next) = self.metadata(block, span)?;
        if off > data.len() {
            return corrupt(format!(
                "offset {off} is past the end of the metadata block at byte {block} ({} bytes)",
                data.len()
            ));
        }
        Ok(MetaReader {
            ar: self,
            span,
            data,
            next,
            off,
        })
    }

    fn inode_span(&self) -> Span {
        Span {
            lo: self.sb.inode_table,
            hi: self.sb.directory_table,
        }
    }

    fn directory_span(&self) -> Span {
        Span {
            lo: self.sb.directory_table,
            hi: self.sb.table_end(self.sb.directory_table),
        }
    }

    /// A lookup table's `i`-th pointer (to a metadata block lying before the table).
    fn table_pointer(&self, table: u64, i: u64, count: u64) -> Result<u64> {
        if i >= count {
            return corrupt(format!("entry {i} of a table of {count} pointers"));
        }
        let b = self.raw(table + i * 8, 8)?;
        Ok(le64(&b, 0))
    }

    fn read_ids(&self) -> Result<Vec<u32>> {
        let n = self.sb.id_count as usize;
        let per = METADATA_SIZE / 4;
        let blocks = n.div_ceil(per) as u64;
        let mut ids = Vec::with_capacity(n);
        for b in 0..blocks {
            let p = self.table_pointer(self.sb.id_table, b, blocks)?;
            let span = Span {
                lo: SUPERBLOCK_SIZE,
                hi: self.sb.id_table,
            };
            let mut r = self.meta_reader(span, p, 0)?;
            let k = (n - ids.len()).min(per);
            for _ in 0..k {
                ids.push(r.u32()?);
            }
        }
        Ok(ids)
    }

    pub(crate) fn id(&self, idx: u16) -> Result<u32> {
        match self.ids.get(idx as usize) {
            Some(&id) => Ok(id),
            None => corrupt(format!(
                "id index {idx} is past the id table's {} entries",
                self.ids.len()
            )),
        }
    }

    fn fragment(&self, i: u32) -> Result<Fragment> {
        if self.sb.fragment_table == NO_TABLE || i >= self.sb.fragment_count {
            return corrupt(format!(
                "fragment {i} is past the fragment table's {} entries",
                self.sb.fragment_count
            ));
        }
        let per = (METADATA_SIZE / 16) as u64;
        let blocks = (self.sb.fragment_count as u64).div_ceil(per);
        let p = self.table_pointer(self.sb.fragment_table, i as u64 / per, blocks)?;
        let span = Span {
            lo: SUPERBLOCK_SIZE,
            hi: self.sb.fragment_table,
        };
        let mut r = self.meta_reader(span, p, (i as u64 % per) as usize * 16)?;
        let start = r.u64()?;
        let size = r.u32()?;
        Ok(Fragment {
            start,
            size: size & 0x00ff_ffff,
            raw: size & (1 << 24) != 0,
        })
    }

    /// The root directory's inode.
    pub fn root(&self) -> Result<Inode> {
        self.inode(self.sb.root_inode)
    }

    /// The inode at reference `r` (the metadata block's offset in the inode table << 16 | the
    /// offset in the block), as directory entries and [`Inode::reference`] give it.
    pub fn inode(&self, r: u64) -> Result<Inode> {
        let block = r >> 16;
        let off = (r & 0xffff) as usize;
        let pos = self
            .sb
            .inode_table
            .checked_add(block)
            .ok_or_else(|| Error::Corrupt(format!("inode reference {r:#x} overflows")))?;
        let mut m = self.meta_reader(self.inode_span(), pos, off)?;
        inode::parse(self, &mut m, r)
    }

    /// A directory's entries, in the image's (sorted) order.
    pub fn read_dir(&self, dir: &Inode) -> Result<Vec<DirEntry>> {
        let InodeKind::Directory {
            block,
            offset,
            size,
            ..
        } = dir.kind
        else {
            return corrupt(format!("inode {} is not a directory", dir.number));
        };
        if size <= 3 {
            return Ok(Vec::new());
        }
        let len = u64::from(size) - 3;
        if len > MAX_LISTING {
            return corrupt(format!(
                "directory inode {} has a {len}-byte listing (at most {MAX_LISTING})",
                dir.number
            ));
        }
        let pos = self
            .sb
            .directory_table
            .checked_add(u64::from(block))
            .ok_or_else(|| Error::Corrupt("directory block overflows".into()))?;
        let mut m = self.meta_reader(self.directory_span(), pos, offset as usize)?;
        inode::read_listing(&mut m, len, dir.number)
    }

    /// The entry `name` of a directory, if there is one.
    pub fn lookup(&self, dir: &Inode, name: &[u8]) -> Result<Option<DirEntry>> {
        // listings are sorted by name, but reading one is the cost; a binary search over the
        // directory index is not worth it at the sizes the page cache and the caller's cache see
        Ok(self.read_dir(dir)?.into_iter().find(|e| e.name == name))
    }

    /// A symbolic link's target.
    pub fn read_link(&self, ino: &Inode) -> Result<Vec<u8>> {
        match &ino.kind {
            InodeKind::Symlink { target } => Ok(target.clone()),
            _ => corrupt(format!("inode {} is not a symbolic link", ino.number)),
        }
    }

    /// The decompressed data block `idx` of a regular file (the last may be a fragment's tail);
    /// shorter than the block size only at the file's end.
    pub fn file_block(&self, ino: &Inode, idx: u64) -> Result<Arc<Vec<u8>>> {
        let InodeKind::File(f) = &ino.kind else {
            return corrupt(format!("inode {} is not a regular file", ino.number));
        };
        let bs = self.sb.block_size as u64;
        let nblocks = f.size.div_ceil(bs);
        if idx >= nblocks {
            return corrupt(format!(
                "block {idx} is past the end of inode {} ({} bytes)",
                ino.number, f.size
            ));
        }
        let want = (f.size - idx * bs).min(bs) as usize;
        if (idx as usize) < f.blocks.len() {
            let word = f.blocks[idx as usize];
            let disk = (word & 0x00ff_ffff) as usize;
            if disk == 0 {
                return Ok(self.data.zeros(want));
            }
            let pos = f.starts[idx as usize];
            let raw = word & (1 << 24) != 0;
            let b = self.data_block(pos, disk, raw, want)?;
            if b.len() != want {
                return corrupt(format!(
                    "block {idx} of inode {} holds {} bytes, not {want}",
                    ino.number,
                    b.len()
                ));
            }
            return Ok(b);
        }
        // the tail, in a fragment block
        let Some((frag, off)) = f.fragment else {
            return corrupt(format!(
                "inode {} lists {} blocks for {} bytes and no fragment",
                ino.number,
                f.blocks.len(),
                f.size
            ));
        };
        let fr = self.fragment(frag)?;
        if fr.size == 0 {
            return corrupt(format!("fragment {frag} has size 0"));
        }
        let block = self.data_block(
            fr.start,
            fr.size as usize,
            fr.raw,
            self.sb.block_size as usize,
        )?;
        let off = off as usize;
        match block.get(off..off + want) {
            Some(s) => Ok(Arc::new(s.to_vec())),
            None => corrupt(format!(
                "inode {}'s tail ({want} bytes at {off}) is past fragment {frag}'s {} bytes",
                ino.number,
                block.len()
            )),
        }
    }

    /// A data block at `pos`, `disk` bytes on disk, at most `max` bytes decompressed (a stored
    /// block is its bytes). Cached.
    fn data_block(&self, pos: u64, disk: usize, raw: bool, max: usize) -> Result<Arc<Vec<u8>>> {
        if let Some(b) = self.data.get(pos) {
            return Ok(b);
        }
        if pos < SUPERBLOCK_SIZE {
            return corrupt(format!(
                "a data block at byte {pos} overlaps the superblock"
            ));
        }
        if disk > self.sb.block_size as usize {
            return corrupt(format!(
                "a data block at byte {pos} is {disk} bytes on disk, more than the block size"
            ));
        }
        let bytes = self.raw(pos, disk)?;
        let out = if raw {
            if bytes.len() > max {
                return corrupt(format!(
                    "the stored block at byte {pos} is {disk} bytes, more than {max}"
                ));
            }
            bytes
        } else {
            self.sb
                .compressor
                .decompress(&bytes, max)
                .map_err(|e| Error::Corrupt(format!("the data block at byte {pos}: {e}")))?
        };
        let out = Arc::new(out);
        self.data.put(pos, out.clone());
        Ok(out)
    }

    /// Read a regular file's bytes at `offset` into `buf`; returns how many (0 at the end).
    pub fn read(&self, ino: &Inode, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let InodeKind::File(f) = &ino.kind else {
            return corrupt(format!("inode {} is not a regular file", ino.number));
        };
        if offset >= f.size {
            return Ok(0);
        }
        let bs = self.sb.block_size as u64;
        let len = ((f.size - offset) as usize).min(buf.len());
        let mut done = 0;
        while done < len {
            let at = offset + done as u64;
            let b = self.file_block(ino, at / bs)?;
            let inb = (at % bs) as usize;
            let n = (b.len() - inb).min(len - done);
            buf[done..done + n].copy_from_slice(&b[inb..inb + n]);
            done += n;
        }
        Ok(len)
    }

    /// Whether data block `idx` of a file is decompressed in the cache already (read-ahead).
    pub fn block_cached(&self, ino: &Inode, idx: u64) -> bool {
        match &ino.kind {
            InodeKind::File(f) => match (f.blocks.get(idx as usize), f.starts.get(idx as usize)) {
                (Some(&w), Some(&p)) => w & 0x00ff_ffff == 0 || self.data.contains(p),
                _ => true,
            },
            _ => true,
        }
    }

    /// Resolve a path from the root (`a/b/c`; components split on `/`), following no links.
    pub fn lookup_path(&self, path: &[u8]) -> Result<Option<Inode>> {
        let mut cur = self.root()?;
        for comp in path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            match self.lookup(&cur, comp)? {
                Some(e) => cur = self.inode(e.inode)?,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }
}
