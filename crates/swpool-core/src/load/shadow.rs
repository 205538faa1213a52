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

pub use swpool_node::shadow::private_shadows;

#[cfg(test)]
mod tests {
    use super::*;

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
