#!/usr/bin/env bash
# sw-pool load / unload on the virtual cluster: the paper's command line verbatim under mpirun on 4
# nodes; a repeated load reads nothing from shared storage; the whole flow from a Slurm batch job as
# the unprivileged user with the real Lmod (module avail / load on every node); all-or-nothing
# failures: a corrupted pool on shared storage, an unsigned pool under --require-signature, a mount
# that fails on one node. Leaves no mount, record or cache temporary behind.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
uid=$(id -u "$TB_USER")
W=$TB/scratch/t30-$$
E=$TB/export/t30-$$          # the storage server's disk; nodes see it as $TB/shared/t30-$$
cleanup() {
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "awk '\$3 ~ /^fuse/ && (\$2 ~ \"^$TB/local/\" || \$2 ~ \"^/tmp/sw-pool-\") {print \$2}' /proc/self/mounts | while read -r m; do fusermount3 -u -z \"\$m\" || umount -l \"\$m\"; done; rm -rf $TB/local/t30mnt* $TB/local/sw-pool-0 /tmp/sw-pool-$uid" >/dev/null 2>&1 || true
  done
  rm -rf "$W" "$E" /run/sw-pool/records 2>/dev/null || true
}
trap cleanup EXIT
cleanup
mkdir -p "$W/bin" "$W/keys" "$E/pools/demo" "$W/tree" "$W/out"
chmod 1777 "$W/out"   # the job's output, written by the unprivileged user
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$REPO/tests/cluster/srun-mpi" "$W/bin/"
SW=$W/bin/sw-pool

# --- the paper's test pool: head -c 1GB /dev/urandom (64 MB here), sw-pool build -s SIZE test-pool.ext2
mkdir -p "$W/test-pool"
head -c 64MB /dev/urandom > "$W/test-pool/random.data"
want=$(sha256sum < "$W/test-pool/random.data" | cut -d' ' -f1)
# (a failed step must fail the check: `a && b` under set -e ignores a's failure)
if out=$(cd "$W" && "$SW" build -q -s 80MB test-pool.ext2 test-pool 2>&1) && cp "$W/test-pool.ext2" "$E/random.ext2"; then
  pass "built the paper's ext2 pool and put it on shared storage"
else
  fail "built the paper's ext2 pool and put it on shared storage" "$(tail -n 5 <<< "$out")"
  finish
fi

# --- the paper's command, verbatim, on every node
LOCAL_TMPDIR=$TB/local SCRATCH=$TB/shared
export SW_POOL_SHELL=sh   # the printed environment change in sh syntax, whatever $SHELL the caller has
"$TESTBED/storage-bytes" --mark >/dev/null
out=$("$TESTBED/mpirun" "$SW" -v load -m "$LOCAL_TMPDIR/t30mnt" "$SCRATCH/t30-$$/random.ext2" 2>&1) && rc=0 || rc=$?
served=$("$TESTBED/storage-bytes" --since-mark)
assert_eq "mpirun sw-pool -v load -m \$LOCAL_TMPDIR/mnt \$SCRATCH/random.ext2 exits 0" 0 "$rc"
assert_match "-v prints per-phase timings including mount" "read +[0-9.]+ s.*distribute.*mount +[0-9.]+ s" "$(tr '\n' ' ' <<< "$out")"
assert_eq "the environment change is printed once (by rank 0)" 1 "$(grep -c "^export MODULEPATH='$TB/local/t30mnt/modulefiles[:']" <<< "$out" || true)"
size=$(stat -c %s "$E/random.ext2")
assert_within "shared storage served the pool's data once (bytes / file size)" "$(calc "$served / $size")" 0.5 1.05
for n in "${nodes[@]}"; do
  got=$("$TESTBED/exec" "$n" sh -c "sha256sum < $TB/local/t30mnt/random.data | cut -d' ' -f1")
  assert_eq "$n: random.data through the fuse2fs mount has the source's sha256" "$want" "$got"
done
# a second load: nothing read from shared storage, the mount gets a second reference
"$TESTBED/storage-bytes" --mark >/dev/null
out=$("$TESTBED/mpirun" "$SW" -v load -m "$LOCAL_TMPDIR/t30mnt" "$SCRATCH/t30-$$/random.ext2" 2>&1) && rc=0 || rc=$?
served=$("$TESTBED/storage-bytes" --since-mark)
assert_eq "second load exits 0" 0 "$rc"
assert_match "second load: already cached everywhere" "already cached everywhere" "$out"
assert_le "second load reads (almost) nothing from shared storage" "$served" 200000
out=$("$TESTBED/exec" node2 "$SW" list)
assert_match "node2: one mount with two references" "ok +test-pool/0 +[0-9a-f]+ +2 " "$out"
# unload twice: the first keeps the mount (one reference left), the second unmounts on every node
"$TESTBED/mpirun" "$SW" unload "$LOCAL_TMPDIR/t30mnt" >/dev/null 2>&1 && rc=0 || rc=$?
assert_eq "first unload exits 0" 0 "$rc"
assert_eq "node3: still mounted after the first unload" 1 "$("$TESTBED/exec" node3 sh -c "grep -c ' $TB/local/t30mnt fuse' /proc/self/mounts || true")"
"$TESTBED/mpirun" "$SW" unload "$LOCAL_TMPDIR/t30mnt" >/dev/null 2>&1 && rc=0 || rc=$?
assert_eq "second unload exits 0" 0 "$rc"
for n in "${nodes[@]}"; do
  assert_eq "$n: nothing mounted after the last unload" 0 "$("$TESTBED/exec" "$n" sh -c "grep -c ' $TB/local/t30mnt ' /proc/self/mounts || true")"
  assert_match "$n: no record left" "^no mounts on $n" "$("$TESTBED/exec" "$n" "$SW" list)"
done
out=$("$TESTBED/mpirun" "$SW" unload "$LOCAL_TMPDIR/t30mnt" 2>&1) && rc=0 || rc=$?
assert_eq "unload of a pool that is not loaded: exit 0 (as asked already)" 0 "$rc"
assert_match "unload of a pool that is not loaded: a note saying so" "nothing is mounted at .*: nothing to unload" "$out"

# --- a pool with real packages, loaded in a Slurm batch job by the unprivileged user, used through Lmod
"$SW" init --name demo --version 1.0 "$W/tree/demo" >/dev/null
mkdir -p "$W/tree/demo/install/hello/1.0/bin" "$W/tree/demo/install/cfact/2.0/bin"
printf '#!/bin/sh\necho "hello from $(hostname)"\n' > "$W/tree/demo/install/hello/1.0/bin/hello"
chmod 755 "$W/tree/demo/install/hello/1.0/bin/hello"
printf '#include <stdio.h>\nint main(void){long f=1;for(int i=2;i<=7;i++)f*=i;printf("cfact %%ld\\n",f);return 0;}\n' > "$W/cfact.c"
cc -O2 -o "$W/tree/demo/install/cfact/2.0/bin/cfact" "$W/cfact.c"
"$SW" build -q --gen-modulefiles "$E/pools/demo/1.0.sqfs" "$W/tree/demo"
chmod -R a+rX "$W" "$E"
cat > "$W/job.sh" <<EOS
#!/bin/bash
set -e
source /usr/share/lmod/lmod/init/bash
export PATH=$W/bin:\$PATH SW_POOL_PATH=$TB/shared/t30-$$/pools SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR MODULEPATH
code=\$(srun-mpi -N4 --ntasks-per-node=2 sw-pool load demo/1.0)
eval "\$code"
echo "MODULEPATH=\$MODULEPATH"
srun -n4 -N4 --ntasks-per-node=1 bash -c 'source /usr/share/lmod/lmod/init/bash; module -t avail 2>&1 | grep -E "^(hello/1.0|cfact/2.0)\\\$" | sort -u | wc -l ; module load hello/1.0 cfact/2.0 && hello && cfact'
code=\$(srun --mpi=pmix -n4 -N4 --ntasks-per-node=1 sw-pool unload demo/1.0)
eval "\$code"
echo "AFTER=\${MODULEPATH:-}"
srun -n4 -N4 --ntasks-per-node=1 bash -c 'grep -c " /tmp/sw-pool-$uid/" /proc/self/mounts || true'
EOS
chmod 755 "$W/job.sh"
jid=$(as_user sbatch --parsable -N4 --ntasks-per-node=2 -o "$W/out/job-%j.out" --chdir=/tmp "$W/job.sh")
wait_job "$jid" 1800
out=$(cat "$W/out/job-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  job: /' | head -40
assert_match "job: MODULEPATH points into the pool" "MODULEPATH=/tmp/sw-pool-$uid/mnt/demo/1.0/modulefiles" "$out"
assert_eq "job: module avail lists both packages on all 4 nodes" "2 2 2 2" "$(grep -E '^[0-9]+$' <<< "$out" | head -4 | tr '\n' ' ' | sed 's/ $//')"
for n in "${nodes[@]}"; do
  assert_match "job: module load hello/1.0 && hello on $n" "hello from $n" "$out"
done
assert_eq "job: cfact (compiled C) runs on all 4 nodes" 4 "$(grep -c '^cfact 5040$' <<< "$out" || true)"
assert_eq "job: after unload no MODULEPATH entry points into the pool" 1 "$(grep -cx 'AFTER=' <<< "$out" || true)"
assert_eq "job: no mount left on any node" "0 0 0 0" "$(grep -E '^[0-9]+$' <<< "$out" | tail -4 | tr '\n' ' ' | sed 's/ $//')"

# --- failures are all-or-nothing
"$SW" keygen -q --out "$W/keys/adm" >/dev/null
cp "$W/keys/adm.pub.pem" "$W/keys/trusted-adm.pem"
mkdir -p "$W/trusted"
cp "$W/keys/adm.pub.pem" "$W/trusted/site-admin.pem"
cp "$W/test-pool.ext2" "$E/signed.ext2"
"$SW" sign -q --key "$W/keys/adm.pem" "$E/signed.ext2"
# (a) one flipped byte in the data of the pool on shared storage
cp "$E/signed.ext2" "$E/corrupt.ext2"
flip_byte "$E/corrupt.ext2" $((40 * 1024 * 1024 + 12345))
out=$("$TESTBED/mpirun" -x SW_POOL_TRUSTED_KEYS="$W/trusted" "$SW" load -m "$LOCAL_TMPDIR/t30mnt" "$SCRATCH/t30-$$/corrupt.ext2" 2>&1) && rc=0 || rc=$?
assert_eq "corrupted pool: load fails" 1 "$([[ $rc != 0 ]] && echo 1 || echo 0)"
assert_match "corrupted pool: the error names the chunk offset and a node" "(offset|chunk).*node[1-4]|node[1-4].*(offset|chunk)" "$(tr '\n' ' ' <<< "$out")"
echo "$out" | grep 'sw-pool: error' | sed 's/^/  /' | head -8
assert_le "corrupted pool: the ranks report one failure (at least one rank prints it; all exit non-zero)" 1 "$(grep -c 'sw-pool: error' <<< "$out" || true)"
for n in "${nodes[@]}"; do
  left=$("$TESTBED/exec" "$n" sh -c "ls $TB/local/sw-pool-0/cache 2>/dev/null | grep -c -E 'swpool-tmp|corrupt' || true; grep -c ' $TB/local/t30mnt ' /proc/self/mounts || true" | tr '\n' ' ')
  assert_eq "$n: nothing cached half-way and nothing mounted" "0 0 " "$left"
done
# (b) an unsigned pool under --require-signature: refused before any byte moves
"$TESTBED/storage-bytes" --mark >/dev/null
out=$("$TESTBED/mpirun" -x SW_POOL_TRUSTED_KEYS="$W/trusted" "$SW" load --require-signature -m "$LOCAL_TMPDIR/t30mnt" "$SCRATCH/t30-$$/random.ext2" 2>&1) && rc=0 || rc=$?
served=$("$TESTBED/storage-bytes" --since-mark)
assert_match "unsigned pool under --require-signature: refused, says how to sign" "is not signed.*sw-pool sign" "$(tr '\n' ' ' <<< "$out")"
assert_le "unsigned pool: no image data read from shared storage" "$served" 500000
# the signed pool loads under the same policy
out=$("$TESTBED/mpirun" -x SW_POOL_TRUSTED_KEYS="$W/trusted" "$SW" -v load --require-signature -m "$LOCAL_TMPDIR/t30mnt" "$SCRATCH/t30-$$/signed.ext2" 2>&1) && rc=0 || rc=$?
assert_eq "signed pool under --require-signature loads" 0 "$rc"
"$TESTBED/mpirun" "$SW" unload "$LOCAL_TMPDIR/t30mnt" >/dev/null 2>&1 || true
# (c) the mount fails on one node (its mount point is not empty): no node keeps a mount
"$TESTBED/exec" node2 sh -c "mkdir -p $TB/local/t30mnt2 && echo x > $TB/local/t30mnt2/occupied"
out=$("$TESTBED/mpirun" "$SW" load -m "$LOCAL_TMPDIR/t30mnt2" "$SCRATCH/t30-$$/random.ext2" 2>&1) && rc=0 || rc=$?
assert_match "mount fails on node2: the error names node2 and the reason" "node2.*(not empty|empty)" "$(tr '\n' ' ' <<< "$out")"
for n in "${nodes[@]}"; do
  assert_eq "$n: no mount kept after node2's mount failed" 0 "$("$TESTBED/exec" "$n" sh -c "grep -c ' $TB/local/t30mnt2 ' /proc/self/mounts || true")"
done
finish
