//! Command-line definitions of `load` (and the on-demand server it starts, `lazy-serve`) and of
//! `avail`, which lists what `load NAME/VERSION` finds.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
#[command(after_help = "EXAMPLES:
  mpirun sw-pool -v load -m $LOCAL_TMPDIR/mnt $SCRATCH/random.ext2
      the paper's call (every node)
  eval \"$(sw-pool load demo/1.0)\"
      one node; with /etc/profile.d/sw-pool.sh just `sw-pool load demo/1.0`
  srun -N4 --ntasks-per-node=1 sw-pool load --json demo/1.0

Steps: resolve POOL (a file, or NAME/VERSION on $SW_POOL_PATH); read its
manifest and apply the trust policy (nothing moves if it fails); copy it with
the broadcast engine into the node-local cache (--cache-dir, $SW_POOL_CACHE,
$LOCAL_TMPDIR, $TMPDIR, /tmp; each data byte read once from shared storage,
every chunk verified as it lands; nothing when the cache already holds it);
mount it read-only at -m DIR or $SW_POOL_MOUNT/NAME/VERSION on every node;
print the environment change (stdout) and, with -v, per-phase timings (stderr).
A failure on any node fails every node the same way and leaves nothing mounted.
A node without room for the copy: the pool is served in place on every node
instead (sw-pool-serve, each chunk verified on first read), with a warning;
--no-fallback fails instead.
--lazy: nothing is copied up front; in a Slurm job a background step of the
job serves the pool on every node (chunk i from node i mod N, which alone reads
it from shared storage), each chunk verified before it is served. Outside a
job, the node's server runs detached until `sw-pool unload`; under mpirun (or
srun --mpi=pmix), one rank per node, each rank serves in the foreground until
the pool is unloaded on every node.")]
pub struct LoadArgs {
    /// Fail when a node has no room for the copy, instead of serving the pool in place
    #[arg(long)]
    pub no_fallback: bool,
    /// On demand: mount on every node at once and fetch each chunk when first touched, from the
    /// node that owns it; each chunk is read from shared storage once per job
    #[arg(long, conflicts_with = "no_fallback")]
    pub lazy: bool,
    /// With --lazy: after the mount, every node fetches the chunks a prefetch list names (`sw-pool
    /// cache trace`), one at a time, in the background; `auto`: POOL.prefetch if there is one
    #[arg(long, value_name = "FILE|auto", requires = "lazy")]
    pub prefetch: Option<String>,
    /// Mount point on every node (created if missing; must be empty); default $SW_POOL_MOUNT/NAME/VERSION
    #[arg(short = 'm', long = "mountpoint", value_name = "DIR")]
    pub mountpoint: Option<PathBuf>,
    /// Node-local cache directory (default: $SW_POOL_CACHE, $LOCAL_TMPDIR, $TMPDIR, /tmp)
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Refuse a pool that is not signed by a trusted key
    #[arg(long)]
    pub require_signature: bool,
    /// Shell for the printed environment change: sh, bash, zsh, fish, csh (default: $SW_POOL_SHELL, $SHELL)
    #[arg(long, value_name = "SHELL")]
    pub shell: Option<String>,
    /// Job id recorded with the mount; default: $SLURM_JOB_ID
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// Seconds to wait for each mount to appear
    #[arg(long, value_name = "SECS", default_value_t = 15.0)]
    pub timeout: f64,
    /// No progress bar
    #[arg(long)]
    pub no_progress: bool,
    /// Print a JSON report (phases, bytes, mount point) instead of shell code
    #[arg(long)]
    pub json: bool,
    /// The pool file, or NAME/VERSION of a pool on $SW_POOL_PATH
    pub pool: PathBuf,
}

#[derive(Debug, Args)]
pub struct ViewServeArgs {
    /// This node's socket (the same path on every node), for the node's sw-pool-view
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// Seconds a chunk may take from the node that owns it before the read fails (EIO)
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub stall: u64,
    /// Seconds the node's view may take to come (then the node's server is done)
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub wait: u64,
    /// Bytes of the node's own chunks kept in memory at most (the next are read again when asked)
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 30)]
    pub max_kept: u64,
    /// Files of at most this many bytes are fetched ahead by directory: at the first read of one,
    /// the node fetches the others of its directory too (0: none)
    #[arg(long, value_name = "BYTES", default_value_t = 64 << 10)]
    pub small: u64,
    /// At most this many bytes of such files
    #[arg(long, value_name = "BYTES", default_value_t = 512 << 20)]
    pub small_total: u64,
    /// The tree (absolute)
    pub tree: PathBuf,
}

#[derive(Debug, Args)]
pub struct LazyServeArgs {
    /// The manifest digest `load --lazy` authorized
    #[arg(long, value_name = "DIGEST")]
    pub digest: String,
    /// Mount point on every node; default $SW_POOL_MOUNT/NAME/VERSION
    #[arg(short = 'm', long = "mountpoint", value_name = "DIR")]
    pub mountpoint: Option<PathBuf>,
    /// Node-local cache directory (the chunks fetched are kept there)
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Job id recorded with the mounts
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
    /// Seconds a chunk may take from the node that owns it before the read fails (EIO)
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub stall: u64,
    /// Seconds to wait for each mount to appear
    #[arg(long, value_name = "SECS", default_value_t = 15.0)]
    pub timeout: f64,
    /// A prefetch list (checked by `load --lazy`) whose chunks every node fetches after the mount
    #[arg(long, value_name = "FILE")]
    pub prefetch: Option<PathBuf>,
    /// The pool file
    pub pool: PathBuf,
}

#[derive(Debug, Args)]
#[command(after_help = "EXAMPLES:
  sw-pool avail
  sw-pool avail gcc              (its versions)
  sw-pool avail --json

The pools are the files `sw-pool load NAME/VERSION` finds on the pool path
(config `pool_path`, $SW_POOL_PATH): DIR/NAME/VERSION.sqfs or
DIR/NAME-VERSION.sqfs (and .squashfs, .ext2/3/4, .img); where two directories
hold the same one, the first's. CACHED: a verified copy is in your node-local
cache on this node.")]
pub struct AvailArgs {
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    /// Node-local cache directory to look in (default: $SW_POOL_CACHE, $LOCAL_TMPDIR, $TMPDIR, /tmp)
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Only this pool: NAME, or NAME/VERSION
    pub name: Option<String>,
}
