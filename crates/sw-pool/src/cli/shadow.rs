//! `sw-pool shadow`: the one line a site adds to an existing modulefile (seed 002's
//! `module_load`), so that `module load gcc/12` shows the site pool over the original
//! installation for the job and `module unload` / `module purge` releases it.

use clap::Args;

#[derive(Debug, Args)]
#[command(
    after_help = "THE LINE, at the end of a site's existing modulefile, Lua (Lmod):
  execute{cmd=\"sw-pool shadow \" .. mode() .. \" gcc/12\",
          modeA={\"load\",\"unload\"}}
or Tcl (Environment Modules, and Lmod):
  puts stdout \"sw-pool shadow [module-info mode] gcc/12;\"
(Oslo's `system ...` works with Environment Modules; Lmod 8.6 runs a Tcl
`system` on load only.)

MODE load asks the site's mount helper (config `mount_helper`) to mount the
site-signed pool gcc/12 (found on $SW_POOL_PATH) once on this node and to show
each install/<pkg>/<ver> of it over <shadow_root>/<pkg>/<ver> where that exists,
for the job in $SLURM_JOB_ID (the job's epilog releases it); unload and remove
release it. Any other mode does nothing. A shadow that cannot be made is a
warning on stderr, never an error: the original installation stays and the
module works from it (status 0, so a module load never fails because of it)."
)]
pub struct ShadowArgs {
    /// The module command's mode: load, unload, remove (others do nothing)
    pub mode: String,
    /// The pool: NAME/VERSION on $SW_POOL_PATH, or a pool file
    pub pool: std::path::PathBuf,
    /// Job id of the reference; default: $SLURM_JOB_ID
    #[arg(long, value_name = "ID")]
    pub job_id: Option<String>,
}
