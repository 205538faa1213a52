#!/usr/bin/env bash
# P4 benchmark (not a test): reading a 1 GiB file through a sw-pool mount vs. natively from local disk,
# and the cost of verification: `sw-pool mount POOL` (the verified, read-only copy in the node-local
# cache) vs. the FUSE helper run on the pool file where it lies (what `mount FILE` did before it
# verified anything: `squashfuse_ll -o ro,nosuid,nodev POOL MNT`, `fuse2fs POOL MNT -o ro,...`).
#
#   bench/mount-read.sh [SIZE_MIB] [REPS]      (root; defaults 1024 MiB, 3 repetitions)
#
# For native, squashfuse_ll (squashfs pool) and fuse2fs (ext4 pool): sha256sum of the file and a raw
# read (dd bs=1M to /dev/null), cold (page cache dropped: `echo 3 > /proc/sys/vm/drop_caches`, which
# is machine-wide) and warm (read once before). Median of REPS runs. Writes
# bench/results/mount-read-<date>.md and prints it. Everything it makes is under one temporary
# directory on local disk, unmounted and removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SIZE_MIB=${1:-1024}
REPS=${2:-3}
SW=$REPO/target/release/sw-pool
[[ $(id -u) == 0 ]] || { echo "mount-read: run as root (drop_caches)" >&2; exit 1; }

# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW" || exit 1
W=$(mktemp -d /var/tmp/swp-bench-mount.XXXXXX)
export SW_POOL_STATE_DIR=$W/state SW_POOL_SYSTEM_CONFIG='' SW_POOL_USER_CONFIG='' SW_POOL_CACHE=$W
mkdir -m 700 "$W/state"
cleanup() {
  for m in "$W/mnt-sqfs" "$W/mnt-ext4"; do
    "$SW" umount -q --force "$m" 2>/dev/null || true
  done
  for m in "$W/inplace-sqfs" "$W/inplace-ext4"; do
    fusermount3 -u -z "$m" 2>/dev/null || true
  done
  rm -rf "$W"
}
trap cleanup EXIT

echo "mount-read: making a ${SIZE_MIB} MiB random file and the pools in $W" >&2
mkdir -p "$W/tree/data"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$W/tree/data/big.bin"
cp "$W/tree/data/big.bin" "$W/native.bin"
"$SW" build -q --name bench --version 1 "$W/pool.sqfs" "$W/tree"
"$SW" build -q --name bench --version 1 --format ext4 "$W/pool.ext4" "$W/tree"
mkdir "$W/mnt-sqfs" "$W/mnt-ext4" "$W/inplace-sqfs" "$W/inplace-ext4"
drop
s0=$(now); "$SW" mount -q "$W/pool.sqfs" "$W/mnt-sqfs"; s1=$(now)
drop
e0=$(now); "$SW" mount -q "$W/pool.ext4" "$W/mnt-ext4"; e1=$(now)
MOUNT_SQFS=$(elapsed "$s0" "$s1")
MOUNT_EXT4=$(elapsed "$e0" "$e1")
squashfuse_ll -o ro,nosuid,nodev "$W/pool.sqfs" "$W/inplace-sqfs"
fuse2fs "$W/pool.ext4" "$W/inplace-ext4" -o ro,nosuid,nodev,fakeroot >/dev/null 2>&1

KEYS="native squashfuse_ll squashfuse_ll-in-place fuse2fs fuse2fs-in-place"
declare -A FILE=([native]=$W/native.bin [squashfuse_ll]=$W/mnt-sqfs/data/big.bin [fuse2fs]=$W/mnt-ext4/data/big.bin
  [squashfuse_ll-in-place]=$W/inplace-sqfs/data/big.bin [fuse2fs-in-place]=$W/inplace-ext4/data/big.bin)
ref=$(sha256sum "$W/native.bin" | cut -d' ' -f1)
for k in squashfuse_ll squashfuse_ll-in-place fuse2fs fuse2fs-in-place; do
  [[ $(sha256sum "${FILE[$k]}" | cut -d' ' -f1) == "$ref" ]] || { echo "mount-read: $k reads different bytes" >&2; exit 1; }
done

# not lib.sh's median (2 decimals, the mean of the middle two): the time of the middle run as
# measured (the lower middle one for an even REPS), as the reports so far give it
median() { tr ' ' '\n' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
sha() { sha256sum "$1"; }
raw() { dd if="$1" of=/dev/null bs=1M status=none; }

declare -A R
for k in $KEYS; do
  f=${FILE[$k]}
  for op in sha raw; do
    cold=() warm=()
    for ((i = 0; i < REPS; i++)); do
      drop; cold+=("$(timeit "$op" "$f" 2>/dev/null)")
      "$op" "$f" >/dev/null 2>&1; warm+=("$(timeit "$op" "$f" 2>/dev/null)")
    done
    R[$k.$op.cold]=$(echo "${cold[*]}" | median)
    R[$k.$op.warm]=$(echo "${warm[*]}" | median)
    echo "mount-read: $k $op cold ${cold[*]} warm ${warm[*]}" >&2
  done
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
mbs() { awk -v s="$SIZE_MIB" -v t="$1" 'BEGIN { printf "%.0f", s * 1.048576 / t }'; }
out=$REPO/bench/results/mount-read-$(date +%Y%m%d-%H%M).md
{
  echo "# P4: reading through the mount vs. native ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "One ${SIZE_MIB} MiB file of random data, read from a squashfs pool (zstd, $(squashfuse_ll --version 2>&1 | head -1 | sed 's/ (c).*//')),"
  echo "an ext4 pool (fuse2fs $(dpkg-query -W -f '${Version}' fuse2fs 2>/dev/null)), and natively from the same local disk."
  echo "Median of $REPS runs; cold = page cache dropped before the run, warm = read once before."
  echo "\`bench/mount-read.sh $SIZE_MIB $REPS\`; $(nproc) cores, kernel $(uname -r)."
  echo
  echo "| path | sha256 cold (s) | ÷ native | sha256 warm (s) | ÷ native | dd cold (s) | MB/s | ÷ native | dd warm (s) | MB/s | ÷ native |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  for k in $KEYS; do
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "$k" \
      "${R[$k.sha.cold]}" "$(ratio "${R[$k.sha.cold]}" "${R[native.sha.cold]}")" \
      "${R[$k.sha.warm]}" "$(ratio "${R[$k.sha.warm]}" "${R[native.sha.warm]}")" \
      "${R[$k.raw.cold]}" "$(mbs "${R[$k.raw.cold]}")" "$(ratio "${R[$k.raw.cold]}" "${R[native.raw.cold]}")" \
      "${R[$k.raw.warm]}" "$(mbs "${R[$k.raw.warm]}")" "$(ratio "${R[$k.raw.warm]}" "${R[native.raw.warm]}")"
  done
  echo
  echo "Goal: sha256 through the default mount ÷ native ≤ 1.15."
  echo
  echo "## The cost of verification"
  echo
  echo "\`sw-pool mount POOL\` serves the verified, read-only copy in the node-local cache; \"in place\" is the FUSE"
  echo "helper run on the pool file where it lies (no verification: what \`mount FILE\` did before)."
  echo
  echo "| helper | sha256 cold verified ÷ in place | sha256 warm verified ÷ in place | \`sw-pool mount\` (copy + verify + mount, cold) |"
  echo "|---|---|---|---|"
  echo "| squashfuse_ll | $(ratio "${R[squashfuse_ll.sha.cold]}" "${R[squashfuse_ll-in-place.sha.cold]}") | $(ratio "${R[squashfuse_ll.sha.warm]}" "${R[squashfuse_ll-in-place.sha.warm]}") | ${MOUNT_SQFS} s |"
  echo "| fuse2fs | $(ratio "${R[fuse2fs.sha.cold]}" "${R[fuse2fs-in-place.sha.cold]}") | $(ratio "${R[fuse2fs.sha.warm]}" "${R[fuse2fs-in-place.sha.warm]}") | ${MOUNT_EXT4} s |"
  echo
  echo "Goal: sha256 through the verified path ÷ through the unverified mount ≤ 1.05."
  echo
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores (other work on this machine makes the figures noisy;"
  echo "all runs are in the script's stderr)."
} > "$out"
cat "$out"
echo "mount-read: written to $out" >&2
