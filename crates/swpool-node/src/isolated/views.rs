//! `--cache DIR`: each directory shown read-once over itself inside the environment, by the view
//! server beside sw-pool (`sw-pool-view`, `swpool_serve::view`), mounted by pid 1 with the pools.

use std::path::{Path, PathBuf};

use crate::config::{EnvVar, Environment, HostVar};

/// The view server's snapshot arguments: `--epoch` from `SW_POOL_VIEW_EPOCH`, else `--step
/// JOB.STEP` in a job step of more than one node (its start is the snapshot on every node), else
/// none (a step on one node has one view: its own start is the job's, and a file changed since an
/// interactive step began stays usable).
pub fn snapshot_args(env: &Environment) -> Vec<String> {
    if let Some(e) = env.get_nonempty(EnvVar::ViewEpoch) {
        return vec!["--epoch".into(), e];
    }
    let Some(step) = slurm_step(env) else {
        return Vec::new();
    };
    match digits(env, HostVar::SlurmStepNumNodes).and_then(|n| n.parse::<u64>().ok()) {
        Some(n) if n <= 1 => Vec::new(),
        _ => vec!["--step".into(), step],
    }
}

/// `v`'s value if it is a number.
fn digits(env: &Environment, v: HostVar) -> Option<String> {
    env.get_nonempty(v)
        .filter(|v| v.bytes().all(|b| b.is_ascii_digit()))
}

/// This Slurm step's `JOB.STEP`, if both are numbers.
fn slurm_step(env: &Environment) -> Option<String> {
    Some(format!(
        "{}.{}",
        digits(env, HostVar::SlurmJobId)?,
        digits(env, HostVar::SlurmStepId)?
    ))
}

/// A job-wide view's node server: its socket (node-local, the same path on every node) and the
/// log of the servers' step (task 0's node).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobView {
    pub socket: PathBuf,
    pub log: PathBuf,
    /// `JOB.STEP`.
    pub step: String,
}

/// The job-wide view of `at` in a Slurm step, of one node or many (no `SW_POOL_VIEW_EPOCH`
/// given): one listing and one read of each file per job, by the job's view servers (a step of
/// `sw-pool-full view-serve`, started by task 0), the same on 1 node as on 1,000; `None`
/// elsewhere (outside a step, or with a launcher's epoch: each node's view walks and reads the
/// tree itself). The socket lies in the user's state directory `state`.
pub fn job_view(env: &Environment, state: &Path, at: &Path) -> Option<JobView> {
    if env.get_nonempty(EnvVar::ViewEpoch).is_some() {
        return None;
    }
    let step = slurm_step(env)?;
    let key = crate::cache::view_key(at);
    let base = state.join(format!("view-{step}-{}", &key[..key.len().min(12)]));
    let with = |ext: &str| {
        let mut p = base.clone().into_os_string();
        p.push(ext);
        PathBuf::from(p)
    };
    Some(JobView {
        socket: with(".sock"),
        log: with(".log"),
        step,
    })
}

/// Remove the job-wide views' logs and failure notes in the state directory `dir` older than
/// `age` (each step leaves its servers' log for the user to read; a week is kept).
pub fn prune_logs(dir: &Path, age: std::time::Duration) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let ours =
            name.starts_with("view-") && (name.ends_with(".log") || name.ends_with(".failed"));
        let old = e
            .metadata()
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|a| a > age);
        if ours && old {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Task 0 of the step: start the job's view servers of `at` on the step's nodes (`srun --overlap`
/// of `full view-serve`, one task per node), in the background: every task's view waits for its
/// node's server. Their output goes to `jv.log`.
pub fn start_servers(
    env: &Environment,
    full: &Path,
    at: &Path,
    jv: &JobView,
) -> Result<(), String> {
    let nodes: u64 = env
        .get(HostVar::SlurmStepNumNodes)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let nodelist = env.get(HostVar::SlurmStepNodelist).ok_or_else(|| {
        format!(
            "--cache {}: SLURM_STEP_NODELIST is not set: cannot start the job's view servers",
            at.display()
        )
    })?;
    // their listing's and their end's figures (info) in the log
    let args = [
        "--log".into(),
        "info".into(),
        "view-serve".into(),
        "--socket".into(),
        jv.socket.clone().into_os_string(),
        at.as_os_str().to_owned(),
    ];
    // (Open MPI's ranks yield while they wait in a collective: the servers share the nodes' cores
    // with the job)
    let mut cmd = super::nested_step(
        env,
        full,
        args,
        nodes,
        &nodelist,
        ",OMPI_MCA_mpi_yield_when_idle=1",
    )
    .map_err(|e| format!("--cache {}: {e}", at.display()))?;
    if let Some(d) = jv.log.parent() {
        prune_logs(d, std::time::Duration::from_secs(7 * 24 * 3600));
    }
    let log = std::fs::File::create(&jv.log)
        .map_err(|e| format!("--cache {}: {}: {e}", at.display(), jv.log.display()))?;
    {
        use std::os::unix::process::CommandExt;
        cmd.stdin(std::process::Stdio::null()).process_group(0);
    }
    tracing::debug!(
        "starting the job's view servers of {}: {cmd:?}",
        at.display()
    );
    watch_servers(cmd, &jv.socket, (&log, &jv.log)).map_err(|e| {
        format!(
            "--cache {}: cannot start the job's view servers: {e}",
            at.display()
        )
    })
}

/// Start the servers' `srun` (`cmd`, its output to `log`: the file, and its path to name) from a
/// watcher process that reaps it when it ends, and if it failed (or could not start) before this
/// node's server made its socket, says so beside the socket (`SOCKET.failed`, where this node's
/// view looks while it waits): the view then goes on without the servers at once instead of
/// waiting for one that will not come. (The other nodes' views wait for theirs up to
/// `--job-wait`.)
///
/// The watcher is a process (forked twice, so that this one has no child left to reap), never a
/// thread: this task joins its node's environment next, and `setns` into a user namespace
/// refuses a multithreaded caller (EINVAL: a step whose task 0 was not the first on its node
/// failed so in `bench/storm.sh` at 8 × 4 on 2026-11-29, when the watcher was a thread).
fn watch_servers(
    cmd: std::process::Command,
    socket: &Path,
    log: (&std::fs::File, &Path),
) -> Result<(), String> {
    // SAFETY: this task is single-threaded (see above); the children only make system calls,
    // spawn `srun` and leave by _exit
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
        0 => {
            if unsafe { libc::fork() } == 0 {
                watch(cmd, socket, log);
            }
            unsafe { libc::_exit(0) }
        }
        child => {
            let mut st = 0;
            while unsafe { libc::waitpid(child, &mut st, 0) } == -1
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
            {
            }
            Ok(())
        }
    }
}

/// The watcher (a grandchild of the task): nothing of the task's but `cmd` and the log (its
/// standard input is /dev/null, its output the log, its other descriptors closed, so that it
/// holds no lock and no pipe of the step open), then `srun` started with those streams, waited
/// for and its failure written down.
fn watch(mut cmd: std::process::Command, socket: &Path, (out, log): (&std::fs::File, &Path)) -> ! {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system calls on descriptors this process holds, in a single-threaded child
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
        }
        libc::dup2(out.as_raw_fd(), 1);
        libc::dup2(out.as_raw_fd(), 2);
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
    let failed = |why: String| {
        let _ = swpool_serve::view::job::write_failed(socket, &why);
    };
    let status = match cmd.spawn() {
        Err(e) => {
            failed(format!("cannot start the servers' step (srun): {e}"));
            None
        }
        Ok(mut child) => loop {
            if socket.exists() {
                let _ = child.wait();
                break None;
            }
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(100)),
                Err(_) => break None,
            }
        },
    };
    if let Some(st) = status.filter(|st| !st.success()) {
        if !socket.exists() {
            failed(format!(
                "the servers' step (srun) ended before serving ({st}): see {}",
                log.display()
            ));
        }
    }
    unsafe { libc::_exit(0) }
}

/// The views of `dirs`, as pools of the environment: each an existing directory, named by its
/// canonical path (the view is mounted there), served by `sw-pool-view` beside `self_exe`; with
/// `warm` (the user's [`crate::cache::views_dir`]) each keeps the files it reads there for the
/// next job on the node. In a step of several nodes (`state`: the user's state directory), the
/// views are job-wide ([`job_view`]): task 0 starts the servers.
pub fn views(
    dirs: &[PathBuf],
    self_exe: &Path,
    warm: Option<&Path>,
    state: Option<&Path>,
    env: &Environment,
) -> Result<Vec<swpool_env::EnvPool>, String> {
    if dirs.is_empty() {
        return Ok(Vec::new());
    }
    let server = self_exe.with_file_name("sw-pool-view");
    if !server.is_file() {
        return Err(format!(
            "--cache needs {}, installed with sw-pool; it is missing: reinstall sw-pool",
            server.display()
        ));
    }
    let mut out: Vec<swpool_env::EnvPool> = Vec::new();
    for d in dirs {
        let at = std::fs::canonicalize(d)
            .map_err(|e| format!("--cache {}: {e}; give an existing directory", d.display()))?;
        if !at.is_dir() {
            return Err(format!("--cache {}: not a directory", d.display()));
        }
        if at == Path::new("/") {
            return Err("--cache /: give the directory of a program or environment, not /".into());
        }
        if let Some(o) = out
            .iter()
            .find(|o| o.at.starts_with(&at) || at.starts_with(&o.at))
        {
            return Err(format!(
                "--cache {} and --cache {}: one is inside the other; give the outer one only",
                o.at.display(),
                at.display()
            ));
        }
        let job = state.and_then(|st| job_view(env, st, &at));
        if let Some(jv) = &job {
            if jv.socket.as_os_str().len() > 107 {
                return Err(format!(
                    "--cache {}: the socket path {} is too long (at most 107 bytes): set \
                     SW_POOL_STATE_DIR to a shorter private directory",
                    at.display(),
                    jv.socket.display()
                ));
            }
            if env.get(HostVar::SlurmProcid).as_deref() == Some("0") {
                start_servers(env, &self_exe.with_file_name("sw-pool-full"), &at, jv)?;
            }
        }
        let first: Vec<String> = match &job {
            // (the step too: a node whose server does not come lists and reads the tree itself)
            Some(jv) => vec![
                "--job".into(),
                jv.socket.display().to_string(),
                "--step".into(),
                jv.step.clone(),
            ],
            None => snapshot_args(env),
        };
        let view_args = first
            .into_iter()
            .chain(warm.into_iter().flat_map(|w| {
                [
                    "--warm".to_string(),
                    w.join(crate::cache::view_key(&at)).display().to_string(),
                ]
            }))
            .collect();
        out.push(swpool_env::EnvPool {
            label: at.display().to_string(),
            image: at.clone(),
            at,
            ext: false,
            digest: None,
            view: Some(server.clone()),
            view_args,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked (single-threaded) process: the watcher leaves it single-threaded and childless
    /// (it can still enter a user namespace), and a step that fails before any socket is
    /// written down beside the socket; one that made its socket is not.
    #[test]
    fn the_servers_watcher_leaves_the_task_able_to_join_a_user_namespace() {
        let t = tempfile::tempdir().unwrap();
        let (sock, log) = (t.path().join("s.sock"), t.path().join("s.log"));
        let out = std::fs::File::create(&log).unwrap();
        let mut fails = std::process::Command::new("sh");
        fails.args(["-c", "echo no nodes >&2; exit 3"]);
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = match watch_servers(fails, &sock, (&out, &log)) {
                Err(_) => 2,
                Ok(()) => {
                    let mut st = 0;
                    let childless = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) } == -1;
                    let joins = unsafe { libc::unshare(libc::CLONE_NEWUSER) } == 0;
                    match (childless, joins) {
                        (true, true) => 0,
                        (false, _) => 3,
                        (true, false) => 4,
                    }
                }
            };
            unsafe { libc::_exit(code) }
        }
        let mut st = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(libc::WIFEXITED(st), "{st}");
        assert_eq!(
            libc::WEXITSTATUS(st),
            0,
            "2: no watcher, 3: a child left, 4: unshare failed"
        );
        let failed = swpool_serve::view::job::failed_path(&sock);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !failed.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let why = std::fs::read_to_string(&failed).unwrap();
        assert!(
            why.contains("ended before serving") && why.contains("s.log"),
            "{why}"
        );
        assert!(std::fs::read_to_string(&log).unwrap().contains("no nodes"));
        // a step that made its socket and ended well: nothing written
        std::fs::remove_file(&failed).unwrap();
        let mut serves = std::process::Command::new("sh");
        serves.args(["-c", &format!("touch {}; exit 0", sock.display())]);
        watch_servers(serves, &sock, (&out, &log)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert!(!failed.exists());
    }

    #[test]
    fn views_are_canonical_existing_directories_none_inside_another() {
        let t = tempfile::tempdir().unwrap();
        let exe = t.path().join("sw-pool");
        std::fs::create_dir(t.path().join("a")).unwrap();
        std::fs::create_dir(t.path().join("a/b")).unwrap();
        // no server beside sw-pool: said so
        let e = views(
            &[t.path().join("a")],
            &exe,
            None,
            None,
            &Environment::default(),
        )
        .unwrap_err();
        assert!(e.contains("sw-pool-view"), "{e}");
        std::fs::write(t.path().join("sw-pool-view"), b"").unwrap();
        let v = views(
            &[t.path().join("a/../a/b")],
            &exe,
            None,
            None,
            &Environment::default(),
        )
        .unwrap();
        let want = std::fs::canonicalize(t.path().join("a/b")).unwrap();
        assert_eq!((v[0].at.clone(), v[0].image.clone()), (want.clone(), want));
        assert_eq!(v[0].view, Some(t.path().join("sw-pool-view")));
        let e = views(
            &[t.path().join("a"), t.path().join("a/b")],
            &exe,
            None,
            None,
            &Environment::default(),
        )
        .unwrap_err();
        assert!(e.contains("inside"), "{e}");
        let e = views(
            &[t.path().join("nope")],
            &exe,
            None,
            None,
            &Environment::default(),
        )
        .unwrap_err();
        assert!(e.contains("--cache") && e.contains("nope"), "{e}");
        assert!(views(
            &[PathBuf::from("/")],
            &exe,
            None,
            None,
            &Environment::default()
        )
        .is_err());
        assert!(views(&[], &exe, None, None, &Environment::default())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_slurm_step_has_a_job_wide_view_named_by_step_and_tree() {
        let st = Path::new("/tmp/sw-pool-1000");
        let e = Environment::default();
        assert_eq!(job_view(&e, st, Path::new("/p/env")), None);
        let step = e
            .clone()
            .with(HostVar::SlurmJobId, "12")
            .with(HostVar::SlurmStepId, "3")
            .with(HostVar::SlurmStepNumNodes, "4");
        let jv = job_view(&step, st, Path::new("/p/env")).unwrap();
        assert_eq!(jv.step, "12.3");
        assert!(jv.socket.starts_with(st), "{jv:?}");
        let name = jv
            .socket
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with("view-12.3-") && name.ends_with(".sock"),
            "{name}"
        );
        assert_eq!(jv.log.with_extension("sock"), jv.socket);
        // another tree, another socket; one node too; an epoch given or no step id: none
        assert_ne!(
            job_view(&step, st, Path::new("/p/other")).unwrap().socket,
            jv.socket
        );
        let one = step.clone().with(HostVar::SlurmStepNumNodes, "1");
        assert_eq!(job_view(&one, st, Path::new("/p/env")), Some(jv.clone()));
        let batch = e.clone().with(HostVar::SlurmJobId, "12");
        assert_eq!(job_view(&batch, st, Path::new("/p/env")), None);
        let given = step.with(EnvVar::ViewEpoch, "1700000000.5");
        assert_eq!(job_view(&given, st, Path::new("/p/env")), None);
    }

    #[test]
    fn old_view_logs_go_and_nothing_else() {
        let t = tempfile::tempdir().unwrap();
        for n in [
            "view-1.0-abc.log",
            "view-1.0-abc.sock.failed",
            "view-2.0-abc.log",
            "mine.log",
        ] {
            std::fs::write(t.path().join(n), b"x").unwrap();
        }
        prune_logs(t.path(), std::time::Duration::from_secs(3600));
        assert_eq!(std::fs::read_dir(t.path()).unwrap().count(), 4);
        std::thread::sleep(std::time::Duration::from_millis(20));
        prune_logs(t.path(), std::time::Duration::from_millis(10));
        let left: Vec<_> = std::fs::read_dir(t.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["mine.log"]);
    }

    #[test]
    fn the_snapshot_is_the_epoch_given_else_the_start_of_a_step_of_several_nodes() {
        let e = Environment::default();
        assert!(snapshot_args(&e).is_empty());
        let step = e
            .clone()
            .with(HostVar::SlurmJobId, "12")
            .with(HostVar::SlurmStepId, "3");
        assert_eq!(snapshot_args(&step), ["--step", "12.3"]);
        let four = step.clone().with(HostVar::SlurmStepNumNodes, "4");
        assert_eq!(snapshot_args(&four), ["--step", "12.3"]);
        // one node: its own start
        let one = step.clone().with(HostVar::SlurmStepNumNodes, "1");
        assert!(snapshot_args(&one).is_empty());
        // no step id (a batch script): none
        let batch = e.clone().with(HostVar::SlurmJobId, "12");
        assert!(snapshot_args(&batch).is_empty());
        // not numbers: none
        let odd = e
            .clone()
            .with(HostVar::SlurmJobId, "12;x")
            .with(HostVar::SlurmStepId, "3");
        assert!(snapshot_args(&odd).is_empty());
        // the user's epoch first
        let given = four.with(EnvVar::ViewEpoch, "1700000000.5");
        assert_eq!(snapshot_args(&given), ["--epoch", "1700000000.5"]);
    }
}
