use swpool_core::config::Environment;
use swpool_core::env::{self, PoolMount, Shell, Snapshot};
use swpool_core::mount;
use swpool_core::state::StateDir;
use swpool_core::{Error, ExitStatus};

use crate::cli::{EnvArgs, GlobalArgs};

pub fn run(_g: &GlobalArgs, a: EnvArgs, env: &Environment) -> Result<(), Error> {
    // shell code on a terminal changes nothing: say what to run instead of half-acting
    super::shell_init::refuse_on_terminal(env, false)?;
    let shell: Shell = crate::output::shell(a.shell.as_deref(), env)?;
    // a mount point, or the pool (NAME/VERSION, a pool file) mounted at its default place
    let uid = rustix::process::geteuid().as_raw();
    let spec = swpool_core::load::named_mountpoint(
        &a.mountpoint,
        || Ok(swpool_core::config::Config::load(env)?.mount_dir.value),
        uid,
        env,
    )?;
    // unload works for a mount point that is gone too (its MODULEPATH entry must still go)
    let mp = match mount::canonical_mountpoint(&spec) {
        Ok(p) => p,
        Err(_) if a.unload => swpool_core::exec::absolute(&spec),
        Err(e) => return Err(e.into()),
    };
    if a.unload {
        // modules of the pool still loaded in this shell would keep their changes
        swpool_core::load::check_no_modules_loaded(&mp, env)?;
    }
    let dir = StateDir::open_default(env)?;
    let rec = dir.read(&mp)?;
    if rec.is_none() && !a.unload {
        return Err(Error::other(
            ExitStatus::BadInput,
            format!(
                "no pool is mounted at {} by you on this node (see `sw-pool list`)",
                mp.display()
            ),
        ));
    }
    let pm = PoolMount {
        mount_point: mp.clone(),
        pool: rec
            .as_ref()
            .and_then(|r| r.pool.as_ref())
            .map(|p| (p.name.clone(), p.version.clone())),
    };
    if !a.unload && !mp.join("modulefiles").is_dir() {
        eprintln!(
            "sw-pool: warning: {} has no modulefiles/ directory: no modules will appear",
            mp.display()
        );
    }
    let now = Snapshot::from_env(env);
    let changes = if a.unload {
        env::unload_changes(&now, &pm)
    } else {
        env::load_changes(&now, &pm)
    };
    let code = env::render(shell, &changes).map_err(|e| Error::other(ExitStatus::BadInput, e))?;
    crate::output::shell_code(&code);
    Ok(())
}
