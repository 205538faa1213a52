#!/usr/bin/env bash
# Benchmark (not a test): sw-pool's own one-hop FUSE server (`sw-pool-serve --tree`) beside its
# peers, in one run, the configurations interleaved within each repetition:
#   native          the files on local disk
#   kernel          the pool's squashfs image mounted by the kernel (mount -t squashfs -o loop,ro)
#   erofs           the same tree as a kernel EROFS image (mkfs.erofs -zlz4hc, loop mount), when
#                   mkfs.erofs is installed and the kernel reads EROFS (else left out, and said so)
#   squashfuse_ll   squashfuse_ll -f -o ro,nosuid,nodev on the pool file (the fallback helper)
#   tree-cached     sw-pool-serve --tree --cached on the pool file (a verified node-local copy)
#   tree-in-place   sw-pool-serve --tree on the pool file, every chunk verified (`mount --in-place`)
#
#   bench/native-read.sh [SIZE_MIB] [REPS] [SMALL_TREE]   (root; 1024 MiB, 3, see below)
#
# The pool holds: a SIZE_MIB file of random data; a small-file tree: SMALL_TREE if given, else the
# Linux source's drivers/net from Debian's linux-source tarball (bench/oslo-table1.sh's tree and
# subset; the package is installed if missing), else /usr/share/doc; and a `pip install --target`
# tree of numpy and scipy (from the package registry, in this set-up).
# Workloads (every one cold = page cache dropped, and warm = run once before, except fio):
#   dd, sha256   the big file read with dd bs=1M and with sha256sum
#   fio 4k       random 4 KiB reads of the big file (fio psync, one job, 5 s from a dropped cache): IOPS
#   md5 batch    md5sum of every small file in one batch (find -type f -exec md5sum {} +)
#   md5 per file md5sum run once per file (find -exec md5sum {} \;) on the first 1500 files
#   find wc      find -type f | wc -l;  stat walk: find -printf of mode, size, owner, mtime
#   import       python3 -c 'import numpy, scipy.stats' with PYTHONPATH in the pool's pip tree
# The servers' own block caches are not dropped (64 MiB for sw-pool-serve). Median of REPS; ratios
# ÷ native (for fio, IOPS ÷ native's: higher is better). CPU seconds and peak RSS of each server from
# /usr/bin/time -v over the whole run (the same reads for each). The load average is printed before
# and after: run it on a quiet machine and repeat if the load was high. Writes
# bench/results/native-read-<date>.md and prints it; everything else lives in one temporary
# directory under /var/tmp, unmounted and removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SIZE_MIB=${1:-1024}
REPS=${2:-3}
SMALL=${3:-}
PY=${PY:-/usr/bin/python3}
SW=$REPO/target/release/sw-pool
SERVE=$REPO/target/release/sw-pool-serve
[[ $(id -u) == 0 ]] || { echo "native-read: run as root (drop_caches, loop mounts)" >&2; exit 1; }
command -v fio >/dev/null || { echo "native-read: fio is missing (tools/setup-deps.sh installs it)" >&2; exit 1; }

# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW" "$SERVE" || exit 1
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(now)
W=$(mktemp -d /var/tmp/swp-bench-native.XXXXXX)
KEYS="native kernel erofs squashfuse_ll tree-cached tree-in-place"
SERVERS="squashfuse_ll tree-cached tree-in-place"
declare -A PID=() SRV=()
cleanup() {
  for k in "${!SRV[@]}"; do kill -TERM "${SRV[$k]}" 2>/dev/null || true; done
  sleep 1
  for k in $KEYS; do
    [[ -d $W/mnt-$k ]] && { umount "$W/mnt-$k" 2>/dev/null || fusermount3 -u -z "$W/mnt-$k" 2>/dev/null || true; }
  done
  rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/tree/data"
head -c $((SIZE_MIB << 20)) /dev/urandom > "$W/tree/data/big.bin"
if [[ -z $SMALL ]]; then
  TARBALL=$(find /usr/src -maxdepth 1 -name "linux-source-*.tar.xz" | sort -V | tail -1)
  if [[ -z $TARBALL ]]; then
    apt-get install -y -qq --no-install-recommends linux-source-6.1 >/dev/null 2>&1 || true
    TARBALL=$(find /usr/src -maxdepth 1 -name "linux-source-*.tar.xz" | sort -V | tail -1)
  fi
  if [[ -n $TARBALL ]]; then
    top=$(basename "$TARBALL" .tar.xz)
    mkdir -p "$W/src"
    tar --no-same-owner -m -xJf "$TARBALL" -C "$W/src" "$top/drivers/net"
    mv "$W/src/$top/drivers/net" "$W/tree/small"
    SMALL="$(basename "$TARBALL")'s drivers/net"
  else
    cp -a /usr/share/doc "$W/tree/small"
    SMALL="/usr/share/doc (no linux-source tarball)"
  fi
else
  [[ -d $SMALL ]] || { echo "native-read: $SMALL is not a directory" >&2; exit 1; }
  cp -a "$SMALL" "$W/tree/small"
fi
"$PY" -m pip install -q --disable-pip-version-check --target "$W/tree/py" numpy scipy >/dev/null 2>&1 \
  || { echo "native-read: pip install --target numpy scipy failed" >&2; exit 1; }
PYVER=$(PYTHONPATH=$W/tree/py "$PY" -c 'import numpy, scipy; print("numpy", numpy.__version__, "scipy", scipy.__version__)')
echo "native-read: a ${SIZE_MIB} MiB random file, $SMALL and $PYVER in $W ($(el "$T0") s)" >&2
"$SW" build -q --name bench --version 1 "$W/pool.sqfs" "$W/tree"
DIGEST=$("$SW" inspect "$W/pool.sqfs" | awk '$1 == "digest" { print $2 }')
EROFS_NOTE=""
if command -v mkfs.erofs >/dev/null && grep -qw erofs /proc/filesystems \
  && mkfs.erofs -zlz4hc "$W/tree.erofs" "$W/tree" >/dev/null 2>&1; then
  :
else
  KEYS=${KEYS/erofs /}
  EROFS_NOTE="EROFS left out: mkfs.erofs missing or the kernel does not read EROFS."
fi
for k in $KEYS; do mkdir -p "$W/mnt-$k"; done
rmdir "$W/mnt-native"; ln -s "$W/tree" "$W/mnt-native"
mount -t squashfs -o loop,ro,nosuid,nodev "$W/pool.sqfs" "$W/mnt-kernel"
[[ -z $EROFS_NOTE ]] && mount -t erofs -o loop,ro,nosuid,nodev "$W/tree.erofs" "$W/mnt-erofs"
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
(cd "$W/tree/small" && find . -type f | LC_ALL=C sort | awk 'NR <= 1500') > "$W/perfile"
echo "native-read: set up in $(el "$T0") s; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

raw() { dd if="$1/data/big.bin" of=/dev/null bs=1M status=none; }
sha() { sha256sum "$1/data/big.bin"; }
md5() { md5_batch "$1/small"; }
md5p() { (cd "$1/small" && xargs -d '\n' -n1 md5sum < "$W/perfile"); }
count() { find "$1/small" -type f | wc -l; }
walk() { find "$1/small" -printf '%m %s %u %g %T@\n'; }
py() { PYTHONPATH=$1/py "$PY" -c 'import numpy, scipy.stats'; }
iops() {  # random 4 KiB reads for 5 s from a dropped cache: read IOPS (fio's terse field 8)
  drop
  fio --name=rand4k --filename="$1/data/big.bin" --readonly --rw=randread --bs=4k --ioengine=psync \
    --runtime=5 --time_based --invalidate=0 --minimal 2>/dev/null | cut -d';' -f8
}
OPS="raw sha md5 md5p count walk py"

declare -A T=()
for ((i = 0; i < REPS; i++)); do
  for op in $OPS fio; do
    for k in $KEYS; do
      if [[ $op == fio ]]; then
        T[$k.fio.cold]+=" $(iops "$W/mnt-$k")"
        echo "native-read: rep $i fio $k ${T[$k.fio.cold]##* } IOPS" >&2
        continue
      fi
      drop; c=$(timeit "$op" "$W/mnt-$k")
      w=$(timeit "$op" "$W/mnt-$k")
      T[$k.$op.cold]+=" $c"; T[$k.$op.warm]+=" $w"
      echo "native-read: rep $i $op $k cold $c warm $w" >&2
    done
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for k in $KEYS; do
  for op in $OPS fio; do
    for t in cold warm; do [[ -n ${T[$k.$op.$t]:-} ]] && T[$k.$op.$t]=$(echo "${T[$k.$op.$t]}" | median); done
  done
done

# the servers end (and their /usr/bin/time reports are written): unmounted, or, when a copy of the
# mount in another mount namespace (a container started meanwhile) keeps it alive, on SIGTERM
for k in $SERVERS; do
  fusermount3 -u "$W/mnt-$k" || true
  for _ in $(seq 30); do kill -0 "${PID[$k]}" 2>/dev/null || break; sleep 0.1; done
  kill -0 "${PID[$k]}" 2>/dev/null && kill -TERM "${SRV[$k]}"
  wait "${PID[$k]}" 2>/dev/null || true
  unset "SRV[$k]"
done
umount "$W/mnt-kernel"
[[ -z $EROFS_NOTE ]] && umount "$W/mnt-erofs"
tv() { awk -F': ' -v f="$2" '$1 ~ f { print $2 }' "$W/time-$1"; }
cpu() { awk -v u="$(tv "$1" 'User time')" -v s="$(tv "$1" 'System time')" 'BEGIN { printf "%.2f", u + s }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
table() {  # HEADER COLUMNS...: one row per configuration, each figure with its ratio to native
  echo "| path | $1 |"
  echo "|---|$(for _ in $(seq $(($# - 1))); do printf -- '---|---|'; done)"
  shift
  for k in $KEYS; do
    row="| $k"
    for c in "$@"; do row+=" | ${T[$k.$c]} | $(ratio "${T[$k.$c]}" "${T[native.$c]}")"; done
    echo "$row |"
  done
}
out=$REPO/bench/results/native-read-$(date +%Y%m%d-%H%M).md
{
  echo "# sw-pool's one-hop FUSE server beside its peers ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "\`bench/native-read.sh $SIZE_MIB $REPS${3:+ $3}\`: one ${SIZE_MIB} MiB file of random data, $SMALL"
  echo "($FILES files) and a pip --target tree of $PYVER in one zstd squashfs pool;"
  echo "$(squashfuse_ll --version 2>&1 | head -1 | sed 's/ (c).*//'); $(nproc) cores, kernel $(uname -r)."
  echo "Median of $REPS interleaved runs (seconds); cold = page cache dropped, warm = run once before; ÷ = ÷ native."
  [[ -n $EROFS_NOTE ]] && echo "$EROFS_NOTE"
  echo
  table "dd cold | ÷ | dd warm | ÷ | sha256 cold | ÷ | sha256 warm | ÷ | fio 4k IOPS | ÷" \
    raw.cold raw.warm sha.cold sha.warm fio.cold
  echo
  table "md5 batch cold | ÷ | md5 batch warm | ÷ | md5 per file cold | ÷ | md5 per file warm | ÷ | find wc cold | ÷ | find wc warm | ÷ | stat walk cold | ÷ | stat walk warm | ÷ | import cold | ÷ | import warm | ÷" \
    md5.cold md5.warm md5p.cold md5p.warm count.cold count.warm walk.cold walk.warm py.cold py.warm
  echo
  echo "In place ÷ cached: sha256 cold $(ratio "${T[tree-in-place.sha.cold]}" "${T[tree-cached.sha.cold]}"),"\
    "warm $(ratio "${T[tree-in-place.sha.warm]}" "${T[tree-cached.sha.warm]}"); fio 4k IOPS $(ratio "${T[tree-in-place.fio.cold]}" "${T[tree-cached.fio.cold]}")."
  echo
  echo "Servers over the whole run (the same reads for each), from \`/usr/bin/time -v\`:"
  echo
  echo "| server | CPU s (user+sys) | peak RSS (MiB) |"
  echo "|---|---|---|"
  for k in $SERVERS; do
    echo "| $k | $(cpu "$k") | $(awk -v r="$(tv "$k" 'Maximum resident')" 'BEGIN { printf "%.0f", r / 1024 }') |"
  done
  echo
  echo "Load average: $LOAD0 before, $(cut -d' ' -f1-3 /proc/loadavg) after, on $(nproc) cores; the run took $(el "$T0") s."
} > "$out"
cat "$out"
echo "native-read: written to $out" >&2
