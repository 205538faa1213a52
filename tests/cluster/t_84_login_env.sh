#!/usr/bin/env bash
# Logins into a layer's environment (SDEE's login path; README, "Logins in an environment"), as
# the unprivileged test user under Slurm:
# - ~/.bashrc has `eval "$(sw-pool shell-init bash --login-env dev)"`; two logins on one node
#   (`srun --pty bash -l` on a pseudo-terminal, and `srun bash -l -i`) while both run land in ONE
#   environment: the same mount and PID namespace (inodes), not the node's, SW_POOL_ENVIRONMENT=dev;
#   each login ends with its environment's shell;
# - a broken layer never locks the user out: a missing layer, and one writable by others, give a
#   plain shell (the node's namespace) with one line saying why and what to do;
# - SW_POOL_NO_LOGIN_ENV=1 skips it without a word;
# - nothing left: no environment process, no rendezvous socket, no login file.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
node=${nodes[0]}
SW=$REPO/target/release/sw-pool
[[ -x $SW && -x $SW-enter ]] || { fail "sw-pool built" "$SW or $SW-enter missing (make build)"; finish; }
command -v script >/dev/null || { skip "srun --pty" "script(1) is not installed"; finish; }
W=$TB/scratch/t84-$$
uid=$(id -u "$TB_USER")
LD=$TB/local/t84-layers-$uid   # node-local
cleanup() {
  "$TESTBED/exec" "$node" sh -c "rm -rf $LD; rm -f /tmp/sw-pool-login.*" >/dev/null 2>&1 || true
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$W/bin" "$W/home" "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
SW=$W/bin/sw-pool
# the user's start-up files: a login shell reads ~/.bash_profile, which reads ~/.bashrc
cat > "$W/home/.bashrc" <<EOF
export PATH=$W/bin:\$PATH
eval "\$(sw-pool shell-init bash --login-env \${T84_LAYER:-dev})"
EOF
printf '. ~/.bashrc\n' > "$W/home/.bash_profile"
chown -R "$TB_USER" "$W/home" "$W/out"
chmod -R a+rX "$W"
# a login on $node: srun runs the user's shell, its commands from stdin (as_user keeps root's
# XDG_RUNTIME_DIR: unset, as in a user's own login)
user_srun() {
  as_user env -u XDG_RUNTIME_DIR -u SW_POOL_STATE_DIR HOME="$W/home" SHELL=/bin/bash \
    SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_LAYER_DIR="$LD" "$@"
}
SHOW='echo "env=[$SW_POOL_ENVIRONMENT] mnt=$(readlink /proc/self/ns/mnt) pid=$(readlink /proc/self/ns/pid)"'
node_ns=$("$TESTBED/exec" "$node" readlink /proc/self/ns/mnt)

rc=0; out=$(user_srun srun -N1 -w "$node" --chdir="$W" "$SW" layer create dev 2>&1) || rc=$?
assert_eq "layer dev on $node" 0 "$rc"

# 1. two logins at once: the first on a pseudo-terminal (srun --pty), the second a login shell
{ printf '%s\n' "$SHOW" 'sleep 8' 'exit 3'; } > "$W/a.in"
user_srun script -qec "srun -N1 -w $node --chdir=$W --pty bash -l" /dev/null < "$W/a.in" > "$W/out/a.txt" 2>&1 &
apid=$!
wait_for 300 grep -q 'env=\[dev\] mnt=' "$W/out/a.txt" || true
rc=0
out_b=$(printf '%s\n' "$SHOW" 'exit 4' | user_srun srun -N1 -w "$node" --chdir="$W" bash -l -i 2>&1) || rc=$?
rc_a=0; wait "$apid" || rc_a=$?
out_a=$(tr -d '\r' < "$W/out/a.txt")
ns_a=$(grep -o 'env=\[dev\] mnt=[^ ]* pid=[^ ]*' <<< "$out_a" | tail -1)
ns_b=$(grep -o 'env=\[dev\] mnt=[^ ]* pid=[^ ]*' <<< "$out_b" | tail -1)
assert_match "login 1 (srun --pty bash -l) is in layer dev's environment" 'env=\[dev\] mnt=mnt:' "$ns_a"
assert_match "login 2 (srun bash -l -i) is in layer dev's environment" 'env=\[dev\] mnt=mnt:' "$ns_b"
assert_eq "... both in ONE environment (same mount and PID namespace inodes)" "$ns_a" "$ns_b"
assert_eq "... not the node's mount namespace" 0 "$(grep -cF "mnt=$node_ns " <<< "$ns_a" || true)"
assert_match "... the second joined the running one" "joining|entering" "$out_b"
assert_eq "login 2 ended with its environment's shell (exit 4)" 4 "$rc"
assert_eq "login 1 ended with its environment's shell (exit 3)" 3 "$rc_a"
[[ -n $ns_a && $ns_a == "$ns_b" ]] || printf '  a: %s\n  b: %s\n' "$(tail -n 8 <<< "$out_a")" "$(tail -n 8 <<< "$out_b")"

# 2. broken layers: a plain shell and one line saying why and what to do
said=
plain_login() {  # plain_login NAME LAYER: asserts a plain shell; sw-pool's line in $said
  local out rc=0
  out=$(printf '%s\n' "$SHOW" 'echo after' | user_srun env T84_LAYER="$2" srun -N1 -w "$node" --chdir="$W" bash -l -i 2>&1) || rc=$?
  assert_eq "$1: the login goes on (exit 0)" 0 "$rc"
  assert_match "$1: a plain shell (not in an environment)" "env=\[\] mnt=mnt:" "$out"
  assert_eq "$1: ... not the layer's environment" 0 "$(grep -cF "mnt=${ns_a#env=\[dev\] mnt=}" <<< "$out" || true)"
  assert_match "$1: ... where the login's commands run" 'after' "$out"
  assert_eq "$1: one line from sw-pool" 1 "$(grep -c 'sw-pool' <<< "$out" || true)"
  said=$(grep 'sw-pool' <<< "$out" || true)
}
plain_login "missing layer" nosuch
assert_match "missing layer: says why and how to fix it" 'layer "nosuch" does not exist.*sw-pool layer create nosuch.*plain shell.*SW_POOL_NO_LOGIN_ENV=1' "$said"
rc=0; user_srun srun -N1 -w "$node" --chdir="$W" sh -c "$SW layer create open >/dev/null && chmod 777 $LD/open" || rc=$?
assert_eq "a layer open, writable by others" 0 "$rc"
plain_login "a layer writable by others" open
assert_match "writable layer: says why and how to fix it" 'could not start: .*open.*writable by no one else.*plain shell' "$said"
rc=0; out=$(printf '%s\n' "$SHOW" | user_srun env SW_POOL_NO_LOGIN_ENV=1 srun -N1 -w "$node" --chdir="$W" bash -l -i 2>&1) || rc=$?
assert_match "SW_POOL_NO_LOGIN_ENV=1: a plain shell" "env=\[\] mnt=mnt:" "$out"
assert_eq "... without a word from sw-pool" 0 "$(grep -c 'sw-pool' <<< "$out" || true)"

# 3. nothing left on the node
sleep 1
m=$("$TESTBED/exec" "$node" grep -c fuse-overlayfs /proc/self/mountinfo || true)
p=$("$TESTBED/exec" "$node" pgrep -u "$TB_USER" -f 'sw-pool-enter|fuse-overlayfs' | grep -c . || true)
s=$("$TESTBED/exec" "$node" sh -c "ls /tmp/sw-pool-$uid*/envs/*.sock 2>/dev/null | grep -c ." || true)
f=$("$TESTBED/exec" "$node" sh -c "ls /tmp/sw-pool-login.* 2>/dev/null | grep -c ." || true)
assert_eq "$node: nothing left (mounts, processes, sockets, login files)" "0 0 0 0" "${m:-0} ${p:-0} ${s:-0} ${f:-0}"
finish
