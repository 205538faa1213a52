#!/usr/bin/env bash
# sw-pool cp (the broadcast engine) on the virtual cluster with real Open MPI
# (testbed/mpirun and srun --mpi=pmix). SRC lives on the throttled shared storage ($SCRATCH =
# $TB/shared inside the nodes, written here through $TB/export), DEST on every node's local disk.
# Checks: identical hashes on every node for dense / sparse / 0 / 1 byte / chunk ± 1, 2 ranks on
# one node, 3 ranks spread unevenly, srun, a directory tree; a repeat copy reads nothing from storage;
# faults (SRC unreadable, DEST dir missing on one node, one node's disk full, one rank killed
# mid-transfer) exit non-zero on every surviving rank in bounded time, name the node and leave no
# temporary or partial file on any node.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
bin=$REPO/target/release/sw-pool
if [[ ! -x $bin ]]; then
  (cd "$REPO" && cargo build --release -q --workspace) || true
fi
[[ -x $bin ]] || { fail "sw-pool built" "$bin missing"; finish; }
install -m 755 "$bin" "$bin-full" "$bin-enter" "$TB/scratch/"
SW=$TB/scratch/sw-pool
read -r -a NODES <<< "$TB_NODES"
NN=${#NODES[@]}
EXP=$TB/export/cp-test        # the storage server's disk, seen from the root namespace
SH=$TB/shared/cp-test         # the same directory seen from the nodes (sshfs, throttled)
rm -rf "$EXP"; mkdir -p "$EXP"; chmod 755 "$EXP"
cd "$TB/scratch"
MIB=$((1 << 20)); CH=$((4 * MIB))
gen() { head -c "$2" /dev/urandom > "$EXP/$1"; }
gen dense $((24 * MIB)); gen zero 0; gen one 1; gen cm1 $((CH - 1)); gen cp1 $((CH + 1))
truncate -s $((64 * MIB)) "$EXP/sparse"
dd if=/dev/urandom of="$EXP/sparse" bs=1M count=5 seek=30 conv=notrunc status=none
chmod 644 "$EXP"/*

local_of() { echo "$TB/nodes/$1/local"; }   # a node's local disk seen from the root namespace
clean_local() { for n in "${NODES[@]}"; do rm -rf "$(local_of "$n")"/cp-* "$(local_of "$n")"/.cp-*; done; }
# hashes_equal LABEL NAME [NODES...]: DEST on every listed node has SRC's sha256
hashes_equal() {
  local label=$1 name=$2 want got n bad=""; shift 2
  want=$(sha256sum < "$EXP/$name" | cut -d' ' -f1)
  for n in "${@:-${NODES[@]}}"; do
    got=$(sha256sum < "$(local_of "$n")/cp-$name" 2>/dev/null | cut -d' ' -f1 || true)
    [[ $got == "$want" ]] || bad+=" $n"
  done
  if [[ -z $bad ]]; then pass "$label: identical sha256 on ${*:-all $NN nodes}"; else fail "$label" "wrong or missing on:$bad"; fi
}
no_temps() {  # no temporary file or directory of ours on any node
  local left
  left=$(for n in "${NODES[@]}"; do find "$(local_of "$n")" -maxdepth 2 -name '*.swpool-tmp-*' 2>/dev/null; done)
  assert_eq "$1: no temporary file left on any node" "" "$left"
}

clean_local
for f in dense sparse zero one cm1 cp1; do
  out=$("$TESTBED/mpirun" "$SW" cp --json "$SH/$f" "$TB/local/cp-$f" 2>&1) || { fail "cp $f" "$(tail -n 5 <<< "$out")"; continue; }
  hashes_equal "cp $f (1 rank x $NN nodes)" "$f"
done
# the sparse file stays sparse on the nodes
alloc=$(du -k "$(local_of "${NODES[0]}")/cp-sparse" | cut -f1)
assert_le "sparse DEST allocation (KiB)" "$alloc" 6200
no_temps "shapes"

# repeat: nothing read from storage
"$TESTBED/storage-bytes" --mark >/dev/null
out=$("$TESTBED/mpirun" "$SW" cp --json "$SH/dense" "$TB/local/cp-dense" 2>&1 || true)
served=$("$TESTBED/storage-bytes" --since-mark)
assert_match "repeat copy skipped" '"skipped_all": true' "$out"
assert_le "repeat copy: bytes served by storage" "$served" 262144
# first copy: each data byte read once (storage bytes ~ file size)
clean_local
"$TESTBED/storage-bytes" --mark >/dev/null
"$TESTBED/mpirun" "$SW" cp "$SH/dense" "$TB/local/cp-dense" >/dev/null 2>&1 || true
served=$("$TESTBED/storage-bytes" --since-mark)
assert_within "first copy: storage bytes / file size" "$(calc "$served / (24 * $MIB)")" 0.98 1.05
# only the node lacking DEST receives it
rm -f "$(local_of "${NODES[1]}")/cp-dense"
out=$("$TESTBED/mpirun" "$SW" cp --json "$SH/dense" "$TB/local/cp-dense" 2>&1 || true)
assert_match "one node lacking DEST: only it receives" '"nodes_received": 1' "$out"
hashes_equal "after partial repeat" dense

# ranks per node
clean_local
out=$("$TESTBED/mpirun" -np 2 -H "${NODES[0]}:2" "$SW" cp "$SH/cp1" "$TB/local/cp-cp1" 2>&1) || fail "2 ranks on one node" "$out"
hashes_equal "2 ranks on one node" cp1 "${NODES[0]}"
clean_local
out=$("$TESTBED/mpirun" -np 3 -H "${NODES[0]}:2,${NODES[1]}:1" "$SW" cp --json "$SH/dense" "$TB/local/cp-dense" 2>&1) || fail "3 ranks uneven" "$out"
assert_match "3 ranks on 2 nodes: 2 nodes" '"nodes": 2' "$out"
hashes_equal "3 ranks spread unevenly" dense "${NODES[0]}" "${NODES[1]}"
clean_local
out=$("$REPO/tests/cluster/srun-mpi" -N"$NN" --ntasks-per-node=2 "$SW" cp "$SH/sparse" "$TB/local/cp-sparse" 2>&1) || fail "srun --mpi=pmix" "$out"
hashes_equal "srun --mpi=pmix, 2 tasks per node" sparse
# chosen per copy: at most 4 chunks per node take the two trees from one reader, more the ring
clean_local
out=$("$TESTBED/mpirun" "$SW" cp --json "$SH/dense" "$TB/local/cp-dense" 2>&1) || fail "default algorithm" "$out"
assert_match "24 chunks of 1 MiB on $NN nodes: ring chosen" '"algorithm": "ring"' "$out"
clean_local
out=$("$TESTBED/mpirun" "$SW" cp --json --chunk 4MiB "$SH/dense" "$TB/local/cp-dense" 2>&1) || fail "default algorithm, 4 MiB chunks" "$out"
assert_match "6 chunks of 4 MiB on $NN nodes: two-tree chosen" '"algorithm": "two-tree"' "$out"
hashes_equal "two-tree chosen" dense
for algo in allgather bcast ring two-tree; do
  clean_local
  out=$("$TESTBED/mpirun" -x SW_POOL_CP_ALGORITHM=$algo "$SW" cp --json "$SH/dense" "$TB/local/cp-dense" 2>&1) || fail "algorithm $algo" "$out"
  assert_match "algorithm $algo used" "\"algorithm\": \"$algo\"" "$out"
  hashes_equal "algorithm $algo" dense
done
# the two trees on odd shapes and on 3 nodes (one rank below the root forwards in neither tree)
for f in sparse cm1 cp1; do
  clean_local
  out=$("$TESTBED/mpirun" -x SW_POOL_CP_ALGORITHM=two-tree "$SW" cp "$SH/$f" "$TB/local/cp-$f" 2>&1) || fail "two-tree $f" "$out"
  hashes_equal "two-tree, $f" "$f"
done
clean_local
out=$("$TESTBED/mpirun" -np 3 -H "${NODES[0]},${NODES[1]},${NODES[2]}" -x SW_POOL_CP_ALGORITHM=two-tree "$SW" cp "$SH/dense" "$TB/local/cp-dense" 2>&1) || fail "two-tree on 3 nodes" "$out"
hashes_equal "two-tree on 3 nodes" dense "${NODES[0]}" "${NODES[1]}" "${NODES[2]}"

# a directory tree: modes, symlinks, hard links, mtimes. It lives on the plain shared directory
# ($TB/scratch): the testbed's sshfs refuses readlink (EPERM), so a tree with symlinks cannot be
# read from $SCRATCH there.
T=$TB/scratch/cp-test-tree; rm -rf "$T"; mkdir -p "$T/a/b/c"; head -c 3000000 /dev/urandom > "$T/a/big"
printf '#!/bin/sh\necho hi\n' > "$T/a/b/run.sh"; chmod 751 "$T/a/b/run.sh"; chmod 700 "$T/a/b/c"
ln -s ../big "$T/a/b/link"; ln "$T/a/big" "$T/a/b/c/hard"; touch -d '2001-02-03 04:05:06.123456789' "$T/a/b/run.sh"
chown 4321:8765 "$T/a/big"; chown -h 4322:8766 "$T/a/b/link"   # ownership is kept (mpirun runs as root)
touch -d '2002-03-04 05:06:07.987654321' "$T/a/b/c" "$T/a/b" "$T/a"
clean_local
out=$("$TESTBED/mpirun" "$SW" cp "$T" "$TB/local/cp-tree" 2>&1) || fail "directory copy" "$out"
# type, mode, size, link target, owner, group, mtime to the nanosecond
want=$(cd "$T" && find . -printf '%P %y %m %s %l %U %G %T@\n' | sort | sha256sum)
bad=""
for n in "${NODES[@]}"; do
  d=$(local_of "$n")/cp-tree
  got=$(if cd "$d" 2>/dev/null; then find . -printf '%P %y %m %s %l %U %G %T@\n' | sort | sha256sum; fi)
  [[ $got == "$want" ]] || bad+=" $n(meta)"
  cmp -s "$T/a/big" "$d/a/b/c/hard" || bad+=" $n(data)"
  [[ $(stat -c %i "$d/a/big" 2>/dev/null) == $(stat -c %i "$d/a/b/c/hard" 2>/dev/null) ]] || bad+=" $n(hardlink)"
  [[ $(stat -c %y "$d/a/b/run.sh" 2>/dev/null) == *"04:05:06.123456789"* ]] || bad+=" $n(mtime-ns)"
done
assert_eq "directory tree identical on all nodes (modes, links, hard links, owners, mtimes in ns)" "" "$bad"
out=$("$TESTBED/mpirun" "$SW" cp --json "$T" "$TB/local/cp-tree" 2>&1 || true)
assert_match "directory repeat skipped" '"skipped_all": true' "$out"

# a receiving node that fails during a directory copy stops the stream at once: its DEST is a
# tmpfs with room for the bytes but only 40 inodes, the tree 120 small files, then a 96 MiB file;
# the reader must not read that big file through to the end (storage serves far less than it)
mkdir -p "$EXP/stoptree"
for i in $(seq -w 0 119); do echo "$i" > "$EXP/stoptree/a$i"; done
head -c $((96 * MIB)) /dev/urandom > "$EXP/stoptree/zz-big"; chmod -R a+rX "$EXP/stoptree"
victim=${NODES[$((NN - 1))]}
clean_local
for n in "${NODES[@]}"; do mkdir -p "$(local_of "$n")/cp-inodes"; done
"$TESTBED/exec" "$victim" mount -t tmpfs -o size=512m,nr_inodes=40 swp-cp-test "$TB/local/cp-inodes"
"$TESTBED/storage-bytes" --mark >/dev/null
rc=0; out=$("$TESTBED/mpirun" "$SW" cp "$SH/stoptree" "$TB/local/cp-inodes/t" 2>&1) || rc=$?
served=$("$TESTBED/storage-bytes" --since-mark)
if [[ $rc != 0 ]]; then pass "directory copy, extraction fails on $victim: non-zero exit"; else fail "extraction failure" "exit 0"; fi
assert_match "extraction failure: names $victim" "$victim" "$out"
assert_le "extraction failure stops the stream early: MB served by storage" $((served / MIB)) 48 MB
left=$(for n in "${NODES[@]}"; do ls -A "$(local_of "$n")/cp-inodes" 2>/dev/null || true; done; "$TESTBED/exec" "$victim" ls -A "$TB/local/cp-inodes" || true)
assert_eq "extraction failure: no temporary or partial tree on any node" "" "$left"
"$TESTBED/exec" "$victim" umount "$TB/local/cp-inodes"
rm -rf "$EXP/stoptree"

# ---- faults ----
export SW_POOL_STALL_TIMEOUT=20
# SRC unreadable (as the unprivileged user, a root-only file)
install -m 600 /dev/null "$EXP/secret"; head -c 1000 /dev/urandom > "$EXP/secret"
t0=$(now)
rc=0; out=$(as_user srun --mpi=pmix -N"$NN" --chdir=/tmp "$SW" cp "$SH/secret" /tmp/cp-secret 2>&1) || rc=$?
if [[ $rc != 0 ]]; then pass "SRC unreadable: non-zero exit ($rc)"; else fail "SRC unreadable" "exit 0"; fi
assert_match "SRC unreadable: message names the node and SRC" "node[0-9]+.*(SRC|secret).*(denied|Permission)" "$out"
assert_eq "SRC unreadable: every rank reports it" "$NN" "$(grep -c 'sw-pool: error: ' <<< "$out")"
assert_le "SRC unreadable: bounded time" "$(elapsed "$t0")" 30 s

# DEST directory missing on one node
victim=${NODES[$((NN - 1))]}
for n in "${NODES[@]}"; do mkdir -p "$(local_of "$n")/cp-dir"; done
rm -rf "$(local_of "$victim")/cp-dir"
t0=$(now)
rc=0; out=$("$TESTBED/mpirun" "$SW" cp "$SH/dense" "$TB/local/cp-dir/f" 2>&1) || rc=$?
if [[ $rc != 0 ]]; then pass "DEST dir missing on $victim: non-zero exit"; else fail "DEST dir missing" "exit 0"; fi
assert_match "DEST dir missing: names $victim" "$victim.*cp-dir.*create it" "$out"
assert_eq "DEST dir missing: all $NN ranks report the same failure" "$NN" "$(grep -c "sw-pool: error: $victim" <<< "$out")"
left=$(for n in "${NODES[@]}"; do ls -A "$(local_of "$n")/cp-dir" 2>/dev/null || true; done)
assert_eq "DEST dir missing: nothing written on the other nodes" "" "$left"
assert_le "DEST dir missing: bounded time" "$(elapsed "$t0")" 30 s

# one node's local disk full (a 4 MiB tmpfs on that node only)
victim=${NODES[1]}
for n in "${NODES[@]}"; do mkdir -p "$(local_of "$n")/cp-small"; done
"$TESTBED/exec" "$victim" mount -t tmpfs -o size=4m swp-cp-test "$TB/local/cp-small"
for algo in two-tree ring; do
  rc=0; out=$("$TESTBED/mpirun" -x SW_POOL_CP_ALGORITHM=$algo "$SW" cp "$SH/dense" "$TB/local/cp-small/f" 2>&1) || rc=$?
  if [[ $rc != 0 ]]; then pass "disk full on $victim ($algo): non-zero exit"; else fail "disk full ($algo)" "exit 0"; fi
  assert_match "disk full ($algo): names $victim and the space" "$victim.*(space|No space)" "$out"
  left=$(for n in "${NODES[@]}"; do ls -A "$(local_of "$n")/cp-small" 2>/dev/null || true; done; "$TESTBED/exec" "$victim" ls -A "$TB/local/cp-small" || true)
  assert_eq "disk full ($algo): no temporary or partial file on any node" "" "$left"
done
"$TESTBED/exec" "$victim" umount "$TB/local/cp-small"

# one rank killed mid-transfer (a 200 MiB file through the 50 MB/s storage link takes seconds): on
# the ring, and on the two trees a rank that forwards to two others (node2 is tree 0's top)
gen big $((200 * MIB)); chmod 644 "$EXP/big"
for algo in ring two-tree; do
clean_local
victim=${NODES[2]}; [[ $algo == two-tree ]] && victim=${NODES[1]}
t0=$(now)
"$TESTBED/mpirun" -x SW_POOL_STALL_TIMEOUT -x SW_POOL_CP_ALGORITHM=$algo "$SW" cp "$SH/big" "$TB/local/cp-big" > /var/tmp/swp-t10-kill.log 2>&1 &
mpid=$!
pid=""
for _ in $(seq 100); do
  pid=$("$TESTBED/exec" "$victim" "pgrep -n -f '^$SW cp $SH/big'" 2>/dev/null | tr -dc 0-9 || true)
  [[ -n $pid ]] && break; sleep 0.1
done
sleep 1.5
if [[ -n $pid ]]; then
  "$TESTBED/exec" "$victim" kill -9 "$pid"
  pass "$algo: killed rank pid $pid on $victim"
else
  fail "$algo: kill a rank" "sw-pool not found on $victim"
fi
rc=0
for _ in $(seq 600); do kill -0 "$mpid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$mpid" 2>/dev/null; then
  fail "$algo: rank killed: job ends in bounded time" "still running after 60 s"; kill "$mpid" 2>/dev/null || true
fi
wait "$mpid" || rc=$?
out=$(cat /var/tmp/swp-t10-kill.log)
if [[ $rc != 0 ]]; then pass "$algo: rank killed: non-zero exit ($rc)"; else fail "$algo: rank killed" "exit 0"; fi
assert_match "$algo: rank killed: the node is named" "$victim" "$out"
assert_le "$algo: rank killed: bounded time" "$(elapsed "$t0")" 60 s
sleep 1
# the killed rank cannot clean up after SIGKILL: its temporary stays until the next copy to that
# DEST on that node removes it (stale temporaries of dead pids are removed in preflight)
# shellcheck disable=SC2010  # the names are the test's and sw-pool's own: no spaces or newlines
leftover=$(for n in "${NODES[@]}"; do ls -A "$(local_of "$n")" | grep -E 'cp-big' | grep -v "swpool-tmp-$pid\$" || true; done)
assert_eq "$algo: rank killed: no temporary or partial file on any surviving node" "" "$leftover"
left_procs=$("$TESTBED/exec" all "pgrep -f '^$SW cp' || true" 2>/dev/null | grep -c '[0-9]$' || true)
assert_eq "$algo: rank killed: no sw-pool process left" 0 "$left_procs"
done

# a second MPI implementation (MPICH) on the host
if [[ -x $REPO/tools/mpich-smoke.sh ]]; then
  assert_cmd "MPICH: 2-rank smoke test (tools/mpich-smoke.sh)" "$REPO/tools/mpich-smoke.sh"
fi
clean_local
rm -rf "$EXP" "$T" /var/tmp/swp-t10-kill.log
finish
