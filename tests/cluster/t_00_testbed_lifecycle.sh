#!/usr/bin/env bash
# Checks: up from nothing < 30 s, down < 10 s; up twice and down twice exit 0; after down no
# testbed namespace, link, mount, /etc/hosts line or process is left (processes are checked by exact
# namespace identity and by the PIDs of the pid files, never by name).  Leaves the testbed UP.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

# identities of everything the running testbed owns: "dev:inode" of its namespaces, pids of its pid files
snapshot() {
  ns_ids=$(stat -L -c '%d:%i' /run/netns/swp-* "$TB"/ns/*.mnt "$TB"/ns/*.uts 2>/dev/null | sort -u || true)
  pidfile_pids=""
  local f p
  for f in "$TB"/slurm/run/*.pid "$TB"/munge/munged.pid "$TB"/run/sshd.pid; do
    [[ -f $f ]] || continue
    p=$(tr -dc 0-9 < "$f")
    # remember pid + start time, so that a reused pid is not mistaken for ours
    [[ -n $p ]] && pidfile_pids+="$p:$(awk '{print $22}' "/proc/$p/stat" 2>/dev/null) "
  done
}
leftovers() {  # prints what is left of the testbed; empty if nothing
  local out="" l d p st
  for l in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    [[ $l == swp-* ]] && out+="netns $l; "
  done
  for l in /sys/class/net/*; do
    l=${l##*/}
    [[ $l == swph-* || $l == "$TB_BR" ]] && out+="link $l; "
  done
  findmnt -rn -o TARGET | grep -q "^$TB" && out+="mounts: $(findmnt -rn -o TARGET | grep "^$TB" | tr '\n' ' '); "
  grep -qE "swp-testbed|$TB_NET\." /etc/hosts && out+="/etc/hosts lines; "
  if [[ -n $ns_ids ]]; then
    # every process's net/mnt/uts namespace identity, compared with the recorded ones
    while read -r id path; do
      d=${path%/ns/*}; p=${d#/proc/}
      st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null || echo Z)
      [[ $st == Z ]] && continue
      grep -qx "$id" <<< "$ns_ids" && out+="process $p in a testbed namespace ($(cat "/proc/$p/comm" 2>/dev/null)); "
    done < <(stat -L -c '%d:%i %n' /proc/[0-9]*/ns/net /proc/[0-9]*/ns/mnt /proc/[0-9]*/ns/uts 2>/dev/null)
  fi
  for pp in $pidfile_pids; do
    p=${pp%%:*}
    st=$(awk '{print $3 ":" $22}' "/proc/$p/stat" 2>/dev/null || true)
    [[ -n $st && ${st%%:*} != Z && ${st#*:} == "${pp#*:}" ]] && out+="pid-file process $p still running; "
  done
  echo "$out"
}

# --purge deletes the hook directories; keep the hooks someone installed and put them back at the end
hooks=$(mktemp -d /var/tmp/swp-t00-hooks.XXXXXX)
trap 'rm -rf "$hooks"' EXIT
for d in prolog.d epilog.d task-prolog.d; do
  [[ -d $TB/etc/$d ]] && cp -a "$TB/etc/$d" "$hooks/"
done

snapshot
rc=0; "$TESTBED/down" --purge >/dev/null || rc=$?
assert_eq "down --purge before the test" 0 "$rc"
ns_ids="" pidfile_pids=""
assert_eq "clean machine after down --purge" "" "$(leftovers)"
assert_cmd "state dir removed by --purge" test ! -e "$TB"

t=$(now); rc=0; "$TESTBED/up" || rc=$?; dt=$(elapsed "$t")
assert_eq "up from nothing exits 0" 0 "$rc"
assert_le "up from nothing time" "$dt" 30 s
rc=0; "$TESTBED/up" || rc=$?
assert_eq "second up exits 0" 0 "$rc"
t=$(now); rc=0; "$TESTBED/up" --restart >/dev/null || rc=$?; dt=$(elapsed "$t")
assert_eq "up --restart (rebuild over a running testbed) exits 0" 0 "$rc"
assert_le "up --restart time" "$dt" 30 s
assert_cmd "status healthy after up" "$TESTBED/status" -q
# make the teardown do real work: a running job and a FUSE mount on a node
sbatch -Q -N2 -o /dev/null --wrap 'sleep 300' >/dev/null 2>&1 || true
img=$(make_test_image)
"$TESTBED/exec" node1 sh -c "mkdir -p /tmp/t00 && squashfuse '$img' /tmp/t00" || true

snapshot
t=$(now); rc=0; "$TESTBED/down" || rc=$?; dt=$(elapsed "$t")
assert_eq "down exits 0" 0 "$rc"
assert_le "down time" "$dt" 10 s
rc=0; "$TESTBED/down" || rc=$?
assert_eq "second down exits 0" 0 "$rc"
assert_eq "nothing left after down" "" "$(leftovers)"
assert_cmd "status reports down" sh -c "! '$TESTBED/status' -q"

rc=0; "$TESTBED/up" || rc=$?
assert_eq "up again (left up for the other tests)" 0 "$rc"
for d in prolog.d epilog.d task-prolog.d; do
  if [[ -d $hooks/$d ]]; then cp -a "$hooks/$d/." "$TB/etc/$d/"; fi
done
assert_cmd "status healthy at the end" "$TESTBED/status" -q
finish
