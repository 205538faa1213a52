#!/usr/bin/env bash
# Benchmark (not a test): two builds of sw-pool's one-hop FUSE server (`sw-pool-serve --tree`),
# A and B, on the same pool in one run, interleaved, beside local disk and the kernel's squashfs:
#
#   bench/tree-ab.sh A_SERVE B_SERVE [REPS] [SMALL_TREE]   (root; REPS 5)
#
# A_SERVE and B_SERVE are two sw-pool-serve binaries (e.g. main's and a branch's, each built with
# its own CARGO_TARGET_DIR); A_NAME and B_NAME label them in the report (default a, b); SW is the
# sw-pool that builds the pool (default target/release/sw-pool). Configurations:
#   native        the files on local disk
#   kernel        the pool mounted by the kernel's squashfs (loop, ro)
#   A, B          sw-pool-serve --tree --cached on the pool file
#   A-in-place, B-in-place   sw-pool-serve --tree on the pool file, every chunk verified
# The pool holds a small-file tree (SMALL_TREE if given, else the Linux source's drivers/net from
# Debian's linux-source tarball, as bench/native-read.sh) and a `pip install --target` tree of
# numpy and scipy. Workloads, each cold (page cache dropped) and warm (run once before):
#   md5 batch     find -type f -exec md5sum {} +  (every small file, one batch)
#   md5 per file  md5sum once per file, the first 1500
#   find wc       find -type f | wc -l;   stat walk: find -printf of mode, size, owner, mtime
#   import        python3 -c 'import numpy, scipy.stats'
# Every repetition runs every workload on every configuration, the order of the configurations
# reversed every other repetition; median of REPS (seconds) and its ratio to native, then B ÷ A.
# For each server: the FUSE requests one warm run of each workload cost it (reads of /dev/fuse, the
# `syscr` of /proc/PID/io) and its CPU time in that run (/proc/PID/stat), medians, and its CPU
# seconds over the whole run: figures a busy machine does not change. The load average is
# printed before and after: the ratios of one run are the figures to compare on a busy machine.
# Writes bench/results/<PREFIX>-<date>.md (PREFIX default tree-ab) and prints it; everything else lives in one temporary
# directory under /var/tmp, unmounted and removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
A_SERVE=${1:?usage: bench/tree-ab.sh A_SERVE B_SERVE [REPS] [SMALL_TREE]}
B_SERVE=${2:?usage: bench/tree-ab.sh A_SERVE B_SERVE [REPS] [SMALL_TREE]}
REPS=${3:-5}
SMALL=${4:-}
SMALL_ARG=$SMALL
A_NAME=${A_NAME:-a}
B_NAME=${B_NAME:-b}
PREFIX=${PREFIX:-tree-ab}
PY=${PY:-/usr/bin/python3}
SW=${SW:-$REPO/target/release/sw-pool}
[[ $(id -u) == 0 ]] || { echo "tree-ab: run as root (drop_caches, loop mounts)" >&2; exit 1; }
for b in "$A_SERVE" "$B_SERVE" "$SW"; do
  [[ -x $b ]] || { echo "tree-ab: $b is not a program (build first)" >&2; exit 1; }
done

# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
T0=$(now)
W=$(mktemp -d /var/tmp/swp-bench-tree-ab.XXXXXX)
KEYS="native kernel A B A-in-place B-in-place"
SERVERS="A B A-in-place B-in-place"
declare -A SRV=()
cleanup() {
  for k in "${!SRV[@]}"; do kill -TERM "${SRV[$k]}" 2>/dev/null || true; done
  sleep 1
  for k in $KEYS; do
    [[ -d $W/mnt-$k ]] && { umount "$W/mnt-$k" 2>/dev/null || fusermount3 -u -z "$W/mnt-$k" 2>/dev/null || true; }
  done
  rm -rf "$W"
}
trap cleanup EXIT

mkdir -p "$W/tree"
if [[ -z $SMALL ]]; then
  TARBALL=$(find /usr/src -maxdepth 1 -name "linux-source-*.tar.xz" | sort -V | tail -1)
  [[ -n $TARBALL ]] || { echo "tree-ab: no /usr/src/linux-source-*.tar.xz: give SMALL_TREE" >&2; exit 1; }
  top=$(basename "$TARBALL" .tar.xz)
  mkdir -p "$W/src"
  tar --no-same-owner -m -xJf "$TARBALL" -C "$W/src" "$top/drivers/net"
  mv "$W/src/$top/drivers/net" "$W/tree/small"
  rm -rf "$W/src"
  SMALL="$(basename "$TARBALL")'s drivers/net"
else
  [[ -d $SMALL ]] || { echo "tree-ab: $SMALL is not a directory" >&2; exit 1; }
  cp -a "$SMALL" "$W/tree/small"
fi
"$PY" -m pip install -q --disable-pip-version-check --target "$W/tree/py" numpy scipy >/dev/null 2>&1 \
  || { echo "tree-ab: pip install --target numpy scipy failed" >&2; exit 1; }
PYVER=$(PYTHONPATH=$W/tree/py "$PY" -c 'import numpy, scipy; print("numpy", numpy.__version__, "scipy", scipy.__version__)')
"$SW" build -q --name bench --version 1 "$W/pool.sqfs" "$W/tree"
DIGEST=$("$SW" inspect "$W/pool.sqfs" | awk '$1 == "digest" { print $2 }')
for k in $KEYS; do mkdir -p "$W/mnt-$k"; done
rmdir "$W/mnt-native"; ln -s "$W/tree" "$W/mnt-native"
mount -t squashfs -o loop,ro,nosuid,nodev "$W/pool.sqfs" "$W/mnt-kernel"
start() {  # KEY SERVE [--cached]: a tree server in the background; waits for its mount
  local k=$1 serve=$2; shift 2
  "$serve" --tree "$@" --pool "$W/pool.sqfs" --digest "$DIGEST" --dir "$W/mnt-$k" 2>"$W/log-$k" &
  SRV[$k]=$!
  for _ in $(seq 100); do mountpoint -q "$W/mnt-$k" && return 0; sleep 0.1; done
  echo "tree-ab: $k did not mount: $(cat "$W/log-$k")" >&2; exit 1
}
start A "$A_SERVE" --cached
start B "$B_SERVE" --cached
start A-in-place "$A_SERVE"
start B-in-place "$B_SERVE"

md5_batch() { (cd "$1" && find . -type f -exec md5sum {} + | LC_ALL=C sort -k2 | md5sum); }
refsmall=$(md5_batch "$W/tree/small")
for k in $KEYS; do
  [[ $(md5_batch "$W/mnt-$k/small") == "$refsmall" ]] || { echo "tree-ab: $k reads a different small tree" >&2; exit 1; }
done
FILES=$(find "$W/tree/small" -type f | wc -l)
(cd "$W/tree/small" && find . -type f | LC_ALL=C sort | awk 'NR <= 1500') > "$W/perfile"
echo "tree-ab: set up in $(el "$T0") s; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

md5() { md5_batch "$1/small"; }
md5p() { (cd "$1/small" && xargs -d '\n' -n1 md5sum < "$W/perfile"); }
count() { find "$1/small" -type f | wc -l; }
walk() { find "$1/small" -printf '%m %s %u %g %T@\n'; }
py() { PYTHONPATH=$1/py "$PY" -c 'import numpy, scipy.stats'; }
OPS="md5 md5p count walk py"
syscr() { awk '$1 == "syscr:" { print $2 }' "/proc/${SRV[$1]}/io"; }
ticks() { awk '{ print $14 + $15 }' "/proc/${SRV[$1]}/stat"; }
hz=$(getconf CLK_TCK)

declare -A T=()
for ((i = 0; i < REPS; i++)); do
  order=$KEYS
  ((i % 2)) && order=$(tr ' ' '\n' <<< "$KEYS" | tac | tr '\n' ' ')
  for op in $OPS; do
    for k in $order; do
      drop; c=$(timeit "$op" "$W/mnt-$k")
      [[ -n ${SRV[$k]:-} ]] && { r0=$(syscr "$k"); c0=$(ticks "$k"); }
      w=$(timeit "$op" "$W/mnt-$k")
      if [[ -n ${SRV[$k]:-} ]]; then
        T[$k.$op.req]+=" $(($(syscr "$k") - r0))"
        T[$k.$op.cpu]+=" $((($(ticks "$k") - c0) * 1000 / hz))"
      fi
      T[$k.$op.cold]+=" $c"; T[$k.$op.warm]+=" $w"
      echo "tree-ab: rep $i $op $k cold $c warm $w" >&2
    done
  done
done
med() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for k in $KEYS; do
  for op in $OPS; do
    for t in cold warm req cpu; do [[ -n ${T[$k.$op.$t]:-} ]] && T[$k.$op.$t]=$(echo "${T[$k.$op.$t]}" | med); done
  done
done
declare -A CPU=()
for k in $SERVERS; do
  CPU[$k]=$(awk -v hz="$hz" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/${SRV[$k]}/stat")
done
for k in $SERVERS; do
  fusermount3 -u "$W/mnt-$k" || kill -TERM "${SRV[$k]}"
  wait "${SRV[$k]}" 2>/dev/null || true
  unset "SRV[$k]"
done
umount "$W/mnt-kernel"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
label() { case $1 in A) echo "$A_NAME" ;; B) echo "$B_NAME" ;; A-in-place) echo "$A_NAME in place" ;; B-in-place) echo "$B_NAME in place" ;; *) echo "$1" ;; esac; }
COLS="md5.cold md5.warm md5p.cold md5p.warm count.cold count.warm walk.cold walk.warm py.cold py.warm"
out=$REPO/bench/results/$PREFIX-$(date +%Y%m%d-%H%M).md
{
  echo "# Two builds of sw-pool's tree server, A/B ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "\`bench/tree-ab.sh A B $REPS${SMALL_ARG:+ $SMALL_ARG}\`: A = $A_NAME (\`$A_SERVE\`), B = $B_NAME (\`$B_SERVE\`);"
  echo "$SMALL ($FILES files) and a pip --target tree of $PYVER in one zstd squashfs pool; $(nproc) cores,"
  echo "kernel $(uname -r). Median of $REPS interleaved runs (seconds); cold = page cache dropped, warm = run once before; ÷ = ÷ native."
  echo
  echo "| path | md5 batch cold | ÷ | md5 batch warm | ÷ | md5 per file cold | ÷ | md5 per file warm | ÷ | find wc cold | ÷ | find wc warm | ÷ | stat walk cold | ÷ | stat walk warm | ÷ | import cold | ÷ | import warm | ÷ |"
  echo "|---|$(for _ in $COLS; do printf -- '---|---|'; done)"
  for k in $KEYS; do
    row="| $(label "$k")"
    for c in $COLS; do row+=" | ${T[$k.$c]} | $(ratio "${T[$k.$c]}" "${T[native.$c]}")"; done
    echo "$row |"
  done
  echo
  echo "B ÷ A (the same column's medians):"
  echo
  echo "| pair | $(for c in $COLS; do printf '%s | ' "$c"; done)"
  echo "|---|$(for _ in $COLS; do printf -- '---|'; done)"
  for b in B B-in-place; do
    a=A${b#B}
    row="| $(label "$b") ÷ $(label "$a")"
    for c in $COLS; do row+=" | $(ratio "${T[$b.$c]}" "${T[$a.$c]}")"; done
    echo "$row |"
  done
  echo
  echo "FUSE requests of one warm run (reads of /dev/fuse by the server) / the server's CPU milliseconds in it"
  echo "(user + system, $((1000 / hz)) ms ticks), medians; the server's CPU seconds over the whole run:"
  echo
  echo "| server | md5 batch | md5 per file | find wc | stat walk | import | CPU s |"
  echo "|---|---|---|---|---|---|---|"
  for k in $SERVERS; do
    row="| $(label "$k")"
    for op in $OPS; do row+=" | ${T[$k.$op.req]} / ${T[$k.$op.cpu]}"; done
    echo "$row | ${CPU[$k]} |"
  done
  echo
  echo "Load average: $LOAD0 before, $(cut -d' ' -f1-3 /proc/loadavg) after, on $(nproc) cores; the run took $(el "$T0") s."
} > "$out"
cat "$out"
echo "tree-ab: written to $out" >&2
