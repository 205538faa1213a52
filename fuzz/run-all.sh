#!/usr/bin/env bash
# Run every fuzz target for SECONDS (default 600) each, one after the other; exit non-zero on a crash.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-600}
for t in manifest pool_trailer signature_block superblock layer_manifest squashfs; do
  mkdir -p "corpus/$t"
  echo "== fuzz $t for ${secs}s"
  cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 12
done
