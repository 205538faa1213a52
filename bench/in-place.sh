#!/usr/bin/env bash
# The verifying chunk server's data path (issues 30, 51; a benchmark, not a test): a pool served
# from where it lies by `sw-pool mount --in-place` (sw-pool-serve --tree: one FUSE hop, each chunk
# hashed against the manifest before any byte of it is parsed) against the cached mount
# (`sw-pool mount`: copy + verify into the node-local cache, then served from the copy) and the
# file on local disk, one run, the ways interleaved (each repetition in another order):
#   - random 4 KiB reads of a SIZE MiB file for RAND seconds (fio, psync, one reader, page cache
#     dropped, every mount fresh: no chunk of the file read yet): reads per second;
#   - the same in place on a pool built with `--chunk 64KiB` (each random read fetches and hashes
#     64 KiB instead of 1 MiB, for a manifest 16x longer);
#   - sha256 of the file, cold (page cache dropped, fresh mount) and warm;
#   - time to first use: mount + read one small file, cold.
# The pool lies on local disk here, so this measures the server (reads, hashing, FUSE), not shared
# storage (bench/lazy.sh measures random reads on the virtual cluster, lazy and in place).
#
#   flock /var/tmp/swp-cluster-session.lock bench/in-place.sh [SIZE_MIB] [REPS] [RAND_SECONDS]
#                                              (root; defaults 1024, 3, 5)
# Median of REPS. Writes bench/results/in-place-<date>.md and prints it; everything it makes is
# under one temporary directory, unmounted and removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SIZE_MIB=${1:-1024}
REPS=${2:-3}
RAND=${3:-5}
SW=$REPO/target/release/sw-pool
[[ $(id -u) == 0 ]] || { echo "in-place: run as root (drop_caches)" >&2; exit 1; }
command -v fio >/dev/null || { echo "in-place: fio missing (tools/setup-deps.sh installs it)" >&2; exit 1; }
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW" "$SW-serve" || exit 1
W=$(mktemp -d /var/tmp/swp-bench-inplace.XXXXXX)
export SW_POOL_STATE_DIR=$W/state SW_POOL_SYSTEM_CONFIG='' SW_POOL_USER_CONFIG='' SW_POOL_CACHE=$W/cache
mkdir -m 700 "$W/state" "$W/cache"
WAYS=(native cached inplace inplace-64k)
cleanup() {
  for k in "${WAYS[@]}"; do "$SW" umount -q --force "$W/m-$k" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup EXIT
OUT=$REPO/bench/results/in-place-$(date +%Y%m%d-%H%M)
: > "$OUT.log"

echo "in-place: a ${SIZE_MIB} MiB random file and its pools in $W" >&2
mkdir -p "$W/tree/data"
for k in "${WAYS[@]}"; do mkdir -p "$W/m-$k"; done
head -c $((SIZE_MIB << 20)) /dev/urandom > "$W/tree/data/big.bin"
echo hello > "$W/tree/data/small.txt"
cp "$W/tree/data/big.bin" "$W/native.bin"
"$SW" build -q --name bench --version 1 "$W/pool.sqfs" "$W/tree"
"$SW" build -q --name bench64k --version 1 --chunk 64KiB "$W/pool64k.sqfs" "$W/tree"
ref=$(sha256sum "$W/native.bin" | cut -d' ' -f1)

med() { tr ' ' '\n' | awk NF | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
file_of() { if [[ $1 == native ]]; then echo "$W/native.bin"; else echo "$W/m-$1/data/big.bin"; fi; }
# mount_way WAY: a fresh mount of WAY (nothing of it in the server's memory); the cached copy stays
mount_way() {
  case $1 in
    native) return 0 ;;
    cached) "$SW" mount -q "$W/pool.sqfs" "$W/m-cached" ;;
    inplace) "$SW" mount -q --in-place "$W/pool.sqfs" "$W/m-inplace" ;;
    inplace-64k) "$SW" mount -q --in-place "$W/pool64k.sqfs" "$W/m-inplace-64k" ;;
  esac
}
umount_way() { [[ $1 == native ]] || "$SW" umount -q "$W/m-$1"; }
first_use() { mount_way "$1" && cat "$W/m-$1/data/small.txt"; }
iops() {
  fio --name=r --filename="$1" --readonly --rw=randread --bs=4k --ioengine=psync \
    --time_based --runtime="$RAND" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["read"]["iops"]))'
}
sha() { sha256sum "$1"; }

declare -A V
for ((i = 0; i < REPS; i++)); do
  # each repetition in another order: ways rotated by i
  order=("${WAYS[@]:i % ${#WAYS[@]}}" "${WAYS[@]:0:i % ${#WAYS[@]}}")
  for k in "${order[@]}"; do
    f=$(file_of "$k")
    if [[ $k != native ]]; then
      [[ $k == cached ]] && rm -rf "${W:?}/cache"/*
      drop; V[$k.first]+=" $(timeit first_use "$k")"
      [[ $(sha256sum "$f" | cut -d' ' -f1) == "$ref" ]] || { echo "in-place: $k reads different bytes" >&2; exit 1; }
      umount_way "$k"; mount_way "$k"
    fi
    drop; V[$k.iops]+=" $(iops "$f")"
    umount_way "$k"; mount_way "$k"
    drop; V[$k.cold]+=" $(timeit sha "$f")"
    V[$k.warm]+=" $(timeit sha "$f")"
    umount_way "$k"
    log "rep $((i + 1)) $k: first use ${V[$k.first]:-}; IOPS ${V[$k.iops]}; sha256 cold ${V[$k.cold]}; warm ${V[$k.warm]}"
  done
done
declare -A R
for k in "${WAYS[@]}"; do
  for x in first iops cold warm; do R[$k.$x]=$(echo "${V[$k.$x]:-}" | med); done
done

{
  echo "# The verifying chunk server's data path ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "One ${SIZE_MIB} MiB file of random data in a squashfs pool on local disk. \"inplace\": \`sw-pool mount"
  echo "--in-place\` (sw-pool-serve --tree, one FUSE hop; each 1 MiB chunk hashed against the manifest before"
  echo "any byte of it is parsed); \"inplace-64k\": the same on a pool built with \`--chunk 64KiB\`; \"cached\":"
  echo "\`sw-pool mount\` (verified copy in the node-local cache, served from it); \"native\": the file on the same"
  echo "disk. Random reads: fio, 4 KiB, psync, one reader, ${RAND} s, page cache dropped and a fresh mount (no"
  echo "chunk read yet); the ways interleaved, median of $REPS; cold = page cache dropped, fresh mount."
  echo "\`bench/in-place.sh $SIZE_MIB $REPS $RAND\`; $(nproc) cores, kernel $(uname -r)."
  echo
  echo "| path | 4 KiB random reads, cold (per s) | ÷ cached | sha256 cold (s) | sha256 warm (s) | first use (s) |"
  echo "|---|---|---|---|---|---|"
  for k in "${WAYS[@]}"; do
    echo "| $k | ${R[$k.iops]} | $(ratio "${R[$k.iops]}" "${R[cached.iops]}") | ${R[$k.cold]} | ${R[$k.warm]} | ${R[$k.first]:--} |"
  done
  echo
  echo "| ratio | value | goal |"
  echo "|---|---|---|"
  echo "| random 4 KiB reads, in place ÷ cached | $(ratio "${R[inplace.iops]}" "${R[cached.iops]}") | ≥ 0.5 |"
  echo "| random 4 KiB reads, in place with 64 KiB chunks ÷ cached | $(ratio "${R[inplace-64k.iops]}" "${R[cached.iops]}") | ≥ 0.5 |"
  echo "| sha256 warm, in place ÷ cached | $(ratio "${R[inplace.warm]}" "${R[cached.warm]}") | ≤ 1.05 |"
  echo "| sha256 cold, in place ÷ cached | $(ratio "${R[inplace.cold]}" "${R[cached.cold]}") | ≤ 1.05 |"
  echo "| time to first use (mount + read a small file, cold), in place ÷ cached (copy + verify + mount) | $(ratio "${R[inplace.first]}" "${R[cached.first]}") | |"
  echo
  echo "Every figure (per repetition) in \`$(basename "$OUT").log\`. Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores."
} > "$OUT.md"
cat "$OUT.md"
echo "in-place: written to $OUT.md" >&2
