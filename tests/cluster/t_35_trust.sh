#!/usr/bin/env bash
# The trust tamper matrix through a real 4-node `sw-pool load --require-signature` (mpirun, one rank
# per node), with each tampered copy on shared storage: a flipped byte at 20 pseudo-random offsets of
# the image (file-system metadata and file data), in the manifest (caught by the footer hash, and a
# rewritten manifest with a valid footer, caught by the signature), in the signature, a damaged
# signature block, a signature made by another key under the trusted key's name, a pool re-signed by
# an untrusted key, truncated by one byte and by one chunk, bytes appended, the signed manifest of
# another pool of the same size swapped in, an unsigned pool. For every case: every rank exits
# non-zero, the output names what failed (and the chunk offset and node where data is damaged),
# nothing is cached (no entry, no temporary) and nothing is mounted on any node, and the cases the
# trust policy refuses read (almost) nothing from shared storage ("before any byte is broadcast").
# Then the properly signed pool loads and unloads; two cases that are not refusals by design are
# pinned down: a flipped byte inside an all-zero chunk (such chunks never move: the nodes get the
# signed image) and a POOL.sig of another pool beside the file (load checks the trailer's signature,
# never POOL.sig; `sw-pool verify --detached` does).
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
read -r -a nodes <<< "$TB_NODES"
[[ ${#nodes[@]} -ge 4 ]] || { fail "4 nodes" "the testbed has only ${#nodes[@]} nodes"; finish; }
nodes=("${nodes[@]:0:4}")
SW=$REPO/target/release/sw-pool
[[ -x $SW ]] || { fail "sw-pool built" "$SW missing (cargo build --release)"; finish; }
W=$TB/scratch/t35-$$          # keys, the binary, helper files (fast scratch, visible on every node)
E=$TB/export/t35-$$           # the storage server's disk; nodes see it as $TB/shared/t35-$$
S=$TB/shared/t35-$$
MNT=$TB/local/t35mnt-$$       # node-local (each node's own $TB/local)
CACHE=$TB/local/t35cache-$$
CACHEB=$TB/local/t35cacheb-$$ CACHEC=$TB/local/t35cachec-$$   # fresh caches for the last two loads
cleanup() {
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "awk '\$3 ~ /^fuse/ && \$2 ~ \"^$TB/local/t35(mnt|cache)[a-z0-9]*-$$\" {print \$2}' /proc/self/mounts | while read -r m; do fusermount3 -u -z \"\$m\" || umount -l \"\$m\"; done; rm -rf $TB/local/t35mnt*-$$ $TB/local/t35cache*-$$" >/dev/null 2>&1 || true
  done
  # mount records of this test's mount points (root's state directory), then its files
  grep -l "t35mnt[a-z0-9]*-$$" /run/sw-pool/records/* 2>/dev/null | xargs -r rm -f || true
  rm -rf "$W" "$E" 2>/dev/null || true
}
trap cleanup EXIT
cleanup
mkdir -p "$W/bin" "$W/keys" "$W/trusted" "$W/src" "$E"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$W/bin/"
SW=$W/bin/sw-pool
printf '#!/bin/sh\n"$@"\necho "rank-exit $OMPI_COMM_WORLD_RANK $?"\n' > "$W/bin/rank-exit"
chmod 755 "$W/bin/rank-exit"
export SW_POOL_SHELL=sh

# --- keys, two signed pools of the same size (1 MiB chunks, so that the 16 MiB of data span 16)
"$SW" keygen -q --out "$W/keys/adm" >/dev/null
"$SW" keygen -q --out "$W/keys/mallory" >/dev/null
cp "$W/keys/adm.pub.pem" "$W/trusted/site-admin.pem"
for p in alpha beta; do
  mkdir -p "$W/src/$p"
  head -c 16MiB /dev/urandom > "$W/src/$p/random.data"
  SW_POOL_CHUNK_SIZE=1MiB "$SW" build -q -s 24MB --name "$p" "$W/src/$p.ext2" "$W/src/$p"
done
cp "$W/src/alpha.ext2" "$E/unsigned.ext2"
for p in alpha beta; do "$SW" sign -q --key "$W/keys/adm.pem" "$W/src/$p.ext2" >/dev/null; done
cp "$W/src/alpha.ext2" "$E/mallory.ext2"
"$SW" sign -q --key "$W/keys/mallory.pem" "$E/mallory.ext2" >/dev/null
want=$(sha256sum < "$W/src/alpha/random.data" | cut -d' ' -f1)
pass "built and signed two 24 MB ext2 pools (alpha, beta) and a copy re-signed by an untrusted key"

# --- the tampered copies, written onto the storage server's disk as an attacker who knows the format
cat > "$W/tamper.py" <<'EOF'
import hashlib, json, os, struct, sys
good_path, other_path, mallory_path, out = sys.argv[1:5]
good = open(good_path, "rb").read()
other = open(other_path, "rb").read()
mal = open(mallory_path, "rb").read()

def parts(b):
    f = b[-80:]
    image, mlen, slen = struct.unpack_from("<QQQ", f, 16)
    return b[:image], b[image:image + mlen], b[image + mlen:image + mlen + slen]

def rebuild(image, manifest, sig):
    f = bytearray(80)
    f[0:8] = b"SWPOOL\x00\x01"
    f[8:12] = struct.pack("<I", 1)
    f[16:40] = struct.pack("<QQQ", len(image), len(manifest), len(sig))
    f[40:72] = hashlib.sha256(manifest).digest()
    f[72:80] = b"SWPOOLFT"
    return image + manifest + sig + bytes(f)

def write(name, b):
    open(os.path.join(out, name + ".ext2"), "wb").write(b)

image, manifest, sig = parts(good)
m = json.loads(manifest)
cs, n = m["chunk_size"], len(image)
data_chunks = [i for i, h in enumerate(m["chunks"]) if h is not None]
zero_chunks = [i for i, h in enumerate(m["chunks"]) if h is None]
# 20 flips in chunks that hold data: the superblock's magic, the start of the image, block 1, the
# block bitmap / inode table area, the last data byte, and pseudo-random offsets (fixed seed)
last = max(data_chunks)
offs = [1024 + 56, 0, 4096, 65536, last * cs + min(cs, n - last * cs) - 1]
x = 0x2545F4914F6CDD1D
while len(offs) < 20:
    x ^= (x << 13) & (2**64 - 1); x ^= x >> 7; x ^= (x << 17) & (2**64 - 1)
    o = x % n
    if o // cs in data_chunks and o not in offs:
        offs.append(o)
for k, o in enumerate(offs):
    b = bytearray(good); b[o] ^= 0x01
    write("flip%02d" % k, bytes(b))
    print("flip%02d %d %d" % (k, o, o // cs * cs))
# a flip inside an all-zero chunk (not a refusal: such chunks never move)
o = zero_chunks[len(zero_chunks) // 2] * cs + 777
b = bytearray(good); b[o] ^= 0x01
write("fliphole", bytes(b))
print("fliphole %d %d" % (o, o // cs * cs))
# the manifest: one flipped byte (the footer's hash catches it); rewritten with a valid footer
b = bytearray(good); b[n + 40] ^= 0x04
write("manifest-byte", bytes(b))
write("manifest-forged", rebuild(image, manifest.replace(b'"alpha"', b'"gamma"'), sig))
# the signature: one hex digit changed; the block damaged
s = sig.decode()
p = s.index('"signature"') + 20
sb = bytearray(sig); sb[p] = ord("1") if sb[p] == ord("0") else ord("0")
write("sig-digit", rebuild(image, manifest, bytes(sb)))
write("sig-block", rebuild(image, manifest, b"[" + sig[1:]))
# signed by another key (mallory's signature) under the trusted key's name and fingerprint
blk = json.loads(sig)
blk["signature"] = json.loads(parts(mal)[2])["signature"]
write("sig-otherkey", rebuild(image, manifest, json.dumps(blk, indent=2).encode()))
# truncated by one byte, by one chunk; bytes appended
write("trunc1", good[:-1])
write("truncchunk", good[:-cs])
write("append", good + b"appended")
# the signed manifest of another pool of the same image size
assert parts(other)[0].__len__() == n
write("swapped", image + other[n:])
EOF
python3 "$W/tamper.py" "$W/src/alpha.ext2" "$W/src/beta.ext2" "$E/mallory.ext2" "$E" > "$W/flips.txt"
cp "$W/src/alpha.ext2" "$E/alpha.ext2"
chmod -R a+rX "$W" "$E"
if [[ $(grep -c "^flip[0-9]" "$W/flips.txt") == 20 ]]; then pass "wrote 20 image flips and 11 other tampered copies"; else fail "tampered copies" "$(cat "$W/flips.txt")"; fi

for n in "${nodes[@]}"; do "$TESTBED/exec" "$n" mkdir -p "$CACHE" "$CACHEB" "$CACHEC"; done

# load CASE [MPIRUN-ARGS...]: run the 4-node load of $S/CASE.ext2 into $CACHE / $MNT; sets $out (all
# ranks' output), $codes (every rank's exit status, sorted, space-separated) and $served (bytes the
# storage server sent)
load() {
  local c=$1; shift
  "$TESTBED/storage-bytes" --mark >/dev/null
  # rank-exit reports each rank's own exit status (and exits 0, so that mpirun lets every rank finish)
  out=$("$TESTBED/mpirun" -x SW_POOL_TRUSTED_KEYS="$W/trusted" "$@" "$W/bin/rank-exit" \
    "$SW" load --require-signature --cache-dir "$CACHE" -m "$MNT" "$S/$c.ext2" 2>&1 < /dev/null) || true
  served=$("$TESTBED/storage-bytes" --since-mark)
  codes=$(sed -n 's/^rank-exit [0-9]* \([0-9]*\)$/\1/p' <<< "$out" | sort -n | tr '\n' ' ' | sed 's/ $//')
}
# on every node: files under the cache directory (entries and temporaries) and mounts of this test
leftovers() {
  local n
  for n in "${nodes[@]}"; do
    "$TESTBED/exec" "$n" sh -c "echo \$(find $CACHE -type f ! -name '*.verified' 2>/dev/null | wc -l) \$(awk '\$2 ~ \"^$TB/local/t35\"' /proc/self/mounts | wc -l)"
  done | tr '\n' ' ' | sed 's/ $//'
}
# refused CASE REGEX [MAX_SERVED]: the load is refused on every rank with a message matching REGEX
refused() {
  local c=$1 re=$2 max=${3:-}
  load "$c"
  local one
  one=$(grep -m1 'sw-pool: error' <<< "$out" || true)
  echo "  $c: ${one:0:400}"
  if [[ $codes =~ ^[1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*\ [1-9][0-9]*$ ]]; then
    pass "$c: all 4 ranks exit non-zero ($codes)"
  else
    fail "$c: all 4 ranks exit non-zero" "exit statuses '$codes'; output: $(tail -n 5 <<< "$out")"
  fi
  assert_match "$c: the error says what failed" "$re" "$(tr '\n' ' ' <<< "$out")"
  assert_eq "$c: no cache file, no temporary, no mount on any node" "0 0 0 0 0 0 0 0" "$(leftovers)"
  [[ -z $max ]] || assert_le "$c: refused before the broadcast (bytes served by shared storage)" "$served" "$max"
}

# --- refused by the trust policy, before any byte of the image moves
pre=500000
refused unsigned "is not signed.*sw-pool sign.*require" $pre
refused mallory "signed by key sha256:[0-9a-f]{64}, which is not trusted here.*trusted-keys" $pre
refused sig-otherkey "manifest signature does not verify with key sha256:[0-9a-f]{64} \(site-admin\)" $pre
refused sig-digit "manifest signature does not verify" $pre
refused sig-block "signature block is damaged" $pre
refused manifest-byte "manifest bytes do not match their hash" $pre
refused manifest-forged "manifest signature does not verify" $pre
# no footer where it belongs: each leader reads the last 1 MiB to say whether the file was truncated
# or appended to (a diagnostic read; nothing is broadcast)
tail=$(( ${#nodes[@]} * (1 << 20) * 11 / 10 ))
refused trunc1 "truncated" $tail
refused truncchunk "no sw-pool trailer at its end" $tail
refused append "8 bytes were appended" $tail

# --- accepted by the policy (valid signature); the broadcast's per-chunk check refuses the data
while read -r c off chunk <&3; do
  [[ $c == flip[0-9]* ]] || continue
  refused "$c" "offset ${chunk}[^0-9].*node[1-4]|node[1-4].*offset ${chunk}[^0-9]"
  [[ $out == *"offset $chunk"* ]] || echo "  ($c: byte $off, chunk at $chunk)"
done 3< "$W/flips.txt"
refused swapped "does not match its manifest hash|does not match the pool manifest"

# --- the untouched pool loads under the same policy, every node reads the data, unload unmounts
load alpha
assert_eq "signed pool: all 4 ranks exit 0" "0 0 0 0" "$codes"
size=$(stat -c %s "$E/alpha.ext2")
assert_within "signed pool: shared storage served its data once (bytes / file size)" "$(calc "$served / $size")" 0.5 1.05
for n in "${nodes[@]}"; do
  assert_eq "$n: random.data through the mount has the source's sha256" "$want" "$("$TESTBED/exec" "$n" sh -c "sha256sum < $MNT/random.data | cut -d' ' -f1")"
done
out=$("$TESTBED/mpirun" "$SW" unload "$MNT" 2>&1) && rc=0 || rc=$?
assert_eq "signed pool: unload exits 0" 0 "$rc"
assert_eq "after unload: the cache entry stays (one file per node), nothing mounted" "1 0 1 0 1 0 1 0" "$(leftovers)"

# --- not refusals, by design (pinned so that a change is noticed)
# a flipped byte in an all-zero chunk: the manifest lists the chunk as zeros, so it is never read or
# sent; every node's copy is the signed image (fresh cache: the pool really moves)
CACHE=$CACHEB
read -r _ hoff hchunk < <(grep '^fliphole ' "$W/flips.txt")
load fliphole
assert_eq "flip at $hoff (the all-zero chunk at $hchunk): load succeeds on all 4 ranks" "0 0 0 0" "$codes"
good=$(sha256sum < "$W/src/alpha.ext2" | cut -d' ' -f1)
for n in "${nodes[@]}"; do
  got=$("$TESTBED/exec" "$n" sh -c "sha256sum < \$(find $CACHE -type f -name '*.pool' | head -1) | cut -d' ' -f1")
  assert_eq "$n: the cached copy is the signed pool, not the tampered file" "$good" "$got"
done
"$TESTBED/mpirun" "$SW" unload "$MNT" >/dev/null 2>&1 || fail "unload after fliphole" "exit $?"
# a POOL.sig of another pool beside a correctly signed pool: load checks the trailer's signature only
CACHE=$CACHEC
cp "$E/alpha.ext2" "$E/othersig.ext2"
cp "$W/src/beta.ext2.sig" "$E/othersig.ext2.sig"
chmod a+r "$E"/othersig.*
load othersig
assert_eq "a POOL.sig of another pool: load (trailer signature) succeeds on all 4 ranks" "0 0 0 0" "$codes"
"$TESTBED/mpirun" "$SW" unload "$MNT" >/dev/null 2>&1 || fail "unload after othersig" "exit $?"
o=$("$SW" verify --detached --trusted "$W/trusted" "$E/othersig.ext2" 2>&1) && rc=0 || rc=$?
assert_match "a POOL.sig of another pool: sw-pool verify --detached refuses it (exit 7)" "^7 .*does not match the pool file" "$rc $o"
for n in "${nodes[@]}"; do
  assert_eq "$n: nothing of this test mounted at the end" 0 "$("$TESTBED/exec" "$n" sh -c "awk '\$2 ~ \"^$TB/local/t35\"' /proc/self/mounts | wc -l")"
done
finish
