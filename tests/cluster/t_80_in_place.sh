#!/usr/bin/env bash
# The verifying chunk server (issue 30), as the unprivileged test user:
# - `sw-pool mount --in-place POOL DIR` on node1: no copy; sha256 of every file through the mount
#   equals the source; shared storage sends about the pool's data once; `umount` leaves no server,
#   no mount, no record;
# - a pool changed on shared storage after it was built (one byte in one chunk): reading what lies
#   in that chunk is EIO and the mount's log names the pool, the chunk, its offset and the node; every
#   other file still reads right;
# - `kill -9` of the server: reads fail with EIO at once (no hang), `list` says stale, `umount`
#   cleans everything;
# - a batch job on 4 nodes whose node-local cache has no room for the pool: `load` serves it in
#   place on every node with a warning, the job's tasks read it right; the job ends while reads are
#   in flight: the epilog leaves no server, mount or record on any node.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
lazy_fixture t80
MP=$TB/local/t80mnt-$uid     # node-local
ST=$TB/local/t80state-$uid   # node-local record store of the interactive part (its logs)
SMALL=$TB/local/t80small

# --- a pool of 8 x 4 MiB random files and 200 small ones, on shared storage
mkdir -p "$W/tree/small"
for i in 1 2 3 4 5 6 7 8; do head -c 4M /dev/urandom > "$W/tree/data/f$i"; done
for i in $(seq 200); do echo "small file $i $RANDOM" > "$W/tree/small/s$i"; done
want=$(cd "$W/tree" && find . -type f | sort | xargs sha256sum)
if out=$("$SW" build -q -s 48MB "$E/t80.pool" "$W/tree" 2>&1); then
  pass "built a 33 MB squashfs pool on shared storage"
else
  fail "built a 33 MB squashfs pool on shared storage" "$(tail -n 5 <<< "$out")"
  finish
fi
chmod 644 "$E/t80.pool"
data=$("$SW" inspect --json "$E/t80.pool" | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifest"]["data_size"])' 2>/dev/null || echo 0)
U=(env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$ST" SW_POOL_SHELL=sh)
on1() { "$TESTBED/exec" node1 runuser -u "$TB_USER" -- "${U[@]}" "$@"; }
sums() { on1 sh -c "cd $MP && find . -type f | sort | xargs sha256sum" 2>&1 || true; }
left() {  # what is left of the user's in-place mounts on node1: servers, mounts, records
  "$TESTBED/exec" node1 sh -c "
    echo servers=\$(pgrep -u $uid -f '^$W/bin/sw-pool-serve' | grep -c .)
    echo mounts=\$(awk -v m='$MP' -v s='$ST/' '\$2 == m || index(\$2, s) == 1' /proc/self/mounts | grep -c .)
    echo records=\$(ls $ST/mounts/*.json 2>/dev/null | grep -c .)" | tr '\n' ' ' | sed 's/ $//'
}
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# --- 1. mount --in-place on node1: right bytes, storage read about once, nothing left after umount
on1 mkdir -p "$MP"
drop
"$TESTBED/storage-bytes" --mark >/dev/null
rc=0; out=$(on1 "$SW" mount --in-place "$S/t80.pool" "$MP" 2>&1) || rc=$?
assert_eq "mount --in-place of a pool on shared storage" 0 "$rc"
assert_match "... says it is served in place, each chunk verified, nothing copied" "served in place from .*nothing copied" "$out"
[[ $rc == 0 ]] || printf '  %s\n' "$out"
got=$(sums)
assert_eq "sha256 of every file through the in-place mount equals the source (208 files)" "$want" "$got"
served=$("$TESTBED/storage-bytes" --since-mark)
assert_le "... shared storage sent about the pool's data once ($served bytes for $data)" "$(calc "$served / ($data + 1)")" 1.15 "x data"
lst=$(on1 "$SW" list 2>&1 || true)
assert_match "list: the in-place mount is ok" "ok +t80/0 .* $MP" "$lst"
assert_cmd "umount" on1 "$SW" umount "$MP"
assert_eq "... no server, no mount (the pool's or the server's), no record left" "servers=0 mounts=0 records=0" "$(left)"

# --- 2. one byte changed on shared storage after the build: EIO for that chunk, logged; the rest reads
cp "$E/t80.pool" "$E/t80bad.pool"
off=$((8 * 1048576 + 4321))
printf '\x5a' | dd of="$E/t80bad.pool" bs=1 seek=$off conv=notrunc status=none
orig=$(dd if="$E/t80.pool" bs=1 skip=$off count=1 status=none | od -An -tx1 | tr -d ' ')
[[ $orig == 5a ]] && printf '\x5b' | dd of="$E/t80bad.pool" bs=1 seek=$off conv=notrunc status=none
chmod 644 "$E/t80bad.pool"
drop
rc=0; out=$(on1 "$SW" mount --in-place "$S/t80bad.pool" "$MP" 2>&1) || rc=$?
assert_eq "mount --in-place of the changed pool (its manifest is intact)" 0 "$rc"
got=$(sums)
eio=$(grep -c "Input/output error" <<< "$got" || true)
okk=$(comm -12 <(sort <<< "$want") <(grep -v "Input/output error" <<< "$got" | grep -E '^[0-9a-f]{64} ' | sort) | grep -c . || true)
if [[ $eio -ge 1 && $eio -le 2 && $((okk + eio)) == 208 ]]; then
  pass "the file(s) in the changed chunk read as EIO ($eio), the other $okk files read right"
else
  fail "the file(s) in the changed chunk read as EIO, the others right" "eio=$eio ok=$okk: $(grep -v '^[0-9a-f]\{64\} ' <<< "$got" | head -3)"
fi
log=$("$TESTBED/exec" node1 sh -c "cat $ST/mounts/*.log" 2>/dev/null || true)
assert_match "the mount's log names pool, chunk, offset and node" "t80/0: chunk 8 at byte offset 8388608 read from $S/t80bad.pool does not match the pool's signed manifest \(node node1\)" "$log"
assert_cmd "umount of the changed pool" on1 "$SW" umount "$MP"

# --- 3. kill -9 of the server: EIO at once, list says stale, umount cleans up
drop
rc=0; out=$(on1 "$SW" mount --in-place "$S/t80.pool" "$MP" 2>&1) || rc=$?
assert_eq "mount --in-place again" 0 "$rc"
spid=$("$TESTBED/exec" node1 pgrep -u "$uid" -f "^$W/bin/sw-pool-serve" | head -1)
"$TESTBED/exec" node1 kill -9 "$spid"
t0=$(now)
rc=0; on1 timeout 10 cat "$MP/data/f5" > /dev/null 2>&1 || rc=$?
assert_eq "a read after the server was killed fails (EIO), not a hang (timeout 10 s)" 1 "$rc"
assert_le "... within 2 s" "$(elapsed "$t0")" 2 s
lst=$(on1 "$SW" list 2>&1 || true)
assert_match "list: the mount is stale" "stale +t80/0" "$lst"
on1 "$SW" umount "$MP" >/dev/null 2>&1 || on1 "$SW" cleanup --stale >/dev/null 2>&1 || true
assert_eq "umount of the stale mount: no server, no mount (the server's dead one too), no record" "servers=0 mounts=0 records=0" "$(left)"

# --- 4. a batch job on 4 nodes with no room for the copy: served in place, with a warning
# (the Slurm epilog as an admin installs it: README "For admins: Slurm")
install_epilog
for n in "${nodes[@]:0:4}"; do
  "$TESTBED/exec" "$n" sh -c "mkdir -p $SMALL && mount -t tmpfs -o size=2m,mode=1777 tmpfs $SMALL"
done
cat > "$W/job.sh" <<EOS
#!/bin/bash
export SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_SHELL=sh
eval "\$($SW load --cache-dir $SMALL -m $TB/local/t80job $S/t80.pool)" || exit 3
srun -N4 --ntasks-per-node=1 sh -c 'cd $TB/local/t80job && echo "\$(hostname) \$(find . -type f | sort | xargs sha256sum | sha256sum)"'
# the job ends while every node still reads the pool
srun -N4 --ntasks-per-node=1 sh -c 'while :; do cat $TB/local/t80job/data/* > /dev/null; done' &
sleep 2
exit 0
EOS
chmod 755 "$W/job.sh"
one=$(sha256sum <<< "$want" | cut -d' ' -f1)
rc=0; out=$(as_user sbatch -W -N4 --chdir=/tmp -o "$W/out/job.out" "$W/job.sh" 2>&1) || rc=$?
jo=$(cat "$W/out/job.out" 2>/dev/null || true)
assert_eq "batch job on 4 nodes without room for a copy exits 0" 0 "$rc"
assert_match "... load warns: no room on 4 nodes, served in place" "no room for a copy of t80/0 on 4 node\(s\).*served in place" "$jo"
assert_eq "... every node read every file right through the in-place mount" 4 "$(grep -cE "^node[0-9] $one  -$" <<< "$jo" || true)"
[[ $rc == 0 ]] || printf '  %s\n' "$out" "$jo"
# the epilog runs on every node (up to 20 s after the job)
rest_of() { left_of_user "$TB/local/t80(job|lazy)"; }
wait_nothing_left "$TB/local/t80(job|lazy)"
assert_eq "after the job (ended while reading), the epilog left no mount, no record on any node, no server or helper" \
  "$NOTHING_LEFT" "$(rest_of)"
# --- 5. load --lazy in batch jobs on 4 nodes: every node mounts at once, nothing copied; a chunk
# comes from the node that owns it, which alone reads it from shared storage
lazy_job() {  # lazy_job NAME STEP-COMMAND: the job's output
  cat > "$W/$1.sh" <<EOS
#!/bin/bash
export SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_SHELL=sh
eval "\$($SW -v load --lazy -m $TB/local/t80lazy $S/t80.pool)" || exit 3
srun -N4 --ntasks-per-node=1 sh -c 'cd $TB/local/t80lazy && $2'
EOS
  chmod 755 "$W/$1.sh"
  as_user sbatch -W -N4 --chdir=/tmp -o "$W/out/$1.out" "$W/$1.sh" >/dev/null 2>&1 || true
  cat "$W/out/$1.out" 2>/dev/null || true
}
f3=$(sha256sum < "$W/tree/data/f3" | cut -c1-64)
drop
"$TESTBED/storage-bytes" --mark >/dev/null
jo=$(lazy_job lazy1 'echo "$(hostname) f3 $(sha256sum < data/f3 | cut -c1-64)"')
served=$("$TESTBED/storage-bytes" --since-mark)
assert_match "load --lazy in a batch job: mounted on 4 nodes, -v says so" "served on demand on 4 node\(s\)" "$jo"
assert_eq "... every node read the same 4 MiB file right" 4 "$(grep -cE "^node[0-9] f3 $f3$" <<< "$jo" || true)"
[[ $(grep -cE "^node[0-9] f3 $f3$" <<< "$jo" || true) == 4 ]] || printf '  %s\n' "$jo"
# once: the file's 5 chunks, the 8 the server reads ahead of a sequential reader and the file
# system's metadata, about 16 MiB; each node fetching its own would be at least 4 x 13 MiB
assert_le "... shared storage sent its chunks about once, not once per node ($served bytes; the file is 4 MiB, 4 nodes)" "$served" $((24 << 20)) B
wait_nothing_left "$TB/local/t80(job|lazy)"
assert_eq "... after the job: no server, mount or record left" "$NOTHING_LEFT" "$(rest_of)"
jo=$(lazy_job lazy2 'echo "$(hostname) all $(find . -type f | sort | xargs sha256sum | sha256sum)"')
assert_eq "a second lazy job: sha256 of every file on 4 nodes equals the source" 4 "$(grep -cE "^node[0-9] all $one  -$" <<< "$jo" || true)"
[[ $(grep -cE "^node[0-9] all $one  -$" <<< "$jo" || true) == 4 ]] || printf '  %s\n' "$jo"
wait_nothing_left "$TB/local/t80(job|lazy)"
assert_eq "... after the job: no server, mount or record left" "$NOTHING_LEFT" "$(rest_of)"
finish
