#!/usr/bin/env bash
# The Debian package (`make test-deb`): build it, install it with dpkg on this machine, run the
# installed tool the way the demo's admin does (init, build with modulefiles, keygen, sign, verify,
# inspect), check every part an admin expects (paper names, Slurm hooks, man pages, completions,
# profile.d, both pool modulefiles, the documented configuration), then purge it and check that
# nothing it installed is left. Refuses to run if a sw-pool package is already installed (it is not
# ours to remove). Root only.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $(id -u) == 0 ]] || { echo "test-deb: run as root (dpkg -i)" >&2; exit 1; }
passed=0 failed=0
pass() { echo "PASS deb: $1"; passed=$((passed + 1)); }
fail() { echo "FAIL deb: $1: $2"; failed=$((failed + 1)); }
check() { local name=$1; shift; if "$@" >/dev/null 2>&1; then pass "$name"; else fail "$name" "$* failed"; fi; }

if dpkg-query -W -f='${Status}' sw-pool 2>/dev/null | grep -q "install ok installed"; then
  echo "SKIP deb: a sw-pool package is already installed on this machine; not touching it"
  exit 0
fi
deb=$(bash tools/make-deb.sh)
check "make deb built $(basename "$deb")" test -s "$deb"
W=$(mktemp -d /var/tmp/swp-deb.XXXXXX)
installed=0
cleanup() {
  if [[ $installed == 1 ]]; then dpkg --purge sw-pool >/dev/null 2>&1 || true; fi
  rm -rf "$W"
}
trap cleanup EXIT
dpkg-deb -c "$deb" | awk '{print substr($6, 2)}' | grep -v '/$' > "$W/files"
if dpkg -i "$deb" > "$W/dpkg.log" 2>&1; then installed=1; pass "dpkg -i"; else fail "dpkg -i" "$(tail -5 "$W/dpkg.log")"; exit 1; fi

want=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
got=$(/usr/bin/sw-pool --version 2>&1 || true)
if [[ $got == *"$want"* ]]; then pass "sw-pool --version says $want"; else fail "sw-pool --version" "$got"; fi
for f in /usr/bin/scalable-fs-cp /usr/bin/scalable-fs-mount /usr/libexec/sw-pool/prolog \
         /usr/libexec/sw-pool/task-prolog /usr/libexec/sw-pool/epilog; do
  check "$f runs the installed sw-pool" test "$(readlink -f "$f")" = /usr/bin/sw-pool
done
check "the mount helper is installed root's, mode 0755" test "$(stat -c '%U %a' /usr/libexec/sw-pool/sw-pool-mount-helper)" = "root 755"
rc=0; out=$(/usr/libexec/sw-pool/sw-pool-mount-helper list 2>&1) || rc=$?
check "the mount helper does nothing without /etc/sw-pool/helper.toml (status 3, says so)" \
  test "$rc" = 3 -a -n "$(grep 'not configured on this node' <<< "$out")"
check "the full program, pid 1 of environments and the chunk server and the tree view beside the front" test -x /usr/bin/sw-pool-full -a -x /usr/bin/sw-pool-enter -a -x /usr/bin/sw-pool-serve -a -x /usr/bin/sw-pool-view
check "the front is linked statically (ldd: no shared library)" bash -c 'ldd /usr/bin/sw-pool 2>&1 | grep -qE "statically linked|not a dynamic executable"'
check "sw-pool run -- true (an environment, as root)" env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= /usr/bin/sw-pool run -- true
check "man page sw-pool(1)" test -s /usr/share/man/man1/sw-pool.1
check "man page sw-pool-load(1)" test -s /usr/share/man/man1/sw-pool-load.1
check "bash completion" grep -q sw-pool /usr/share/bash-completion/completions/sw-pool
check "zsh completion" test -s /usr/share/zsh/site-functions/_sw-pool
check "fish completion" test -s /usr/share/fish/vendor_completions.d/sw-pool.fish
check "profile.d shell function" grep -q 'sw-pool()' /etc/profile.d/sw-pool.sh
check "Lmod pool modulefile" grep -q 'module load pool' /usr/share/sw-pool/lmod/pool-modulefile.lua
check "SPANK plugin (--pool)" test -s /usr/lib/sw-pool/sw_pool_spank.so
check "Tcl pool modulefile" grep -q '^#%Module' /usr/share/sw-pool/modules/pool-modulefile.tcl
check "trusted-keys directory" test -d /etc/sw-pool/trusted-keys
check "config.toml is a conffile" grep -qx /etc/sw-pool/config.toml /var/lib/dpkg/info/sw-pool.conffiles
# the documented configuration parses, with every key uncommented
sed 's/^#\([a-z_]* = \)/\1/' /etc/sw-pool/config.toml > "$W/config.toml"
check "every documented key of config.toml is valid" env SW_POOL_SYSTEM_CONFIG="$W/config.toml" SW_POOL_USER_CONFIG= /usr/bin/sw-pool config

# the demo's admin steps with the installed tool
sw() { env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= /usr/bin/sw-pool "$@"; }
sw init --name demo --version 1.0 "$W/demo" >/dev/null
mkdir -p "$W/demo/install/hello/1.0/bin"
printf '#!/bin/sh\necho hello\n' > "$W/demo/install/hello/1.0/bin/hello"
chmod 755 "$W/demo/install/hello/1.0/bin/hello"
check "sw-pool build --gen-modulefiles" sw build -q --gen-modulefiles "$W/demo-1.0.sqfs" "$W/demo"
check "... wrote the Lua and the Tcl modulefile" test -f "$W/demo/modulefiles/hello/1.0.lua" -a -f "$W/demo/modulefiles/hello/1.0"
check "sw-pool keygen" sw keygen -q --out "$W/site"
check "sw-pool sign" sw sign -q --key "$W/site.pem" "$W/demo-1.0.sqfs"
check "sw-pool verify --key" sw verify --key "$W/site.pub.pem" "$W/demo-1.0.sqfs"
check "sw-pool inspect" sw inspect "$W/demo-1.0.sqfs"
check "the paper's build call" sw build -q -s 64MB "$W/test-pool.ext2" "$W/demo"

# --- the README's quick start, verbatim (tools/readme-example quickstart), as a new unprivileged user
# in a login shell on the installed package: a module loaded from a signed pool. /dev/fuse is 0600
# on machines without udev: a 0666 node is bound over it in a private mount namespace, as udev
# would make it (the README states the requirement); the user's mounts end with that namespace.
qs_user=swp-quick-$$
chmod 755 "$W"
if useradd --create-home --home-dir "$W/home" --shell /bin/bash "$qs_user" 2>"$W/useradd.log"; then
  qs_uid=$(id -u "$qs_user")
  bash tools/readme-example quickstart > "$W/quickstart.sh"
  mknod -m 666 "$W/fuse" c 10 229
  rc=0
  out=$(unshare --mount --propagation private sh -c "mount --bind '$W/fuse' /dev/fuse && \
    runuser -l '$qs_user' -c 'set -e; cd; . $W/quickstart.sh; sw-pool cleanup --all >/dev/null'" 2>&1) || rc=$?
  if [[ $rc == 0 && $out == *"Hello from a pool"* ]]; then
    pass "the README's quick start, verbatim, as a new user: module loaded from a signed pool"
  else
    fail "the README's quick start, verbatim, as a new user" "exit $rc: $(tail -n 15 <<< "$out")"
  fi
  userdel -r "$qs_user" >/dev/null 2>&1 || true
  rm -rf "/tmp/sw-pool-$qs_uid" "/tmp/sw-pool-$qs_uid".*
else
  fail "a new user for the quick start" "$(cat "$W/useradd.log")"
fi

# purge: nothing it installed is left
if dpkg --purge sw-pool > "$W/dpkg.log" 2>&1; then installed=0; pass "dpkg --purge"; else fail "dpkg --purge" "$(tail -5 "$W/dpkg.log")"; fi
left=0
while read -r f; do [[ -e /$f || -L /$f ]] && { left=$((left + 1)); echo "  left: /$f"; }; done < "$W/files"
if [[ $left == 0 ]]; then pass "purge removed all $(wc -l < "$W/files") files"; else fail "purge removed everything" "$left files left"; fi
check "purge removed /etc/sw-pool" test ! -e /etc/sw-pool
check "purge removed /usr/share/sw-pool" test ! -e /usr/share/sw-pool
check "purge removed /usr/libexec/sw-pool" test ! -e /usr/libexec/sw-pool
status=$(dpkg-query -W -f='${Status}' sw-pool 2>/dev/null || true)
if [[ $status != *installed* ]]; then pass "dpkg no longer knows sw-pool"; else fail "dpkg no longer knows sw-pool" "$status"; fi

echo "deb: $passed passed, $failed failed"
[[ $failed == 0 ]]
