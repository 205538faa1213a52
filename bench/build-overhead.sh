#!/usr/bin/env bash
# Benchmark (not a test): `sw-pool build` against the bare mke2fs -d / mksquashfs call it wraps, on
# (a) the paper's tree (one 1 GB random file, -s 1020MB) and (b) a tree of 50,000 small files.
# Each pair is interleaved, warm page cache, RUNS repetitions (default 3), median and spread reported.
# Writes bench/results/build-overhead-<date>.md.  usage: bench/build-overhead.sh [--quick]
# CASES="ext2 ext4 sqfs sqfs-small" (default: all four) picks the cases.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. "$PWD/bench/lib.sh"
SW=${SW:-$PWD/target/release/sw-pool}  # SW=/path/to/other/sw-pool to measure another build
RUNS=${RUNS:-3}
BIG=1GB; FILES=50000
if [[ ${1:-} == --quick ]]; then BIG=100MB; FILES=5000; RUNS=2; fi
W=${BENCH_DIR:-/var/tmp/swp-bench-build}
rm -rf "$W"; mkdir -p "$W/paper"
trap 'rm -rf "$W"' EXIT
head -c "$BIG" /dev/urandom > "$W/paper/random.data"
python3 bench/gen-tree.py "$W/small" --files "$FILES" >/dev/null
SIZE_BIG=$(( $(stat -c %s "$W/paper/random.data") * 102 / 100 ))
# the bare calls use exactly the options sw-pool passes (see `sw-pool --log debug build …`): the fixed
# UUID / hash seed that make the image reproducible, no metadata_csum (sw-pool rewrites atime/ctime in
# the inode tables afterwards; the manifest's chunk hashes protect the metadata instead)
UUID=fa5f9661-45af-42d8-950b-0648ff6d0ee9
E2OPTS="-b 4096 -I 256 -m 0 -O ^metadata_csum -U $UUID -E hash_seed=$UUID,root_owner=0:0"
CASES=${CASES:-ext2 ext4 sqfs sqfs-small}
want() { [[ " $CASES " == *" $1 "* ]]; }
n_small=$(( $(find "$W/small" | wc -l) * 11 / 10 + 64 ))
declare -A T
run_pair() {  # name, bare command (string), sw-pool command (string)
  local name=$1 bare=$2 ours=$3 _
  for _ in $(seq "$RUNS"); do
    rm -f "$W"/out*; sync
    T[$name,bare]+="$(timeit bash -c "$bare" 2>/dev/null) "
    rm -f "$W"/out*; sync
    T[$name,ours]+="$(timeit bash -c "$ours" 2>/dev/null) "
  done
}
# stats "T1 T2 ...": the median, the smallest and the largest (2 decimals)
stats() {
  local v; v=$(tr ' ' '\n' <<< "$1" | grep . | sort -g)
  echo "$(median <<< "$v") $(awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.2f %.2f", lo, hi }' <<< "$v")"
}
# warm the page cache with one untimed pass over each tree
cat "$W/paper/random.data" > /dev/null; find "$W/small" -type f -exec cat {} + > /dev/null

load_start=$(uptime)
want ext2 && run_pair "ext2 paper ($BIG, -s ${SIZE_BIG})" \
  "truncate -s $SIZE_BIG $W/out && E2FSPROGS_FAKE_TIME=1 mke2fs -q -F -t ext2 $E2OPTS -N 100 -d $W/paper $W/out" \
  "$SW -q build -s $SIZE_BIG --format ext2 $W/out $W/paper"
want ext4 && run_pair "ext4 $FILES small files" \
  "truncate -s \$(( $(du -sb "$W/small" | cut -f1) * 3 / 2 + 64000000 )) $W/out && E2FSPROGS_FAKE_TIME=1 mke2fs -q -F -t ext4 $E2OPTS -N $n_small -d $W/small $W/out" \
  "$SW -q build --format ext4 $W/out $W/small"
want sqfs && run_pair "squashfs paper ($BIG)" \
  "mksquashfs $W/paper $W/out -noappend -no-progress -quiet -comp zstd" \
  "$SW -q build --format squashfs $W/out $W/paper"
want sqfs-small && run_pair "squashfs $FILES small files" \
  "mksquashfs $W/small $W/out -noappend -no-progress -quiet -comp zstd" \
  "$SW -q build --format squashfs $W/out $W/small"

mkdir -p bench/results
out=bench/results/build-overhead-$(date +%F).md
[[ -e $out ]] && out=bench/results/build-overhead-$(date +%F-%H%M).md  # keep earlier results of the day
{
  echo "# sw-pool build vs the bare mke2fs -d / mksquashfs call"
  echo
  echo "$(date -u +%FT%TZ), $(nproc) cores, sw-pool: \`$SW\`, $RUNS runs each (interleaved, warm page cache), times in seconds: median (min–max)."
  echo "Goal: overhead ≤ 10 % (ratio ≤ 1.10)."
  echo
  echo "Machine load at the start: \`$load_start\`; at the end: \`$(uptime)\` (only an idle machine gives meaningful ratios)."
  echo
  echo "| case | bare tool | sw-pool build | ratio | goal |"
  echo "|---|---|---|---|---|"
  for name in "ext2 paper ($BIG, -s ${SIZE_BIG})" "ext4 $FILES small files" "squashfs paper ($BIG)" "squashfs $FILES small files"; do
    [[ -n ${T[$name,bare]:-} ]] || continue
    read -r bm bl bh <<<"$(stats "${T[$name,bare]}")"
    read -r om ol oh <<<"$(stats "${T[$name,ours]}")"
    ratio=$(python3 -c "print(f'{$om/$bm:.3f}')")
    ok=$(python3 -c "print('pass' if $om/$bm <= 1.10 else 'MISSED')")
    echo "| $name | $bm ($bl–$bh) | $om ($ol–$oh) | $ratio | $ok |"
  done
  echo
  echo "sw-pool build does what the bare call does, plus: a walk of the tree (sizes, checks), one read of the"
  echo "image to hash its chunks (BLAKE3, all cores), the manifest trailer, fsync and rename."
} > "$out"
cat "$out"
