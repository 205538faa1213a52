#!/usr/bin/env bash
# Slurm integration on the virtual cluster's real slurmctld/slurmd, 4 nodes:
#  - the hooks as README "For admins: Slurm" configures them (prolog, task-prolog, epilog through the
#    multi-call names), installed in the testbed's hook directories;
#  - sbatch -N4: `sw-pool load demo/1.0` in the script, then `srun -N4 bash -lc 'module load hello/1.0 &&
#    hello'` prints from all four nodes; afterwards no mount, record or FUSE process remains;
#  - SW_POOL_LOAD given at submission (sbatch --export): every task's node mounts it (TaskProlog);
#  - scancel --signal=KILL mid-run: the epilog leaves nothing; the epilog again by hand changes nothing;
#  - two concurrent jobs on one node, same pool: the first job's end keeps the second's mount;
#  - a FUSE helper killed by hand: list --stale reports it, cleanup --dry-run changes nothing,
#    cleanup --stale removes it; list --all-nodes gathers every node's table;
#  - 50 parallel load/unload pairs of one pool on one node by two users: refcounts end at zero.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
uid=$(id -u "$TB_USER")
uid2=$(id -u "$TB_USER2")
W=$TB/scratch/t40-$$
E=$TB/export/t40-$$          # on the storage server; nodes see it as $TB/shared/t40-$$
HOOKS=("$TB/etc/prolog.d/50-sw-pool" "$TB/etc/task-prolog.d/50-sw-pool" "$TB/etc/epilog.d/50-sw-pool")
SINK_PID=""
# what a user has on a node: sw-pool FUSE mounts, records, helper processes
leftovers() {  # leftovers NODE UID -> "mounts records helpers"
  "$TESTBED/exec" "$1" sh -c "m=\$(awk '\$3 ~ /^fuse\\.(squashfuse|ext|fuse2fs|sw-pool)/ && \$4 ~ /user_id=$2(,|\$)/' /proc/self/mounts | wc -l)
    r=\$(ls /tmp/sw-pool-$2/mounts/ 2>/dev/null | grep -c '\\.json\$' || true)
    h=\$(ps -u $2 -o stat=,comm= 2>/dev/null | grep -c -E '^[^Z ]+ +(squashfuse|fuse2fs|sw-pool-serve)' || true)
    echo \$m \$r \$h"
}
wait_clean() {  # wait_clean NODE UID: up to 10 s for the epilog to finish
  local i
  for ((i = 0; i < 100; i++)); do [[ $(leftovers "$1" "$2") == "0 0 0" ]] && return 0; sleep 0.1; done
  return 1
}
cleanup() {
  rm -f "${HOOKS[@]}"
  for n in "${nodes[@]}"; do
    for u in "$uid" "$uid2"; do
      "$TESTBED/exec" "$n" runuser -u "$(id -un "$u")" -- "$SW" cleanup --all --kill >/dev/null 2>&1 || true
      "$TESTBED/exec" "$n" rm -rf "/tmp/sw-pool-$u" >/dev/null 2>&1 || true
    done
  done
  if [[ -n $SINK_PID ]] && kill -0 "$SINK_PID" 2>/dev/null; then kill "$SINK_PID" 2>/dev/null || true; fi
  if [[ -S /dev/log && -n $SINK_PID && $(stat -c %i /dev/log) == "$(cat "$W/sink.ino" 2>/dev/null)" ]]; then rm -f /dev/log; fi
  rm -rf "$W" "$E" 2>/dev/null || true
}
trap cleanup EXIT
mkdir -p "$W/bin" "$W/libexec/sw-pool" "$W/tree" "$W/out" "$E/pools/demo"
chmod 1777 "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
SW=$W/bin/sw-pool
# the installed shell integration and pool modulefile, copied where every node sees them (the
# checkout itself may sit in a directory private to this host, e.g. a clone under /tmp)
mkdir -p "$W/etc/profile.d" "$W/etc/lmod"
cp "$REPO/etc/profile.d/sw-pool.sh" "$W/etc/profile.d/sw-pool.sh"
cp "$REPO/etc/lmod/pool-modulefile.lua" "$W/etc/lmod/pool-modulefile.lua"
mkdir -p "$W/etc/modules"
cp "$REPO/etc/modules/pool-modulefile.tcl" "$W/etc/modules/pool-modulefile.tcl"
# the installed names of the hooks (Makefile `install`, README "For admins: Slurm")
for h in prolog task-prolog epilog; do ln -sf ../../bin/sw-pool "$W/libexec/sw-pool/$h"; done

# a syslog receiver, when this machine has none (so the hooks' syslog lines can be checked)
if [[ ! -e /dev/log ]]; then
  python3 - "$W/syslog.txt" <<'EOP' &
import socket, sys, os
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind("/dev/log"); os.chmod("/dev/log", 0o666)
with open(sys.argv[1], "ab", buffering=0) as f:
    while True:
        f.write(s.recv(65536) + b"\n")
EOP
  SINK_PID=$!
  if wait_for 50 test -S /dev/log; then
    stat -c %i /dev/log > "$W/sink.ino"
  else
    fail "test syslog sink listens on /dev/log" "no socket after 5 s"
  fi
fi

# --- the pool: hello/1.0 (a script) on shared storage
"$SW" init --name demo --version 1.0 "$W/tree/demo" >/dev/null
mkdir -p "$W/tree/demo/install/hello/1.0/bin"
printf '#!/bin/sh\necho "hello from $(hostname)"\n' > "$W/tree/demo/install/hello/1.0/bin/hello"
chmod 755 "$W/tree/demo/install/hello/1.0/bin/hello"
mkdir -p "$W/tree/demo/install/hello/1.0/share"
head -c 24M /dev/urandom > "$W/tree/demo/install/hello/1.0/share/data"   # so that bytes served mean something
"$SW" build -q --gen-modulefiles "$E/pools/demo/1.0.sqfs" "$W/tree/demo"
chmod -R a+rX "$W" "$E"
POOLS=$TB/shared/t40-$$/pools

# --- the hooks, as README configures them (the testbed's dispatchers run every file in the .d dirs)
readme=$REPO/README.md
for h in prolog task-prolog epilog; do
  key=$(sed -e 's/task-prolog/TaskProlog/' -e 's/^prolog/Prolog/' -e 's/^epilog/Epilog/' <<< "$h")
  assert_match "README configures $key=…/libexec/sw-pool/$h" "$key=/usr/local/libexec/sw-pool/$h" "$(cat "$readme")"
  assert_match "make install creates libexec/sw-pool/$h" "libexec/sw-pool/$h" "$(cat "$REPO/Makefile")"
done
printf '#!/bin/sh\nexec %s\n' "$W/libexec/sw-pool/prolog" > "${HOOKS[0]}"
printf '#!/bin/sh\nexec %s\n' "$W/libexec/sw-pool/task-prolog" > "${HOOKS[1]}"
printf '#!/bin/sh\nexec %s\n' "$W/libexec/sw-pool/epilog" > "${HOOKS[2]}"
chmod 755 "${HOOKS[@]}"

# a job that did not use sw-pool: the hooks do nothing (and fail nothing)
jid=$(as_user sbatch --parsable -N4 -o "$W/out/plain-%j.out" --chdir=/tmp --wrap "srun -N4 hostname")
wait_job "$jid" 600
assert_eq "a job without sw-pool runs with the hooks installed" 4 "$(grep -c node "$W/out/plain-$jid.out" 2>/dev/null || echo 0)"
assert_eq "a job without sw-pool: the hooks left no state dir on node1" 0 "$("$TESTBED/exec" node1 sh -c "ls -d /tmp/sw-pool-$uid 2>/dev/null | wc -l")"

common="source /usr/share/lmod/lmod/init/bash
source $W/etc/profile.d/sw-pool.sh
export PATH=$W/bin:\$PATH SW_POOL_PATH=$POOLS SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR MODULEPATH SW_POOL_LOADED SW_POOL_JOB_POOLS"

# --- 1. sbatch -N4: sw-pool load in the script, srun -N4 module load hello/1.0 && hello
cat > "$W/job1.sh" <<EOS
#!/bin/bash
set -e
$common
sw-pool load demo/1.0
echo "MODULEPATH=\$MODULEPATH"
srun -N4 --ntasks-per-node=1 bash -lc 'module load hello/1.0 && hello'
srun -N4 --ntasks-per-node=2 bash -lc 'module -t avail 2>&1 | grep -c "^hello/1.0\$"' | sort | uniq -c | sed 's/^ */AVAIL /'
EOS
chmod 755 "$W/job1.sh"
"$TESTBED/storage-bytes" --mark >/dev/null
jid=$(as_user sbatch --parsable -N4 --ntasks-per-node=2 -o "$W/out/job1-%j.out" --chdir=/tmp "$W/job1.sh")
wait_job "$jid" 1800
served=$("$TESTBED/storage-bytes" --since-mark)
out=$(cat "$W/out/job1-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  job1: /' | head -30
assert_match "job1: sw-pool load in the batch script puts the pool on MODULEPATH" "MODULEPATH=/tmp/sw-pool-$uid/mnt/demo/1.0/modulefiles" "$out"
for n in "${nodes[@]}"; do
  assert_match "job1: srun -N4 bash -lc 'module load hello/1.0 && hello' prints from $n" "hello from $n" "$out"
done
assert_match "job1: module avail lists hello/1.0 in all 8 tasks" "AVAIL +8 1" "$out"
size=$(stat -c %s "$E/pools/demo/1.0.sqfs")
assert_le "job1: shared storage served the pool about once (broadcast, not one read per node)" "$(calc "$served / $size")" 1.5
ok=1
for n in "${nodes[@]}"; do
  wait_clean "$n" "$uid" || true
  l=$(leftovers "$n" "$uid")
  [[ $l == "0 0 0" ]] || { ok=0; fail "job1: $n clean after the job" "mounts records helpers = $l"; }
done
[[ $ok == 1 ]] && pass "job1: after the job no mount, record or FUSE process on any node"
if [[ -n $SINK_PID ]]; then
  assert_match "job1: the epilog logged to syslog with the job id" "sw-pool\[[0-9]+\]: job=$jid user=$TB_USER node=node[1-4] (unmounted|record-removed)" "$(cat "$W/syslog.txt")"
fi

# --- 1b. later steps' tasks do not go back to shared storage: the pool file can go once it is loaded
# (the TaskProlog of a task on a node where the job's mount stands reads only the node's record;
# before, every task of every step reopened the pool file on shared storage and checked its signature)
cat > "$W/job1b.sh" <<EOS
#!/bin/bash
set -e
$common
cp $POOLS/demo/1.0.sqfs $W/out/fast-\$SLURM_JOB_ID.sqfs
sw-pool load $W/out/fast-\$SLURM_JOB_ID.sqfs
mv $W/out/fast-\$SLURM_JOB_ID.sqfs $W/out/fast-\$SLURM_JOB_ID.moved
sleep 2
export T0=\$(date +%s)
# first thing in each task, before it touches the mount: the node's cache entry was marked used by
# this task's prolog (LRU eviction sees the latest task, not only the load)
srun -N4 --ntasks-per-node=2 bash -lc 'a=\$(stat -c %X \$LOCAL_TMPDIR/sw-pool-\$(id -u)/cache/*.pool | sort -n | tail -1); [ "\$a" -ge "\$T0" ] && echo "ATIME_FRESH \$(hostname)"; module load hello/1.0 && hello'
EOS
chmod 755 "$W/job1b.sh"
jid=$(as_user sbatch --parsable -N4 --ntasks-per-node=2 -o "$W/out/job1b-%j.out" --chdir=/tmp "$W/job1b.sh")
wait_job "$jid" 1800
out=$(cat "$W/out/job1b-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  job1b: /' | head -20
assert_eq "job1b: pool file moved away after load: all 8 tasks of the next step run hello" 8 "$(grep -c '^hello from node' <<< "$out" || true)"
assert_eq "job1b: ... and no task prolog error" 0 "$(grep -c 'task prolog' <<< "$out" || true)"
assert_eq "job1b: ... and each task's prolog marked the node's cache entry used (atime >= step start)" 8 "$(grep -c '^ATIME_FRESH node' <<< "$out" || true)"
ok=1
for n in "${nodes[@]}"; do
  wait_clean "$n" "$uid" || true
  l=$(leftovers "$n" "$uid")
  [[ $l == "0 0 0" ]] || { ok=0; fail "job1b: $n clean after the job" "mounts records helpers = $l"; }
done
[[ $ok == 1 ]] && pass "job1b: after the job no mount, record or FUSE process on any node"

# --- 2. SW_POOL_LOAD at submission: the TaskProlog loads it on every node of every step
cat > "$W/job2.sh" <<EOS
#!/bin/bash
set -e
source /usr/share/lmod/lmod/init/bash
echo "BATCH MODULEPATH=\$MODULEPATH"
srun -N4 --ntasks-per-node=1 bash -lc 'module load hello/1.0 && hello'
EOS
chmod 755 "$W/job2.sh"
jid=$(as_user env SW_POOL_PATH="$POOLS" SW_POOL_LOAD=demo/1.0 sbatch --parsable -N4 --export=ALL -o "$W/out/job2-%j.out" --chdir=/tmp "$W/job2.sh")
wait_job "$jid" 1800
out=$(cat "$W/out/job2-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  job2: /' | head -12
assert_match "job2: sbatch --export SW_POOL_LOAD=demo/1.0: the batch step has the pool on MODULEPATH" "BATCH MODULEPATH=[^ ]*/tmp/sw-pool-$uid/mnt/demo/1.0/modulefiles" "$out"
assert_eq "job2: hello runs on all 4 nodes" 4 "$(grep -c '^hello from node' <<< "$out" || true)"
sleep 1
ok=1
for n in "${nodes[@]}"; do
  wait_clean "$n" "$uid" || true
  l=$(leftovers "$n" "$uid"); [[ $l == "0 0 0" ]] || { ok=0; fail "job2: $n clean after the job" "$l"; }
done
[[ $ok == 1 ]] && pass "job2: after the job nothing left on any node"

# --- 2b. `module load pool/demo/1.0` in the script (the pool modulefile) also follows the job
mkdir -p "$W/modulefiles/pool/demo"
ln -s "$W/etc/lmod/pool-modulefile.lua" "$W/modulefiles/pool/demo/1.0.lua"
chmod -R a+rX "$W/modulefiles"
cat > "$W/job2b.sh" <<EOS
#!/bin/bash
set -e
$common
module use $W/modulefiles
module load pool/demo/1.0
srun -N4 --ntasks-per-node=1 bash -lc 'module load hello/1.0 && hello'
EOS
chmod 755 "$W/job2b.sh"
jid=$(as_user sbatch --parsable -N4 -o "$W/out/job2b-%j.out" --chdir=/tmp "$W/job2b.sh")
wait_job "$jid" 1800
out=$(cat "$W/out/job2b-$jid.out" 2>/dev/null || true)
echo "$out" | sed 's/^/  job2b: /' | head -8
assert_eq "job2b: module load pool/demo/1.0 in the script: hello runs on all 4 nodes" 4 "$(grep -c '^hello from node' <<< "$out" || true)"
ok=1
for n in "${nodes[@]}"; do
  wait_clean "$n" "$uid" || true
  l=$(leftovers "$n" "$uid"); [[ $l == "0 0 0" ]] || { ok=0; fail "job2b: $n clean after the job" "$l"; }
done
[[ $ok == 1 ]] && pass "job2b: after the job nothing left on any node"

# --- 2c. the same with Environment Modules (Tcl): the Tcl pool modulefile in the script, the
# generated Tcl modulefiles in every task, and `module unload pool/...` releasing the mount
MODULECMD=/opt/sw-pool-deps/environment-modules/usr/lib/x86_64-linux-gnu/modulecmd.tcl
if [[ -f $MODULECMD ]]; then
  mkdir -p "$W/modulefiles-tcl/pool/demo"
  ln -s "$W/etc/modules/pool-modulefile.tcl" "$W/modulefiles-tcl/pool/demo/1.0"
  chmod -R a+rX "$W/modulefiles-tcl"
  envmod="module() { eval \"\$(tclsh $MODULECMD bash \"\$@\")\"; }"
  cat > "$W/job2c.sh" <<EOS
#!/bin/bash
set -e
$common
unset -f module ml
$envmod
export MODULEPATH=$W/modulefiles-tcl
module load pool/demo/1.0
srun -N4 --ntasks-per-node=1 bash -c '$envmod; module load hello/1.0 && hello'
srun -N4 --ntasks-per-node=2 bash -c '$envmod; module -t avail 2>&1 | grep -c "^hello/1.0\$"' | sort | uniq -c | sed 's/^ */AVAIL /'
mp=\$(sw-pool list --json | grep -o '"mount_point": "[^"]*"' | head -1 | cut -d'"' -f4)
module unload pool/demo/1.0
echo "UNLOADED MODULEPATH=\$MODULEPATH"
awk -v m="\$mp" '\$2 == m' /proc/self/mounts | wc -l | sed 's/^/STILL_MOUNTED /'
EOS
  chmod 755 "$W/job2c.sh"
  jid=$(as_user sbatch --parsable -N4 --ntasks-per-node=2 -o "$W/out/job2c-%j.out" --chdir=/tmp "$W/job2c.sh")
  wait_job "$jid" 1800
  out=$(cat "$W/out/job2c-$jid.out" 2>/dev/null || true)
  echo "$out" | sed 's/^/  job2c: /' | head -12
  assert_eq "job2c: Environment Modules: module load pool/demo/1.0, then hello runs on all 4 nodes" 4 "$(grep '^hello from node' <<< "$out" | sort -u | wc -l)"
  assert_match "job2c: Environment Modules: module avail lists hello/1.0 in all 8 tasks" "AVAIL +8 1" "$out"
  assert_match "job2c: module unload pool/demo/1.0 takes the pool off MODULEPATH" "UNLOADED MODULEPATH=$W/modulefiles-tcl"$'\n' "$out"
  assert_match "job2c: module unload pool/demo/1.0 releases the mount" "STILL_MOUNTED 0" "$out"
  ok=1
  for n in "${nodes[@]}"; do
    wait_clean "$n" "$uid" || true
    l=$(leftovers "$n" "$uid"); [[ $l == "0 0 0" ]] || { ok=0; fail "job2c: $n clean after the job" "$l"; }
  done
  [[ $ok == 1 ]] && pass "job2c: after the job nothing left on any node"
else
  skip "job2c: Environment Modules" "$MODULECMD missing (make setup unpacks it)"
fi

# --- 3. scancel --signal=KILL mid-run; then the epilog again by hand
cat > "$W/job3.sh" <<EOS
#!/bin/bash
$common
sw-pool load demo/1.0
srun -N4 --ntasks-per-node=1 bash -lc 'module load hello/1.0 && hello'
touch $W/out/job3-ready
sleep 600
EOS
chmod 755 "$W/job3.sh"
jid=$(as_user sbatch --parsable -N4 -o "$W/out/job3-%j.out" --chdir=/tmp "$W/job3.sh")
wait_for 1800 test -e "$W/out/job3-ready"
before=$("$TESTBED/exec" node3 runuser -u "$TB_USER" -- "$SW" list --job "$jid")
# the job's output so far (its load's messages), for when the check below fails
sed 's/^/  job3: /' "$W/out/job3-$jid.out" 2>/dev/null || true
assert_match "job3: mounted on node3 for the job before the kill" "ok +demo/1.0 .* $jid " "$before"
scancel --signal=KILL "$jid"
wait_job "$jid" 600
ok=1
for n in "${nodes[@]}"; do
  wait_clean "$n" "$uid" || true
  l=$(leftovers "$n" "$uid"); [[ $l == "0 0 0" ]] || { ok=0; fail "job3: $n clean after scancel --signal=KILL" "$l"; }
done
[[ $ok == 1 ]] && pass "job3: scancel --signal=KILL: the epilog left nothing on any node"
# what the epilog can change on node3, scoped to node3 (its mount namespace: nodes share the pid
# namespace, so a plain `ps -u` also lists other nodes' processes, and a killed job's processes on
# any node that are still being torn down): the user's records there, the user's FUSE mounts there,
# and the user's processes whose mount namespace is node3's
node3_ns=$("$TESTBED/exec" node3 readlink /proc/self/ns/mnt)
node3_state() {
  "$TESTBED/exec" node3 sh -c "ls -la /tmp/sw-pool-$uid/mounts 2>/dev/null | awk '{print \$1, \$3, \$NF}'; awk '\$3 ~ /^fuse/ && \$4 ~ /user_id=$uid(,|\$)/ {print \$2, \$3}' /proc/self/mounts"
  for p in /proc/[0-9]*; do
    [[ $(stat -c %u "$p" 2>/dev/null) == "$uid" && $(readlink "$p/ns/mnt" 2>/dev/null) == "$node3_ns" ]] || continue
    echo "proc $(cat "$p/comm" 2>/dev/null)"
  done | sort
}
# the killed job's processes on node3 end asynchronously (slurmstepd, helpers after unmount): wait
# until none is left there (bounded), and say what was still running if some stay
no_user_procs_on_node3() { ! node3_state | grep -q '^proc '; }
if ! wait_for 300 no_user_procs_on_node3; then
  echo "  job3: still running on node3 after 30 s:"; node3_state | sed 's/^/    /'
fi
node3_state > "$W/out/before2" 2>&1 || true
rc=0; "$TESTBED/exec" node3 env SLURM_JOB_ID="$jid" SLURM_JOB_UID="$uid" SLURM_JOB_USER="$TB_USER" "$W/libexec/sw-pool/epilog" || rc=$?
assert_eq "job3: the epilog run a second time by hand exits 0" 0 "$rc"
node3_state > "$W/out/after2" 2>&1 || true
assert_eq "job3: ... and changes nothing" "$(cat "$W/out/before2")" "$(cat "$W/out/after2")"

# --- 4. two concurrent jobs on node1 sharing the pool: the first one's end keeps the second's mount
mkjob() {  # mkjob NAME
  cat > "$W/$1.sh" <<EOS
#!/bin/bash
$common
sw-pool load demo/1.0
touch $W/out/$1-ready
while [ ! -e $W/out/$1-stop ]; do sleep 0.2; done
module load hello/1.0 && hello
EOS
  chmod 755 "$W/$1.sh"
}
mkjob jobA; mkjob jobB
ja=$(as_user sbatch --parsable -N1 -n1 -w node1 -o "$W/out/jobA-%j.out" --chdir=/tmp "$W/jobA.sh")
wait_for 600 test -e "$W/out/jobA-ready"
jb=$(as_user sbatch --parsable -N1 -n1 -w node1 -o "$W/out/jobB-%j.out" --chdir=/tmp "$W/jobB.sh")
wait_for 600 test -e "$W/out/jobB-ready"
out=$("$TESTBED/exec" node1 runuser -u "$TB_USER" -- "$SW" list)
assert_match "two jobs on node1: one mount, two references, both job ids" "ok +demo/1.0 +[0-9a-f]+ +2 +($ja,$jb|$jb,$ja) " "$out"
touch "$W/out/jobA-stop"
wait_job "$ja" 600
sleep 1
out=$("$TESTBED/exec" node1 runuser -u "$TB_USER" -- "$SW" list)
assert_match "first job ended: the second job's mount stays, one reference of job $jb" "ok +demo/1.0 +[0-9a-f]+ +1 +$jb " "$out"
touch "$W/out/jobB-stop"
wait_job "$jb" 600
assert_match "the second job still used the pool after the first ended" "hello from node1" "$(cat "$W/out/jobB-$jb.out" 2>/dev/null)"
wait_clean node1 "$uid" || true
assert_eq "second job ended: nothing left on node1" "0 0 0" "$(leftovers node1 "$uid")"

# --- 5. stale mounts: a FUSE helper killed by hand
U="$TESTBED/exec node2 runuser -u $TB_USER -- env SW_POOL_PATH=$POOLS SW_POOL_SHELL=sh"
$U "$SW" load --json demo/1.0 >/dev/null 2>&1
hp=$($U "$SW" list --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["mounts"][0]["record"]["helper_pid"])')
assert_match "stale: a mount with a live helper on node2" "^[0-9]+$" "$hp"
kill -9 "$hp"   # the helper this test started (its pid from our own record)
sleep 0.3
out=$($U "$SW" list --stale)
assert_match "list --stale reports the dead helper's mount" "stale +demo/1.0 .*/tmp/sw-pool-$uid/mnt/demo/1.0" "$out"
snap() { $U sh -c "ls /tmp/sw-pool-$uid/mounts; grep -c ' /tmp/sw-pool-$uid/mnt/demo/1.0 ' /proc/self/mounts"; }
b=$(snap)
out=$($U "$SW" cleanup --stale --dry-run)
assert_match "cleanup --stale --dry-run says what it would do" "would: unmounted .*demo/1.0" "$out"
assert_eq "cleanup --dry-run changes nothing" "$b" "$(snap)"
out=$($U "$SW" cleanup --stale 2>&1) && rc=0 || rc=$?
assert_eq "cleanup --stale exits 0" 0 "$rc"
assert_eq "cleanup --stale removed the stale mount and its record" "0 0 0" "$(leftovers node2 "$uid")"
{ ps -o pid,ppid,stat,comm -p "$hp" | sed 's/^/  killed helper: /'; } 2>/dev/null || true
assert_match "list --stale is empty afterwards" "^no mounts on node2" "$($U "$SW" list --stale)"

# --- list --all-nodes (under mpirun: one table for every node)
"$TESTBED/mpirun" -x SW_POOL_PATH="$POOLS" "$SW" load demo/1.0 >/dev/null 2>&1 || true
out=$("$TESTBED/mpirun" "$SW" list --all-nodes 2>&1) && rc=0 || rc=$?
assert_eq "list --all-nodes exits 0" 0 "$rc"
assert_eq "list --all-nodes: one row per node, from rank 0 only" 4 "$(grep -c -E '^node[1-4] +ok +demo/1.0' <<< "$out" || true)"
"$TESTBED/mpirun" "$SW" unload demo/1.0 >/dev/null 2>&1 || true

# --- 6. 50 parallel load/unload pairs of one pool on node3 by two users (bounded in time)
cat > "$W/pair.sh" <<EOS
#!/bin/bash
# one load/unload pair as the calling user, in a login-like shell with the profile.d function
source $W/etc/profile.d/sw-pool.sh
export PATH=$W/bin:\$PATH SW_POOL_PATH=$POOLS SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR MODULEPATH SLURM_JOB_ID
sw-pool load demo/1.0 2>>$W/out/pairs-\$(id -u).err || { echo LOADFAIL; exit 1; }
[ -x "\${MODULEPATH%%/modulefiles*}/install/hello/1.0/bin/hello" ] || { echo NOTMOUNTED; exit 1; }
sw-pool unload demo/1.0 2>>$W/out/pairs-\$(id -u).err || { echo UNLOADFAIL; exit 1; }
echo OK
EOS
chmod 755 "$W/pair.sh"
# warm both users' caches first, so that the stress is on mount/refcount, not 50 copies
for u in "$TB_USER" "$TB_USER2"; do
  "$TESTBED/exec" node3 runuser -u "$u" -- "$W/pair.sh" >/dev/null 2>&1 || true
done
t0=$(now)
"$TESTBED/exec" node3 bash -c "
  for i in \$(seq 25); do
    runuser -u $TB_USER -- $W/pair.sh & runuser -u $TB_USER2 -- $W/pair.sh &
  done; wait" > "$W/out/pairs.txt" 2>&1 &
pairs=$!
wait_for 1800 sh -c "! kill -0 $pairs 2>/dev/null" || fail "stress: 50 pairs finish within 180 s" "still running"
wait "$pairs" 2>/dev/null || true
dt=$(elapsed "$t0")
assert_eq "stress: 50 load/unload pairs by two users all succeed" 50 "$(grep -c '^OK$' "$W/out/pairs.txt" || true)"
{ grep -v '^OK$' "$W/out/pairs.txt" | head -5 | sed 's/^/  pairs: /'; } || true
{ grep -v -e 'is unsigned' -e '^$' "$W/out/pairs-$uid.err" | head -5 | sed 's/^/  pairs stderr: /'; } 2>/dev/null || true
assert_le "stress: bounded in time" "$dt" 180 " s"
for u in "$uid" "$uid2"; do
  assert_eq "stress: uid $u: no mount, record or helper left on node3 (refcounts ended at zero)" "0 0 0" "$(leftovers node3 "$u")"
done
finish
