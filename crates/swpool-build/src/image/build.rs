//! `sw-pool build`: a source tree → one pool file (image + manifest trailer), written atomically.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::tree::{self, TreeError, TreeStats};
use super::ImageFormat;
use crate::atomic::{parent_dir, TempOutput};
use crate::exec::{ExecError, Tool, ToolCommand};
use crate::pool::layout::{LayoutError, PoolLayout};
use crate::pool::manifest::{check_name, ChunkListBuilder, Manifest, CHUNK_HASH, MANIFEST_SCHEMA};
use crate::pool::modulefile::{generate_missing, ModulefileOptions};
use crate::pool::trailer::write_trailer;
use crate::size::Bytes;
use swpool_format::status::ExitStatus;

/// Smallest ext image sw-pool makes when it chooses the size itself.
pub const MIN_AUTO_EXT_SIZE: u64 = 16 << 20;

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub out: PathBuf,
    pub src: PathBuf,
    /// `-s`: the image size for ext formats; an upper limit for squashfs.
    pub size: Option<u64>,
    pub format: Option<ImageFormat>,
    pub name: Option<String>,
    pub version: Option<String>,
    pub force: bool,
    pub chunk_size: u64,
    pub gen_modulefiles: bool,
    pub modulefile_opts: ModulefileOptions,
    /// zstd level for squashfs (mksquashfs' default when `None`).
    pub squashfs_level: Option<u32>,
    /// `--no-compress`: squashfs and EROFS store the data uncompressed (for incompressible data:
    /// faster to build, read at the disk's speed); ext images never compress.
    pub no_compress: bool,
    /// Every file owned by root in the image (squashfs `-all-root`, EROFS `--all-root`; ext images
    /// keep the tree's owners): a root file system or an exported layer stacked under
    /// `sw-pool run --base`, where the environment's root (you) owns what root owns.
    pub all_root: bool,
    /// With `all_root`: keep setuid/setgid bits and device nodes as they are in the tree (root
    /// only). Without it they become root's in the image, so an `all_root` build clears the bits
    /// and leaves device nodes out, with a warning naming each (see [`tree::Special`]).
    pub keep_special: bool,
    /// `SOURCE_DATE_EPOCH`, if set: the build time recorded in the image and the manifest.
    pub source_date_epoch: Option<u64>,
    /// The value of `PATH` mksquashfs and mke2fs are looked up in (the caller's environment; see
    /// [`crate::exec::Tool::locate`]).
    pub path_var: Option<std::ffi::OsString>,
}

#[derive(Debug, Clone, Default)]
pub struct Timings {
    pub scan: Duration,
    /// mke2fs / mksquashfs, including its own final fsync.
    pub mkfs: Duration,
    /// ext images: setting atime and ctime to mtime in the inode tables (zero for squashfs).
    pub times: Duration,
    pub hash: Duration,
    pub commit: Duration,
}

#[derive(Debug)]
pub struct BuildReport {
    pub out: PathBuf,
    pub file_len: u64,
    pub manifest: Manifest,
    pub tree: TreeStats,
    pub warnings: Vec<String>,
    pub modulefiles_written: Vec<PathBuf>,
    pub timings: Timings,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("source directory {} does not exist", crate::exec::show(path))]
    SrcMissing { path: PathBuf },
    #[error(
        "source {} is not a directory; give the directory whose contents go into the pool",
        crate::exec::show(path)
    )]
    SrcNotDir { path: PathBuf },
    #[error("source {} is a symbolic link loop (too many levels of symbolic links); point SRC at a real directory", crate::exec::show(path))]
    SrcLoop { path: PathBuf },
    #[error("cannot read source {}: {source}", crate::exec::show(path))]
    SrcIo {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tree(#[from] TreeError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(
        "{} already exists; use --force to replace it",
        crate::exec::show(path)
    )]
    OutExists { path: PathBuf },
    #[error("{} is a directory; OUT must be a file name", crate::exec::show(path))]
    OutIsDir { path: PathBuf },
    #[error(
        "{} is inside the source tree {}; write the pool somewhere else",
        crate::exec::show(out),
        crate::exec::show(src)
    )]
    OutInsideSrc { out: PathBuf, src: PathBuf },
    #[error("cannot write the output in {}: {source}", crate::exec::show(dir))]
    OutDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("-s {size} bytes ({}) is too small for {}: the tree needs at least {needed} bytes ({} of file data, {} of file-system metadata); use -s {} or larger, or omit -s to size the image automatically",
        Bytes(*size), src.display(), Bytes(*data), Bytes(needed - data), suggest_size(*needed))]
    TooSmall {
        size: u64,
        needed: u64,
        data: u64,
        src: PathBuf,
    },
    #[error("-s {size} bytes is too small: the file system ran out of space while mke2fs copied {} into it ({detail}); use a larger -s (at least {}) or omit -s", crate::exec::show(src), suggest_size(size + size / 10))]
    Full {
        size: u64,
        src: PathBuf,
        detail: String,
    },
    #[error("the squashfs image of {} is {}, larger than -s {}; raise -s or omit it", crate::exec::show(src), Bytes(*actual), Bytes(*limit))]
    SquashfsTooLarge {
        actual: u64,
        limit: u64,
        src: PathBuf,
    },
    #[error("mke2fs cannot store an entry of {}: {detail}", crate::exec::show(src))]
    Unstorable { src: PathBuf, detail: String },
    #[error("--keep-special keeps setuid files and device nodes as root's in the pool: only root may ask for it (you are uid {uid}); leave it out and they are defused (setuid/setgid bits cleared, device nodes left out)")]
    KeepSpecialNotRoot { uid: u32 },
    #[error("{} holds {} that a {format} image would carry as root's: {}; {format} builds cannot leave them out, so build a squashfs pool (--format squashfs), or remove them from the tree", crate::exec::show(src), if list.len() == 1 { "an entry" } else { "entries" }, list.join(", "))]
    SpecialUnsupported {
        src: PathBuf,
        format: ImageFormat,
        list: Vec<String>,
    },
    #[error("{} cannot be named to mksquashfs to leave it out or clear its setuid/setgid bits (its name holds a newline); rename or remove it", crate::exec::show(path))]
    SpecialName { path: PathBuf },
    #[error("invalid {what}: {reason}")]
    BadName { what: &'static str, reason: String },
    #[error(transparent)]
    Tool(#[from] ExecError),
    #[error("{what} {}: {source}", crate::exec::show(path))]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn suggest_size(bytes: u64) -> String {
    // round up to whole MB (10^6), as users write -s 1020MB
    format!("{}MB", bytes.div_ceil(1_000_000))
}

impl BuildError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            BuildError::Tool(e) => e.exit_status(),
            BuildError::Io { source, .. } | BuildError::OutDir { source, .. } => {
                swpool_format::status::io_status(source)
            }
            BuildError::SrcIo { source, .. } => swpool_format::status::io_status(source),
            BuildError::Tree(TreeError::Io { .. }) => ExitStatus::System,
            _ => ExitStatus::BadInput,
        }
    }
}

/// Build a pool file from `opts.src` at `opts.out`.
pub fn build(opts: &BuildOptions) -> Result<BuildReport, BuildError> {
    let mut warnings = Vec::new();
    let mut timings = Timings::default();
    let t0 = Instant::now();
    let src = resolve_src(&opts.src)?;
    let (out, out_dir, format) = check_output(opts, &src)?;
    let (layout, name, version, modulefiles_written) =
        read_layout(opts, &src, &out, &mut warnings)?;

    // --- the tree
    let stats = tree::scan(&src, format.is_ext())?;
    timings.scan = t0.elapsed();
    let defuse = super::defuse::defuse_list(opts, &src, format, &stats, &mut warnings)?;
    let epoch = opts
        .source_date_epoch
        .unwrap_or(stats.newest_mtime.max(0) as u64);
    let uuid = derive_uuid(&name, &version, format, epoch, &stats);
    let ext_size = ext_image_size(opts, format, &stats)?;

    // --- write the image at a temporary name
    let (tmp, mut file) = TempOutput::create(&out).map_err(|source| BuildError::OutDir {
        dir: out_dir.clone(),
        source,
    })?;
    let t1 = Instant::now();
    match (format, ext_size) {
        (ImageFormat::Squashfs, _) => {
            write_squashfs(opts, &src, tmp.path(), &file, epoch, &defuse)?;
            timings.mkfs = t1.elapsed();
        }
        (ImageFormat::Erofs, _) => {
            write_erofs(opts, &src, tmp.path(), &file, epoch, &uuid)?;
            timings.mkfs = t1.elapsed();
        }
        (_, Some(size)) => {
            let mkfs = Mkfs {
                opts,
                src: &src,
                tmp: tmp.path(),
                file: &file,
                format,
                size,
                stats: &stats,
                uuid: &uuid,
                epoch,
            };
            timings.times = write_ext(&mkfs, &mut timings.mkfs, t1)?;
        }
        _ => unreachable!("ext formats always have a size"),
    }
    let image_size = file
        .metadata()
        .map_err(|source| BuildError::Io {
            what: "cannot stat",
            path: tmp.path().into(),
            source,
        })?
        .len();
    if let (true, Some(limit)) = (format.is_packed(), opts.size) {
        if image_size > limit {
            return Err(BuildError::SquashfsTooLarge {
                actual: image_size,
                limit,
                src: opts.src.clone(),
            });
        }
    }

    // --- the manifest: one pass over the image, chunk hashes in parallel
    let t2 = Instant::now();
    let mut manifest = Manifest {
        schema: MANIFEST_SCHEMA,
        name,
        version,
        description: layout.toml.as_ref().and_then(|t| t.description.clone()),
        format,
        image_size: 0,
        data_size: 0,
        digest: String::new(),
        chunk_size: opts.chunk_size,
        hash: CHUNK_HASH.into(),
        chunks: Vec::new(),
        created: epoch,
        packages: layout.packages.clone(),
        builder: format!("sw-pool {}", env!("CARGO_PKG_VERSION")),
    };
    hash_image(
        &file,
        tmp.path(),
        image_size,
        opts.chunk_size,
        &mut manifest,
    )?;
    timings.hash = t2.elapsed();

    // --- trailer, fsync, rename
    let t3 = Instant::now();
    let file_len =
        write_trailer(&mut file, image_size, &manifest.to_json(), &[]).map_err(|source| {
            BuildError::Io {
                what: "cannot write the manifest to",
                path: tmp.path().into(),
                source,
            }
        })?;
    if opts.force && out.is_dir() {
        return Err(BuildError::OutIsDir {
            path: opts.out.clone(),
        });
    }
    tmp.commit(file).map_err(|source| BuildError::Io {
        what: "cannot move the finished pool to",
        path: out.clone(),
        source,
    })?;
    timings.commit = t3.elapsed();
    Ok(BuildReport {
        out,
        file_len,
        manifest,
        tree: stats,
        warnings,
        modulefiles_written,
        timings,
    })
}

/// OUT is checked before anything is written: not a directory, not existing (without
/// `--force`), its directory usable, not inside SRC. Returns OUT (absolute), its directory and
/// the format (flag, else OUT's extension, else squashfs).
fn check_output(
    opts: &BuildOptions,
    src: &Path,
) -> Result<(PathBuf, PathBuf, ImageFormat), BuildError> {
    let out = crate::exec::absolute(&opts.out);
    if out.is_dir() {
        return Err(BuildError::OutIsDir {
            path: opts.out.clone(),
        });
    }
    if out.symlink_metadata().is_ok() && !opts.force {
        return Err(BuildError::OutExists {
            path: opts.out.clone(),
        });
    }
    let out_dir = parent_dir(&out).to_path_buf();
    let out_dir_real = out_dir
        .canonicalize()
        .map_err(|source| BuildError::OutDir {
            dir: out_dir.clone(),
            source,
        })?;
    if out_dir_real.starts_with(src) {
        return Err(BuildError::OutInsideSrc {
            out: opts.out.clone(),
            src: opts.src.clone(),
        });
    }
    let format = opts
        .format
        .or_else(|| ImageFormat::from_extension(&out))
        .unwrap_or(ImageFormat::Squashfs);
    Ok((out, out_dir, format))
}

/// The pool layout (pool.toml, install/, modulefiles/): modulefiles generated on request,
/// warnings for what is missing, and the pool's name and version.
fn read_layout(
    opts: &BuildOptions,
    src: &Path,
    out: &Path,
    warnings: &mut Vec<String>,
) -> Result<(PoolLayout, String, String, Vec<PathBuf>), BuildError> {
    let mut modulefiles_written = Vec::new();
    if opts.gen_modulefiles {
        let g = generate_missing(src, opts.modulefile_opts, &mut |p, b| {
            crate::atomic::write_file(p, b, false)
        })?;
        modulefiles_written = g.written;
        warnings.extend(g.warnings);
    }
    let layout = PoolLayout::scan(src)?;
    // one statement about a tree without pool.toml, true for what the tree holds
    match (&layout.toml, layout.packages.len()) {
        (Some(_), _) => {}
        (None, 0) => warnings.push(format!(
            "{} has no pool.toml and no install/: building an ad-hoc pool (no packages, no modulefiles); see `sw-pool init`",
            opts.src.display()
        )),
        (None, n) => warnings.push(format!(
            "{} has no pool.toml: building it without one ({n} package{} under install/, name and version from the command line or the directory); `sw-pool init` writes one",
            opts.src.display(),
            if n == 1 { "" } else { "s" }
        )),
    }
    for p in layout.packages.iter().filter(|p| !p.modulefile) {
        warnings.push(format!(
            "package {}/{} has no modulefile (modulefiles/{}/{}.lua); it will not appear in `module avail` (use --gen-modulefiles)",
            p.name, p.version, p.name, p.version
        ));
    }
    for f in &layout.orphan_modulefiles {
        warnings.push(format!(
            "modulefile {} has no install/ directory to point at",
            f.display()
        ));
    }
    let name = opts
        .name
        .clone()
        .or_else(|| layout.toml.as_ref().map(|t| t.name.clone()))
        .unwrap_or_else(|| {
            out.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default()
        });
    let version = opts
        .version
        .clone()
        .or_else(|| layout.toml.as_ref().map(|t| t.version.clone()))
        .unwrap_or_else(|| "0".into());
    check_name("name", &name).map_err(|reason| BuildError::BadName {
        what: "pool name (set it with --name)",
        reason,
    })?;
    check_name("version", &version).map_err(|reason| BuildError::BadName {
        what: "pool version",
        reason,
    })?;
    Ok((layout, name, version, modulefiles_written))
}

/// The size of an ext image (`None` for squashfs): `-s`, refused below the tree's lower bound,
/// else the automatic size.
fn ext_image_size(
    opts: &BuildOptions,
    format: ImageFormat,
    stats: &TreeStats,
) -> Result<Option<u64>, BuildError> {
    if !format.is_ext() {
        return Ok(None);
    }
    let needed = ext_min_size(format, stats);
    Ok(Some(match opts.size {
        Some(s) if s < needed => {
            return Err(BuildError::TooSmall {
                size: s,
                needed,
                data: stats.blocks_4k * 4096,
                src: opts.src.clone(),
            })
        }
        Some(s) => s,
        None => ext_auto_size(format, stats),
    }))
}

/// `mksquashfs -comp zstd` into the temporary, reproducibly; `defuse`: setuid/setgid files whose
/// bits are cleared (a pseudo-file `m` line each) and device nodes left out (`-ef`).
fn write_squashfs(
    opts: &BuildOptions,
    src: &Path,
    tmp: &Path,
    file: &File,
    epoch: u64,
    defuse: &[tree::Special],
) -> Result<(), BuildError> {
    let mut c = ToolCommand::new(Tool::Mksquashfs)
        .path(src)
        .path(tmp)
        .args(["-noappend", "-no-progress", "-quiet", "-comp", "zstd"])
        .arg("-mkfs-time")
        .arg(epoch.to_string())
        .env_remove("SOURCE_DATE_EPOCH");
    if opts.all_root {
        c = c.arg("-all-root");
    }
    // the pseudo and exclude files live until mksquashfs is done
    let (mut c, _sides) = super::defuse::mksquashfs_args(c, tmp, defuse)?;
    if opts.no_compress {
        c = c.args(["-noI", "-noId", "-noD", "-noF", "-noX"]);
    } else if let Some(l) = opts.squashfs_level {
        c = c.arg("-Xcompression-level").arg(l.to_string());
    }
    with_early_writeback(file, || c.run(opts.path_var.as_deref()))?;
    Ok(())
}

/// `mkfs.erofs` into the temporary, reproducibly: every inode's times and the superblock's build
/// time are the epoch (`-T`), the UUID is derived from the tree (`-U`), lz4hc (Debian 12's
/// erofs-utils 1.5 has lz4 and lz4hc only; lz4hc of 1 GiB of random data took over 6.5 minutes
/// here), or uncompressed with `--no-compress`. The kernel mounts it (raw on a file or through a loop
/// device); there is no FUSE server for it on these systems.
fn write_erofs(
    opts: &BuildOptions,
    src: &Path,
    tmp: &Path,
    file: &File,
    epoch: u64,
    uuid: &str,
) -> Result<(), BuildError> {
    let mut c = ToolCommand::new(Tool::MkfsErofs).arg("--quiet");
    if opts.all_root {
        c = c.arg("--all-root");
    }
    if !opts.no_compress {
        c = c.arg("-zlz4hc");
    }
    let c = c
        .arg(format!("-T{epoch}"))
        .arg(format!("-U{uuid}"))
        .path(tmp)
        .path(src)
        .env_remove("SOURCE_DATE_EPOCH");
    with_early_writeback(file, || c.run(opts.path_var.as_deref()))?;
    Ok(())
}

/// What `mke2fs -d` needs.
struct Mkfs<'a> {
    opts: &'a BuildOptions,
    src: &'a Path,
    tmp: &'a Path,
    file: &'a File,
    format: ImageFormat,
    size: u64,
    stats: &'a TreeStats,
    uuid: &'a str,
    epoch: u64,
}

/// A sparse file of the image's size filled and formatted in one step by `mke2fs -d`, then every
/// inode's atime and ctime set to its mtime. Sets `mkfs_time`; returns the time of the latter.
fn write_ext(m: &Mkfs, mkfs_time: &mut Duration, t1: Instant) -> Result<Duration, BuildError> {
    m.file.set_len(m.size).map_err(|source| BuildError::Io {
        what: "cannot size",
        path: m.tmp.into(),
        source,
    })?;
    let inodes = m.stats.inodes() + m.stats.inodes() / 10 + 64;
    let cmd = ToolCommand::new(Tool::Mke2fs)
        .args([
            "-q",
            "-F",
            "-t",
            m.format.as_str(),
            "-b",
            "4096",
            "-I",
            "256",
            "-m",
            "0",
            // no metadata_csum: chunk hashes protect the pool; see ext_times.rs
            "-O",
            "^metadata_csum",
        ])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-U")
        .arg(m.uuid)
        .arg("-E")
        .arg(format!("hash_seed={},root_owner=0:0", m.uuid))
        .arg("-d")
        .path(m.src)
        .end_of_options()
        .path(m.tmp)
        .env("E2FSPROGS_FAKE_TIME", m.epoch.to_string())
        .env_remove("SOURCE_DATE_EPOCH")
        .env_remove("MKE2FS_CONFIG");
    let r = with_early_writeback(m.file, || cmd.run(m.opts.path_var.as_deref()));
    *mkfs_time = t1.elapsed();
    if let Err(ExecError::Failed { stderr, .. }) = &r {
        let detail = last_line(stderr);
        if stderr.contains("Could not allocate block")
            || stderr.contains("No space left")
            || stderr.contains("Could not allocate inode")
        {
            return Err(BuildError::Full {
                size: m.size,
                src: m.opts.src.clone(),
                detail,
            });
        }
        if stderr.contains("already exists")
            || stderr.contains("File name too long")
            || stderr.contains("Invalid argument passed")
        {
            return Err(BuildError::Unstorable {
                src: m.opts.src.clone(),
                detail,
            });
        }
    }
    r?;
    let tt = Instant::now();
    super::ext_times::normalize_times(m.file).map_err(|source| BuildError::Io {
        what: "cannot normalise inode times in",
        path: m.tmp.into(),
        source,
    })?;
    Ok(tt.elapsed())
}

/// The chunk hashes (one pass over the image, in parallel) into `manifest`.
fn hash_image(
    file: &File,
    tmp: &Path,
    image_size: u64,
    chunk_size: u64,
    manifest: &mut Manifest,
) -> Result<(), BuildError> {
    let chunks =
        crate::pool::chunks::hash_chunks(file, image_size, chunk_size, None).map_err(|source| {
            BuildError::Io {
                what: "cannot read back",
                path: tmp.into(),
                source,
            }
        })?;
    let mut builder = ChunkListBuilder::new(image_size, chunk_size);
    for c in chunks {
        builder.push(c);
    }
    builder.finish_into(manifest);
    Ok(())
}

/// Run `f` (mke2fs or mksquashfs filling `file` through its own descriptor) while a helper thread
/// starts the kernel's writeback of `file`'s dirty pages every 100 ms (`sync_file_range`
/// `SYNC_FILE_RANGE_WRITE`: asynchronous, it waits for nothing and guarantees nothing; the tool's
/// own fsync and ours before the rename stay the durability points). Without it the page cache
/// holds the whole image dirty until the tool's final fsync (mke2fs) or ours (mksquashfs), and
/// writing it to disk then is serial time: 1.2 s for the paper's 1 GB image here, while the disk
/// sat idle during the copy.
fn with_early_writeback<T>(file: &File, f: impl FnOnce() -> T) -> T {
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        scope.spawn(move || {
            let fd = file.as_raw_fd();
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(WRITEBACK_EVERY) {
                // SAFETY: a plain syscall on a descriptor `file` keeps open for this scope.
                // SAFETY: `fd` belongs to the image file the build holds open; sync_file_range only
                // starts writeback and touches no memory of ours.
                let r = unsafe { libc::sync_file_range(fd, 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
                if r != 0 {
                    tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range: no early writeback");
                    return; // not supported here: the final fsync does it all, as before
                }
            }
        });
        let out = f();
        drop(stop);
        out
    })
}

const WRITEBACK_EVERY: Duration = Duration::from_millis(100);

fn resolve_src(p: &Path) -> Result<PathBuf, BuildError> {
    match std::fs::metadata(p) {
        Ok(m) if m.is_dir() => p.canonicalize().map_err(|source| BuildError::SrcIo {
            path: p.into(),
            source,
        }),
        Ok(_) => Err(BuildError::SrcNotDir { path: p.into() }),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            Err(BuildError::SrcLoop { path: p.into() })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if p.symlink_metadata().is_ok() {
                Err(BuildError::SrcIo {
                    path: p.into(),
                    source: std::io::Error::other("dangling symbolic link"),
                })
            } else {
                Err(BuildError::SrcMissing { path: p.into() })
            }
        }
        Err(source) => Err(BuildError::SrcIo {
            path: p.into(),
            source,
        }),
    }
}

fn last_line(s: &str) -> String {
    s.trim().lines().last().unwrap_or("").trim().to_string()
}

/// mke2fs' default journal size (in 4 KiB blocks) for a file system of `blocks` blocks.
fn default_journal_blocks(blocks: u64) -> u64 {
    match blocks {
        b if b < 2048 => 0,
        b if b < 32768 => 1024,
        b if b < 256 * 1024 => 4096,
        b if b < 512 * 1024 => 8192,
        b if b < 4096 * 1024 => 16384,
        b if b < 8192 * 1024 => 32768,
        b if b < 16384 * 1024 => 65536,
        b if b < 32768 * 1024 => 131072,
        _ => 262144,
    }
}

/// A lower bound of the bytes an ext image of this tree needs: what `-s` is checked against before
/// anything is written (mke2fs' own "could not allocate" is mapped to a clear error as a second line).
pub fn ext_min_size(format: ImageFormat, s: &TreeStats) -> u64 {
    let mut blocks = s.blocks_4k + s.dirent_bytes.div_ceil(4096).max(s.dirs) + s.long_symlinks;
    if format != ImageFormat::Ext4 {
        blocks += s.map_blocks_4k;
    }
    let inode_table = (s.inodes() + 16) * 256;
    let journal = if format == ImageFormat::Ext2 {
        0
    } else {
        default_journal_blocks(blocks) * 4096
    };
    blocks * 4096 + inode_table + journal
}

/// The size chosen without `-s`: the lower bound plus a 5 % + 4 MiB margin for group descriptors,
/// bitmaps, backup superblocks and spare inodes, rounded up to 1 MiB (documented in the README).
fn ext_auto_size(format: ImageFormat, s: &TreeStats) -> u64 {
    let need = ext_min_size(format, s);
    let with_margin = need + need / 20 + (4 << 20);
    with_margin.div_ceil(1 << 20).max(MIN_AUTO_EXT_SIZE >> 20) << 20
}

/// A UUID (for mke2fs `-U` and the directory hash seed) that depends only on what is built.
fn derive_uuid(
    name: &str,
    version: &str,
    format: ImageFormat,
    epoch: u64,
    s: &TreeStats,
) -> String {
    let mut h = Sha256::new();
    h.update(b"sw-pool uuid v1\0");
    for part in [name, version, format.as_str()] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    for n in [epoch, s.files, s.dirs, s.symlinks, s.bytes, s.blocks_4k] {
        h.update(n.to_le_bytes());
    }
    let d = h.finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[..16]);
    b[6] = (b[6] & 0x0f) | 0x40; // version 4 layout (random-looking)
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let x = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuid_is_stable_and_well_formed() {
        let s = TreeStats {
            files: 3,
            ..Default::default()
        };
        let a = derive_uuid("n", "1", ImageFormat::Ext4, 5, &s);
        assert_eq!(a, derive_uuid("n", "1", ImageFormat::Ext4, 5, &s));
        assert_ne!(a, derive_uuid("n", "2", ImageFormat::Ext4, 5, &s));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }

    #[test]
    fn paper_size_is_enough_for_one_gb() {
        // head -c 1GB: 10^9 bytes in one file; the paper builds it with -s 1020MB (ext2)
        let s = TreeStats {
            files: 1,
            dirs: 1,
            bytes: 1_000_000_000,
            blocks_4k: 1_000_000_000u64.div_ceil(4096),
            map_blocks_4k: 300,
            dirent_bytes: 24,
            ..Default::default()
        };
        assert!(ext_min_size(ImageFormat::Ext2, &s) < 1_020_000_000);
        assert!(ext_min_size(ImageFormat::Ext2, &s) > 1_000_000_000);
        assert!(ext_auto_size(ImageFormat::Ext4, &s) > ext_min_size(ImageFormat::Ext4, &s));
    }

    #[test]
    fn hashes_skip_holes() {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = tempfile::tempfile().unwrap();
        f.set_len(16 << 20).unwrap();
        f.seek(SeekFrom::Start(5 << 20)).unwrap();
        f.write_all(&[9u8; 100]).unwrap();
        let h = crate::pool::chunks::hash_chunks(&f, 16 << 20, 1 << 20, None).unwrap();
        assert_eq!(h.len(), 16);
        assert_eq!(h.iter().filter(|x| x.is_some()).count(), 1);
        assert!(h[5].is_some());
    }
}
