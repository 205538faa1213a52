//! The fixture of the load tests (`tests/load*.rs`): a scratch directory with its own cache,
//! state, mount and trusted-key directories; on drop, unmounts whatever is still mounted under it.

use super::*;

use std::path::PathBuf;
use std::process::Command;

pub struct T {
    pub d: tempfile::TempDir,
}

impl T {
    pub fn new() -> T {
        let t = T { d: scratch() };
        for sub in ["local", "state", "mnt", "keys"] {
            std::fs::create_dir_all(t.d.path().join(sub)).unwrap();
        }
        t
    }
    pub fn p(&self, rel: &str) -> PathBuf {
        self.d.path().join(rel)
    }
    pub fn sw(&self) -> Command {
        let mut c = sw();
        c.env("LOCAL_TMPDIR", self.p("local"))
            .env("SW_POOL_STATE_DIR", self.p("state"))
            .env("SW_POOL_MOUNT", self.p("mnt"))
            .env("SW_POOL_TRUSTED_KEYS", self.p("keys"))
            .env("SW_POOL_SHELL", "sh")
            // the test reads and checks the shell code itself (else `load` refuses a pipe that
            // no shell reads)
            .env("SW_POOL_SHELL_FUNCTION", "1")
            .env_remove("SLURM_JOB_ID")
            .env_remove("MODULEPATH");
        c
    }
    pub fn run(&self, args: &[&str]) -> Out {
        run(self.sw().args(args))
    }
    /// `run`, which must exit 0 (its stderr in the failure message).
    #[track_caller]
    pub fn ok(&self, args: &[&str]) -> Out {
        let o = self.run(args);
        assert_eq!(o.code, 0, "sw-pool {args:?}: {}", o.stderr);
        o
    }
    pub fn cache_files(&self) -> Vec<String> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(self.p("local")).unwrap().flatten() {
            if let Ok(rd) = std::fs::read_dir(e.path().join("cache")) {
                v.extend(
                    rd.flatten()
                        .map(|f| f.file_name().to_string_lossy().into_owned())
                        // an entry's verification stamp is bookkeeping, not a file of the cache
                        .filter(|n| !n.ends_with(".verified")),
                );
            }
        }
        v
    }
    pub fn fuse_mounts(&self) -> usize {
        let root = self.d.path().to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&root) && l.contains("fuse"))
            .count()
    }
}

impl Drop for T {
    fn drop(&mut self) {
        let root = self.d.path().to_string_lossy().into_owned();
        for l in std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
        {
            if let Some(mp) = l.split_whitespace().nth(1).filter(|m| m.starts_with(&root)) {
                let _ = Command::new("fusermount3").args(["-u", "-z", mp]).status();
            }
        }
    }
}

pub fn pool(t: &T, with_modules: bool) -> PathBuf {
    let tree = t.p("tree");
    sample_tree(&tree);
    if !with_modules {
        std::fs::remove_dir_all(tree.join("modulefiles")).unwrap();
    }
    let out = t.p("demo.sqfs");
    let mut a = vec!["build", "-q"];
    if with_modules {
        a.push("--gen-modulefiles");
    }
    a.extend([out.to_str().unwrap(), tree.to_str().unwrap()]);
    let o = sw_run(&a);
    assert_eq!(o.code, 0, "{}", o.stderr);
    out
}
