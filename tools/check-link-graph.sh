#!/usr/bin/env bash
# Who may link what (`make lint`; docs/architecture.md "Who may link what"): the normal dependency
# graph (`cargo tree -e normal`, no dev or build dependencies) of each crate below must not hold
# the crates named after it. The front (`sw-pool` run/shell: every shared library it loads is paid
# on every environment start), the environment crate and the node layer link neither MPI nor
# OpenSSL, nor do the transfer engine (MPI is its seams' implementation in swpool-mpi) and the
# builders; the root helper links no MPI (it checks site signatures with swpool-trust, OpenSSL).
# Exits 1 naming each crate that holds a forbidden one and the path that brings it in.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
MPI="mpi mpi-sys"
SSL="openssl openssl-sys"
rules=(
  "sw-pool:$MPI $SSL"
  "swpool-env:$MPI $SSL"
  "swpool-node:$MPI $SSL"
  "swpool-transfer:$MPI $SSL"
  "swpool-build:$MPI $SSL"
  "sw-pool-mount-helper:$MPI"
)
bad=0
for r in "${rules[@]}"; do
  crate=${r%%:*}
  tree=$("$CARGO" tree -q -p "$crate" -e normal --prefix none) || {
    echo "check-link-graph: cargo tree -p $crate failed (see above): run it in the workspace root" >&2
    exit 1
  }
  for dep in ${r#*:}; do
    if grep -qE "^$dep v" <<< "$tree"; then
      echo "check-link-graph: $crate links $dep; it must not (docs/architecture.md, \"Who may link what\"). What brings it in:" >&2
      "$CARGO" tree -q -p "$crate" -e normal -i "$dep" >&2 || true
      bad=1
    fi
  done
done
if ((bad)); then
  exit 1
fi
echo "check-link-graph: sw-pool (the front), swpool-env, swpool-node, swpool-transfer and swpool-build link neither MPI nor OpenSSL; sw-pool-mount-helper links no MPI"
