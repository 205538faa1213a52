#!/usr/bin/env bash
# sw-pool bundle on the virtual cluster: a program installed on shared storage (RUNPATH
# $ORIGIN libraries, Debian's libz, a dlopen()ed plugin) is bundled with --trace into a pool; the
# original installation is then made unreadable, and a Slurm job of the unprivileged user loads the
# pool on 4 nodes (sw-pool load), module-loads the package and runs it, plugin included, on every
# node: the loader resolves every library inside the mounted pool, nothing from shared storage.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
command -v patchelf >/dev/null || { fail "patchelf installed" "make setup"; finish; }
uid=$(id -u "$TB_USER")
W=$TB/scratch/t50-$$
E=$TB/export/t50-$$          # the storage server's disk; nodes see it as $TB/shared/t50-$$
S=$TB/shared/t50-$$
cleanup() {
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "awk '\$3 ~ /^fuse/ && \$2 ~ \"^/tmp/sw-pool-$uid/\" {print \$2}' /proc/self/mounts | while read -r m; do fusermount3 -u -z \"\$m\" || umount -l \"\$m\"; done; rm -rf /tmp/sw-pool-$uid" >/dev/null 2>&1 || true
  done
  chmod -R u+rwX "$E" 2>/dev/null || true
  rm -rf "$W" "$E" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
mkdir -p "$W/bin" "$W/src" "$W/out" "$E/app/bin" "$E/app/lib" "$E/app/plugins" "$E/pools/app"
chmod 1777 "$W/out"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
SW=$W/bin/sw-pool

# --- the installation on shared storage
cat > "$W/src/a.c" <<'C'
#include <zlib.h>
int a_fn(void){ return (int)zlibVersion()[0]; }
C
printf 'int a_fn(void);\nint b_fn(void){ return a_fn()+1; }\n' > "$W/src/b.c"
printf 'int plug_fn(void){ return 42; }\n' > "$W/src/plug.c"
cat > "$W/src/main.c" <<'C'
#include <stdio.h>
#include <dlfcn.h>
#include <unistd.h>
int b_fn(void);
int main(void) {
  char h[64]; gethostname(h, sizeof h);
  void *p = dlopen("libplug.so", RTLD_NOW);
  if (!p) { fprintf(stderr, "%s: dlopen: %s\n", h, dlerror()); return 3; }
  int (*f)(void) = (int (*)(void))dlsym(p, "plug_fn");
  printf("%s b=%d plug=%d\n", h, b_fn(), f());
  return 0;
}
C
(
  cd "$E/app"
  gcc -shared -fPIC -o lib/liba.so.1 -Wl,-soname,liba.so.1 "$W/src/a.c" -lz
  gcc -shared -fPIC -o lib/libb.so.1 -Wl,-soname,libb.so.1 "$W/src/b.c" -Llib -l:liba.so.1 -Wl,--enable-new-dtags,-rpath,'$ORIGIN'
  gcc -shared -fPIC -o plugins/libplug.so "$W/src/plug.c"
  gcc -o bin/prog "$W/src/main.c" -Llib -l:libb.so.1 -ldl -Wl,--enable-new-dtags,-rpath,'$ORIGIN/../lib:$ORIGIN/../plugins' -Wl,-rpath-link,lib
)
chmod -R a+rX "$E"
out=$("$TESTBED/exec" node1 runuser -u "$TB_USER" -- "$S/app/bin/prog" 2>&1) && rc=0 || rc=$?
assert_match "the original runs from shared storage on node1" "node1 b=50 plug=42" "$out"

# --- bundle it (traced, so the plugin comes along) into a pool on shared storage
out=$("$SW" bundle --name app --version 1.0 -o "$E/pools/app/1.0.sqfs" "$E/app/bin/prog" --trace -- "$E/app/bin/prog" 2>&1) && rc=0 || rc=$?
assert_eq "sw-pool bundle --trace -o app/1.0.sqfs exits 0" 0 "$rc"
echo "  $out"
list=$(unsquashfs -l "$E/pools/app/1.0.sqfs" 2>/dev/null || true)
for f in bin/prog lib/libb.so.1 lib/liba.so.1 lib/libz.so.1 lib/libplug.so bundle.json; do
  assert_match "the pool holds install/app/1.0/$f" "install/app/1.0/$f" "$list"
done
assert_match "the pool has the generated modulefile" "modulefiles/app/1.0.lua" "$list"

# --- the original becomes unreadable for the job's user
chmod 000 "$E/app"
out=$("$TESTBED/exec" node2 runuser -u "$TB_USER" -- ls "$S/app" 2>&1) && rc=0 || rc=$?
assert_match "the original installation is unreadable on the nodes" "Permission denied" "$out"
out=$("$TESTBED/exec" node2 runuser -u "$TB_USER" -- "$S/app/bin/prog" 2>&1) && rc=0 || rc=$?
assert_eq "the original program cannot run any more" 1 "$([[ $rc != 0 ]] && echo 1 || echo 0)"

# --- a Slurm job of the unprivileged user: load the pool on 4 nodes, module load, run everywhere
cat > "$W/job.sh" <<EOS
#!/bin/bash
set -e
source /usr/share/lmod/lmod/init/bash
export PATH=$W/bin:\$PATH SW_POOL_PATH=$S/pools SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG=
unset XDG_RUNTIME_DIR SW_POOL_STATE_DIR MODULEPATH LD_LIBRARY_PATH
code=\$(srun --mpi=pmix -n4 -N4 --ntasks-per-node=1 sw-pool load app/1.0)
eval "\$code"
module load app/1.0
echo "PROG=\$(command -v prog)"
srun -N4 --ntasks-per-node=2 prog
srun -n4 -N4 --ntasks-per-node=1 bash -c '/lib64/ld-linux-x86-64.so.2 --list \$(command -v prog) | sed "s/^/LIST \$(hostname) /"'
srun -n4 -N4 --ntasks-per-node=1 bash -c 'strace -f -qq -e trace=%file -o /tmp/t50-trace.\$\$ prog >/dev/null; grep -c "$S/app" /tmp/t50-trace.\$\$ | sed "s/^/ORIGOPENS \$(hostname) /"; rm -f /tmp/t50-trace.\$\$'
code=\$(srun --mpi=pmix -n4 -N4 --ntasks-per-node=1 sw-pool unload app/1.0)
eval "\$code"
EOS
chmod 755 "$W/job.sh"
jid=$(as_user sbatch --parsable -N4 --ntasks-per-node=2 -o "$W/out/job-%j.out" --chdir=/tmp "$W/job.sh")
wait_job "$jid" 1800
out=$(cat "$W/out/job-$jid.out" 2>/dev/null || true)
echo "$out" | grep -v '^LIST' | sed 's/^/  job: /' | head -30
assert_match "job: prog comes from the mounted pool" "PROG=/tmp/sw-pool-$uid/mnt/app/1.0/install/app/1.0/bin/prog" "$out"
for n in "${nodes[@]}"; do
  assert_eq "job: $n runs the bundled program with its plugin (2 ranks)" 2 "$(grep -c "^$n b=50 plug=42$" <<< "$out" || true)"
  bad=$(grep "^LIST $n " <<< "$out" | grep '=>' | grep -v -E "=> /tmp/sw-pool-$uid/mnt/app/1.0/|libc\.so\.6" || true)
  assert_eq "job: on $n every library but libc resolves inside the pool" "" "$bad"
  assert_eq "job: on $n the run opens nothing under the original installation" "ORIGOPENS $n 0" "$(grep "^ORIGOPENS $n " <<< "$out" || echo "ORIGOPENS $n ?")"
done
finish
