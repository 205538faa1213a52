#!/usr/bin/env bash
# Writable user images on the virtual cluster (issue 31): an image on the shared storage (sshfs,
# where flock is node-local; its coherent mount $TB/coherent, see testbed/up); two nodes race `sw-pool mount --rw`
# on it 100 times and exactly one wins each round (the lease's link(2) lock); a read-only mount on
# one node refuses a writer on another and the reverse; what one node wrote is read on another
# after its unmount; a holder whose job ended is taken over; a job killed with SIGKILL while it
# writes (the fuse2fs it started survives a kill under proctrack/linuxproc: the Slurm epilog
# unmounts it, and the job stays in squeue until then, so no other node may write before) leaves
# what it synced, the lease to the next writer and a clean image; where the job's fuse2fs dies with
# it and no epilog runs, the next writer takes the killed job's lease over (its job gone per Slurm);
# the image is fsck-clean at the end.
# Run as root on the nodes: the testbed's sshfs logs in to the storage server as root, so a file a
# user creates there belongs to root and the user cannot open it for writing again (a parallel file
# system keeps the creator's ownership; the rootless path is tested in crates/sw-pool/tests/userimage.rs).
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 2 ]] || { fail "2 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (make build)"; finish; }
uid=0
W=$TB/scratch/t75-$$
E=$TB/export/t75-$$          # the storage server's disk; nodes see it as $TB/shared/t75-$$
S=$TB/coherent/t75-$$
n1=${nodes[0]} n2=${nodes[1]}
on() { local n=$1; shift; "$TESTBED/exec" "$n" env SLURM_CONF="$SLURM_CONF" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$TB/local/t75-state-$n" "$@"; }
HOOK=$TB/etc/epilog.d/50-t75-sw-pool
cleanup() {
  rm -f "$HOOK"
  for n in "$n1" "$n2"; do
    "$TESTBED/exec" "$n" sh -c "awk '\$3 ~ /^fuse/ && \$2 ~ \"^$TB/local/t75\" {print \$2}' /proc/self/mounts | while read -r m; do fusermount3 -u -z \"\$m\"; done; rm -rf $TB/local/t75-$uid $TB/local/t75-state-$n" >/dev/null 2>&1 || true
  done
  rm -rf "$W" "$E"
}
trap cleanup EXIT
cleanup
mkdir -p "$W/bin" "$E/src"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
SW=$W/bin/sw-pool
for i in $(seq 1 300); do echo "file $i" > "$E/src/f$i"; done
chmod -R a+rX "$W"
for n in "$n1" "$n2"; do "$TESTBED/exec" "$n" install -d -m 700 "$TB/local/t75-$uid/a" "$TB/local/t75-$uid/b" "$TB/local/t75-state-$n"; done
M=$TB/local/t75-$uid

rc=0; out=$(on "$n1" "$SW" image create --small-files "$S/data.img" "$S/src" 2>&1) || rc=$?
assert_eq "image create on shared storage (filled from a directory)" 0 "$rc"
[[ $rc == 0 ]] || { echo "  $out"; finish; }

# --- 100 rounds: both nodes ask for --rw at the same moment; exactly one wins
bad=0 wins1=0 wins2=0
for round in $(seq 1 100); do
  r1=$W/r1 r2=$W/r2
  ( c=0; on "$n1" "$SW" mount -q --rw "$S/data.img" "$M/a" >/dev/null 2>"$r1.err" || c=$?; echo "$c" > "$r1" ) &
  ( c=0; on "$n2" "$SW" mount -q --rw "$S/data.img" "$M/a" >/dev/null 2>"$r2.err" || c=$?; echo "$c" > "$r2" ) &
  wait
  c1=$(cat "$r1") c2=$(cat "$r2")
  if [[ $c1 == 0 && $c2 != 0 ]]; then
    wins1=$((wins1 + 1)); on "$n1" "$SW" umount -q "$M/a" || bad=$((bad + 1))
    grep -q "is in use: read-write on $n1" "$r2.err" || { bad=$((bad + 1)); echo "  round $round: $(cat "$r2.err")"; }
  elif [[ $c2 == 0 && $c1 != 0 ]]; then
    wins2=$((wins2 + 1)); on "$n2" "$SW" umount -q "$M/a" || bad=$((bad + 1))
    grep -q "is in use: read-write on $n2" "$r1.err" || { bad=$((bad + 1)); echo "  round $round: $(cat "$r1.err")"; }
  else
    bad=$((bad + 1)); echo "  round $round: node1 exit $c1, node2 exit $c2: $(cat "$r1.err" "$r2.err")"
    on "$n1" "$SW" umount -q "$M/a" >/dev/null 2>&1; on "$n2" "$SW" umount -q "$M/a" >/dev/null 2>&1
  fi
done
assert_eq "100 rounds of two nodes racing mount --rw: exactly one wins each (node1 $wins1, node2 $wins2)" 0 "$bad"
assert_eq "no lease left after the rounds" 0 "$([[ -e $E/data.img.lease ]] && echo 1 || echo 0)"

# --- a writer on one node, readers on the other
on "$n1" "$SW" mount -q --rw "$S/data.img" "$M/a"
on "$n1" sh -c "echo 'from $n1' > $M/a/note && sync -f $M/a/note"
rc=0; out=$(on "$n2" "$SW" mount "$S/data.img" "$M/b" 2>&1) || rc=$?
assert_eq "$n2: read-only mount refused while $n1 writes (exit 3)" 3 "$rc"
assert_match "... naming the holder" "read-write on $n1" "$out"
on "$n1" "$SW" umount -q "$M/a"
on "$n2" "$SW" mount -q "$S/data.img" "$M/b"
assert_eq "$n2 reads what $n1 wrote, after its unmount" "from $n1" "$(on "$n2" cat "$M/b/note" 2>&1)"
rc=0; out=$(on "$n1" "$SW" mount --rw "$S/data.img" "$M/a" 2>&1) || rc=$?
assert_eq "$n1: mount --rw refused while $n2 reads (exit 3)" 3 "$rc"
assert_match "... naming the reader" "read-only on $n2" "$out"
on "$n2" "$SW" umount -q "$M/b"

# --- a holder whose Slurm job ended is taken over (the lease names the job; squeue forgot it)
python3 - "$E/data.img.lease" "$n2" <<'PY'
import json, sys
json.dump({"schema": 1, "holders": [{"mode": "rw", "host": sys.argv[2], "boot_id": "x", "pid": 999999,
  "uid": 0, "user": "someone", "job": "999999", "mount_point": "/gone", "since": 0}]}, open(sys.argv[1], "w"))
PY
rc=0; out=$(on "$n1" "$SW" mount --rw "$S/data.img" "$M/a" 2>&1) || rc=$?
assert_eq "a lease held by an ended job (999999) is taken over" 0 "$rc"
assert_match "... and the user is told" "took over the lease.*job 999999 has ended" "$out"
on "$n1" "$SW" umount -q "$M/a"
# --- a job killed with SIGKILL while it writes; the sw-pool epilog as a site installs it
printf '#!/bin/sh\nSW_POOL_SYSTEM_CONFIG= exec %s -q slurm epilog\n' "$SW" > "$HOOK"
chmod 755 "$HOOK"
cat > "$W/kill.sh" <<EOS
#!/bin/bash
export SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
$SW mount -q --rw $S/data.img $M/a || exit 1
mkdir -p $M/a/k && for i in \$(seq 1 200); do echo "synced \$i" > $M/a/k/s\$i; done
sync -f $M/a/k/s200
touch $W/kill.ready
i=0; while :; do i=\$((i + 1)); echo "unsynced \$i" > $M/a/k/u\$((i % 500)); done
EOS
chmod 755 "$W/kill.sh"
jid=$(sbatch --parsable -w "$n1" -N1 -o "$W/kill.out" --chdir=/ "$W/kill.sh")
wait_for 600 test -e "$W/kill.ready"
assert_eq "a job on $n1 writes into the image (read-write under its lease)" 1 "$(grep -c '"job": "'"$jid"'"' "$E/data.img.lease" 2>/dev/null || echo 0)"
rc=0; out=$(on "$n2" "$SW" mount --rw "$S/data.img" "$M/a" 2>&1) || rc=$?
assert_eq "$n2: mount --rw refused while the job writes (exit 3)" 3 "$rc"
scancel --full --signal=KILL "$jid"
wait_job "$jid" 600
assert_eq "after SIGKILL and the epilog: nothing of the job mounted on $n1" 0 "$("$TESTBED/exec" "$n1" sh -c "grep -c ' $M/a ' /proc/self/mounts || true")"
rc=0; out=$(on "$n2" "$SW" mount --rw "$S/data.img" "$M/a" 2>&1) || rc=$?
assert_eq "$n2: mount --rw after the killed job (lease given back or taken over)" 0 "$rc"
assert_eq "... every file the killed job synced is there" 200 "$(on "$n2" sh -c "grep -l '^synced ' $M/a/k/s* 2>/dev/null | wc -l")"
on "$n2" "$SW" umount -q "$M/a"

# --- the same where everything of the job dies with it (a site whose process tracking kills the
# job's fuse2fs too) and no epilog runs: the lease stays, naming the killed job; the next writer
# finds the job gone (Slurm) and takes the lease over, the image checked and repaired first
rm -f "$HOOK" "$W/kill.ready"
jid=$(sbatch --parsable -w "$n1" -N1 -o "$W/kill2.out" --chdir=/ "$W/kill.sh")
wait_for 600 test -e "$W/kill.ready"
fpid=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['holders'][0]['pid'])" "$E/data.img.lease" 2>/dev/null || echo 0)
scancel --full --signal=KILL "$jid"
wait_job "$jid" 600
# the job's fuse2fs (the lease names it; the job started it) dies with the job, as under cgroups
[[ $fpid -gt 1 ]] && "$TESTBED/exec" "$n1" kill -KILL "$fpid" 2>/dev/null
"$TESTBED/exec" "$n1" sh -c "fusermount3 -u -z $M/a" >/dev/null 2>&1 || true
assert_match "no epilog: the lease still names the killed job" "\"job\": \"$jid\"" "$(cat "$E/data.img.lease" 2>/dev/null)"
rc=0; out=$(on "$n2" "$SW" mount --rw "$S/data.img" "$M/a" 2>&1) || rc=$?
assert_eq "$n2: mount --rw takes the lease of the killed job over" 0 "$rc"
assert_match "... and says so" "took over the lease.*job $jid has ended" "$out"
assert_eq "... every file the killed job synced is there" 200 "$(on "$n2" sh -c "grep -l '^synced ' $M/a/k/s* 2>/dev/null | wc -l")"
on "$n2" "$SW" umount -q "$M/a"
# what the killed job left on $n1 (its record in root's default state), as a Prolog would
"$TESTBED/exec" "$n1" env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$SW" cleanup -q --stale >/dev/null 2>&1 || true
rc=0; out=$(on "$n1" "$SW" image check "$S/data.img" 2>&1) || rc=$?
assert_eq "the image is fsck-clean at the end" 0 "$rc"
assert_eq "nothing mounted on $n1 or $n2" 0 "$(for n in "$n1" "$n2"; do "$TESTBED/exec" "$n" sh -c "grep -c ' $M/' /proc/self/mounts || true"; done | awk '{s += $1} END {print s + 0}')"
finish
