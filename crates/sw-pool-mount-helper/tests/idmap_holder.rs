//! `idmap --pid P` on this machine: the holder, once it is one of the caller's processes (in the
//! caller's user namespace, traceable by them), holds no descriptor of root's: while it waits for
//! P, `/proc/HOLDER/fd` lists only its standard streams, each on `/dev/null`.
//!
//! Runs as root in a mount namespace of the test's own, where a private `helper.toml` (over an
//! overlay of `/etc`) and a private `/run` stand in for the node's: the machine itself is never
//! changed. The caller is uid 65534 (`SUDO_UID`, as sudo sets it, with the real uid root).

use std::process::Command;

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

const SCRIPT: &str = r#"
set -eu
D=$1; H=$2
mount -t tmpfs -o mode=0755 t79run /run
mkdir -p "$D/u" "$D/w"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$D/u,workdir=$D/w" /etc
mkdir -p /etc/sw-pool
printf 'environment_trees = ["/usr"]\n' > /etc/sw-pool/helper.toml
chmod 0644 /etc/sw-pool/helper.toml
# the caller's environment stand-in: a process of uid 65534 in a user namespace of its own that
# maps exactly that uid and gid to 0
setpriv --reuid=65534 --regid=65534 --clear-groups -- unshare -Ur sleep 30 &
T=$!
for _ in $(seq 200); do
  [ "$(awk '{print $1, $2, $3}' /proc/$T/uid_map 2>/dev/null)" = "0 65534 1" ] && break
  sleep 0.02
done
out=$(SUDO_UID=65534 "$H" idmap --pid "$T")
holder=$(printf '%s' "$out" | sed -n 's/.*"holder":\([0-9]*\).*/\1/p')
echo "holder=$holder"
# the holder is the caller's now: look while it waits for T
for _ in $(seq 200); do
  [ "$(awk '/^Uid:/ {print $2}' /proc/$holder/status 2>/dev/null)" = 65534 ] && break
  sleep 0.01
done
echo "uid=$(awk '/^Uid:/ {print $2, $3, $4, $5}' /proc/$holder/status)"
for f in /proc/$holder/fd/*; do
  n=${f##*/}
  echo "fd $n -> $(readlink "$f") flags $(awk '/^flags:/ {print $2}' /proc/$holder/fdinfo/$n)"
done
echo "cwd -> $(readlink /proc/$holder/cwd)"
kill "$T"
wait "$T" 2>/dev/null || true
"#;

#[test]
fn the_holder_keeps_no_descriptor_of_roots_once_it_is_the_callers() {
    if !is_root() {
        eprintln!("SKIP: needs root (a private /etc and /run in a mount namespace of the test's)");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let o = Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            SCRIPT,
            "sh",
        ])
        .arg(d.path())
        .arg(env!("CARGO_BIN_EXE_sw-pool-mount-helper"))
        .current_dir("/")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("uid=65534 65534 65534 65534"), "{out}\n{err}");
    let fds: Vec<&str> = out.lines().filter(|l| l.starts_with("fd ")).collect();
    assert!(!fds.is_empty(), "{out}\n{err}");
    for l in &fds {
        let ok = [
            "fd 0 -> /dev/null",
            "fd 1 -> /dev/null",
            "fd 2 -> /dev/null",
        ]
        .iter()
        .any(|p| l.starts_with(p));
        assert!(
            ok,
            "the holder, the caller's process, holds {l:?}:\n{out}\n{err}"
        );
    }
    assert_eq!(fds.len(), 3, "{out}\n{err}");
    assert!(out.contains("cwd -> /\n"), "{out}\n{err}");
}
