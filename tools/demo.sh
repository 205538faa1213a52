#!/usr/bin/env bash
# make demo: the main job end to end on the built-in virtual cluster (4 nodes, real Slurm, Open MPI,
# FUSE and Lmod). An admin builds and signs a pool with two real packages (a C program compiled now,
# and a script) and puts it on the throttled shared storage; a user's Slurm job loads it on all four
# nodes with one command, uses both packages through `module load` on every node, installs a tool
# into /usr/local/bin inside an isolated environment with a writable layer on one node, syncs the
# layer to every node and runs the tool there (the hosts stay unchanged), unloads the pool, and
# runs hello in an environment of its own with the pool (`run --pool`); nothing stays mounted.
# The cluster is taken down at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=preamble.sh
. tools/preamble.sh
from_reachable_copy tools/demo.sh "$@"
# one user of the virtual cluster at a time on this machine
if [ -z "${SWP_CLUSTER_SESSION:-}" ]; then
  SWP_CLUSTER_SESSION=1 exec flock -o -w 3600 /var/tmp/swp-cluster-session.lock "$0" "$@"
fi
# shellcheck source=../testbed/env.sh
. testbed/env.sh
SW=$REPO/target/release/sw-pool
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() { testbed/down --purge >/dev/null 2>&1 || testbed/down --purge; }
trap cleanup EXIT
t0=$(date +%s)

say "bring up the virtual cluster: 4 nodes, shared storage capped at 50 MB/s, Slurm, munge"
testbed/up
W=$TB/scratch/demo            # scratch for the demo (same path on every node)
P=$TB/export/pools            # the shared storage (the nodes see it as $SCRATCH = $TB/shared)
mkdir -p "$W/bin" "$W/trusted" "$W/out" "$P/demo"
chmod 1777 "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$W/bin/"

say "admin: sw-pool init, two packages (hello: a script; cfact: C, compiled now)"
"$SW" init --name demo --version 1.0 --description "sw-pool demo pool" "$W/demo"
mkdir -p "$W/demo/install/hello/1.0/bin" "$W/demo/install/cfact/2.0/bin" "$W/demo/source/cfact"
cat > "$W/demo/install/hello/1.0/bin/hello" <<'EOS'
#!/bin/sh
echo "hello from $(hostname)"
EOS
chmod 755 "$W/demo/install/hello/1.0/bin/hello"
cat > "$W/demo/source/cfact/cfact.c" <<'EOS'
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10, f = 1;
    for (long i = 2; i <= n; i++) f *= i;
    printf("%ld! = %ld\n", n, f);
    return 0;
}
EOS
cc -O2 -o "$W/demo/install/cfact/2.0/bin/cfact" "$W/demo/source/cfact/cfact.c"

say "admin: sw-pool build --gen-modulefiles, sign, inspect; the pool goes to shared storage"
"$SW" build --gen-modulefiles "$P/demo/1.0.sqfs" "$W/demo"
"$SW" keygen --out "$W/site-admin"
"$SW" sign --key "$W/site-admin.pem" "$P/demo/1.0.sqfs"
cp "$W/site-admin.pub.pem" "$W/trusted/site-admin.pem"
"$SW" inspect "$P/demo/1.0.sqfs"
chmod -R a+rX "$W" "$TB/export"

say "user ($TB_USER): a Slurm job on 4 nodes loads the pool with one command and uses it"
cat > "$W/job.sh" <<EOS
#!/bin/bash
set -euo pipefail
source /usr/share/lmod/lmod/init/bash
export PATH=$W/bin:\$PATH SW_POOL_PATH=\$SCRATCH/pools SW_POOL_TRUSTED_KEYS=$W/trusted
unset MODULEPATH
echo "--- sw-pool -v load --require-signature demo/1.0   (one leader per node, 2 ranks per node)"
code=\$(srun --mpi=pmix --ntasks-per-node=2 sw-pool -v load --require-signature demo/1.0)
eval "\$code"
echo "--- module avail"
module avail 2>&1 | sed -n '1,4p'
echo "--- on every node: module load hello/1.0 cfact/2.0"
srun -n4 --ntasks-per-node=1 bash -c 'source /usr/share/lmod/lmod/init/bash; module load hello/1.0 cfact/2.0; hello; echo "  \$(hostname): \$(cfact 12)"' | sort
echo "--- an isolated environment with a writable layer: a tool installed into /usr/local/bin on node1,"
echo "    the layer synced to every node's disk (sw-pool layer sync), the tool run on every node"
export SW_POOL_LAYER_DIR=$TB/local/demo-layers-\$(id -u)
srun -N1 -n1 -w node1 $W/env-step.sh
sw-pool layer sync demo
srun -n4 --ntasks-per-node=1 sh -c 'sw-pool run --layer demo -- demo-tool; test ! -e /usr/local/bin/demo-tool && echo "  \$(hostname): the host'"'"'s /usr/local/bin has no demo-tool"' | sort
echo "--- sw-pool unload demo/1.0"
code=\$(srun --mpi=pmix -n4 --ntasks-per-node=1 sw-pool unload demo/1.0)
eval "\$code"
echo "MODULEPATH after unload: '\${MODULEPATH:-}'"
echo "--- a pool for one environment only (sw-pool run --pool demo/1.0): mounted inside it, on no node"
srun -n4 --ntasks-per-node=1 sw-pool run --pool demo/1.0 -- bash -c 'source /usr/share/lmod/lmod/init/bash; module load hello/1.0 && hello' | sort
srun -n4 --ntasks-per-node=1 $W/count-fuse.sh | sort
EOS
chmod 755 "$W/job.sh"
cat > "$W/env-step.sh" <<EOS
#!/bin/sh
# a layer on this node's local disk; a tool installed into /usr/local/bin inside lands in it
set -e
sw-pool layer create demo >/dev/null
sw-pool run --layer demo -- sh -c 'printf "#!/bin/sh\\necho \\"  \\\$(hostname): demo-tool runs from the layer (\\\$SW_POOL_ENVIRONMENT)\\"\\n" > /usr/local/bin/demo-tool; chmod 755 /usr/local/bin/demo-tool'
echo "  \$(hostname): demo-tool installed into the layer"
EOS
chmod 755 "$W/env-step.sh"
cat > "$W/count-fuse.sh" <<'EOS'
#!/bin/sh
echo "  $(hostname): $(awk '$3 ~ /^fuse/ && $3 != "fuse.sshfs"' /proc/self/mounts | wc -l) FUSE mounts besides the shared storage"
EOS
chmod 755 "$W/count-fuse.sh"
runuser -u "$TB_USER" -- env SLURM_CONF="$SLURM_CONF" sbatch --wait -N4 --ntasks-per-node=2 -o "$W/out/job.out" --chdir=/tmp "$W/job.sh" >/dev/null || {
  cat "$W/out/job.out"; echo "demo: the job failed" >&2; exit 1; }
cat "$W/out/job.out"

say "after the job: no mount, no record of it on any node"
for n in $TB_NODES; do
  testbed/exec "$n" runuser -u "$TB_USER" -- "$W/bin/sw-pool" list | sed "s/^/  $n: /"
done
# shellcheck disable=SC2016  # an awk program: its $3 is awk's field, not a shell variable
left=$(for n in $TB_NODES; do testbed/exec "$n" awk '$3 ~ /^fuse/ && $3 != "fuse.sshfs"' /proc/self/mounts; done)
if [ -n "$left" ]; then echo "demo: mounts left behind: $left" >&2; exit 1; fi
say "demo done in $(( $(date +%s) - t0 )) s; taking the cluster down"
