#!/usr/bin/env bash
# Checks: the rsmpi check program (tools/mpi-selftest: 64 MiB MPI_Bcast from rank 0, sha256
# on every rank) runs across 4 nodes with testbed/mpirun and with srun --mpi=pmix, and every rank
# reports the same checksum.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
bin=$REPO/target/release/mpi-selftest
[[ -x $bin || ! -x $REPO/target/debug/mpi-selftest ]] || bin=$REPO/target/debug/mpi-selftest
if [[ ! -x $bin ]]; then
  echo "t_03: building mpi-selftest (cargo build --release -p mpi-selftest)"
  (cd "$REPO" && cargo build --release -q -p mpi-selftest) || true
fi
[[ -x $bin ]] || { fail "mpi-selftest built" "$bin missing and cargo build failed"; finish; }
# a copy on the shared scratch dir, readable by every user on every node
install -m 755 "$bin" "$TB/scratch/mpi-selftest"
bin=$TB/scratch/mpi-selftest
cd "$TB/scratch"

check() {  # check LABEL OUTPUT: 4 ranks on 4 distinct nodes, one common digest; prints the digest
  local label=$1 out=$2 lines ranks hosts digests
  lines=$(grep -E '^rank [0-9]+/4 host node[0-9]+ sha256 [0-9a-f]{64}$' <<< "$out" || true)
  ranks=$(awk '{print $2}' <<< "$lines" | sort | tr '\n' ' ')
  hosts=$(awk '{print $4}' <<< "$lines" | sort -u | wc -l)
  digests=$(awk '{print $6}' <<< "$lines" | sort -u)
  assert_eq "$label: ranks 0..3 of 4 reported" "0/4 1/4 2/4 3/4 " "$ranks"
  assert_eq "$label: one rank on each of 4 nodes" 4 "$hosts"
  assert_eq "$label: all ranks have the same sha256" 1 "$(grep -c . <<< "$digests")"
  echo "  $label: sha256 $digests"
}
out=$("$TESTBED/mpirun" "$bin" 2>/dev/null || true)
check "testbed/mpirun -np 4" "$out"
d1=$(awk '/^rank/ {print $6; exit}' <<< "$out")
out=$(srun --mpi=pmix -N4 "$bin" 2>/dev/null || true)
check "srun --mpi=pmix -N4" "$out"
d2=$(awk '/^rank/ {print $6; exit}' <<< "$out")
assert_eq "same digest with mpirun and srun" "$d1" "$d2"
out=$(as_user srun --mpi=pmix -N4 --chdir=/tmp "$bin" 2>/dev/null || true)
check "srun --mpi=pmix -N4 as $TB_USER" "$out"
# Open MPI's own launcher inside an allocation (plm/slurm starts orted through srun), as the user
out=$(cd /tmp || exit; as_user salloc -Q -N2 mpirun.openmpi "$bin" 1 2>/dev/null) || true
assert_eq "salloc -N2 mpirun (as $TB_USER): 2 ranks on 2 distinct nodes, one digest" "2 2 1" \
  "$(grep -c '^rank [01]/2 ' <<< "$out") $(awk '/^rank/ {print $4}' <<< "$out" | sort -u | grep -c .) $(awk '/^rank/ {print $6}' <<< "$out" | sort -u | grep -c .)"
# the wrapper honours overrides: 8 ranks, two per node
out=$("$TESTBED/mpirun" -np 8 "$bin" 1 2>/dev/null || true)
assert_eq "testbed/mpirun -np 8: 8 ranks, 2 per node" "2 node1 2 node2 2 node3 2 node4" \
  "$(awk '/^rank/ {print $4}' <<< "$out" | sort | uniq -c | awk '{printf "%s%s %s", (NR > 1 ? " " : ""), $1, $2}')"
finish
