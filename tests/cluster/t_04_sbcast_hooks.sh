#!/usr/bin/env bash
# Checks: sbcast places an identical copy of a file in every node's local directory; the
# Prolog, Epilog and TaskProlog dispatchers ran on every allocated node (hook logs), the TaskProlog
# exported LOCAL_TMPDIR and SCRATCH, hooks in $TB/etc/prolog.d run, and a failing hook fails the
# prolog/epilog.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
n4=${nodes[*]:0:4}
cd "$TB/scratch"
src=$TB/scratch/t04-$$.bin
head -c 8M /dev/urandom > "$src"
tag=t04-$$-$RANDOM
hook=$TB/etc/prolog.d/50-$tag
cleanup() {
  rm -f "$hook" "$TB/etc/prolog.d/99-$tag-fail" "$TB/etc/epilog.d/10-$tag-fail" "$TB/etc/epilog.d/20-$tag-ok" "$src"
  for n in $n4; do rm -f "$TB/nodes/$n/local/$tag.bin" "$TB/nodes/$n/local/$tag.hook"; done
}
trap cleanup EXIT
# a hook in prolog.d, as the Slurm integration will install them
printf '#!/bin/sh\necho "job=$SLURM_JOB_ID host=$(hostname)" >> %s/local/%s.hook\n' "$TB" "$tag" > "$hook"
chmod 755 "$hook"
declare -A off
for n in $n4; do
  for k in prolog epilog task-prolog; do off[$n.$k]=$(stat -c %s "$TB/nodes/$n/local/$k.log" 2>/dev/null || echo 0); done
done

jid=$(env -u LOCAL_TMPDIR -u SCRATCH sbatch --parsable -N4 -o "$TB/scratch/$tag.out" --wait --wrap \
  "sbcast -f '$src' '$TB/local/$tag.bin' && srun sh -c 'echo \$(hostname) \$LOCAL_TMPDIR \$SCRATCH \$(sha256sum < \$LOCAL_TMPDIR/$tag.bin)'" 2>/dev/null || true)
assert_match "sbatch -N4 with sbcast + srun ran" '^[0-9]+$' "$jid"
sum="$(sha256sum < "$src" | cut -d" " -f1) -"
out=$(sort "$TB/scratch/$tag.out" 2>/dev/null || true)
rm -f "$TB/scratch/$tag.out"
exp=""
for n in $n4; do exp+="$n $TB/local $TB/shared $sum"$'\n'; done
assert_eq "every task saw LOCAL_TMPDIR, SCRATCH (TaskProlog) and an identical sbcast copy" "${exp%$'\n'}" "$out"
for n in $n4; do
  assert_cmd "sbcast copy in $n's own local dir is identical" cmp "$src" "$TB/nodes/$n/local/$tag.bin"
done
new_lines() { tail -c +"$((${off[$1.$2]} + 1))" "$TB/nodes/$1/local/$2.log" 2>/dev/null || true; }
epilogs_done() {
  local n
  for n in $n4; do new_lines "$n" epilog | grep -q " epilog job=$jid .*rc=0" || return 1; done
}
wait_for 100 epilogs_done || true
for n in $n4; do
  assert_match "prolog ran on $n" "prolog job=$jid user=root host=$n rc=0 hooks=50-$tag=0" "$(new_lines "$n" prolog)"
  assert_match "epilog ran on $n" "epilog job=$jid user=root host=$n rc=0" "$(new_lines "$n" epilog)"
  assert_match "task prolog ran on $n" "task-prolog job=$jid user=root host=$n rc=0" "$(new_lines "$n" task-prolog)"
  assert_eq "prolog.d hook ran on $n" "job=$jid host=$n" "$(cat "$TB/nodes/$n/local/$tag.hook" 2>/dev/null || true)"
done
rm -f "$hook"

# a failing hook fails the dispatcher (run directly, so that no node gets drained); the epilog
# still runs its later hooks
printf '#!/bin/sh\n[ -z "$T04_FAIL" ] || exit 3\n' > "$TB/etc/prolog.d/99-$tag-fail"
printf '#!/bin/sh\n[ -z "$T04_FAIL" ] || exit 4\n' > "$TB/etc/epilog.d/10-$tag-fail"
printf '#!/bin/sh\n[ -z "$T04_FAIL" ] || echo ran > %s/local/%s.hook\n' "$TB" "$tag" > "$TB/etc/epilog.d/20-$tag-ok"
chmod 755 "$TB/etc/prolog.d/99-$tag-fail" "$TB/etc/epilog.d/10-$tag-fail" "$TB/etc/epilog.d/20-$tag-ok"
rc=0; "$TESTBED/exec" node1 env T04_FAIL=1 SLURM_JOB_ID=t04 "$TB/etc/prolog" 2>/dev/null || rc=$?
assert_eq "a failing prolog.d hook fails the prolog" 3 "$rc"
rc=0; "$TESTBED/exec" node1 env T04_FAIL=1 SLURM_JOB_ID=t04 "$TB/etc/epilog" 2>/dev/null || rc=$?
assert_eq "a failing epilog.d hook fails the epilog" 4 "$rc"
assert_eq "the epilog still ran the later hooks" ran "$(cat "$TB/nodes/node1/local/$tag.hook" 2>/dev/null || true)"
rc=0; "$TESTBED/exec" node1 env SLURM_JOB_ID=t04 "$TB/etc/prolog" || rc=$?
assert_eq "the same hooks pass when they succeed" 0 "$rc"
finish
