#!/usr/bin/env bash
# Checks: srun -N4 runs one task per node; each sees its own hostname, address, private /tmp
# and local dir; a FUSE (squashfuse) mount made on node1 is invisible on node2 and in the root
# namespace -- as root through testbed/exec and as the unprivileged user through srun.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
n4=${nodes[*]:0:4}
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
uid=$(id -u "$TB_USER")
tag=t01-$$-$RANDOM

probe='echo "$(hostname) $(ip -4 -o addr show eth0 | awk "{print \$4}") $(findmnt -no SOURCE /tmp) $(findmnt -no SOURCE $LOCAL_TMPDIR | sed "s/.*\[//; s/\]//") $SCRATCH $(id -un)"'
for who in root "$TB_USER"; do
  if [[ $who == root ]]; then run=(); else run=(runuser -u "$TB_USER" -- env SLURM_CONF="$SLURM_CONF"); fi
  out=$("${run[@]}" srun -N4 -l --chdir=/tmp sh -c "$probe; echo $tag-\$(hostname) > /tmp/$tag; echo \$(hostname) > \$LOCAL_TMPDIR/$tag-$who" 2>&1 | sort) || true
  exp=""
  for i in 0 1 2 3; do
    n=${nodes[i]}
    exp+="$i: $n $(node_ip "$n")/24 swp-$n-tmp $TB/nodes/$n/local $TB/shared $who"$'\n'
  done
  assert_eq "srun -N4 as $who: one task per node, own hostname/address/tmp/local dir" "${exp%$'\n'}" "$out"
  # the files written went to each node's own /tmp and own local dir
  for n in $n4; do
    got=$("$TESTBED/exec" "$n" cat "/tmp/$tag" 2>&1 || true)
    assert_eq "$who: $n sees its own /tmp file" "$tag-$n" "$got"
    assert_eq "$who: $n local file is in $n's own disk" "$n" "$(cat "$TB/nodes/$n/local/$tag-$who" 2>&1 || true)"
    rm -f "$TB/nodes/$n/local/$tag-$who"
  done
  assert_cmd "$who: /tmp of the nodes is not the root's /tmp" test ! -e "/tmp/$tag"
  assert_cmd "$who: another node's disk is hidden on node2" "$TESTBED/exec" node2 sh -c "test ! -e $TB/nodes/node1/local"
  "$TESTBED/exec" all rm -f "/tmp/$tag" >/dev/null 2>&1 || true
done

img=$(make_test_image)
fuse_count() {  # fuse_count WHERE MOUNTPOINT: number of FUSE mounts at MOUNTPOINT on node WHERE (or "root")
  if [[ $1 == root ]]; then
    awk -v m="$2" '$2 == m && $3 ~ /^fuse/' /proc/self/mounts | wc -l
  else
    "$TESTBED/exec" "$1" awk -v m="$2" '$2 == m && $3 ~ /^fuse/' /proc/self/mounts | wc -l
  fi
}
# root, through testbed/exec
mp=/tmp/t01-root
assert_cmd "root: squashfuse mount on node1" "$TESTBED/exec" node1 sh -c "mkdir -p $mp && squashfuse '$img' $mp && test \"\$(cat $mp/hello.txt)\" = hello"
assert_eq "root: mount visible on node1 in a later command" 1 "$(fuse_count node1 $mp)"
assert_eq "root: mount invisible on node2" 0 "$(fuse_count node2 $mp)"
assert_eq "root: mount invisible in the root namespace" 0 "$(fuse_count root $mp)"
assert_cmd "root: fusermount3 -u on node1" "$TESTBED/exec" node1 fusermount3 -u $mp
assert_eq "root: mount gone after unmount" 0 "$(fuse_count node1 $mp)"

# unprivileged user, through srun (the FUSE daemon outlives the job step, like a real user mount)
mp=/tmp/t01-user
assert_cmd "$TB_USER: squashfuse mount on node1 via srun" as_user srun -N1 -w node1 --chdir=/tmp sh -c "mkdir -p $mp && squashfuse '$img' $mp"
out=$(as_user srun -N1 -w node1 --chdir=/tmp sh -c "cat $mp/hello.txt; awk '\$2 == \"$mp\" {print \$3, \$4}' /proc/self/mounts" 2>/dev/null || true)
assert_match "$TB_USER: mount readable in a later step, owned by uid $uid" "^hello"$'\n'"fuse(\.squashfuse)? .*user_id=$uid" "$out"
assert_eq "$TB_USER: mount invisible on node2 (seen by srun on node2)" 0 "$(as_user srun -N1 -w node2 --chdir=/tmp awk -v m=$mp '$2 == m' /proc/self/mounts | wc -l)"
assert_eq "$TB_USER: mount invisible in the root namespace" 0 "$(fuse_count root $mp)"
assert_cmd "$TB_USER: fusermount3 -u via srun" as_user srun -N1 -w node1 --chdir=/tmp fusermount3 -u $mp
assert_eq "$TB_USER: mount gone" 0 "$(fuse_count node1 $mp)"
finish
