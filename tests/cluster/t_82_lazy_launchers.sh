#!/usr/bin/env bash
# load --lazy without a background step (issue 30: "outside Slurm, as long as the user keeps it"),
# as the unprivileged test user:
# - one node outside any job: `sw-pool load --lazy` starts the node's server detached and returns
#   with the shell code once mounted; the pool reads right; `unload` ends the server and leaves no
#   mount, record, server or socket; a server ended by SIGTERM releases its mount and socket itself;
# - under an MPI launcher (`srun --mpi=pmix -N4 --ntasks-per-node=1 sw-pool load --lazy` in a
#   job, as `mpirun -np N sw-pool load --lazy` outside one): every rank is its node's server in the
#   foreground; task 0 says when every node has mounted; every node reads the pool right; `srun
#   sw-pool unload` on the nodes ends the step with status 0 and leaves nothing; a chunk changed on
#   shared storage is EIO on every node for the file in it (the others read) and every node's
#   server logs pool, chunk, offset and node; two ranks on one node are refused by name.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
lazy_fixture t82
MP=$TB/local/t82lazy
C=$TB/local/t82cache
for i in 0 1 2 3; do head -c 3M /dev/urandom > "$W/tree/data/f$i"; done
want=$(cd "$W/tree" && find . -type f | sort | xargs sha256sum | sha256sum | cut -d' ' -f1)
if out=$("$SW" build -q -s 64MB "$E/t82.pool" "$W/tree" 2>&1); then
  pass "built a 12 MiB squashfs pool on shared storage"
else
  fail "built a 12 MiB squashfs pool on shared storage" "$(tail -n 5 <<< "$out")"
  finish
fi
chmod 644 "$E/t82.pool"
# the same pool with one byte changed on shared storage after the build, in chunk 5
cp "$E/t82.pool" "$E/t82bad.pool"
off=$((5 * 1048576 + 4321))
b=$(dd if="$E/t82.pool" bs=1 skip=$off count=1 status=none | od -An -tx1 | tr -d ' ')
if [[ $b == 5a ]]; then printf '\x5b'; else printf '\x5a'; fi | dd of="$E/t82bad.pool" bs=1 seek=$off conv=notrunc status=none
chmod 644 "$E/t82bad.pool"
on1() { "$TESTBED/exec" node1 runuser -u "$TB_USER" -- env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_SHELL=sh "$@"; }
sum_on1() { on1 sh -c "cd $MP && find . -type f | sort | xargs sha256sum | sha256sum | cut -d' ' -f1" 2>&1; }
servers_on1() { lazy_servers_on node1; }
left_on1() {  # mounts, records, servers, sockets of the test user on node1
  "$TESTBED/exec" node1 sh -c "echo \$(grep -c '$MP' /proc/self/mounts) \$(ls /tmp/sw-pool-$uid*/mounts/*.json 2>/dev/null | grep -c .) \$(ls /tmp/sw-pool-$uid*/lazy-*.sock 2>/dev/null | grep -c .)"
  servers_on1 | grep -c . || true
}
none_on1=$(printf '0 0 0\n0')

# --- one node, outside any job
on1 mkdir -p "$C"
t0=$(date +%s.%N)
out=$(on1 timeout 60 "$SW" -v load --lazy -m "$MP" --cache-dir "$C" "$S/t82.pool" 2>&1) && rc=0 || rc=$?
t1=$(date +%s.%N)
secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
if [[ $rc == 0 ]] && grep -q "^export MODULEPATH='$MP/modulefiles'" <<< "$out" &&
   grep -q "server in the background until \`sw-pool unload\`" <<< "$out"; then
  pass "outside a job: load --lazy returned with the shell code once node1 mounted ($secs s)"
else
  fail "outside a job: load --lazy returned with the shell code once node1 mounted" "rc $rc: $(tail -n 6 <<< "$out")"
fi
got=$(sum_on1)
if [[ $got == "$want" ]]; then pass "outside a job: every file reads right through the lazy mount"
else fail "outside a job: every file reads right through the lazy mount" "$got"; fi
n=$(servers_on1 | grep -c . || true)
if [[ $n == 1 ]]; then pass "outside a job: one server runs detached on node1 after load returned"
else fail "outside a job: one server runs detached on node1 after load returned" "$n servers"; fi
out=$(on1 "$SW" unload "$MP" 2>&1) || true
for _ in $(seq 50); do [[ $(left_on1) == "$none_on1" ]] && break; sleep 0.2; done
left=$(left_on1)
if [[ $left == "$none_on1" ]]; then pass "outside a job: unload ends the server; no mount, record, server or socket left"
else fail "outside a job: unload ends the server; no mount, record, server or socket left" "left (mounts records sockets / servers): $left; $out"; fi

# a server ended by SIGTERM (the test's own: started above by this test, found by its node)
out=$(on1 timeout 60 "$SW" -q load --lazy -m "$MP" --cache-dir "$C" "$S/t82.pool" 2>&1) || true
pid=$(servers_on1 | head -n 1)
if [[ -n $pid ]]; then
  kill -TERM "$pid"
  for _ in $(seq 50); do [[ $(left_on1) == "$none_on1" ]] && break; sleep 0.2; done
  left=$(left_on1)
  if [[ $left == "$none_on1" ]]; then pass "outside a job: a server ended by SIGTERM releases its mount, record and socket"
  else fail "outside a job: a server ended by SIGTERM releases its mount, record and socket" "left: $left"; fi
else
  fail "outside a job: a server ended by SIGTERM releases its mount, record and socket" "no server started: $out"
fi

# --- under an MPI launcher: every rank its node's server, in the foreground
cat > "$W/fg.sh" <<EOF
#!/bin/bash
export SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_SHELL=sh
srun -N4 --ntasks-per-node=1 mkdir -p $C
timeout 120 srun --overlap --mpi=pmix -N4 --ntasks-per-node=1 $SW load --lazy -m $MP --cache-dir $C $S/t82.pool > $W/out/fg-step.out 2>&1 &
step=\$!
for i in \$(seq 300); do grep -q 'served on demand on 4 node' $W/out/fg-step.out && break; sleep 0.2; done
echo "ready: \$(grep -c 'served on demand on 4 node' $W/out/fg-step.out)"
srun --overlap -N4 --ntasks-per-node=1 sh -c 'cd $MP && find . -type f | sort | xargs sha256sum | sha256sum | cut -d" " -f1' | sort | uniq -c | sed 's/^ */sums: /'
srun --overlap --mpi=pmix -N4 --ntasks-per-node=1 $SW -q unload $MP
wait \$step
echo "step: \$?"
# (a node's line can be missing while the servers' step still ends there: asked again, 3 times)
for try in 1 2 3; do
  r=\$(srun --overlap -N4 --ntasks-per-node=1 sh -c 'f=\$(ls /tmp/sw-pool-\$(id -u)*/mounts/*.json /tmp/sw-pool-\$(id -u)*/lazy-*.sock 2>/dev/null); echo left: \$(grep -c $MP /proc/self/mounts) \$(echo "\$f" | grep -c .) \$([ -n "\$f" ] && echo \$(hostname): \$f)' 2>&1 | sort | uniq -c)
  echo "\$r" | grep -q '^ *4 left: ' && break
  echo "try \$try: \$r"
  sleep 1
done
echo "\$r"
# the changed pool: every node reads every file; the file(s) in chunk 5 are EIO on every node
# (an empty cache: the nodes' partial copies of the same digest hold chunk 5 verified)
srun --overlap -N4 --ntasks-per-node=1 mkdir -p ${C}bad
timeout 120 srun --overlap --mpi=pmix -N4 --ntasks-per-node=1 $SW load --lazy -m $MP --cache-dir ${C}bad $S/t82bad.pool > $W/out/fg-bad.out 2>&1 &
step=\$!
for i in \$(seq 300); do grep -q 'served on demand on 4 node' $W/out/fg-bad.out && break; sleep 0.2; done
srun --overlap -N4 --ntasks-per-node=1 sh -c 'cd $MP && for f in data/*; do if cat \$f > /dev/null 2>/tmp/t82err.\$\$; then echo \$(hostname) ok \$f; else echo \$(hostname) eio \$f \$(grep -c "Input/output error" /tmp/t82err.\$\$); fi; rm -f /tmp/t82err.\$\$; done' | sort | sed 's/^/bad: /'
srun --overlap --mpi=pmix -N4 --ntasks-per-node=1 $SW -q unload $MP
wait \$step
timeout 60 srun --overlap --overcommit --mpi=pmix -N2 --ntasks-per-node=2 $SW load --lazy -m $MP --cache-dir $C $S/t82.pool > $W/out/fg-two.out 2>&1
echo "two per node: \$?"
EOF
chmod 755 "$W/fg.sh"
as_user sbatch -W -N4 --chdir=/tmp -o "$W/out/fg.out" "$W/fg.sh" >/dev/null 2>&1 || true
out=$(cat "$W/out/fg.out" 2>/dev/null || true)
step=$(cat "$W/out/fg-step.out" 2>/dev/null || true)
if grep -q "^ready: 1$" <<< "$out"; then pass "under srun --mpi=pmix: task 0 says every node (4) mounted"
else fail "under srun --mpi=pmix: task 0 says every node (4) mounted" "$(tail -n 8 <<< "$out$step")"; fi
if grep -q "^sums: 4 $want$" <<< "$out"; then pass "under srun --mpi=pmix: every file reads right on 4 of 4 nodes"
else fail "under srun --mpi=pmix: every file reads right on 4 of 4 nodes" "$(grep sums <<< "$out")"; fi
if grep -q "^step: 0$" <<< "$out"; then pass "under srun --mpi=pmix: unload on every node ends the servers' step with status 0"
else fail "under srun --mpi=pmix: unload on every node ends the servers' step with status 0" "$(grep step: <<< "$out"); $(tail -n 6 <<< "$step")"; fi
if grep -qE "^ +4 left: 0 0$" <<< "$out"; then pass "under srun --mpi=pmix: no mount, record or socket left on any node"
else fail "under srun --mpi=pmix: no mount, record or socket left on any node" "$(grep -A3 -B3 left: <<< "$out")"; fi
# the changed chunk: EIO on every node for the file(s) in it, the others right; each node's
# server says which chunk, at which offset, of which pool, on which node
bad=$(grep '^bad: ' <<< "$out" || true)
eio_nodes=$(awk '$3 == "eio" && $5 >= 1 {print $2}' <<< "$bad" | sort -u | grep -c . || true)
eio_files=$(awk '$3 == "eio" {print $4}' <<< "$bad" | sort -u | grep -c . || true)
ok_lines=$(awk '$3 == "ok"' <<< "$bad" | grep -c . || true)
if [[ $eio_nodes == 4 && $eio_files == 1 && $ok_lines == 12 ]]; then
  pass "a chunk changed on shared storage: its file is EIO on 4 of 4 nodes, the 3 others read on every node"
else
  fail "a chunk changed on shared storage: its file is EIO on 4 of 4 nodes, the 3 others read on every node" "$bad"
fi
lines=$(grep -E "chunk 5 at byte offset 5242880" "$W/out/fg-bad.out" 2>/dev/null || true)
named=$(grep -oE "\(node node[1-4]\)|on node[1-4]|node node[1-4]" <<< "$lines" | grep -oE "node[1-4]" | sort -u | grep -c . || true)
if grep -q "does not match the pool's signed manifest" <<< "$lines" && [[ $named == 4 ]]; then
  pass "... logged on every node that touched it: pool, chunk 5, offset 5242880 and the node"
else
  fail "... logged on every node that touched it: pool, chunk 5, offset 5242880 and the node" "$named nodes named: $(head -n 5 <<< "$lines")"
fi
two=$(cat "$W/out/fg-two.out" 2>/dev/null || true)
if grep -q "^two per node: [1-9]" <<< "$out" && grep -q "one rank per node (4 ranks on 2 nodes)" <<< "$two"; then
  pass "under srun --mpi=pmix: two ranks per node refused by name"
else
  fail "under srun --mpi=pmix: two ranks per node refused by name" "$(grep 'two per node' <<< "$out"); $(tail -n 3 <<< "$two")"
fi
wait_nothing_left "$MP"
left=$(left_of_user "$MP")
if [[ $left == "$NOTHING_LEFT" ]]; then pass "after the job: nothing of the test user left on any node"
else fail "after the job: nothing of the test user left on any node" "$left"; fi
finish
