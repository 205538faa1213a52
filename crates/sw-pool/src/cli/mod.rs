//! Command-line definitions (clap structs only). Man pages and completions are generated from these.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod environment;
pub mod help;
mod image;
mod load;
mod shadow;
pub use environment::*;
pub use help::{multicall_args, parse_from};
pub use image::*;
pub use load::*;
pub use shadow::*;

/// What `run` is (`sw-pool --help`, `sw-pool run --help`).
pub const RUN_ABOUT: &str = "Run a command in an isolated environment (own user, mount and PID \
                             namespaces), with a writable layer over the host's tree if asked";
/// What `shell` is.
pub const SHELL_ABOUT: &str = "Start your shell in an isolated environment (as `run`, interactive)";

pub const EXIT_STATUS_HELP: &str = "\
EXIT STATUS:
  0  success
  1  internal error (a bug: please report it)
  2  usage error (bad command line)
  3  bad input (a missing or wrong path, a bad size, OUT exists without --force)
  4  not a valid pool or image (wrong magic, damaged manifest, failed check)
  5  an external tool is missing or failed (mksquashfs, squashfuse_ll, ...)
  6  the system refused (permission denied, no space left, I/O error)
  7  signature missing, invalid or untrusted
  8  a collective operation failed on another node (the message names it)";

#[derive(Debug, Parser)]
#[command(
    name = "sw-pool",
    version,
    about = "Software pools for HPC clusters: build one image of a software stack, broadcast it with MPI to \
             node-local storage, mount it without root, and use it through Lmod",
    after_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Print more: per-phase timings and details
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Print only errors
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Log filter for diagnostics on stderr (error, warn, info, debug, trace); default: $SW_POOL_LOG or warn
    #[arg(long, global = true, value_name = "LEVEL", value_parser = log_filter)]
    pub log: Option<String>,
}

/// `--log`: levels, or `target=level` directives, comma-separated (a bare word that is not a level
/// would silently filter for a target of that name).
fn log_filter(s: &str) -> Result<String, String> {
    const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];
    for part in s.split(',') {
        let level = part.rsplit_once('=').map_or(part, |(_, l)| l);
        if !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{part:?} is not a log level: use one of {} (or TARGET=LEVEL)",
                LEVELS.join(", ")
            ));
        }
    }
    Ok(s.to_string())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a pool file from a directory tree (squashfs or ext2/3/4, with its manifest)
    Build(BuildArgs),
    /// Show a pool's manifest and layout, and check its file system
    Inspect(InspectArgs),
    /// Create an empty pool tree (pool.toml, install/, modulefiles/, source/, config/)
    Init(InitArgs),
    /// Write Lmod modulefiles for packages in a pool tree that have none
    Modulefiles(ModulefilesArgs),
    /// Copy a file or directory to node-local storage on every node of an MPI job (scalable-fs-cp)
    Cp(CpArgs),
    /// Mount a pool or image read-only with FUSE (scalable-fs-mount)
    Mount(MountArgs),
    /// Release a mount: the last user unmounts it (fusermount3 -u)
    Umount(UmountArgs),
    /// This node's pools mounted by you: mount points, job ids, reference counts, stale mounts
    List(ListArgs),
    /// The pools you can load by NAME/VERSION (on the pool path): signed or not, cached on this node
    Avail(AvailArgs),
    /// Unmount and forget what a job left behind, stale mounts, or everything of yours on this node
    Cleanup(CleanupArgs),
    /// Slurm hooks: `prolog`, `task-prolog`, `epilog` (`make install` links them as libexec/sw-pool/prolog, task-prolog and epilog)
    Slurm(SlurmArgs),
    /// Print the shell code that puts a mounted pool's modules on MODULEPATH (or takes them off)
    Env(EnvArgs),
    /// Make a key pair for signing pools (Ed25519 by default; RSA and ECDSA P-256 on request)
    Keygen(KeygenArgs),
    /// Sign a pool: a signature over its manifest, and the paper-compatible POOL.sig
    Sign(SignArgs),
    /// Check a pool's signature and every chunk of its image against the signed manifest
    Verify(VerifyArgs),
    /// Copy a pool to node-local storage on every node (MPI), mount it, and print the shell code
    /// that puts its modules on MODULEPATH
    Load(LoadArgs),
    /// Release a loaded pool (the last user unmounts it) and print the shell code that undoes load
    Unload(UnloadArgs),
    /// This user's node-local pool cache: list entries, prune least recently used ones
    Cache(CacheArgs),
    /// Show the effective configuration and where each value comes from
    Config(ConfigArgs),
    /// Put programs, the libraries they load and the files they open into a pool tree or pool
    Bundle(BundleArgs),
    // (the front parses these two itself: `FrontCommand` in front.rs, the same texts)
    #[command(about = RUN_ABOUT)]
    Run(RunArgs),
    #[command(about = SHELL_ABOUT)]
    Shell(ShellArgs),
    /// Your writable layers: list, create, rm, du
    Layer(LayerArgs),
    /// Writable user images for data sets of many small files: create, resize, check
    Image(ImageArgs),
    /// The modulefile hook: show a site pool over the original software for the job (load) or
    /// release it (unload); never fails a module command
    Shadow(ShadowArgs),
    /// Print a shell completion script (bash, zsh, fish, ...) or write the man pages
    Generate(GenerateArgs),
    /// Print the shell function that makes `sw-pool load|unload|env` change the calling shell
    ShellInit(ShellInitArgs),
    /// (csh's alias) print `load`/`unload`/`env`'s shell code, or the command line of any other
    /// subcommand, for the alias to evaluate
    #[command(hide = true)]
    ShellExec(ShellExecArgs),
    /// (started by `load --lazy`) one node's on-demand server: a task of the job's background step
    #[command(hide = true)]
    LazyServe(LazyServeArgs),
    /// (started by `run --cache` in a step of several nodes) one node's server of a job-wide view
    #[command(hide = true)]
    ViewServe(ViewServeArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "EXAMPLES:
  sw-pool bundle --name app --version 1.0 --out app-tree /opt/app/bin/app
  sw-pool bundle --name app --version 1.0 --out app-1.0.sqfs /opt/app/bin/app \\
      --trace -- /opt/app/bin/app --selftest
  sw-pool bundle --name pyapp --version 1 --out pyapp.sqfs --python /sw/venv \\
      --trace -- python3 -c 'import numpy'

The ELF closure follows DT_NEEDED, DT_RPATH / DT_RUNPATH ($ORIGIN),
LD_LIBRARY_PATH, ld.so.cache (through `ldconfig -p`) and the default
directories as glibc's loader does. --trace runs CMD once under `strace -f` and
adds every file it opened under the traced prefixes (default: the inputs'
installation prefixes, e.g. /opt/app for /opt/app/bin/app): dlopen()ed plugins,
data files, and with --python the modules it imported, under python/ (on
PYTHONPATH through the modulefile).
The C library, the loader, MPI, the interconnect stack, Slurm and GPU drivers
stay out (they must come from the host); install/NAME/VERSION/bundle.json says
for every file why it is in or out.
Library references are rewritten (patchelf) to $ORIGIN-relative paths: no
search by the loader, wherever the pool is mounted. The output is written to a
temporary directory and renamed at the end; an OUT ending in
.sqfs/.squashfs/.ext2/.ext3/.ext4 is built into a pool file.")]
pub struct BundleArgs {
    /// Package and pool name; default: the first input's file name
    #[arg(long)]
    pub name: Option<String>,
    /// Package and pool version; default: 0
    #[arg(long)]
    pub version: Option<String>,
    /// The pool tree (a new directory) or pool file (.sqfs, .ext4, ...) to write
    #[arg(short, long, value_name = "TREE|POOL")]
    pub out: PathBuf,
    /// Replace OUT if it exists
    #[arg(short, long)]
    pub force: bool,
    /// Lay out the Python modules the traced command imports under python/ (interpreter:
    /// PYTHON, default python3); needs --trace
    #[arg(long, num_args = 0..=1, require_equals = true, value_name = "PYTHON")]
    pub python: Option<Option<PathBuf>>,
    /// Run the command after `--` once under strace and bundle the files it opens
    #[arg(long)]
    pub trace: bool,
    /// Bundle traced files under DIR only (repeatable); default: the inputs' prefixes
    #[arg(long, value_name = "DIR")]
    pub trace_prefix: Vec<PathBuf>,
    /// Also leave out libraries whose name matches GLOB (`*` wildcard; repeatable)
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Bundle libraries matching GLOB even if the exclude list names them (repeatable)
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// Start from an empty exclude list (only --exclude applies)
    #[arg(long)]
    pub no_default_excludes: bool,
    /// How bundled objects find bundled libraries: `needed` ($ORIGIN/… paths in DT_NEEDED, no
    /// search) or `runpath` ($ORIGIN/… directories in DT_RUNPATH)
    #[arg(long, value_enum, default_value = "needed")]
    pub link: LinkArg,
    /// Manifest chunk size when OUT is a pool file; default from config: 1MiB
    #[arg(long, value_name = "SIZE")]
    pub chunk: Option<String>,
    /// Print the report (bundle.json's content) as JSON
    #[arg(long)]
    pub json: bool,
    /// Executables, libraries or directories to bundle (optional with --trace: then what the
    /// command opens under --trace-prefix / the Python module path is the bundle)
    #[arg(required_unless_present = "trace", value_name = "EXE|DIR")]
    pub inputs: Vec<PathBuf>,
    /// With --trace: the command to run (after `--`)
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LinkArg {
    Needed,
    Runpath,
}

#[derive(Debug, Args)]
#[command(after_help = "EXAMPLES:
  sw-pool build -s 1020MB test-pool.ext2 test-pool
      the paper's call: an ext2 image of 1020 MB
  sw-pool build demo-1.0.sqfs demo
      squashfs (zstd), sized automatically
  sw-pool build --format ext4 --gen-modulefiles pool.img tree

SIZE accepts coreutils units: KB/MB/GB are powers of 1000, K/M/G and
KiB/MiB/GiB powers of 1024.
Without -s an ext image is sized from the tree: data + metadata + 5 % + 4 MiB
(at least 16 MiB).
The same tree always gives a bit-identical pool; SOURCE_DATE_EPOCH sets the
recorded build time.")]
pub struct BuildArgs {
    /// Image size (ext formats); an upper limit for squashfs
    #[arg(short, long, value_name = "SIZE")]
    pub size: Option<String>,
    /// File-system format; default: from OUT's extension (.sqfs .squashfs .ext2 .ext3 .ext4), else squashfs
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// Pool name; default: pool.toml's, else OUT's file name without extension
    #[arg(long)]
    pub name: Option<String>,
    /// Pool version; default: pool.toml's, else "0"
    #[arg(long)]
    pub version: Option<String>,
    /// Replace OUT if it exists
    #[arg(short, long)]
    pub force: bool,
    /// Manifest chunk size (power of two, 4KiB..1GiB); default from config: 1MiB
    #[arg(long, value_name = "SIZE")]
    pub chunk: Option<String>,
    /// Write missing Lmod modulefiles into SRC before building
    #[arg(long)]
    pub gen_modulefiles: bool,
    /// With --gen-modulefiles: also set LD_LIBRARY_PATH
    #[arg(long, requires = "gen_modulefiles")]
    pub ld_library_path: bool,
    /// With --gen-modulefiles: Lmod (lua), Environment Modules (tcl) or both
    #[arg(
        long,
        value_name = "lua|tcl|both",
        default_value = "both",
        requires = "gen_modulefiles"
    )]
    pub modules: swpool_format::pool::modulefile::Formats,
    /// Store the data uncompressed (squashfs, EROFS): for incompressible data (random, already
    /// compressed) it builds faster and reads at the disk's speed; ext images are never compressed
    #[arg(long)]
    pub no_compress: bool,
    /// Store every file as root's (squashfs, EROFS): for a root file system built from a tree
    /// you own, to be a base of `sw-pool run --base` (ext images keep the tree's owners)
    #[arg(long)]
    pub all_root: bool,
    /// With --all-root: keep setuid/setgid bits and device nodes (root only); without it they are
    /// cleared and left out, each named in a warning
    #[arg(long, requires = "all_root")]
    pub keep_special: bool,
    /// Print the build report as JSON
    #[arg(long)]
    pub json: bool,
    /// A Python environment (venv, uv, conda, pixi) to lay out as the pool's one package,
    /// relocatable, with its interpreter and modulefiles (then OUT alone, no SRC)
    #[arg(long, value_name = "ENV", conflicts_with_all = ["gen_modulefiles", "all_root"])]
    pub from_env: Option<PathBuf>,
    /// With --from-env (conda, pixi): the absolute path install/<name>/<version> of the pool will
    /// be seen at on the nodes; files conda-meta lists with a prefix placeholder are rewritten to
    /// it as conda-pack does (a binary file only to a prefix no longer than the original)
    #[arg(long, value_name = "DIR", requires = "from_env")]
    pub env_prefix: Option<PathBuf>,
    /// The pool file to write
    pub out: PathBuf,
    /// The directory whose contents become the pool's root
    #[arg(required_unless_present = "from_env", conflicts_with = "from_env")]
    pub src: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormatArg {
    Squashfs,
    Ext4,
    Ext3,
    Ext2,
    /// Mounted by the kernel only, through the site's mount helper (no FUSE server for EROFS)
    Erofs,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Print as JSON
    #[arg(long)]
    pub json: bool,
    /// Skip the file-system consistency check (e2fsck -fn / unsquashfs -stat)
    #[arg(long)]
    pub no_check: bool,
    /// The pool file
    pub pool: PathBuf,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The pool's name (pool.toml); default: DIR's last component
    #[arg(long)]
    pub name: Option<String>,
    /// The pool's version (pool.toml), e.g. 1.0 or 2026.11
    #[arg(long)]
    pub version: String,
    /// The pool's one-line description (pool.toml)
    #[arg(long)]
    pub description: Option<String>,
    /// The directory to create (must be empty or absent)
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct ModulefilesArgs {
    /// Also prepend lib/ and lib64/ to LD_LIBRARY_PATH
    #[arg(long)]
    pub ld_library_path: bool,
    /// Write Lmod (lua), Environment Modules (tcl) modulefiles, or both
    #[arg(long, value_name = "lua|tcl|both", default_value = "both")]
    pub modules: swpool_format::pool::modulefile::Formats,
    /// The pool tree (with pool.toml)
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct CpArgs {
    /// Print the result as JSON (phases, bytes read from SRC, bytes sent, nodes)
    #[arg(long)]
    pub json: bool,
    /// Transfer chunk size for plain files and directories (e.g. 1MiB; default: the chunk_size
    /// setting); pools always move in their manifest's chunks
    #[arg(long, value_name = "SIZE")]
    pub chunk: Option<String>,
    /// Do not draw a progress bar (it is drawn only on world rank 0 and only on a terminal)
    #[arg(long)]
    pub no_progress: bool,
    /// Source file or directory (read once, from shared storage)
    pub src: PathBuf,
    /// Destination path on every node
    pub dest: PathBuf,
}

#[derive(Debug, Args)]
#[command(after_help = "EXAMPLES:
  sw-pool mount demo-1.0.sqfs $HOME/mnt/demo
      mount a pool (squashfs -> squashfuse_ll)
  scalable-fs-mount test-pool.ext2 $LOCAL_TMPDIR/mnt
      the paper's tool (ext2 -> fuse2fs)
  sw-pool mount demo/1.0
      found on $SW_POOL_PATH, mounted at $SW_POOL_MOUNT/demo/1.0
  sw-pool mount --in-place demo/1.0
      no copy: served from the pool file, each chunk verified on first read

A pool is copied into the node-local cache (every chunk verified) and mounted
from there; with --in-place it is served from where it lies by sw-pool-serve,
which hashes each chunk against the manifest before serving it (a changed
chunk reads as EIO and is logged; the rest stays readable).

The format comes from the image's magic, never from its name. Pools are always
mounted ro,nosuid,nodev; --rw is for your own writable user images.
The mount point must be an empty directory (not a symlink) owned by you or
root. Mounting the same pool at the same mount point again only adds a
reference (see `sw-pool list`); `sw-pool umount` drops one, and the last one
unmounts. Records live in $XDG_RUNTIME_DIR/sw-pool (root: /run/sw-pool;
SW_POOL_STATE_DIR overrides).")]
pub struct MountArgs {
    /// Mount options: ro (the default), rw (= --rw), nosuid and nodev (always applied)
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Option<String>,
    /// Read-write: a user image (`sw-pool image create`), on one node at a time under its lease
    #[arg(long)]
    pub rw: bool,
    /// Through the site's mount helper: mount the site pool NAME/VERSION once on this node and
    /// show each install/<pkg>/<ver> of it over <shadow_root>/<pkg>/<ver> (the original) for
    /// everyone; `sw-pool umount --shadow NAME/VERSION` releases it
    #[arg(long, conflicts_with_all = ["rw", "mountpoint", "options"])]
    pub shadow: bool,
    /// With --rw: mounted by the kernel through the site's mount helper (no FUSE), under the
    /// same lease; DIR must be under the helper's user_mount_root/<you>/
    #[arg(long, requires = "rw")]
    pub kernel: bool,
    /// Serve a pool from where it lies (no copy): every chunk is read from the pool file when
    /// first touched and hashed against its signed manifest before any byte of it is served
    #[arg(long, conflicts_with_all = ["rw", "shadow", "kernel"])]
    pub in_place: bool,
    /// Job id recorded with the mount; default: $SLURM_JOB_ID
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// Seconds to wait for the mount to appear
    #[arg(long, value_name = "SECS", default_value_t = 15.0)]
    pub timeout: f64,
    /// Print the mount record as JSON
    #[arg(long)]
    pub json: bool,
    /// Print only the mount point (for scripts and the pool modulefile)
    #[arg(long, conflicts_with = "json")]
    pub print_mountpoint: bool,
    /// The pool or image file, or NAME/VERSION of a pool on $SW_POOL_PATH
    pub image: PathBuf,
    /// An empty directory; default for a pool: $SW_POOL_MOUNT/NAME/VERSION (created)
    pub mountpoint: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(
    after_help = "A mount shared by several users (reference count > 1) loses one reference
and stays. A busy mount is left mounted and the processes holding it are named;
with --force it is detached lazily (it disappears when the last process lets
go). A stale mount (its FUSE process died) and a record whose mount is gone are
cleaned up."
)]
pub struct UmountArgs {
    /// Detach lazily when busy; remove an unreadable record
    #[arg(short, long)]
    pub force: bool,
    /// Drop the reference of this job; default: $SLURM_JOB_ID, else the latest
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Release a shadow mount (`mount --shadow`): the argument is NAME/VERSION
    #[arg(long)]
    pub shadow: bool,
    /// The mount point to release
    pub mountpoint: PathBuf,
}

#[derive(Debug, Args)]
#[command(
    after_help = "STATUS: ok, mounting (right now), stale (FUSE helper died or mount
interrupted), gone (record without mount), unrecorded (a sw-pool FUSE mount
without record), corrupt.
  sw-pool list --stale
      what `sw-pool cleanup --stale` would clean
  srun -N4 --ntasks-per-node=1 --mpi=pmix sw-pool list --all-nodes
      one table for the job's nodes"
)]
pub struct ListArgs {
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Only mounts this job holds a reference to
    #[arg(long, value_name = "JOB_ID")]
    pub job: Option<String>,
    /// Only mounts without a record and records without a mount; also cache entries nothing mounts
    #[arg(long)]
    pub unreported: bool,
    /// Only stale mounts (FUSE helper died), records whose mount is gone, interrupted mounts
    #[arg(long)]
    pub stale: bool,
    /// Collect every node's list to rank 0 (run under mpirun/srun, one table for the job)
    #[arg(long)]
    pub all_nodes: bool,
    /// Node-local cache directory for --unreported (default: $SW_POOL_CACHE, $LOCAL_TMPDIR, $TMPDIR, /tmp)
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(after_help = "EXAMPLES:
  sw-pool cleanup --stale --dry-run
      what would be cleaned: stale FUSE mounts, records without mount
  sw-pool cleanup --job 1234
      drop job 1234's references; unmount what nobody else uses
  sw-pool cleanup --all --kill
      unmount all of yours, ending (by PID, after naming them) what holds them

A mount other jobs still use only loses the selected job's references. Each
action is logged to syslog (tag sw-pool) with the job id. Run as root with
--user, it cleans that user's mounts as that user.")]
pub struct CleanupArgs {
    /// Drop this job's references (the last one unmounts)
    #[arg(long, value_name = "JOB_ID")]
    pub job: Option<String>,
    /// Stale FUSE mounts, records without a mount, interrupted mounts
    #[arg(long)]
    pub stale: bool,
    /// Everything of yours on this node, with or without a record
    #[arg(long)]
    pub all: bool,
    /// End the processes that keep a mount busy (named first) instead of detaching it lazily
    #[arg(long)]
    pub kill: bool,
    /// Say what would be done; change nothing
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// As root: clean this user's mounts (run as that user)
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(after_help = "slurm.conf (see README, \"For admins: Slurm\"):
  Prolog=/usr/local/libexec/sw-pool/prolog
      cleans the job user's stale mounts on the node
  TaskProlog=/usr/local/libexec/sw-pool/task-prolog
      mounts the job's pools on the node, sets MODULEPATH
  Epilog=/usr/local/libexec/sw-pool/epilog
      unmounts what the job mounted, kills leftover helpers
  PrologFlags=Alloc
Hooks do nothing for jobs that did not use sw-pool, drop to the job's user
before any work, and are safe to run twice.")]
pub struct SlurmArgs {
    #[command(subcommand)]
    pub hook: SlurmHook,
}

#[derive(Debug, Subcommand)]
pub enum SlurmHook {
    /// Prolog (root, every allocated node): clean the job user's stale mounts there
    Prolog(HookArgs),
    /// TaskProlog (the job's user, every task): mount the job's pools on this node once; print
    /// `export` lines for MODULEPATH
    TaskProlog,
    /// Epilog (root, every allocated node): unmount what the job mounted, remove its records, kill
    /// its leftover FUSE helpers; other jobs' mounts stay
    Epilog(HookArgs),
    /// For the SPANK plugin, at submission: check that every pool of a `--pool` list exists and
    /// passes the trust policy
    CheckPools {
        /// NAME/VERSION[,NAME/VERSION...]
        pools: String,
    },
    /// For the SPANK plugin: load every pool of the list on all nodes of a job, one broadcast each
    /// (`sw-pool load` spread with `srun --overlap`)
    Broadcast {
        /// The job
        #[arg(long, value_name = "JOB_ID")]
        job_id: String,
        /// Its number of nodes
        #[arg(long)]
        nodes: u32,
        /// NAME/VERSION[,NAME/VERSION...]
        pools: String,
    },
}

#[derive(Debug, Args)]
pub struct HookArgs {
    /// Job id (default: $SLURM_JOB_ID)
    #[arg(long, value_name = "JOB_ID")]
    pub job: Option<String>,
    /// The job's user id (default: $SLURM_JOB_UID)
    #[arg(long, value_name = "UID")]
    pub uid: Option<u32>,
}

#[derive(Debug, Args)]
#[command(after_help = "Use it with eval:
  eval \"$(sw-pool env demo/1.0)\"
The shell function (`sw-pool shell-init`) does this for you: then
`sw-pool env demo/1.0` is enough.")]
pub struct EnvArgs {
    /// Shell syntax: sh, bash, zsh, fish, csh, tcsh; default: $SW_POOL_SHELL, else $SHELL
    #[arg(long, value_name = "SHELL")]
    pub shell: Option<String>,
    /// Print the reverse change
    #[arg(long)]
    pub unload: bool,
    /// Where the pool is mounted
    pub mountpoint: PathBuf,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Writes KEYNAME.pem (private, mode 0600) and KEYNAME.pub.pem. To make the key
trusted on a cluster, copy KEYNAME.pub.pem to
/etc/sw-pool/trusted-keys/SIGNER.pem (SIGNER names the signer in `verify`
output). Keys made by `openssl genpkey` work as well."
)]
pub struct KeygenArgs {
    /// Base name of the key files
    #[arg(long, value_name = "KEYNAME")]
    pub out: std::path::PathBuf,
    /// Key type
    #[arg(long = "type", value_enum, default_value = "ed25519")]
    pub key_type: KeyTypeArg,
    /// Replace existing key files
    #[arg(short, long)]
    pub force: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum KeyTypeArg {
    Ed25519,
    Rsa,
    EcdsaP256,
}

#[derive(Debug, Args)]
#[command(after_help = "Check the detached signature with the openssl CLI:
  RSA / ECDSA keys:
    openssl dgst -sha256 -verify PUB.pem -signature POOL.sig POOL
  Ed25519 keys:
    openssl dgst -sha256 -binary POOL > POOL.sha256
    openssl pkeyutl -verify -pubin -inkey PUB.pem -rawin -in POOL.sha256 \\
        -sigfile POOL.sig")]
pub struct SignArgs {
    /// Private key (PEM, PKCS#8 or traditional)
    #[arg(long, value_name = "PRIV.pem")]
    pub key: std::path::PathBuf,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// The pool file (rewritten with the signature in its trailer)
    pub pool: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Accept only this public key
    #[arg(long, value_name = "PUB.pem", conflicts_with = "trusted")]
    pub key: Option<std::path::PathBuf>,
    /// Accept keys in this directory (default: $SW_POOL_TRUSTED_KEYS, else /etc/sw-pool/trusted-keys and ~/.config/sw-pool/trusted-keys)
    #[arg(long, value_name = "DIR")]
    pub trusted: Option<std::path::PathBuf>,
    /// Also check the detached signature POOL.sig over the whole file
    #[arg(long)]
    pub detached: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// The pool file to check
    pub pool: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct UnloadArgs {
    /// Detach lazily when busy
    #[arg(short, long)]
    pub force: bool,
    /// Shell for the printed environment change (default: $SW_POOL_SHELL, $SHELL)
    #[arg(long, value_name = "SHELL")]
    pub shell: Option<String>,
    /// Drop the reference of this job; default: $SLURM_JOB_ID
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// The mount point, the pool file, or NAME/VERSION (mounted at $SW_POOL_MOUNT/NAME/VERSION)
    pub pool: PathBuf,
}

#[derive(Debug, Args)]
pub struct CacheArgs {
    /// Base directory of the cache (default: $SW_POOL_CACHE, $LOCAL_TMPDIR, $TMPDIR, /tmp)
    #[arg(long, value_name = "DIR", global = true)]
    pub cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: CacheCommand,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Entries, least recently used first: pool, size on disk, mounted or not
    List {
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove least recently used entries (never a mounted one) until the cache fits
    Prune {
        /// Target size (default: the low watermark, when above the high one)
        #[arg(long, value_name = "SIZE")]
        max_size: Option<String>,
        /// Say what would be removed
        #[arg(long)]
        dry_run: bool,
    },
    /// Copy POOL into the node-local cache of every node, verified, without mounting it
    /// (collective like `load`: in a batch script once per node; nothing moves to a node that
    /// holds it already). Prepares a job's nodes; `run --pool` mounts such a copy in one
    /// environment
    Fetch {
        /// Refuse a pool that is not signed by a trusted key
        #[arg(long)]
        require_signature: bool,
        /// No progress bar
        #[arg(long)]
        no_progress: bool,
        /// Print a JSON report (the pool, its copy, bytes, phases) instead of a line
        #[arg(long)]
        json: bool,
        /// Also leave each node's outcome for the tasks of job step JOB.STEP (`run --pool`)
        #[arg(long, value_name = "JOB.STEP", hide = true)]
        for_step: Option<String>,
        /// The pool file, or NAME/VERSION of a pool on $SW_POOL_PATH
        pool: PathBuf,
    },
    /// Write the prefetch list of the chunks of POOL that on-demand runs fetched on this node
    /// (for `load --lazy --prefetch FILE`; as POOL.prefetch beside the pool, `--prefetch auto`);
    /// with --view DIR, the files of DIR that `run --cache DIR` jobs read on this node
    Trace {
        /// Write the list to FILE (replaced whole) instead of standard output
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// List the files of the tree DIR that `run --cache DIR` jobs read on this node, one
        /// absolute path per line (from the node's warm cache of DIR, so as far as it still
        /// holds them): the inputs of a pool (`sw-pool bundle`, `build`)
        #[arg(long, value_name = "DIR", conflicts_with = "pool")]
        view: Option<PathBuf>,
        /// The pool file, or NAME/VERSION of a pool on $SW_POOL_PATH
        #[arg(required_unless_present = "view")]
        pool: Option<PathBuf>,
    },
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Also list the variables sw-pool sets for itself (in a shell, a job) and the test switches
    #[arg(long)]
    pub all: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(
    after_help = "EXAMPLES (for one user; `make install` and the Debian package install both for
all users):
  sw-pool generate completions bash \\
      > ~/.local/share/bash-completion/completions/sw-pool
  sw-pool generate completions zsh > ~/.zfunc/_sw-pool
      (a directory on $fpath, before compinit)
  sw-pool generate completions fish > ~/.config/fish/completions/sw-pool.fish
  sw-pool generate man ~/.local/share/man/man1"
)]
pub struct GenerateArgs {
    #[command(subcommand)]
    pub what: GenerateWhat,
}

#[derive(Debug, Subcommand)]
pub enum GenerateWhat {
    /// Man pages (sw-pool.1 and one per subcommand) into DIR
    Man {
        /// The directory to write them into (created if missing)
        dir: PathBuf,
    },
    /// A completion script for SHELL on stdout
    Completions {
        /// The shell to complete in
        shell: clap_complete::Shell,
    },
    /// (the completion scripts) names to complete, one a line: pools, loaded pools, layers
    #[command(hide = true)]
    Words { kind: WordKind },
}

/// What `generate words` lists: pools on the pool path, mount points loaded here, layers.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum WordKind {
    Pools,
    Loaded,
    Layers,
}

#[cfg(test)]
mod tests;
