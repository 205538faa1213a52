#!/usr/bin/env bash
# Install the Debian packages sw-pool needs. Idempotent; run as root on Debian 12.
#   setup-deps.sh demo   what `make demo` needs: build sw-pool and run the virtual cluster (Slurm,
#                        Open MPI, FUSE, Lmod) — nothing only the tests, the linter or the
#                        benchmarks use (`make demo` calls this)
#   setup-deps.sh        everything: also MPICH, the linters (shellcheck, cargo-deny), the shells and
#                        Environment Modules the tests drive, strace/patchelf for `bundle`, the
#                        benchmark and scale-model tools (`make setup`, `make test`)
set -euo pipefail
PROFILE=${1:-all}

DEMO_PACKAGES=(
  # build (clang: rsmpi's bindings to the system MPI are generated with bindgen)
  build-essential pkg-config clang libclang-dev libssl-dev
  # image tools called by sw-pool
  e2fsprogs fuse2fs squashfs-tools squashfuse fuse3 openssl
  # MPI: Open MPI is the default implementation
  openmpi-bin libopenmpi-dev libpmix2
  # the virtual cluster: Slurm, munge, sshd + sshfs for shared storage, iproute2 for namespaces
  slurmctld slurmd slurm-client libslurm-dev munge openssh-server openssh-sftp-server openssh-client sshfs iproute2 util-linux procps kmod
  # Lmod (module avail / module load)
  lmod
  # `sw-pool run/shell --layer` without the site's helper: the rootless writable overlay
  fuse-overlayfs
)
TEST_PACKAGES=(
  # MPICH must also work
  mpich libmpich-dev
  # tests and `bundle`: fuser, strace (bundle --trace), patchelf (bundle's rewrite), the linter
  psmisc strace shellcheck patchelf
  # build --from-env's tests make real environments (python3 -m venv needs ensurepip)
  python3-venv
  # shells the environment output is tested in; tclsh for Environment Modules (see below)
  csh fish zsh tcl8.6
  # benchmarks and reports
  python3 python3-matplotlib hyperfine time
  # bench/lazy.sh PROFILE=1: where the cores go (perf record -a)
  linux-perf
  # the environment start benchmark's peers (bench/env-start.sh): bwrap, ch-run, unshare -U
  bubblewrap charliecloud-runtime uidmap
  # the environment overhead benchmark (bench/env-overhead.sh)
  fio
  # the SimGrid scale model of the broadcast (model/, `make model`)
  python3-simgrid
  # the privileged mount helper's tests (called through sudo by an unprivileged user) and the
  # EROFS pool format (mkfs.erofs)
  sudo erofs-utils
)
case $PROFILE in
  demo) PACKAGES=("${DEMO_PACKAGES[@]}") ;;
  all) PACKAGES=("${DEMO_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  *) echo "setup-deps: unknown profile '$PROFILE' (demo or nothing)" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  echo "setup-deps: must run as root (it installs Debian packages)" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup-deps: all ${#PACKAGES[@]} packages present"
else
  echo "setup-deps: installing ${missing[*]}"
  # keep package postinst scripts from starting daemons (slurmd, munge, sshd): the testbed starts its own
  policy=/usr/sbin/policy-rc.d
  created_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; created_policy=1
  fi
  trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# the demo needs nothing more: the rest is for linting and tests
[ "$PROFILE" = demo ] && exit 0

# Rust toolchain: rustup is on the developer and CI machines; make sure fmt and clippy are there
if command -v rustup >/dev/null 2>&1; then
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
fi

# cargo-deny for `make lint` (licenses, duplicate crates, sources; deny.toml), built from crates.io
# once (a few minutes on a fresh machine); the version `make lint` was checked with
CARGO_DENY_VERSION=0.20.2
if command -v cargo >/dev/null 2>&1 &&
   [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  echo "setup-deps: installing cargo-deny $CARGO_DENY_VERSION (cargo install --locked)"
  cargo install --locked --quiet "cargo-deny@$CARGO_DENY_VERSION"
fi

# Environment Modules 5.2 (Tcl modulefiles, `modulecmd.tcl`) for the tests of the Tcl modulefiles.
# Debian's environment-modules conflicts with lmod (both own `module`), so it is not installed:
# the same package is unpacked beside it and its modulecmd.tcl run with tclsh, as its own init
# scripts do (`eval "$(tclsh $ENVMOD/usr/lib/x86_64-linux-gnu/modulecmd.tcl bash ...)"`).
ENVMOD=/opt/sw-pool-deps/environment-modules
if [ ! -f "$ENVMOD/.complete" ]; then
  echo "setup-deps: unpacking environment-modules into $ENVMOD (it conflicts with lmod as a package)"
  tmp=$(mktemp -d /var/tmp/swp-envmod.XXXXXX)
  chmod 755 "$tmp"   # apt-get download runs as _apt
  cd "$tmp"
  if ! apt-get download -qq environment-modules 2>/dev/null; then
    apt-get update -qq
    apt-get download -qq environment-modules
  fi
  cd - >/dev/null
  rm -rf "$ENVMOD.tmp"
  mkdir -p "$ENVMOD.tmp"
  dpkg -x "$tmp"/environment-modules_*.deb "$ENVMOD.tmp"
  rm -rf "$tmp" "$ENVMOD"
  mv "$ENVMOD.tmp" "$ENVMOD"
  touch "$ENVMOD/.complete"
fi
