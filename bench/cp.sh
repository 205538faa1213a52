#!/usr/bin/env bash
# Benchmark of sw-pool cp on the virtual cluster (goals P1, P2, P3 of bench/report.py; P6, P7 below). NOT a test.
#
#   flock /var/tmp/swp-cluster-session.lock bench/cp.sh [SIZE_MIB] [NODE_COUNTS]
#
# Caps (the benchmark model, docs/architecture.md): every node link 400mbit (50 MB/s) both ways, the storage
# server's egress 800mbit (100 MB/s). SRC is a random file on the shared storage ($SCRATCH, sshfs,
# throttled and counted); DEST is each node's local disk. Brings the testbed up for every node
# count and takes it down at the end. Writes bench/results/cp-<date>.md.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TESTBED=$REPO/testbed
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
SIZE_MIB=${1:-1024}
COUNTS=${2:-"1 2 4 8"}
NODE_RATE=400mbit; STOR_RATE=800mbit; NODE_MBS=50
SW_BIN=$REPO/target/release/sw-pool
mkdir -p "$REPO/bench/results"
OUT=$REPO/bench/results/cp-$(date +%Y%m%d-%H%M).md
S=$((SIZE_MIB << 20))
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW_BIN" || exit 1
trap '"$TESTBED/down" -q || true' EXIT

{
  echo "# sw-pool cp benchmark ($(date -Is))"
  echo
  echo "Testbed: node links capped at $NODE_RATE (= $NODE_MBS MB/s) both ways, storage egress $STOR_RATE"
  echo "(100 MB/s); one rank per node; SRC a ${SIZE_MIB} MiB random file on the shared storage"
  echo "(sshfs), DEST each node's local disk; page cache dropped before every run. Wire limit ="
  echo "size / 50 MB/s (the node link: every node must receive every byte). One run per figure."
  [[ $SIZE_MIB -lt 1024 ]] && echo && echo "**Size: ${SIZE_MIB} MiB, not the 1 GB target (time budget of this session).**"
  echo
  echo "Every time is wall time from the shell, including mpirun's start-up and DEST's fsync. The"
  echo "\"sw-pool\" column is the default algorithm (SW_POOL_CP_ALGORITHM unset; its name is in the -v output below);"
  echo "the last three columns run each algorithm explicitly, cold, one after the other."
  echo
  echo "Machine load (\`uptime\`) at the start: $(uptime)"
  echo
  echo "| N | sw-pool (s) | wire limit (s) | P1 = sw-pool / limit | P2 first = served / size | P2 repeat (bytes served) | every node copies from storage (s) | sbcast (s) | P3 = sw-pool / sbcast | allgather (s) | ring (s) | bcast (s) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$OUT"

for N in $COUNTS; do
  "$TESTBED/up" -n "$N" --node-rate $NODE_RATE --storage-rate $STOR_RATE >/dev/null
  read -r -a NODES <<< "$(<"$TB/run/nodes")"
  install -m 755 "$SW_BIN" "$TB/scratch/sw-pool"
  for x in full enter; do [[ ! -x $SW_BIN-$x ]] || install -m 755 "$SW_BIN-$x" "$TB/scratch/sw-pool-$x"; done
  SW=$TB/scratch/sw-pool
  mkdir -p "$TB/export/bench"
  [[ -s $TB/export/bench/f && $(stat -c %s "$TB/export/bench/f") == "$S" ]] || head -c "$S" /dev/urandom > "$TB/export/bench/f"
  chmod 644 "$TB/export/bench/f"
  cd "$TB/scratch"
  clean() { for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/"{f,naive,sb}; done; }
  limit=$(calc "$S / ($NODE_MBS * 1000000)")
  # sw-pool (default algorithm)
  clean; drop; "$TESTBED/storage-bytes" --mark >/dev/null; t=$(now)
  "$TESTBED/mpirun" "$SW" cp -v "$TB/shared/bench/f" "$TB/local/f" > "$OUT.n$N.txt" 2>&1
  tsw=$(el "$t"); served=$("$TESTBED/storage-bytes" --since-mark)
  log "N=$N sw-pool $tsw s, served $served"
  # repeat
  "$TESTBED/storage-bytes" --mark >/dev/null
  "$TESTBED/mpirun" "$SW" cp "$TB/shared/bench/f" "$TB/local/f" >/dev/null 2>&1
  served_rep=$("$TESTBED/storage-bytes" --since-mark)
  # every algorithm explicitly
  declare -A ta=([allgather]=- [ring]=- [bcast]=-)
  if [[ $N -gt 1 ]]; then
    for a in allgather ring bcast; do
      clean; drop; t=$(now)
      "$TESTBED/mpirun" -x SW_POOL_CP_ALGORITHM=$a "$SW" cp "$TB/shared/bench/f" "$TB/local/f" >/dev/null 2>&1
      ta[$a]=$(el "$t"); log "N=$N $a ${ta[$a]} s"
    done
  fi
  # naive: every node copies from shared storage at once
  clean; drop; t=$(now)
  pids=()
  for n in "${NODES[@]}"; do "$TESTBED/exec" "$n" cp "$TB/shared/bench/f" "$TB/local/naive" & pids+=($!); done
  wait "${pids[@]}"; tnaive=$(el "$t"); log "N=$N naive $tnaive s"
  # sbcast from the login (root) namespace to every node's local disk
  clean; drop; t=$(now)
  salloc -Q -N"$N" sbcast -f "$TB/export/bench/f" "$TB/local/sb" >/dev/null 2>&1 || log "sbcast failed"
  tsb=$(el "$t"); log "N=$N sbcast $tsb s"
  echo "| $N | $tsw | $limit | $(calc "$tsw / $limit") | $(calc "$served / $S") | $served_rep | $tnaive | $tsb | $(calc "$tsw / $tsb") | ${ta[allgather]} | ${ta[ring]} | ${ta[bcast]} |" >> "$OUT"
  log "N=$N done; uptime: $(uptime)"
  clean
done

# P6: peak RSS of a leader copying a 10 GB sparse file (256 MiB of data); SRC on the untrottled
# shared scratch directory, whose file system reports holes (sshfs does not: SEEK_DATA would see
# 10 GB of data there).
N=4
"$TESTBED/up" -n $N --node-rate $NODE_RATE --storage-rate $STOR_RATE >/dev/null
read -r -a NODES <<< "$(<"$TB/run/nodes")"
install -m 755 "$SW_BIN" "$TB/scratch/sw-pool"; SW=$TB/scratch/sw-pool
SP=$TB/scratch/bench-sparse10g
rm -f "$SP"; truncate -s 10G "$SP"
for i in 0 1 2 3; do dd if=/dev/urandom of="$SP" bs=1M count=64 seek=$((i * 2560)) conv=notrunc status=none; done
cd "$TB/scratch"
"$TESTBED/mpirun" /usr/bin/time -v "$SW" cp "$SP" "$TB/local/sp" > "$OUT.p6.txt" 2>&1 || true
rss=$(grep 'Maximum resident set size' "$OUT.p6.txt" | awk '{print $NF}' | sort -n | tail -1)
for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/sp"; done
rm -f "$SP"
# P7: sparse image (8x its data) vs a dense file of the same data, both on shared scratch
# the full sizes (a 4 GiB image holding 512 MiB, a dense 512 MiB file) from SIZE_MIB = 1024 on
D=$((SIZE_MIB / 2)); [[ $D -lt 64 ]] && D=64; [[ $D -gt 512 ]] && D=512
truncate -s $((D * 8))M "$TB/scratch/bench-img"; rm -f "$TB/scratch/bench-dense"
head -c $((D << 20)) /dev/urandom > "$TB/scratch/bench-dense"
for i in 0 1 2 3; do dd if="$TB/scratch/bench-dense" of="$TB/scratch/bench-img" bs=1M skip=$((i * D / 4)) count=$((D / 4)) seek=$((i * D * 2)) conv=notrunc status=none; done
drop; t=$(now); "$TESTBED/mpirun" "$SW" cp "$TB/scratch/bench-img" "$TB/local/img" >/dev/null 2>&1; timg=$(el "$t")
drop; t=$(now); "$TESTBED/mpirun" "$SW" cp "$TB/scratch/bench-dense" "$TB/local/dense" >/dev/null 2>&1; tdense=$(el "$t")
for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/"{img,dense}; done
rm -f "$TB/scratch/bench-img" "$TB/scratch/bench-dense"
rm -rf "$TB/export/bench"
{
  echo
  echo "P6: peak RSS of a leader copying a 10 GiB sparse file (256 MiB of data, 4 nodes): **$((rss / 1024)) MiB** (goal ≤ 256 MiB)."
  echo
  echo "P7 (4 nodes): a $((D * 8)) MiB image holding $D MiB of data: ${timg} s; a dense $D MiB file: ${tdense} s;"
  echo "ratio **$(calc "$timg / $tdense")** (goal ≤ 1.2)."
  echo
  echo "Machine load (\`uptime\`) at the end: $(uptime)"
  echo
  echo "Per-phase timings (-v) of the sw-pool runs (default algorithm), world rank 0:"
  for f in "$OUT".n*.txt; do echo; echo "\`$(basename "$f")\`:"; echo '```'; cat "$f"; echo '```'; done
} >> "$OUT"
rm -f "$OUT".n*.txt
cat "$OUT"
