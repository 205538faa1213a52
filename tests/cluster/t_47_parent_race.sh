#!/usr/bin/env bash
# Root never follows a user's symlink in a parent of the mount point (issue 27, defect 1). On
# node1, $TB_USER owns $L/B/p and swaps B/p/sub (a real directory of theirs, holding a root-owned
# mnt) with B/p/link, a symlink to the decoy $L/decoy ($TB_USER2's, holding a root-owned mnt), as
# fast as renameat2(RENAME_EXCHANGE) goes. For 10 s root alternates `sw-pool mount IMG
# B/p/sub/mnt` and `sw-pool load -m B/p/sub/new-N POOL` (which creates new-N), and unmounts what
# it mounted; a watcher reads node1's mountinfo the whole time. Checks: no mount ever appears in
# the decoy and no directory is ever created there; refusals name the symlink or the race; at least
# one mount succeeded; a mount whose parent the user renamed afterwards is still unmounted by
# root; nothing is left. (A mount seen under B/p/link/ is root's mount on the user's real
# directory, renamed by its owner after the mount: that is the intended directory, not the decoy.)
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
race_fixture t47
root_sw() { on env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$L/state" SW_POOL_CACHE="$L/cache" "$SW" "$@"; }
"$SW" init -q --name t47 --version 1.0 "$W/pooltree" >/dev/null
mkdir -p "$W/pooltree/install/hello/1.0/bin" && echo hi > "$W/pooltree/install/hello/1.0/bin/hello"
"$SW" build -q "$W/t47.sqfs" "$W/pooltree"
chmod -R a+rX "$W"

on sh -c "mkdir -p '$L/B/p/sub/mnt' '$L/decoy/mnt' '$L/state' '$L/cache' && chmod 755 '$L' '$L/B' && chmod 700 '$L/state' && chown '$TB_USER' '$L/B/p' '$L/B/p/sub' && chown '$TB_USER2' '$L/decoy' && runuser -u '$TB_USER' -- ln -s '$L/decoy' '$L/B/p/link'"

# defect 1 without a race: the symlink itself as a parent is refused, and nothing is made there
on runuser -u "$TB_USER" -- ln -s "$L/decoy" "$L/B/p/direct"
rc=0; out=$(root_sw mount -q "$W/tiny.sqfs" "$L/B/p/direct/mnt" 2>&1) || rc=$?
assert_eq "root's mount through a user's symlinked parent is refused (status 3)" 3 "$rc"
assert_match "the refusal names the symlink in a user-writable directory" "a symlink in a user-writable directory" "$out"
rc=0; out=$(root_sw load -q -m "$L/B/p/direct/new" "$W/t47.sqfs" 2>&1) || rc=$?
assert_eq "root's load -m through a user's symlinked parent is refused (status 3)" 3 "$rc"
assert_eq "no directory was created in the decoy" "mnt" "$(on ls -A "$L/decoy" | tr '\n' ' ' | sed 's/ $//')"

# the TaskProlog as root (a root job) with its mount root through the symlinked parent
rc=0; out=$(on env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$L/state" SW_POOL_CACHE="$L/cache" \
  SLURM_JOB_ID=4747 SW_POOL_LOAD="$W/t47.sqfs" SW_POOL_MOUNT="$L/B/p/direct/mnts" "$SW" slurm task-prolog 2>&1) || rc=$?
assert_match "root's TaskProlog refuses a mount root through the user's symlink" "a symlink in a user-writable directory" "$out"
assert_eq "the TaskProlog created nothing in the decoy" "mnt" "$(on ls -A "$L/decoy" | tr '\n' ' ' | sed 's/ $//')"

# the Epilog as root finds a job's mount whose parent its owner renamed (and replaced by a symlink
# to the decoy) after the mount, by the mount's ID, and unmounts it where it is
rc=0; out=$(root_sw mount -q --job-id 4747 "$W/tiny.sqfs" "$L/B/p/sub/mnt" 2>&1) || rc=$?
assert_eq "root mounts on the user's real directory (no symlink on the path)" "0" "$rc${out:+ $out}"
on runuser -u "$TB_USER" -- mv -T "$L/B/p/sub" "$L/B/p/moved"
on runuser -u "$TB_USER" -- ln -s "$L/decoy" "$L/B/p/sub"
rc=0; out=$(on env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$L/state" SLURM_JOB_ID=4747 SLURM_JOB_UID=0 "$SW" slurm epilog 2>&1) || rc=$?
assert_eq "root's Epilog succeeds" "0" "$rc${out:+ $out}"
assert_eq "the renamed mount was unmounted" 0 "$(on awk -v p="$L/" 'index($5, p) == 1' /proc/self/mountinfo | wc -l)"
assert_eq "its record was removed" 0 "$(on sh -c "ls '$L/state/mounts' 2>/dev/null | grep -c json" || true)"
on runuser -u "$TB_USER" -- rm "$L/B/p/sub"
on runuser -u "$TB_USER" -- mv -T "$L/B/p/moved" "$L/B/p/sub"

on runuser -u "$TB_USER" -- python3 "$RACE" swap "$L/B/p/sub" "$L/B/p/link" "$W/stop" > "$W/swaps" 2>&1 &
swapper=$!
on python3 "$RACE" watch "$W/stop" /t47- "$L/B/p/" "$L/decoy" > "$W/watch" 2>&1 &
watcher=$!

ok=0 refused=0 other=0 stuck=0 i=0
: > "$W/other"
end=$(( $(date +%s) + 10 ))
while (( $(date +%s) < end )); do
  i=$((i + 1))
  if (( i % 2 )); then
    mp=$L/B/p/sub/mnt; rc=0; out=$(root_sw mount -q --timeout 3 "$W/tiny.sqfs" "$mp" 2>&1) || rc=$?
  else
    mp=$L/B/p/sub/new-$i; rc=0; out=$(root_sw load -q --json -m "$mp" "$W/t47.sqfs" 2>&1 >/dev/null) || rc=$?
  fi
  if [[ $rc == 0 ]]; then
    ok=$((ok + 1))
    # the user may have renamed the directory since: the record's mount is found by its ID
    done_=0
    for _ in $(seq 50); do
      root_sw umount -q "$mp" >/dev/null 2>&1 && { done_=1; break; }
      sleep 0.01
    done
    (( done_ )) || { stuck=$((stuck + 1)); printf 'umount %s failed\n' "$mp" >> "$W/other"; }
  elif grep -qE "a symlink in a user-writable directory|changed while it was being mounted|symbolic link|No such file or directory" <<< "$out"; then
    refused=$((refused + 1))
  else
    other=$((other + 1)); printf '%s\n' "$out" >> "$W/other"
  fi
done
touch "$W/stop"
wait "$swapper" || true
wait "$watcher" || true
read -r samples inside outside where < "$W/watch" || true
echo "  $i root mounts/loads in 10 s: $ok mounted, $refused refused, $other other, $stuck not unmounted; $(cat "$W/swaps") swaps; $samples mountinfo reads ($inside sightings under B/p/)"
if (( $(cat "$W/swaps") > 1000 )); then pass "the swapper swapped (> 1000 times)"; else fail "the swapper swapped" "$(cat "$W/swaps")"; fi
if (( samples > 100 )); then pass "the watcher read mountinfo throughout"; else fail "the watcher read mountinfo" "$samples reads"; fi
assert_eq "no mount and no directory ever seen in the decoy (or anywhere outside B/p)" "0" "${outside:-missing}${where:+ $where}"
if (( ok >= 1 )); then pass "root mounted in the race at least once ($ok)"; else fail "root mounted at least once" "0 of $i"; fi
if (( refused >= 1 )); then pass "lost races were refused ($refused)"; else fail "lost races refused" "none refused: $ok ok, $other other"; fi
assert_eq "every refusal names the symlink or the race" 0 "$other"
assert_eq "root unmounted every mount it made, renamed parent or not" 0 "$stuck"
[[ $other == 0 && $stuck == 0 ]] || sed 's/^/  other: /' "$W/other" | head -5

# nothing left
left=$(on awk -v p="$L/" 'index($5, p) == 1' /proc/self/mountinfo | wc -l)
assert_eq "no mount left under $L" 0 "$left"
assert_eq "no mount record left" 0 "$(on sh -c "ls '$L/state/mounts' 2>/dev/null | grep -c json" || true)"
assert_eq "no staging directory left" 0 "$(on sh -c "ls /run/sw-pool/stage 2>/dev/null | wc -l")"
assert_eq "the decoy is untouched ($TB_USER2's, holding only mnt)" "$TB_USER2 mnt" "$(on stat -c %U "$L/decoy") $(on ls -A "$L/decoy" | tr '\n' ' ' | sed 's/ $//')"
finish
