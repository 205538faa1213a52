#!/usr/bin/env bash
# A user who renames the parent of root's mount point carries root's FUSE mount with it; root must
# still find and remove it by its identity (the record's mount ID), and no command may report a
# mount at a path where it is not. On node1, $TB_USER owns $L/B/p/sub (holding a root-owned mnt) and
# $L/U/far/sub and exchanges the two directories (renameat2 RENAME_EXCHANGE) as fast as it can, for
# 10 s, while root alternates `sw-pool mount IMG B/p/sub/m-N` and `sw-pool load -m
# B/p/sub/new-N POOL` and unmounts each with `sw-pool umount` at the path it mounted. Checks: a
# mount moved before `umount` is unmounted where it went and `list` says where; what `umount` could
# not remove during the race, `cleanup --all` removes: at the end not one of root's mounts is left
# anywhere in node1's mount table.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
race_fixture t48
root_sw() { on env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$L/state" SW_POOL_CACHE="$L/cache" "$SW" "$@"; }
"$SW" init -q --name t48 --version 1.0 "$W/pooltree" >/dev/null
mkdir -p "$W/pooltree/install/hello/1.0/bin" && echo hi > "$W/pooltree/install/hello/1.0/bin/hello"
"$SW" build -q "$W/t48.sqfs" "$W/pooltree"
chmod -R a+rX "$W"
on sh -c "mkdir -p '$L/B/p/sub/mnt' '$L/U/far/sub' '$L/state' '$L/cache' && chmod 755 '$L' '$L/B' '$L/U' && chmod 700 '$L/state' && chown '$TB_USER' '$L/B/p' '$L/B/p/sub' '$L/U/far' '$L/U/far/sub'"
# root's mounts of this test, anywhere in node1's mount table: FUSE mounts of the two images' helpers
# whose mount point is under $L (wherever the user moved them)
ours() { on awk -v p="$L/" 'index($5, p) == 1 && $0 ~ / - fuse/' /proc/self/mountinfo | wc -l; }

# without a race: root's mount, its parent moved elsewhere by the user, is unmounted where it went
rc=0; out=$(root_sw mount -q "$W/tiny.sqfs" "$L/B/p/sub/mnt" 2>&1) || rc=$?
assert_eq "root mounts on the user's directory" "0" "$rc${out:+ $out}"
on runuser -u "$TB_USER" -- python3 -c "import ctypes,sys; l=ctypes.CDLL(None); sys.exit(l.renameat2(-100, b'$L/B/p/sub', -100, b'$L/U/far/sub', 2))"
assert_eq "the user moved it to U/far/sub/mnt" 1 "$(on awk -v p="$L/U/far/sub/mnt" '$5 == p' /proc/self/mountinfo | wc -l)"
out=$(root_sw list 2>&1 || true)
assert_match "list says where the mount is now" "now at $L/U/far/sub/mnt" "$out"
rc=0; out=$(root_sw umount -q "$L/B/p/sub/mnt" 2>&1) || rc=$?
assert_eq "root's umount at the path it mounted succeeds" "0" "$rc${out:+ $out}"
assert_eq "... and the moved mount is gone" 0 "$(ours)"
on runuser -u "$TB_USER" -- python3 -c "import ctypes,sys; l=ctypes.CDLL(None); sys.exit(l.renameat2(-100, b'$L/B/p/sub', -100, b'$L/U/far/sub', 2))"

on runuser -u "$TB_USER" -- python3 "$RACE" swap "$L/B/p/sub" "$L/U/far/sub" "$W/stop" > "$W/swaps" 2>&1 &
swapper=$!
ok=0 gone=0 lied=0 failed=0 other=0 i=0
: > "$W/other"
end=$(( $(date +%s) + 10 ))
while (( $(date +%s) < end )); do
  i=$((i + 1))
  if (( i % 2 )); then
    # a new directory each time: a mount point whose mount is still there (an umount refused) would
    # be shared, and its umount then only drop a reference
    mp=$L/B/p/sub/m-$i; rc=0; on mkdir "$mp" 2>/dev/null || true
    out=$(root_sw mount -q --timeout 3 "$W/tiny.sqfs" "$mp" 2>&1) || rc=$?
  else
    mp=$L/B/p/sub/new-$i; rc=0; out=$(root_sw load -q --json -m "$mp" "$W/t48.sqfs" 2>&1 >/dev/null) || rc=$?
  fi
  if [[ $rc != 0 ]]; then
    # a mount point the user moved away while it was being mounted is refused
    grep -qE "changed while it was being mounted|No such file or directory|does not exist|not found|moved|already a mount point" <<< "$out" || { other=$((other + 1)); printf 'mount: %s\n' "$out" >> "$W/other"; }
    continue
  fi
  ok=$((ok + 1))
  before=$(ours)
  rc=0; out=$(root_sw umount -q "$mp" 2>&1) || rc=$?
  after=$(ours)
  if [[ $rc == 0 ]]; then
    # the race test's own mounts are the only ones under $L: success must have removed one
    if (( after < before )); then gone=$((gone + 1)); else lied=$((lied + 1)); printf 'umount %s: success, but %s mounts before and %s after\n' "$mp" "$before" "$after" >> "$W/other"; fi
  else
    failed=$((failed + 1)); printf 'umount %s: %s\n' "$mp" "$out" >> "$W/other"
  fi
done
touch "$W/stop"
wait "$swapper" || true
echo "  $i root mounts/loads in 10 s: $ok mounted, $gone unmounted, $failed umounts refused, $lied false successes, $other other; $(cat "$W/swaps") exchanges"
if (( $(cat "$W/swaps") > 1000 )); then pass "the user exchanged the directories (> 1000 times)"; else fail "the user exchanged the directories" "$(cat "$W/swaps")"; fi
if (( ok >= 1 )); then pass "root mounted in the race ($ok)"; else fail "root mounted in the race at least once" "0 of $i"; fi
# An umount that reports success removed a mount: before root's mounts were known by the ID of the
# mount that landed (not by what sat at the path), a mount the user moved away right after it landed
# stayed unrecorded while an older one moved into its place was recorded for it (1 in ~10 runs).
assert_eq "no umount reported success for a mount that stayed" 0 "$lied"
assert_eq "every failed mount was refused for the race" 0 "$other"
[[ $other == 0 ]] || sed 's/^/  /' "$W/other" | head -8
left=$(ours)
listed=$(root_sw list --json 2>/dev/null | python3 -c '
import json, sys
def ok(x):
    if isinstance(x, list):
        return sum(ok(v) for v in x)
    if isinstance(x, dict):
        return (x.get("status") == "ok") + sum(ok(v) for k, v in x.items() if k != "record")
    return 0
print(ok(json.load(sys.stdin)))' 2>/dev/null || echo "?")
echo "  after the race: $left of root's mounts left under $L, $listed listed as mounted"
assert_eq "list shows every mount the race left, as mounted" "$left" "$listed"
if [[ $left != "$listed" ]]; then
  root_sw list 2>&1 | sed 's/^/  list: /' | head -20
  on awk -v p="$L/" 'index($5, p) == 1 && $0 ~ / - fuse/ {print "  mountinfo: " $1, $5}' /proc/self/mountinfo
  on sh -c "cat '$L'/state/mounts/*.json" 2>/dev/null | head -c 3000; echo
  grep '^umount' "$W/other" | sed 's/^/  /' | head -8
fi
rc=0; out=$(root_sw cleanup -q --all 2>&1) || rc=$?
assert_eq "root's cleanup --all succeeds" "0" "$rc${out:+ $out}"
assert_eq "not one of root's mounts is left anywhere (after $failed refused umounts)" 0 "$(ours)"
assert_eq "no mount record left" 0 "$(on sh -c "ls '$L/state/mounts' 2>/dev/null | grep -c json" || true)"
finish
