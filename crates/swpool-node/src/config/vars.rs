//! The tables of every environment variable sw-pool reads: its own `SW_POOL_*` variables
//! ([`EnvVar`]) and the few it shares with other programs ([`HostVar`]). The values are read once,
//! into an [`Environment`]; nothing here reads the process environment.

use super::{Environment, Origin};

/// What an environment variable is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarKind {
    /// Overrides a config-file key ([`Config`](super::Config); `sw-pool config` shows the key with its
    /// origin).
    Setting,
    /// Names a config file.
    File,
    /// An option with no config key.
    Option,
    /// Written by sw-pool into a shell's or a job's environment and read back by later calls.
    State,
    /// A benchmark or test switch: no flag and no config key; not for users.
    Test,
}

impl VarKind {
    pub fn as_str(self) -> &'static str {
        match self {
            VarKind::Setting => "setting",
            VarKind::File => "file",
            VarKind::Option => "option",
            VarKind::State => "state",
            VarKind::Test => "test switch",
        }
    }
}

macro_rules! env_vars {
    ($($var:ident $name:literal $kind:ident $default:literal $meaning:literal;)*) => {
        /// Every `SW_POOL_*` environment variable sw-pool (or its Lmod modulefile) reads. Code
        /// outside this module reads them only from an [`Environment`] (read once, passed down), so
        /// that this list is complete and `sw-pool config` shows each with its value.
        ///
        /// | variable | kind | when unset | meaning |
        /// |---|---|---|---|
        $(#[doc = concat!("| `", $name, "` | ", stringify!($kind), " | ", $default, " | ", $meaning, " |")])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum EnvVar {
            $(#[doc = $meaning] $var,)*
        }

        impl EnvVar {
            /// All of them, in the order of the table.
            pub const ALL: &'static [EnvVar] = &[$(EnvVar::$var),*];

            pub const fn name(self) -> &'static str {
                match self { $(EnvVar::$var => $name,)* }
            }
            pub const fn kind(self) -> VarKind {
                match self { $(EnvVar::$var => VarKind::$kind,)* }
            }
            /// What applies when the variable is unset.
            pub const fn default_text(self) -> &'static str {
                match self { $(EnvVar::$var => $default,)* }
            }
            pub const fn meaning(self) -> &'static str {
                match self { $(EnvVar::$var => $meaning,)* }
            }
        }
    };
}

env_vars! {
    Format "SW_POOL_FORMAT" Setting "squashfs" "config key `format`";
    ChunkSize "SW_POOL_CHUNK_SIZE" Setting "1MiB" "config key `chunk_size`";
    SquashfsLevel "SW_POOL_SQUASHFS_LEVEL" Setting "mksquashfs' default" "config key `squashfs_level`";
    Path "SW_POOL_PATH" Setting "none" "config key `pool_path` (`:`-separated)";
    Cache "SW_POOL_CACHE" Setting "`$LOCAL_TMPDIR`, `$TMPDIR`, `/tmp`" "config key `cache_dir`";
    Mount "SW_POOL_MOUNT" Setting "per-user runtime directory" "config key `mount_dir`; also set by `load` for modulefiles";
    LayerDir "SW_POOL_LAYER_DIR" Setting "`$XDG_DATA_HOME/sw-pool/layers`, `~/.local/share/sw-pool/layers`" "config key `layer_dir`";
    MountHelper "SW_POOL_MOUNT_HELPER" Setting "none" "config key `mount_helper`: the site's sw-pool-mount-helper, run through `sudo -n` (empty: none)";
    FuseReader "SW_POOL_FUSE_READER" Setting "sw-pool" "config key `fuse_reader`: the FUSE server of squashfs pools, `sw-pool` (sw-pool-serve --tree) or `squashfuse_ll`";
    ShadowRoot "SW_POOL_SHADOW_ROOT" Setting "none" "config key `shadow_root`: the site's original software (`<shadow_root>/<pkg>/<ver>`) that pools shadow (empty: none)";
    RequireSignature "SW_POOL_REQUIRE_SIGNATURE" Setting "true when a trusted key is installed, else false" "config key `require_signature`";
    CacheHigh "SW_POOL_CACHE_HIGH" Setting "none" "config key `cache_high_watermark`";
    CacheLow "SW_POOL_CACHE_LOW" Setting "80 % of high" "config key `cache_low_watermark`";
    SystemConfig "SW_POOL_SYSTEM_CONFIG" File "`/etc/sw-pool/config.toml`" "the system config file (empty: none)";
    UserConfig "SW_POOL_USER_CONFIG" File "`~/.config/sw-pool/config.toml`" "the user config file (empty: none)";
    Shell "SW_POOL_SHELL" Option "from `$SHELL`" "shell syntax of printed environment changes (`--shell`)";
    Log "SW_POOL_LOG" Option "warn" "log filter for diagnostics on stderr (`--log`)";
    StateDir "SW_POOL_STATE_DIR" Option "`/run/sw-pool` (root), `$XDG_RUNTIME_DIR/sw-pool`, `/tmp/sw-pool-UID`" "the mount-record store, and the only one searched";
    TrustedKeys "SW_POOL_TRUSTED_KEYS" Option "`/etc/sw-pool/trusted-keys`, `~/.config/sw-pool/trusted-keys`" "trusted-key directories (`:`-separated)";
    Spread "SW_POOL_SPREAD" Option "1" "`0`: `load` in a job stays on this node (no srun)";
    SrunMpi "SW_POOL_SRUN_MPI" Option "pmix" "srun's `--mpi` plugin for `load` in a job (`none`: none)";
    StallTimeout "SW_POOL_STALL_TIMEOUT" Option "120" "seconds without progress before a broadcast fails";
    Load "SW_POOL_LOAD" Option "none" "pools the TaskProlog loads in every step (given at submission)";
    SpankPools "SW_POOL_SPANK_POOLS" State "none" "pools asked for with the SPANK option `--pool` (broadcast once per job)";
    SpankStep "SW_POOL_SPANK_STEP" State "none" "`batch` in the batch step of a job submitted with `--pool` (set by the SPANK plugin)";
    SpankDone "SW_POOL_SPANK_DONE" State "none" "the job whose `--pool` pools were broadcast (later steps skip it)";
    SpankLayer "SW_POOL_SPANK_LAYER" State "none" "the layer asked for with the SPANK option `--layer` (every task of the job's steps runs in it)";
    SpankExec "SW_POOL_SPANK_EXEC" State "none" "a task's own program, set by the SPANK plugin when it starts the task as `sw-pool run --layer` (read once, then removed)";
    Bin "SW_POOL_BIN" Option "`sw-pool` on PATH" "the sw-pool the pool modulefile runs (read by the modulefile only)";
    JobPools "SW_POOL_JOB_POOLS" State "none" "pools loaded in this job, for the TaskProlog of later steps";
    Loaded "SW_POOL_LOADED" State "none" "mount points loaded into this shell";
    ShellFunction "SW_POOL_SHELL_FUNCTION" State "none" "`1`: set by the shell function (`sw-pool shell-init`) that evaluates the output of `load`, `unload` and `env`";
    Prompt "SW_POOL_PROMPT" Option "`(sw-pool LAYER) `, `(sw-pool LAYER, root) ` with `--root`" "the mark `sw-pool shell` puts before the prompt (`LAYER`: the layer's name; empty: none)";
    PromptMark "SW_POOL_PROMPT_MARK" State "none" "set by `sw-pool shell` for the shell it starts: the mark its prompt command puts before `PS1`";
    NoLoginEnv "SW_POOL_NO_LOGIN_ENV" Option "unset" "`1`: a login stays a plain shell instead of entering the layer's environment that `shell-init --login-env NAME` names (read by that start-up code)";
    Environment "SW_POOL_ENVIRONMENT" State "none" "set inside `run`/`shell`: the environment's layer (`-`: none)";
    ViewEpoch "SW_POOL_VIEW_EPOCH" Option "the job step's start (`scontrol show step`)" "`run --cache`: the snapshot time, in seconds since 1970 (`date +%s`), of the view on every node of the step: no file changed at or after it is served";
    SyncFor "SW_POOL_SYNC_FOR" State "none" "the job step (`JOB.STEP`) whose tasks wait for the `layer sync` that `run --layer` started (its failure is recorded for them)";
    SetMount "_SW_POOL_SET_MOUNT" State "none" "`SW_POOL_MOUNT` was set by sw-pool (unload unsets it)";
    SetGwdg "_SW_POOL_SET_GWDG" State "none" "`GWDG_SW_MOUNT` was set by sw-pool (unload unsets it)";
    FakeNodes "SW_POOL_FAKE_NODES" Test "0" "`1`: every MPI rank is its own node (tests on one machine)";
    CpAlgorithm "SW_POOL_CP_ALGORITHM" Test "chosen per copy" "broadcast algorithm: `ring`, `two-tree`, `allgather` or `bcast` (benchmarks)";
    BenchNoVerify "SW_POOL_BENCH_NO_VERIFY" Test "0" "`1`: chunks are NOT verified (benchmarks only)";
    BenchSlots "SW_POOL_BENCH_SLOTS" Test "no cap" "at most this many chunks per round (benchmarks: the round-latency bound on few nodes)";
}

impl EnvVar {
    /// Find one by name.
    pub fn from_name(name: &str) -> Option<EnvVar> {
        EnvVar::ALL.iter().copied().find(|v| v.name() == name)
    }
}

macro_rules! host_vars {
    ($($var:ident $name:literal $meaning:literal;)*) => {
        /// The variables sw-pool reads that are not its own (set by the system, the shell, Slurm
        /// or the MPI launcher). Like [`EnvVar`], read only from an [`Environment`].
        ///
        /// | variable | read for |
        /// |---|---|
        $(#[doc = concat!("| `", $name, "` | ", $meaning, " |")])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum HostVar {
            $(#[doc = $meaning] $var,)*
        }

        impl HostVar {
            /// All of them, in the order of the table.
            pub const ALL: &'static [HostVar] = &[$(HostVar::$var),*];

            pub const fn name(self) -> &'static str {
                match self { $(HostVar::$var => $name,)* }
            }
            pub const fn meaning(self) -> &'static str {
                match self { $(HostVar::$var => $meaning,)* }
            }
        }
    };
}

host_vars! {
    Path "PATH" "tools are looked up in its directories before the system ones (not as root)";
    Home "HOME" "`~/.config` when `XDG_CONFIG_HOME` is unset (user config file, trusted keys)";
    XdgConfigHome "XDG_CONFIG_HOME" "the user config file and trusted-keys directory";
    XdgDataHome "XDG_DATA_HOME" "the default layer directory (`run`, `shell`, `layer`)";
    XdgRuntimeDir "XDG_RUNTIME_DIR" "a user's record store and mount root (when it is the user's private directory)";
    LocalTmpdir "LOCAL_TMPDIR" "the node-local cache's base directory (before `TMPDIR`)";
    Tmpdir "TMPDIR" "the node-local cache's base directory";
    Shell "SHELL" "shell syntax of printed environment changes, when neither `--shell` nor `SW_POOL_SHELL` says; the shell `sw-pool shell` starts";
    Ps1 "PS1" "`sw-pool shell`: the prompt its mark (`SW_POOL_PROMPT`) goes in front of";
    PromptCommand "PROMPT_COMMAND" "`sw-pool shell`: kept after the command that puts the mark in bash's prompt";
    RustLog "RUST_LOG" "passed on to the `sw-pool cleanup` the root Slurm hooks run as the job's user";
    Pythonpath "PYTHONPATH" "`bundle --python`: module directories besides the interpreter's";
    LdLibraryPath "LD_LIBRARY_PATH" "`bundle`: the loader's search path";
    SourceDateEpoch "SOURCE_DATE_EPOCH" "`build`, `bundle`: the build time recorded in the image";
    Modulepath "MODULEPATH" "`load`, `unload`, `env`: the module search path they change";
    Lmfiles "_LMFILES_" "`unload`, `env --unload`: the modulefiles loaded in the calling shell (Lmod, Environment Modules)";
    LoadedModules "LOADEDMODULES" "`unload`, `env --unload`: the names of the modules loaded in the calling shell";
    GwdgSwMount "GWDG_SW_MOUNT" "`load`, `unload`, `env`: the mount root the paper's modulefiles read";
    SlurmJobId "SLURM_JOB_ID" "the job a mount belongs to; a Slurm hook's job";
    SlurmJobUid "SLURM_JOB_UID" "the Prolog's and Epilog's job user";
    SlurmJobGid "SLURM_JOB_GID" "the Prolog's and Epilog's job group";
    SlurmJobUser "SLURM_JOB_USER" "the Prolog's and Epilog's job user, by name (for messages)";
    SlurmStepId "SLURM_STEP_ID" "`load` in a job step stays on its node; srun without MPI is refused";
    SlurmJobNumNodes "SLURM_JOB_NUM_NODES" "the nodes `load` in a batch script spreads over";
    SlurmStepNumNodes "SLURM_STEP_NUM_NODES" "`run --layer` in a step of several nodes syncs the layer to them";
    SlurmStepNodelist "SLURM_STEP_NODELIST" "the nodes `run --layer` syncs the layer to";
    SlurmProcid "SLURM_PROCID" "task 0 of a step starts the layer's sync for `run --layer`";
    SlurmNnodes "SLURM_NNODES" "the same, from older Slurm";
    SlurmNtasks "SLURM_NTASKS" "srun with several tasks but without MPI is refused";
    SlurmNprocs "SLURM_NPROCS" "the same, from older Slurm";
    SlurmPmixFence "SLURM_PMIX_FENCE" "Slurm's pmix fence algorithm; sw-pool's own steps set `tree` unless it is set (Open MPI 4.1 start-up race)";
    OmpiCommWorldSize "OMPI_COMM_WORLD_SIZE" "started by an MPI launcher (Open MPI)";
    PmixRank "PMIX_RANK" "started by an MPI launcher (PMIx)";
    PmiRank "PMI_RANK" "started by an MPI launcher (PMI)";
    PmiSize "PMI_SIZE" "started by an MPI launcher (PMI)";
    MpiLocalnranks "MPI_LOCALNRANKS" "started by an MPI launcher (MPICH's Hydra)";
}

/// Variables read as a group, by the start of their names: the SPANK plugin's options as `sbatch`
/// passes them on (`SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_pool`), which the `--pool` broadcast
/// removes from its srun's environment, and a job step's task and MPI variables
/// ([`STEP_PREFIXES`]).
pub const HOST_PREFIXES: &[&str] = &[
    SPANK_PREFIX,
    // a job step's own task and MPI variables, which `run --layer`'s sync in a step does not pass
    // on to the step it starts ([`STEP_PREFIXES`])
    "SLURM_STEP_",
    "PMI",
    "OMPI_",
];

/// The SPANK plugin's options as `sbatch` passes them on.
pub const SPANK_PREFIX: &str = "SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_";

/// The variables (by the start of their names, and [`STEP_NAMES`]) of a job step's task that a
/// new step started from it must not inherit.
pub const STEP_PREFIXES: &[&str] = &["SLURM_STEP_", "PMI", "OMPI_"];
/// See [`STEP_PREFIXES`].
pub const STEP_NAMES: &[HostVar] = &[HostVar::SlurmProcid, HostVar::MpiLocalnranks];

/// A variable sw-pool reads: one of [`EnvVar`] or [`HostVar`].
pub trait Var: Copy {
    fn var_name(self) -> &'static str;
}

impl Var for EnvVar {
    fn var_name(self) -> &'static str {
        self.name()
    }
}

impl Var for HostVar {
    fn var_name(self) -> &'static str {
        self.name()
    }
}

/// Is `name` a variable sw-pool reads (listed in [`EnvVar`] or [`HostVar`], or starting with one
/// of [`HOST_PREFIXES`])?
pub fn is_read(name: &str) -> bool {
    EnvVar::from_name(name).is_some()
        || HostVar::ALL.iter().any(|v| v.name() == name)
        || HOST_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// `(variable, value, origin, kind)` rows for `sw-pool config`: every variable of [`EnvVar`], with
/// its value in `env`, or what applies when it is unset.
pub fn env_rows(env: &Environment) -> Vec<(&'static str, String, String, &'static str)> {
    EnvVar::ALL
        .iter()
        .map(|&v| match env.get(v) {
            Some(val) => (
                v.name(),
                val,
                Origin::Env(v.name()).to_string(),
                v.kind().as_str(),
            ),
            None => (
                v.name(),
                format!("({})", v.default_text().replace('`', "")),
                "unset".to_string(),
                v.kind().as_str(),
            ),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.rs` file of the workspace's crates, with its path relative to the workspace.
    fn workspace_sources() -> Vec<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut out = Vec::new();
        let mut stack = vec![root.join("crates")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let rel = p.strip_prefix(&root).unwrap().display().to_string();
                    out.push((rel, std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        out
    }

    #[test]
    fn every_variable_named_in_the_code_is_listed() {
        let mut missing = Vec::new();
        for (path, text) in workspace_sources() {
            let b = text.as_bytes();
            let mut i = 0;
            while let Some(off) = text[i..].find("SW_POOL_") {
                let start = i + off;
                let s = if start > 0 && b[start - 1] == b'_' {
                    start - 1
                } else {
                    start
                };
                let mut e = start + "SW_POOL_".len();
                while e < b.len()
                    && (b[e].is_ascii_uppercase() || b[e].is_ascii_digit() || b[e] == b'_')
                {
                    e += 1;
                }
                let name = &text[s..e];
                // `SW_POOL_` alone is a prefix in tests that clear the environment
                if name != "SW_POOL_" && EnvVar::from_name(name).is_none() {
                    missing.push(format!("{path}: {name}"));
                }
                i = e;
            }
        }
        assert!(
            missing.is_empty(),
            "not listed in config::EnvVar: {missing:?}"
        );
    }

    #[test]
    fn variables_are_read_only_here() {
        // call sites still to be switched to EnvVar by the load-pipeline rework; remove each
        // entry as its file is switched
        const PENDING: &[&str] = &[];
        let mut stray = Vec::new();
        for (path, text) in workspace_sources() {
            if path.contains("swpool-node/src/config/")
                || path.contains("/tests/")
                || PENDING.iter().any(|p| path.contains(p))
            {
                continue;
            }
            for (n, l) in text.lines().enumerate() {
                if (l.contains("env::var") || l.contains("try_from_env")) && l.contains("SW_POOL_")
                {
                    stray.push(format!("{path}:{}: {}", n + 1, l.trim()));
                }
            }
        }
        assert!(
            stray.is_empty(),
            "read them from a config::Environment: {stray:?}"
        );
    }

    #[test]
    fn env_rows_show_every_variable() {
        let env = Environment::default().with(EnvVar::Shell, "fish");
        let rows = env_rows(&env);
        assert_eq!(rows.len(), EnvVar::ALL.len());
        let shell = rows.iter().find(|r| r.0 == "SW_POOL_SHELL").unwrap();
        assert_eq!(
            (shell.1.as_str(), shell.2.as_str()),
            ("fish", "$SW_POOL_SHELL")
        );
        let log = rows.iter().find(|r| r.0 == "SW_POOL_LOG").unwrap();
        assert_eq!((log.1.as_str(), log.2.as_str()), ("(warn)", "unset"));
        let mut names: Vec<_> = EnvVar::ALL.iter().map(|v| v.name()).collect();
        names.extend(HostVar::ALL.iter().map(|v| v.name()));
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            EnvVar::ALL.len() + HostVar::ALL.len(),
            "a name is listed twice"
        );
    }

    #[test]
    fn only_listed_variables_are_kept() {
        assert!(is_read("PATH") && is_read("SW_POOL_SHELL"));
        assert!(is_read("SLURM_SPANK__SLURM_SPANK_OPTION_sw_pool_pool"));
        assert!(!is_read("LD_PRELOAD") && !is_read("SW_POOL_"));
    }
}
