#!/usr/bin/env bash
# make demo: build a sample pool with two real packages (a C program compiled now, and a shell
# script), inspect it, mount it with squashfuse_ll and use its packages through Lmod.
set -euo pipefail
cd "$(dirname "$0")/.."
SW=$PWD/target/release/sw-pool
WORK=${DEMO_DIR:-/var/tmp/sw-pool-demo}
rm -rf "$WORK"; mkdir -p "$WORK"
MNT=$WORK/mnt
cleanup() { mountpoint -q "$MNT/demo/1.0" 2>/dev/null && fusermount3 -u "$MNT/demo/1.0"; true; }
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "sw-pool init: a pool tree for demo/1.0"
"$SW" init --name demo --version 1.0 --description "sw-pool demo pool" "$WORK/demo"

say "two packages: hello (a script) and cfact (C, compiled now)"
mkdir -p "$WORK/demo/install/hello/1.0/bin" "$WORK/demo/install/cfact/2.0/bin" "$WORK/demo/source/cfact"
cat > "$WORK/demo/install/hello/1.0/bin/hello" <<'EOS'
#!/bin/sh
echo "hello from $(hostname), pool ${SW_POOL_MOUNT:-?}"
EOS
chmod 755 "$WORK/demo/install/hello/1.0/bin/hello"
cat > "$WORK/demo/source/cfact/cfact.c" <<'EOS'
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10, f = 1;
    for (long i = 2; i <= n; i++) f *= i;
    printf("%ld! = %ld\n", n, f);
    return 0;
}
EOS
cc -O2 -o "$WORK/demo/install/cfact/2.0/bin/cfact" "$WORK/demo/source/cfact/cfact.c"

say "sw-pool build --gen-modulefiles demo-1.0.sqfs demo"
"$SW" -v build --gen-modulefiles "$WORK/demo-1.0.sqfs" "$WORK/demo"

say "sw-pool inspect demo-1.0.sqfs"
"$SW" inspect "$WORK/demo-1.0.sqfs"

say "the paper's build: sw-pool build -s 1020MB test-pool.ext2 test-pool (with a 64 MB random file here)"
mkdir -p "$WORK/test-pool"
head -c 64MB /dev/urandom > "$WORK/test-pool/random.data"
(cd "$WORK" && "$SW" build -q -s 1020MB test-pool.ext2 test-pool)
"$SW" inspect "$WORK/test-pool.ext2" | sed -n '1,6p'
ls -ls "$WORK/test-pool.ext2" | awk '{printf "on disk: %d KiB allocated for a %d-byte sparse file\n", $1, $6}'

say "mount with squashfuse_ll and use the packages through Lmod"
mkdir -p "$MNT/demo/1.0"
squashfuse_ll "$WORK/demo-1.0.sqfs" "$MNT/demo/1.0"
SW_POOL_MOUNT=$MNT bash -c '
  source /usr/share/lmod/lmod/init/bash
  export MODULEPATH=$SW_POOL_MOUNT/demo/1.0/modulefiles
  module avail 2>&1
  module load hello/1.0 cfact/2.0
  hello
  cfact 12
'
fusermount3 -u "$MNT/demo/1.0"
say "demo done: nothing left mounted"
! grep -q " $MNT" /proc/self/mounts
