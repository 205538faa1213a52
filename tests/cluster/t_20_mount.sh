#!/usr/bin/env bash
# sw-pool mount/umount/list/env on the virtual cluster, as the unprivileged user (non-root FUSE with
# the nodes' 0666 /dev/fuse): squashfs (sw-pool's tree server; squashfuse_ll when configured) and
# ext2 (fuse2fs) pools, records and mounts private to each node, shared refcounted mounts, a stale
# mount cleaned by umount --force, and the pool's modules through `sw-pool env` and
# `module load pool/<name>/<version>` with the real Lmod on all four nodes.  Leaves no mount, record or FUSE process behind.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
uid=$(id -u "$TB_USER")
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }

# everything this test makes lives under $W (shared scratch: the same path on every node)
W=$TB/scratch/t20-$$
cleanup() {
  # unmount whatever this test left mounted on any node, by mount point, then remove $W
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "awk '\$2 ~ \"^/tmp/sw-pool-$uid/\" && \$3 ~ /^fuse/ {print \$2}' /proc/self/mounts | while read -r m; do fusermount3 -u -z \"\$m\"; done; rm -rf /tmp/sw-pool-$uid" >/dev/null 2>&1 || true
  done
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/bin" "$W/pools/demo" "$W/mf/pool/demo" "$W/tree/install/hello/1.0/bin" "$W/tree/source"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
cp "$REPO/etc/profile.d/sw-pool.sh" "$W/sw-pool.sh"
cp "$REPO/etc/lmod/pool-modulefile.lua" "$W/mf/pool/demo/1.0.lua"
"$W/bin/sw-pool" init --name demo --version 1.0 "$W/tree/x" >/dev/null
cp "$W/tree/x/pool.toml" "$W/tree/"
rm -rf "$W/tree/x"
printf '#!/bin/sh\necho "hello from $(hostname)"\n' > "$W/tree/install/hello/1.0/bin/hello"
chmod 755 "$W/tree/install/hello/1.0/bin/hello"
mkdir -p "$W/tree/install/cfact/2.0/bin"
printf '#include <stdio.h>\nint main(void){long f=1;for(int i=2;i<=6;i++)f*=i;printf("%%ld\\n",f);return 0;}\n' > "$W/tree/source/cfact.c"
cc -O2 -o "$W/tree/install/cfact/2.0/bin/cfact" "$W/tree/source/cfact.c"
assert_cmd "build a squashfs pool" "$W/bin/sw-pool" build -q --gen-modulefiles "$W/pools/demo/1.0.sqfs" "$W/tree"
assert_cmd "build an ext2 pool (the paper's format)" "$W/bin/sw-pool" build -q --name paper --version 0.5 "$W/pools/paper-0.5.ext2" "$W/tree"
chmod -R a+rX "$W"

# run a script as the user on one node (or -N4), with sw-pool on PATH and the pools findable
on() {  # on NODE|all SCRIPT
  local spec=(-N1 -w "$1"); [[ $1 == all ]] && spec=(-N4); shift
  as_user srun -Q "${spec[@]}" --chdir=/tmp env -u XDG_RUNTIME_DIR -u SW_POOL_STATE_DIR -u MODULEPATH \
    PATH="$W/bin:/usr/bin:/bin" SW_POOL_PATH="$W/pools" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= \
    bash -c "$1" 2>&1
}
MP=/tmp/sw-pool-$uid/mnt/demo/1.0

out=$(on node1 'sw-pool mount demo/1.0 && cat /tmp/sw-pool-'"$uid"'/mnt/demo/1.0/pool.toml | head -2 && sw-pool list && awk -v m='"$MP"' '\''$2 == m {print $3, $4}'\'' /proc/self/mounts')
assert_match "$TB_USER: mount demo/1.0 on node1 (sw-pool's tree server, non-root)" "mounted demo/1.0 \(squashfs, sw-pool-serve pid [0-9]+\) at $MP" "$out"
assert_match "$TB_USER: files readable" 'name = "demo"' "$out"
assert_match "$TB_USER: list shows it ok with refcount 1" "ok +demo/1.0 +[0-9a-f]{12} +1 +[0-9]+ +$MP" "$out"
assert_match "$TB_USER: ro,nosuid,nodev, user_id=$uid" "fuse.sw-pool ro,nosuid,nodev" "$out"
# squashfuse_ll stays the fallback a config names
out=$(on node3 'mkdir -p /tmp/t20-sq && SW_POOL_FUSE_READER=squashfuse_ll sw-pool mount demo/1.0 /tmp/t20-sq && grep -c "^name" /tmp/t20-sq/pool.toml && awk '\''$2 == "/tmp/t20-sq" {print $3}'\'' /proc/self/mounts; sw-pool umount /tmp/t20-sq && rmdir /tmp/t20-sq')
assert_match "$TB_USER: fuse_reader = squashfuse_ll mounts with squashfuse_ll, reads, unmounts" "squashfuse_ll pid [0-9]+.*1 fuse.squashfuse_ll unmounted" "$(tr '\n' ' ' <<< "$out")"
out=$(on node1 "awk -v m=$MP '\$2 == m' /proc/self/mounts | grep -c user_id=$uid")
assert_eq "$TB_USER: the mount outlives the job step (still there in the next step)" 1 "$out"
out=$(on node2 'sw-pool list; awk -v m='"$MP"' '\''$2 == m'\'' /proc/self/mounts | wc -l')
assert_match "node2: no record and no mount of node1's pool" "^no mounts on node2"$'\n'"0$" "$out"
assert_eq "root namespace: node1's mount invisible" 0 "$(awk -v m="$MP" '$2 == m' /proc/self/mounts | wc -l)"

# the same pool again on node1: one FUSE mount, refcount 2; a mount on node2 is node2's own
out=$(on node1 'SLURM_JOB_ID=77 sw-pool mount demo/1.0; sw-pool list --json | grep -c "\"job_id\""; awk -v m='"$MP"' '\''$2 == m'\'' /proc/self/mounts | wc -l')
out=$(grep -v '^sw-pool: warning: ' <<< "$out")   # the unsigned test pool is warned about (trust policy)
assert_match "node1: second mount adds a reference (one FUSE mount, 2 refs)" "reference added \(now 2\)"$'\n'"2"$'\n'"1$" "$out"
out=$(on node2 'sw-pool mount -q demo/1.0 && sw-pool list | grep -c demo/1.0')
assert_eq "node2: its own mount and record" 1 "$out"
out=$(on node1 "sw-pool umount $MP; sw-pool umount $MP; sw-pool list")
assert_match "node1: first umount keeps it, second unmounts" "still used \(1 reference left\).*unmounted demo/1.0.*no mounts on node1" "$(tr '\n' ' ' <<< "$out")"
out=$(on node2 "sw-pool list | grep -c demo/1.0; sw-pool umount $MP")
assert_match "node2: its mount survived node1's unmount" "^1"$'\n'"unmounted" "$out"

# two users on one node: root (through testbed/exec, state in /run/sw-pool, which the testbed's
# nodes share with the host -- records are keyed by node) and the user, each with their own mount
root_on() {  # root_on NODE SCRIPT
  "$TESTBED/exec" "$1" env -u SW_POOL_STATE_DIR -u SW_POOL_MOUNT PATH="$W/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    SW_POOL_PATH="$W/pools" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= bash -c "$2" 2>&1
}
RMP=/run/sw-pool/mnt/demo/1.0
out=$(on node1 'sw-pool mount -q demo/1.0 && echo user-ok')
out+=$(root_on node1 "sw-pool mount -q demo/1.0 && echo root-ok; awk '(\$3 ~ /^fuse.sw-pool/ || \$1 == \"sw-pool\") && \$2 ~ /demo\/1.0\$/ {print \$2}' /proc/self/mounts | sort | tr '\n' ' '")
assert_eq "node1: root and $TB_USER each mount demo/1.0 (two FUSE mounts)" "user-okroot-ok"$'\n'"$RMP $MP " "$out"
out=$(root_on node2 "sw-pool list")
assert_eq "node2: root's list does not show node1's record in the shared /run/sw-pool" "no mounts on node2" "$out"
out=$(root_on node1 "sw-pool umount $RMP && sw-pool list")
assert_match "node1: root unmounts its own" "unmounted demo/1.0.*no mounts on node1" "$(tr '\n' ' ' <<< "$out")"
out=$(on node1 "grep '^name' $MP/pool.toml; sw-pool umount $MP")
assert_match "node1: $TB_USER's mount survived root's unmount" '^name = "demo"'$'\n''unmounted' "$out"

# ext2 through fuse2fs, as the user
out=$(on node3 "mkdir -p /tmp/t20-ext && sw-pool mount $W/pools/paper-0.5.ext2 /tmp/t20-ext && /tmp/t20-ext/install/cfact/2.0/bin/cfact && (echo x > /tmp/t20-ext/new || echo write-refused) && sw-pool umount /tmp/t20-ext && rmdir /tmp/t20-ext")
assert_match "$TB_USER: ext2 pool through fuse2fs on node3: runs, read-only, unmounts" "mounted paper/0.5 \(ext2, fuse2fs pid [0-9]+\).*720.*write-refused.*unmounted paper/0.5" "$(tr '\n' ' ' <<< "$out")"

# a killed FUSE helper: list reports the stale mount, umount --force cleans it
out=$(on node4 'sw-pool mount -q demo/1.0 && pid=$(sw-pool list --json | sed -n "s/.*\"helper_pid\": \([0-9]*\).*/\1/p") && kill -KILL "$pid" && sleep 0.3 && sw-pool list; sw-pool mount demo/1.0; echo "rc=$?"; sw-pool umount --force '"$MP"'; sw-pool list')
assert_match "node4: killed helper -> list says stale" "stale +demo/1.0" "$out"
assert_match "node4: mounting over a stale mount is refused with the fix" "stale mount.*umount --force" "$(tr '\n' ' ' <<< "$out")"
assert_match "node4: umount --force cleans it" "it was stale.*no mounts on node4" "$(tr '\n' ' ' <<< "$out")"

# modules through the env output (eval), on node1
out=$(on node1 'source /usr/share/lmod/lmod/init/bash; export MODULEPATH=; mp=$(sw-pool mount --print-mountpoint demo/1.0); eval "$(sw-pool env --shell sh "$mp")"; module -t avail 2>&1; module load hello/1.0 cfact/2.0; hello; cfact; module purge; eval "$(sw-pool env --shell sh --unload "$mp")"; echo "MODULEPATH=[$MODULEPATH]"; sw-pool umount -q "$mp"')
assert_match "node1: env output puts the pool's modules in module avail" "cfact/2.0.*hello/1.0" "$(tr '\n' ' ' <<< "$out")"
assert_match "node1: module load runs the pool's programs" "hello from node1"$'\n'"720" "$out"
assert_match "node1: unload leaves no MODULEPATH entry" "MODULEPATH=\[\]" "$out"

# module load pool/demo/1.0 (the pool modulefile) on all four nodes, with the profile function
out=$(on all 'source /usr/share/lmod/lmod/init/bash; source '"$W"'/sw-pool.sh; export MODULEPATH='"$W"'/mf; module load pool/demo/1.0 && module load hello/1.0 && hello && module spider cfact 2>&1 | grep -c "pool/demo/1.0"; module unload pool/demo/1.0; echo "$(hostname) MP=$MODULEPATH"; sw-pool list')
for n in "${nodes[@]:0:4}"; do
  assert_match "$n: module load pool/demo/1.0 -> hello runs" "hello from $n" "$out"
  assert_match "$n: unload restores MODULEPATH" "$n MP=$W/mf"$'\n' "$out"
  assert_match "$n: unload unmounts" "no mounts on $n" "$out"
done

# nothing left: no FUSE mount of the user, no record, no helper process on any node
for n in "${nodes[@]:0:4}"; do
  left=$("$TESTBED/exec" "$n" sh -c "grep -c 'user_id=$uid' /proc/self/mountinfo; ls /tmp/sw-pool-$uid/mounts 2>/dev/null | wc -l" | tr '\n' ' ')
  assert_eq "$n: no mount and no record left" "0 0 " "$left"
  assert_eq "$n: no root mount left" 0 "$("$TESTBED/exec" "$n" grep -c "$RMP" /proc/self/mountinfo || true)"
done
# (zombies do not count: orphans are reaped lazily by PID 1 here)
left=$(ps -u "$TB_USER" -o stat=,pid=,args= | awk '$1 !~ /^Z/ && ($3 ~ /squashfuse_ll|fuse2fs|sw-pool-serve/)')
assert_eq "no sw-pool-serve/squashfuse_ll/fuse2fs process of $TB_USER left" "" "$left"
finish
