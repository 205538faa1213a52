#!/usr/bin/env bash
# Benchmark (not a test): sw-pool's own one-hop FUSE server (`sw-pool-serve --tree`) beside its
# peers, in one run, the configurations interleaved within each repetition:
#   native          the files on local disk
#   kernel          the pool's squashfs image mounted by the kernel (mount -t squashfs -o loop,ro)
#   squashfuse_ll   squashfuse_ll -f -o ro,nosuid,nodev on the pool file (what `sw-pool mount` runs)
#   two-hop         today's `mount --in-place`: sw-pool-serve (verifying, image as a file) with
#                   squashfuse_ll on that file
#   tree-cached     sw-pool-serve --tree --cached on the pool file (a verified node-local copy)
#   tree-in-place   sw-pool-serve --tree on the pool file, every chunk verified (`mount --in-place`)
#
#   bench/native-read.sh [SIZE_MIB] [REPS] [SMALL_TREE]   (root; 1024 MiB, 3, /usr/share/doc)
#
# Workloads: a SIZE_MIB file of random data read with dd bs=1M and with sha256sum; SMALL_TREE (a
# copy, thousands of small files) read with md5sum batched (find -type f -exec md5sum {} +), counted
# (find -type f | wc -l) and stat-walked (find -printf of mode, size, owner, mtime). Cold = page
# cache dropped (echo 3 > /proc/sys/vm/drop_caches; the servers' own block caches are not: 64 MiB
# for sw-pool-serve, squashfuse_ll's is smaller), warm = run once before. Median of REPS. CPU
# seconds and peak RSS of each server from /usr/bin/time -v over the whole run. Writes
# bench/results/native-read-<date>.md and prints it; everything else lives in one temporary
# directory under /var/tmp, unmounted and removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SIZE_MIB=${1:-1024}
REPS=${2:-3}
SMALL=${3:-/usr/share/doc}
SW=$REPO/target/release/sw-pool
SERVE=$REPO/target/release/sw-pool-serve
[[ $(id -u) == 0 ]] || { echo "native-read: run as root (drop_caches, loop mounts)" >&2; exit 1; }
[[ -x $SW && -x $SERVE ]] || { echo "native-read: build first (cargo build --release)" >&2; exit 1; }
[[ -d $SMALL ]] || { echo "native-read: $SMALL is not a directory" >&2; exit 1; }

# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
W=$(mktemp -d /var/tmp/swp-bench-native.XXXXXX)
KEYS="native kernel squashfuse_ll two-hop tree-cached tree-in-place"
declare -A PID=() SRV=()
cleanup() {
  for k in "${!SRV[@]}"; do kill -TERM "${SRV[$k]}" 2>/dev/null || true; done
  sleep 1
  for k in $KEYS; do
    [[ -d $W/mnt-$k ]] && { umount "$W/mnt-$k" 2>/dev/null || fusermount3 -u -z "$W/mnt-$k" 2>/dev/null || true; }
  done
  [[ -d $W/img-two-hop ]] && { fusermount3 -u -z "$W/img-two-hop" 2>/dev/null || true; }
  rm -rf "$W"
}
trap cleanup EXIT

echo "native-read: a ${SIZE_MIB} MiB random file and a copy of $SMALL in $W" >&2
mkdir -p "$W/tree/data"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$W/tree/data/big.bin"
cp -a "$SMALL" "$W/tree/small"
"$SW" build -q --name bench --version 1 "$W/pool.sqfs" "$W/tree"
DIGEST=$("$SW" inspect "$W/pool.sqfs" | awk '$1 == "digest" { print $2 }')
for k in $KEYS; do mkdir -p "$W/mnt-$k"; done
rmdir "$W/mnt-native"; ln -s "$W/tree" "$W/mnt-native"
mount -t squashfs -o loop,ro,nosuid,nodev "$W/pool.sqfs" "$W/mnt-kernel"
start() {  # KEY CMD...: a server under /usr/bin/time -v, in the background; waits for its mount
  local k=$1; shift
  /usr/bin/time -v -o "$W/time-$k" "$@" 2>"$W/log-$k" &
  PID[$k]=$!
  for _ in $(seq 100); do
    if mountpoint -q "$W/mnt-$k"; then
      SRV[$k]=$(ps -o pid= --ppid "${PID[$k]}" | tr -d ' ')  # the server: /usr/bin/time's child
      return 0
    fi
    sleep 0.1
  done
  echo "native-read: $k did not mount: $(cat "$W/log-$k")" >&2; exit 1
}
start squashfuse_ll squashfuse_ll -f -o ro,nosuid,nodev "$W/pool.sqfs" "$W/mnt-squashfuse_ll"
mkdir "$W/img-two-hop"
start two-hop "$SERVE" --pool "$W/pool.sqfs" --digest "$DIGEST" --dir "$W/img-two-hop" -- \
  squashfuse_ll -f -o ro,nosuid,nodev "{image}" "$W/mnt-two-hop"
start tree-cached "$SERVE" --tree --cached --pool "$W/pool.sqfs" --digest "$DIGEST" --dir "$W/mnt-tree-cached"
start tree-in-place "$SERVE" --tree --pool "$W/pool.sqfs" --digest "$DIGEST" --dir "$W/mnt-tree-in-place"

ref=$(sha256sum "$W/tree/data/big.bin" | cut -d' ' -f1)
md5_batch() { (cd "$1" && find . -type f -exec md5sum {} + | LC_ALL=C sort -k2 | md5sum); }
refsmall=$(md5_batch "$W/tree/small")
for k in $KEYS; do
  [[ $(sha256sum "$W/mnt-$k/data/big.bin" | cut -d' ' -f1) == "$ref" ]] || { echo "native-read: $k reads different bytes" >&2; exit 1; }
  [[ $(md5_batch "$W/mnt-$k/small") == "$refsmall" ]] || { echo "native-read: $k reads a different small tree" >&2; exit 1; }
done
FILES=$(find "$W/tree/small" -type f | wc -l)

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
raw() { dd if="$1/data/big.bin" of=/dev/null bs=1M status=none; }
sha() { sha256sum "$1/data/big.bin"; }
md5() { md5_batch "$1/small"; }
count() { find "$1/small" -type f | wc -l; }
walk() { find "$1/small" -printf '%m %s %u %g %T@\n'; }
OPS="raw sha md5 count walk"

declare -A T=()
for ((i = 0; i < REPS; i++)); do
  for op in $OPS; do
    for k in $KEYS; do
      drop; c=$(timeit "$op" "$W/mnt-$k")
      w=$(timeit "$op" "$W/mnt-$k")
      T[$k.$op.cold]+=" $c"; T[$k.$op.warm]+=" $w"
      echo "native-read: rep $i $op $k cold $c warm $w" >&2
    done
  done
done
for k in $KEYS; do
  for op in $OPS; do
    for t in cold warm; do T[$k.$op.$t]=$(echo "${T[$k.$op.$t]}" | median); done
  done
done

# the servers end (and their /usr/bin/time reports are written): unmounted, or, when a copy of the
# mount in another mount namespace (a container started meanwhile) keeps it alive, on SIGTERM
for k in squashfuse_ll two-hop tree-cached tree-in-place; do
  fusermount3 -u "$W/mnt-$k" || true
  for _ in $(seq 30); do kill -0 "${PID[$k]}" 2>/dev/null || break; sleep 0.1; done
  kill -0 "${PID[$k]}" 2>/dev/null && kill -TERM "${SRV[$k]}"
  wait "${PID[$k]}" 2>/dev/null || true
  unset "SRV[$k]"
done
umount "$W/mnt-kernel"
tv() { awk -F': ' -v f="$2" '$1 ~ f { print $2 }' "$W/time-$1"; }
cpu() { awk -v u="$(tv "$1" 'User time')" -v s="$(tv "$1" 'System time')" 'BEGIN { printf "%.2f", u + s }'; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
out=$REPO/bench/results/native-read-$(date +%Y%m%d-%H%M).md
{
  echo "# sw-pool's one-hop FUSE server beside its peers ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "\`bench/native-read.sh $SIZE_MIB $REPS $SMALL\`: one ${SIZE_MIB} MiB file of random data and a copy of $SMALL"
  echo "($FILES files) in one zstd squashfs pool; $(squashfuse_ll --version 2>&1 | head -1 | sed 's/ (c).*//'); $(nproc) cores, kernel $(uname -r)."
  echo "Median of $REPS interleaved runs (seconds); cold = page cache dropped, warm = run once before; ÷ = ÷ native."
  echo
  echo "| path | dd cold | ÷ | dd warm | ÷ | sha256 cold | ÷ | sha256 warm | ÷ | md5 batch cold | ÷ | md5 batch warm | ÷ | find wc cold | ÷ | stat walk cold | ÷ | stat walk warm | ÷ |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  for k in $KEYS; do
    row="| $k"
    for c in raw.cold raw.warm sha.cold sha.warm md5.cold md5.warm count.cold walk.cold walk.warm; do
      row+=" | ${T[$k.$c]} | $(ratio "${T[$k.$c]}" "${T[native.$c]}")"
    done
    echo "$row |"
  done
  echo
  echo "Servers over the whole run (the same reads for each), from \`/usr/bin/time -v\`:"
  echo
  echo "| server | CPU s (user+sys) | peak RSS (MiB) |"
  echo "|---|---|---|"
  for k in squashfuse_ll two-hop tree-cached tree-in-place; do
    echo "| $k | $(cpu "$k") | $(awk -v r="$(tv "$k" 'Maximum resident')" 'BEGIN { printf "%.0f", r / 1024 }') |"
  done
  echo
  echo "two-hop's figures include its squashfuse_ll child (waited for by sw-pool-serve; peak RSS is the larger of the two)."
  echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores (other work on this machine makes the figures noisy)."
} > "$out"
cat "$out"
echo "native-read: written to $out" >&2
