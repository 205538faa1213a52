#!/usr/bin/env bash
# A second MPI implementation: build sw-pool against MPICH (MPICC=mpicc.mpich) into a separate
# target directory and run a 2-rank smoke test of `sw-pool cp` on this machine with mpirun.mpich
# (hydra). SW_POOL_FAKE_NODES=1 makes each rank its own "node", so the MPI distribution path runs
# (one process per node would otherwise be a local copy). Exits 0 only if both ranks' copies are
# identical to SRC, every byte was read once, and a repeat copy reads nothing.
#
#   tools/mpich-smoke.sh            (needs mpich + libmpich-dev; ~5 min for the first build)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${SWP_MPICH_TARGET:-/var/tmp/swp-mpich-target}
if ! command -v mpicc.mpich >/dev/null || ! command -v mpirun.mpich >/dev/null; then
  echo "mpich-smoke: mpicc.mpich / mpirun.mpich not found (apt-get install mpich libmpich-dev)"; exit 1
fi
(cd "$REPO" && MPICC=mpicc.mpich CARGO_TARGET_DIR=$TARGET cargo build --release -q -p sw-pool)
# sw-pool is the front (no MPI); the MPI commands run as sw-pool-full beside it
BIN=$TARGET/release/sw-pool
# (ldd's output is read whole: `ldd | grep -q` fails under pipefail when grep exits first and ldd
# gets SIGPIPE; it did, once, in the cluster suite)
libs=$(ldd "$BIN-full")
if ! grep -q 'libmpich' <<< "$libs"; then
  echo "mpich-smoke: FAIL: $BIN-full is not linked against MPICH:"; grep -i mpi <<< "$libs"; exit 1
fi
D=$(mktemp -d /var/tmp/swp-mpich-smoke.XXXXXX)
trap 'rm -rf "$D"' EXIT
head -c $((9 * 1048576 + 7)) /dev/urandom > "$D/src"
out=$(SW_POOL_FAKE_NODES=1 mpirun.mpich -np 2 "$BIN" cp --json --chunk 1MiB "$D/src" "$D/dest-%n")
want=$(sha256sum < "$D/src" | cut -d' ' -f1)
rc=0
for i in 0 1; do
  got=$(sha256sum < "$D/dest-$i" | cut -d' ' -f1)
  if [[ $got == "$want" ]]; then echo "PASS mpich: rank/node $i identical"; else echo "FAIL mpich: node $i differs"; rc=1; fi
done
if grep -q '"nodes": 2' <<< "$out" && grep -q "\"bytes_read_from_src\": $((9 * 1048576 + 7))" <<< "$out"; then
  echo "PASS mpich: 2 nodes, each byte read once"
else
  echo "FAIL mpich: report: $out"; rc=1
fi
out=$(SW_POOL_FAKE_NODES=1 mpirun.mpich -np 2 "$BIN" cp --json "$D/src" "$D/dest-%n")
if grep -q '"skipped_all": true' <<< "$out"; then echo "PASS mpich: repeat copy skipped"; else echo "FAIL mpich: repeat: $out"; rc=1; fi
exit $rc
