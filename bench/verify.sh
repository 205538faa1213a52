#!/usr/bin/env bash
# Benchmark (not a test): `sw-pool verify` of a 1 GB signed pool against `openssl dgst -sha256` of the
# same file (what the paper's verify did), warm page cache, RUNS repetitions (default 5), interleaved.
# Goal: ratio <= 1.1. Writes bench/results/verify-<date>.md.  usage: bench/verify.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=lib.sh
. "$PWD/bench/lib.sh"
SW=$PWD/target/release/sw-pool
RUNS=${RUNS:-5}
SIZE=1GB
[[ ${1:-} == --quick ]] && { SIZE=100MB; RUNS=3; }
W=${BENCH_DIR:-/var/tmp/swp-bench-verify}
rm -rf "$W"; mkdir -p "$W/tree"
trap 'rm -rf "$W"' EXIT
head -c "$SIZE" /dev/urandom > "$W/tree/random.data"
"$SW" -q build "$W/pool.sqfs" "$W/tree"
"$SW" -q keygen --out "$W/k"
"$SW" -q sign --key "$W/k.pem" "$W/pool.sqfs"
cat "$W/pool.sqfs" > /dev/null
ours=(); theirs=()
for _ in $(seq "$RUNS"); do
  ours+=("$(timeit "$SW" verify --key "$W/k.pub.pem" "$W/pool.sqfs")")
  theirs+=("$(timeit openssl dgst -sha256 "$W/pool.sqfs")")
done
mkdir -p bench/results
out=bench/results/verify-$(date +%F).md
python3 - "$out" "$SIZE" "$(nproc)" "${ours[*]}" "${theirs[*]}" <<'PY'
import statistics, sys, datetime
out, size, cores, a, b = sys.argv[1:]
a = sorted(map(float, a.split())); b = sorted(map(float, b.split()))
ma, mb = statistics.median(a), statistics.median(b)
with open(out, "w") as f:
    f.write("# sw-pool verify vs openssl dgst -sha256\n\n")
    f.write(f"{datetime.datetime.utcnow():%Y-%m-%dT%H:%M:%SZ}, {cores} cores, a {size} random file in a signed squashfs pool, warm page cache, {len(a)} runs each.\n\n")
    f.write("| command | median s | min–max s |\n|---|---|---|\n")
    f.write(f"| sw-pool verify (signature + every chunk, BLAKE3, all cores) | {ma:.3f} | {a[0]:.3f}–{a[-1]:.3f} |\n")
    f.write(f"| openssl dgst -sha256 (whole file) | {mb:.3f} | {b[0]:.3f}–{b[-1]:.3f} |\n\n")
    f.write(f"ratio sw-pool / openssl = **{ma/mb:.2f}** (goal <= 1.10: {'pass' if ma/mb <= 1.10 else 'MISSED'})\n")
print(open(out).read())
PY
