#!/usr/bin/env bash
# The Slurm SPANK plugin (`--pool=NAME/VERSION[,...]`) on the virtual cluster's real Slurm, 4 nodes:
#  - bad values fail at submission with a clear message (syntax; a pool that does not exist), for
#    sbatch and srun, and no job is created;
#  - `sbatch -N4 --pool=demo/1.0`: the pool is on MODULEPATH in the script and in every task of
#    `srun -N4`, mounted on all 4 nodes before the script starts, with one broadcast: shared storage
#    serves about 1x the pool (not one read per node);
#  - `srun -N4 --pool=demo/1.0 CMD` (its own allocation) and `salloc -N4 --pool=demo/1.0 srun ...`:
#    the same;
#  - after each job the existing epilog leaves no mount, record or FUSE process on any node.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
SW=$REPO/target/release/sw-pool
SO=$REPO/target/release/sw_pool_spank.so
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
[[ -f $SO ]] || { fail "SPANK plugin built" "$SO missing (make spank)"; finish; }
uid=$(id -u "$TB_USER")
W=$TB/scratch/t41-$$
E=$TB/export/t41-$$          # on the storage server; nodes see it as $TB/shared/t41-$$
POOLS=$TB/shared/t41-$$/pools
HOOKS=("$TB/etc/prolog.d/50-sw-pool" "$TB/etc/task-prolog.d/50-sw-pool" "$TB/etc/epilog.d/50-sw-pool")
PLUGSTACK=$TB/etc/plugstack.conf
leftovers() {  # leftovers NODE -> "mounts records helpers" of $TB_USER
  "$TESTBED/exec" "$1" sh -c "m=\$(awk '\$3 ~ /^fuse\\.(squashfuse|ext|fuse2fs|sw-pool)/ && \$4 ~ /user_id=$uid(,|\$)/' /proc/self/mounts | wc -l)
    r=\$(ls /tmp/sw-pool-$uid/mounts/ 2>/dev/null | grep -c '\\.json\$' || true)
    h=\$(ps -u $uid -o stat=,comm= 2>/dev/null | grep -c -E '^[^Z ]+ +(squashfuse|fuse2fs|sw-pool-serve)' || true)
    echo \$m \$r \$h"
}
clean_after() {  # clean_after NAME: every node clean within 10 s of the job's end
  local n i ok=1
  for n in "${nodes[@]}"; do
    for ((i = 0; i < 100; i++)); do [[ $(leftovers "$n") == "0 0 0" ]] && break; sleep 0.1; done
    l=$(leftovers "$n"); [[ $l == "0 0 0" ]] || { ok=0; fail "$1: $n clean after the job" "$l"; }
  done
  [[ $ok == 1 ]] && pass "$1: after the job no mount, record or FUSE process on any node"
  return 0
}
cleanup() {
  sed -i "\\|$W/|d" "$PLUGSTACK" 2>/dev/null || true
  rm -f "${HOOKS[@]}"
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" runuser -u "$TB_USER" -- "$SW" cleanup --all --kill >/dev/null 2>&1 || true
    "$TESTBED/exec" "$n" rm -rf "/tmp/sw-pool-$uid" >/dev/null 2>&1 || true
  done
  rm -rf "$W" "$E" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$W/bin" "$W/lib" "$W/libexec/sw-pool" "$W/tree" "$W/out" "$E/pools/demo"
chmod 1777 "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"; SW=$W/bin/sw-pool
cp "$SO" "$W/lib/sw_pool_spank.so"
for h in prolog task-prolog epilog; do ln -sf ../../bin/sw-pool "$W/libexec/sw-pool/$h"; done
"$SW" init --name demo --version 1.0 "$W/tree/demo" >/dev/null
mkdir -p "$W/tree/demo/install/hello/1.0/bin" "$W/tree/demo/install/hello/1.0/share"
printf '#!/bin/sh\necho "hello from $(hostname)"\n' > "$W/tree/demo/install/hello/1.0/bin/hello"
chmod 755 "$W/tree/demo/install/hello/1.0/bin/hello"
head -c 24M /dev/urandom > "$W/tree/demo/install/hello/1.0/share/data"   # so that bytes served mean something
"$SW" build -q --gen-modulefiles "$E/pools/demo/1.0.sqfs" "$W/tree/demo"
chmod -R a+rX "$W" "$E"
POOL_BYTES=$(stat -c %s "$E/pools/demo/1.0.sqfs")
printf '#!/bin/sh\nexec %s\n' "$W/libexec/sw-pool/prolog" > "${HOOKS[0]}"
printf '#!/bin/sh\nexec %s\n' "$W/libexec/sw-pool/task-prolog" > "${HOOKS[1]}"
printf '#!/bin/sh\nexec %s\n' "$W/libexec/sw-pool/epilog" > "${HOOKS[2]}"
chmod 755 "${HOOKS[@]}"
# README, "For admins: Slurm": one plugstack.conf line
assert_match "README gives the plugstack.conf line" "optional /usr/local/lib/sw-pool/sw_pool_spank.so" "$(cat "$REPO/README.md")"
echo "optional $W/lib/sw_pool_spank.so sw-pool=$SW" >> "$PLUGSTACK"

# submissions from node1 (the login node: it sees the shared file system, as users' login nodes do)
u() {
  "$TESTBED/exec" node1 runuser -u "$TB_USER" -- env -u XDG_RUNTIME_DIR -u SW_POOL_STATE_DIR -u MODULEPATH \
    SW_POOL_PATH="$POOLS" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= PATH="$W/bin:/usr/local/bin:/usr/bin:/bin" "$@"
}
njobs() { squeue -h -u "$TB_USER" 2>/dev/null | wc -l; }
# every job starts with empty node caches, so that the bytes served show how the pool got there
uncache() { local n; for n in "${nodes[@]}"; do "$TESTBED/exec" "$n" rm -rf "$TB/local/sw-pool-$uid/cache"; done; }

# --- bad values fail at submission, no job is created
rc=0; out=$(u sbatch --parsable -N1 --pool='demo' --wrap true 2>&1) || rc=$?
assert_eq "sbatch --pool=demo (no version) fails at submission" 1 "$(( rc != 0 ))"
assert_match "... saying what is wrong" "--pool=demo: 'demo' is not NAME/VERSION" "$out"
rc=0; out=$(u sbatch --parsable -N1 --pool='demo/1.0;rm' --wrap true 2>&1) || rc=$?
assert_eq "sbatch --pool='demo/1.0;rm' fails at submission" 1 "$(( rc != 0 ))"
assert_match "... naming the bad character" "contains ';'" "$out"
rc=0; out=$(u sbatch --parsable -N1 --pool=nope/9 --wrap true 2>&1) || rc=$?
assert_eq "sbatch --pool=nope/9 (no such pool) fails at submission" 1 "$(( rc != 0 ))"
assert_match "... with sw-pool's reason" "--pool=nope/9: .*nope" "$out"
rc=0; out=$(u srun -N1 --pool=nope/9 true 2>&1) || rc=$?
assert_eq "srun --pool=nope/9 fails at submission" 1 "$(( rc != 0 ))"
assert_eq "no job was queued by the refused submissions" 0 "$(njobs)"

# --- sbatch -N4 --pool=demo/1.0
cat > "$W/job.sh" <<EOS
#!/bin/bash
source /usr/share/lmod/lmod/init/bash
echo "BATCH MODULEPATH=\$MODULEPATH"
srun -N4 --ntasks-per-node=1 bash -c 'source /usr/share/lmod/lmod/init/bash; module load hello/1.0 && hello'
EOS
chmod 755 "$W/job.sh"
uncache
b0=$("$TESTBED/storage-bytes")
jid=$(u sbatch --parsable -N4 --pool=demo/1.0 -o "$W/out/job-%j.out" --chdir=/tmp "$W/job.sh")
wait_job "$jid" 1800
bytes=$(( $("$TESTBED/storage-bytes") - b0 ))
out=$(cat "$W/out/job-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  sbatch: /' | head -20
assert_match "sbatch --pool: the batch script has the pool on MODULEPATH" "BATCH MODULEPATH=[^ ]*/demo/1.0/modulefiles" "$out"
assert_eq "sbatch --pool: hello runs from the pool on all 4 nodes" 4 "$(grep '^hello from node' <<< "$out" | sort -u | wc -l)"
assert_within "sbatch --pool: shared storage served about 1x the pool (one broadcast) ($bytes bytes, pool $POOL_BYTES)" "$(calc "$bytes / $POOL_BYTES")" 0.95 1.5
clean_after "sbatch --pool"

# --- srun and salloc: run CMD (it runs `hello` from the pool in one task per node) with empty node
# caches; it exits 0, hello ran on all 4 nodes, shared storage served about 1x the pool
interactive() {  # interactive NAME CMD...
  local name=$1 rc=0 out b0 bytes; shift
  uncache
  b0=$("$TESTBED/storage-bytes")
  out=$(u "$@" bash -c 'source /usr/share/lmod/lmod/init/bash; module load hello/1.0 && hello' 2>&1) || rc=$?
  bytes=$(( $("$TESTBED/storage-bytes") - b0 ))
  assert_eq "$name exits 0" 0 "$rc"
  [[ $rc == 0 ]] || printf '%s\n' "$out" | sed "s/^/  ${name%% *}: /" | head -8
  assert_eq "$name: hello runs from the pool on all 4 nodes" 4 "$(grep '^hello from node' <<< "$out" | sort -u | wc -l)"
  assert_within "$name: shared storage served about 1x the pool ($bytes bytes)" "$(calc "$bytes / $POOL_BYTES")" 0.95 1.5
  clean_after "$name"
}
interactive "srun --pool" srun -N4 --ntasks-per-node=1 --pool=demo/1.0    # its own allocation
interactive "salloc --pool" salloc -N4 --pool=demo/1.0 srun --ntasks-per-node=1

# --- --layer=NAME: every task of the steps runs in the environment with that layer (node1's layer,
# synced to the step's nodes by sw-pool run itself); the batch script itself runs outside
LD=$TB/local/t41-layers-$uid
ul() { u env SW_POOL_LAYER_DIR="$LD" "$@"; }
rc=0; out=$(ul srun -N1 --layer='dev;rm' true 2>&1) || rc=$?
assert_eq "srun --layer='dev;rm' fails at submission" 1 "$(( rc != 0 ))"
assert_match "... naming the bad character" "--layer=dev;rm: 'dev;rm' contains ';'" "$out"
rc=0; out=$(ul srun -N1 -w node1 sh -c "$SW layer create dev >/dev/null && $SW run --layer dev -- sh -c 'printf \"#!/bin/sh\\necho t41 \\\$(hostname) in \\\$SW_POOL_ENVIRONMENT\\n\" > /usr/local/bin/t41tool && chmod 755 /usr/local/bin/t41tool'" 2>&1) || rc=$?
assert_eq "a layer on node1 with a program in /usr/local/bin" 0 "$rc"
[[ $rc == 0 ]] || printf '  %s\n' "$out"
rc=0; out=$(ul timeout 300 srun -N4 --ntasks-per-node=2 --layer=dev t41tool 2>&1) || rc=$?
assert_eq "srun -N4 --ntasks-per-node=2 --layer=dev t41tool exits 0" 0 "$rc"
assert_eq "... the layer's program ran in the environment in all 8 tasks, on 4 nodes" "8 4" "$(grep -c '^t41 node[0-9] in dev$' <<< "$out") $(grep '^t41 node' <<< "$out" | sort -u | wc -l)"
[[ $rc == 0 ]] || printf '  %s\n' "$out" | head -8
cat > "$W/layer-job.sh" <<EOS
#!/bin/bash
echo "BATCH env=\${SW_POOL_ENVIRONMENT:-none}"
srun -N4 t41tool
EOS
chmod 755 "$W/layer-job.sh"
jid=$(ul sbatch --parsable -N4 --layer=dev -o "$W/out/layer-%j.out" --chdir=/tmp "$W/layer-job.sh")
wait_job "$jid" 600
out=$(cat "$W/out/layer-$jid.out" 2>/dev/null || true)
assert_match "sbatch --layer=dev: the batch script runs outside the environment" "BATCH env=none" "$out"
assert_eq "... its step's tasks run in it on 4 nodes" 4 "$(grep '^t41 node[0-9] in dev$' <<< "$out" | sort -u | wc -l)"
[[ $(grep -c '^t41 node' <<< "$out") == 4 ]] || printf '  %s\n' "$out" | head -8
for n in "${nodes[@]}"; do "$TESTBED/exec" "$n" rm -rf "$LD" >/dev/null 2>&1 || true; done
finish
