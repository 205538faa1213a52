#!/usr/bin/env bash
# The privileged mount helper (issue 31), called by unprivileged users through sudo on node1, as a
# site installs it (testbed/up: the sudoers line, /etc/sw-pool/helper.toml, root's node-private
# /run/sw-pool). Checks:
#  - the hostile-input matrix: a mount point that is a symlink (to /etc, to another user's dir),
#    swapped for one during the call (10 s race, a watcher reading mountinfo throughout), with `..`,
#    with a newline, outside the configured roots (/etc, /usr, elsewhere on the node's disk); a pool
#    signed only by a key in the user's own trusted keys, an unsigned pool; an image owned by
#    another user, a symlink, a FIFO, a device, one the caller cannot read, a crafted corrupt ext4;
#    a setuid-root program in an image (no privilege, exec or not); LD_PRELOAD, PATH and SW_POOL_*
#    in the caller's environment ignored. Every refusal is clear, nothing is mounted, no loop device
#    is left attached.
#  - two users' jobs on node1 mounting the same site pool: one cache copy, one mount, the second
#    mount reads nothing from shared storage; the first job's clean-up (the epilog's) leaves the
#    second job's mount; the last one's removes it and frees the loop device;
#  - `--job-id` of another user's job is refused;
#  - `sw-pool load` of a site-signed pool where the site configured the helper (mount_helper): a
#    2-node job of user 1 loads it (one broadcast, then the helper's copy and kernel mount on each
#    node), user 2's load on node1 reads nothing from shared storage and shares the mount, unload
#    and the job's epilog give the references back, the last one unmounts;
#  - an EROFS pool (`build --format erofs`): mounted by the kernel through the helper; without the
#    helper `load` refuses it clearly (no FUSE server for EROFS here).
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
node=node1
on() { "$TESTBED/exec" "$node" "$@"; }
U1=$TB_USER U2=$TB_USER2
uid1=$(id -u "$U1") uid2=$(id -u "$U2")
UR=$TB/local/root/users          # helper.toml's user_mount_root on every node
W=$TB/scratch/t76-$$             # fixtures (fast shared dir, same path on the nodes)
E=$TB/export/t76-$$              # the storage server's disk (written from here) ...
S=$TB/shared/t76-$$              # ... which the nodes see as the throttled, counted shared storage
KEYS=$TB/etc/sw-pool/trusted-keys
jobs_=()
fuse_pid='' fuse_conf_bound=''
cleanup() {
  touch "$W/stop" 2>/dev/null || true
  if [[ -n $fuse_pid ]]; then on kill -CONT "$fuse_pid" >/dev/null 2>&1 || true; on fusermount3 -u -z "$W/u1fuse" >/dev/null 2>&1 || true; fi
  if [[ -n $fuse_conf_bound ]]; then on umount /etc/fuse.conf >/dev/null 2>&1 || true; fi
  sleep 0.3
  for j in "${jobs_[@]}"; do scancel "$j" 2>/dev/null || true; done
  on sh -c "awk -v a='$UR/' -v b='$TB/local/root/site/t76' 'index(\$5, a) == 1 || index(\$5, b) == 1 {print \$5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l \"\$m\"; done" >/dev/null 2>&1 || true
  on "$H" cleanup >/dev/null 2>&1 || true
  on sh -c "rm -rf '$UR/$U1' '$UR/$U2' $TB/local/root/cache/t76*" >/dev/null 2>&1 || true
  # the user's own trusted key: left behind, it would make every later load of theirs require signatures
  rm -f "$KEYS/t76-site.pub.pem" "$KEYS/t76-site.pem" "/var/tmp/swp-tb-home/$U1/.config/sw-pool/trusted-keys/t76-mine.pem"
  rmdir "/var/tmp/swp-tb-home/$U1/.config/sw-pool/trusted-keys" "/var/tmp/swp-tb-home/$U1/.config/sw-pool" 2>/dev/null || true
  for n in node1 node2; do "$TESTBED/exec" "$n" sh -c "awk -v b='$TB/local/root/site/t76' 'index(\$5, b) == 1 {print \$5}' /proc/self/mountinfo | while read -r m; do umount -l \"\$m\"; done; rm -f $TB/local/root/cache/t76*; rm -rf /tmp/sw-pool-$uid1 /tmp/sw-pool-$uid2" >/dev/null 2>&1 || true; done
  cp "$W/helper.toml.orig" "$TB/etc/sw-pool/helper.toml" 2>/dev/null || true
  rm -rf "$W" "$E"
}
trap cleanup EXIT
mkdir -p "$W" "$E" && chmod 1777 "$W"
# the binaries where the nodes see them (the checkout may sit in a directory private to this host,
# e.g. a clone under /tmp: the nodes have their own /tmp)
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/"
SW=$W/sw-pool
cp "$TB/etc/sw-pool/helper.toml" "$W/helper.toml.orig"
as1() { on runuser -u "$U1" -- "$@"; }
as2() { on runuser -u "$U2" -- "$@"; }
loops_of_test() { on sh -c "losetup -a 2>/dev/null | grep -c -e '$W' -e '/t76' || true"; }
# the loop devices backing node $1's own copies of the site pool (loop devices are the machine's,
# shared by the testbed's nodes: `losetup -j` matches the file's device and inode, so only $1's)
node_loops() { "$TESTBED/exec" "$1" sh -c "for f in $TB/local/root/cache/t76site-*; do [ -e \"\$f\" ] && losetup -j \"\$f\"; done; true"; }
mounts_under() { on awk -v p="$1" 'index($5, p) == 1' /proc/self/mountinfo | wc -l; }

# --- fixtures: a site key (the site's trusted-keys directory), a user's own key, three pools
"$SW" keygen --out "$W/site" >/dev/null
"$SW" keygen --out "$W/mine" >/dev/null
cp "$W/site.pub.pem" "$KEYS/t76-site.pub.pem"
"$SW" init -q --name t76site --version 1.0 "$W/tree" >/dev/null
mkdir -p "$W/tree/install/hello/1.0/bin"
printf '#!/bin/sh\necho "hello from a kernel-mounted pool"\n' > "$W/tree/install/hello/1.0/bin/hello"
chmod 755 "$W/tree/install/hello/1.0/bin/hello"
head -c 8M /dev/urandom > "$W/tree/install/hello/1.0/data.bin"   # so a copy shows on the storage counter
"$SW" build -q "$E/site.pool" "$W/tree"
"$SW" sign -q --key "$W/site.pem" "$E/site.pool"
"$SW" build -q "$W/mine.pool" "$W/tree" && "$SW" sign -q --key "$W/mine.pem" "$W/mine.pool"
"$SW" build -q "$W/unsigned.pool" "$W/tree"
chmod -R a+rX "$E" "$W/tree" "$W"/*.pool "$W"/*.pem
on install -d -m 0700 -o "$U1" "/var/tmp/swp-tb-home/$U1/.config/sw-pool/trusted-keys" >/dev/null 2>&1 || true
if cp "$W/mine.pub.pem" "/var/tmp/swp-tb-home/$U1/.config/sw-pool/trusted-keys/t76-mine.pem" 2>/dev/null; then
  chown "$U1" "/var/tmp/swp-tb-home/$U1/.config/sw-pool/trusted-keys/t76-mine.pem"
fi

# images: U1's own (made by U1), U2's (readable by all, and a private one), corrupt, setuid inside
mkdir -p "$W/src" && echo data > "$W/src/f"
as1 "$SW" image create -q "$W/u1.img" "$W/src" >/dev/null
as2 "$SW" image create -q "$W/u2.img" "$W/src" >/dev/null
as2 sh -c "mkdir -m 700 '$W/u2priv' && '$SW' image create -q '$W/u2priv/p.img' '$W/src' >/dev/null"
as1 "$SW" image create -q "$W/bad.img" "$W/src" >/dev/null
debugfs -w -R 'clri <2>' "$W/bad.img" >/dev/null 2>&1   # the root directory's inode, wiped
as1 ln -s "$W/u1.img" "$W/u1-link.img"
as1 mkfifo "$W/u1.fifo"
mkdir -p "$W/suid" && cp /usr/bin/id "$W/suid/id" && chmod 4755 "$W/suid/id"
mke2fs -q -t ext4 -d "$W/suid" "$W/suid.img" 16M && chown "$U1" "$W/suid.img"

helper1() { as1 sudo -n "$H" "$@"; }
before_loops=$(loops_of_test)
refuse() {  # refuse NAME STATUS REGEX CMD...: refused with STATUS, message matching REGEX, nothing mounted
  local name=$1 want=$2 re=$3 rc=0 out; shift 3
  out=$("$@" 2>&1) || rc=$?
  if [[ $rc == "$want" ]] && grep -qE "$re" <<< "$out"; then pass "$name"; else fail "$name" "status $rc: $out"; fi
}

# --- hostile mount points
as1 sudo -n "$H" list >/dev/null 2>&1 || true   # creates nothing; $UR/$U1 is made on first mount
# the mount points are the helper's: $UR/<user> and every directory under it are root's, 0755
if helper1 mount-image "$W/u1.img" "$UR/$U1/first" >/dev/null 2>&1; then helper1 umount "$UR/$U1/first" >/dev/null 2>&1 || true; fi
if as2 sudo -n "$H" mount-image "$W/u2.img" "$UR/$U2/first" >/dev/null 2>&1; then as2 sudo -n "$H" umount "$UR/$U2/first" >/dev/null 2>&1 || true; fi
assert_eq "the user's mount directory is root's, 0755" "0 755" "$(on stat -c '%u %a' "$UR/$U1")"
assert_eq "the helper's mount point went with its unmount" "gone" "$(on sh -c "[ -e '$UR/$U1/first' ] && echo left || echo gone")"
if as1 mkdir "$UR/$U1/mine" 2>/dev/null || as1 ln -s /etc "$UR/$U1/to-etc" 2>/dev/null; then
  fail "the user can make nothing in their mount directory" "mkdir or ln -s succeeded"
else pass "the user can make nothing in their mount directory (no symlink, no directory to swap)"; fi
refuse "'..' in the mount point: refused" 3 "without '.' or '..'" helper1 mount-image "$W/u1.img" "$UR/$U1/d/../../$U2/decoy"
refuse "'..' in the image path: refused" 3 "without '.' or '..'" helper1 mount-image "$W/../t76-$$/u1.img" "$UR/$U1/d"
refuse "a newline in the mount point: refused" 3 "control character" helper1 mount-image "$W/u1.img" "$UR/$U1/d
x"
refuse "a mount point over /etc: refused" 3 "is not under" helper1 mount-image "$W/u1.img" /etc
refuse "a mount point over /usr: refused" 3 "is not under" helper1 mount-image "$W/u1.img" /usr
refuse "a mount point elsewhere on the node's disk: refused" 3 "is not under" helper1 mount-image "$W/u1.img" "$TB/local"
refuse "a mount point in another user's directory: refused" 3 "is not under" helper1 mount-image "$W/u1.img" "$UR/$U2/decoy"

# --- hostile images and pools
refuse "an image owned by another user: refused" 3 "belongs to uid $uid2" helper1 mount-image "$W/u2.img" "$UR/$U1/d"
refuse "an image that is a symlink: refused" 3 "symlink" helper1 mount-image "$W/u1-link.img" "$UR/$U1/d"
refuse "an image that is a FIFO: refused" 3 "not a regular file" helper1 mount-image "$W/u1.fifo" "$UR/$U1/d"
refuse "an image that is a device: refused" 3 "not a regular file" helper1 mount-image /dev/null "$UR/$U1/d"
refuse "an image the caller cannot read: refused" 3 "cannot open it|ermission denied" helper1 mount-image "$W/u2priv/p.img" "$UR/$U1/d"
refuse "a corrupt ext4 image is not handed to the kernel" 4 "file-system errors" helper1 mount-image "$W/bad.img" "$UR/$U1/d"
refuse "a pool signed only by a key in the user's own trusted keys: refused" 7 "not trusted|untrusted|site key" helper1 mount-pool "$W/mine.pool"
refuse "an unsigned pool: refused" 7 "not signed|unsigned|site key" helper1 mount-pool "$W/unsigned.pool"
refuse "cleanup by a user: refused" 3 "for root" helper1 cleanup
refuse "--job-id of a job that does not exist: refused" 3 "not a running Slurm job" helper1 mount-pool --job-id 999999 "$S/site.pool"
assert_eq "nothing mounted by any refusal" 0 "$(mounts_under "$UR/")"
assert_eq "no loop device left by any refusal" "$before_loops" "$(loops_of_test)"

# --- the caller's environment is ignored: PATH (a fake e2fsck), LD_PRELOAD, SW_POOL_*
mkdir -p "$W/evil" && printf '#!/bin/sh\ntouch %s/evil-ran\nexit 0\n' "$W" > "$W/evil/e2fsck" && chmod 755 "$W/evil/e2fsck"
printf '#include <stdlib.h>\n__attribute__((constructor)) static void c(void){ system("touch %s/preload-ran"); }\n' "$W" > "$W/evil.c"
cc -shared -fPIC -o "$W/evil.so" "$W/evil.c" 2>/dev/null
refuse "with PATH, LD_PRELOAD and SW_POOL_* set, the real e2fsck still refuses the corrupt image" 4 "file-system errors" \
  as1 env PATH="$W/evil:/usr/bin:/bin" LD_PRELOAD="$W/evil.so" SW_POOL_CACHE=/etc SW_POOL_SYSTEM_CONFIG="$W/x" sudo -n "$H" mount-image "$W/bad.img" "$UR/$U1/d"
ran=none; for f in "$W/evil-ran" "$W/preload-ran"; do [[ -e $f ]] && ran=$f; done
assert_eq "the caller's PATH and LD_PRELOAD ran nothing as root" none "$ran"

# --- a user's image, mounted and unmounted; a setuid-root program inside gains nothing
if out=$(helper1 mount-image --rw "$W/u1.img" "$UR/$U1/d" 2>&1); then pass "the user's own image is mounted read-write by the kernel"; else fail "own image mounted" "$out"; fi
opts=$(on awk -v p="$UR/$U1/d" '$5 == p' /proc/self/mountinfo)
assert_match "kernel ext4 on a loop device, nosuid,nodev,noexec" "nosuid,nodev,noexec.* ext4 /dev/loop" "$opts"
assert_cmd "the user writes into it" as1 sh -c "echo written > '$UR/$U1/d/new'"
refuse "a second mount of the same image: refused" 3 "already mounted|crosses a mount" helper1 mount-image "$W/u1.img" "$UR/$U1/race/sub"
refuse "another user cannot unmount it" 3 "not yours|nothing the helper mounted" as2 sudo -n "$H" umount "$UR/$U1/d"
if out=$(helper1 umount "$UR/$U1/d" 2>&1); then pass "the owner unmounts it"; else fail "owner unmounts" "$out"; fi
assert_cmd "the image is fsck-clean after the kernel rw mount" e2fsck -fn "$W/u1.img"
helper1 mount-image "$W/suid.img" "$UR/$U1/s" >/dev/null
rc=0; out=$(as1 "$UR/$U1/s/id" -u 2>&1) || rc=$?
assert_match "a program in a user image does not run (noexec by default)" "^[1-9][0-9]* .*Permission denied" "$rc $out"
helper1 umount "$UR/$U1/s" >/dev/null
printf 'user_images_exec = true\n' >> "$TB/etc/sw-pool/helper.toml"
helper1 mount-image "$W/suid.img" "$UR/$U1/s" >/dev/null
assert_eq "a setuid-root program in an image runs as the user (nosuid) where exec is allowed" "$uid1 $uid1" "$(as1 "$UR/$U1/s/id" -u) $(as1 "$UR/$U1/s/id" -ru)"
helper1 umount "$UR/$U1/s" >/dev/null
cp "$W/helper.toml.orig" "$TB/etc/sw-pool/helper.toml"

# --- the per-user cap: max_images_per_user = 1, a second image of the same user refused, another user's not
printf 'max_images_per_user = 1\n' >> "$TB/etc/sw-pool/helper.toml"
helper1 mount-image "$W/u1.img" "$UR/$U1/cap1" >/dev/null 2>&1 || fail "the first image under the cap mounts" "refused"
refuse "a second image over max_images_per_user: refused, naming the limit" 3 "max_images_per_user = 1.*unmount one first" helper1 mount-image "$W/suid.img" "$UR/$U1/cap2"
assert_eq "the refused mount left no directory" "gone" "$(on sh -c "[ -e '$UR/$U1/cap2' ] && echo left || echo gone")"
if out=$(as2 sudo -n "$H" mount-image "$W/u2.img" "$UR/$U2/cap" 2>&1); then pass "another user's image is not counted against the first"; as2 sudo -n "$H" umount "$UR/$U2/cap" >/dev/null 2>&1; else fail "another user under the cap" "$out"; fi
helper1 umount "$UR/$U1/cap1" >/dev/null 2>&1 || true
cp "$W/helper.toml.orig" "$TB/etc/sw-pool/helper.toml"

# --- the race: the user renames the mount point and its parent during and after the calls
cp "$REPO/tests/cluster/race.py" "$W/race.py"
cat > "$W/mover.py" <<'PY'
import os, sys
a, b, stop = sys.argv[1:4]
moved = tried = 0
while not os.path.exists(stop):
    for src, dst in ((a + "/t76sub", b + "-sub"), (a, b)):
        tried += 1
        try:
            os.rename(src, dst)
            moved += 1
        except OSError:
            pass
print(moved, tried)
PY
as1 python3 "$W/mover.py" "$UR/$U1/race" "$W/moved" "$W/stop" > "$W/moves" 2>&1 &
mover=$!
on python3 "$W/race.py" watch "$W/stop" t76sub "$UR/$U1/race/" > "$W/watch" 2>&1 &
watcher=$!
ok=0 other=0 i=0
: > "$W/other"
end=$(( $(date +%s) + 10 ))
while (( $(date +%s) < end )); do
  i=$((i + 1)); rc=0
  out=$(helper1 mount-image "$W/u1.img" "$UR/$U1/race/t76sub" 2>&1) || rc=$?
  if [[ $rc == 0 ]]; then
    ok=$((ok + 1))
    for _ in $(seq 50); do helper1 umount "$UR/$U1/race/t76sub" >/dev/null 2>&1 && break; sleep 0.01; done
  else
    other=$((other + 1)); printf '%s\n' "$out" >> "$W/other"
  fi
done
touch "$W/stop"; wait "$mover" || true; wait "$watcher" || true
read -r samples inside outside where < "$W/watch" || true
read -r moved tried < "$W/moves" || true
echo "  $i helper calls in 10 s: $ok mounted, $other refused; the user's renames: $moved of $tried succeeded; $samples mountinfo reads ($inside sightings inside)"
assert_eq "no mount ever seen outside the user's mount directory" "0" "${outside:-missing}${where:+ $where}"
assert_eq "the user renamed nothing of the helper's mount points" "0" "${moved:-missing}"
assert_eq "every call of the race mounted (nothing moved under it)" 0 "$other"
[[ $other == 0 ]] || head -3 "$W/other" | sed 's/^/  other: /'
assert_eq "nothing mounted under the users' root after the race" 0 "$(mounts_under "$UR/")"
assert_eq "no loop device left after the race" "$before_loops" "$(loops_of_test)"

# --- two users' jobs, one site pool: one copy, one mount, the second reads nothing from storage
j1=$(as_user sbatch --parsable -w "$node" -N1 -o /dev/null -D /tmp --wrap 'sleep 300'); jobs_+=("$j1")
j2=$(runuser -u "$U2" -- env SLURM_CONF="$SLURM_CONF" sbatch --parsable -w "$node" -N1 -o /dev/null -D /tmp --wrap 'sleep 300'); jobs_+=("$j2")
wait_for 100 sh -c "squeue -h -j $j1,$j2 -t R | wc -l | grep -qx 2" || fail "both jobs run" "$(squeue)"
refuse "--job-id of another user's job: refused" 3 "belongs to uid $uid2" helper1 mount-pool --job-id "$j2" "$S/site.pool"
"$TESTBED/storage-bytes" --mark >/dev/null
out1=$(helper1 mount-pool --job-id "$j1" "$S/site.pool" 2>&1) || fail "user 1 mounts the site pool" "$out1"
b1=$("$TESTBED/storage-bytes" --since-mark)
"$TESTBED/storage-bytes" --mark >/dev/null
out2=$(as2 sudo -n "$H" mount-pool --job-id "$j2" "$S/site.pool" 2>&1) || fail "user 2 mounts the site pool" "$out2"
b2=$("$TESTBED/storage-bytes" --since-mark)
echo "  storage bytes: first mount $b1, second mount $b2 (pool $(stat -c %s "$E/site.pool"))"
assert_match "the first mount copied the pool into root's cache" '"copied":true' "$out1"
assert_match "the second mount shares it (2 references, no copy)" '"copied":false.*"refs":2.*"shared":true' "$out2"
assert_le "the second mount read (almost) nothing from shared storage (bytes)" "$b2" 262144
mp=$(sed -n 's/.*"mount_point":"\([^"]*\)".*/\1/p' <<< "$out1")
assert_eq "one mount of the pool on the node" 1 "$(on awk -v p="$mp" '$5 == p' /proc/self/mountinfo | wc -l)"
assert_eq "one copy in root's cache" 1 "$(on sh -c "ls $TB/local/root/cache | grep -c '^t76site-'")"
assert_eq "both users run from it" "hello from a kernel-mounted pool hello from a kernel-mounted pool" \
  "$(as1 "$mp/install/hello/1.0/bin/hello") $(as2 "$mp/install/hello/1.0/bin/hello")"
on "$H" cleanup --job-id "$j1" >/dev/null
assert_eq "job 1's clean-up (the epilog's) leaves job 2's mount" 1 "$(on awk -v p="$mp" '$5 == p' /proc/self/mountinfo | wc -l)"
on "$H" cleanup --job-id "$j2" >/dev/null
assert_eq "job 2's clean-up unmounts it" 0 "$(on awk -v p="$mp" '$5 == p' /proc/self/mountinfo | wc -l)"
for _ in $(seq 100); do [[ -z $(node_loops "$node") ]] && break; sleep 0.1; done
assert_eq "its loop device is released" "" "$(node_loops "$node")"

scancel "$j1" "$j2" 2>/dev/null || true   # their CPUs: the 2-node load below needs node1

# --- a loop device left attached to the helper's cache without a mount (no autoclear: what a
#     crashed older helper or an admin's losetup leaves) is freed by cleanup; other nodes' are not
orphan=$(on sh -c "losetup -f --show $TB/local/root/cache/t76site-*")
other=$("$TESTBED/exec" node2 sh -c "f=$TB/local/root/cache/t76zz-other.pool && mkdir -p $TB/local/root/cache && truncate -s 1M \$f && losetup -f --show \$f")
out=$(on "$H" cleanup)
assert_match "cleanup frees the loop device that backs no mount ($orphan)" "\"loops_freed\":\\[\"${orphan#/dev/}\"\\]" "$out"
assert_eq "and it is gone" "" "$(node_loops "$node")"
assert_cmd "another node's loop device on a file of the same directory (its own disk) is left alone" "$TESTBED/exec" node2 losetup "$other"
"$TESTBED/exec" node2 sh -c "f=\$(losetup -nO BACK-FILE $other); losetup -d $other; rm -f \$f" || true

# --- sw-pool load through the helper (the site configured mount_helper)
for n in node1 node2; do "$TESTBED/exec" "$n" sh -c "rm -f $TB/local/root/cache/t76site-*" 2>/dev/null || true; done
cp "$W/site.pub.pem" "$KEYS/t76-site.pem"   # the site's key where sw-pool itself looks: /etc/sw-pool/trusted-keys
SWENV=(env SW_POOL_MOUNT_HELPER="$H" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=)
"$TESTBED/storage-bytes" --mark >/dev/null
rc=0; out=$(as_user "${SWENV[@]}" "$REPO/tests/cluster/srun-mpi" -N 2 -w node1,node2 --chdir=/tmp \
  sh -c 'echo "JOB=$SLURM_JOB_ID"; exec "$@"' sh "$SW" load "$S/site.pool" 2>&1) || rc=$?
job=$(sed -n 's/^JOB=//p' <<< "$out" | head -1)
b1=$("$TESTBED/storage-bytes" --since-mark)
assert_eq "user 1's 2-node load of a site pool through the helper succeeds" 0 "$rc${rc/#0/}"
[[ $rc == 0 ]] || echo "$out" | tail -5
mp=$TB/local/root/site/t76site/1.0
for n in node1 node2; do
  assert_eq "$n: the helper's kernel mount at $mp" 1 "$("$TESTBED/exec" "$n" awk -v p="$mp" '$5 == p && / - squashfs \/dev\/loop/' /proc/self/mountinfo | wc -l)"
done
assert_le "the 2-node load read the pool from shared storage once (bytes)" "$b1" $(( $(stat -c %s "$E/site.pool") * 11 / 10 ))
"$TESTBED/storage-bytes" --mark >/dev/null
rc=0; out=$(as2 "${SWENV[@]}" "$SW" -v load "$S/site.pool" 2>&1) || rc=$?
b2=$("$TESTBED/storage-bytes" --since-mark)
assert_eq "user 2's load on node1 succeeds" 0 "$rc${rc/#0/}"
assert_match "user 2's load moved nothing" "bytes read from .*: 0, sent: 0, written: 0" "$out"
assert_le "user 2's load read (almost) nothing from shared storage (bytes)" "$b2" 262144
echo "  sw-pool load: user 1 (2 nodes) $b1 bytes from storage, user 2 (node1) $b2 bytes"
assert_match "user 2's environment points at the one mount" "MODULEPATH='$mp/modulefiles" "$out"
assert_eq "both users' records on node1 name the helper's mount" "$mp $mp" \
  "$(as1 "$SW" list --json | grep -o "\"mount_point\": *\"$mp\"" | head -1 | sed 's/.*: *"//; s/"//') $(as2 "$SW" list --json | grep -o "\"mount_point\": *\"$mp\"" | head -1 | sed 's/.*: *"//; s/"//')"
rc=0; as2 "$SW" unload t76site/1.0 >/dev/null 2>&1 || rc=$?
assert_eq "user 2 unloads" 0 "$rc"
assert_eq "user 1's mount stays on node1 after user 2's unload" 1 "$(on awk -v p="$mp" '$5 == p' /proc/self/mountinfo | wc -l)"
for n in node1 node2; do
  rc=0; out=$("$TESTBED/exec" "$n" env SLURM_JOB_ID="$job" SLURM_JOB_UID="$uid1" SLURM_JOB_USER="$U1" "$SW" slurm epilog 2>&1) || rc=$?
  assert_eq "$n: the Slurm epilog of user 1's job $job (as root) succeeds" 0 "$rc${out:+ $out}"
  for _ in $(seq 100); do [[ -z $(node_loops "$n") ]] && break; sleep 0.1; done
  assert_eq "$n: the last reference gone, the helper's mount is gone" 0 "$("$TESTBED/exec" "$n" awk -v p="$mp" '$5 == p' /proc/self/mountinfo | wc -l)"
  left=$(node_loops "$n")
  assert_eq "$n: and its loop device" "" "$left${left:+ (mounts: $("$TESTBED/exec" "$n" grep -c ' - squashfs /dev/loop' /proc/self/mountinfo || true))}"
done

# --- a call stalled on a stopped FUSE daemon (a site that sets user_allow_other): user 1 serves an
# image from a FUSE mount of their own, stops its daemon and asks the helper to mount that image.
# The helper waits on that call alone: user 2's list and mount-image and root's cleanup each finish
# in under 1 s meanwhile; the stalled call is refused within file_timeout_secs, naming the file,
# and leaves nothing (no directory, no mount, no loop device).
printf 'user_allow_other\n' > "$W/fuse.conf"
on mount --bind "$W/fuse.conf" /etc/fuse.conf && fuse_conf_bound=1
printf 'file_timeout_secs = 2\n' >> "$TB/etc/sw-pool/helper.toml"
mkdir -p "$W/hold" && cp "$W/u1.img" "$W/hold/u1.img" && chown "$U1" "$W/hold/u1.img"
mksquashfs "$W/hold" "$W/hold.sqfs" -quiet -noappend >/dev/null && chmod a+r "$W/hold.sqfs"
as1 mkdir "$W/u1fuse"
as1 sh -c "squashfuse -f -o allow_other '$W/hold.sqfs' '$W/u1fuse' & echo \$! > '$W/u1fuse.pid'; wait" >/dev/null 2>&1 &
for _ in $(seq 50); do [[ $(mounts_under "$W/u1fuse") == 1 ]] && break; sleep 0.1; done
fuse_pid=$(cat "$W/u1fuse.pid" 2>/dev/null || true)
assert_eq "user 1's FUSE mount (allow_other) is up" 1 "$(mounts_under "$W/u1fuse")"
on kill -STOP "$fuse_pid"
sleep 1.5   # past the kernel's cached entries: a lookup of the image now waits on the daemon
( rc=0; as1 sudo -n "$H" mount-image "$W/u1fuse/u1.img" "$UR/$U1/stall" > "$W/stall.out" 2>&1 || rc=$?; echo "$rc" > "$W/stall.rc" ) &
stalled=$!
sleep 0.5
assert_eq "the call on the stopped daemon's file is still waiting" "waiting" "$([[ -e $W/stall.rc ]] && echo "done: $(cat "$W/stall.rc") $(cat "$W/stall.out")" || echo waiting)"
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; local rc=$?; t1=$(date +%s%N); echo "$(( (t1 - t0) / 1000000 )) $rc"; }
read -r t rc <<< "$(ms as2 sudo -n "$H" list)"
assert_le "meanwhile user 2's list finishes in under 1 s (ms)" "$t" 999; assert_eq "... and succeeds" 0 "$rc"
read -r t rc <<< "$(ms as2 sudo -n "$H" mount-image "$W/u2.img" "$UR/$U2/during")"
assert_le "meanwhile user 2's mount-image finishes in under 1 s (ms)" "$t" 999; assert_eq "... and mounts" 0 "$rc"
as2 sudo -n "$H" umount "$UR/$U2/during" >/dev/null 2>&1 || true
read -r t rc <<< "$(ms on "$H" cleanup)"
assert_le "meanwhile root's cleanup (the epilog's) finishes in under 1 s (ms)" "$t" 999; assert_eq "... and succeeds" 0 "$rc"
echo "  while user 1's call waited: list, mount-image and cleanup took under 1 s each"
for _ in $(seq 100); do [[ -e $W/stall.rc ]] && break; sleep 0.1; done
assert_match "the stalled call is refused within file_timeout_secs, naming the file" \
  "^3 .*$W/u1fuse/u1.img.*did not finish within 2.0 s" "$(cat "$W/stall.rc" 2>/dev/null || echo still waiting) $(tr '\n' ' ' < "$W/stall.out")"
assert_eq "... and leaves no directory, mount or loop device" "gone 0 0" \
  "$(on sh -c "[ -e '$UR/$U1/stall' ] && echo left || echo gone") $(mounts_under "$UR/$U1/") $(loops_of_test)"
on kill -CONT "$fuse_pid"
wait "$stalled" 2>/dev/null || true
as1 fusermount3 -u "$W/u1fuse" >/dev/null 2>&1 || true
fuse_pid=''
on umount /etc/fuse.conf && fuse_conf_bound=''
cp "$W/helper.toml.orig" "$TB/etc/sw-pool/helper.toml"

# --- an EROFS pool: the kernel through the helper, or a clear refusal without it
"$SW" init -q --name t76erofs --version 1.0 "$W/etree" >/dev/null
mkdir -p "$W/etree/install/hello/1.0/bin"
cp "$W/tree/install/hello/1.0/bin/hello" "$W/etree/install/hello/1.0/bin/hello"
"$SW" build -q --format erofs "$E/erofs.pool" "$W/etree"
"$SW" sign -q --key "$W/site.pem" "$E/erofs.pool"
chmod a+r "$E/erofs.pool"
rc=0; out=$(as1 "${SWENV[@]}" "$SW" load "$S/erofs.pool" 2>&1) || rc=$?
assert_eq "an EROFS pool loads through the helper" 0 "$rc${rc/#0/}"
emp=$TB/local/root/site/t76erofs/1.0
assert_eq "it is a kernel EROFS mount" 1 "$(on awk -v p="$emp" '$5 == p && / - erofs \/dev\/loop/' /proc/self/mountinfo | wc -l)"
assert_eq "its program runs from it" "hello from a kernel-mounted pool" "$(as1 "$emp/install/hello/1.0/bin/hello" 2>&1)"
assert_cmd "it unloads" as1 "$SW" unload t76erofs/1.0
rc=0; out=$(as1 env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$SW" load -m "$TB/local/t76-erofs-fuse-$$" "$S/erofs.pool" 2>&1) || rc=$?
assert_match "without the helper, an EROFS pool is refused, saying why" "^3 .*only the kernel mounts.*mount_helper" "$rc $out"
on rm -rf "$TB/local/t76-erofs-fuse-$$" >/dev/null 2>&1 || true
finish
