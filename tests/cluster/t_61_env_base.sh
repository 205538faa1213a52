#!/usr/bin/env bash
# `sw-pool run --base POOL` on the virtual cluster (issue 29), as the unprivileged test user under
# Slurm: a root file system built by root as a squashfs pool on shared storage; a batch job loads it
# on 4 nodes (`sw-pool load`: its verified node-local copy on each), syncs a layer written over the
# base on node1, and runs `srun -N4 sw-pool run --base tbase/1 --layer dev -- PROGRAM`: every task
# runs inside the base (not the host's tree), over the job's copy of the layer, through the kernel's
# overlay without the site's helper (-v says so); the hosts and the pool are unchanged, and nothing
# of the environments is left on any node.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
[[ -x $SW && -x $SW-enter ]] || { fail "sw-pool built" "$SW or $SW-enter missing (make build)"; finish; }
command -v squashfuse_ll >/dev/null || { skip "squashfuse_ll is not installed (tools/setup-deps.sh installs it)"; finish; }
W=$TB/scratch/t61-$$
E=$TB/export/t61-$$          # the storage server's disk; nodes see it as $TB/shared/t61-$$
uid=$(id -u "$TB_USER")
LD=$TB/local/t61-layers-$uid   # node-local: each node has its own $TB/local
cleanup() {
  for n in $TB_NODES; do "$TESTBED/exec" "$n" rm -rf "$LD" >/dev/null 2>&1 || true; done
  rm -rf "$W" "$E"
}
trap cleanup EXIT
mkdir -p "$W/bin" "$W/tree" "$E/pools/tbase" "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$REPO/tests/cluster/srun-mpi" "$W/bin/"
SW=$W/bin/sw-pool

# a tiny root file system: dash as /bin/sh, a few programs and their libraries, mount points
T=$W/tree
mkdir -p "$T"/{bin,etc,proc,dev,sys,tmp,run,home,root,var/tmp,usr/local/bin}
for p in /bin/dash:sh /bin/cat:cat /bin/ls:ls /bin/rm:rm /bin/chmod:chmod; do
  cp "${p%%:*}" "$T/bin/${p##*:}"
  for l in $(ldd "${p%%:*}" | grep -o '/lib[^ ]*'); do mkdir -p "$T$(dirname "$l")"; cp -n "$l" "$T$l"; done
done
echo 'NAME="t61 base"' > "$T/etc/os-release"
echo 'from the base' > "$T/etc/motd"
chmod 1777 "$T/tmp"
out=$("$SW" build -q --format squashfs --name tbase --version 1 "$E/pools/tbase/1.sqfs" "$T" 2>&1) && rc=0 || rc=$?
assert_eq "root builds the root file system as a squashfs pool on shared storage" 0 "$rc"
[[ $rc == 0 ]] || printf '  %s\n' "$out"
pool_hash=$(sha256sum < "$E/pools/tbase/1.sqfs")
chmod -R a+rX "$W" "$E"
chmod 1777 "$W/out"
ENVV=(env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_LAYER_DIR="$LD" SW_POOL_PATH="$TB/shared/t61-$$/pools")

# what node1 writes into the layer, inside the base: a program, and the deletion of the base's motd
cat > "$W/t61tool" <<'EOS'
#!/bin/sh
echo "t61 on $(cat /proc/sys/kernel/hostname): $(cat /etc/os-release) $(cat /etc/motd 2>/dev/null || echo no-motd) $(ls /usr/bin/apt 2>/dev/null || echo no-host-usr)"
EOS
cat > "$W/install.sh" <<EOS
cat $W/t61tool > /usr/local/bin/t61tool && chmod 755 /usr/local/bin/t61tool && rm /etc/motd
EOS
chmod 644 "$W/t61tool" "$W/install.sh"
# the batch job: load the base on 4 nodes, write into a layer over it on node1, sync the layer,
# run the program on 4 nodes inside the base over the job's copy; unload
cat > "$W/job.sh" <<EOS
#!/bin/bash
export PATH=$W/bin:\$PATH
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR
srun-mpi -N4 --ntasks-per-node=1 sw-pool load tbase/1 >/dev/null || { echo "LOAD FAILED"; exit 3; }
srun -N1 -w \$(hostname) sh -c 'sw-pool layer create dev >/dev/null && sw-pool -v run --base tbase/1 --layer dev -- sh $W/install.sh' || { echo "INSTALL FAILED"; exit 4; }
sw-pool layer sync dev >/dev/null || { echo "SYNC FAILED"; exit 5; }
srun -N4 sw-pool -v run --base tbase/1 --layer dev -- t61tool
srun --mpi=pmix -N4 --ntasks-per-node=1 sw-pool unload tbase/1 >/dev/null
srun -N4 sh -c 'echo "left \$(grep -cE " /tmp/sw-pool-$uid/|squashfuse|overlay" /proc/self/mounts)"'
EOS
chmod 755 "$W/job.sh"
rc=0; as_user "${ENVV[@]}" sbatch -W -N4 --chdir=/tmp -o "$W/out/job.out" "$W/job.sh" >/dev/null 2>&1 || rc=$?
jo=$(cat "$W/out/job.out" 2>/dev/null || true)
assert_eq "batch job: load --base pool on 4 nodes, layer over it, sync, srun -N4 run --base --layer exits 0" 0 "$rc"
assert_match "... node1: writing the layer over the base takes the rootless kernel overlay" "rootless kernel overlay over the base pool" "$jo"
assert_eq "... the program ran on 4 nodes inside the base (its os-release, the layer's deletion of its motd, no host /usr)" 4 \
  "$(grep -cE '^t61 on node[0-9]: NAME="t61 base" no-motd no-host-usr$' <<< "$jo" || true)"
assert_eq "... on 4 distinct nodes" 4 "$(grep -E '^t61 on node' <<< "$jo" | cut -d: -f1 | sort -u | wc -l)"
assert_eq "... -v on every node: the kernel's overlay over the base and the job's copy" 5 "$(grep -c "rootless kernel overlay over the base pool" <<< "$jo" || true)"
assert_eq "... no mount of sw-pool's left on any node after unload" 4 "$(grep -c '^left 0$' <<< "$jo" || true)"
[[ $rc == 0 && $(grep -c '^t61 on' <<< "$jo" || true) == 4 && $(grep -c '^left 0$' <<< "$jo" || true) == 4 ]] || printf '  job: %s\n' "$jo"
assert_eq "the pool on shared storage is unchanged" "$pool_hash" "$(sha256sum < "$E/pools/tbase/1.sqfs")"
n1=$("$TESTBED/exec" node1 sh -c "test -x $LD/dev/upper/usr/local/bin/t61tool && stat -c %u $LD/dev/upper/usr/local/bin/t61tool" || true)
assert_eq "the program is in node1's layer, the user's own file" "$uid" "$n1"
assert_eq "the hosts have no t61tool" 0 "$(for n in $TB_NODES; do "$TESTBED/exec" "$n" sh -c 'test -e /usr/local/bin/t61tool && echo x'; done | grep -c x || true)"
finish
