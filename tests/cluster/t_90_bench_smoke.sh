#!/usr/bin/env bash
# Smoke test of the benchmark harness (`make bench`): `bench/run --quick` against the testbed that is up
# (BENCH_USE_RUNNING_TESTBED=1). Asserts that the harness worked and produced well-formed output —
# every configuration ran its repetitions with correct digests, the raw data parse, the plots are PNGs,
# the report states P1–P5, sw-pool rows are measured or marked unavailable, nothing is left behind.
# Never asserts a timing. About 2–3 minutes.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
OUT=$(mktemp -d /var/tmp/swp-bench-smoke.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "release binary" "$SW missing (cargo build --release)"; finish; }
t=$(now); rc=0
# N = 1, 2 only (--quick alone also does N = 4): the harness is the same for every N, and with the
# sw-pool load rows the suite's budget would be tight
BENCH_USE_RUNNING_TESTBED=1 BENCH_NODES="1 2" BENCH_OUT=$OUT bash "$REPO/bench/run" --quick > "$OUT/run.log" 2>&1 || rc=$?
assert_eq "bench/run --quick exits 0 ($(elapsed "$t") s)" 0 "$rc"
[[ $rc == 0 ]] || tail -n 20 "$OUT/run.log"
for f in results.jsonl results.csv meta.json report.md fig11_time_vs_nodes.png fig12_phases.png \
         storage_bytes_vs_nodes.png smallfiles.png p4_mount_overhead.png sparse.png; do
  assert_cmd "output $f written" test -s "$OUT/$f"
done
for f in "$OUT"/*.png; do
  assert_eq "$(basename "$f") is a PNG" "89504e470d0a1a0a" "$(head -c 8 "$f" | od -An -tx1 | tr -d ' \n')"
done
has_load=0; "$SW" load --help >/dev/null 2>&1 && has_load=1
has_cp=0; "$SW" cp --help 2>/dev/null | grep -q -- --json && has_cp=1
# every configuration: REPS successful runs with the right digests; storage bytes counted
check=$(python3 - "$OUT" "$has_load" "$has_cp" "$REPO/bench" <<'PY'
import json, sys, collections
out, has_load, has_cp = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
meta = json.load(open(f"{out}/meta.json"))
runs = [json.loads(l) for l in open(f"{out}/results.jsonl")]
reps, ns = meta["reps"], meta["node_counts"]
ok = collections.Counter()
probs = []
for r in runs:
    for k in ("section", "method", "n", "rep", "seconds", "storage_bytes"):
        if k not in r:
            probs.append(f"run without {k}: {r}")
    if not (isinstance(r.get("seconds"), (int, float)) and r["seconds"] > 0):
        probs.append(f"bad seconds in {r.get('section')} {r.get('method')}")
    if r.get("ok") and not r.get("errors"):
        ok[(r["section"], r["method"], r["n"], r.get("op", ""), r.get("temp", ""))] += 1
    else:
        probs.append(f"failed run {r.get('section')} {r.get('method')} N={r.get('n')} {r.get('op', '')}: {r.get('errors')}")
want = []
fig = ["shared", "copy", "sbcast", "direct-mount"] + (["swpool-cp"] if has_cp else []) + (["swpool-load-sqfs", "swpool-load-ext2"] if has_load else [])
want += [("fig11", m, n, "", "") for m in fig for n in ns]
want += [("p4", k, 1, op, t) for k in ("native", "squashfuse_ll", "fuse2fs") for op in ("hash", "read") for t in ("cold", "warm")]
want += [("smallfiles", w, 1, op, "") for w in ("local", "shared") for op in ("untar", "md5sum", "rm")] + [("smallfiles", "pool", 1, "md5sum", "")]
want += [("sparse", m, meta["sparse"]["n"], "", "") for m in ["copy-dense", "copy-sparse"] + (["swpool-cp-dense", "swpool-cp-sparse"] if has_cp else [])]
for w in want:
    if ok[w] < reps:
        probs.append(f"{w}: {ok[w]} of {reps} runs succeeded")
if not has_load and any(r["method"].startswith("swpool-load") for r in runs):
    probs.append("sw-pool load rows present although this build has no load")
hashed = [r for r in runs if r["section"] == "fig11" and r.get("ok")]
if any(not r.get("hashes_ok") for r in hashed):
    probs.append("fig11 run without verified digests")
if any(r["hashes"] != r["n"] for r in hashed):
    probs.append("fig11 run where not every node reported a digest")
# every run is what it is labelled: a first sw-pool load or copy read the data from storage (the
# harness empties the caches first), a repeat read ~nothing (bench/labels.py, as report.py checks)
sys.path.insert(0, sys.argv[4])
import labels
probs += [w for w in (labels.check(r, meta["data_bytes"]) for r in runs) if w]
print("\n".join(probs) if probs else "OK")
PY
)
assert_eq "every configuration ran ${REPS:-3}x with verified digests" "OK" "$check"
rep=$(cat "$OUT/report.md" 2>/dev/null || true)
for g in P0 P1 P2 P3 P4 P5; do
  assert_match "report states $g with a verdict" "\| $g \|[^|]*\|[^|]*\| \*\*(pass|MISSED|not measurable in this build|not measured[^*]*|not run)\*\* \|" "$rep"
done
if [[ $has_load == 1 ]]; then
  assert_match "report has measured sw-pool load rows" "\| sw-pool load \(default format, squashfs\) \| [0-9]" "$rep"
else
  assert_match "report marks sw-pool load as not available" "\| sw-pool load \(default format, squashfs\) \| not available in this build" "$rep"
fi
for p in fig11_time_vs_nodes fig12_phases storage_bytes_vs_nodes smallfiles; do
  assert_match "report embeds $p.png" "!\[[^]]*\]\($p\.png\)" "$rep"
done
# nothing left behind: no mounts or files of the harness on the nodes or the storage, testbed still up
left=$("$TESTBED/exec" all sh -c "grep -c ' $TB/local/bench-run' /proc/self/mounts || true" 2>/dev/null | awk '{s += $2} END {print s + 0}')
assert_eq "no FUSE mount of the harness left on any node" 0 "$left"
assert_eq "no harness files left on the nodes or the storage" "" \
  "$(ls -d "$TB"/nodes/*/local/bench-run "$TB/export/bench-run" "$TB/scratch/bench-run" /var/tmp/swp-bench-work 2>/dev/null || true)"
assert_cmd "testbed still up and healthy" "$TESTBED/status" -q
finish
