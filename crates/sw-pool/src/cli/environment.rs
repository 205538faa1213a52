//! Command-line definitions of environments (`run`, `shell`, `layer`) and of the shell
//! integration (`shell-init`, `shell-exec`).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

/// What `run` and `shell` share.
#[derive(Debug, Args)]
pub struct EnvironmentArgs {
    /// The writable layer (made with `sw-pool layer create NAME`): writes anywhere in the
    /// environment (/usr/local, /opt, /etc, ...) land in it, never on the host or in a pool
    #[arg(long, value_name = "NAME")]
    pub layer: Option<String>,
    /// Be uid 0 inside (mapped to you): apt-get, dpkg -i and `make install` into system paths
    /// write into the layer. Files only root may read on the host (0600, 0640) stay unreadable
    #[arg(long)]
    pub root: bool,
    /// Where your layers are (default: config `layer_dir`, $SW_POOL_LAYER_DIR,
    /// ~/.local/share/sw-pool/layers)
    #[arg(long, value_name = "DIR")]
    pub layer_dir: Option<PathBuf>,
    /// In a job over the layer's node-local copy: keep what the environment wrote (its upper) in
    /// DIR/<node> when it ends, instead of discarding it (DIR must exist; a node's earlier one is
    /// replaced)
    #[arg(long, value_name = "DIR", requires = "layer")]
    pub keep_upper: Option<PathBuf>,
    /// Shadow the site's original software with a pool you loaded on this node, in this
    /// environment only: each install/<pkg>/<ver> of the pool shown over
    /// <shadow_root>/<pkg>/<ver> where that exists (config `shadow_root`); repeatable
    #[arg(long, value_name = "NAME/VERSION")]
    pub shadow: Vec<String>,
    /// A whole root file system as a pool in place of the host's / (a squashfs pool you loaded
    /// on this node: `sw-pool load`); repeatable, each stacked on the one before (an exported
    /// layer on a base). With --layer, writes land in the layer through the kernel's overlay,
    /// without the site's helper
    #[arg(long, value_name = "NAME/VERSION")]
    pub base: Vec<String>,
    /// A pool for this environment only, mounted at its usual place ($SW_POOL_MOUNT/NAME/VERSION)
    /// with its modules on MODULEPATH: its verified node-local copy (made on first use, once per
    /// node of a job step), nothing mounted on the node; repeatable
    #[arg(long, value_name = "NAME/VERSION|FILE")]
    pub pool: Vec<String>,
    /// A directory on shared storage (a conda/venv/Spack prefix, a plugin tree) shown read-once
    /// over itself in this environment: listed once when it starts, every file read from storage
    /// once and then served from node-local memory; a snapshot, read-only; the files read are kept
    /// in your node-local cache, so the next job re-reads only what changed; repeatable
    #[arg(long, value_name = "DIR")]
    pub cache: Vec<PathBuf>,
}

pub const ENVIRONMENT_HELP: &str = "\
EXAMPLES:
  sw-pool layer create dev
  sw-pool run --layer dev -- sh -c 'cp mytool /usr/local/bin/'
  sw-pool run --layer dev -- mytool
  sw-pool shell --layer dev --root            (then: dpkg -i hello.deb)

INSIDE: new user, mount and PID namespaces; /proc shows only the environment's
processes; your uid (or 0 with --root), $HOME, the job's environment variables,
the network, the devices and every mount of the node (pools loaded with
`sw-pool load` included) as they are; SW_POOL_ENVIRONMENT names the layer. When
the command (the environment's first process) exits or is killed, every process
and mount of the environment is gone.

SHELL: `sw-pool shell` says on entry and exit where you are and marks the
prompt: `(sw-pool LAYER) `, `(sw-pool LAYER, root) ` with --root (bash: in
front of what your start-up files make; other shells: PS1 from the
environment). SW_POOL_PROMPT sets the mark (LAYER: the layer's name); set it
empty for none. -q: no lines.

LAYER: the host's / is the read-only lower and the layer the writable upper.
Without the site's helper this is fuse-overlayfs (rootless; needs /dev/fuse
usable by you); -v says which was used.
One environment uses a layer at a time.

SHADOW: --shadow gcc/12 (after `sw-pool load gcc/12` on the node) shows the
pool's install/gcc/12 over <shadow_root>/gcc/12 (config `shadow_root`, such
as /sw) inside the environment only, so the site's modulefiles, which point at
the original, run the pool's copy. An original that cannot be shadowed stays,
with a warning. For every user on the node at once, the site's helper does it:
`sw-pool mount --shadow NAME/VERSION`.

--root WITHOUT THE SITE'S HELPER: uid 0 inside is you; files only root may read
on the host stay unreadable. The package managers' (empty) lock files get empty
stand-ins in the layer and the layer gets APT::Sandbox::User root, so dpkg -i
and apt-get install work; /etc/shadow does not.

BASE: --base debian/12 runs the command in the pool's tree instead of the
host's (a pool built from a root file system as root, e.g. of a debootstrap
tree; loaded on the node first). /dev, /sys, /tmp, /run, /home, your $HOME and
the node's other mounts are the host's, bound in where the base has the
directory. Exported layers stack on it: --base debian/12 --base tools/1.
With --layer the kernel's overlay writes into the layer without privileges.

POOL: --pool gcc/12 shows the pool at its usual mount point
($SW_POOL_MOUNT/gcc/12) inside this environment only, its modules on MODULEPATH
(`module load` works inside); nothing is mounted on the node and nothing is
left when the environment ends. The pool is resolved, checked against the
trust policy and copied into the node-local cache as `sw-pool load` does it
(once per node: `sw-pool cache fetch`; in a job step the step's first task
copies it to every node of the step, reading it once from shared storage).
Squashfs pools are served inside the environment by sw-pool-serve --tree
(config fuse_reader; squashfuse_ll is the fallback), ext pools by fuse2fs.

CACHE: --cache /project/envs/torch lists the tree once when the environment
starts and answers every lookup (the loader's and Python's failed ones too)
from that listing; each file is read from storage once, at its first open,
and then served from memory. The tree is a snapshot: a file changed on storage
after the start is not served (EIO, and a line on standard error naming it),
never half old, half new. Read-only; nothing is left when the environment ends.

IN A JOB: after `sw-pool layer sync NAME` (or by itself in a step over several
nodes) every node runs over its own copy of the layer under a fresh upper; what
the job writes is discarded with the environment, never written into the layer.

EXIT STATUS: the command's (128+N when signal N ended it); 125 when the
environment could not be set up, 126 when the command could not be executed,
127 when it was not found.";

#[derive(Debug, Args)]
#[command(after_help = ENVIRONMENT_HELP)]
pub struct RunArgs {
    #[command(flatten)]
    pub env: EnvironmentArgs,
    /// The command and its arguments
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<OsString>,
}

#[derive(Debug, Args)]
#[command(after_help = ENVIRONMENT_HELP)]
pub struct ShellArgs {
    #[command(flatten)]
    pub env: EnvironmentArgs,
    /// Started for a login (`shell-init --login-env`): FILE, made by the caller, gets the shell's
    /// exit status once the shell has run in the environment; when the environment cannot be
    /// made or its shell cannot run, one line says why and how to fix or skip it (status 125)
    #[arg(long, value_name = "FILE", requires = "layer")]
    pub login: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct LayerArgs {
    /// Where your layers are (default: config `layer_dir`, $SW_POOL_LAYER_DIR,
    /// ~/.local/share/sw-pool/layers)
    #[arg(long, value_name = "DIR", global = true)]
    pub layer_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: LayerCommand,
}

#[derive(Debug, Subcommand)]
pub enum LayerCommand {
    /// Your layers: name, size, entries, whether an environment uses it
    List {
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Make a new, empty layer
    Create {
        /// The layer's name (letters, digits, '.', '_', '-')
        name: String,
    },
    /// Remove a layer and everything written into it (refused while an environment uses it)
    Rm {
        /// The layer to remove
        name: String,
    },
    /// Copy a layer to node-local storage on every node of the job (collective, like `load`);
    /// afterwards only what changed moves. `run --layer NAME` in the job then uses the copy, under
    /// a fresh per-node upper that ends with the environment (nodes never write into the layer)
    #[command(
        after_help = "IN A JOB: in a batch script, `sw-pool layer sync NAME` runs itself once per
node (srun --overlap); in a step:
  srun --mpi=pmix -N NODES --ntasks-per-node=1 sw-pool layer sync NAME
Then `srun sw-pool run --layer NAME -- CMD` runs each task over its node's copy.

The layer is read once, by the first node. Each node keeps its copies in
<cache base>/sw-pool-<uid>/layers (the cache base: --cache-dir, config
cache_dir, $LOCAL_TMPDIR)."
    )]
    Sync {
        /// The layer to copy
        name: String,
        /// The node-local base directory for the copies (default: config `cache_dir`,
        /// $SW_POOL_CACHE, $LOCAL_TMPDIR, $TMPDIR, /tmp)
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// What layers hold: bytes, entries, deleted host files (whiteouts); every layer without NAME
    /// (`list` shows names only, reading nothing inside a layer)
    Du {
        /// The layer to measure (default: all)
        name: Option<String>,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Pack what a layer holds (its upper, whiteouts kept) into a pool file, to sign and share
    /// (refused while an environment uses the layer)
    Export {
        /// The layer to pack
        name: String,
        /// The pool file to write
        out: PathBuf,
        /// squashfs (default), ext4, erofs
        #[arg(long, value_enum)]
        format: Option<crate::cli::FormatArg>,
        /// The pool's version (its name is the layer's)
        #[arg(long, default_value = "1")]
        version: String,
        /// Replace OUT if it exists
        #[arg(short, long)]
        force: bool,
        /// Keep setuid/setgid bits and device nodes (root only): without it they are cleared and
        /// left out, as the pool's files are root's
        #[arg(long)]
        keep_special: bool,
        /// Print the result as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum InitShell {
    Bash,
    Zsh,
    Ksh,
    Fish,
    Csh,
    Tcsh,
}

#[derive(Debug, Args)]
#[command(after_help = "SET UP (once, in your shell's start-up file):
  bash  ~/.bashrc:                   eval \"$(sw-pool shell-init bash)\"
  zsh   ~/.zshrc:                    eval \"$(sw-pool shell-init zsh)\"
  fish  ~/.config/fish/config.fish:  sw-pool shell-init fish | source
  csh   ~/.cshrc:                    eval \"`sw-pool shell-init csh`\"
`make install` and the Debian package set it up for bash, zsh and ksh login
shells (/etc/profile.d/sw-pool.sh). Then `sw-pool load POOL` changes MODULEPATH
in the shell it is typed in, like Lmod's `module` function; without it, run
`eval \"$(sw-pool load POOL)\"`.

LOGINS IN AN ENVIRONMENT (bash, zsh, ksh):
  eval \"$(sw-pool shell-init bash --login-env dev)\"     (in ~/.bashrc)
Every interactive shell that reads it (an ssh login, `srun --pty bash`, `bash
-l`) runs `sw-pool shell --layer dev` in its place and ends with it: all your
logins on a node share one environment. SW_POOL_NO_LOGIN_ENV=1 (or
`ssh -t HOST env SW_POOL_NO_LOGIN_ENV=1 bash -l`) skips it. When the
environment cannot start (no such layer, a broken one), the login stays a
plain shell, with one line saying why and what to do.")]
pub struct ShellInitArgs {
    /// The shell to print the function for
    pub shell: InitShell,
    /// Interactive shells that read the printed code (logins: ssh, `srun --pty`, `bash -l`) run
    /// `sw-pool shell --layer NAME` in their place; a plain shell when it cannot start
    #[arg(long, value_name = "NAME")]
    pub login_env: Option<String>,
}

#[derive(Debug, Args)]
pub struct ShellExecArgs {
    /// The shell (csh)
    pub shell: String,
    /// sw-pool's arguments as typed
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<OsString>,
}
