#!/usr/bin/env bash
# Benchmark (NOT a test): `sw-pool cp` of one binary against another, same run, interleaved — for a
# refactor that must not change the broadcast. One random file on the shared storage, DEST each
# node's local disk, page cache dropped before every run, the order of the two binaries alternating.
#
#   flock /var/tmp/swp-cluster-session.lock bench/ab-cp.sh OLD_BIN [SIZE_MIB] [NODE_COUNTS] [RUNS]
#
# Defaults: 1024 MiB, N = "2 8", 2 runs per binary. Caps as bench/cp.sh (node links 400mbit, storage
# egress 800mbit). Writes bench/results/ab-cp-<date>.md: per N the wall times of each binary, their
# medians and new ÷ old.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
OLD=${1:?usage: bench/ab-cp.sh OLD_BIN [SIZE_MIB] [NODE_COUNTS] [RUNS]}
SIZE_MIB=${2:-1024}
COUNTS=${3:-"2 8"}
RUNS=${4:-2}
NEW=$REPO/target/release/sw-pool
[[ -x $NEW && -x $OLD ]] || { echo "ab-cp: need $NEW (cargo build --release) and $OLD" >&2; exit 1; }
S=$((SIZE_MIB << 20))
OUT=$REPO/bench/results/ab-cp-$(date +%Y%m%d-%H%M).md
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
trap '"$TESTBED/down" -q || true' EXIT
{
  echo "# sw-pool cp: new vs old binary ($(date -Is))"
  echo
  echo "new: \`$NEW\` ($(git -C "$REPO" rev-parse --short HEAD)); old: \`$OLD\`. ${SIZE_MIB} MiB random file on the"
  echo "shared storage (sshfs), node links 400mbit, storage egress 800mbit, one rank per node, page cache"
  echo "dropped before every run, $RUNS runs per binary, interleaved with the order alternating. Wall"
  echo "time from the shell, including mpirun's start-up. Machine load at the start: $(uptime)"
  echo
  echo "| N | new (s) | old (s) | new median | old median | new ÷ old |"
  echo "|---|---|---|---|---|---|"
} > "$OUT"
for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate 400mbit --storage-rate 800mbit >/dev/null
  read -r -a NODES <<< "$(<"$TB/run/nodes")"
  # a build with the front: the full program is the one that copies (it runs under any name)
  [[ ! -x $NEW-full ]] || NEW=$NEW-full
  [[ ! -x $OLD-full ]] || OLD=$OLD-full
  install -m 755 "$NEW" "$TB/scratch/sw-pool.new"
  install -m 755 "$OLD" "$TB/scratch/sw-pool.old"
  mkdir -p "$TB/export/bench"
  [[ -s $TB/export/bench/f && $(stat -c %s "$TB/export/bench/f") == "$S" ]] || head -c "$S" /dev/urandom > "$TB/export/bench/f"
  chmod 644 "$TB/export/bench/f"
  cd "$TB/scratch"
  declare -A times=([new]="" [old]="")
  for r in $(seq "$RUNS"); do
    order="new old"; (( r % 2 )) || order="old new"
    for b in $order; do
      for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/f"; done
      drop
      t=$(now)
      "$TESTBED/mpirun" "$TB/scratch/sw-pool.$b" cp "$TB/shared/bench/f" "$TB/local/f" >/dev/null 2>&1 || { echo "ab-cp: $b failed at N=$N" >&2; exit 1; }
      s=$(el "$t"); times[$b]+="$s "
      echo "N=$N run $r $b $s s"
    done
  done
  mn=$(tr ' ' '\n' <<< "${times[new]}" | grep . | median)
  mo=$(tr ' ' '\n' <<< "${times[old]}" | grep . | median)
  echo "| $N | ${times[new]% } | ${times[old]% } | $mn | $mo | $(awk -v a="$mn" -v b="$mo" 'BEGIN { printf "%.3f", a / b }') |" >> "$OUT"
  for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/f"; done
done
echo >> "$OUT"; echo "Machine load at the end: $(uptime)" >> "$OUT"
cat "$OUT"
