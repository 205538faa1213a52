#!/usr/bin/env bash
# load --lazy (issue 30), its life and what it leaves, as the unprivileged test user on 4 nodes:
# - reuse: a lazy job in which every node reads the same 6 of a pool's 20 files (30 %), then
#   `srun sw-pool unload` in that job: no mount, server or record left on any node while the job
#   still runs; a later job's full `load` of the same pool reads at most 0.72 of it from shared
#   storage (the chunks the nodes fetched are taken from their partial copies, verified), every node
#   reads every file right, and no partial copy is left;
#   a lazy job after that is served from the nodes' full entries (shared storage sends ~nothing);
# - faults: the on-demand server of one node is killed (SIGKILL) while that node reads: its next
#   read of a chunk it does not hold fails with EIO at once (no hang), the job ends, and the epilog
#   leaves no mount, record, server or helper on any node;
# - prefetch: `sw-pool cache trace` after the first lazy job writes what node1 fetched; a later lazy
#   job on empty caches with `--prefetch auto` (POOL.prefetch beside the pool) has every node hold
#   every listed chunk without reading anything; a list of another pool is refused by name;
# - the servers' step, sw-pool's own srun, runs with SLURM_PMIX_FENCE=tree.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
lazy_fixture t81
MP=$TB/local/t81lazy
C=$TB/local/t81cache
install_epilog

# --- a pool of 10 x 4 MiB random files on shared storage
for i in $(seq -w 0 19); do head -c 4M /dev/urandom > "$W/tree/data/f$i"; done
want=$(cd "$W/tree" && find . -type f | sort | xargs sha256sum)
one=$(sha256sum <<< "$want" | cut -d' ' -f1)
if out=$("$SW" build -q -s 128MB "$E/t81.pool" "$W/tree" 2>&1); then
  pass "built an 80 MiB squashfs pool on shared storage"
else
  fail "built an 80 MiB squashfs pool on shared storage" "$(tail -n 5 <<< "$out")"
  finish
fi
chmod 644 "$E/t81.pool"
size=$(stat -c %s "$E/t81.pool")
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
job() {  # job NAME BODY: run BODY as a batch job on 4 nodes; its output
  { echo '#!/bin/bash'
    echo "export SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_SHELL=sh"
    echo "srun -N4 --ntasks-per-node=1 mkdir -p $C"
    echo "$2"; } > "$W/$1.sh"
  chmod 755 "$W/$1.sh"
  as_user sbatch -W -N4 --chdir=/tmp -o "$W/out/$1.out" "$W/$1.sh" >/dev/null 2>&1 || true
  cat "$W/out/$1.out" 2>/dev/null || true
}
rest_of() { left_of_user "$MP"; }
nothing=$NOTHING_LEFT
chunks() { python3 -c '
import sys
s = set()
for l in sys.stdin.read().splitlines()[1:]:
    a, _, b = l.partition("-")
    s.update(range(int(a), int(b or a) + 1))
print(" ".join(map(str, sorted(s))))'; }
wait_nothing() { wait_nothing_left "$MP"; }

# --- 1. a lazy job touches 30 % of the pool on every node, then unloads it on every node
body=$(cat <<EOS
eval "\$($SW load --lazy -m $MP --cache-dir $C $S/t81.pool)" || exit 3
srun -N4 --ntasks-per-node=1 sh -c 'cd $MP && echo "\$(hostname) part \$(cat data/f0[0-5] | sha256sum | cut -c1-64)"'
srun --mpi=pmix -N4 --ntasks-per-node=1 $SW -q unload $MP > /dev/null 2> $W/out/unload.err || { echo "unload failed"; cat $W/out/unload.err; }
touch $W/out/unloaded
# the job goes on: the test looks at the nodes now
for i in \$(seq 300); do [ -e $W/out/looked ] && echo "still running when looked" && break; sleep 0.2; done
EOS
)
part=$(cat "$W/tree/data/f0"[0-5] | sha256sum | cut -c1-64)
drop
(job lazy "$body" > "$W/lazy.txt") &
jp=$!
for _ in $(seq 300); do [[ -e $W/out/unloaded ]] && break; sleep 0.2; done
wait_nothing
assert_eq "lazy job: after srun sw-pool unload, no mount, record, server or helper on any node (the job still runs)" "$nothing" "$(rest_of)"
touch "$W/out/looked"
wait "$jp" || true
jo=$(cat "$W/lazy.txt")
assert_match "... the check above ran while the job still ran" "still running when looked" "$jo"
assert_eq "... every node read its 6 files (30 % of the pool) right" 4 "$(grep -cE "^node[0-9] part $part$" <<< "$jo" || true)"
assert_eq "... unload exited 0 on every node" 0 "$(grep -c 'unload failed' <<< "$jo" || true)"
[[ $(grep -cE "^node[0-9] part $part$" <<< "$jo" || true) == 4 && $jo != *"unload failed"* ]] || printf '  %s\n' "$jo"
parts=$(for n in "${nodes[@]:0:4}"; do "$TESTBED/exec" "$n" sh -c "ls $C/sw-pool-$uid/cache/ 2>/dev/null" ; done | grep -c '\.pool\.part$' || true)
assert_eq "... each node kept the chunks it fetched (a partial copy in its cache)" 4 "$parts"
on1() { "$TESTBED/exec" node1 runuser -u "$TB_USER" -- env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$@"; }
rc=0; out=$(on1 "$SW" cache trace --cache-dir "$C" -o "$W/out/t81.prefetch" "$S/t81.pool" 2>&1) || rc=$?
assert_eq "sw-pool cache trace on node1: what it fetched, as a prefetch list" 0 "$rc"
assert_match "... says how many chunks" "[0-9]+ of [0-9]+ chunks of t81/0 written to" "$out"
cp "$W/out/t81.prefetch" "$E/t81.pool.prefetch" 2>/dev/null && chmod 644 "$E/t81.pool.prefetch"

# --- 2. a full load of the same pool moves only what no node holds
body=$(cat <<EOS
eval "\$($SW -v load -m $MP --cache-dir $C $S/t81.pool 2>$W/out/load.err)" || { cat $W/out/load.err; exit 3; }
cat $W/out/load.err
srun -N4 --ntasks-per-node=1 sh -c 'cd $MP && echo "\$(hostname) all \$(find . -type f | sort | xargs sha256sum | sha256sum)"'
EOS
)
drop
"$TESTBED/storage-bytes" --mark >/dev/null
jo=$(job full "$body")
served=$("$TESTBED/storage-bytes" --since-mark)
assert_eq "full load after the lazy job: every node read every file right" 4 "$(grep -cE "^node[0-9] all $one  -$" <<< "$jo" || true)"
[[ $(grep -cE "^node[0-9] all $one  -$" <<< "$jo" || true) == 4 ]] || printf '  %s\n' "$jo"
assert_match "... -v says what came from the nodes' partial copies" "taken from the nodes' partial copies" "$jo"
assert_le "... shared storage sent at most 0.72 of the pool ($served of $size bytes)" "$(calc "$served / $size")" 0.72
# the lazy job fetched its files and what the server read ahead of them: the rest, and no more
held=$(chunks < "$W/out/t81.prefetch" | wc -w)
total=$(head -n 1 "$W/out/t81.prefetch" | cut -d' ' -f5)
assert_le "... only what no node held: the $((total - held)) of $total chunks the lazy job did not fetch, plus 2 MiB" "$served" "$(( (total - held) * 1048576 + (2 << 20) ))" B
parts=$(for n in "${nodes[@]:0:4}"; do "$TESTBED/exec" "$n" sh -c "ls -a $C/sw-pool-$uid/cache/ 2>/dev/null" ; done)
assert_eq "... every node holds the full entry and no partial copy or temporary" "4 0" \
  "$(grep -c '\.pool$' <<< "$parts" || true) $(grep -cE '\.part|swpool-tmp' <<< "$parts" || true)"
wait_nothing
assert_eq "... after the job: nothing left" "$nothing" "$(rest_of)"
# a lazy job where every node holds the full, verified entry: served from there, not from storage
body=$(cat <<EOS
eval "\$($SW load --lazy -m $MP --cache-dir $C $S/t81.pool)" || exit 3
srun -N4 --ntasks-per-node=1 sh -c 'cd $MP && echo "\$(hostname) all \$(find . -type f | sort | xargs sha256sum | sha256sum)"'
EOS
)
drop
"$TESTBED/storage-bytes" --mark >/dev/null
jo=$(job lazyfull "$body")
served=$("$TESTBED/storage-bytes" --since-mark)
assert_eq "load --lazy where every node holds the full entry: every file right on 4 nodes" 4 "$(grep -cE "^node[0-9] all $one  -$" <<< "$jo" || true)"
assert_le "... shared storage sent only the trailer's reads ($served bytes)" "$served" $((1 << 20)) B
wait_nothing

# --- 3. one node's on-demand server killed while that node reads: EIO at once, nothing left
"$TESTBED/exec" all "rm -rf $C" >/dev/null 2>&1 || true
body=$(cat <<EOS
eval "\$($SW load --lazy -m $MP --cache-dir $C $S/t81.pool)" || exit 3
srun -N1 -w node2 sh -c 'cd $MP && cat data/f00 > /dev/null && touch $W/out/reading &&
  for i in \$(seq 50); do [ -e $W/out/killed ] && break; sleep 0.2; done
  s=\$(date +%s.%N); err=\$(cat data/f15 data/f16 data/f18 data/f19 2>&1 >/dev/null); rc=\$?; e=\$(date +%s.%N)
  echo "\$(hostname) rc=\$rc took=\$(awk "BEGIN { print \$e - \$s }") err=\$err"'
EOS
)
drop
(job kill "$body" > "$W/kill.txt") &
jp=$!
for _ in $(seq 300); do [[ -e $W/out/reading ]] && break; sleep 0.2; done
victim=$(lazy_servers_on node2 | tail -n 1)
# the servers' step is sw-pool's own srun (slurm::overlap_step): one fence algorithm for Open MPI's
# two start-up fences, whatever the site configured (testbed/README.md, "Open MPI start-up crash")
fence=$(tr '\0' '\n' < "/proc/${victim:-0}/environ" 2>/dev/null | grep '^SLURM_PMIX_FENCE=' || true)
assert_eq "the servers' step (sw-pool's own srun) runs with SLURM_PMIX_FENCE=tree" "SLURM_PMIX_FENCE=tree" "$fence"
if [[ -n $victim ]]; then kill -9 "$victim"; fi
touch "$W/out/killed"
wait "$jp" || true
jo=$(cat "$W/kill.txt")
assert_match "node2's on-demand server found and killed while node2 reads" "^[0-9]+$" "$victim"
assert_match "... node2's next reads of chunks it does not hold fail with EIO" "node2 rc=[1-9].*Input/output error" "$jo"
took=$(sed -n 's/.*took=\([0-9.]*\).*/\1/p' <<< "$jo" | head -n 1)
assert_le "... at once, not after a hang" "${took:-99}" 5 s
[[ $jo == *"Input/output error"* ]] || printf '  %s\n' "$jo"
wait_nothing
assert_eq "... after the job: the epilog left no mount, record, server or helper on any node" "$nothing" "$(rest_of)"

# --- 4. prefetch: a lazy job on empty caches warms the listed chunks on every node
"$TESTBED/exec" all "rm -rf $C" >/dev/null 2>&1 || true
sed 's/^sw-pool prefetch v1 blake3:[0-9a-f]*/sw-pool prefetch v1 blake3:'"$(printf '%064d' 0)"'/' "$W/out/t81.prefetch" > "$W/out/other.prefetch"
body=$(cat <<EOS
if out=\$($SW load --lazy --prefetch $W/out/other.prefetch -m $MP --cache-dir $C $S/t81.pool 2>&1); then echo "other list accepted"; else echo "other list refused: \$out"; fi
eval "\$($SW load --lazy --prefetch auto -m $MP --cache-dir $C $S/t81.pool)" || exit 3
sleep 6
EOS
)
jo=$(job prefetch "$body")
assert_match "a prefetch list of another pool is refused, naming the list and what to do" "other list refused: .*other.prefetch.*made for another pool.*trace this pool again" "$jo"
want=$(chunks < "$W/out/t81.prefetch")
held=0
for n in "${nodes[@]:0:4}"; do
  got=$("$TESTBED/exec" "$n" runuser -u "$TB_USER" -- env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$SW" cache trace --cache-dir "$C" "$S/t81.pool" 2>/dev/null | chunks || true)
  python3 -c 'import sys; a, b = set(sys.argv[1].split()), set(sys.argv[2].split()); sys.exit(0 if a and a <= b else 1)' "$want" "$got" && held=$((held + 1))
done
assert_eq "--prefetch auto (POOL.prefetch): every node holds every listed chunk ($(wc -w <<< "$want") chunks) without reading a file" 4 "$held"
[[ $held == 4 ]] || printf '  %s\n' "$jo"
wait_nothing
assert_eq "... after the job: nothing left" "$nothing" "$(rest_of)"
finish
