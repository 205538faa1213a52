#!/usr/bin/env bash
# What a load asks of shared storage, from the storage server's own request log (testbed up
# --sftp-log): a small pool (at most 4 chunks per node) goes down two trees from one reader, so
# one node opens it, once, whatever the job's size; a larger one goes round the ring, where each node
# that reads chunks opens it once and no other node does. No chunk is read twice (no read-ahead
# into the next reader's chunks: the bytes the server read for the pool stay within one page per
# reader of its size), and a small pool's load on 4 nodes costs about the requests of a load on
# 1 node. Brings the default testbed back up at the end.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
restore() { "$TESTBED/up" >/dev/null 2>&1 || true; rm -rf "$TB/export/t32-$$" "$TB/scratch/t32-$$"; }
trap restore EXIT
rc=0; "$TESTBED/up" --sftp-log >/dev/null || rc=$?
assert_eq "testbed up --sftp-log (4 nodes) exits 0" 0 "$rc"
[[ $rc == 0 ]] || finish
E=$TB/export/t32-$$ S=$TB/shared/t32-$$ W=$TB/scratch/t32-$$
mkdir -p "$E" "$W/bin"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"; SW=$W/bin/sw-pool
export SW_POOL_SHELL=sh
mkpool() {  # mkpool NAME BYTES: an ad-hoc pool of random data on shared storage
  mkdir -p "$W/$1/install/$1/1/share"
  head -c "$2" /dev/urandom > "$W/$1/install/$1/1/share/data"
  "$SW" build -q "$E/$1.sqfs" "$W/$1" >/dev/null 2>&1
}
# requests served for PATH since the line counts saved by mark(): sessions that opened it, the
# bytes sftp-server read for it (its own "close ... bytes read N" accounting), all requests
declare -A base
mark() { local f; base=(); for f in "$TB"/log/sftp.*.log; do base[$f]=$(wc -l < "$f"); done; }
since() { local f; for f in "$TB"/log/sftp.*.log; do tail -n +"$(( ${base[$f]:-0} + 1 ))" "$f" | sed "s|^|$(basename "$f") |"; done; }
openers() { since | grep -F "open \"$TB/export/t32-$$/$1\"" | cut -d' ' -f1 | sort -u | wc -l; }
opens() { since | grep -cF "open \"$TB/export/t32-$$/$1\"" || true; }
read_bytes() { since | grep -F "close \"$TB/export/t32-$$/$1\"" | sed -n 's/.* bytes read \([0-9]*\) .*/\1/p' | awk '{s += $1} END {print s + 0}'; }
requests() { since | grep -E ' debug[0-9]: request [0-9]+: ' | grep -vc ': request [0-9]*: sent ' || true; }
load() {  # load NP POOL: load on NP nodes from a cold cache, then unload
  "$TESTBED/exec" all rm -rf "$TB/local/sw-pool-0" >/dev/null 2>&1 || true
  drop_caches
  mark
  out=$("$TESTBED/mpirun" -np "$1" "$SW" -q load -m "$TB/local/t32mnt" "$S/$2" 2>&1) && rc=0 || rc=$?
  "$TESTBED/mpirun" -np "$1" "$SW" -q unload "$TB/local/t32mnt" >/dev/null 2>&1 || true
}

if ! mkpool one 300000 || ! mkpool three 2800000 || ! mkpool ring 20000000; then
  fail "built the test pools" "sw-pool build failed"; finish
fi
for p in one three ring; do
  c=$("$SW" inspect "$E/$p.sqfs" 2>/dev/null | sed -n 's/^data .* in \([0-9]*\) of .*/\1/p')
  echo "  $p.sqfs: $(stat -c %s "$E/$p.sqfs") bytes, $c data chunk(s)"
done
load 4 one.sqfs
assert_eq "a one-chunk pool on 4 nodes: load exits 0" 0 "$rc"
assert_eq "a one-chunk pool on 4 nodes: one node opened it on shared storage" 1 "$(openers one.sqfs)"
load 4 three.sqfs
assert_eq "a three-chunk pool on 4 nodes: load exits 0" 0 "$rc"
assert_eq "a three-chunk pool on 4 nodes (two trees): one node opened it" 1 "$(openers three.sqfs)"
# node 0 checks the pool's trailer, inspects it and reads its chunks through one open file
assert_eq "a three-chunk pool on 4 nodes: opened once in all (trust check, plan and read)" 1 "$(opens three.sqfs)"
load 4 ring.sqfs
assert_eq "a 20 MB pool on 4 nodes: load exits 0" 0 "$rc"
assert_eq "a 20 MB pool on 4 nodes (ring): the four readers opened it" 4 "$(openers ring.sqfs)"
size=$(stat -c %s "$E/ring.sqfs")
got=$(read_bytes ring.sqfs)
# over the size: node 0's reads of the trailer and manifest (< 64 KiB) and each reader's 4 KiB page
# of the trailer; read-ahead into the next reader's chunks would add ~128 KiB per boundary
assert_within "four readers read the pool once (bytes read by the server / file size)" \
  "$(calc "$got / $size")" 0.99 "$(calc "($size + 65536 + 4 * 4096) / $size")"
load 1 three.sqfs; one_node=$(requests)
load 4 three.sqfs; four_nodes=$(requests)
echo "  requests for the three-chunk pool: $one_node on 1 node, $four_nodes on 4 nodes"
assert_le "a small pool on 4 nodes costs at most 4 requests more than on 1 node" "$four_nodes" "$(( one_node + 4 ))"
if "$TESTBED/exec" all sh -c "! grep -q ' $TB/local/t32mnt ' /proc/self/mounts" >/dev/null 2>&1; then
  pass "no mount left"
else
  fail "no mount left" "$("$TESTBED/exec" all grep t32mnt /proc/self/mounts)"
fi
finish
