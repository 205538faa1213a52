#!/usr/bin/env bash
# Root's mount lands on the directory that was checked, or nowhere. On node1, $TB_USER owns
# $LOCAL_TMPDIR/race and swaps race/mnt (a directory root created) with race/link, a symlink to
# $TB_USER2's directory, as fast as it can (renameat2 RENAME_EXCHANGE). Meanwhile root mounts a
# squashfs image (squashfuse_ll, libfuse3) and an ext2 image (fuse2fs, libfuse2) on race/mnt
# again and again for 10 s, and a watcher reads node1's /proc/self/mountinfo the whole time.
# Checks: not one mount ever appears outside race/ (on the symlink's target); every refused
# attempt says the mount point changed or was a symlink, never blames storage; at least one
# mount succeeded; nothing is left (no mount, no record, no staging directory).
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
race_fixture t46
root_sw() { on env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$L/state" "$SW" "$@"; }
mke2fs -q -t ext2 -d "$W/tree" "$W/tiny.ext2" 4M >/dev/null
chmod -R a+rX "$W"

# race/ belongs to the user; mnt in it is root's (root mounts only on its own or the caller's
# directories); the symlink points at the other user's directory
on sh -c "mkdir -p '$L/race' '$L/victim' '$L/state' && chmod 755 '$L' && chmod 700 '$L/state' && chown '$TB_USER' '$L/race' && chown '$TB_USER2' '$L/victim' && mkdir '$L/race/mnt' && runuser -u '$TB_USER' -- ln -s '$L/victim' '$L/race/link'"

on runuser -u "$TB_USER" -- python3 "$RACE" swap "$L/race/mnt" "$L/race/link" "$W/stop" > "$W/swaps" 2>&1 &
swapper=$!
on python3 "$RACE" watch "$W/stop" /t46- "$L/race/" > "$W/watch" 2>&1 &
watcher=$!

ok=0 raced=0 symlink=0 other=0 i=0
: > "$W/other"
end=$(( $(date +%s) + 10 ))
while (( $(date +%s) < end )); do
  img=$W/tiny.sqfs; (( i % 2 )) && img=$W/tiny.ext2
  i=$((i + 1))
  rc=0; out=$(root_sw mount -q --timeout 3 "$img" "$L/race/mnt" 2>&1) || rc=$?
  if [[ $rc == 0 ]]; then
    ok=$((ok + 1))
    # the swapper may have moved it: unmount by the recorded mount point when it is there again
    for _ in $(seq 200); do
      root_sw umount -q "$L/race/mnt" >/dev/null 2>&1 && break
      sleep 0.01
    done
  elif grep -q "the mount point changed while it was being mounted" <<< "$out"; then
    raced=$((raced + 1))
  elif grep -q "symbolic link" <<< "$out"; then
    symlink=$((symlink + 1))
  else
    other=$((other + 1)); printf '%s\n' "$out" >> "$W/other"
  fi
done
touch "$W/stop"
wait "$swapper" || true
wait "$watcher" || true
read -r samples inside outside where < "$W/watch" || true
echo "  $i root mounts in 10 s: $ok mounted, $raced lost the race, $symlink saw the symlink, $other other; $(cat "$W/swaps") swaps; $samples mountinfo reads ($inside sightings inside race/)"
assert_match "the swapper ran" "^[0-9]+$" "$(cat "$W/swaps")"
if (( $(cat "$W/swaps") > 1000 )); then pass "the swapper swapped (> 1000 times)"; else fail "the swapper swapped" "$(cat "$W/swaps")"; fi
if (( samples > 100 )); then pass "the watcher read mountinfo throughout"; else fail "the watcher read mountinfo" "$samples reads"; fi
assert_eq "no mount ever seen outside race/ (on the symlink's target)" "0" "${outside:-missing}${where:+ $where}"
if (( ok >= 1 )); then pass "root mounted in the race at least once ($ok)"; else fail "root mounted at least once" "0 of $i"; fi
if (( raced + symlink >= 1 )); then pass "lost races were refused ($raced changed, $symlink symlink)"; else fail "lost races refused" "none refused: $ok ok, $other other"; fi
assert_eq "every refusal names the race or the symlink, none blames storage" 0 "$other"
[[ $other == 0 ]] || sed 's/^/  other: /' "$W/other" | head -5

# nothing left: the user's directory is put back, every mount undone
if on test -L "$L/race/mnt"; then on runuser -u "$TB_USER" -- mv -T "$L/race/link" "$L/race/tmp"; on runuser -u "$TB_USER" -- mv -T "$L/race/mnt" "$L/race/link"; on runuser -u "$TB_USER" -- mv -T "$L/race/tmp" "$L/race/mnt"; fi
left=$(on awk -v p="$L/" 'index($5, p) == 1' /proc/self/mountinfo | wc -l)
assert_eq "no mount left under $L" 0 "$left"
assert_eq "no mount record left" 0 "$(on sh -c "ls '$L/state/mounts' 2>/dev/null | grep -c json" || true)"
assert_eq "no staging directory left" 0 "$(on sh -c "ls /run/sw-pool/stage 2>/dev/null | wc -l")"
assert_eq "the victim directory is untouched (empty, $TB_USER2's)" "$TB_USER2 0" "$(on stat -c %U "$L/victim") $(on ls -A "$L/victim" | wc -l)"
finish
