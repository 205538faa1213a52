#!/usr/bin/env bash
# Benchmark: `sw-pool cp` of the same signed 1 GiB pool with per-chunk verification ÷
# without, on the virtual cluster. NOT a test.
#
#   flock -o /var/tmp/swp-cluster-session.lock bench/cp-verify.sh [SIZE_MIB] [NODE_COUNTS] [PAIRS]
#
# Defaults: 1024 MiB, "4", 3 pairs. "Without" sets SW_POOL_BENCH_NO_VERIFY=1 on every rank: a
# benchmark switch of `sw-pool cp` only (not an option, never honoured by `load`) under which no
# chunk is hashed or checked (zero detection and sparse writes stay). The pool is an ext2 image of a
# random file (every chunk holds data), built and signed outside the lock; SRC is on the shared
# storage ($SCRATCH, sshfs, throttled), DEST each node's local disk (removed before every run, else
# the copy is skipped as already there), page cache dropped before every run. Caps as in
# bench/cp.sh (the benchmark model, docs/architecture.md): node links 400mbit both ways, storage egress 800mbit. Runs are
# interleaved in pairs whose order alternates (with/without, then without/with, ...), so that a
# change in the machine's load hits both sides. Brings the testbed up for every node count and
# down at the end. Writes bench/results/cp-verify-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SIZE_MIB=${1:-1024}
COUNTS=${2:-4}
PAIRS=${3:-3}
NODE_RATE=400mbit; STOR_RATE=800mbit
SW_BIN=$REPO/target/release/sw-pool
[[ $(id -u) == 0 ]] || { echo "bench/cp-verify.sh: must run as root (the testbed)"; exit 1; }
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/cp-verify-$(date +%Y%m%d-%H%M).md
B=/var/tmp/swp-cpv-$$          # the pool, built once in the root namespace
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW_BIN" || exit 1
NODES=()
cleanup() {
  for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/cpv"; done
  rm -rf "$B" "$TB/export/cpv-$$" "$TB/scratch/cpv-$$" 2>/dev/null || true
  "$TESTBED/down" --purge -q >/dev/null 2>&1 || true
}
trap cleanup EXIT

# --- the pool: one random file in an ext2 image (every chunk holds data), signed
mkdir -p "$B/tree"
head -c "$((SIZE_MIB << 20))" /dev/urandom > "$B/tree/random.data"
"$SW_BIN" build -q -s "$((SIZE_MIB * 1048576 / 1000000 + 40))MB" --name cpv "$B/pool.ext2" "$B/tree"
rm -rf "$B/tree"
"$SW_BIN" keygen -q --out "$B/key" >/dev/null
"$SW_BIN" sign -q --key "$B/key.pem" "$B/pool.ext2" >/dev/null
S=$(stat -c %s "$B/pool.ext2")
read -r DATA CHUNK_MIB < <("$SW_BIN" inspect --json --no-check "$B/pool.ext2" | python3 -c 'import json,sys; m = json.load(sys.stdin)["manifest"]; print(m["data_size"], m["chunk_size"] >> 20)')
SRC_SHA=$(sha256sum < "$B/pool.ext2" | cut -d' ' -f1)

{
  echo "# sw-pool cp with per-chunk verification ÷ without ($(date -Is))"
  echo
  echo "Command: \`flock -o /var/tmp/swp-cluster-session.lock bench/cp-verify.sh $SIZE_MIB \"$COUNTS\" $PAIRS\`; binary \`$(git -C "$REPO" rev-parse --short HEAD)$(git -C "$REPO" diff --quiet HEAD -- crates || echo +changes)\`."
  echo
  echo "Pool: a signed ext2 image of one ${SIZE_MIB} MiB random file, $S bytes, $DATA bytes of data in"
  echo "$CHUNK_MIB MiB chunks. Testbed: node links $NODE_RATE both ways, storage egress $STOR_RATE; one rank per"
  echo "node; SRC on the shared storage (sshfs), DEST each node's local disk (removed before each run);"
  echo "page cache dropped before each run. Each time is wall time of \`testbed/mpirun sw-pool cp -v SRC"
  echo "DEST\` from the shell (mpirun start-up and DEST's fsync included). \"without\": the same command"
  echo "with \`-x SW_POOL_BENCH_NO_VERIFY=1\` (no chunk hashed or checked). $PAIRS pairs per node count,"
  echo "interleaved, the order alternating. \"verify (rank 0)\" is world rank 0's \`-v\` verify phase"
  echo "(CPU time spent hashing, overlapped with the network)."
  echo
  echo "Machine load (\`uptime\`) at the start: $(uptime)"
  echo
  echo "| N | pair | order | with (s) | without (s) | with ÷ without | verify (rank 0) with / without (s) |"
  echo "|---|---|---|---|---|---|---|"
} > "$OUT"
summary=()

for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate $NODE_RATE --storage-rate $STOR_RATE >/dev/null
  read -r -a NODES <<< "$(<"$TB/run/nodes")"
  mkdir -p "$TB/scratch/cpv-$$" "$TB/export/cpv-$$"
  install -m 755 "$SW_BIN" "$TB/scratch/cpv-$$/sw-pool"
  for x in full enter; do [[ ! -x $SW_BIN-$x ]] || install -m 755 "$SW_BIN-$x" "$TB/scratch/cpv-$$/sw-pool-$x"; done
  SW=$TB/scratch/cpv-$$/sw-pool
  cp --sparse=always "$B/pool.ext2" "$TB/export/cpv-$$/pool.ext2"
  chmod -R a+rX "$TB/export/cpv-$$"
  cd "$TB/scratch"
  # run MODE: one cold copy; prints "SECONDS VERIFY_SECONDS"
  run() {
    local mode=$1 t v n
    local env=()
    [[ $mode == without ]] && env=(-x SW_POOL_BENCH_NO_VERIFY=1)
    for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/cpv"; done
    drop; t=$(now)
    "$TESTBED/mpirun" "${env[@]}" "$SW" cp -v "$TB/shared/cpv-$$/pool.ext2" "$TB/local/cpv" > "$OUT.run.txt" 2>&1 < /dev/null \
      || { log "N=$N $mode: cp failed: $(tail -n 3 "$OUT.run.txt")"; return 1; }
    t=$(el "$t")
    v=$(awk '$1 == "verify" { print $2 }' "$OUT.run.txt" | head -1)
    echo "$t ${v:--}"
  }
  with=() without=() ratios=()
  for ((p = 1; p <= PAIRS; p++)); do
    if (( p % 2 )); then order="with, without"; a=$(run with); b=$(run without)
    else order="without, with"; b=$(run without); a=$(run with); fi
    read -r tw vw <<< "$a"; read -r tn vn <<< "$b"
    with+=("$tw"); without+=("$tn"); r=$(calc "$tw / $tn"); ratios+=("$r")
    log "N=$N pair $p ($order): with $tw s (verify $vw s), without $tn s (verify $vn s), ratio $r"
    echo "| $N | $p | $order | $tw | $tn | $r | $vw / $vn |" >> "$OUT"
  done
  # the copy made without verification is still the pool, byte for byte (node 1)
  same=$([[ $(sha256sum < "$TB/nodes/${NODES[0]}/local/cpv" | cut -d' ' -f1) == "$SRC_SHA" ]] && echo yes || echo NO)
  mw=$(echo "${with[*]}" | median); mn=$(echo "${without[*]}" | median)
  summary+=("| $N | $mw | $mn | **$(calc "$mw / $mn")** | $(echo "${ratios[*]}" | median) | $(calc "$S / 50000000") | $same |")
  log "N=$N median with $mw s, without $mn s, ratio $(calc "$mw / $mn"); last copy identical to SRC: $same; uptime: $(uptime)"
  for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/cpv"; done
  rm -rf "$TB/export/cpv-$$" "$TB/scratch/cpv-$$"
done
{
  echo
  echo "Summary (goal: with ÷ without ≤ 1.05 on 4 nodes):"
  echo
  echo "| N | median with (s) | median without (s) | ratio of medians | median of pair ratios | wire limit (s) | last copy == SRC |"
  echo "|---|---|---|---|---|---|---|"
  printf '%s\n' "${summary[@]}"
  echo
  echo "Machine load (\`uptime\`) at the end: $(uptime)"
  echo
  echo "Last run's \`-v\` output (world rank 0):"
  echo '```'
  cat "$OUT.run.txt"
  echo '```'
} >> "$OUT"
rm -f "$OUT.run.txt"
cat "$OUT"
