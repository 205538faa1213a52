#!/usr/bin/env bash
# The ring's rounds on the virtual cluster: one chunk of every reader per round (the engine) against
# rounds capped at K chunks (SW_POOL_BENCH_SLOTS=K: the regime of round buffers at many nodes, where
# a round's few chunks still travel every hop of the ring). NOT a test. The scale model
# (model/, `make model`) simulates the same runs; its calibration table puts the two side by side.
#
#   flock /var/tmp/swp-cluster-session.lock bench/ring-slots.sh [SIZE_MIB] [N] ["K ..."] [REPS] [CHUNK]
#
# CHUNK (default 4MiB): the testbed's tbf shaping lets an idle link send a 1 MB burst at once, so with
# 1 MiB chunks the hops of a round with few chunks (idle links) run far faster than the link rate and
# hide what such rounds cost on a real network; 4 MiB chunks are mostly rate-limited.
#
# Caps as bench/cp.sh (node links 400mbit, storage egress 800mbit); SRC a random file on the shared
# storage, DEST each node's local disk, page cache dropped before every run; the configurations are
# interleaved, REPS times. Writes bench/results/ring-slots-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SIZE_MIB=${1:-1024}
N=${2:-8}
CAPS=${3-"1 2"}
REPS=${4:-2}
CHUNK=${5:-4MiB}
SW_BIN=$REPO/target/release/sw-pool
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/ring-slots-$(date +%Y%m%d-%H%M).md
S=$((SIZE_MIB << 20))
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW_BIN" || exit 1
trap '"$TESTBED/down" -q || true' EXIT

"$TESTBED/up" -n "$N" --node-rate 400mbit --storage-rate 800mbit >/dev/null
read -r -a NODES <<< "$(<"$TB/run/nodes")"
install -m 755 "$SW_BIN" "$TB/scratch/sw-pool"
for x in full enter; do [[ ! -x $SW_BIN-$x ]] || install -m 755 "$SW_BIN-$x" "$TB/scratch/sw-pool-$x"; done
SW=$TB/scratch/sw-pool
mkdir -p "$TB/export/bench"
[[ -s $TB/export/bench/f && $(stat -c %s "$TB/export/bench/f") == "$S" ]] || head -c "$S" /dev/urandom > "$TB/export/bench/f"
chmod 644 "$TB/export/bench/f"
cd "$TB/scratch"
clean() { for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/f"; done; }

declare -A T
read -r -a caps <<< "$CAPS"
configs=(none "${caps[@]}")
{
  echo "# The ring's rounds: one chunk of every reader vs K chunks per round ($(date -Is))"
  echo
  echo "Testbed: $N nodes, node links 400 Mbit/s, storage egress 800 Mbit/s; \`sw-pool cp --chunk $CHUNK\` of a"
  echo "${SIZE_MIB} MiB random file from the shared storage to every node's local disk, page cache dropped"
  echo "before every run; wall time incl. mpirun's start-up and the fsync. Configurations interleaved,"
  echo "$REPS runs each. \`none\`: the engine (a round carries one chunk of each of the $N readers);"
  echo "\`K\`: \`SW_POOL_BENCH_SLOTS=K\`, at most K chunks per round."
  echo
  echo "Machine load (\`uptime\`) at the start: $(uptime)"
  echo
} > "$OUT"
for rep in $(seq 1 "$REPS"); do
  for k in "${configs[@]}"; do
    clean; drop
    env=()
    [[ $k != none ]] && env=(-x "SW_POOL_BENCH_SLOTS=$k")
    t=$(now)
    "$TESTBED/mpirun" "${env[@]}" "$SW" cp --chunk "$CHUNK" "$TB/shared/bench/f" "$TB/local/f" >/dev/null 2>&1
    T[$k]="${T[$k]:-} $(el "$t")"
    echo "rep $rep K=$k: $(el "$t") s"
    sum=$(sha256sum < "$TB/nodes/${NODES[-1]}/local/f" | cut -c1-16)
    [[ $sum == $(sha256sum < "$TB/export/bench/f" | cut -c1-16) ]] || { echo "K=$k: the copy on ${NODES[-1]} differs"; exit 1; }
  done
done
clean
{
  echo "| chunks per round | runs (s) | mean (s) | ÷ one chunk of every reader |"
  echo "|---|---|---|---|"
  base=$(echo "${T[none]}" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.2f", s / NF }')
  for k in "${configs[@]}"; do
    m=$(echo "${T[$k]}" | awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.2f", s / NF }')
    label=$k; [[ $k == none ]] && label="$N (one of every reader)"
    echo "| $label | ${T[$k]# } | $m | $(awk -v a="$m" -v b="$base" 'BEGIN { printf "%.2f", a / b }') |"
  done
  echo
  echo "Machine load (\`uptime\`) at the end: $(uptime)"
} >> "$OUT"
cat "$OUT"
