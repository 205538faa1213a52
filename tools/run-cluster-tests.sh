#!/usr/bin/env bash
# Bring the virtual cluster up, run the cluster test suite, and always take the cluster down again
# (also when a test fails or the run is interrupted). Exit status: the suite's.
#
#   tools/run-cluster-tests.sh [--busy] [PATTERN]    (arguments: tests/cluster/run's)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run-cluster-tests: must run as root (the testbed makes namespaces)" >&2; exit 1; }
# shellcheck source=preamble.sh
. tools/preamble.sh
from_reachable_copy tools/run-cluster-tests.sh "$@"
# one user of the virtual cluster at a time on this machine (developers' runs and benchmarks share it)
if [ -z "${SWP_CLUSTER_SESSION:-}" ]; then
  SWP_CLUSTER_SESSION=1 exec flock -o -w 3600 /var/tmp/swp-cluster-session.lock "$0" "$@"
fi
cleanup() { testbed/down --purge >/dev/null 2>&1 || testbed/down --purge; }
trap cleanup EXIT
testbed/up
tests/cluster/run "$@"
