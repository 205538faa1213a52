#!/usr/bin/env bash
# The verifying chunk server's data path (issue 30; a benchmark, not a test): a pool served from
# where it lies by `sw-pool mount --in-place` (sw-pool-serve verifying each chunk, squashfuse_ll on
# the served file: two FUSE hops) against today's cached mount (`sw-pool mount`: copy + verify into
# the node-local cache, squashfuse_ll on the copy: one hop) and the file on local disk, one run:
#   - sha256 of a SIZE MiB file, cold (page cache dropped) and warm; goal (issue 30): in place ÷
#     cached ≤ 1.1 warm;
#   - random 4 KiB reads of that file for RAND seconds (fio, psync, cold): IOPS;
#   - time to first use: mount + read one small file, for the in-place mount vs the cached mount
#     (which copies and verifies the whole pool first), cold.
# The pool lies on local disk here, so this measures the server (hashing, the second FUSE hop),
# not shared storage; t_80_in_place shows that shared storage sends each chunk once.
#
#   bench/in-place.sh [SIZE_MIB] [REPS] [RAND_SECONDS]   (root; defaults 1024, 3, 5)
#
# Median of REPS runs. Writes bench/results/in-place-<date>.md and prints it; everything it makes
# is under one temporary directory, unmounted and removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SIZE_MIB=${1:-1024}
REPS=${2:-3}
RAND=${3:-5}
SW=$REPO/target/release/sw-pool
[[ $(id -u) == 0 ]] || { echo "in-place: run as root (drop_caches)" >&2; exit 1; }
[[ -x $SW && -x $SW-serve ]] || { echo "in-place: build first (cargo build --release)" >&2; exit 1; }
command -v fio >/dev/null || { echo "in-place: fio missing (tools/setup-deps.sh installs it)" >&2; exit 1; }
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
W=$(mktemp -d /var/tmp/swp-bench-inplace.XXXXXX)
export SW_POOL_STATE_DIR=$W/state SW_POOL_SYSTEM_CONFIG='' SW_POOL_USER_CONFIG='' SW_POOL_CACHE=$W/cache
mkdir -m 700 "$W/state" "$W/cache"
cleanup() {
  for m in "$W/cached" "$W/inplace"; do "$SW" umount -q --force "$m" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT
OUT=$REPO/bench/results/in-place-$(date +%Y%m%d-%H%M)
: > "$OUT.log"

echo "in-place: a ${SIZE_MIB} MiB random file and its pool in $W" >&2
mkdir -p "$W/tree/data" "$W/cached" "$W/inplace"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$W/tree/data/big.bin"
echo hello > "$W/tree/data/small.txt"
cp "$W/tree/data/big.bin" "$W/native.bin"
"$SW" build -q --name bench --version 1 "$W/pool.sqfs" "$W/tree"
ref=$(sha256sum "$W/native.bin" | cut -d' ' -f1)

median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mount_cached() { "$SW" mount -q "$W/pool.sqfs" "$W/cached" && cat "$W/cached/data/small.txt"; }
mount_inplace() { "$SW" mount -q --in-place "$W/pool.sqfs" "$W/inplace" && cat "$W/inplace/data/small.txt"; }
unmount_all() {
  "$SW" umount -q "$W/cached" 2>/dev/null || true
  "$SW" umount -q "$W/inplace" 2>/dev/null || true
  rm -rf "$W/cache"/*
}

# time to first use (cold: nothing cached, page cache dropped)
declare -A R
fc=() fi=()
for ((i = 0; i < REPS; i++)); do
  unmount_all; drop; fc+=("$(timeit mount_cached)")
  unmount_all; drop; fi+=("$(timeit mount_inplace)")
done
R[first.cached]=$(echo "${fc[*]}" | median)
R[first.inplace]=$(echo "${fi[*]}" | median)
log "first use: cached ${fc[*]}; in place ${fi[*]}"

# reads: both mounted at once
unmount_all
mount_cached >/dev/null
mount_inplace >/dev/null
declare -A FILE=([native]=$W/native.bin [cached]=$W/cached/data/big.bin [inplace]=$W/inplace/data/big.bin)
for k in cached inplace; do
  [[ $(sha256sum "${FILE[$k]}" | cut -d' ' -f1) == "$ref" ]] || { echo "in-place: $k reads different bytes" >&2; exit 1; }
done
sha() { sha256sum "$1"; }
for k in native cached inplace; do
  cold=() warm=()
  for ((i = 0; i < REPS; i++)); do
    drop; cold+=("$(timeit sha "${FILE[$k]}")")
    sha "${FILE[$k]}" >/dev/null; warm+=("$(timeit sha "${FILE[$k]}")")
  done
  R[$k.cold]=$(echo "${cold[*]}" | median)
  R[$k.warm]=$(echo "${warm[*]}" | median)
  log "sha256 $k: cold ${cold[*]}; warm ${warm[*]}"
  iops=()
  for ((i = 0; i < REPS; i++)); do
    drop
    iops+=("$(fio --name=r --filename="${FILE[$k]}" --readonly --rw=randread --bs=4k --ioengine=psync \
      --time_based --runtime="$RAND" --output-format=json 2>/dev/null |
      python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))')")
  done
  R[$k.iops]=$(echo "${iops[*]}" | median)
  log "4k random $k: ${iops[*]} IOPS"
done

{
  echo "# The verifying chunk server's data path ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "One ${SIZE_MIB} MiB file of random data in a squashfs pool on local disk. \"in place\": \`sw-pool mount"
  echo "--in-place\` (sw-pool-serve hashes each 1 MiB chunk against the manifest once, squashfuse_ll reads"
  echo "the served file: two FUSE hops); \"cached\": \`sw-pool mount\` (verified copy in the node-local"
  echo "cache, squashfuse_ll on it: one hop); \"native\": the file on the same disk. Median of $REPS;"
  echo "cold = page cache dropped. \`bench/in-place.sh $SIZE_MIB $REPS $RAND\`; $(nproc) cores, kernel $(uname -r)."
  echo
  echo "| path | sha256 cold (s) | sha256 warm (s) | 4 KiB random reads, cold (IOPS) |"
  echo "|---|---|---|---|"
  for k in native cached inplace; do
    echo "| $k | ${R[$k.cold]} | ${R[$k.warm]} | ${R[$k.iops]} |"
  done
  echo
  echo "| ratio | value | goal |"
  echo "|---|---|---|"
  echo "| sha256 warm, in place ÷ cached | $(ratio "${R[inplace.warm]}" "${R[cached.warm]}") | ≤ 1.1 |"
  echo "| sha256 cold, in place ÷ cached | $(ratio "${R[inplace.cold]}" "${R[cached.cold]}") | |"
  echo "| random 4 KiB IOPS, in place ÷ cached | $(ratio "${R[inplace.iops]}" "${R[cached.iops]}") | |"
  echo "| time to first use (mount + read a small file, cold), in place ÷ cached | $(ratio "${R[first.inplace]}" "${R[first.cached]}") (${R[first.inplace]} s vs ${R[first.cached]} s) | |"
  echo
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores."
} > "$OUT.md"
cat "$OUT.md"
echo "in-place: written to $OUT.md" >&2
