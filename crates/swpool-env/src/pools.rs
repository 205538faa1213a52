//! `--pool` in an environment: a pool's verified node-local copy (`sw-pool cache fetch`) mounted by
//! FUSE inside the environment, at the pool's usual mount point, for this environment only. The
//! FUSE daemon lives in the environment's PID namespace and the mount in its mount namespace: both
//! end with it (nothing on the node to unload, nothing another user sees).

use std::path::{Path, PathBuf};

use swpool_sys::exec::{Tool, ToolCommand};

/// A pool of one environment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EnvPool {
    /// NAME/VERSION (messages).
    pub label: String,
    /// The verified node-local copy.
    pub image: PathBuf,
    /// The usual mount point (`<mount dir>/NAME/VERSION`, a directory on the host).
    pub at: PathBuf,
    /// An ext2/3/4 image (fuse2fs), else squashfs (sw-pool's tree server, else squashfuse_ll).
    pub ext: bool,
    /// The pool's manifest digest (the tree server checks the copy's manifest against it).
    #[serde(default)]
    pub digest: Option<String>,
    /// `--cache DIR`: no pool but the directory `at` itself, shown read-once over itself by this
    /// program (`sw-pool-view`, beside sw-pool; `image` is the directory too).
    #[serde(default)]
    pub view: Option<PathBuf>,
    /// The view server's snapshot arguments (`--epoch SECS` or `--step JOB.STEP`), made by the
    /// front from the job's environment.
    #[serde(default)]
    pub view_args: Vec<String>,
}

/// Check that the tools the pools need are there: `squashfuse` is where the probe found
/// `squashfuse_ll` (it looks whenever a pool is a squashfs; not needed when `tree`, sw-pool's
/// server, is there), fuse2fs is located on `PATH` here and returned, each only when some pool
/// needs it; an error names the missing tool's Debian package.
pub fn tools(
    pools: &[EnvPool],
    squashfuse: Option<&std::path::Path>,
    tree: bool,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<Option<PathBuf>, String> {
    let missing = |t: Tool, pkg: &str, what: &str| {
        format!(
            "--pool {what}: {} mounts it inside the environment and was not found on PATH \
             (Debian package {pkg})",
            t.program()
        )
    };
    if let Some(p) = pools.iter().find(|p| !p.ext && p.view.is_none()) {
        if squashfuse.is_none() && !(tree && p.digest.is_some()) {
            return Err(missing(Tool::SquashfuseLl, "squashfuse", &p.label));
        }
    }
    pools
        .iter()
        .find(|p| p.ext)
        .map(|p| {
            Tool::Fuse2fs
                .locate(path_var)
                .map_err(|_| missing(Tool::Fuse2fs, "fuse2fs", &p.label))
        })
        .transpose()
}

/// Mount each pool at its usual mount point below `root` (the environment's root being built, or
/// `/`), read-only. Run by pid 1 as the namespace's root: the pool's root-owned files are shown as
/// root's.
pub(crate) fn mount(
    pools: &[EnvPool],
    root: &Path,
    readers: crate::reader::Readers<'_>,
    fuse2fs: Option<&Path>,
    verbose: bool,
) -> Result<(), String> {
    for p in pools {
        let at = root.join(p.at.strip_prefix("/").unwrap_or(&p.at));
        if !at.is_dir() {
            return Err(format!(
                "cannot mount the pool {} at {}: the environment has no such directory (with \
                 --base, the base's tree has to have it)",
                p.label,
                p.at.display()
            ));
        }
        if let Some(server) = &p.view {
            view(server, &p.view_args, &at, verbose).map_err(|e| {
                format!(
                    "--cache {}: {e}; run without --cache to read it from storage directly",
                    p.at.display()
                )
            })?;
            continue;
        }
        let fail = |e: String| {
            format!(
                "cannot mount the pool {} at {}: {e}",
                p.label,
                p.at.display()
            )
        };
        let server = if p.ext {
            ToolCommand::new(Tool::Fuse2fs)
                .program(fuse2fs.ok_or("fuse2fs was not found")?)
                .path(&p.image)
                .path(&at)
                .arg("-o")
                .arg("ro,fakeroot")
                .run(None)
                .map_err(|e| fail(e.to_string()))?;
            Tool::Fuse2fs.program()
        } else {
            crate::reader::mount_squashfs(readers, &p.image, p.digest.as_deref(), &at, &p.label)
                .map_err(fail)?
        };
        if verbose {
            eprintln!(
                "sw-pool: environment: pool {} at {} by {server} (this environment only)",
                p.label,
                p.at.display()
            );
        }
    }
    Ok(())
}

/// `--cache`: the view server walks `at` once and mounts the view over it; it returns (and this
/// with it) once the view is mounted. Its log lines (a file not served) go to the environment's
/// standard error; it ends with the environment's PID namespace.
fn view(server: &Path, args: &[String], at: &Path, verbose: bool) -> Result<(), String> {
    let mut cmd = std::process::Command::new(server);
    cmd.arg("--over")
        .arg(at)
        .args(args)
        .stdin(std::process::Stdio::null());
    if verbose {
        cmd.arg("--debug");
    }
    let st = cmd
        .status()
        .map_err(|e| format!("cannot start {}: {e}", server.display()))?;
    if !st.success() {
        // it said why on standard error
        return Err(format!("{} failed ({st})", server.display()));
    }
    if verbose {
        eprintln!(
            "sw-pool: environment: {} read-once (a snapshot of the job's start; this environment only)",
            at.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(label: &str, ext: bool) -> EnvPool {
        EnvPool {
            label: label.into(),
            image: PathBuf::from("/nonexistent/image"),
            at: PathBuf::from("/nonexistent/at"),
            ext,
            digest: Some("blake3:00".into()),
            view: None,
            view_args: Vec::new(),
        }
    }

    #[test]
    fn tools_name_what_a_pool_needs_and_its_package() {
        // a squashfs pool when the probe found no squashfuse_ll: the error names the pool and the
        // package, whatever fuse2fs' state
        let e = tools(
            &[pool("ext/1", true), pool("sq/2", false)],
            None,
            false,
            None,
        )
        .unwrap_err();
        assert!(
            e.contains("--pool sq/2") && e.contains("squashfuse_ll"),
            "{e}"
        );
        assert!(e.contains("Debian package squashfuse"), "{e}");
        // squashfs pools only: the probe's squashfuse_ll is enough, fuse2fs is not looked for
        let sq = std::path::Path::new("/usr/bin/squashfuse_ll");
        assert_eq!(
            tools(&[pool("sq/2", false)], Some(sq), false, None),
            Ok(None)
        );
        // sw-pool's tree server is enough for a pool with a digest
        assert_eq!(tools(&[pool("sq/2", false)], None, true, None), Ok(None));
        let mut bare = pool("sq/3", false);
        bare.digest = None;
        assert!(tools(&[bare], None, true, None).is_err());
        // no pools: nothing needed
        assert_eq!(tools(&[], None, false, None), Ok(None));
        // an ext pool: fuse2fs where it is installed (the test set-up installs it)
        if Tool::Fuse2fs.locate(None).is_ok() {
            let f = tools(&[pool("ext/1", true)], None, false, None).unwrap();
            assert!(f.is_some_and(|p| p.ends_with("fuse2fs")));
        }
    }
}
