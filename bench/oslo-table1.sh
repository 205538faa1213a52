#!/usr/bin/env bash
# Seed 002's (the Oslo disk-image study's) Table 1 on the virtual cluster, with the kernel paths of
# the mount helper: the Linux kernel source from Debian's linux-source package, on node1,
#   untar      tar --no-same-owner -m -xJf linux-source-*.tar.xz (the tarball on the node's local disk;
#              -m and --no-same-owner everywhere: sshfs cannot set times or owners of symlinks)
#   md5-each   find . -type f -exec md5sum {} \;   (the seed's workload: one process per file)
#   md5-batch  find . -type f -exec md5sum {} +
#   rm         rm -rf
# in these places (cold page cache before every step):
#   local          node-local disk
#   shared         the shared storage (sshfs, the testbed's throttled server)
#   image-fuse2fs  a user image on shared storage, mounted read-write by fuse2fs (sw-pool mount --rw)
#   image-kernel   the same image mounted read-write by the kernel (sw-pool-mount-helper mount-image)
# and, read-only (md5 steps only), the tree built into a pool:
#   pool-squashfuse  squashfs pool, sw-pool mount (verified cache copy, squashfuse_ll)
#   pool-squashfs    squashfs pool, kernel (sw-pool-mount-helper mount-pool: root's verified copy)
#   pool-erofs       EROFS pool, kernel (the helper)
# plus P4: sha256sum of a 1 GiB file through the helper's kernel squashfs mount of a pool ÷ the same file on
# local disk. One run (this is a 2-core VM: single runs, ratios), not a timed test.
#
#   bench/oslo-table1.sh [--subset PATH] [--p4-only]   e.g. --subset drivers/net for a short check
#
# Needs: the testbed up (testbed/up), sw-pool and sw-pool-mount-helper built, linux-source-6.1
# (installed here if missing). Writes bench/results/oslo-table1-<date>/{table1.csv,report.md}.
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
SUBSET='' P4_ONLY=''
while [[ $# -gt 0 ]]; do
  case $1 in
    --subset) SUBSET=$2; shift 2 ;;
    --p4-only) P4_ONLY=1; shift ;;
    *) die "usage: bench/oslo-table1.sh [--subset PATH] [--p4-only]" ;;
  esac
done
. "$TESTBED/env.sh"
"$TESTBED/status" -q || die "the testbed is not up (testbed/up)"
SW=$REPO/target/release/sw-pool
HB=$REPO/target/release/sw-pool-mount-helper
built_from_tree "$SW" "$HB" || exit 1
TARBALL=$(find /usr/src -maxdepth 1 -name "linux-source-*.tar.xz" | sort -V | tail -1)
if [[ -z $TARBALL ]]; then
  apt-get install -y -qq --no-install-recommends linux-source-6.1 >/dev/null
  TARBALL=$(find /usr/src -maxdepth 1 -name "linux-source-*.tar.xz" | sort -V | tail -1)
fi
H=$TB/sbin/sw-pool-mount-helper
install -m 0755 "$HB" "$H"
N=node1
on() { "$TESTBED/exec" "$N" sh -c "$1"; }
STAMP=$(date +%Y%m%d-%H%M%S)
OUT=$REPO/bench/results/oslo-table1-$STAMP
mkdir -p "$OUT"
B=oslo1-$$
L=$TB/local/$B            # node1's disk
E=$TB/export/$B           # the storage server's disk, seen by the nodes as:
S=$TB/shared/$B
UM=$TB/local/root/users/root   # the helper's user mount root for root
KEY=$TB/etc/sw-pool/trusted-keys/$B.pem
SWE=(env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= SW_POOL_STATE_DIR="$L/state" SW_POOL_CACHE="$L/cache")
cleanup() {
  on "for m in $UM/$B-* $L/mnt-*; do mountpoint -q \$m 2>/dev/null && umount -l \$m; done; true" >/dev/null 2>&1 || true
  on "'$H' release-pool $B-sqfs/1 >/dev/null 2>&1; '$H' release-pool $B-erofs/1 >/dev/null 2>&1; '$H' release-pool $B-p4/1 >/dev/null 2>&1; '$H' release-pool $B-p4e/1 >/dev/null 2>&1; '$H' cleanup >/dev/null 2>&1; rm -rf '$L' $UM/$B-* $TB/local/root/cache/$B-*" >/dev/null 2>&1 || true
  rm -rf "$E" "$KEY"
}
trap cleanup EXIT
mkdir -p "$E" && chmod 755 "$E"
on "mkdir -p '$L' '$L/state' '$L/cache' && chmod 700 '$L/state' && cp '$TARBALL' '$L/src.tar.xz'"
MEMBER=
if [[ -n $SUBSET ]]; then
  top=$(basename "$TARBALL" .tar.xz)   # Debian's tarball holds linux-source-X.Y/
  MEMBER="$top/$SUBSET"
fi
echo "config,op,seconds,files,bytes" > "$OUT/table1.csv"
row() { echo "$1,$2,$3,${FILES:-},${BYTES:-}" >> "$OUT/table1.csv"; printf '  %-16s %-10s %8s s\n' "$1" "$2" "$3"; }
MD5_EACH="find . -type f -exec md5sum {} \\; | LC_ALL=C sort -k2 | md5sum"
MD5_BATCH="find . -type f -exec md5sum {} + | LC_ALL=C sort -k2 | md5sum"
timed() {  # CONFIG OP SHELL-CMD: cold caches, run on node1, record the wall time
  drop
  local t; t=$(now)
  on "$3" > "$OUT/last.out" 2>&1 || { cat "$OUT/last.out" >&2; die "$1 $2 failed"; }
  row "$1" "$2" "$(sub "$t" "$(now)")"
}
check_hash() {  # CONFIG: the md5 of every file matches the local tree's
  local h; h=$(grep -o '^[0-9a-f]\{32\}' "$OUT/last.out" | tail -1)
  [[ $h == "$REF" ]] || die "$1: the files differ from the local tree's ($h, want $REF)"
}
untar_into() { echo "mkdir -p '$1' && cd '$1' && tar --no-same-owner -m -xJf '$L/src.tar.xz' $MEMBER"; }
rw_steps() {  # CONFIG DIR
  timed "$1" untar "$(untar_into "$2")"
  timed "$1" md5-each "cd '$2' && $MD5_EACH"; check_hash "$1"
  timed "$1" md5-batch "cd '$2' && $MD5_BATCH"; check_hash "$1"
  timed "$1" rm "rm -rf '$2'/*"
}

if [[ -z $P4_ONLY ]]; then
log "Table 1 of seed 002 on $N: $(basename "$TARBALL")${SUBSET:+ (subset $SUBSET)} -> $OUT"
# the reference: the tree on local disk, and its count, size and md5
on "$(untar_into "$L/ref")" >/dev/null
FILES=$(on "find '$L/ref' -type f | wc -l")
BYTES=$(on "du -sb --apparent-size '$L/ref' | cut -f1")
REF=$(on "cd '$L/ref' && $MD5_BATCH" | cut -d' ' -f1)
log "  $FILES files, $BYTES bytes"

rw_steps local "$L/t"
rw_steps shared "$S/t"

# a user image on shared storage, sized for the tree and its many small files
on "'$SW' image create -q --size $(( BYTES * 2 / 1048576 + 512 ))M --small-files '$S/img.ext4'"
on "mkdir -p '$L/mnt-img'"
on "${SWE[*]} '$SW' mount -q --rw '$S/img.ext4' '$L/mnt-img'"
rw_steps image-fuse2fs "$L/mnt-img"
on "${SWE[*]} '$SW' umount -q '$L/mnt-img'"
on "mkdir -p '$UM/$B-img' && '$H' mount-image --rw '$S/img.ext4' '$UM/$B-img' >/dev/null"
rw_steps image-kernel "$UM/$B-img"
on "'$H' umount '$UM/$B-img' >/dev/null"
on "e2fsck -fn '$S/img.ext4' >/dev/null" || die "the image is not fsck-clean after the runs"

# pools of the tree: squashfs (FUSE and kernel) and EROFS (kernel), signed by a site key
"$SW" keygen --out "$OUT/site" >/dev/null   # a site key for this run (its private half is removed at the end)
cp "$OUT/site.pub.pem" "$KEY"
on "'$SW' init -q --name $B-sqfs --version 1 '$L/pt' >/dev/null && cp -a '$L/ref/.' '$L/pt/install/'"
for f in sqfs erofs; do
  fmt=squashfs; [[ $f == erofs ]] && fmt=erofs
  t=$(now)
  on "sed -i 's/^name = .*/name = \"$B-$f\"/' '$L/pt/pool.toml' && '$SW' build -q --format $fmt '$L/$f.pool' '$L/pt'"
  mv "$TB/nodes/$N/local/$B/$f.pool" "$E/$f.pool"   # onto the storage server's disk
  log "  built the $fmt pool in $(sub "$t" "$(now)") s ($(stat -c %s "$E/$f.pool") bytes)"
  "$SW" sign -q --key "$OUT/site.pem" "$E/$f.pool"
  chmod 644 "$E/$f.pool"
done
on "mkdir -p '$L/mnt-sqfs' && ${SWE[*]} '$SW' mount -q '$S/sqfs.pool' '$L/mnt-sqfs'"
for op in md5-each md5-batch; do
  cmd=$MD5_EACH; [[ $op == md5-batch ]] && cmd=$MD5_BATCH
  timed pool-squashfuse "$op" "cd '$L/mnt-sqfs/install' && $cmd"; check_hash pool-squashfuse
done
on "${SWE[*]} '$SW' umount -q '$L/mnt-sqfs'"
for f in sqfs erofs; do
  name=pool-squashfs; [[ $f == erofs ]] && name=pool-erofs
  on "'$H' mount-pool '$S/$f.pool' >/dev/null"
  for op in md5-each md5-batch; do
    cmd=$MD5_EACH; [[ $op == md5-batch ]] && cmd=$MD5_BATCH
    timed "$name" "$op" "cd '$TB/local/root/site/$B-$f/1/install' && $cmd"; check_hash "$name"
  done
  on "'$H' release-pool '$B-$f/1' >/dev/null"
done

fi  # --p4-only

# P4: sha256 of 1 GiB of random data through the helper's kernel mounts of a pool (squashfs and
# EROFS, both --no-compress: the data does not compress, and mkfs.erofs -zlz4hc of it ran over
# 6.5 min) vs the same file on local disk
[[ -e $OUT/site.pem ]] || "$SW" keygen --out "$OUT/site" >/dev/null
cp "$OUT/site.pub.pem" "$KEY"
on "rm -rf '$L/ref' '$L/pt' && '$SW' init -q --name $B-p4 --version 1 '$L/p4' >/dev/null && head -c 1G /dev/urandom > '$L/p4/install/big'"
for f in p4 p4e; do
  fmt=squashfs; [[ $f == p4e ]] && fmt=erofs
  t=$(now)
  on "sed -i 's/^name = .*/name = \"$B-$f\"/' '$L/p4/pool.toml' && '$SW' build -q --no-compress --format $fmt '$L/$f.pool' '$L/p4'"
  log "  built the 1 GiB $fmt pool (--no-compress) in $(sub "$t" "$(now)") s"
  mv "$TB/nodes/$N/local/$B/$f.pool" "$E/$f.pool"
  "$SW" sign -q --key "$OUT/site.pem" "$E/$f.pool"; chmod 644 "$E/$f.pool"
  on "'$H' mount-pool '$S/$f.pool' >/dev/null"
done
FILES=1 BYTES=1073741824
for _ in 1 2 3; do
  timed p4-local sha256 "sha256sum '$L/p4/install/big'"
  timed p4-kernel-squashfs sha256 "sha256sum '$TB/local/root/site/$B-p4/1/install/big'"
  timed p4-kernel-erofs sha256 "sha256sum '$TB/local/root/site/$B-p4e/1/install/big'"
done
on "'$H' release-pool '$B-p4/1' >/dev/null; '$H' release-pool '$B-p4e/1' >/dev/null"

# the report: ratios
python3 "$REPO/bench/oslo_report.py" "$OUT/table1.csv" > "$OUT/report.md"
rm -f "$OUT/last.out" "$OUT/site.pem"
cat "$OUT/report.md"
log "report: $OUT/report.md"
