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
    /// An ext2/3/4 image (fuse2fs), else squashfs (squashfuse_ll).
    pub ext: bool,
}

/// The tools the pools need, located on `PATH`: `(squashfuse_ll, fuse2fs)`, each only when some
/// pool needs it; an error names the missing tool's Debian package.
pub fn tools(
    pools: &[EnvPool],
    path_var: Option<&std::ffi::OsStr>,
) -> Result<(Option<PathBuf>, Option<PathBuf>), String> {
    let find = |t: Tool, pkg: &str, what: &str| {
        t.locate(path_var).map_err(|_| {
            format!(
                "--pool {what}: {} mounts it inside the environment and was not found on PATH \
                 (Debian package {pkg})",
                t.program()
            )
        })
    };
    let sq = pools
        .iter()
        .find(|p| !p.ext)
        .map(|p| find(Tool::SquashfuseLl, "squashfuse", &p.label))
        .transpose()?;
    let e2 = pools
        .iter()
        .find(|p| p.ext)
        .map(|p| find(Tool::Fuse2fs, "fuse2fs", &p.label))
        .transpose()?;
    Ok((sq, e2))
}

/// Mount each pool at its usual mount point below `root` (the environment's root being built, or
/// `/`), read-only. Run by pid 1 as the namespace's root: the pool's root-owned files are shown as
/// root's.
pub(crate) fn mount(
    pools: &[EnvPool],
    root: &Path,
    squashfuse: Option<&Path>,
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
        let cmd = if p.ext {
            ToolCommand::new(Tool::Fuse2fs)
                .program(fuse2fs.ok_or("fuse2fs was not found")?)
                .path(&p.image)
                .path(&at)
                .arg("-o")
                .arg("ro,fakeroot")
        } else {
            ToolCommand::new(Tool::SquashfuseLl)
                .program(squashfuse.ok_or("squashfuse_ll was not found")?)
                .path(&p.image)
                .path(&at)
        };
        cmd.run(None).map_err(|e| {
            format!(
                "cannot mount the pool {} at {}: {e}",
                p.label,
                p.at.display()
            )
        })?;
        if verbose {
            eprintln!(
                "sw-pool: environment: pool {} at {} (this environment only)",
                p.label,
                p.at.display()
            );
        }
    }
    Ok(())
}
