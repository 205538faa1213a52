//! `--base` pools in an environment: each squashfs pool's verified node-local image mounted again
//! by sw-pool's tree server (else squashfuse_ll; [`crate::reader`]) inside the environment (pid 1, root of its user namespace), so that the files the
//! pool's root owns are the environment's root's (the user's) and the kernel's overlay can copy
//! them up without privileges (kernel-facts item 3); the lower directories of the overlays.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::mount::MountFlags;

/// A `--base` pool: the verified node-local image `sw-pool load` (or `mount`) made of it, mounted
/// again by squashfuse inside the environment over its usual mount point `at` (the environment
/// sees it there; the host's mount of it is hidden inside only).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Base {
    /// NAME/VERSION (messages).
    pub label: String,
    pub image: PathBuf,
    pub at: PathBuf,
    /// The pool's manifest digest (the tree server checks the copy's manifest against it).
    #[serde(default)]
    pub digest: Option<String>,
}

/// Mount each `--base` pool's image over its usual mount point ([`crate::reader`]), in this
/// namespace (its files owned by root are this namespace's root's, so the kernel's overlay can
/// copy them up). The FUSE daemon lives in the environment's PID namespace and ends with it.
/// With `written` (a layer over the bases through the kernel's overlay), a base whose top directory is not root's in the image
/// is named: copying its files up fails (EOVERFLOW: their owner is not mapped in the namespace).
pub(crate) fn mount(
    bases: &[Base],
    readers: crate::reader::Readers<'_>,
    written: bool,
) -> Result<(), String> {
    for b in bases {
        crate::reader::mount_squashfs(readers, &b.image, b.digest.as_deref(), &b.at, &b.label)
            .map_err(|e| format!("cannot mount the base pool {}: {e}", b.label))?;
        if written {
            if let Some(w) = not_roots(b) {
                eprintln!("sw-pool: environment: warning: {w}");
            }
        }
    }
    Ok(())
}

/// Why writing over base `b` (mounted at `b.at`, seen from the environment's namespace, where
/// root is uid 0) will fail, if its top directory is not root's.
fn not_roots(b: &Base) -> Option<String> {
    let st = rustix::fs::stat(&b.at).ok()?;
    (st.st_uid != 0).then(|| {
        format!(
            "the files of the base pool {} are not root's in its image (its top directory is \
             uid {} here): writing over them through the layer fails (EOVERFLOW); rebuild it \
             with `sw-pool build --all-root`",
            b.label, st.st_uid
        )
    })
}

/// The overlay's lower directories, top first: the job's copy of the layer, then the base pools
/// (top base first) or the host's `/`. Each must be free of the option separators.
pub(crate) fn lowers(copy: Option<&Path>, bases: &[Base]) -> Result<String, String> {
    let mut v: Vec<&Path> = copy.into_iter().collect();
    match bases.is_empty() {
        true => v.push(Path::new("/")),
        false => v.extend(bases.iter().rev().map(|b| b.at.as_path())),
    }
    let mut out = Vec::new();
    for p in v {
        match p.to_str() {
            Some(s) if !s.contains([',', ':']) => out.push(s),
            _ => {
                return Err(format!(
                    "{}: an overlay cannot take a directory whose path has ',' or ':' (or is not \
                     UTF-8): choose another mount_dir or cache_dir",
                    p.display()
                ))
            }
        }
    }
    Ok(out.join(":"))
}

/// `--base` without a layer: the top base's mount is the root. Several bases are stacked by a
/// kernel overlay over them with a throwaway upper in a small tmpfs (mounted over the bottom base's
/// mount point, the bases reached through descriptors opened before), mounted read-only: a
/// lowers-only overlay as the root breaks the nested user namespace the command enters (writing
/// its maps fails with EACCES, measured on 6.18).
pub(crate) fn root(bases: &[Base]) -> Result<PathBuf, String> {
    let top = bases.last().ok_or("--base without a base")?;
    if bases.len() == 1 {
        return Ok(top.at.clone());
    }
    let fds = bases
        .iter()
        .map(|b| {
            rustix::fs::open(
                &b.at,
                rustix::fs::OFlags::PATH
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| format!("cannot open the base pool {}: {e}", b.label))
        })
        .collect::<Result<Vec<OwnedFd>, String>>()?;
    let spot = &bases[0].at;
    rustix::mount::mount(
        "sw-pool-env",
        spot,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        "mode=0755,size=1m",
    )
    .map_err(|e| format!("cannot stack the base pools: a tmpfs: {e}"))?;
    let (upper, work, root) = (spot.join("u"), spot.join("w"), spot.join("r"));
    for d in [&upper, &work, &root] {
        std::fs::create_dir(d).map_err(|e| format!("cannot stack the base pools: {e}"))?;
    }
    let lower: Vec<String> = fds
        .iter()
        .rev()
        .map(|f| format!("/proc/self/fd/{}", f.as_raw_fd()))
        .collect();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.join(":"),
        upper.display(),
        work.display()
    );
    rustix::mount::mount("overlay", &root, "overlay", MountFlags::RDONLY, opts)
        .map_err(|e| format!("cannot stack the base pools: {e}"))?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(at: &str) -> Base {
        Base {
            label: at.into(),
            image: "/c/x.pool".into(),
            at: at.into(),
            digest: None,
        }
    }

    #[test]
    fn lowers_are_the_copy_then_the_bases_top_first_else_the_host() {
        assert_eq!(lowers(None, &[]).unwrap(), "/");
        assert_eq!(lowers(Some(Path::new("/c/s1")), &[]).unwrap(), "/c/s1:/");
        let b = [base("/m/debian/12"), base("/m/dev/1")];
        assert_eq!(lowers(None, &b).unwrap(), "/m/dev/1:/m/debian/12");
        assert_eq!(
            lowers(Some(Path::new("/c/s1")), &b).unwrap(),
            "/c/s1:/m/dev/1:/m/debian/12"
        );
        let e = lowers(None, &[base("/m/a,b/1")]).unwrap_err();
        assert!(e.contains("/m/a,b/1") && e.contains("mount_dir"), "{e}");
        assert!(lowers(Some(Path::new("/c:d")), &[]).is_err());
    }
}
