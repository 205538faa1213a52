//! `build`'s progress on a terminal: mksquashfs, mke2fs and mkfs.erofs run quiet, so the bar
//! counts what they have read (`rchar` of `/proc/PID/io`, summed over this process's children)
//! against the bytes of the tree's regular files, and shows a percentage and an ETA. Until the
//! tree is measured (a walk of its metadata, beside the build) it is a spinner.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The bar and the thread that moves it; dropping it stops the thread and clears the bar.
pub struct ToolProgress {
    bar: indicatif::ProgressBar,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A bar for building `tree` into `msg`'s image, when stderr is a terminal and `show`.
pub fn start(show: bool, msg: String, tree: PathBuf) -> Option<ToolProgress> {
    let bar = crate::output::spinner(show, msg)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (b, s) = (bar.clone(), stop.clone());
    let thread = std::thread::Builder::new()
        .name("build-progress".into())
        .spawn(move || follow(&b, &s, &tree))
        .ok();
    Some(ToolProgress { bar, stop, thread })
}

impl Drop for ToolProgress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

fn follow(bar: &indicatif::ProgressBar, stop: &AtomicBool, tree: &Path) {
    let total = tree_bytes(tree, stop);
    if stop.load(Ordering::Relaxed) || total == 0 {
        return;
    }
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {msg} {wide_bar} {percent}% {bytes}/{total_bytes} ETA {eta}",
        )
        .expect("template"),
    );
    bar.set_length(total);
    let me = std::process::id();
    while !stop.load(Ordering::Relaxed) {
        bar.set_position(position(children_read(Path::new("/proc"), me), total));
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Bytes in the regular files under `tree` (not following links), as the tools read them.
fn tree_bytes(tree: &Path, stop: &AtomicBool) -> u64 {
    let mut total = 0;
    let mut dirs = vec![tree.to_path_buf()];
    while let Some(d) = dirs.pop() {
        if stop.load(Ordering::Relaxed) {
            return 0;
        }
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map_or(0, |m| m.len()),
                _ => {}
            }
        }
    }
    total
}

/// Where the bar stands when the tools have read `read` bytes of `total`: at most 99 % until
/// the build returns (a tool reads more than the files: its own output, for deduplication).
pub fn position(read: u64, total: u64) -> u64 {
    read.min(total - total / 100)
}

/// What the children of process `me` have read so far (`rchar` of `<proc>/PID/io` of each process
/// whose parent is `me`, from `<proc>/PID/stat`); 0 for what cannot be read.
pub fn children_read(proc: &Path, me: u32) -> u64 {
    let mut sum = 0;
    for e in std::fs::read_dir(proc).into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")) else {
            continue;
        };
        // "PID (COMM) STATE PPID ...": the name may hold spaces and parentheses
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid != Some(me) {
            continue;
        }
        sum += std::fs::read_to_string(proc.join(pid.to_string()).join("io"))
            .ok()
            .and_then(|io| {
                io.lines()
                    .find_map(|l| l.strip_prefix("rchar:"))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .unwrap_or(0);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc_entry(root: &Path, pid: u32, comm: &str, ppid: u32, rchar: Option<u64>) {
        let d = root.join(pid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("stat"),
            format!("{pid} ({comm}) S {ppid} 1 1 0 -1\n"),
        )
        .unwrap();
        if let Some(r) = rchar {
            std::fs::write(d.join("io"), format!("rchar: {r}\nwchar: 7\nsyscr: 3\n")).unwrap();
        }
    }

    #[test]
    fn the_children_reads_are_summed_and_no_one_elses() {
        let t = tempfile::tempdir().unwrap();
        proc_entry(t.path(), 10, "mksquashfs", 5, Some(1000));
        proc_entry(t.path(), 11, "a (tool) 5 x", 5, Some(24)); // a name with ')' and spaces
        proc_entry(t.path(), 12, "other", 6, Some(1 << 30)); // not ours
        proc_entry(t.path(), 13, "gone", 5, None); // its io unreadable
        std::fs::create_dir_all(t.path().join("self")).unwrap();
        assert_eq!(children_read(t.path(), 5), 1024);
        assert_eq!(children_read(t.path(), 7), 0);
    }

    #[test]
    fn the_bar_stays_below_its_end_until_the_build_returns() {
        assert_eq!(position(0, 1000), 0);
        assert_eq!(position(500, 1000), 500);
        assert_eq!(position(5000, 1000), 990);
        assert_eq!(position(1, 1), 1);
    }

    #[test]
    fn the_tree_counts_regular_files_only() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::write(t.path().join("a/b/f"), vec![0u8; 300]).unwrap();
        std::fs::write(t.path().join("g"), vec![0u8; 20]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", t.path().join("l")).unwrap();
        assert_eq!(tree_bytes(t.path(), &AtomicBool::new(false)), 320);
    }
}
