#!/usr/bin/env bash
# On-demand loads on the virtual cluster (issue 30; a benchmark, not a test), as the unprivileged
# test user in Slurm batch jobs on N nodes, one run each, all in one run of this script:
#   - time to first use: `load --lazy` + every node reading one small file of the pool, against a
#     full `load` + the same read, for a small and a large pool (goals: first use within 1.2x between
#     them, and <= 1/10 of a full load of the large pool);
#   - the OSR paper's test: sha256 of a 1 GB file of the large pool on every node at once through
#     the lazy mount, against full load + sha256, and against sha256 straight from shared storage
#     (goal: lazy <= 1.3x load + sha256);
#   - every node reading the same 5 % of the large pool through the lazy mount: bytes shared storage
#     sent / bytes touched (goal <= 1.1);
#   - bytes shared storage sent for each (testbed/storage-bytes).
# At N = EXTRA_N only (default 4):
#   - content: sha256 of every file of the large pool on every node through the lazy mount, and on
#     one node through `mount --in-place`, against the source;
#   - reuse: a lazy job touching 30 % of the large pool, then a full `load`: bytes from storage / pool
#     (goal <= 0.72);
#   - random 4 KiB reads (fio, psync, RAND seconds, cold, RAND_REPS rounds in turning order) of the
#     1 GB file on one node: through a fresh lazy mount and a fresh `mount --in-place`, each also of
#     the pool built with `--chunk 64KiB`, the cached mount (full load), a copy on local disk, and
#     the file straight from shared storage.
# Page caches dropped and every node's cache emptied before each job.
#
#   flock /var/tmp/swp-cluster-session.lock bench/lazy.sh [SMALL_MB] [LARGE_MB] [NODE_COUNTS] [EXTRA_N]
#                                              (root; defaults 256 4096 "1 2 4 8" 4; RAND=10)
# RAND_ONLY=1: at N = EXTRA_N only the random reads (e.g. RAND_ONLY=1 RAND_REPS=3 BIG_MB=1024
# bench/lazy.sh 64 1100 4 4: ~10 min).
# PROFILE=1: the whole machine's CPU time during each large-pool job (lazy and full: load, first
# use and the sha256 of every node), sampled with `perf record -a` and split by command and
# library, in bench/results/lazy-<date>-cpu-<mode>-<N>.txt (where do the cores go).
#
# Caps as bench/load-e2e.sh: node links 400mbit, storage egress 800mbit. Writes
# bench/results/lazy-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SMALL_MB=${1:-256}
LARGE_MB=${2:-4096}
COUNTS=${3:-"1 2 4 8"}
EXTRA_N=${4:-4}
RAND=${RAND:-10}
RAND_REPS=${RAND_REPS:-1}
RAND_ONLY=${RAND_ONLY:-}
BIG_MB=${BIG_MB:-1024}   # the OSR test's file (smaller only for a quick try of this script)
NODE_RATE=400mbit; STOR_RATE=800mbit
SW_BIN=$REPO/target/release/sw-pool
command -v fio >/dev/null || { echo "lazy: fio missing (tools/setup-deps.sh installs it)" >&2; exit 1; }
(( LARGE_MB > BIG_MB )) || { echo "lazy: LARGE_MB must exceed $BIG_MB (the 1 GB file is part of the large pool)" >&2; exit 2; }
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/lazy-$(date +%Y%m%d-%H%M)
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW_BIN" "$SW_BIN-full" "$SW_BIN-serve" || exit 1
W=/var/tmp/swp-bench-lazy
trap '"$TESTBED/down" -q || true; rm -rf "$W"' EXIT
: > "$OUT.log"

rm -rf "$W"; mkdir -p "$W"
for s in small large; do
  mkdir -p "$W/$s/data"
  echo hello > "$W/$s/data/small.txt"
done
head -c "${SMALL_MB}MB" /dev/urandom > "$W/small/data/big.bin"
head -c "${BIG_MB}MB" /dev/urandom > "$W/large/data/big.bin"
head -c "$(( LARGE_MB - BIG_MB ))MB" /dev/urandom > "$W/large/data/filler.bin"
for s in small large; do "$SW_BIN" build -q --name "lazy$s" --version 1 "$W/$s.sqfs" "$W/$s"; done
"$SW_BIN" build -q --name lazylarge64k --version 1 --chunk 64KiB "$W/large64k.sqfs" "$W/large"
want=$(sha256sum < "$W/large/data/big.bin" | cut -d' ' -f1)
every=$(cd "$W/large" && find . -type f | sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
size=$(stat -c %s "$W/large.sqfs")
# the same 5 % of the large pool: MiB of the filler every node reads
FIVE=$(( LARGE_MB * 1000 * 1000 / 20 >> 20 ))
# 30 % of the large pool: the 1 GB file and this many MiB of the filler
THIRTY=$(( (LARGE_MB * 3 / 10 - BIG_MB) * 1000 * 1000 >> 20 )); (( THIRTY > 0 )) || THIRTY=0
log "pools built: small $(stat -c %s "$W/small.sqfs") B, large $size B"

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
on1() { "$TESTBED/exec" "${NODES[0]}" runuser -u "$U" -- env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$@"; }
fresh() {  # nothing cached or mounted on any node; page caches dropped
  for n in "${NODES[@]}"; do
    "$TESTBED/exec" "$n" runuser -u "$U" -- "$SW" cleanup --all --kill >/dev/null 2>&1 || true
    # the user's caches (also the lazy runs' .part stores, which a later run would reuse)
    "$TESTBED/exec" "$n" sh -c "rm -rf /tmp/sw-pool-$uid*/cache $TB/local/sw-pool-$uid/cache $TB/local/lz*" >/dev/null 2>&1 || true
  done
  drop
}
fio_iops() {  # fio_iops FILE: on node 1 as the user, cold
  on1 fio --name=r --filename="$1" --readonly --rw=randread --bs=4k --ioengine=psync \
    --time_based --runtime="$RAND" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))' 2>/dev/null || echo 0
}
# rand_reads: 4 KiB random reads of the 1 GB file on node 1, cold, every way once per round
# (RAND_REPS rounds, each in another order; median): a fresh `mount --in-place` (no chunk read yet),
# a fresh lazy load, a full load (the cached mount), each of the first two also of the same pool
# built with `--chunk 64KiB` (a random read moves 64 KiB chunks instead of 1 MiB), a copy on local
# disk and the file straight from shared storage
rand_reads() {
  local ways=(inplace lazy full inplace-64k lazy-64k local shared) k r pool mode flag jp
  declare -A iops
  for ((r = 0; r < RAND_REPS; r++)); do
    for k in "${ways[@]:r % ${#ways[@]}}" "${ways[@]:0:r % ${#ways[@]}}"; do
      pool=$POOL; [[ $k == *-64k ]] && pool=$POOL64K
      case $k in
        inplace*)
          fresh
          on1 mkdir -p "$TB/local/lzip"
          on1 "$SW" -q mount --in-place "$pool" "$TB/local/lzip" >/dev/null 2>&1 || true
          drop
          iops[$k]+=" $(fio_iops "$TB/local/lzip/data/big.bin")"
          on1 "$SW" -q umount "$TB/local/lzip" >/dev/null 2>&1 || true ;;
        lazy*|full)
          fresh
          mode=$k; flag=""; [[ $k == lazy* ]] && flag=--lazy
          rm -f "$TB/scratch/lz/out/rand-$k.up" "$TB/scratch/lz/out/rand-$k.done"
          job "$N" "rand-$k-$N" "eval \"\$($LOAD $flag -m $TB/local/lz $pool)\" || exit 3
touch $TB/scratch/lz/out/rand-$mode.up
for i in \$(seq 600); do [ -e $TB/scratch/lz/out/rand-$mode.done ] && break; sleep 0.5; done" > /dev/null &
          jp=$!
          for _ in $(seq 600); do [[ -e $TB/scratch/lz/out/rand-$k.up ]] && break; sleep 0.5; done
          drop
          iops[$k]+=" $(fio_iops "$TB/local/lz/data/big.bin")"
          touch "$TB/scratch/lz/out/rand-$k.done"
          wait "$jp" || true ;;
        local)
          fresh
          on1 cp "$TB/shared/lz/big.bin" "$TB/local/lzlocal.bin"
          drop
          iops[$k]+=" $(fio_iops "$TB/local/lzlocal.bin")"
          on1 rm -f "$TB/local/lzlocal.bin" ;;
        shared) drop; iops[$k]+=" $(fio_iops "$TB/shared/lz/big.bin")" ;;
      esac
      log "4 KiB random reads on node 1, $k: ${iops[$k]} per s"
    done
  done
  for k in "${ways[@]}"; do
    R[rand.$k]=$(tr ' ' '\n' <<< "${iops[$k]}" | awk NF | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  done
  log "4 KiB random reads on node 1 (per s, median of $RAND_REPS): lazy ${R[rand.lazy]}, in place ${R[rand.inplace]}, lazy 64 KiB chunks ${R[rand.lazy-64k]}, in place 64 KiB chunks ${R[rand.inplace-64k]}, cached ${R[rand.full]}, local disk ${R[rand.local]}, shared storage ${R[rand.shared]}"
}
# the job's own clock, expanded in the job
# shellcheck disable=SC2016
T='$(date +%s.%N)'
LOAD="$TB/scratch/lz/sw-pool load"
POOL=$TB/shared/lz/large.sqfs
POOL64K=$TB/shared/lz/large64k.sqfs
for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate $NODE_RATE --storage-rate $STOR_RATE >/dev/null
  read -r -a NODES <<< "$(<"$TB/run/nodes")"
  mkdir -p "$TB/scratch/lz/out" "$TB/export/lz"
  chmod 1777 "$TB/scratch/lz/out"
  cp "$SW_BIN" "$SW_BIN-full" "$SW_BIN-serve" "$SW_BIN-enter" "$TB/scratch/lz/"
  SW=$TB/scratch/lz/sw-pool
  cp "$W/small.sqfs" "$W/large.sqfs" "$W/large64k.sqfs" "$TB/export/lz/"
  cp "$W/large/data/big.bin" "$TB/export/lz/big.bin"
  chmod -R a+rX "$TB/scratch/lz" "$TB/export/lz"
  [[ -n $RAND_ONLY && $N == "$EXTRA_N" ]] && { rand_reads; fresh; rm -rf "$TB/scratch/lz" "$TB/export/lz"; continue; }
  for s in small large; do
    for mode in lazy full; do
      flag=""; [[ $mode == lazy ]] && flag=--lazy
      fresh
      "$TESTBED/storage-bytes" --mark >/dev/null
      prof=""
      if [[ -n ${PROFILE:-} && $s == large ]]; then
        perf record -a -F 199 -o "$W/perf.data" >/dev/null 2>&1 & prof=$!
      fi
      out=$(job "$N" "$mode-$s-$N" "t0=$T
eval \"\$($LOAD $flag -m $TB/local/lz $TB/shared/lz/$s.sqfs)\" || exit 3
srun -N $N --ntasks-per-node=1 cat $TB/local/lz/data/small.txt >/dev/null || exit 4
t1=$T
echo first \$(awk -v a=\$t0 -v b=\$t1 'BEGIN{printf \"%.3f\", b-a}')
if [ $s = large ]; then
  t2=$T
  srun -N $N --ntasks-per-node=1 sh -c 'sha256sum < $TB/local/lz/data/big.bin' | sort | uniq -c | awk '{print \"sums\", \$1, \$2}'
  echo sha \$(awk -v a=\$t2 -v b=$T 'BEGIN{printf \"%.3f\", b-a}')
fi")
      if [[ -n $prof ]]; then
        kill -INT "$prof"; wait "$prof" || true
        cpu_report "$W/perf.data" "during the $mode job, large pool, N = $N" > "$OUT-cpu-$mode-$N.txt" || true
      fi
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
  # every node reads the same 5 % of the large pool through the lazy mount (when the filler holds it)
  (( FIVE <= LARGE_MB - BIG_MB )) && {
  fresh
  "$TESTBED/storage-bytes" --mark >/dev/null
  out=$(job "$N" "same5-$N" "eval \"\$($LOAD --lazy -m $TB/local/lz $POOL)\" || exit 3
srun -N $N --ntasks-per-node=1 sh -c 'dd if=$TB/local/lz/data/filler.bin bs=1M count=$FIVE status=none | sha256sum' | sort | uniq -c | awk '{print \"same5\", \$1}'")
  R[same5.$N]=$("$TESTBED/storage-bytes" --since-mark)
  R[same5.$N.ok]=$(awk '/^same5 /{print $2}' <<< "$out")
  log "N=$N same 5 % ($FIVE MiB) on every node: storage ${R[same5.$N]} B, ${R[same5.$N.ok]:-0} nodes agree"
  }
  if [[ $N == "$EXTRA_N" ]]; then
    # content: every file on every node through the lazy mount
    fresh
    out=$(job "$N" "content-$N" "eval \"\$($LOAD --lazy -m $TB/local/lz $POOL)\" || exit 3
srun -N $N --ntasks-per-node=1 sh -c 'cd $TB/local/lz && find . -type f | sort | xargs sha256sum | sha256sum' | awk -v w=$every '\$1 == w' | wc -l | sed 's/^/content /'")
    R[content.lazy]=$(awk '/^content /{print $2}' <<< "$out")
    log "N=$N lazy: every file right on ${R[content.lazy]:-0} of $N nodes"
    # ... and on node 1 through mount --in-place
    fresh
    on1 mkdir -p "$TB/local/lzip"
    on1 "$SW" -q mount --in-place "$POOL" "$TB/local/lzip" >/dev/null 2>&1 || true
    got=$(on1 sh -c "cd $TB/local/lzip && find . -type f | sort | xargs sha256sum | sha256sum" 2>/dev/null | cut -d' ' -f1)
    R[content.inplace]=$([[ $got == "$every" ]] && echo yes || echo no)
    log "mount --in-place: every file right: ${R[content.inplace]}"
    rand_reads
    on1 "$SW" -q umount "$TB/local/lzip" >/dev/null 2>&1 || true
    # reuse: a lazy job touching 30 %, then a full load (when 30 % reaches past the 1 GB file)
    (( THIRTY > 0 )) && {
    fresh
    job "$N" "touch30-$N" "eval \"\$($LOAD --lazy -m $TB/local/lz $POOL)\" || exit 3
srun -N $N --ntasks-per-node=1 sh -c 'cat $TB/local/lz/data/big.bin > /dev/null; dd if=$TB/local/lz/data/filler.bin bs=1M count=$THIRTY status=none > /dev/null'" > /dev/null
    drop
    "$TESTBED/storage-bytes" --mark >/dev/null
    out=$(job "$N" "reuse-$N" "eval \"\$($LOAD -m $TB/local/lz $POOL)\" || exit 3
srun -N $N --ntasks-per-node=1 sh -c 'cd $TB/local/lz && find . -type f | sort | xargs sha256sum | sha256sum' | awk -v w=$every '\$1 == w' | wc -l | sed 's/^/content /'")
    R[reuse]=$("$TESTBED/storage-bytes" --since-mark)
    R[reuse.ok]=$(awk '/^content /{print $2}' <<< "$out")
    log "N=$N full load after a lazy job touched 30 %: storage ${R[reuse]} B of $size, every file right on ${R[reuse.ok]:-0} nodes"
    }
  fi
  fresh
  rm -rf "$TB/scratch/lz" "$TB/export/lz"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
{
  echo "# On-demand loads: \`load --lazy\` against a full \`load\` ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "Pools: ${SMALL_MB} MB and ${LARGE_MB} MB of random data (squashfs; the large one holds the ${BIG_MB} MB file of the"
  echo "OSR test) on the testbed's shared storage (egress $STOR_RATE); node links $NODE_RATE. Batch jobs as the test user,"
  echo "one run each; caches dropped and emptied before each. first use = \`load [--lazy]\` + every node reading a small"
  echo "file of the pool; sha256 = every node's sha256 of the ${BIG_MB} MB file at once, after that."
  echo "\`bench/lazy.sh $SMALL_MB $LARGE_MB \"$COUNTS\" $EXTRA_N\`; $(nproc) cores."
  echo
  [[ -n $RAND_ONLY ]] || {
  echo "| N | first use, lazy small (s) | lazy large (s) | large ÷ small (goal ≤ 1.2) | full load large (s) | lazy ÷ full, large (goal ≤ 0.1) | same 5 % on every node: storage ÷ touched (goal ≤ 1.1) |"
  echo "|---|---|---|---|---|---|---|"
  for N in $COUNTS; do
    echo "| $N | ${R[lazy.small.$N.first]:-} | ${R[lazy.large.$N.first]:-} | $(ratio "${R[lazy.large.$N.first]:-0}" "${R[lazy.small.$N.first]:-0}") | ${R[full.large.$N.first]:-} | $(ratio "${R[lazy.large.$N.first]:-0}" "${R[full.large.$N.first]:-0}") | $(if [[ -n ${R[same5.$N]:-} ]]; then echo "$(calc "${R[same5.$N]} / ($FIVE * 1048576)") (${R[same5.$N.ok]:-0}/$N agree)"; else echo "— (the filler holds less than 5 %)"; fi) |"
  done
  echo
  echo "| N | lazy first use + sha256 (s) | full load + sha256 (s) | lazy ÷ full (goal ≤ 1.3) | sha256 from shared storage (s) | checksums ok lazy / full | storage bytes lazy / full ÷ pool |"
  echo "|---|---|---|---|---|---|---|"
  for N in $COUNTS; do
    l=$(calc "${R[lazy.large.$N.first]:-0} + ${R[lazy.large.$N.sha]:-0}")
    f=$(calc "${R[full.large.$N.first]:-0} + ${R[full.large.$N.sha]:-0}")
    echo "| $N | $l | $f | $(ratio "$l" "$f") | ${R[shared.$N]} | ${R[lazy.large.$N.ok]:-0}/$N / ${R[full.large.$N.ok]:-0}/$N | $(calc "${R[lazy.large.$N.bytes]} / $size") / $(calc "${R[full.large.$N.bytes]} / $size") |"
  done
  echo
  }
  if [[ -n ${R[rand.full]:-} ]]; then
    echo "4 KiB random reads of the ${BIG_MB} MB file on one node at N = $EXTRA_N (fio, psync, one reader, ${RAND} s,"
    echo "page cache dropped, every mount fresh: no chunk of the file on any node yet; median of $RAND_REPS, the ways"
    echo "interleaved); \"64 KiB chunks\": the same pool built with \`--chunk 64KiB\`:"
    echo
    echo "| way | reads per s | ÷ cached mount | ÷ 17 (two hops, 1 MiB chunks, \`lazy-20261126-1656.md\`) |"
    echo "|---|---|---|---|"
    for k in lazy inplace lazy-64k inplace-64k full local shared; do
      echo "| $k | ${R[rand.$k]} | $(ratio "${R[rand.$k]}" "${R[rand.full]}") | $(ratio "${R[rand.$k]}" 17) |"
    done
    echo
  fi
  if [[ -n ${R[rand.full]:-} && -z $RAND_ONLY ]]; then
    echo "At N = $EXTRA_N:"
    echo
    echo "- content of the ${LARGE_MB} MB pool (sha256 of every file): lazy, right on ${R[content.lazy]:-0} of $EXTRA_N nodes; \`mount --in-place\` on one node: ${R[content.inplace]}"
    echo "- full \`load\` after a lazy job in which every node read 30 % of the pool: shared storage sent $(calc "${R[reuse]:-0} / $size") of the pool (goal ≤ 0.72); every file right on ${R[reuse.ok]:-0} of $EXTRA_N nodes"
    echo
  fi
  echo "Machine load at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores."
} > "$OUT.md"
cat "$OUT.md"
echo "lazy: written to $OUT.md" >&2
