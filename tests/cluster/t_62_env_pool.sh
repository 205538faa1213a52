#!/usr/bin/env bash
# `sw-pool run --pool NAME/VERSION` on the virtual cluster (issue 29), as the unprivileged test user
# under Slurm: root builds a pool (a program and its Lua modulefile) on shared storage; in a batch
# job `srun -N4 --ntasks-per-node=2 sw-pool run --pool tp62/1 -- bash -c 'module load tp62/1 &&
# tp62tool'` places the pool in every node's cache (the step's first task, once for all nodes) and
# runs each task in an environment where the pool is mounted at its usual place with its modules on
# MODULEPATH; nothing is mounted on any node before, during (outside the environments) or after; a
# damaged pool fails every task with its name and runs nothing; the pool file is unchanged.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
[[ -x $SW && -x $SW-full ]] || { fail "sw-pool built" "$SW or $SW-full missing (make build)"; finish; }
command -v squashfuse_ll >/dev/null || { skip "squashfuse_ll is not installed (tools/setup-deps.sh installs it)"; finish; }
W=$TB/scratch/t62-$$
E=$TB/export/t62-$$          # the storage server's disk; nodes see it as $TB/shared/t62-$$
uid=$(id -u "$TB_USER")
cleanup() {
  rm -rf "$W" "$E"
}
trap cleanup EXIT
mkdir -p "$W/bin" "$W/tree/install/tp62/1/bin" "$W/tree/modulefiles/tp62" "$E/pools/tp62" "$E/pools/tbad" "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/" 2>/dev/null || cp "$SW" "$SW-full" "$W/bin/"
SW=$W/bin/sw-pool

T=$W/tree
cat > "$T/install/tp62/1/bin/tp62tool" <<'EOS'
#!/bin/sh
echo "tp62 on $(cat /proc/sys/kernel/hostname) from $(dirname "$(command -v tp62tool)")"
EOS
chmod 755 "$T/install/tp62/1/bin/tp62tool"
# 16 MiB that does not compress: the bytes the storage server serves show how often it is read
head -c 16M /dev/urandom > "$T/install/tp62/1/data"
mkdir -p "$W/tbad/modulefiles"
echo 'whatis("t")' > "$W/tbad/modulefiles/t.lua"
cat > "$T/modulefiles/tp62/1.lua" <<'EOS'
local root = myFileName():match("(.*)/modulefiles/")
prepend_path("PATH", pathJoin(root, "install/tp62/1/bin"))
EOS
out=$("$SW" build -q --format squashfs --name tp62 --version 1 "$E/pools/tp62/1.sqfs" "$T" 2>&1) && rc=0 || rc=$?
assert_eq "root builds the pool (a program and its modulefile) on shared storage" 0 "$rc"
[[ $rc == 0 ]] || printf '  %s\n' "$out"
"$SW" build -q --format squashfs --name tbad --version 1 "$E/pools/tbad/1.sqfs" "$W/tbad" >/dev/null 2>&1
# damaged after it was built: a byte of its image flipped (the manifest's chunk hashes catch it)
flip_byte "$E/pools/tbad/1.sqfs" 300
pool_hash=$(sha256sum < "$E/pools/tp62/1.sqfs")
chmod -R a+rX "$W" "$E"
chmod 1777 "$W/out"
ENVV=(env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_PATH="$TB/shared/t62-$$/pools")

cat > "$W/job.sh" <<EOS
#!/bin/bash
export PATH=$W/bin:\$PATH
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR SW_POOL_MOUNT MODULEPATH
srun -n4 -N4 sh -c 'echo "before \$(grep -cE "tp62|squashfuse" /proc/self/mounts)"'
for step in 1 2; do
  srun -N4 --ntasks-per-node=2 sw-pool -v run --pool tp62/1 -- bash -c 'source /usr/share/lmod/lmod/init/bash; module load tp62/1 && tp62tool; echo "MP \$MODULEPATH"'
done
srun -n2 -N2 sw-pool run --pool tbad/1 -- echo ran; echo "bad rc \$?"
srun -n4 -N4 sh -c 'echo "left \$(grep -cE "tp62|squashfuse" /proc/self/mounts) \$(sw-pool cache list | grep -c "tp62") \$(sw-pool cache list | grep -c "tbad")"; sw-pool list | grep -c tp62 || true'
srun -n4 -N4 sw-pool cache prune --max-size 0 >/dev/null
EOS
chmod 755 "$W/job.sh"
"$TESTBED/storage-bytes" --mark >/dev/null
rc=0; as_user "${ENVV[@]}" sbatch -W -N4 --ntasks-per-node=2 --chdir=/tmp -o "$W/out/job.out" "$W/job.sh" >/dev/null 2>&1 || rc=$?
jo=$(cat "$W/out/job.out" 2>/dev/null || true)
served=$("$TESTBED/storage-bytes" --since-mark)
assert_eq "batch job: srun -N4 --ntasks-per-node=2 run --pool tp62/1, twice, and a damaged pool: exits 0" 0 "$rc"
assert_eq "... no pool mounted on any node before" 4 "$(grep -c '^before 0$' <<< "$jo" || true)"
assert_eq "... module load tp62/1 && tp62tool ran in all 16 tasks, from the pool at its usual place" 16 \
  "$(grep -cE "^tp62 on node[0-9] from /tmp/sw-pool-$uid/mnt/tp62/1/install/tp62/1/bin$" <<< "$jo" || true)"
assert_eq "... on 4 distinct nodes" 4 "$(grep -E '^tp62 on node' <<< "$jo" | cut -d' ' -f3 | sort -u | wc -l)"
assert_eq "... MODULEPATH inside names the pool's modulefiles" 16 "$(grep -c "^MP /tmp/sw-pool-$uid/mnt/tp62/1/modulefiles" <<< "$jo" || true)"
mounted=$(grep -c "pool tp62/1 at /tmp/sw-pool-$uid/mnt/tp62/1 by sw-pool-serve (this environment only)" <<< "$jo" || true)
assert_match "... -v: the pool mounted in each node's environment by sw-pool's tree server (one per node and step, its tasks join it)" '^(8|9|1[0-6])$' "$mounted"
assert_match "... the damaged pool: the step fails (exit 125)" "bad rc 125" "$jo"
assert_match "... the damaged pool: srun fails and names the pool and the damage" "tbad.*damaged|damaged.*tbad" "$jo"
assert_eq "... nothing ran over the damaged pool" 0 "$(grep -c '^ran$' <<< "$jo" || true)"
assert_eq "... after: no mount on any node, one verified copy of tp62 in each node's cache, none of tbad" 4 "$(grep -c '^left 0 1 0$' <<< "$jo" || true)"
assert_eq "... sw-pool list on the nodes names no tp62 (nothing loaded node-wide)" 4 "$(grep -c '^0$' <<< "$jo" || true)"
[[ $rc == 0 && $(grep -c "^left 0 1 0$" <<< "$jo" || true) == 4 ]] || printf "  job: %s\n" "$jo" | head -60
size=$(( $(stat -c %s "$E/pools/tp62/1.sqfs") + $(stat -c %s "$E/pools/tbad/1.sqfs") ))
echo "  storage served $served bytes for pools of $size bytes (2 steps x 4 nodes x 2 tasks)"
assert_eq "the storage server served the pools about once (<= 1.3x their size), not once per node or task" 1 \
  "$(awk -v s="$served" -v p="$size" 'BEGIN { print (s >= 0.9 * 16777216 && s <= 1.3 * p) ? 1 : 0 }')"
assert_eq "the pool on shared storage is unchanged" "$pool_hash" "$(sha256sum < "$E/pools/tp62/1.sqfs")"
finish
