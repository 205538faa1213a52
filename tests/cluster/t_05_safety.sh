#!/usr/bin/env bash
# Safety checks: testbed/down, run under strace while a job, a FUSE daemon and a stray
# process live in the nodes, signals only processes that were in our pid files or proven to be in
# our namespaces (exact identity), never PID 1 or a process group; no testbed script uses
# pkill/killall; every address contacted (by up, down, srun, mpirun, and the running daemons) is a
# testbed address (10.79.0.x) or loopback.  Leaves the testbed UP.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
command -v strace >/dev/null || { fail "strace installed" "strace missing (tools/setup-deps.sh)"; finish; }
cd "$TB/scratch"
work=$(mktemp -d /var/tmp/swp-t05.XXXXXX)
trap 'rm -rf "$work"' EXIT
SIGS=kill,tkill,tgkill,rt_sigqueueinfo,rt_tgsigqueueinfo,pidfd_send_signal
NETS=connect,sendto,sendmsg
# 0.0.0.0 and :: mean "this host" (sshd's per-connection child connects an unsent UDP socket to
# them: glibc's getaddrinfo source-address selection), so they count as loopback
addr_ok() { [[ $1 =~ ^10\.79\.0\.[0-9]+$ || $1 =~ ^127\. || $1 == ::1 || $1 == 0.0.0.0 || $1 == :: || $1 =~ ^::ffff:(10\.79\.0\.|127\.) ]]; }
check_addrs() {  # check_addrs LABEL STRACE-FILE
  local bad="" a n
  n=$(grep -cE 'inet_addr|inet_pton' "$2" || true)
  while read -r a; do
    addr_ok "$a" || bad+="$a "
  done < <(grep -oE 'inet_addr\("[^"]+"\)|inet_pton\(AF_INET6?, "[^"]+"' "$2" | grep -oE '"[^"]+"' | tr -d '"' | sort -u)
  assert_eq "$1: only testbed/loopback addresses contacted ($n inet calls)" "" "$bad"
}

# --- the scene: a running job, a FUSE daemon on node3, a stray background process on node4
sbatch -Q -N2 -o /dev/null --wrap 'sleep 300' >/dev/null 2>&1 || true
img=$(make_test_image)
"$TESTBED/exec" node3 sh -c "mkdir -p /tmp/t05 && squashfuse '$img' /tmp/t05" || true
"$TESTBED/exec" node4 sh -c 'sleep 300 >/dev/null 2>&1 &' || true
wait_for 50 sh -c "squeue -h -t R | grep -q ." || true
# stray = the sleep on node4, found by exact namespace identity
stray=""
for d in /proc/[0-9]*; do
  [[ $d/ns/net -ef /run/netns/swp-n4 && $(cat "$d/comm" 2>/dev/null) == sleep ]] && stray=${d#/proc/}
done
# allowed targets: pid-file PIDs and every process in our namespaces, right before the teardown
allowed=" "
for f in "$TB"/slurm/run/*.pid "$TB"/munge/munged.pid "$TB"/run/sshd.pid; do
  [[ -f $f ]] && allowed+="$(tr -dc 0-9 < "$f") "
done
refs=()
for f in /run/netns/swp-*; do [[ -e $f ]] && refs+=("net $f"); done
for f in "$TB"/ns/*.mnt; do mountpoint -q "$f" && refs+=("mnt $f"); done
for d in /proc/[0-9]*; do
  for r in "${refs[@]}"; do
    if [[ $d/ns/${r%% *} -ef ${r#* } ]]; then allowed+="${d#/proc/} "; break; fi
  done
done
assert_match "scene set up (stray process on node4 found by namespace identity)" '^[0-9]+$' "$stray"

# --- down under strace
rc=0
strace -f -qq -e signal=none -e trace="$SIGS,$NETS" -o "$work/down.trace" "$TESTBED/down" >/dev/null || rc=$?
assert_eq "down under strace exits 0" 0 "$rc"
grep -E "^[0-9]+ +($(tr , '|' <<< "$SIGS"))\(" "$work/down.trace" > "$work/down.kills" || true
nk=$(grep -c . "$work/down.kills" || true)
bad=""
while read -r line; do
  t=$(sed -E 's/^[0-9]+ +[a-z_]+\((-?[0-9]+).*/\1/' <<< "$line")
  if [[ ! $t =~ ^[0-9]+$ ]] || (( t <= 1 )) || [[ $allowed != *" $t "* ]]; then bad+="[$line] "; fi
done < "$work/down.kills"
assert_match "down sent signals ($nk)" '^[1-9][0-9]*$' "$nk"
assert_eq "every signal went to a pid-file PID or a process in our namespaces, none to PID <= 1" "" "$bad"
assert_cmd "the stray process on node4 was signalled" grep -qE "kill\($stray, " "$work/down.kills"
assert_cmd "no signal to PID 1 (explicit)" sh -c "! grep -qE '(kill|tkill|tgkill)\((1|0|-[0-9]+), ' '$work/down.kills'"
check_addrs "down" "$work/down.trace"

# --- up under strace (from clean: its internal down finds nothing to signal); the daemons it
# starts are traced until up has finished, then strace (our own child) detaches
rm -f "$work/up.rc"
strace -f -qq -I 2 -e signal=none -e trace="$SIGS,$NETS" -o "$work/up.trace" \
  bash -c '"$1" >/dev/null; echo $? > "$2"' up "$TESTBED/up" "$work/up.rc" &
spid=$!
wait_for 600 test -s "$work/up.rc" || true
kill -INT "$spid" 2>/dev/null || true
wait "$spid" 2>/dev/null || true
assert_eq "up under strace exits 0" 0 "$(cat "$work/up.rc" 2>/dev/null || echo none)"
assert_eq "up from clean sent no signals" "" "$(grep -E "^[0-9]+ +($(tr , '|' <<< "$SIGS"))\(" "$work/up.trace" | head -3 || true)"
check_addrs "up (incl. sshd, sshfs, munged, slurmctld, slurmd start-up)" "$work/up.trace"
"$TESTBED/status" -q || "$TESTBED/up" --restart >/dev/null

# --- clients
strace -f -qq -e signal=none -e trace="$NETS" -o "$work/srun.trace" srun -N4 true >/dev/null 2>&1 || true
check_addrs "srun -N4" "$work/srun.trace"
strace -f -qq -e signal=none -e trace="$NETS" -o "$work/mpirun.trace" "$TESTBED/mpirun" /bin/true >/dev/null 2>&1 || true
check_addrs "testbed/mpirun" "$work/mpirun.trace"

# --- open TCP connections of the running testbed: every peer is a testbed or loopback address
peers=""
for ns in $(ip netns list | awk '$1 ~ /^swp-/ {print $1}'); do
  peers+=" $(ip netns exec "$ns" ss -Htn state all 2>/dev/null | awk '{print $NF}' | sed -E 's/:[0-9*]+$//; s/^\[//; s/\]$//' || true)"
done
for f in "$TB"/slurm/run/slurmctld.pid "$TB"/munge/munged.pid; do
  p=$(tr -dc 0-9 < "$f" || true)
  [[ -n $p ]] || continue
  peers+=" $(ss -Htnp state all 2>/dev/null | grep "pid=$p," | awk '{print $(NF-1)}' | sed -E 's/:[0-9*]+$//; s/^\[//; s/\]$//' || true)"
done
bad=""
for a in $peers; do [[ $a == '*' || $a == 0.0.0.0 ]] || addr_ok "$a" || bad+="$a "; done
assert_eq "open TCP peers of the testbed are testbed/loopback addresses" "" "$bad"

# --- static checks of the testbed scripts
assert_eq "no pkill/killall in testbed scripts" "" \
  "$(grep -rnwE 'pkill|killall' "$TESTBED" --exclude=README.md || true)"
assert_eq "no IPv4 literal other than loopback or 10.79.0.x in testbed scripts" "" \
  "$(grep -rnoE '\b[0-9]{1,3}(\.[0-9]{1,3}){3}\b' "$TESTBED" --exclude=README.md | grep -vE ':(127\.0\.0\.1|10\.79\.0\.[0-9]+)$' || true)"
assert_cmd "testbed is up and healthy at the end" "$TESTBED/status" -q
finish
