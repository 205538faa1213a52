#!/usr/bin/env bash
# The two trees from one reader against the ring of readers, on the virtual cluster: what
# `Algorithm::choose` (crates/swpool-transfer/src/transfer/mod.rs) trades. NOT a test. The scale model
# (model/, `make model`) simulates both to 1,024 nodes.
#
#   flock /var/tmp/swp-cluster-session.lock bench/tree-ring.sh ["SIZES_MIB"] ["NODES"] [REPS] [CHUNK]
#   defaults: "4 16 64 256" "4 8" 3 1MiB
#   env: TREE_RING_NODE_RATE=400mbit (the nodes' link cap; "none": uncapped, as bench/storm.sh)
#
# Caps as bench/cp.sh (node links 400mbit, storage egress 800mbit); `sw-pool cp --chunk CHUNK` of a
# random file from the shared storage to every node's local disk, page cache dropped before every
# run, wall time incl. mpirun's start-up and the fsync; the two algorithms interleaved, REPS times
# (SW_POOL_CP_ALGORITHM=two-tree / ring); also the files the storage server opened (its sftp log,
# testbed up --sftp-log): the ring opens the file once per reading node, the trees once.
# Writes bench/results/tree-ring-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SIZES=${1:-"4 16 64 256"}
NS=${2:-"4 8"}
REPS=${3:-3}
CHUNK=${4:-1MiB}
NODE_RATE=${TREE_RING_NODE_RATE:-400mbit}
SW_BIN=$REPO/target/release/sw-pool
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/tree-ring-$(date +%Y%m%d-%H%M).md
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW_BIN" || exit 1
trap '"$TESTBED/down" -q || true' EXIT

max_n=0; for n in $NS; do if (( n > max_n )); then max_n=$n; fi; done
"$TESTBED/up" -n "$max_n" --node-rate "$NODE_RATE" --storage-rate 800mbit --sftp-log >/dev/null
read -r -a NODES <<< "$(<"$TB/run/nodes")"
install -m 755 "$SW_BIN" "$TB/scratch/sw-pool"
for x in full enter; do [[ ! -x $SW_BIN-$x ]] || install -m 755 "$SW_BIN-$x" "$TB/scratch/sw-pool-$x"; done
SW=$TB/scratch/sw-pool
mkdir -p "$TB/export/bench"
cd "$TB/scratch"
clean() { local x; for x in "${NODES[@]}"; do rm -f "$TB/nodes/$x/local/f"; done; }
# one file per size: the nodes' sshfs caches what it saw of a path for a while
opens() { cat "$TB"/log/sftp.*.log 2>/dev/null | grep -c "open \"$TB/export/bench/$F\"" || true; }

{
  echo "# Two trees from one reader vs the ring of readers ($(date -Is))"
  echo
  echo "Testbed: node links $NODE_RATE, storage egress 800 Mbit/s; \`sw-pool cp --chunk $CHUNK\` of a random file"
  echo "from the shared storage to every node's local disk, page cache dropped before every run; wall time"
  echo "incl. mpirun's start-up and the fsync; the two algorithms interleaved, $REPS runs each, medians."
  echo "Opens: the times the storage server opened the file in one copy (its own request log)."
  echo
  echo "Machine load (\`uptime\`) at the start: $(uptime)"
  echo
  echo "| nodes | size (MiB) | chunks per node | ring (s) | two-tree (s) | two-tree ÷ ring | ring opens | two-tree opens | chosen by default |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$OUT"
for size in $SIZES; do
  F=f-$size-$$
  head -c $((size << 20)) /dev/urandom > "$TB/export/bench/$F"; chmod 644 "$TB/export/bench/$F"
  want=$(sha256sum < "$TB/export/bench/$F" | cut -c1-16)
  for n in $NS; do
    hosts=$(IFS=,; echo "${NODES[*]:0:$n}")
    declare -A T=() O=()
    for rep in $(seq 1 "$REPS"); do
      for algo in ring two-tree; do
        clean; drop
        o0=$(opens); t=$(now)
        "$TESTBED/mpirun" -np "$n" -H "$hosts" -x SW_POOL_CP_ALGORITHM=$algo "$SW" cp --chunk "$CHUNK" \
          "$TB/shared/bench/$F" "$TB/local/f" >/dev/null 2>&1
        T[$algo]="${T[$algo]:-} $(el "$t")"; O[$algo]=$(( $(opens) - o0 ))
        echo "N=$n ${size} MiB $algo rep $rep: ${T[$algo]##* } s, ${O[$algo]} opens"
        got=$(sha256sum < "$TB/nodes/${NODES[$((n - 1))]}/local/f" | cut -c1-16)
        [[ $got == "$want" ]] || { echo "$algo: the copy on ${NODES[$((n - 1))]} differs"; exit 1; }
      done
    done
    clean
    chosen=$("$TESTBED/mpirun" -np "$n" -H "$hosts" "$SW" cp --json --chunk "$CHUNK" "$TB/shared/bench/$F" "$TB/local/f" 2>/dev/null \
      | sed -n 's/.*"algorithm": "\([a-z-]*\)".*/\1/p' | head -1)
    clean
    r=$(median <<< "${T[ring]}"); t2=$(median <<< "${T[two-tree]}")
    chunks=$(awk -v s="$size" -v c="${CHUNK%MiB}" -v n="$n" 'BEGIN { printf "%.1f", s / c / n }')
    echo "| $n | $size | $chunks | $r (${T[ring]# }) | $t2 (${T[two-tree]# }) | $(awk -v a="$t2" -v b="$r" 'BEGIN { printf "%.2f", a / b }') | ${O[ring]} | ${O[two-tree]} | $chosen |" >> "$OUT"
    unset T O
  done
  rm -f "$TB/export/bench/$F"
done
echo >> "$OUT"
echo "Command: \`TREE_RING_NODE_RATE=$NODE_RATE bench/tree-ring.sh \"$SIZES\" \"$NS\" $REPS $CHUNK\`" >> "$OUT"
cat "$OUT"
