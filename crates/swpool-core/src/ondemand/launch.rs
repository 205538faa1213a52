//! `load --lazy`'s launcher: the node servers (`sw-pool-full lazy-serve`, [`super::serve`]) started
//! as a background step of the job (`srun --overlap`, one task per node) or, outside a job, as
//! this node's server detached, their output going to a log in the user's state directory; then
//! the wait for task 0's line saying every node mounted, or why not. The step lives as long as the
//! job; `unload` (the mounts go) or the end of the job ends it.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use swpool_node::config::Environment;

use crate::{Error, ExitStatus};

/// The line task 0 of the servers writes when every node mounted (then a JSON object:
/// `mountpoint`, `nodes`).
pub const READY: &str = "sw-pool-lazy: ready ";
/// The line task 0 writes when the servers failed (then the error on one line).
pub const FAILED: &str = "sw-pool-lazy: failed ";

/// Task 0's ready line: every node mounted at `mount_point`.
pub fn ready_line(mount_point: &std::path::Path, nodes: u64) -> String {
    let line = serde_json::json!({"mountpoint": mount_point, "nodes": nodes});
    format!("{READY}{line}")
}

/// Task 0's failed line.
pub fn failed_line(e: &dyn std::fmt::Display) -> String {
    format!("{FAILED}{}", e.to_string().replace('\n', " "))
}

/// The node servers to start: the program and its arguments (`lazy-serve …`), the log their output
/// goes to, and where (a background step of the job on `nodes` nodes, or this node's server,
/// detached).
#[derive(Debug, Clone)]
pub struct Servers {
    pub exe: PathBuf,
    pub args: Vec<OsString>,
    pub log: PathBuf,
    pub in_job: bool,
    pub nodes: u64,
}

/// The servers' answer: where the pool is mounted on every node, on how many.
#[derive(Debug, Clone, PartialEq)]
pub struct Ready {
    pub mount_point: PathBuf,
    pub nodes: u64,
}

impl Servers {
    /// (Re)start the servers, their output in a fresh log.
    fn start(&self, env: &Environment) -> Result<std::process::Child, Error> {
        let out = std::fs::File::create(&self.log).map_err(|e| {
            Error::other(ExitStatus::System, format!("{}: {e}", self.log.display()))
        })?;
        let err = out
            .try_clone()
            .map_err(|e| Error::other(ExitStatus::System, e.to_string()))?;
        let (mut c, cmdline) = if self.in_job {
            let cmd = swpool_node::slurm::overlap_step(
                env,
                &self.exe,
                self.args.clone(),
                self.nodes,
                None,
                "",
            );
            (cmd.command(env.path_var())?, cmd.cmdline())
        } else {
            let line = format!(
                "{} {}",
                self.exe.display(),
                self.args.join(" ".as_ref()).to_string_lossy()
            );
            let mut c = std::process::Command::new(&self.exe);
            c.args(&self.args).stdin(std::process::Stdio::null());
            (c, line)
        };
        {
            use std::os::unix::process::CommandExt;
            c.stdout(out).stderr(err).process_group(0);
        }
        tracing::debug!("starting the servers: {cmdline}");
        c.spawn().map_err(|e| {
            Error::other(
                ExitStatus::Tool,
                format!("cannot start the servers ({cmdline}): {e}"),
            )
        })
    }

    /// Start the servers and wait until every node mounted `what` (the servers' ready line), they
    /// failed (their failed line, or their end: once more if Open MPI could not connect two
    /// nodes, `retrying` told so), or `timeout` (plus a minute for MPI's start) is up.
    pub fn start_and_wait(
        &self,
        env: &Environment,
        what: &str,
        timeout: Duration,
        retrying: &dyn Fn(&str),
    ) -> Result<Ready, Error> {
        let mut child = self.start(env)?;
        let mut retried = false;
        let t0 = Instant::now();
        // the servers start MPI, authorize on every node and mount: allow for the job's size
        let limit = timeout + Duration::from_secs(60);
        loop {
            // whether they ended first, then their log: all they wrote before the end is in it
            let ended = child.try_wait();
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if let Some(l) = text.lines().find_map(|l| l.strip_prefix(READY)) {
                return Ok(parse_ready(l));
            }
            if let Some(l) = text.lines().find_map(|l| l.strip_prefix(FAILED)) {
                let _ = child.wait();
                return Err(Error::other(ExitStatus::System, l.to_string()));
            }
            if let Ok(Some(st)) = ended {
                // Open MPI's TCP wire-up between two nodes can fail under load ("failed to TCP
                // connect to a peer", EINPROGRESS; seen on the testbed's busy 2 cores): nothing
                // was mounted for good (a node that had mounted released it), so the servers
                // start once more
                if !retried && text.contains("Open MPI failed to TCP connect to a peer") {
                    retried = true;
                    retrying(
                        "the on-demand servers could not start MPI (Open MPI failed to connect \
                         two nodes over TCP); starting them once more",
                    );
                    child = self.start(env)?;
                    continue;
                }
                return Err(self.failure(
                    format!("the on-demand servers ended ({st}) before every node mounted {what}"),
                    &text,
                ));
            }
            if t0.elapsed() > limit {
                let _ = child.kill(); // srun (it ends the step's tasks) or the server: our child
                let _ = child.wait();
                return Err(self.failure(
                    format!(
                        "the on-demand servers did not mount {what} on every node within {} s",
                        limit.as_secs()
                    ),
                    &text,
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The error: what happened, the log's last lines, and where the log is.
    fn failure(&self, what: String, log: &str) -> Error {
        let tail: Vec<&str> = log.lines().rev().take(8).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Error::other(
            ExitStatus::System,
            format!(
                "{what}:\n  {}\n(log: {})",
                tail.join("\n  "),
                self.log.display()
            ),
        )
    }
}

/// The ready line's JSON (a line that does not parse: no mount point, 0 nodes).
fn parse_ready(json: &str) -> Ready {
    let v = serde_json::from_str::<serde_json::Value>(json).unwrap_or_default();
    Ready {
        mount_point: v["mountpoint"]
            .as_str()
            .map(PathBuf::from)
            .unwrap_or_default(),
        nodes: v["nodes"].as_u64().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_carries_the_mount_point_and_the_nodes() {
        let l = ready_line(std::path::Path::new("/tmp/m/gcc/12"), 4);
        let json = l.strip_prefix(READY).expect("ready prefix");
        assert_eq!(
            parse_ready(json),
            Ready {
                mount_point: "/tmp/m/gcc/12".into(),
                nodes: 4
            }
        );
        assert_eq!(parse_ready("not json").nodes, 0);
        let f = failed_line(&"node2: no room\non /tmp");
        assert_eq!(f, format!("{FAILED}node2: no room on /tmp"));
    }

    fn servers(dir: &std::path::Path, script: &str) -> Servers {
        Servers {
            exe: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            log: dir.join("lazy.log"),
            in_job: false,
            nodes: 1,
        }
    }

    #[test]
    fn the_servers_answer_is_read_from_their_log() {
        let t = tempfile::tempdir().unwrap();
        let env = Environment::default();
        let no_retry = |m: &str| panic!("unexpected retry: {m}");
        let ok = servers(
            t.path(),
            &format!(
                "echo 'starting'; echo '{}'",
                ready_line("/m/x/1".as_ref(), 2)
            ),
        );
        let r = ok
            .start_and_wait(&env, "x/1", Duration::from_secs(5), &no_retry)
            .unwrap();
        assert_eq!((r.mount_point, r.nodes), (PathBuf::from("/m/x/1"), 2));
        // their failed line is the error
        let failed = servers(t.path(), &format!("echo '{}'", failed_line(&"node3: EIO")));
        let e = failed
            .start_and_wait(&env, "x/1", Duration::from_secs(5), &no_retry)
            .unwrap_err();
        assert!(e.to_string().contains("node3: EIO"), "{e}");
        // their end without a word: the error names what and gives the log's tail and path
        let died = servers(t.path(), "echo 'mpi: boom'; exit 3");
        let e = died
            .start_and_wait(&env, "x/1", Duration::from_secs(5), &no_retry)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("ended") && e.contains("x/1") && e.contains("mpi: boom"),
            "{e}"
        );
        assert!(
            e.contains(&t.path().join("lazy.log").display().to_string()),
            "{e}"
        );
    }

    #[test]
    fn a_failed_tcp_wire_up_is_started_once_more() {
        let t = tempfile::tempdir().unwrap();
        let env = Environment::default();
        let mark = t.path().join("second");
        // the first start fails Open MPI's wire-up; the second answers
        let script = format!(
            "if [ -e {m} ]; then echo '{r}'; else touch {m}; echo 'Open MPI failed to TCP connect to a peer'; exit 1; fi",
            m = mark.display(),
            r = ready_line("/m/x/1".as_ref(), 1)
        );
        let said = std::cell::Cell::new(0);
        let r = servers(t.path(), &script)
            .start_and_wait(&env, "x/1", Duration::from_secs(5), &|_| {
                said.set(said.get() + 1)
            })
            .unwrap();
        assert_eq!((r.nodes, said.get()), (1, 1));
        // twice: not a third time
        let always = "echo 'Open MPI failed to TCP connect to a peer'; exit 1";
        let e = servers(t.path(), always)
            .start_and_wait(&env, "x/1", Duration::from_secs(5), &|_| {})
            .unwrap_err();
        assert!(e.to_string().contains("ended"), "{e}");
    }
}
