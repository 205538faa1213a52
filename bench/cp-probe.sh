#!/usr/bin/env bash
# Where does the time of one `sw-pool cp` go? NOT a test, not the benchmark (bench/cp.sh is).
#
#   flock /var/tmp/swp-cluster-session.lock bench/cp-probe.sh N [SIZE_MIB] [ALGORITHM...]
#
# Brings the testbed up with the benchmark model's caps (docs/architecture.md) (nodes 400mbit both ways, storage 800mbit), copies a
# random SIZE_MIB file from the shared storage to every node's local disk once per ALGORITHM
# (default: the built-in default) with `-v`, and samples every 0.5 s: node1's received bytes
# (incoming link use: 50 MB/s is full), the storage server's sent bytes, and the machine's CPU
# (vmstat: us/sy/id). Prints the samples and the per-phase timings; takes the testbed down.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
# shellcheck source=../testbed/env.sh
. "$TESTBED/env.sh"
N=${1:?N}; SIZE_MIB=${2:-1024}; shift $(( $# >= 2 ? 2 : 1 ))
ALGOS=("$@"); [[ ${#ALGOS[@]} -gt 0 ]] || ALGOS=(default)
SW_BIN=$REPO/target/release/sw-pool
trap '"$TESTBED/down" -q || true' EXIT
"$TESTBED/up" -n "$N" --node-rate 400mbit --storage-rate 800mbit >/dev/null
read -r -a NODES <<< "$(<"$TB/run/nodes")"
install -m 755 "$SW_BIN" "$TB/scratch/sw-pool"
for x in full enter; do [[ ! -x $SW_BIN-$x ]] || install -m 755 "$SW_BIN-$x" "$TB/scratch/sw-pool-$x"; done
S=$((SIZE_MIB << 20))
mkdir -p "$TB/export/bench"
[[ -s $TB/export/bench/f && $(stat -c %s "$TB/export/bench/f") == "$S" ]] || head -c "$S" /dev/urandom > "$TB/export/bench/f"
cd "$TB/scratch"
echo "uptime before: $(uptime)"
echo "busiest processes on the machine before the runs:"; top -bn1 -o %CPU | sed -n '8,14p' | cut -c1-120
for A in "${ALGOS[@]}"; do
  for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/f"; done
  drop
  # shellcheck disable=SC2016  # expanded by the bash in the namespace, not here
  ip netns exec swp-n1 bash -c 'while :; do echo "$(date +%s.%N) $(cat /sys/class/net/eth0/statistics/rx_bytes)"; sleep 0.5; done' > /tmp/cp-probe.rx &
  p1=$!
  # shellcheck disable=SC2016  # expanded by the bash in the namespace, not here
  ip netns exec "$TB_STOR" bash -c 'while :; do echo "$(cat /sys/class/net/eth0/statistics/tx_bytes)"; sleep 0.5; done' > /tmp/cp-probe.tx &
  p2=$!
  vmstat -n 1 > /tmp/cp-probe.vm &
  p3=$!
  t0=$(now)
  env_arg=(); [[ $A == default ]] || env_arg=(-x "SW_POOL_CP_ALGORITHM=$A")
  "$TESTBED/mpirun" "${env_arg[@]}" /usr/bin/time -f "rank cpu: user %U s, sys %S s, wall %e s" "$TB/scratch/sw-pool" cp -v "$TB/shared/bench/f" "$TB/local/f" 2>&1 | sed "s/^/[$A] /"
  t1=$(now)
  kill "$p1" "$p2" "$p3"; wait "$p1" "$p2" "$p3" 2>/dev/null || true
  echo "[$A] N=$N wall $(elapsed "$t0" "$t1") s (incl. mpirun start-up)"
  echo "[$A] node1 rx MB/s per 0.5 s | storage tx MB/s:"
  paste /tmp/cp-probe.rx /tmp/cp-probe.tx | awk -v t0="$t0" 'NR>1 && NF==3 && $3!="" { printf "  t=%5.1f rx %5.1f  stor %5.1f\n", $1-t0, ($2-r)/0.5e6, ($3-s)/0.5e6 } { r=$2; s=$3 }'
  echo "[$A] vmstat (us sy id wa) per second:"
  awk 'NR>2 { printf "  %s %s %s %s\n", $13, $14, $15, $16 }' /tmp/cp-probe.vm | tr '\n' ';'; echo
  rm -f /tmp/cp-probe.rx /tmp/cp-probe.tx /tmp/cp-probe.vm
done
for n in "${NODES[@]}"; do rm -f "$TB/nodes/$n/local/f"; done
echo "uptime after: $(uptime)"
