#!/usr/bin/env bash
# The paper's end-to-end figure on the virtual cluster: `sw-pool load` of the paper's ext2
# pool (a 1 GB random file, `sw-pool build -s 1020MB`) on N nodes, then sha256sum of the file through
# the mount on every node, at N = 1, 2, 4, 8; against the same sha256sum run by every node directly
# from the shared storage ("running from the shared file system"). NOT a test.
#
#   flock /var/tmp/swp-cluster-session.lock bench/load-e2e.sh [SIZE_MB] [NODE_COUNTS]
#
# Caps as bench/cp.sh: node links 400mbit both ways, storage egress 800mbit. Page caches dropped
# before every run. Writes bench/results/load-e2e-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SIZE_MB=${1:-1000}
COUNTS=${2:-"1 2 4 8"}
NODE_RATE=400mbit; STOR_RATE=800mbit
SW_BIN=$REPO/target/release/sw-pool
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/load-e2e-$(date +%Y%m%d-%H%M).md
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW_BIN" || exit 1
W=/var/tmp/swp-bench-e2e
trap '"$TESTBED/down" -q || true; rm -rf "$W"' EXIT

# the paper's pool, built once (outside the testbed)
rm -rf "$W"; mkdir -p "$W/test-pool"
head -c "${SIZE_MB}MB" /dev/urandom > "$W/test-pool/random.data"
want=$(sha256sum < "$W/test-pool/random.data" | cut -d' ' -f1)
img_mb=$((SIZE_MB + SIZE_MB / 50 + 8))
(cd "$W" && "$SW_BIN" build -q -s "${img_mb}MB" test-pool.ext2 test-pool)
{
  echo "# sw-pool load + sha256sum, end to end ($(date -Is))"
  echo
  echo "The paper's pool: \`head -c ${SIZE_MB}MB /dev/urandom > test-pool/random.data; sw-pool build -s ${img_mb}MB test-pool.ext2 test-pool\`"
  echo "on the shared storage (sshfs, egress $STOR_RATE = 100 MB/s); node links $NODE_RATE (50 MB/s) both ways."
  echo "**load** = \`testbed/mpirun sw-pool -v load -m \$LOCAL_TMPDIR/mnt \$SCRATCH/random.ext2\` (one rank per node, wall time incl."
  echo "mpirun start-up); **sha256** = \`sha256sum mnt/random.data\` through the fuse2fs mount on every node at once;"
  echo "**shared** = the same sha256sum of the file read directly from the shared storage by every node at once."
  echo "Page caches dropped before each run. One run per figure. Machine load at the start: $(uptime)"
  echo
  echo "| N | load (s) | sha256 via mount (s) | load + sha256 (s) | served / pool size | sha256 from shared storage (s) | ratio (load+sha256) / shared | checksums ok |"
  echo "|---|---|---|---|---|---|---|---|"
} > "$OUT"

for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate $NODE_RATE --storage-rate $STOR_RATE >/dev/null
  read -r -a NODES <<< "$(<"$TB/run/nodes")"
  install -m 755 "$SW_BIN" "$TB/scratch/sw-pool"; SW=$TB/scratch/sw-pool
  mkdir -p "$TB/export/e2e"
  cp "$W/test-pool.ext2" "$TB/export/e2e/random.ext2"
  cp "$W/test-pool/random.data" "$TB/export/e2e/random.data"
  chmod 644 "$TB/export/e2e/"*
  cd "$TB/scratch"
  drop; "$TESTBED/storage-bytes" --mark >/dev/null; t=$(now)
  "$TESTBED/mpirun" -x SW_POOL_SHELL=sh "$SW" -v load -m "$TB/local/mnt" "$TB/shared/e2e/random.ext2" > "$OUT.n$N.txt" 2>&1
  tload=$(el "$t"); served=$("$TESTBED/storage-bytes" --since-mark)
  t=$(now)
  sums=$("$TESTBED/mpirun" sh -c "sha256sum < $TB/local/mnt/random.data" 2>/dev/null | cut -d' ' -f1 | sort | uniq -c)
  tsum=$(el "$t")
  okc=$(awk -v w="$want" '$2 == w {print $1}' <<< "$sums"); okc=${okc:-0}
  "$TESTBED/mpirun" "$SW" unload "$TB/local/mnt" >/dev/null 2>&1 || log "unload failed"
  for n in "${NODES[@]}"; do rm -rf "$TB/nodes/$n/local/sw-pool-0"; done
  drop; t=$(now)
  "$TESTBED/mpirun" sh -c "sha256sum < $TB/shared/e2e/random.data" >/dev/null 2>&1
  tshared=$(el "$t")
  size=$(stat -c %s "$TB/export/e2e/random.ext2")
  total=$(calc "$tload + $tsum")
  echo "| $N | $tload | $tsum | $total | $(calc "$served / $size") | $tshared | $(calc "$total / $tshared") | $okc/$N |" >> "$OUT"
  log "N=$N load $tload sha $tsum shared $tshared ok $okc/$N; uptime: $(uptime)"
  rm -rf "$TB/export/e2e"
done
{
  echo
  echo "Machine load at the end: $(uptime)"
  echo
  echo "Per-phase timings (-v) of each load, world rank 0:"
  for f in "$OUT".n*.txt; do echo; echo "\`$(basename "$f")\`:"; echo '```'; grep -v '^export\|^unset' "$f"; echo '```'; done
} >> "$OUT"
rm -f "$OUT".n*.txt
cat "$OUT"
