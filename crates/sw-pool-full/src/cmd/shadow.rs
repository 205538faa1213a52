//! `sw-pool mount --shadow`, `sw-pool umount --shadow` and the modulefile hook `sw-pool shadow
//! MODE NAME/VERSION`: shadow mounts by the site's mount helper (`swpool_core::load::shadow`).

use std::path::Path;

use swpool_core::config::Environment;
use swpool_core::load::shadow::{shadow_mount, shadow_release, ShadowReleased, Shadowed};
use swpool_core::mount::RealSys;
use swpool_core::Error;

use crate::cli::{GlobalArgs, MountArgs, ShadowArgs, UmountArgs};
use crate::output::Printer;

/// NAME/VERSION of `spec` (NAME/VERSION itself, or a pool file's manifest).
fn name_version(spec: &Path) -> Result<String, Error> {
    let s = spec.to_string_lossy();
    if !spec.exists() && swpool_core::pool::spec::is_pool_spec(&s) {
        return Ok(s.into_owned());
    }
    let p = swpool_core::pool::Pool::open(spec)?;
    Ok(format!("{}/{}", p.manifest.name, p.manifest.version))
}

fn mount_one(spec: &Path, job: Option<&str>, env: &Environment) -> Result<Shadowed, Error> {
    let cfg = super::config(env)?;
    let sys = RealSys::new(env.path_var());
    let src = swpool_core::load::resolve(spec, &cfg.pool_path.value)?;
    shadow_mount(
        &sys,
        cfg.mount_helper.value.as_deref(),
        &swpool_core::users::hostname(),
        &src,
        job,
    )
}

fn release_one(spec: &Path, job: Option<&str>, env: &Environment) -> Result<ShadowReleased, Error> {
    let cfg = super::config(env)?;
    let sys = RealSys::new(env.path_var());
    let nv = name_version(spec)?;
    shadow_release(
        &sys,
        cfg.mount_helper.value.as_deref(),
        &swpool_core::users::hostname(),
        &nv,
        job,
    )
}

fn report_mounted(p: &Printer, s: &Shadowed) {
    let label = format!("{}/{}", s.name, s.version);
    for f in &s.failed {
        p.warn(format!(
            "{label}: not shadowed: {f}; the original stays in use"
        ));
    }
    if s.shadows.is_empty() && s.failed.is_empty() {
        p.warn(format!(
            "{label}: none of its packages ({}) has an original under the helper's shadow_root: nothing is shadowed",
            s.no_original.join(", ")
        ));
    }
    for t in &s.shadows {
        p.result(format!(
            "{} shows {label} (site pool at {})",
            t.display(),
            s.mount_point.display()
        ));
    }
    if !s.no_original.is_empty() {
        p.verbose(format!("no original for: {}", s.no_original.join(", ")));
    }
    p.verbose(format!("digest     {}", s.digest));
}

/// `mount --shadow NAME/VERSION`.
pub fn mount(g: &GlobalArgs, a: &MountArgs, env: &Environment) -> Result<(), Error> {
    let p = Printer::new(g, a.json);
    let job = super::mount::job_id(a.job_id.clone(), env);
    let s = mount_one(&a.image, job.as_deref(), env)?;
    report_mounted(&p, &s);
    p.json(&serde_json::to_value(&s).expect("json"));
    Ok(())
}

/// `umount --shadow NAME/VERSION`.
pub fn umount(g: &GlobalArgs, a: &UmountArgs, env: &Environment) -> Result<(), Error> {
    let p = Printer::new(g, a.json);
    let job = super::mount::job_id(a.job_id.clone(), env);
    let r = release_one(&a.mountpoint, job.as_deref(), env)?;
    for t in &r.unshadowed {
        p.result(format!("{} shows the original again", t.display()));
    }
    if r.unshadowed.is_empty() {
        p.result(format!(
            "released; the shadows stay for the other {} reference(s) on this node",
            r.refs
        ));
    }
    p.json(&serde_json::to_value(&r).expect("json"));
    Ok(())
}

/// `sw-pool shadow MODE NAME/VERSION`: the modulefile hook. Never fails the module command: what
/// could not be done is a warning and the original installation stays in use.
pub fn hook(g: &GlobalArgs, a: ShadowArgs, env: &Environment) -> Result<(), Error> {
    let mut p = Printer::new(g, false);
    // stdout may be the module command's shell code (Environment Modules' `system`): warnings
    // only, on stderr; the helper logs every shadow it makes to syslog
    p.stdout_taken = true;
    let job = super::mount::job_id(a.job_id.clone(), env);
    let spec = a.pool.display().to_string();
    match a.mode.as_str() {
        "load" => match mount_one(&a.pool, job.as_deref(), env) {
            Ok(s) => report_mounted(&p, &s),
            Err(e) => p.warn(format!(
                "{spec} is not shadow-mounted: {e}; the module uses the original installation"
            )),
        },
        "unload" | "remove" => match release_one(&a.pool, job.as_deref(), env) {
            Ok(r) => {
                for t in &r.unshadowed {
                    p.verbose(format!("{} shows the original again", t.display()));
                }
            }
            // unloading a module whose load could not shadow: nothing to release, nothing to say
            Err(e)
                if [
                    "no shadow reference",
                    "is not mounted by the helper",
                    "no mount helper is configured",
                ]
                .iter()
                .any(|m| e.to_string().contains(m)) =>
            {
                p.verbose(format!("{spec}: nothing to release ({e})"))
            }
            Err(e) => p.warn(format!("{spec}: the shadow mount was not released: {e}")),
        },
        other => p.verbose(format!("sw-pool shadow: mode {other:?}: nothing to do")),
    }
    Ok(())
}
