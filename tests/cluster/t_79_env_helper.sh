#!/usr/bin/env bash
# Environments with the site's helper (issue 29): helper.toml's environment_trees = ["/usr"], the
# sw-pool-mount-helper installed through sudo, the unprivileged test user under Slurm:
# - `sw-pool shell --layer dev` on node1 installs a program into /usr/local/bin through the
#   kernel's overlay over the helper's read-only idmapped view of /usr (-v says so; no
#   fuse-overlayfs); the layer holds it, the host's /usr is unchanged (hashes);
# - a batch job: `sw-pool layer sync dev`, then `srun -N4 sw-pool run --layer dev -- PROGRAM` runs it
#   on 4 nodes, each over its copy on the kernel path; MPI inside, 4 nodes x 2 tasks;
# - the user attacks the view from outside the environment (nsenter into its namespaces as their
#   root): remount read-write, unmount, write: all refused; the host's /usr unchanged;
# - the helper refuses another user's process, pid 1, a process not in a namespace of its own;
# - `kill -9` of the environment's first process: within 1 s no process and no mount namespace of
#   it left (by namespace identity), the helper's holder gone too;
# - without environment_trees the helper refuses and the environment takes the rootless path,
#   saying why.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
HB=$REPO/target/release/sw-pool-mount-helper
[[ -x $SW && -x $SW-enter && -x $HB ]] || { fail "sw-pool and its helper built" "missing (cargo build --release)"; finish; }
command -v sudo >/dev/null || { fail "sudo installed" "tools/setup-deps.sh installs it"; finish; }
H=$TB/sbin/sw-pool-mount-helper
install -m 0755 -o root -g root "$HB" "$H"
W=$TB/scratch/t79-$$
uid=$(id -u "$TB_USER")
LD=$TB/local/t79-layers-$uid     # node-local: each node has its own $TB/local
HT=$TB/etc/sw-pool/helper.toml
mkdir -p "$W/bin"
cp "$HT" "$W/helper.toml.orig"
cleanup() {
  cp "$W/helper.toml.orig" "$HT"
  for n in $TB_NODES; do
    "$TESTBED/exec" "$n" rm -rf "$LD" >/dev/null 2>&1 || true
  done
  rm -rf "$W"
}
trap cleanup EXIT
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$REPO/tests/cluster/srun-mpi" "$W/bin/"
bin=$REPO/target/release/mpi-selftest
[[ -x $bin ]] || (cd "$REPO" && cargo build --release -q -p mpi-selftest) || true
cp "$bin" "$W/bin/" 2>/dev/null || true
SW=$W/bin/sw-pool
chmod -R a+rX "$W"
mkdir -p "$W/out" && chmod 1777 "$W/out"
printf 'environment_trees = ["/usr"]\n' >> "$HT"
ENVV=(env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_LAYER_DIR="$LD" SW_POOL_MOUNT_HELPER="$H")
swrun() { as_user "${ENVV[@]}" srun --chdir="$W" "$@"; }
on1() { "$TESTBED/exec" node1 "$@"; }
usr_hash() { for n in $TB_NODES; do "$TESTBED/exec" "$n" sh -c 'ls -laR /usr/local /usr/bin | sha256sum'; done | sort -u; }
before=$(usr_hash)

# 1. install through `sw-pool shell` on node1: the kernel path
cat > "$W/install.sh" <<'EOS'
printf '#!/bin/sh\necho "t79 from $(hostname) $(grep -c " overlay overlay " /proc/self/mountinfo) overlays $(grep -c fuse-overlayfs /proc/self/mountinfo) fuse $(test -e /usr/share/common-licenses/GPL-3 && echo present || echo deleted)"\n' > /usr/local/bin/t79hello
chmod 755 /usr/local/bin/t79hello
rm /usr/share/common-licenses/GPL-3
grep " /usr " /proc/self/mountinfo
EOS
chmod 644 "$W/install.sh"
rc=0; out=$(swrun -N1 -w node1 sh -c "$SW layer create dev >/dev/null && SHELL=/bin/sh $SW -v shell --layer dev < $W/install.sh" 2>&1) || rc=$?
assert_eq "sw-pool shell --layer dev on node1: install into /usr/local/bin" 0 "$rc"
assert_match "... -v names the kernel path and the helper's views" "kernel overlay over idmapped lowers .*idmapped views of /usr" "$out"
assert_match "... /usr is the kernel's overlay over the view" " /usr .* overlay overlay .*lowerdir=/run/sw-pool-env/0" "$out"
[[ $rc == 0 ]] || printf '  %s\n' "$out"
n1=$(on1 sh -c "test -x $LD/dev/upper/usr/local/bin/t79hello && stat -c %u $LD/dev/upper/usr/local/bin/t79hello" || true)
assert_eq "the program is in node1's layer, the user's own file" "$uid" "$n1"

# 2. a batch job: sync the layer, run the program on 4 nodes over the copies; MPI inside
cat > "$W/job.sh" <<EOS
#!/bin/bash
export SW_POOL_LAYER_DIR=$LD SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_MOUNT_HELPER=$H
$SW layer sync dev --json >/dev/null || exit 3
srun -N4 $SW -v run --layer dev -- t79hello
EOS
chmod 755 "$W/job.sh"
rc=0; out=$(as_user sbatch -W -N4 --chdir="$W" -o "$W/out/job.out" "$W/job.sh" 2>&1) || rc=$?
jo=$(cat "$W/out/job.out" 2>/dev/null || true)
assert_eq "batch job: layer sync + srun -N4 run --layer dev exits 0" 0 "$rc"
assert_eq "... the program ran on 4 nodes, each in the kernel's overlay (no FUSE), the layer's deletion honoured (the copy's whiteout is the kernel's form)" 4 "$(grep -cE '^t79 from node[0-9] [1-9][0-9]* overlays 0 fuse deleted$' <<< "$jo" || true)"
assert_eq "... -v on every node: the kernel path over the job's copy" 4 "$(grep -c "kernel overlay over idmapped lowers" <<< "$jo" || true)"
[[ $(grep -c '^t79 from' <<< "$jo" || true) == 4 ]] || printf '  %s\n' "$out" "$jo"
if [[ -x $W/bin/mpi-selftest ]]; then
  mpi_in_env() { as_user "${ENVV[@]}" "$W/bin/srun-mpi" --chdir="$W" -N4 --ntasks-per-node=2 "$SW" run --layer dev -- "$W/bin/mpi-selftest" 2>&1 || true; }
  out=$(mpi_in_env)
  lines=$(grep -E '^rank [0-9]+/8 host node[0-9]+ sha256 [0-9a-f]{64}$' <<< "$out" || true)
  assert_eq "MPI in run --layer on the kernel path, 4 nodes x 2 tasks: 8 ranks, one digest" "8 1" "$(grep -c . <<< "$lines") $(awk '{print $6}' <<< "$lines" | sort -u | grep -c .)"
  [[ $(grep -c . <<< "$lines") == 8 ]] || printf '  %s\n' "$(tail -20 <<< "$out")"
else
  fail "mpi-selftest built" "$REPO/target/release/mpi-selftest missing"
fi

# 3. the user attacks the view from outside: into the environment's namespaces as their root
# (its /proc is the environment's: its pid 1 is /proc/1 there)
on1 runuser -u "$TB_USER" -- "${ENVV[@]}" sh -c "cd /; exec $SW run --layer dev -- sleep 30" >/dev/null 2>&1 &
sleeper=$!
pid1=""
for _ in $(seq 100); do
  # the sleep inside (a nested PID namespace: two NSpid fields) and its parent, pid 1
  pid1=$(on1 sh -c "for p in \$(pgrep -u $TB_USER -x sleep); do awk '/^NSpid:/ && NF == 3 {n=1} /^PPid:/ {pp=\$2} END {if (n) print pp}' /proc/\$p/status; done" 2>/dev/null | head -1)
  [[ -n $pid1 ]] && break
  sleep 0.1
done
if [[ -n $pid1 ]]; then
  att=$(on1 runuser -u "$TB_USER" -- nsenter -t "$pid1" -U -m --preserve-credentials sh -c '
    mount -o remount,bind,rw /run/sw-pool-env/0 2>/dev/null && echo remount=ok || echo remount=refused
    umount /run/sw-pool-env/0 2>/dev/null && echo umount=ok || echo umount=refused
    umount -l /run/sw-pool-env 2>/dev/null && echo umount-staging=ok || echo umount-staging=refused
    touch /run/sw-pool-env/0/t79-attack 2>/dev/null && echo write=ok || echo write=refused
    grep -c " /run/sw-pool-env/0 .*ro,nosuid,nodev.*idmapped" /proc/1/mountinfo' 2>&1 || true)
  assert_eq "the user, as root of the environment's namespaces: remount rw, unmount, write of the view all refused; it stays ro,nosuid,nodev,idmapped" \
    "remount=refused umount=refused umount-staging=refused write=refused 1" "$(tr '\n' ' ' <<< "$att" | sed 's/ $//')"
  # 4. the helper refuses what is not the caller's own environment
  rc=0; o=$(on1 runuser -u "$TB_USER2" -- sudo -n "$H" idmap --pid "$pid1" 2>&1) || rc=$?
  assert_match "helper idmap for another user's environment: refused (3)" "^3 .*not a process of $TB_USER2's" "$rc $o"
  rc=0; o=$(on1 runuser -u "$TB_USER" -- sudo -n "$H" idmap --pid 1 2>&1) || rc=$?
  assert_match "... for pid 1: refused (3)" "^3 .*not an environment's first process" "$rc $o"
  rc=0; o=$(on1 runuser -u "$TB_USER" -- sh -c "sleep 5 & sudo -n $H idmap --pid \$!" 2>&1) || rc=$?
  assert_match "... for a process not in a user namespace of its own: refused (3)" "^3 .*not in a user namespace of its own" "$rc $o"
  # 5. kill -9 of the environment's first process: nothing of it left within 1 s
  mntns=$(on1 readlink "/proc/$pid1/ns/mnt")
  on1 kill -9 "$pid1"
  t0=$(date +%s%N); left=x
  while (( ($(date +%s%N) - t0) < 1000000000 )); do
    left=$(on1 sh -c "n=0; for p in /proc/[0-9]*; do [ \"\$(readlink \$p/ns/mnt 2>/dev/null)\" = '$mntns' ] && n=\$((n+1)); done; echo \$n")
    [[ $left == 0 ]] && break
    sleep 0.05
  done
  assert_eq "kill -9 of pid 1: no process in its mount namespace within 1 s (so no mount of it: the namespace is gone)" 0 "$left"
  wait "$sleeper" 2>/dev/null || true
else
  fail "an environment with a layer runs on node1" "no pid 1 found"
  kill "$sleeper" 2>/dev/null || true
fi
after=$(usr_hash)
assert_eq "the hosts' /usr is unchanged on every node" "$before" "$after"
assert_eq "... the file the layer deleted is still the host's" yes "$(test -e /usr/share/common-licenses/GPL-3 && echo yes)"
holders=$(for n in $TB_NODES; do "$TESTBED/exec" "$n" sh -c "ps -u $TB_USER -o comm= | grep -c sw-pool-mount" || true; done | paste -sd+ | bc)
assert_eq "no holder of the helper left on any node" 0 "${holders:-0}"
leak=$(for n in $TB_NODES; do "$TESTBED/exec" "$n" grep -c sw-pool-env /proc/self/mountinfo || true; done | paste -sd+ | bc)
assert_eq "no view or staging mount visible on any node" 0 "${leak:-0}"

# 6. without environment_trees: the helper refuses, the environment takes the rootless path
cp "$W/helper.toml.orig" "$HT"
rc=0; out=$(swrun -N1 -w node1 "$SW" -v run --layer dev -- t79hello 2>&1) || rc=$?
assert_eq "no environment_trees: run --layer dev still works" 0 "$rc"
assert_match "... rootless, saying why" "fuse-overlayfs.*no environment_trees in /etc/sw-pool/helper.toml.*rootless|no environment_trees in /etc/sw-pool/helper.toml.*fuse-overlayfs" "$out"
assert_match "... and the program runs from the layer" "t79 from node1 0 overlays 1 fuse" "$out"
[[ $rc == 0 ]] || printf '  %s\n' "$out"
finish
