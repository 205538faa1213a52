# shellcheck shell=bash
# The preamble of the scripts that run on the virtual cluster or measure: sourced by
# tests/cluster/lib.sh (the cluster tests) and bench/lib.sh (the benchmarks), which add their own
# helpers; not run on its own. It sets
#   strict mode         set -euo pipefail
#   REPO                the repository root
#   TESTBED             $REPO/testbed (the virtual cluster's scripts and env.sh)
# and defines
#   now                 seconds since the epoch, with nanoseconds
#   elapsed T0 [T1]     seconds from T0 to T1 (default: now), 2 decimals
#   drop_caches         sync and drop the page cache (machine-wide: the next read comes from the
#                       device or the wire)
#   median              the median of the numbers on stdin (space- or newline-separated; 2 decimals)
#   log MSG...          MSG on stderr (bench/lib.sh and bench/run redefine it: a log file, a time stamp)
#   die MSG...          log "ERROR: MSG" (with whichever log is defined) and exit 1
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck disable=SC2034  # used by the scripts that source the preamble
TESTBED=$REPO/testbed
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="${2:-$(now)}" 'BEGIN { printf "%.2f", b - a }'; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { printf "%.2f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
log() { echo "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# from_reachable_copy SCRIPT [ARGS...] (SCRIPT relative to the checkout): the virtual cluster's users (swuser, nobody) run this
# checkout's programs and scripts, which fails in a checkout they cannot reach (a clone in root's
# 0700 home). There, this copies what the scripts use (the files git knows and the built programs
# of target/release) to /var/tmp/swp-repo.XXXXXX (root's, 0755), runs SCRIPT from the copy with
# ARGS, removes the copy and exits with SCRIPT's status. In a checkout every user can read it
# returns at once.
from_reachable_copy() {
  local script=$1 copy rc=0
  shift
  if [[ -n ${SWP_REPO_COPY:-} ]] || setpriv --reuid=65534 --regid=65534 --clear-groups \
    test -r "$REPO/tools/preamble.sh" 2>/dev/null; then
    return 0
  fi
  copy=$(mktemp -d /var/tmp/swp-repo.XXXXXX)
  chmod 755 "$copy"
  log "$REPO cannot be read by other users (the virtual cluster's users run its programs): running from a copy in $copy, removed at the end"
  if [[ -e $REPO/.git ]]; then
    (cd "$REPO" && git ls-files -z --cached --others --exclude-standard) | tar -C "$REPO" --null -T - -cf - | tar -C "$copy" -xf -
  else
    tar -C "$REPO" --exclude=./target -cf - . | tar -C "$copy" -xf -
  fi
  mkdir -p "$copy/target/release"
  find "$REPO/target/release" -maxdepth 1 -type f -perm -u+x -exec cp -p {} "$copy/target/release/" \;
  chmod -R a+rX "$copy"
  SWP_REPO_COPY=1 bash "$copy/$script" "$@" || rc=$?
  rm -rf "$copy"
  exit "$rc"
}
