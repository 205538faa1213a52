#!/usr/bin/env bash
# The on-demand mode's peer transport (issue 30's design point): two-sided requests and answers (the
# exchange `load --lazy` ships: swpool_core::ondemand::exchange under swpool_serve::Chunks) against
# one-sided MPI_Get from a window each node exposes (the OSR seed's design), with Open MPI over TCP
# between testbed nodes (one rank per node, testbed/mpirun), all in one run of this script:
#   - every node fetching every 1 MiB chunk it does not own (the OSR test's pattern), DEPTH 1
#     (latency: one chunk in flight per node) and DEPTH 8 (the read-ahead's window), at N nodes;
#   - passive target progress: node 0 alone fetching with MPI_Get while every other node computes
#     for QUIET seconds without calling MPI.
# Chunks come from memory (tools/exchange-bench): transport and verification only, no storage.
#
#   flock /var/tmp/swp-cluster-session.lock bench/exchange.sh [CHUNKS_PER_NODE] [NODE_COUNTS] [QUIET]
#                                            (root; defaults 16 "2 4 8" 3)
#
# Caps as bench/lazy.sh: node links 400mbit. Writes bench/results/exchange-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
PER=${1:-16}
COUNTS=${2:-"2 4 8"}
QUIET=${3:-3}
QUIETS=()
DEFAULTS=()
NODE_RATE=400mbit
BIN=$REPO/target/release/exchange-bench
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/exchange-$(date +%Y%m%d-%H%M)
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$BIN" || exit 1
trap '"$TESTBED/down" -q || true' EXIT
: > "$OUT.log"

# one run: MODE N DEPTH -> "max_seconds sum_bytes min_mbps max_p50 max_p99 oks"
# (Open MPI 4.1's default one-sided component between nodes over TCP, osc/rdma, cannot make a window:
# MPI_Win_create fails with MPI_ERR_WIN; osc/pt2pt, its one-sided emulated on two-sided, can. The
# first one-sided run of each N tries the default once and the report says what it gave.)
OSC=(--mca osc pt2pt)
run() {
  local mode=$1 n=$2 depth=$3 out extra=()
  [[ $mode == two-sided ]] || extra=("${OSC[@]}")
  out=$("$TESTBED/mpirun" -np "$n" "${extra[@]}" "$TB/scratch/exchange-bench" "$mode" "$PER" "$depth" "$QUIET" 2>>"$OUT.log" || true)
  echo "$out" >> "$OUT.log"
  echo "$out" | awk '$1 == "exchange-bench" {
      for (i = 1; i < NF; i++) v[$i] = $(i + 1)
      if (v["chunks"] > 0) {
        if (v["seconds"] > t) t = v["seconds"]
        b += v["bytes"]
        if (m == "" || v["mbps"] < m) m = v["mbps"]
        if (v["p50_ms"] > p) p = v["p50_ms"]
        if (v["p99_ms"] > q) q = v["p99_ms"]
      }
      ok += ($NF == "ok"); all++
    } END { printf "%.3f %d %.1f %.1f %.1f %d/%d\n", t, b, m, p, q, ok, all }'
}

{
  echo "# Peer transport of the on-demand mode: two-sided (shipped) vs one-sided MPI_Get ($(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  echo "Open MPI $(ompi_info --parsable 2>/dev/null | awk -F: '/^ompi:version:full/ {print $4}') over TCP between testbed nodes (node links $NODE_RATE), one rank per node;"
  echo "$PER chunks of 1 MiB owned by each node (chunk i by node i mod N, as \`load --lazy\`); every node"
  echo "fetches every chunk it does not own, all nodes at once, and hashes each against the manifest."
  echo "Chunks come from memory (\`tools/exchange-bench\`): transport and verification only."
  echo "\`bench/exchange.sh $PER \"$COUNTS\" $QUIET\`; $(nproc) cores."
  echo
  echo "| N | depth | two-sided: s (slowest node) | MB/s per node (slowest) | p50 / p99 ms per chunk | one-sided: s | MB/s per node | p50 / p99 ms | one-sided ÷ two-sided (time) | right |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
} > "$OUT.md"

for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate $NODE_RATE >/dev/null
  install -m 755 "$BIN" "$TB/scratch/exchange-bench"
  if "$TESTBED/mpirun" -np "$N" "$TB/scratch/exchange-bench" one-sided 1 1 >/dev/null 2>"$OUT.default"; then
    DEFAULTS+=("N = $N: the default component made a window")
  else
    DEFAULTS+=("N = $N: $(grep -m1 -o 'An error occurred in MPI_Win_create' "$OUT.default" || echo failed): $(grep -m1 -o 'MPI_ERR_WIN[^,]*' "$OUT.default" || true)")
  fi
  rm -f "$OUT.default"
  for depth in 1 8; do
    read -r t2 _ m2 p2 q2 ok2 <<< "$(run two-sided "$N" "$depth")"
    read -r t1 _ m1 p1 q1 ok1 <<< "$(run one-sided "$N" "$depth")"
    log "N=$N depth=$depth two-sided ${t2}s ${m2}MB/s one-sided ${t1}s ${m1}MB/s"
    echo "| $N | $depth | $t2 | $m2 | $p2 / $q2 | $t1 | $m1 | $p1 / $q1 | $(calc "$t1 / $t2") | $ok2 two / $ok1 one |" >> "$OUT.md"
  done
  read -r tq _ mq pq _ okq <<< "$(run one-sided-quiet "$N" 8)"
  QUIETS+=("| $N | $tq | $mq | $pq | $okq |")
  log "N=$N one-sided-quiet ${tq}s (targets out of MPI for ${QUIET}s)"
  "$TESTBED/down" -q
done

{
  echo
  echo "Passive target: node 0 alone fetches every chunk it does not own with MPI_Get (depth 8) while"
  echo "every other node computes for $QUIET s without calling MPI. A time near $QUIET s means a get"
  echo "progresses only when its target enters MPI."
  echo
  echo "| N | node 0's fetch (s) | MB/s | p50 ms | right |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${QUIETS[@]}"
  echo
  echo "One-sided with Open MPI's default component (no \`--mca osc\`): $(printf '%s; ' "${DEFAULTS[@]}" | sed 's/; $//')."
  echo "The one-sided rows above use \`--mca osc pt2pt\`."
  echo
  echo "Machine load at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores."
} >> "$OUT.md"
cat "$OUT.md"
