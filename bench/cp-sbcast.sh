#!/usr/bin/env bash
# Goal P3 (sw-pool cp ÷ sbcast, bench/report.py) with sbcast run where users run it: NOT a test.
#
#   flock /var/tmp/swp-cluster-session.lock bench/cp-sbcast.sh [SIZE_MIB] [NODE_COUNTS]
#
# bench/cp.sh runs `sbcast` from the root namespace (the "login node"), whose link the testbed does
# not cap, reading SRC from the storage server's own disk (not through the capped storage link). A
# user runs sbcast inside the job: the batch script runs on the job's first node, whose one NIC
# (capped like every node's, the benchmark model of docs/architecture.md) carries SRC in and every copy out. This
# script measures, in the same run, for every N: sw-pool cp (default algorithm), sbcast from the root
# namespace (as bench/cp.sh), and sbcast from the batch script (`sbatch --wait --wrap "sbcast …"`,
# SRC read through $SCRATCH). Caps as bench/cp.sh. Writes bench/results/cp-sbcast-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SIZE_MIB=${1:-1024}
COUNTS=${2:-"2 4 8"}
SW_BIN=$REPO/target/release/sw-pool
OUT=$REPO/bench/results/cp-sbcast-$(date +%Y%m%d-%H%M).md
S=$((SIZE_MIB << 20))
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW_BIN" || exit 1
trap '"$TESTBED/down" -q || true' EXIT
{
  echo "# sw-pool cp vs sbcast where users run it ($(date -Is))"
  echo
  echo "Caps: node links 400mbit both ways, storage egress 800mbit; SRC a ${SIZE_MIB} MiB random file;"
  echo "page cache dropped before every run; one run per figure; wall times from the shell."
  echo "\"sbcast, root ns\": as bench/cp.sh (uncapped sender, SRC from the server's disk). \"sbcast in the job\":"
  echo "\`sbatch --wait -N N --wrap 'sbcast -f \$SCRATCH/… \$LOCAL_TMPDIR/…'\` (sender = the job's first node,"
  echo "its capped link carries SRC in and N − 1 copies out; includes sbatch's scheduling, as sw-pool's figure"
  echo "includes mpirun's start-up)."
  echo
  echo "Machine load (\`uptime\`) at the start: $(uptime)"
  echo
  echo "| N | sw-pool (s) | sbcast, root ns (s) | sbcast in the job (s) | sw-pool / sbcast root ns | P3 = sw-pool / sbcast in the job |"
  echo "|---|---|---|---|---|---|"
} > "$OUT"
for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate 400mbit --storage-rate 800mbit >/dev/null
  read -r -a NODES <<< "$(<"$TB/run/nodes")"
  install -m 755 "$SW_BIN" "$TB/scratch/sw-pool"
  for x in full enter; do [[ ! -x $SW_BIN-$x ]] || install -m 755 "$SW_BIN-$x" "$TB/scratch/sw-pool-$x"; done
  mkdir -p "$TB/export/bench"
  [[ -s $TB/export/bench/f && $(stat -c %s "$TB/export/bench/f") == "$S" ]] || head -c "$S" /dev/urandom > "$TB/export/bench/f"
  chmod 755 "$TB/export/bench"; chmod 644 "$TB/export/bench/f"
  cd "$TB/scratch"
  clean() { for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/"{f,sb,sbj}; done; }
  clean; drop; t=$(now)
  "$TESTBED/mpirun" "$TB/scratch/sw-pool" cp "$TB/shared/bench/f" "$TB/local/f" >/dev/null 2>&1
  tsw=$(el "$t")
  clean; drop; t=$(now)
  salloc -Q -N"$N" sbcast -f "$TB/export/bench/f" "$TB/local/sb" >/dev/null 2>&1 || echo "N=$N sbcast (root ns) failed" >&2
  tsb=$(el "$t")
  clean; drop; t=$(now)
  sbatch -Q --wait -N"$N" -o /dev/null --wrap "sbcast -f $TB/shared/bench/f $TB/local/sbj" >/dev/null 2>&1 || echo "N=$N sbcast (job) failed" >&2
  tsj=$(el "$t")
  ok=0; for n in "${NODES[@]}"; do cmp -s "$TB/export/bench/f" "$TB/nodes/$n/local/sbj" && ok=$((ok + 1)); done
  echo "N=$N sw-pool $tsw s, sbcast root ns $tsb s, sbcast in the job $tsj s ($ok/$N copies identical)"
  echo "| $N | $tsw | $tsb | $tsj ($ok/$N identical) | $(calc "$tsw / $tsb") | $(calc "$tsw / $tsj") |" >> "$OUT"
  clean
done
rm -rf "$TB/export/bench"
{ echo; echo "Machine load (\`uptime\`) at the end: $(uptime)"; } >> "$OUT"
cat "$OUT"
