#!/usr/bin/env bash
# Shadow mounts (issue 31, seed 002's software images): a site pool's install/<pkg>/<ver> shown
# over the site's original installation <shadow_root>/<pkg>/<ver> ($TB/sw on the testbed, the
# helper.toml testbed/up writes), so the site's own modulefiles, which point at the original, run
# the pool's copy. Checks, on node1:
#  - the one-line hook in an existing site modulefile, with Lmod (Lua `execute{}`, and a Tcl
#    modulefile read by Lmod) and with Environment Modules (Tcl `puts stdout`: the shell runs it
#    after the module command, with both; Lmod 8.6 runs a Tcl `system` on load only), in Slurm
#    jobs of user 1:
#    `module load` shows the pool there (for another user too: one mount for the node), `module
#    unload` and `module purge` give the original back, a job that ends with the module loaded is
#    released by the epilog (`sw-pool slurm epilog` as root runs the helper's `cleanup --job-id`),
#    the loop device goes with it;
#  - the bind is ro,nosuid,nodev; a package whose original is a symlink (to /etc) is not shadowed
#    (the original stays, /etc untouched), one with no original is left alone;
#  - a modulefile whose pool is missing: `module load` still works, from the original, with a
#    warning that says so;
#  - without the helper: `sw-pool run --shadow NAME/VERSION` shows a pool the user mounted over the
#    original in that environment only.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
SW=$REPO/target/release/sw-pool
HB=$REPO/target/release/sw-pool-mount-helper
[[ -x $SW && -x $HB ]] || { fail "sw-pool and its helper built" "missing (cargo build --release)"; finish; }
command -v sudo >/dev/null || { fail "sudo installed" "tools/setup-deps.sh installs it"; finish; }
H=$TB/sbin/sw-pool-mount-helper
install -m 0755 -o root -g root "$HB" "$H"
node=node1
on() { "$TESTBED/exec" "$node" "$@"; }
U1=$TB_USER U2=$TB_USER2
SR=$TB/sw                         # helper.toml's shadow_root (testbed/up)
W=$TB/scratch/t77-$$
E=$TB/export/t77-$$ S=$TB/shared/t77-$$
KEYS=$TB/etc/sw-pool/trusted-keys
HOOK=$TB/etc/epilog.d/50-t77-sw-pool
MODULECMD=/opt/sw-pool-deps/environment-modules/usr/lib/x86_64-linux-gnu/modulecmd.tcl
jobs_=()
cleanup() {
  for j in "${jobs_[@]}"; do scancel "$j" 2>/dev/null || true; done
  rm -f "$HOOK" "$KEYS/t77-site.pub.pem"
  on sh -c "awk -v a='$SR/t77' -v b='$TB/local/root/site/t77' 'index(\$5, a) == 1 || index(\$5, b) == 1 {print \$5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l \"\$m\"; done" >/dev/null 2>&1 || true
  on "$H" cleanup >/dev/null 2>&1 || true
  on sh -c "rm -f $TB/local/root/cache/t77*" >/dev/null 2>&1 || true
  on runuser -u "$U1" -- env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$W/sw-pool" cleanup --all >/dev/null 2>&1 || true
  [[ -n ${helper_toml_orig:-} ]] && cp "$W/helper.toml.orig" "$TB/etc/sw-pool/helper.toml"
  rm -rf "$W" "$E" "$SR"/t77*
}
trap cleanup EXIT
mkdir -p "$W/out" "$E/pools/t77gcc" && chmod 1777 "$W" "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/"
SW=$W/sw-pool
# a testbed started before shadow_root was in its helper.toml gets it for this test
if ! grep -q '^shadow_root' "$TB/etc/sw-pool/helper.toml"; then
  cp "$TB/etc/sw-pool/helper.toml" "$W/helper.toml.orig"; helper_toml_orig=1
  echo "shadow_root = \"$SR\"" >> "$TB/etc/sw-pool/helper.toml"
fi
install -d -m 0755 "$SR"

# --- the site's original software, its modulefiles, and the pool that shadows it
mkdir -p "$SR/t77gcc/12/bin" "$SR/t77sym"
printf '#!/bin/sh\necho "t77cc: the original on the shared file system"\n' > "$SR/t77gcc/12/bin/t77cc"
chmod 755 "$SR/t77gcc/12/bin/t77cc"
ln -s /etc "$SR/t77sym/1"
"$SW" keygen --out "$W/site" >/dev/null
cp "$W/site.pub.pem" "$KEYS/t77-site.pub.pem"
"$SW" init -q --name t77gcc --version 12 "$W/tree" >/dev/null
mkdir -p "$W/tree/install/t77gcc/12/bin" "$W/tree/install/t77sym/1" "$W/tree/install/t77zlib/1.3"
printf '#!/bin/sh\necho "t77cc: from the pool"\n' > "$W/tree/install/t77gcc/12/bin/t77cc"
chmod 755 "$W/tree/install/t77gcc/12/bin/t77cc"
echo "pool" > "$W/tree/install/t77sym/1/from-pool"
"$SW" build -q "$E/pools/t77gcc/12.sqfs" "$W/tree"
"$SW" sign -q --key "$W/site.pem" "$E/pools/t77gcc/12.sqfs"
chmod -R a+rX "$E" "$W"
mkdir -p "$W/mf-lua/t77gcc" "$W/mf-tcl/t77gcc"
cat > "$W/mf-lua/t77gcc/12.lua" <<EOF
-- a site's existing modulefile of the original installation ...
prepend_path("PATH", "$SR/t77gcc/12/bin")
-- ... and the one line that makes a module load shadow-mount the pool
execute{cmd="$SW shadow " .. mode() .. " t77gcc/12", modeA={"load","unload"}}
EOF
cp "$W/mf-lua/t77gcc/12.lua" "$W/mf-lua/t77gcc/13.lua"
sed -i 's#t77gcc/12"#t77gcc/13"#' "$W/mf-lua/t77gcc/13.lua"
cat > "$W/mf-tcl/t77gcc/12" <<EOF
#%Module
prepend-path PATH $SR/t77gcc/12/bin
puts stdout "$SW shadow [module-info mode] t77gcc/12;"
EOF
chmod -R a+rX "$W"
cc_is() { on runuser -u "$1" -- "$SR/t77gcc/12/bin/t77cc" 2>&1; }
pool_records() { on "$H" list 2>/dev/null | grep -c '"name": "t77gcc"' || true; }
cache_loops() { on sh -c "for f in $TB/local/root/cache/t77gcc-*; do [ -e \"\$f\" ] && losetup -j \"\$f\"; done; true" | grep -c loop || true; }
printf '#!/bin/sh\nSW_POOL_MOUNT_HELPER=%s SW_POOL_SYSTEM_CONFIG= exec %s -q slurm epilog\n' "$H" "$SW" > "$HOOK"
chmod 755 "$HOOK"
assert_eq "before: the original runs" "t77cc: the original on the shared file system" "$(cc_is "$U1")"

# job JOBNAME INIT: a job of user 1 on node1 that loads the module, waits for the test to look from
# outside, unloads, loads again, purges, loads again and ends with it loaded (the epilog's turn)
job() {
  local name=$1 init=$2 mp=$3
  cat > "$W/$name.sh" <<EOS
#!/bin/bash
$init
export SW_POOL_PATH=$S/pools SW_POOL_MOUNT_HELPER=$H SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= MODULEPATH=$mp
module load t77gcc/12
echo "LOADED: \$(t77cc)"
touch $W/$name.loaded
for i in \$(seq 1 600); do [ -e $W/$name.go ] && break; sleep 0.1; done
module unload t77gcc/12
echo "UNLOADED: \$($SR/t77gcc/12/bin/t77cc)"
module load t77gcc/12
echo "RELOADED: \$(t77cc)"
module purge
echo "PURGED: \$($SR/t77gcc/12/bin/t77cc)"
module load t77gcc/12
echo "AT_END: \$(t77cc)"
EOS
  chmod 755 "$W/$name.sh"
  local jid
  jid=$(as_user sbatch --parsable -w "$node" -N1 -o "$W/out/$name.out" --chdir=/tmp "$W/$name.sh")
  jobs_+=("$jid")
  wait_for 600 test -e "$W/$name.loaded"
  assert_eq "$name: module load: another user on the node runs the pool's copy (one mount for the node)" "t77cc: from the pool" "$(cc_is "$U2")"
  local opts
  opts=$(on awk -v m="$SR/t77gcc/12" '$5 == m {print $6}' /proc/self/mountinfo)
  assert_match "$name: the shadow is ro,nosuid,nodev" "^ro,nosuid,nodev" "$opts"
  touch "$W/$name.go"
  wait_job "$jid" 600
  local out
  out=$(cat "$W/out/$name.out" 2>/dev/null)
  echo "$out" | sed "s/^/  $name: /" | head -12
  assert_match "$name: module load t77gcc/12: the job runs the pool's copy" "LOADED: t77cc: from the pool" "$out"
  assert_match "$name: module unload: the original is back" "UNLOADED: t77cc: the original" "$out"
  assert_match "$name: module load again: the pool again" "RELOADED: t77cc: from the pool" "$out"
  assert_match "$name: module purge: the original is back" "PURGED: t77cc: the original" "$out"
  assert_match "$name: loaded again at the end of the job" "AT_END: t77cc: from the pool" "$out"
  wait_for 100 sh -c "[ \"\$($TESTBED/exec $node runuser -u $U2 -- $SR/t77gcc/12/bin/t77cc)\" = 't77cc: the original on the shared file system' ]"
  assert_eq "$name: the job ended with the module loaded: its epilog gave the original back" "t77cc: the original on the shared file system" "$(cc_is "$U2")"
  assert_eq "$name: ... and the helper holds nothing of the pool" "0 0" "$(pool_records) $(cache_loops)"
}

LMOD="source /usr/share/lmod/lmod/init/bash"
job lmod-lua "$LMOD" "$W/mf-lua"
job lmod-tcl "$LMOD" "$W/mf-tcl"
if [[ -f $MODULECMD ]]; then
  job envmod-tcl "unset -f module ml; module() { eval \"\$(tclsh $MODULECMD bash \"\$@\")\"; }" "$W/mf-tcl"
else
  skip "envmod-tcl: Environment Modules" "$MODULECMD missing (make setup unpacks it)"
fi

# --- what the helper did with the other two packages of the pool (from a mount --shadow by hand)
rc=0; out=$(on runuser -u "$U1" -- env SW_POOL_PATH="$S/pools" SW_POOL_MOUNT_HELPER="$H" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$SW" mount --shadow --json t77gcc/12 2>&1) || rc=$?
assert_eq "mount --shadow t77gcc/12 by hand" 0 "$rc"
assert_match "... a package whose original is a symlink (to /etc) is not shadowed" "t77sym/1: it is a symlink or not a directory" "$out"
assert_match "... a package without an original is left alone" '"no_original": \[[^]]*"t77zlib/1.3"' "$out"
assert_eq "... /etc is untouched" "0" "$(on sh -c "ls /etc | grep -c '^from-pool\$' || true")"
rc=0; on runuser -u "$U1" -- env SW_POOL_MOUNT_HELPER="$H" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$SW" umount -q --shadow t77gcc/12 || rc=$?
assert_eq "umount --shadow t77gcc/12: released, the original is back" "0 t77cc: the original on the shared file system" "$rc $(cc_is "$U2")"

# --- a modulefile whose pool does not exist: module load works, from the original, with a warning
cat > "$W/missing.sh" <<EOS
#!/bin/bash
$LMOD
export SW_POOL_PATH=$S/pools SW_POOL_MOUNT_HELPER=$H SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= MODULEPATH=$W/mf-lua
module load t77gcc/13 && echo "LOAD STATUS 0"
echo "RUNS: \$(t77cc)"
module unload t77gcc/13 && echo "UNLOAD STATUS 0"
EOS
chmod 755 "$W/missing.sh"
jid=$(as_user sbatch --parsable -w "$node" -N1 -o "$W/out/missing.out" --chdir=/tmp "$W/missing.sh"); jobs_+=("$jid")
wait_job "$jid" 600
out=$(cat "$W/out/missing.out" 2>/dev/null)
assert_match "missing pool: module load still succeeds" "LOAD STATUS 0" "$out"
assert_match "... and says the original is used" "t77gcc/13 is not shadow-mounted: .*no such pool.*the module uses the original installation" "$out"
assert_match "... which runs" "RUNS: t77cc: the original" "$out"
assert_match "... module unload succeeds" "UNLOAD STATUS 0" "$out"

# --- without the helper: a private shadow in one environment of the user's
as1() { on runuser -u "$U1" -- env SW_POOL_PATH="$S/pools" SW_POOL_MOUNT_HELPER= SW_POOL_SHADOW_ROOT="$SR" SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$@"; }
rc=0; out=$(as1 "$SW" run --shadow t77gcc/12 -- t77cc 2>&1) || rc=$?
assert_eq "run --shadow of a pool not loaded: refused (125)" 125 "$rc"
assert_match "... saying to load it first" "not loaded on $node: run .sw-pool load t77gcc/12. first" "$out"
as1 "$SW" mount -q t77gcc/12 >/dev/null
rc=0; out=$(as1 "$SW" run --shadow t77gcc/12 -- "$SR/t77gcc/12/bin/t77cc" 2>&1) || rc=$?
assert_eq "run --shadow t77gcc/12 (no helper): the pool's copy inside the environment" "0 t77cc: from the pool" "$rc $out"
assert_eq "... while outside it the original stays" "t77cc: the original on the shared file system" "$(cc_is "$U2")"
rc=0; out=$(as1 "$SW" run --shadow t77gcc/12 -- sh -c "ls $SR/t77sym/1/ | grep -c from-pool || true" 2>&1) || rc=$?
assert_match "... a symlinked original is not followed" "^0$" "$out"
as1 "$SW" umount -q t77gcc/12
assert_eq "nothing of the test mounted on $node" 0 "$(on awk -v a="$SR/" 'index($5, a) == 1' /proc/self/mountinfo | wc -l)"
finish
