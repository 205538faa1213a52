#!/usr/bin/env bash
# A name another user took first never stops the rightful user. On node2, swuser2 creates
# /tmp/sw-pool-<uid of swuser> (the record store and mount root of a job without XDG_RUNTIME_DIR)
# and <local>/sw-pool-<uid> (the node-local cache) before swuser ever runs sw-pool there. Then
# swuser's mount and load still work (in private directories beside the squatted names), `list`
# finds them, the epilog of the job cleans everything, and the squatted names stay untouched.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
uid=$(id -u "$TB_USER")
node=node2
W=$TB/scratch/t45-$$
JOB=4545
on() { "$TESTBED/exec" "$node" "$@"; }
as_swuser() { on runuser -u "$TB_USER" -- env -u XDG_RUNTIME_DIR SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= LOCAL_TMPDIR="$TB/local" SLURM_JOB_ID=$JOB "$@"; }
cleanup() {
  as_swuser "$SW" cleanup --all --kill >/dev/null 2>&1 || true
  on sh -c "rm -rf /tmp/sw-pool-$uid /tmp/sw-pool-$uid.* $TB/local/sw-pool-$uid $TB/local/sw-pool-$uid.*" >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT
cleanup
mkdir -p "$W/tree/install/hello/1.0/bin" "$W/libexec/sw-pool"
printf 'name = "demo"\nversion = "1.0"\n' > "$W/tree/pool.toml"
printf '#!/bin/sh\necho hello\n' > "$W/tree/install/hello/1.0/bin/hello"
chmod 755 "$W/tree/install/hello/1.0/bin/hello"
"$SW" build -q --gen-modulefiles "$W/demo.sqfs" "$W/tree" || fail "build the test pool" "sw-pool build failed"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/"
ln -sf ../../sw-pool "$W/libexec/sw-pool/epilog"
chmod -R a+rX "$W"

# the squats, by another user
on runuser -u "$TB_USER2" -- mkdir -p "/tmp/sw-pool-$uid" "$TB/local/sw-pool-$uid"
assert_eq "swuser2 squats /tmp/sw-pool-$uid on $node" "$TB_USER2" "$(on stat -c %U "/tmp/sw-pool-$uid")"

# swuser: mount (default mount point) and load (node-local cache) still work
rc=0; out=$(as_swuser "$W/sw-pool" mount "$W/demo.sqfs" 2>&1) || rc=$?
assert_eq "mount works although /tmp/sw-pool-$uid is squatted" 0 "$rc"
[[ $rc == 0 ]] || printf "  mount: %s\n" "$out"
assert_match "... it mounted in a private directory beside the squatted name" "/tmp/sw-pool-$uid\.[0-9a-f]+/mnt/demo/1.0" "$out"
assert_match "... and said so (logged)" "someone else took the name" "$out"
rc=0; out=$(as_swuser "$W/sw-pool" load --shell sh -m "$TB/local/t45mnt" "$W/demo.sqfs" 2>&1) || rc=$?
assert_eq "load works although the cache name is squatted too" 0 "$rc"
[[ $rc == 0 ]] || printf "  load: %s\n" "$out"
cached=$(on sh -c "ls $TB/local/sw-pool-$uid.*/cache/ 2>/dev/null | grep -c '\.pool\$'" || true)
assert_eq "... the pool is cached in the user's private cache directory" 1 "$cached"
list=$(as_swuser "$W/sw-pool" list 2>&1 || true)
assert_eq "list finds both mounts of the job" 2 "$(grep -c "demo/1.0" <<< "$list" || true)"

# the epilog (root) of the job cleans everything, in the fallback store too
rc=0; on env SLURM_JOB_ID=$JOB SLURM_JOB_UID="$uid" SLURM_JOB_USER="$TB_USER" "$W/libexec/sw-pool/epilog" || rc=$?
assert_eq "the epilog exits 0" 0 "$rc"
m=$(on awk -v u="user_id=$uid" '$3 ~ /^fuse/ && $4 ~ u' /proc/self/mounts | wc -l)
assert_eq "after the epilog: no FUSE mount of the user on $node" 0 "$m"
r=$(on sh -c "ls /tmp/sw-pool-$uid.*/mounts/ 2>/dev/null | grep -c '\.json\$'" || true)
assert_eq "after the epilog: no mount record left" 0 "${r:-0}"
assert_eq "the squatted name is untouched" "$TB_USER2" "$(on stat -c %U "/tmp/sw-pool-$uid")"
finish
