//! `sw-pool-mount-helper`: sw-pool's privileged path, run as root through sudo (or by a root Slurm
//! prolog/epilog). Its whole contract, each request checked on descriptors, logged to syslog:
//!
//! - `mount-pool [--job-id J] POOL`: a pool signed by a **site** key, verified into the node's
//!   root-owned cache once and kernel-mounted once at `<pool_mount_root>/<NAME>/<VERSION>` for
//!   every user (`pool.rs`);
//! - `shadow [--job-id J] POOL`: the same, and the pool's `install/<pkg>/<ver>` bound over
//!   `<shadow_root>/<pkg>/<ver>` where that original exists (`shadow.rs`);
//! - `release-pool [--job-id J] [--shadow] NAME/VERSION`: drop the caller's reference(s);
//! - `mount-image [--rw] [--job-id J] IMG DIR`: the caller's own ext4 image under
//!   `<user_mount_root>/<user>/` (`image.rs`); `umount DIR`;
//! - `idmap --pid P`: read-only idmapped views of the site's `environment_trees` for one of the
//!   caller's environments, locked in its mount namespace (`environment.rs`);
//! - `list`; `cleanup [--job-id J]` (root).
//!
//! The environment is dropped before anything else (`SUDO_UID` is read first); tools run from the
//! system directories with a fixed `PATH`; the configuration comes from a fixed path.

mod bounded;
mod caller;
mod cleanup;
mod config;
#[cfg(test)]
mod contract_tests;
mod environment;
mod error;
mod host;
mod image;
mod pool;
mod shadow;
mod state;
mod tools;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use error::HelperError;

#[derive(Parser)]
#[command(
    name = "sw-pool-mount-helper",
    version,
    about = "Kernel mounts for sw-pool users: site-signed pools (one verified copy and one mount per node) and a user's own images",
    after_help = concat!(
        "Run through sudo. The sudoers line (visudo -f /etc/sudoers.d/sw-pool):\n  ",
        "ALL ALL=(root) NOPASSWD: /usr/libexec/sw-pool/sw-pool-mount-helper",
        "\nConfiguration: /etc/sw-pool/helper.toml (root's, mode 0644; without it nothing is done).\n",
        "Output: one JSON object on stdout; errors on stderr, status 3 refused, 4 bad pool or image,\n",
        "5 a tool failed, 6 the system refused, 7 not signed by a site key."
    )
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Mount a site-signed pool for everyone on this node (verified into root's cache once)
    MountPool {
        #[arg(long)]
        job_id: Option<String>,
        /// Mount the node's cached copy of this digest, without a pool file ({"cached":false} when
        /// there is none)
        #[arg(long, required_unless_present = "pool", conflicts_with = "pool")]
        digest: Option<String>,
        pool: Option<PathBuf>,
    },
    /// Mount a site pool as mount-pool does and shadow the original software: each
    /// install/<pkg>/<ver> of the pool over <shadow_root>/<pkg>/<ver> where that directory exists
    Shadow {
        #[arg(long)]
        job_id: Option<String>,
        pool: PathBuf,
    },
    /// Drop your reference to a site pool (with --job-id: that job's, running or ended); the
    /// last reference unmounts it
    ReleasePool {
        #[arg(long)]
        job_id: Option<String>,
        /// Only the reference a `shadow` took; the shadows go with the last one
        #[arg(long)]
        shadow: bool,
        /// NAME/VERSION
        pool: String,
    },
    /// Mount your own ext4 image under <user_mount_root>/<you>/ (read-only unless --rw)
    MountImage {
        #[arg(long)]
        rw: bool,
        #[arg(long)]
        job_id: Option<String>,
        image: PathBuf,
        mount_point: PathBuf,
    },
    /// Unmount an image you mounted
    Umount { mount_point: PathBuf },
    /// Give your environment (its first process, pid P: `sw-pool run --layer`) read-only
    /// idmapped views of the site's environment_trees, locked in its own mount namespace
    Idmap {
        #[arg(long)]
        pid: i32,
    },
    /// The helper's mounts on this node and its loop devices that back no mount (JSON)
    List,
    /// Root: drop a job's references, unmount what nobody uses, free loop devices that back no mount
    Cleanup {
        #[arg(long)]
        job_id: Option<String>,
        /// End the processes of an image's owner (in this mount namespace) that keep it busy,
        /// then unmount it (a busy image is otherwise left mounted)
        #[arg(long)]
        kill: bool,
    },
}

fn log(level: swpool_sys::syslog::Level, msg: &str) {
    swpool_sys::syslog::syslog(level, &format!("mount-helper: {msg}"));
}

fn main() {
    let sudo_uid = std::env::var_os("SUDO_UID");
    let vars: Vec<_> = std::env::vars_os().map(|(k, _)| k).collect();
    for k in vars {
        // SAFETY: single-threaded, before anything reads the environment.
        unsafe { std::env::remove_var(k) };
    }
    // SAFETY: as above.
    unsafe { std::env::set_var("PATH", tools::SAFE_PATH) };
    let cli = Cli::parse();
    let code = match run(cli, sudo_uid) {
        Ok(v) => {
            println!("{v}");
            0
        }
        Err(e) => {
            eprintln!("sw-pool-mount-helper: {e}");
            e.status().code()
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli, sudo_uid: Option<std::ffi::OsString>) -> Result<serde_json::Value, HelperError> {
    let c = caller::Caller::identify(sudo_uid)?;
    let host = host::RealHost::new();
    let who = format!("{} (uid {})", c.name, c.uid);
    let cfg = config::HelperConfig::load()
        .inspect_err(|e| log(swpool_sys::syslog::Level::Error, &format!("{who}: {e}")))?;
    let job_ok = |j: &Option<String>| -> Result<(), HelperError> {
        match j {
            Some(j) => {
                caller::check_job(&host, &c, j, cfg.slurm_conf.as_deref(), cfg.tool_timeout())
            }
            None => Ok(()),
        }
    };
    let (what, r) = match &cli.cmd {
        Cmd::MountPool {
            job_id,
            digest,
            pool,
        } => match pool {
            Some(pool) => (
                format!("mount-pool {}", pool.display()),
                job_ok(job_id)
                    .and_then(|_| pool::mount_pool(&host, &cfg, &c, pool, job_id.as_deref(), false))
                    .map(json),
            ),
            None => {
                let d = digest.clone().unwrap_or_default();
                (
                    format!("mount-pool --digest {d}"),
                    job_ok(job_id)
                        .and_then(|_| {
                            pool::mount_cached(&host, &cfg, &c, &d, job_id.as_deref(), false)
                        })
                        .map(|m| {
                            m.map(json)
                                .unwrap_or_else(|| serde_json::json!({"cached": false}))
                        }),
                )
            }
        },
        Cmd::Shadow { job_id, pool } => (
            format!("shadow {}", pool.display()),
            job_ok(job_id)
                .and_then(|_| shadow::shadow(&host, &cfg, &c, pool, job_id.as_deref()))
                .map(json),
        ),
        Cmd::ReleasePool {
            job_id,
            shadow,
            pool,
        } => (
            format!(
                "release-pool{} {pool}",
                if *shadow { " --shadow" } else { "" }
            ),
            job_id
                .as_deref()
                .map_or(Ok(()), caller::check_job_form)
                .and_then(|_| pool::release_pool(&c, pool, job_id.as_deref(), *shadow))
                .map(json),
        ),
        Cmd::MountImage {
            rw,
            job_id,
            image,
            mount_point,
        } => (
            format!(
                "mount-image{} {} {}",
                if *rw { " --rw" } else { "" },
                image.display(),
                mount_point.display()
            ),
            job_ok(job_id)
                .and_then(|_| {
                    image::mount_image(&host, &cfg, &c, image, mount_point, *rw, job_id.as_deref())
                })
                .map(json),
        ),
        Cmd::Umount { mount_point } => (
            format!("umount {}", mount_point.display()),
            image::umount(&host, &cfg, &c, mount_point).map(json),
        ),
        Cmd::Idmap { pid } => (
            format!("idmap --pid {pid}"),
            environment::idmap(&cfg, &c, *pid).map(json),
        ),
        Cmd::List => return cleanup::list(&cfg).map(json),
        Cmd::Cleanup { job_id, kill } => (
            format!(
                "cleanup{}{}",
                job_id
                    .as_ref()
                    .map(|j| format!(" --job-id {j}"))
                    .unwrap_or_default(),
                if *kill { " --kill" } else { "" }
            ),
            cleanup::cleanup(&host, &cfg, &c, job_id.as_deref(), *kill).map(json),
        ),
    };
    match &r {
        Ok(v) => log(
            swpool_sys::syslog::Level::Notice,
            &format!("{who}: {what}: {v}"),
        ),
        Err(e) => log(
            swpool_sys::syslog::Level::Warning,
            &format!("{who}: {what}: refused: {e}"),
        ),
    }
    r
}

fn json<T: serde::Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).expect("serialises")
}

#[cfg(test)]
mod tests {
    const SUDOERS: &str = "ALL ALL=(root) NOPASSWD: /usr/libexec/sw-pool/sw-pool-mount-helper";

    #[test]
    fn the_sudoers_line_in_the_help_is_the_documented_one() {
        use clap::CommandFactory;
        let help = super::Cli::command().render_long_help().to_string();
        assert!(help.contains(SUDOERS), "{help}");
    }
}
