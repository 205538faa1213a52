//! One module per subcommand: each turns its arguments into library calls.

mod avail;
mod build;
mod build_progress;
mod bundle;
mod cache;
mod cleanup;
mod config;
mod cp;
mod env;
mod fetch;
mod generate;
mod image;
mod init;
mod inspect;
mod keygen;
mod layer;
mod lazy;
mod list;
mod load;
mod modulefiles;
mod mount;
mod shadow;
mod shell_init;
mod sign;
mod slurm;
mod umount;
mod unload;
mod verify;

use swpool_core::config::Environment;
use swpool_core::Error;

use crate::cli::{Cli, Command};

/// Run the command; `env` is the process environment, read once at start (the commands read no
/// environment variable themselves).
pub fn run(cli: Cli, env: &Environment) -> Result<(), Error> {
    let g = &cli.global;
    match cli.command {
        Command::Build(a) => build::run(g, a, env),
        Command::Bundle(a) => bundle::run(g, a, env),
        Command::Inspect(a) => inspect::run(g, a, env),
        Command::Init(a) => init::run(g, a),
        Command::Modulefiles(a) => modulefiles::run(g, a),
        Command::Keygen(a) => keygen::run(g, a),
        Command::Sign(a) => sign::run(g, a),
        Command::Verify(a) => verify::run(g, a, env),
        Command::Load(a) => load::run(g, a, env),
        Command::Unload(a) => unload::run(g, a, env),
        Command::Cache(a) => cache::run(g, a, env),
        Command::Config(a) => config::run(g, a, env),
        Command::Generate(a) => generate::run(a, env),
        Command::Cp(a) => cp::run(g, a, env),
        Command::Mount(a) => mount::run(g, a, env),
        Command::Umount(a) => umount::run(g, a, env),
        Command::List(a) => list::run(g, a, env),
        Command::Avail(a) => avail::run(g, a, env),
        Command::Cleanup(a) => cleanup::run(g, a, env),
        Command::Slurm(a) => slurm::run(g, a, env),
        Command::Env(a) => env::run(g, a, env),
        Command::Run(a) => crate::environment::run(g, a, env),
        Command::Shell(a) => crate::environment::shell(g, a, env),
        Command::Layer(a) => layer::run(g, a, env),
        Command::Image(a) => image::run(g, a, env),
        Command::Shadow(a) => shadow::hook(g, a, env),
        Command::ShellInit(a) => shell_init::init(a),
        Command::ShellExec(a) => shell_init::exec(a),
        Command::LazyServe(a) => lazy::serve(g, a, env),
        Command::ViewServe(a) => lazy::view_serve(g, a, env),
    }
}

/// Load the configuration (files and environment; flags are applied by each command).
pub fn config(env: &Environment) -> Result<swpool_core::config::Config, Error> {
    Ok(swpool_core::config::Config::load(env)?)
}

/// In a Slurm batch script or `salloc` shell of several nodes, `load`/`unload` re-run themselves
/// once per node (`srun --overlap`): this does not return then (exec).
/// The running program (to start it again elsewhere: on every node, as a background step).
pub fn own_exe() -> Result<std::path::PathBuf, Error> {
    std::env::current_exe().map_err(|e| {
        Error::other(
            swpool_core::ExitStatus::System,
            format!("cannot find our own executable: {e}"),
        )
    })
}

pub fn spread_over_allocation(env: &Environment) -> Result<(), Error> {
    let exe = own_exe()?;
    let Some(cmd) = swpool_core::slurm::spread_command(env, &exe, std::env::args_os().skip(1))
    else {
        return Ok(());
    };
    tracing::debug!("spreading over the job's nodes: {}", cmd.cmdline());
    use std::os::unix::process::CommandExt;
    let e = cmd.command(env.path_var())?.exec();
    Err(Error::other(
        swpool_core::ExitStatus::Tool,
        format!("cannot run srun to run on every node of the job: {e} (set SW_POOL_SPREAD=0 to run on this node only)"),
    ))
}

/// End a collective command: on failure every rank prints the same message, then all meet at a
/// bounded barrier before any exits (the first non-zero exit makes mpirun kill the rest).
pub fn finish_collective(job: swpool_core::Job, r: Result<(), Error>) -> Result<(), Error> {
    if let Err(e) = r {
        crate::output::print_error(&e);
        job.exit_barrier();
        drop(job);
        std::process::exit(e.exit_status().code());
    }
    Ok(())
}

/// The warning for a pool nothing trusted vouches for: in full once a day per pool on this node
/// (what it means and what to do), else a one-line reminder; `None` for a trusted pool.
pub fn trust_warning(env: &Environment, plan: &swpool_core::load::Plan) -> Option<String> {
    let long = plan.verdict.warning(&plan.src)?;
    let digest = plan
        .digest
        .split_once(':')
        .map_or(&*plan.digest, |(_, h)| h);
    let key = format!(
        "{}-{}",
        &digest[..digest.len().min(32)],
        plan.verdict.kind()
    );
    let due = swpool_core::state::StateDir::open_default(env)
        .map(|d| d.warning_due(&key, std::time::Duration::from_secs(24 * 3600)))
        .unwrap_or(true);
    if due {
        Some(long)
    } else {
        plan.verdict.reminder(&plan.src)
    }
}
