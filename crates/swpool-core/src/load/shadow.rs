//! Shadow mounts (seed 002's software images): a pool's `install/<pkg>/<ver>` shown over the
//! site's original installation `<shadow_root>/<pkg>/<ver>` (e.g. `/sw/gcc/12`), so that the
//! site's existing modulefiles, which point there, run the package from the pool. Where a shadow
//! cannot be made the original stays visible, and a warning says so.
//!
//! Two ways:
//! - **for everyone on the node** (Oslo's way), by the site's mount helper (`mount_helper`):
//!   [`shadow_mount`] asks it to mount the site-signed pool (one verified copy, one kernel mount per
//!   node) and bind its packages over the originals, with a reference for the user and job;
//!   [`shadow_release`] drops it (the last one removes the shadows), as does the job's epilog;
//! - **privately**, without privileges: [`private_shadows`] lists the binds `sw-pool run --shadow`
//!   makes in the environment's own mount namespace over a pool this user loaded (only that
//!   environment's processes see them).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::mount::Sys;

use super::LoadError;

/// What the helper answered to `shadow`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Shadowed {
    pub name: String,
    pub version: String,
    pub digest: String,
    /// Where the helper mounted the pool itself.
    pub mount_point: PathBuf,
    /// The pool was copied (verified) into the node's cache by this call.
    #[serde(default)]
    pub copied: bool,
    /// The directories that now show the pool's packages.
    #[serde(default)]
    pub shadows: Vec<PathBuf>,
    /// `<pkg>/<ver>` of the pool with no original under the shadow root.
    #[serde(default)]
    pub no_original: Vec<String>,
    /// Originals that stay visible, each with why.
    #[serde(default)]
    pub failed: Vec<String>,
}

/// What the helper answered to `release-pool --shadow`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShadowReleased {
    pub mount_point: PathBuf,
    pub refs: usize,
    pub unmounted: bool,
    #[serde(default)]
    pub unshadowed: Vec<PathBuf>,
}

fn no_helper(node: &str) -> Error {
    Error::from(LoadError::Helper {
        node: node.to_string(),
        what: "make shadow mounts".into(),
        reason: "no mount helper is configured (config key mount_helper): shadow mounts for the \
                 whole node need the site's helper; to see a pool over the originals in your own \
                 commands only, run them with `sw-pool run --shadow NAME/VERSION -- CMD`"
            .into(),
    })
}

/// Ask the site's helper to mount `pool` (a file; resolve NAME/VERSION first) and shadow the
/// originals with its packages, for `job`.
pub fn shadow_mount(
    sys: &dyn Sys,
    helper: Option<&Path>,
    node: &str,
    pool: &Path,
    job: Option<&str>,
) -> Result<Shadowed, Error> {
    let helper = helper.ok_or_else(|| no_helper(node))?;
    let p = pool.to_string_lossy();
    let mut args = vec!["shadow"];
    if let Some(j) = job {
        args.extend(["--job-id", j]);
    }
    args.push(&p);
    super::site::ask(
        sys,
        helper,
        node,
        &format!("shadow-mount {}", pool.display()),
        &args,
    )
}

/// Drop this user's shadow reference to NAME/VERSION (the job's, with `job`).
pub fn shadow_release(
    sys: &dyn Sys,
    helper: Option<&Path>,
    node: &str,
    name_version: &str,
    job: Option<&str>,
) -> Result<ShadowReleased, Error> {
    let helper = helper.ok_or_else(|| no_helper(node))?;
    let mut args = vec!["release-pool", "--shadow"];
    if let Some(j) = job {
        args.extend(["--job-id", j]);
    }
    args.push(name_version);
    super::site::ask(
        sys,
        helper,
        node,
        &format!("release the shadow mounts of {name_version}"),
        &args,
    )
}

/// The binds of a private shadow: `(pool's install/<pkg>/<ver>, <shadow_root>/<pkg>/<ver>)` for
/// each package of the pool mounted at `pool_mount` whose original exists as a real directory
/// (not a symlink); and the `<pkg>/<ver>` that have none.
pub fn private_shadows(
    pool_mount: &Path,
    shadow_root: &Path,
) -> (Vec<(PathBuf, PathBuf)>, Vec<String>) {
    let install = pool_mount.join("install");
    let mut binds = Vec::new();
    let mut none = Vec::new();
    for (pkg, ver) in swpool_format::pool::layout::installed(pool_mount) {
        let target = shadow_root.join(&pkg).join(&ver);
        let real_dir = std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir())
            && std::fs::symlink_metadata(shadow_root.join(&pkg)).is_ok_and(|m| m.is_dir());
        if real_dir {
            binds.push((install.join(&pkg).join(&ver), target));
        } else {
            none.push(format!("{pkg}/{ver}"));
        }
    }
    (binds, none)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_shadows_pair_packages_with_existing_originals_only() {
        let d = tempfile::tempdir().unwrap();
        let pool = d.path().join("pool");
        let sw = d.path().join("sw");
        for p in [
            "install/gcc/12/bin",
            "install/gcc/13",
            "install/zlib/1.3",
            "install/.hidden/1",
        ] {
            std::fs::create_dir_all(pool.join(p)).unwrap();
        }
        std::fs::create_dir_all(sw.join("gcc/12")).unwrap();
        std::fs::create_dir_all(sw.join("elsewhere")).unwrap();
        std::fs::create_dir_all(sw.join("zlib")).unwrap();
        // a symlink in place of an original is not shadowed (it could lead anywhere)
        std::os::unix::fs::symlink(sw.join("elsewhere"), sw.join("zlib/1.3")).unwrap();
        let (binds, none) = private_shadows(&pool, &sw);
        assert_eq!(
            binds,
            vec![(pool.join("install/gcc/12"), sw.join("gcc/12"))]
        );
        assert_eq!(none, vec!["gcc/13".to_string(), "zlib/1.3".to_string()]);
    }

    fn args_of(sys: &crate::mount::sys::FakeSys) -> Vec<Vec<String>> {
        sys.calls()
            .into_iter()
            .filter_map(|c| match c {
                crate::mount::sys::Call::Run { args, .. } => Some(
                    args.iter()
                        .map(|a| a.to_string_lossy().into_owned())
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    }

    /// The helper is asked through `sudo -n` with the job's id; its answer and its refusal come
    /// back as they are (the refusal's words, without the helper's prefix, and the node).
    #[test]
    fn shadow_mount_and_release_ask_the_helper_through_sudo() {
        use crate::mount::sys::{FakeScript, FakeSys};
        let sys = FakeSys::new(FakeScript {
            helper_answers: [
                Ok(r#"{"name":"gcc","version":"12","digest":"blake3:00","mount_point":"/run/s/gcc/12","shadows":["/sw/gcc/12"]}"#.to_string()),
                Err("sw-pool-mount-helper: gcc/13: not signed by a key in /etc/sw-pool/trusted-keys".to_string()),
                Ok(r#"{"mount_point":"/run/s/gcc/12","refs":0,"unmounted":true,"unshadowed":["/sw/gcc/12"]}"#.to_string()),
            ]
            .into(),
            ..Default::default()
        });
        let h = Path::new("/usr/libexec/sw-pool/sw-pool-mount-helper");
        let s = shadow_mount(
            &sys,
            Some(h),
            "node7",
            Path::new("/p/gcc/12.sqfs"),
            Some("42"),
        )
        .unwrap();
        assert_eq!(s.shadows, vec![PathBuf::from("/sw/gcc/12")]);
        let e = shadow_mount(&sys, Some(h), "node7", Path::new("/p/gcc/13.sqfs"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("node7: ") && e.contains("gcc/13: not signed"),
            "{e}"
        );
        assert!(!e.contains("sw-pool-mount-helper: gcc"), "{e}");
        let r = shadow_release(&sys, Some(h), "node7", "gcc/12", Some("42")).unwrap();
        assert!(r.unmounted && r.unshadowed == vec![PathBuf::from("/sw/gcc/12")]);
        let a = args_of(&sys);
        let h = h.to_string_lossy().into_owned();
        assert_eq!(
            a[0],
            ["-n", &h, "shadow", "--job-id", "42", "/p/gcc/12.sqfs"]
        );
        assert_eq!(a[1], ["-n", &h, "shadow", "/p/gcc/13.sqfs"]);
        assert_eq!(
            a[2],
            [
                "-n",
                &h,
                "release-pool",
                "--shadow",
                "--job-id",
                "42",
                "gcc/12"
            ]
        );
    }

    #[test]
    fn without_a_helper_the_error_says_what_to_do_instead() {
        use crate::mount::sys::{FakeScript, FakeSys};
        let sys = FakeSys::new(FakeScript::default());
        let e = shadow_mount(&sys, None, "node1", Path::new("gcc/12"), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mount_helper") && e.contains("sw-pool run --shadow"),
            "{e}"
        );
        assert!(sys.calls().is_empty());
    }

    #[test]
    fn helper_answers_parse() {
        let s: Shadowed = serde_json::from_str(
            r#"{"name":"gcc","version":"12","digest":"blake3:00","mount_point":"/run/x/gcc/12",
                "copied":true,"shared":false,"refs":1,"signer":"site","format":"squashfs",
                "loop_device":"loop0","shadows":["/sw/gcc/12"],"no_original":[],"failed":[]}"#,
        )
        .unwrap();
        assert_eq!(s.shadows, vec![PathBuf::from("/sw/gcc/12")]);
        let r: ShadowReleased = serde_json::from_str(
            r#"{"mount_point":"/run/x/gcc/12","refs":0,"unmounted":true,"unshadowed":["/sw/gcc/12"]}"#,
        )
        .unwrap();
        assert!(r.unmounted);
    }
}
