//! `bundle --trace -- CMD`: run CMD once under `strace` and list every file it opened.
//!
//! Why strace and not `LD_AUDIT` or fanotify: an audit library sees only what the loader loads
//! (`la_objsearch`/`la_objopen`), not the `open`/`openat` of Python modules and data files (SPINDLE
//! intercepts those with GOT patches and still misses `openat`, hpc/Spindle#83); fanotify needs
//! `CAP_SYS_ADMIN`. `strace -f` is an unprivileged ptrace of our own child that sees every syscall
//! of every thread and child process, static binaries included, whoever makes it (loader, libc,
//! Python). `-ff -o PREFIX` writes one file per process, so lines are never interleaved; `-y`
//! prints the path behind a directory descriptor (`openat(3</dir>, "x", …)`); only successful
//! calls are kept (`-e status=successful`).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use crate::exec::{ExecError, Tool, ToolCommand};

/// The system calls that open or execute a file.
pub const SYSCALLS: &str = "open,openat,openat2,creat,execve,execveat";

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("the traced command `{cmdline}` failed ({status}); it must run successfully once so that sw-pool can see what it opens: fix it (or its environment) and try again, or bundle without --trace{}", stderr_tail(stderr))]
    CommandFailed {
        cmdline: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Exec(ExecError),
    #[error("cannot read strace's log {}: {source}", crate::exec::show(path))]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn stderr_tail(s: &str) -> String {
    let lines: Vec<&str> = s.trim().lines().collect();
    if lines.is_empty() {
        return String::new();
    }
    let start = lines.len().saturating_sub(6);
    format!("\n  its error output:\n  {}", lines[start..].join("\n  "))
}

/// Run `cmd` under strace in `workdir` (a scratch directory for the logs); the files it opened,
/// absolute and lexically normalised, in first-open order, without duplicates. strace is looked up
/// in `path_var` (the value of `PATH`).
pub fn trace(
    cmd: &[OsString],
    workdir: &Path,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<Vec<PathBuf>, TraceError> {
    let prefix = workdir.join("strace");
    let c = ToolCommand::new(Tool::Strace)
        .args(["-f", "-ff", "-qq", "-y", "-e"])
        .arg(format!("trace={SYSCALLS}"))
        .args(["-e", "status=successful", "-o"])
        .path(&prefix)
        .arg("--")
        .args(cmd);
    match c.run(path_var) {
        Ok(_) => {}
        Err(ExecError::Failed { status, stderr, .. }) => {
            return Err(TraceError::CommandFailed {
                cmdline: cmd
                    .iter()
                    .map(|a| crate::exec::shell_quote(&a.to_string_lossy()))
                    .collect::<Vec<_>>()
                    .join(" "),
                status,
                stderr,
            })
        }
        Err(e) => return Err(TraceError::Exec(e)),
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
    let mut logs: Vec<PathBuf> = std::fs::read_dir(workdir)
        .map_err(|source| TraceError::Log {
            path: workdir.into(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .map(|n| n.to_string_lossy().starts_with("strace."))
                .unwrap_or(false)
        })
        .collect();
    // the first process (lowest pid) first: its opens come first in the list
    logs.sort_by_key(|p| {
        p.extension()
            .and_then(|e| e.to_str())
            .and_then(|e| e.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for l in logs {
        let text = std::fs::read_to_string(&l).map_err(|source| TraceError::Log {
            path: l.clone(),
            source,
        })?;
        for line in text.lines() {
            if let Some(p) = parse_line(line, &cwd) {
                if seen.insert(p.clone()) {
                    out.push(p);
                }
            }
        }
    }
    Ok(out)
}

/// One strace line → the path it opened, if it is a successful open/exec.
pub fn parse_line(line: &str, cwd: &Path) -> Option<PathBuf> {
    let (name, rest) = line.split_once('(')?;
    let name = name.trim();
    let (_, result) = rest.rsplit_once(") = ")?;
    if result.trim_start().starts_with('-') {
        return None;
    }
    let (dir, path) = match name {
        "open" | "creat" | "execve" => (None, first_string(rest)?.0),
        "openat" | "openat2" | "execveat" => {
            let (dirarg, after) = rest.split_once(", ")?;
            let dir = if dirarg == "AT_FDCWD" {
                None
            } else {
                // `3</some/dir>`
                let s = dirarg.split_once('<')?.1;
                Some(PathBuf::from(s.strip_suffix('>')?))
            };
            (dir, first_string(after)?.0)
        }
        _ => return None,
    };
    let p = PathBuf::from(&path);
    let abs = if p.is_absolute() {
        p
    } else {
        dir.unwrap_or_else(|| cwd.to_path_buf()).join(p)
    };
    Some(normalize(&abs))
}

/// The first C string literal in `s` (strace's escaping undone) and the rest after it.
fn first_string(s: &str) -> Option<(String, &str)> {
    let start = s.find('"')?;
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'"' => return Some((String::from_utf8_lossy(&out).into_owned(), &s[i + 1..])),
            b'\\' if i + 1 < b.len() => {
                i += 1;
                match b[i] {
                    b'n' => out.push(b'\n'),
                    b't' => out.push(b'\t'),
                    b'r' => out.push(b'\r'),
                    b'v' => out.push(0x0b),
                    b'f' => out.push(0x0c),
                    b'x' if i + 2 < b.len() => {
                        let h = std::str::from_utf8(&b[i + 1..i + 3]).ok()?;
                        out.push(u8::from_str_radix(h, 16).ok()?);
                        i += 2;
                    }
                    c @ b'0'..=b'7' => {
                        let mut v: u32 = (c - b'0') as u32;
                        let mut k = 0;
                        while k < 2 && i + 1 < b.len() && (b'0'..=b'7').contains(&b[i + 1]) {
                            i += 1;
                            k += 1;
                            v = v * 8 + (b[i] - b'0') as u32;
                        }
                        out.push(v as u8);
                    }
                    c => out.push(c),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    None
}

/// `a/./b/../c` → `a/c` without touching the file system (symlinks are resolved later, if at all).
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let cwd = Path::new("/home/u");
        assert_eq!(
            parse_line(
                r#"openat(AT_FDCWD, "/opt/app/lib/libx.so", O_RDONLY|O_CLOEXEC) = 3</opt/app/lib/libx.so>"#,
                cwd
            ),
            Some(PathBuf::from("/opt/app/lib/libx.so"))
        );
        assert_eq!(
            parse_line(
                r#"openat(3</opt/app/share>, "data/../a\x20b.txt", O_RDONLY) = 4</opt/app/share/a b.txt>"#,
                cwd
            ),
            Some(PathBuf::from("/opt/app/share/a b.txt"))
        );
        assert_eq!(
            parse_line(r#"open("rel/x.py", O_RDONLY) = 5"#, cwd),
            Some(PathBuf::from("/home/u/rel/x.py"))
        );
        assert_eq!(
            parse_line(
                r#"execve("/usr/bin/python3", ["python3", "-c", "import x"], 0x7ffd /* 20 vars */) = 0"#,
                cwd
            ),
            Some(PathBuf::from("/usr/bin/python3"))
        );
        assert_eq!(
            parse_line(
                r#"openat(AT_FDCWD, "/nope", O_RDONLY) = -1 ENOENT (No such file or directory)"#,
                cwd
            ),
            None
        );
        assert_eq!(parse_line("+++ exited with 0 +++", cwd), None);
    }
}
