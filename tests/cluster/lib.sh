# shellcheck shell=bash
# Helpers for the cluster tests (tests/cluster/t_*.sh).  Source it first:  . "$(dirname "$0")/lib.sh"
#
#   pass NAME                      record a passed check
#   fail NAME MSG                  record a failed check (the script goes on)
#   skip NAME REASON               record a check that could not run here (counted, never a pass)
#   assert_eq NAME EXPECTED ACTUAL
#   assert_match NAME REGEX ACTUAL
#   assert_cmd NAME CMD...         passes if CMD exits 0
#   assert_le / assert_within      numeric checks (floats allowed)
#   require_testbed                abort the script (one failure) unless the testbed is up and healthy
#   finish                         print the script's summary; exit status 1 if anything failed
#
# Every result is printed ("PASS name" / "FAIL name: msg" / "SKIP name: reason") and appended to $T_RESULTS (set by
# tests/cluster/run) so that the runner can count them.
#
# "The paper" in the tests is Dieterle, Nolte and Kunkel, *Scalable Software Distribution for
# HPC-Systems with Software Pools Using MPI and File Systems in User Space* (GWDG); the virtual
# cluster the tests run on is described in testbed/README.md and docs/architecture.md.
#
# The preamble tools/preamble.sh, shared with the benchmarks, sets strict mode, REPO and TESTBED and
# defines now, elapsed, drop_caches, median, log and die.
# shellcheck source=../../tools/preamble.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../tools/preamble.sh"
# shellcheck source=../../testbed/env.sh
. "$TESTBED/env.sh"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
T_NAME=$(basename "$0" .sh)
T_PASSED=0
T_FAILED=0
T_SKIPPED=0
T_RESULTS=${T_RESULTS:-/dev/null}

pass() {
  T_PASSED=$((T_PASSED + 1))
  echo "PASS $T_NAME: $1"
  echo "PASS $T_NAME: $1" >> "$T_RESULTS"
}
fail() {
  T_FAILED=$((T_FAILED + 1))
  echo "FAIL $T_NAME: $1: ${2:-}"
  echo "FAIL $T_NAME: $1: ${2:-}" >> "$T_RESULTS"
}
skip() {
  T_SKIPPED=$((T_SKIPPED + 1))
  echo "SKIP $T_NAME: $1: ${2:-}"
  echo "SKIP $T_NAME: $1: ${2:-}" >> "$T_RESULTS"
}
assert_eq() {
  if [[ $3 == "$2" ]]; then pass "$1"; else fail "$1" "expected '$2', got '$3'"; fi
}
assert_match() {
  if [[ $3 =~ $2 ]]; then pass "$1"; else fail "$1" "'$3' does not match /$2/"; fi
}
assert_cmd() {
  local name=$1 out rc=0; shift
  out=$("$@" 2>&1) || rc=$?
  if [[ $rc == 0 ]]; then pass "$name"; else fail "$name" "'$*' exited $rc: $(tail -n 5 <<< "$out")"; fi
}
# float comparison helpers (awk): fle A B -> A <= B
fle() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a <= b) }'; }
assert_le() {  # assert_le NAME VALUE MAX [UNIT]
  if fle "$2" "$3"; then pass "$1 ($2${4:-} <= $3${4:-})"; else fail "$1" "$2${4:-} > $3${4:-}"; fi
}
assert_within() {  # assert_within NAME VALUE LO HI [UNIT]
  if fle "$3" "$2" && fle "$2" "$4"; then pass "$1 ($2${5:-} in [$3, $4])"; else fail "$1" "$2${5:-} not in [$3, $4]"; fi
}
# calc EXPR: awk arithmetic, 4 significant digits (bench/lib.sh's calc gives 3 decimals)
calc() { awk "BEGIN { printf \"%.4g\", $1 }"; }
# flip_byte FILE OFFSET: damage FILE by inverting one byte (writing a fixed value would change
# nothing where the byte already has it: 1 in 256 for random data)
flip_byte() {
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  # shellcheck disable=SC2059  # the format is the octal escape of the byte
  printf "\\$(printf %03o $((255 - b)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
require_testbed() {
  if ! "$TESTBED/status" -q; then
    fail "testbed up" "testbed/status reports the testbed down or unhealthy (run testbed/up)"
    finish
  fi
}
finish() {
  echo "$T_NAME: $T_PASSED passed, $T_FAILED failed, $T_SKIPPED skipped"
  if [[ $T_FAILED == 0 ]]; then exit 0; else exit 1; fi
}
# run a command as the unprivileged user with the testbed's Slurm config
as_user() { runuser -u "$TB_USER" -- env SLURM_CONF="$SLURM_CONF" "$@"; }
# wait_for TENTHS CMD...: poll until CMD succeeds
wait_for() {
  local n=$1 i; shift
  for ((i = 0; i < n; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}
# job_gone JID: slurmctld answered that job JID is no longer pending, running or completing. A
# failed squeue is no answer: `! squeue -j JID | grep -q .` took a squeue that timed out on a busy
# machine for the job's end, and the test read a job's output while the job still wrote it
job_gone() {
  local out
  if out=$(squeue -h -j "$1" -o %T 2>&1); then
    [[ -z $out ]]
  else
    [[ $out == *"Invalid job id"* ]]   # slurmctld forgot it (MinJobAge): long gone
  fi
}
# wait_job JID TENTHS: until job JID is gone (job_gone); when it is not within TENTHS, a FAIL that
# names the job and its state, and status 1
wait_job() {
  wait_for "$2" job_gone "$1" && return 0
  fail "Slurm job $1 ended within $(($2 / 10)) s" "$(squeue -h -j "$1" -o '%i %T %M %R' 2>&1 | head -3)"
  return 1
}
# a tiny squashfs image with hello.txt, in the shared fast scratch dir (visible on every node)
make_test_image() {
  local img=$TB/scratch/test-hello.sqfs src
  if [[ ! -s $img ]]; then
    src=$(mktemp -d /var/tmp/swp-t-img.XXXXXX)
    echo hello > "$src/hello.txt"
    mksquashfs "$src" "$img.tmp" -noappend -quiet -all-root >/dev/null
    chmod 644 "$img.tmp"; mv "$img.tmp" "$img"
    rm -rf "$src"
  fi
  echo "$img"
}
# race_fixture TAG: what the root-mount race tests (t_46, t_47) share, on node1: W (scratch, same
# path on every node), L (node1's local disk), RACE (a copy of race.py the racing user can read),
# SW (set by the caller) replaced by a copy in $W,
# on CMD... (run on node1), a clean-up on exit (stops the racers, unmounts and removes what is under
# $L, removes $W), and $W/tree with $W/tiny.sqfs built from it
race_fixture() {
  node=node1
  W=$TB/scratch/$1-$$
  L=$TB/local/$1-$$
  RACE=$W/race.py
  on() { "$TESTBED/exec" "$node" "$@"; }
  race_cleanup() {
    touch "$W/stop" 2>/dev/null || true
    sleep 0.3
    # unmount whatever is still mounted under $L (by mount point), then remove it
    on sh -c "awk -v p='$L/' 'index(\$5, p) == 1 {print \$5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l \"\$m\"; done; rm -rf '$L'" >/dev/null 2>&1 || true
    rm -rf "$W"
  }
  trap race_cleanup EXIT
  mkdir -p "$W/tree"
  cp "$REPO/tests/cluster/race.py" "$RACE"
  # the binary where node1 sees it (the checkout may sit in a directory private to this host, e.g.
  # a clone under /tmp: the nodes have their own /tmp)
  cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/"
  SW=$W/sw-pool
  echo hello > "$W/tree/hello.txt"
  mksquashfs "$W/tree" "$W/tiny.sqfs" -noappend -quiet -all-root >/dev/null
}

# lazy_fixture TAG: what the on-demand tests (t_80 to t_82) share: 4 nodes and the built binaries
# (else fail and finish); uid; W (scratch, the same path on every node) with bin/ (copies of the
# binaries the nodes can run; SW names the copy), tree/data/ and out/ (writable by the jobs); E (the
# storage server's disk) and S (where the nodes see it); HOOK (the Slurm epilog, see install_epilog);
# and a clean-up, now and on exit (unless LAZY_KEEP is set), that removes the hook, stops the chunk
# servers run from $W/bin (proved by their executable), unmounts every mount under
# $TB/local/TAG* and the user's FUSE mounts in its default state directories on every node, and
# removes them, $W and $E.
lazy_fixture() {
  read -r -a nodes <<< "$TB_NODES"
  [[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
  SW=$REPO/target/release/sw-pool
  [[ -x $SW && -x $SW-serve ]] || { fail "sw-pool and sw-pool-serve built" "missing (cargo build --release)"; finish; }
  uid=$(id -u "$TB_USER")
  LAZY_TAG=$1
  W=$TB/scratch/$1-$$
  E=$TB/export/$1-$$
  # shellcheck disable=SC2034 # the callers' name for the pool's directory on the nodes
  S=$TB/shared/$1-$$
  HOOK=$TB/etc/epilog.d/50-sw-pool
  [[ -n ${LAZY_KEEP:-} ]] || trap lazy_cleanup EXIT
  lazy_cleanup
  mkdir -p "$W/bin" "$W/tree/data" "$W/out" "$E"
  chmod 1777 "$W/out"
  cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
  SW=$W/bin/sw-pool
  chmod -R a+rX "$W"
}
lazy_cleanup() {
  local n e p
  rm -f "$HOOK"
  # the nodes share this host's PID namespace: one look at its processes finds every node's
  for e in /proc/[0-9]*/exe; do
    [[ $(readlink "$e" 2>/dev/null) == "$W/bin/sw-pool-serve" ]] || continue
    p=${e#/proc/}
    kill -9 "${p%/exe}" 2>/dev/null || true
  done
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "
      awk '(\$2 ~ \"^$TB/local/$LAZY_TAG\") || (\$3 ~ /^fuse/ && \$2 ~ \"/sw-pool-$uid\") {print \$2}' /proc/self/mounts | sort -r |
        while read -r m; do fusermount3 -u -z \"\$m\" 2>/dev/null || umount -l \"\$m\"; done
      rm -rf $TB/local/$LAZY_TAG*" >/dev/null 2>&1 || true
  done
  rm -rf "$W" "$E"
}
# install_epilog: the Slurm epilog as an admin installs it (README "For admins: Slurm"), running
# $W's binaries; lazy_cleanup removes it.
install_epilog() {
  mkdir -p "$W/libexec/sw-pool"
  ln -sf ../../bin/sw-pool "$W/libexec/sw-pool/epilog"
  printf '#!/bin/sh\nexec %s\n' "$W/libexec/sw-pool/epilog" > "$HOOK"
  chmod 755 "$HOOK"
}

# What is left of the test user's pools on the first 4 nodes: per node "NODE MOUNTS RECORDS" (the
# mounts whose /proc/self/mounts line matches the extended regex $1 or a chunk server's, the records
# and on-demand servers' sockets in the user's default state directories), then the user's live chunk
# servers, FUSE helpers and on-demand servers. The nodes share one PID namespace: those are counted once (and not zombies:
# ps, as pgrep -f matches a zombie's name).
left_of_user() {
  local uid n
  uid=$(id -u "$TB_USER")
  for n in $TB_NODES; do echo "$n"; done | head -n 4 | while read -r n; do
    "$TESTBED/exec" "$n" sh -c "echo \$(hostname) \$(grep -cE 'sw-pool-serve|$1' /proc/self/mounts) \$(ls /tmp/sw-pool-$uid*/mounts/*.json /tmp/sw-pool-$uid*/lazy-*.sock 2>/dev/null | grep -c .)"
  done | sort
  # shellcheck disable=SC2009
  ps -u "$uid" -o stat=,args= | grep -E '^[^Z]+ +(\S*sw-pool-serve|\S*squashfuse_ll|\S*sw-pool-full lazy-serve) ' | grep -c . || true
}
# The test user's live on-demand servers (`sw-pool-full lazy-serve`) on node NODE, one pid a line.
# The nodes share one PID namespace: a node's are those in its network namespace.
lazy_servers_on() {
  local ns p uid
  uid=$(id -u "$TB_USER")
  ns=$("$TESTBED/exec" "$1" readlink /proc/self/ns/net)
  for p in $(ps -u "$uid" -o pid=,stat=,args= | awk '$2 !~ /^Z/ && $3 ~ /sw-pool-full$/ && $4 == "lazy-serve" {print $1}'); do
    [[ $(readlink "/proc/$p/ns/net" 2>/dev/null) == "$ns" ]] && echo "$p"
  done
  return 0
}
# What left_of_user prints when nothing is left.
NOTHING_LEFT="$(printf 'node%s 0 0\n' 1 2 3 4; echo 0)"
# Wait up to 20 s (the epilog runs after the job) for nothing to be left (left_of_user PATTERN).
wait_nothing_left() { for _ in $(seq 100); do [[ $(left_of_user "$1") == "$NOTHING_LEFT" ]] && break; sleep 0.2; done; }
