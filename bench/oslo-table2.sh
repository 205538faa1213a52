#!/usr/bin/env bash
# Seed 002's (the Oslo disk-image study's) Table 2, second row, on the virtual cluster: a `make -j1`
# build whose compiler is taken from different places, the sources and the build always on
# node1's local disk ("the improvement came solely from the gcc startup time"). The seed compiled
# Open MPI 1.10.2 (~7,000 files) with gcc 6.1.0 (~5,500 files); with no network here the project
# is generated: N C files (default 300) that include the usual libc headers, and one link.
#
# The compiler: Debian's gcc 12 installation copied into a prefix (bin/gcc, bin/as, bin/ld, the
# whole lib/gcc/x86_64-linux-gnu/12 with cc1 and collect2, and the shared libraries cc1, as and ld
# load, in lib/ on LD_LIBRARY_PATH): 237 files, 168 MiB. It runs relocated (gcc finds cc1 beside
# itself). Places, cold page cache before every build:
#   local          the prefix on node1's disk
#   shared         the prefix on the shared storage (sshfs, the testbed's throttled server)
#   pool-fuse      a squashfs pool of it, `sw-pool mount` (verified node-local copy, squashfuse_ll)
#   pool-kernel    the same pool through the site's helper (root's verified copy, kernel squashfs)
# For the two pools the one-off time to bring the pool to the node and mount it is reported
# apart (it is paid once per node and job, not per compile). One run, ratios; not a timed test.
#
#   bench/oslo-table2.sh [--files N]
#
# Needs: the testbed up (testbed/up), sw-pool and sw-pool-mount-helper built, gcc-12 and binutils
# (Debian's build-essential). Writes bench/results/oslo-table2-<date>/{table2.csv,report.md}.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
NFILES=300
while [[ $# -gt 0 ]]; do
  case $1 in
    --files) NFILES=$2; shift 2 ;;
    *) die "usage: bench/oslo-table2.sh [--files N]" ;;
  esac
done
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$REPO/bench/results/oslo-table2-$STAMP
mkdir -p "$OUT"
. "$TESTBED/env.sh"
"$TESTBED/status" -q || die "the testbed is not up (testbed/up)"
SW=$REPO/target/release/sw-pool
HB=$REPO/target/release/sw-pool-mount-helper
built_from_tree "$SW" "$HB" || exit 1
GCC=/usr/bin/x86_64-linux-gnu-gcc-12
GDIR=/usr/lib/gcc/x86_64-linux-gnu/12
[[ -x $GCC && -x $GDIR/cc1 ]] || die "gcc-12 is not installed (apt-get install gcc-12 binutils)"
H=$TB/sbin/sw-pool-mount-helper
install -m 0755 "$HB" "$H"
N=node1
on() { "$TESTBED/exec" "$N" sh -c "$1"; }
B=oslo2-$$
L=$TB/local/$B            # node1's disk
E=$TB/export/$B           # the storage server's disk, seen by the nodes as:
S=$TB/shared/$B
KEY=$TB/etc/sw-pool/trusted-keys/$B.pem
SWE=(env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$L/state" SW_POOL_CACHE="$L/cache")
cleanup() {
  on "mountpoint -q '$L/mnt' 2>/dev/null && ${SWE[*]} '$SW' umount -q '$L/mnt'; '$H' release-pool $B/12 >/dev/null 2>&1; '$H' cleanup >/dev/null 2>&1; rm -rf '$L' $TB/local/root/cache/$B-*" >/dev/null 2>&1 || true
  rm -rf "$E" "$KEY"
}
trap cleanup EXIT
mkdir -p "$E/t" && chmod 755 "$E"

# --- the compiler prefix, as a pool tree, on the storage server's disk (for `shared`) and built
P=$E/t/install/gcc/12
mkdir -p "$P/bin" "$P/lib/gcc/x86_64-linux-gnu"
cp "$GCC" "$P/bin/gcc"
cp "$(readlink -f /usr/bin/as)" "$P/bin/as"
cp "$(readlink -f /usr/bin/ld)" "$P/bin/ld"
cp -a "$GDIR" "$P/lib/gcc/x86_64-linux-gnu/"
for prog in "$GDIR/cc1" "$GDIR/collect2" /usr/bin/as /usr/bin/ld; do
  ldd "$(readlink -f "$prog")" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|ld-linux[^/]*)\.so' | while read -r so; do cp -L "$so" "$P/lib/"; done
find "$P" -xtype l -delete   # links to the runtime libraries outside the prefix (libasan.so, ...)
"$SW" init -q --name "$B" --version 12 "$OUT/pt" >/dev/null
cp "$OUT/pt/pool.toml" "$E/t/"
rm -rf "$OUT/pt"
FILES=$(find "$P" -type f | wc -l) BYTES=$(du -sb --apparent-size "$P" | cut -f1)
"$SW" build -q "$E/gcc.pool" "$E/t"
"$SW" keygen --out "$OUT/site" >/dev/null
cp "$OUT/site.pub.pem" "$KEY"
"$SW" sign -q --key "$OUT/site.pem" "$E/gcc.pool"
chmod -R a+rX "$E"

# --- the project: NFILES C files on node1's disk
on "mkdir -p '$L/proj/src' '$L/state' '$L/cache' && chmod 700 '$L/state'"
python3 - "$TB/nodes/$N/local/$B/proj" "$NFILES" <<'PY'
import os, sys
d, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    with open(os.path.join(d, "src", f"f{i:04}.c"), "w") as f:
        f.write(f"""#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
double f{i}_a(const double *v, size_t n) {{ double s = 0; for (size_t k = 0; k < n; k++) s += sqrt(fabs(v[k])) * {i + 1}; return s; }}
int f{i}_b(const char *s) {{ char buf[64]; snprintf(buf, sizeof buf, "%s-{i}", s); return (int)strlen(buf); }}
void *f{i}_c(size_t n) {{ void *p = malloc(n ? n : 1); if (p) memset(p, {i % 256}, n); return p; }}
""")
with open(os.path.join(d, "src", "main.c"), "w") as f:
    f.write("#include <stdio.h>\nint f0_b(const char *);\nint main(void) { printf(\"%d\\n\", f0_b(\"x\")); return 0; }\n")
with open(os.path.join(d, "Makefile"), "w") as f:
    f.write("SRCS := $(wildcard src/*.c)\nOBJS := $(SRCS:.c=.o)\nprog: $(OBJS)\n\t$(CC) -o $@ $(OBJS) -lm\n"
            "%.o: %.c\n\t$(CC) -O2 -c -o $@ $<\nclean:\n\trm -f prog src/*.o\n")
PY
echo "config,op,seconds,files,bytes,compiles" > "$OUT/table2.csv"
row() { echo "$1,$2,$3,$FILES,$BYTES,$((NFILES + 2))" >> "$OUT/table2.csv"; printf '  %-12s %-8s %8s s\n' "$1" "$2" "$3"; }
build_with() {  # CONFIG PREFIX: make -j1 with the compiler in PREFIX, cold caches
  on "cd '$L/proj' && make -s clean"
  drop
  local t; t=$(now)
  on "cd '$L/proj' && PATH='$2/bin':/usr/bin:/bin LD_LIBRARY_PATH='$2/lib' make -s -j1 CC='$2/bin/gcc' && ./prog" > "$OUT/last.out" 2>&1 \
    || { cat "$OUT/last.out" >&2; die "$1: the build failed"; }
  row "$1" make "$(sub "$t" "$(now)")"
  [[ $(tail -1 "$OUT/last.out") == 3 ]] || die "$1: the program built does not run right: $(tail -1 "$OUT/last.out")"
}

log "Table 2 (second row) of seed 002 on $N: make -j1 of $NFILES C files, gcc 12 ($FILES files, $BYTES bytes) -> $OUT"
cp -a "$P" "$TB/nodes/$N/local/$B/gcc"   # node1's disk, from the host's side
build_with local "$L/gcc"
build_with shared "$S/t/install/gcc/12"

drop; t=$(now)
on "mkdir -p '$L/mnt' && ${SWE[*]} '$SW' mount -q '$S/gcc.pool' '$L/mnt'"
row pool-fuse mount "$(sub "$t" "$(now)")"
build_with pool-fuse "$L/mnt/install/gcc/12"
on "${SWE[*]} '$SW' umount -q '$L/mnt'"

drop; t=$(now)
on "'$H' mount-pool '$S/gcc.pool' >/dev/null"
row pool-kernel mount "$(sub "$t" "$(now)")"
build_with pool-kernel "$TB/local/root/site/$B/12/install/gcc/12"
on "'$H' release-pool '$B/12' >/dev/null"

python3 - "$OUT/table2.csv" > "$OUT/report.md" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
t = {(r["config"], r["op"]): float(r["seconds"]) for r in rows}
r0 = rows[0]
print(f"# Seed 002 Table 2, second row, on the testbed: make -j1, {r0['compiles']} compiler runs, gcc 12 "
      f"({r0['files']} files, {int(r0['bytes']) / 2**20:.0f} MiB) from each place\n")
print("| compiler in | make -j1 (s) | ÷ local | ÷ shared | pool to node + mount, once (s) |")
print("|---|---:|---:|---:|---:|")
for c in ["local", "shared", "pool-fuse", "pool-kernel"]:
    if (c, "make") not in t:
        continue
    m = t[(c, "make")]
    mount = f"{t[(c, 'mount')]:.2f}" if (c, "mount") in t else "—"
    print(f"| {c} | {m:.2f} | {m / t[('local', 'make')]:.2f} | {m / t[('shared', 'make')]:.2f} | {mount} |")
print("\nSeed 002 (Open MPI 1.10.2, gcc 6.1.0): HDD 760 s, image on BeeGFS 788 s (1.04 × HDD), "
      "native BeeGFS 1228 s (1.62 × HDD; the image 0.64 × BeeGFS).")
PY
rm -f "$OUT/last.out" "$OUT/site.pem"
cat "$OUT/report.md"
log "report: $OUT/report.md"
