#!/usr/bin/env bash
# Build the Debian package of sw-pool (`make deb`): target/debian/sw-pool_<version>_<arch>.deb.
#
# The files are exactly what `make install PREFIX=/usr` installs (one list of installed files, in the
# Makefile), staged under DESTDIR, plus the documented system configuration and the trusted-keys
# directory; dpkg-deb builds the package. Dependencies: the shared libraries the binary links
# (found with ldd, mapped to their packages with dpkg -S) and the tools sw-pool runs.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
ARCH=$(dpkg --print-architecture)
OUT=$REPO/target/debian
ROOT=$OUT/root
DEB=$OUT/sw-pool_${VERSION}_$ARCH.deb
[[ -n $VERSION ]] || { echo "make-deb: no version in Cargo.toml" >&2; exit 1; }

rm -rf "$ROOT"
mkdir -p "$ROOT/DEBIAN"
make --no-print-directory install DESTDIR="$ROOT" PREFIX=/usr >/dev/null
install -d -m 0755 "$ROOT/etc/sw-pool/trusted-keys"
install -m 0644 etc/sw-pool/config.toml "$ROOT/etc/sw-pool/config.toml"
install -d "$ROOT/usr/share/doc/sw-pool"
install -m 0644 README.md SECURITY.md "$ROOT/usr/share/doc/sw-pool/"

# the packages of the shared libraries the binaries need (sw-pool-full links MPI and OpenSSL)
libdeps=$(ldd target/release/sw-pool target/release/sw-pool-full target/release/sw-pool-enter target/release/sw-pool-serve target/release/sw-pool-view target/release/sw-pool-mount-helper | awk '/=> \//{print $3}' | while read -r lib; do
  dpkg -S "$(readlink -f "$lib")" 2>/dev/null || dpkg -S "$lib" 2>/dev/null || true
done | cut -d: -f1 | sort -u | paste -sd, | sed 's/,/, /g')
[[ -n $libdeps ]] || { echo "make-deb: could not map the binary's libraries to packages" >&2; exit 1; }

size=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
cat > "$ROOT/DEBIAN/control" <<EOF
Package: sw-pool
Version: $VERSION
Architecture: $ARCH
Maintainer: sw-pool developers <sw-pool@localhost>
Installed-Size: $size
Depends: $libdeps, fuse3, squashfuse, fuse2fs, squashfs-tools, e2fsprogs
Recommends: openmpi-bin, lmod | environment-modules, fuse-overlayfs
Suggests: slurm-client, slurmd
Section: admin
Priority: optional
Homepage: https://github.com/sw-pool/sw-pool
Description: software pools for HPC clusters: broadcast with MPI, mounted with FUSE
 sw-pool packs a software stack into one image file (a pool), signs it,
 broadcasts it with MPI to node-local storage on every node of a job
 (reading shared storage once), mounts it without root through FUSE, and
 makes its packages appear in Lmod or Environment Modules.
 .
 This package installs the sw-pool tool, the paper's scalable-fs-cp and
 scalable-fs-mount names, the Slurm prolog/task prolog/epilog hooks, man
 pages, shell completions, the shell integration in /etc/profile.d, the
 pool modulefiles for Lmod and Environment Modules and the Slurm SPANK
 plugin (--pool for sbatch, salloc and srun), and sw-pool run/shell:
 isolated environments with a writable layer (fuse-overlayfs, rootless),
 and sw-pool-mount-helper: kernel mounts of site-signed pools (one verified
 copy and one mount per node) and of users' own images, through sudo; it
 does nothing until an admin writes /etc/sw-pool/helper.toml.
EOF
cat > "$ROOT/DEBIAN/conffiles" <<EOF
/etc/profile.d/sw-pool.sh
/etc/sw-pool/config.toml
EOF
# purge: the configuration directory (trusted keys an admin installed are the admin's: kept, and
# the directory with them)
cat > "$ROOT/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
  rmdir /etc/sw-pool/trusted-keys 2>/dev/null || true
  rmdir /etc/sw-pool 2>/dev/null || true
fi
EOF
chmod 0755 "$ROOT/DEBIAN/postrm"
mkdir -p "$OUT"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB.tmp" >/dev/null
mv "$DEB.tmp" "$DEB"
echo "$DEB"
