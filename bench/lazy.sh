#!/usr/bin/env bash
# On-demand loads on the virtual cluster (issue 30; a benchmark, not a test), as the unprivileged
# test user in Slurm batch jobs on N nodes, one run each, all in one run of this script:
#   - time to first use: `load --lazy` + every node reading one small file of the pool, against a
#     full `load` + the same read, for a small and a large pool (goals: first use within 1.2x between
#     them, and <= 1/10 of a full load of the large pool);
#   - the OSR paper's test: sha256 of the large pool's big file on every node at once through the
#     lazy mount, against full load + sha256, and against sha256 straight from shared storage
#     (goal: lazy <= 1.3x load + sha256);
#   - bytes shared storage sent for each (testbed/storage-bytes).
# Page caches dropped and every node's cache emptied before each job.
#
#   flock /var/tmp/swp-cluster-session.lock bench/lazy.sh [SMALL_MB] [LARGE_MB] [NODE_COUNTS]
#                                                        (root; defaults 256 1024 "2 4 8")
#
# Caps as bench/load-e2e.sh: node links 400mbit, storage egress 800mbit. Writes
# bench/results/lazy-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SMALL_MB=${1:-256}
LARGE_MB=${2:-1024}
COUNTS=${3:-"2 4 8"}
NODE_RATE=400mbit; STOR_RATE=800mbit
SW_BIN=$REPO/target/release/sw-pool
[[ -x $SW_BIN && -x $SW_BIN-full && -x $SW_BIN-serve ]] || { echo "build first: cargo build --release"; exit 1; }
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/lazy-$(date +%Y%m%d-%H%M)
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
W=/var/tmp/swp-bench-lazy
trap '"$TESTBED/down" -q || true; rm -rf "$W"' EXIT
: > "$OUT.log"

rm -rf "$W"; mkdir -p "$W"
for s in small large; do
  mb=$SMALL_MB; [[ $s == large ]] && mb=$LARGE_MB
  mkdir -p "$W/$s/data"
  head -c "${mb}MB" /dev/urandom > "$W/$s/data/big.bin"
  echo hello > "$W/$s/data/small.txt"
  "$SW_BIN" build -q --name "lazy$s" --version 1 "$W/$s.sqfs" "$W/$s"
done
want=$(sha256sum < "$W/large/data/big.bin" | cut -d' ' -f1)

U=$TB_USER
uid=$(id -u "$U")
declare -A R
job() {  # job N NAME BODY: run BODY (bash) in a batch job on N nodes as the test user; its output
  local n=$1 name=$2 body=$3
  printf '#!/bin/bash\nexport SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_SHELL=sh\n%s\n' "$body" > "$TB/scratch/lz/$name.sh"
  chmod 755 "$TB/scratch/lz/$name.sh"
  runuser -u "$U" -- env SLURM_CONF="$SLURM_CONF" sbatch -W -N "$n" --chdir=/tmp -o "$TB/scratch/lz/out/$name.out" "$TB/scratch/lz/$name.sh" >/dev/null 2>&1 || true
  cat "$TB/scratch/lz/out/$name.out" 2>/dev/null || true
}
fresh() {  # nothing cached or mounted on any node; page caches dropped
  for n in "${NODES[@]}"; do
    "$TESTBED/exec" "$n" runuser -u "$U" -- "$SW" cleanup --all --kill >/dev/null 2>&1 || true
    # the user's caches (also the lazy runs' .part stores, which a later lazy run would reuse)
    "$TESTBED/exec" "$n" sh -c "rm -rf /tmp/sw-pool-$uid*/cache $TB/local/sw-pool-$uid/cache $TB/local/lz*" >/dev/null 2>&1 || true
  done
  drop
}
# the job's own clock, expanded in the job
# shellcheck disable=SC2016
T='$(date +%s.%N)'
for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate $NODE_RATE --storage-rate $STOR_RATE >/dev/null
  read -r -a NODES <<< "$(<"$TB/run/nodes")"
  mkdir -p "$TB/scratch/lz/out" "$TB/export/lz"
  chmod 1777 "$TB/scratch/lz/out"
  cp "$SW_BIN" "$SW_BIN-full" "$SW_BIN-serve" "$SW_BIN-enter" "$TB/scratch/lz/"
  SW=$TB/scratch/lz/sw-pool
  cp "$W/small.sqfs" "$W/large.sqfs" "$TB/export/lz/"
  cp "$W/large/data/big.bin" "$TB/export/lz/big.bin"
  chmod -R a+rX "$TB/scratch/lz" "$TB/export/lz"
  for s in small large; do
    for mode in lazy full; do
      flag=""; [[ $mode == lazy ]] && flag=--lazy
      fresh
      "$TESTBED/storage-bytes" --mark >/dev/null
      out=$(job "$N" "$mode-$s-$N" "t0=$T
eval \"\$($SW load $flag -m $TB/local/lz $TB/shared/lz/$s.sqfs)\" || exit 3
srun -N $N --ntasks-per-node=1 cat $TB/local/lz/data/small.txt >/dev/null || exit 4
t1=$T
echo first \$(awk -v a=\$t0 -v b=\$t1 'BEGIN{printf \"%.3f\", b-a}')
if [ $s = large ]; then
  t2=$T
  srun -N $N --ntasks-per-node=1 sh -c 'sha256sum < $TB/local/lz/data/big.bin' | sort | uniq -c | awk '{print \"sums\", \$1, \$2}'
  echo sha \$(awk -v a=\$t2 -v b=$T 'BEGIN{printf \"%.3f\", b-a}')
fi")
      R[$mode.$s.$N.first]=$(awk '/^first /{print $2}' <<< "$out")
      R[$mode.$s.$N.sha]=$(awk '/^sha /{print $2}' <<< "$out")
      R[$mode.$s.$N.ok]=$(awk -v w="$want" '/^sums /{ if ($3 == w) print $2 }' <<< "$out")
      R[$mode.$s.$N.bytes]=$("$TESTBED/storage-bytes" --since-mark)
      log "N=$N $mode $s: first ${R[$mode.$s.$N.first]:-?} s, sha ${R[$mode.$s.$N.sha]:--} s, sums ok ${R[$mode.$s.$N.ok]:--}, storage ${R[$mode.$s.$N.bytes]} B"
      [[ -n ${R[$mode.$s.$N.first]} ]] || log "$(tail -5 <<< "$out")"
    done
  done
  # sha256 straight from shared storage, every node at once
  fresh
  t=$(now)
  "$TESTBED/mpirun" sh -c "sha256sum < $TB/shared/lz/big.bin" >/dev/null 2>&1
  R[shared.$N]=$(el "$t")
  log "N=$N sha256 from shared storage ${R[shared.$N]} s"
  fresh
  rm -rf "$TB/scratch/lz" "$TB/export/lz"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
{
  echo "# On-demand loads: \`load --lazy\` against a full \`load\` ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "Pools: ${SMALL_MB} MB and ${LARGE_MB} MB of random data (squashfs) on the testbed's shared storage (egress $STOR_RATE);"
  echo "node links $NODE_RATE. Batch jobs as the test user, one run each; caches dropped and emptied before each."
  echo "first use = \`load [--lazy]\` + every node reading a small file of the pool; sha256 = every node's sha256 of the big"
  echo "file at once, after that. \`bench/lazy.sh $SMALL_MB $LARGE_MB \"$COUNTS\"\`; $(nproc) cores."
  echo
  echo "| N | first use, lazy small (s) | lazy large (s) | large ÷ small (goal ≤ 1.2) | full load large (s) | lazy ÷ full, large (goal ≤ 0.1) | storage bytes, lazy large job (first use + sha256) ÷ pool |"
  echo "|---|---|---|---|---|---|---|"
  for N in $COUNTS; do
    echo "| $N | ${R[lazy.small.$N.first]:-} | ${R[lazy.large.$N.first]:-} | $(ratio "${R[lazy.large.$N.first]:-0}" "${R[lazy.small.$N.first]:-0}") | ${R[full.large.$N.first]:-} | $(ratio "${R[lazy.large.$N.first]:-0}" "${R[full.large.$N.first]:-0}") | $(calc "${R[lazy.large.$N.bytes]} / $(stat -c %s "$W/large.sqfs")") |"
  done
  echo
  echo "| N | lazy first use + sha256 (s) | full load + sha256 (s) | lazy ÷ full (goal ≤ 1.3) | sha256 from shared storage (s) | checksums ok lazy / full | storage bytes lazy / full ÷ pool |"
  echo "|---|---|---|---|---|---|---|"
  size=$(stat -c %s "$W/large.sqfs")
  for N in $COUNTS; do
    l=$(calc "${R[lazy.large.$N.first]:-0} + ${R[lazy.large.$N.sha]:-0}")
    f=$(calc "${R[full.large.$N.first]:-0} + ${R[full.large.$N.sha]:-0}")
    echo "| $N | $l | $f | $(ratio "$l" "$f") | ${R[shared.$N]} | ${R[lazy.large.$N.ok]:-0}/$N / ${R[full.large.$N.ok]:-0}/$N | $(calc "${R[lazy.large.$N.bytes]} / $size") / $(calc "${R[full.large.$N.bytes]} / $size") |"
  done
  echo
  echo "Machine load at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores."
} > "$OUT.md"
cat "$OUT.md"
echo "lazy: written to $OUT.md" >&2
