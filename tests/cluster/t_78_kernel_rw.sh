#!/usr/bin/env bash
# A user image read-write by the kernel (issue 31): `sw-pool mount --rw --kernel IMG DIR` takes the
# image's lease as the FUSE path does and has the site's helper mount it (ext4, by the kernel).
# Checks, as user 1 through sudo, the image on the scratch file system both nodes see:
#  - the mount is the kernel's (ext4, rw, nosuid,nodev), the lease names node1 (no process: pid 0);
#  - node2's mount --rw (FUSE or kernel) is refused naming node1; umount gives the lease back and
#    node2 reads what node1 wrote;
#  - a crash of the file system (ext4's shutdown ioctl, no journal flush: what a node failure
#    leaves), then the next mount --rw: e2fsck replays the journal and says so; the data written
#    before the last commit is there; the image is fsck-clean after;
#  - a Slurm job holding the image read-write killed with SIGKILL: the sw-pool epilog (as a site
#    installs it) has the helper unmount it and gives the lease back; node2 takes it; fsck-clean.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
HB=$REPO/target/release/sw-pool-mount-helper
[[ -x $SW && -x $HB ]] || { fail "sw-pool and its helper built" "missing (cargo build --release)"; finish; }
command -v sudo >/dev/null || { fail "sudo installed" "tools/setup-deps.sh installs it"; finish; }
H=$TB/sbin/sw-pool-mount-helper
install -m 0755 -o root -g root "$HB" "$H"
U1=$TB_USER
UR=$TB/local/root/users          # helper.toml's user_mount_root on every node
W=$TB/scratch/t78-$$
HOOK=$TB/etc/epilog.d/50-t78-sw-pool
IMG=$W/data.img
jobs_=()
as1() { local n=$1; shift; "$TESTBED/exec" "$n" runuser -u "$U1" -- env SLURM_CONF="$SLURM_CONF" SW_POOL_MOUNT_HELPER="$H" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$@"; }
cleanup() {
  for j in "${jobs_[@]}"; do scancel "$j" 2>/dev/null || true; done
  rm -f "$HOOK"
  for n in node1 node2; do
    as1 "$n" "$SW" cleanup --all >/dev/null 2>&1 || true
    "$TESTBED/exec" "$n" sh -c "awk -v a='$UR/$U1/t78' -v b='$W' 'index(\$5, a) == 1 || index(\$5, b) == 1 {print \$5}' /proc/self/mountinfo | while read -r m; do umount -l \"\$m\"; done; '$H' cleanup; rm -rf '$UR/$U1/t78'" >/dev/null 2>&1 || true
  done
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W" && chmod 1777 "$W"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/"
SW=$W/sw-pool
mkdir -p "$W/src" && for i in $(seq 1 50); do echo "file $i" > "$W/src/f$i"; done
chmod -R a+rX "$W"
as1 node1 "$SW" image create -q --size 64M "$IMG" "$W/src"
# the helper makes the mount point (root's, beneath <user_mount_root>/<user>, which is root's too:
# the user can rename nothing there) on the first mount and removes it with the unmount; the
# user gives only its path
M=$UR/$U1/t78/a
opts() { "$TESTBED/exec" "$1" awk -v m="$M" '$5 == m { o = $6; sub(/.* - /, ""); print o, $1 }' /proc/self/mountinfo; }

rc=0; out=$(as1 node1 "$SW" mount --rw --kernel "$IMG" "$M" 2>&1) || rc=$?
assert_eq "node1: mount --rw --kernel" 0 "$rc"
[[ $rc == 0 ]] || { echo "  $out"; finish; }
assert_match "... by the kernel: ext4, rw, nosuid,nodev" "^rw,nosuid,nodev[^ ]* ext4$" "$(opts node1)"
assert_match "... under the image's lease, naming node1 (no process: pid 0)" '"mode": "rw".*"host": "node1"' "$(tr -d '\n' < "$IMG.lease")"
as1 node2 mkdir -p "$W/n2-fuse"
rc=0; out=$(as1 node2 "$SW" mount --rw "$IMG" "$W/n2-fuse" 2>&1) || rc=$?
assert_eq "node2: mount --rw (FUSE) refused while node1 holds it (exit 3)" 3 "$rc"
assert_match "... naming the holder" "read-write on node1" "$out"
rc=0; out=$(as1 node2 "$SW" mount --rw --kernel "$IMG" "$M" 2>&1) || rc=$?
assert_eq "node2: mount --rw --kernel refused too (exit 3)" 3 "$rc"
as1 node1 sh -c "echo 'from node1' > $M/note && sync -f $M/note"
rc=0; as1 node1 "$SW" umount -q "$M" || rc=$?
assert_eq "node1: umount (the helper unmounts; the lease is given back)" "0 0" "$rc $(opts node1 | wc -l)"
assert_eq "... no lease left" 0 "$([[ -e $IMG.lease ]] && grep -c '"mode"' "$IMG.lease" || echo 0)"
as1 node2 "$SW" mount -q --rw --kernel "$IMG" "$M"
assert_eq "node2 takes it and reads what node1 wrote" "from node1" "$(as1 node2 cat "$M/note" 2>&1)"

# --- a crash: ext4's shutdown ioctl without flushing the log (what a node failure leaves), after
# a commit of 50 files and with more written after it
as1 node2 sh -c "mkdir $M/c && for i in \$(seq 1 50); do echo committed > $M/c/f\$i; done && sync -f $M/c/f50 && for i in \$(seq 1 50); do echo later > $M/c/g\$i; done"
"$TESTBED/exec" node2 python3 -c "
import fcntl, os, struct
fd = os.open('$M', os.O_RDONLY)
fcntl.ioctl(fd, 0x8004587D, struct.pack('I', 2))   # EXT4_IOC_SHUTDOWN, EXT4_GOING_FLAGS_NOLOGFLUSH
"
rc=0; as1 node2 sh -c "echo x > $M/after-crash" 2>/dev/null || rc=$?
assert_eq "after the shutdown the file system takes no writes" 1 "$([[ $rc != 0 ]] && echo 1 || echo 0)"
as1 node2 "$SW" umount -q "$M"
assert_match "the image's journal needs recovery (dumpe2fs)" "needs_recovery" "$(dumpe2fs -h "$IMG" 2>/dev/null | grep -i features)"
rc=0; out=$(as1 node1 "$SW" mount --rw --kernel "$IMG" "$M" 2>&1) || rc=$?
assert_eq "node1: the next mount --rw --kernel" 0 "$rc"
assert_match "... says the journal was replayed" "not unmounted cleanly last time; e2fsck replayed its journal" "$out"
assert_eq "... and the 50 committed files are there" 50 "$(as1 node1 sh -c "grep -l committed $M/c/f* | wc -l")"
as1 node1 "$SW" umount -q "$M"
rc=0; e2fsck -fn "$IMG" >/dev/null 2>&1 || rc=$?
assert_eq "the image is fsck-clean after" 0 "$rc"

# --- a job holding it read-write killed with SIGKILL; the sw-pool epilog as a site installs it
printf '#!/bin/sh\nSW_POOL_MOUNT_HELPER=%s SW_POOL_SYSTEM_CONFIG= exec %s -q slurm epilog\n' "$H" "$SW" > "$HOOK"
chmod 755 "$HOOK"
cat > "$W/job.sh" <<EOS
#!/bin/bash
export SW_POOL_MOUNT_HELPER=$H SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
$SW mount -q --rw --kernel $IMG $M || exit 1
mkdir -p $M/j && for i in \$(seq 1 100); do echo "synced \$i" > $M/j/s\$i; done
sync -f $M/j/s100
# a process that leaves the job's process tree (proctrack/linuxproc does not follow it) and keeps
# the image busy: the epilog must end it before the image can be unmounted
setsid sh -c 'cd $M/j && exec sleep 600' </dev/null >/dev/null 2>&1 &
echo \$! > $W/escaped.pid
touch $W/job.ready
i=0; while :; do i=\$((i + 1)); echo "unsynced \$i" > $M/j/u\$((i % 300)); done
EOS
chmod 755 "$W/job.sh"
jid=$(as_user sbatch --parsable -w node1 -N1 -o "$W/job.out" --chdir=/tmp "$W/job.sh"); jobs_+=("$jid")
wait_for 600 test -e "$W/job.ready"
assert_match "a job on node1 holds the image read-write (the lease names it)" "\"job\": \"$jid\"" "$(cat "$IMG.lease")"
scancel --full --signal=KILL "$jid"
wait_job "$jid" 600
assert_eq "after SIGKILL and the epilog: nothing mounted at $M on node1" 0 "$(opts node1 | wc -l)"
esc=$(cat "$W/escaped.pid" 2>/dev/null || echo 0)
# (a zombie waiting for its new parent to reap it counts as ended)
alive_not_zombie() { [[ $1 -gt 1 ]] && awk '{exit ($3 == "Z" || $3 == "X") ? 1 : 0}' "/proc/$1/stat" 2>/dev/null; }
assert_eq "... the process that escaped the job and held the image was ended (helper cleanup --kill)" 0 "$(alive_not_zombie "$esc" && { echo 1; ps -o pid,ppid,stat,cmd -p "$esc" >&2; } || echo 0)"
assert_eq "... and no lease left" 0 "$([[ -e $IMG.lease ]] && grep -c '"mode"' "$IMG.lease" || echo 0)"
rc=0; out=$(as1 node2 "$SW" mount --rw --kernel "$IMG" "$M" 2>&1) || rc=$?
assert_eq "node2: mount --rw --kernel after the killed job" 0 "$rc"
assert_eq "... every file the job synced is there" 100 "$(as1 node2 sh -c "grep -l '^synced ' $M/j/s* | wc -l")"
as1 node2 "$SW" umount -q "$M"
rc=0; e2fsck -fn "$IMG" >/dev/null 2>&1 || rc=$?
assert_eq "the image is fsck-clean at the end" 0 "$rc"

# --- what no record reports: the helper called directly; a loop device that backs no mount
as1 node1 sudo -n "$H" mount-image "$IMG" "$M" >/dev/null
out=$(as1 node1 "$SW" list --unreported 2>&1)
assert_match "list --unreported: the helper's mount of the user's image without a record" "helper .*data.img at $M" "$out"
out=$(as1 node1 "$SW" cleanup --all 2>&1)
assert_match "cleanup --all gives it back (the helper unmounts it)" "released .*$M" "$out"
assert_eq "... nothing mounted at $M" 0 "$(opts node1 | wc -l)"
"$TESTBED/exec" node1 sh -c "install -d -m 0755 $TB/local/root/cache && head -c 1M /dev/zero > $TB/local/root/cache/t78-orphan.pool"
loopdev=$("$TESTBED/exec" node1 losetup -f --show "$TB/local/root/cache/t78-orphan.pool")
out=$("$TESTBED/exec" node1 env SW_POOL_MOUNT_HELPER="$H" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$SW" list --unreported 2>&1)
assert_match "root's list --unreported: a loop device of the helper's that backs no mount" "loop +$loopdev" "$out"
out=$("$TESTBED/exec" node1 env SW_POOL_MOUNT_HELPER="$H" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$SW" cleanup --stale 2>&1)
assert_match "root's cleanup --stale frees it" "loop-freed +- +$loopdev" "$out"
assert_eq "... it is detached" "" "$("$TESTBED/exec" node1 losetup -j "$TB/local/root/cache/t78-orphan.pool")"
"$TESTBED/exec" node1 rm -f "$TB/local/root/cache/t78-orphan.pool"
finish
