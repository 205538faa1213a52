//! The FUSE server of a squashfs pool inside an environment (`--pool`, `--base`): sw-pool's own
//! one-hop tree server (`sw-pool-serve --tree --cached`, the config's `fuse_reader = "sw-pool"`,
//! the default) reading the verified node-local copy, else `squashfuse_ll` (the fallback: the
//! config says so, the server is not installed, or its reader does not read the image).
//!
//! Pid 1 starts the server as its child in the environment's PID namespace and waits (bounded)
//! until the mount is there; it ends with the environment, like squashfuse_ll's daemon.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use swpool_sys::exec::{Tool, ToolCommand};

/// Which servers may mount a squashfs pool here.
#[derive(Debug, Clone, Copy, Default)]
pub struct Readers<'a> {
    /// `sw-pool-serve`, when the config picks it and it is installed beside sw-pool.
    pub tree: Option<&'a Path>,
    /// `squashfuse_ll`, if installed.
    pub squashfuse: Option<&'a Path>,
}

/// `sw-pool-serve --tree`'s exit status for an image its reader does not read.
const UNSUPPORTED: i32 = 3;
/// How long the tree server may take to mount (it reads the superblock and the root inode).
const MOUNT_WITHIN: Duration = Duration::from_secs(30);

/// Mount the squashfs pool `label` (node-local `image`, manifest `digest`) at `at`: by the tree
/// server when there is one and the pool has a digest, else (or when its reader does not read
/// the image) by squashfuse_ll. Returns the server's name.
pub(crate) fn mount_squashfs(
    r: Readers<'_>,
    image: &Path,
    digest: Option<&str>,
    at: &Path,
    label: &str,
) -> Result<&'static str, String> {
    if let (Some(server), Some(d)) = (r.tree, digest) {
        if tree(server, image, d, at, label)? {
            return Ok(Tool::ChunkServer.program());
        }
        if r.squashfuse.is_none() {
            return Err(format!(
                "{label}: sw-pool's server does not read this image ({}) and squashfuse_ll is \
                 not installed: install the Debian package squashfuse",
                image.display()
            ));
        }
    }
    let prog = r.squashfuse.ok_or_else(|| {
        format!(
            "{label}: squashfuse_ll was not found (install the Debian package squashfuse, or \
             sw-pool-serve beside sw-pool with fuse_reader = \"sw-pool\")"
        )
    })?;
    ToolCommand::new(Tool::SquashfuseLl)
        .program(prog)
        .path(image)
        .path(at)
        .run(None)
        .map_err(|e| e.to_string())?;
    Ok(Tool::SquashfuseLl.program())
}

/// Start `sw-pool-serve --tree --cached` on `image` at `at` and wait until `at` is a mount of its.
/// `Ok(false)`: its reader does not read the image (nothing was mounted).
fn tree(server: &Path, image: &Path, digest: &str, at: &Path, label: &str) -> Result<bool, String> {
    let before = std::fs::metadata(at)
        .map_err(|e| format!("{label}: {}: {e}", at.display()))?
        .dev();
    let mut child = Command::new(server)
        .arg("--tree")
        .arg("--cached")
        .arg("--pool")
        .arg(image)
        .arg("--digest")
        .arg(digest)
        .arg("--dir")
        .arg(at)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("{label}: cannot run {}: {e}", server.display()))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.code() == Some(UNSUPPORTED) => return Ok(false),
            Ok(Some(s)) => {
                return Err(format!(
                    "{label}: {} ended ({s}) before {} was mounted: see its message above",
                    server.display(),
                    at.display()
                ))
            }
            Ok(None) => {}
            Err(e) => return Err(format!("{label}: waiting for {}: {e}", server.display())),
        }
        if std::fs::metadata(at).is_ok_and(|m| m.dev() != before) {
            // the server lives on in the environment's PID namespace and ends with it
            return Ok(true);
        }
        if start.elapsed() > MOUNT_WITHIN {
            // the child we started, by its pid; then reaped
            let _ = child.kill();
            let s = child.wait().ok().and_then(|s| s.signal());
            return Err(format!(
                "{label}: {} did not mount {} within {} s (stopped{}): set fuse_reader = \
                 \"squashfuse_ll\" to use squashfuse_ll",
                server.display(),
                at.display(),
                MOUNT_WITHIN.as_secs(),
                s.map(|s| format!(" by signal {s}")).unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_server_at_all_names_both_and_the_package() {
        let d = std::env::temp_dir();
        let e = mount_squashfs(
            Readers::default(),
            Path::new("/nonexistent/p.pool"),
            Some("blake3:00"),
            &d,
            "p/1",
        )
        .unwrap_err();
        assert!(e.contains("p/1") && e.contains("squashfuse_ll"), "{e}");
        assert!(e.contains("Debian package squashfuse"), "{e}");
    }

    #[test]
    fn a_server_that_reads_nothing_falls_back_and_one_that_fails_is_named() {
        let dir = std::env::temp_dir().join(format!("swp-reader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // a stand-in server: exits 3 (its reader does not read the image), or 1
        let s3 = dir.join("s3");
        std::fs::write(&s3, "#!/bin/sh\nexit 3\n").unwrap();
        let s1 = dir.join("s1");
        std::fs::write(&s1, "#!/bin/sh\necho nope >&2\nexit 1\n").unwrap();
        for s in [&s3, &s1] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(s, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let at = dir.join("at");
        std::fs::create_dir_all(&at).unwrap();
        let img = Path::new("/nonexistent/p.pool");
        assert_eq!(tree(&s3, img, "blake3:00", &at, "p/1"), Ok(false));
        let e = tree(&s1, img, "blake3:00", &at, "p/1").unwrap_err();
        assert!(
            e.contains("p/1") && e.contains("s1") && e.contains("before"),
            "{e}"
        );
        // exit 3 and no squashfuse_ll: the error says so
        let r = Readers {
            tree: Some(&s3),
            squashfuse: None,
        };
        let e = mount_squashfs(r, img, Some("blake3:00"), &at, "p/1").unwrap_err();
        assert!(e.contains("does not read this image"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
