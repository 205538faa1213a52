#!/usr/bin/env bash
# Environment start benchmark (issue 29; not a test): 100 starts in a row of `sw-pool run -- true`,
# with and without a layer, against the peers that install from Debian in the same run — bwrap
# (bubblewrap), `unshare -Urmpf --mount-proc`, ch-run (charliecloud-runtime) — and the floor
# (bench/env-floor.c: clone into new user+mount+PID namespaces, map, /proc, exec; and the same plus a
# kernel overlay over a lower the user owns). SDEE's published figure (seed 003: 100 starts 2.848 s;
# Docker 16.93 s, Singularity 12.49 s) is shown beside them. Then 128 starts at once (one node's
# tasks of a job).
#
#   bench/env-start.sh [REPS]          (root; default 3 repetitions, median reported)
#
# Everything runs as uid 65534 (rootless, as users run it), with a usable /dev/fuse of its own
# (a device node bound over /dev/fuse in this script's mount namespace; the machine is not changed).
# rootless podman is not measured: it needs an image store, subuid ranges and an image, none of
# which a Debian install gives without network access (said in the report). ch-run makes no PID
# namespace (said in the report). Writes bench/results/env-start-<date>.md and prints it.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
REPS=${1:-3}
SW=$REPO/target/release/sw-pool
[[ $(id -u) == 0 ]] || { echo "env-start: run as root (it makes a private /dev/fuse)" >&2; exit 1; }
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
built_from_tree "$SW" || exit 1
W=$(mktemp -d /var/tmp/swp-bench-env.XXXXXX)
chmod 755 "$W"
cleanup() { rm -rf "$W"; }
trap cleanup EXIT
# the programs as `make install` places them: the static front (`make build` puts it under
# target/<host>/) beside the full program, pid 1 of environments and the chunk server
HOST=$(rustc -vV | sed -n 's/^host: //p')
FRONT=${SW_FRONT:-$REPO/target/$HOST/release/sw-pool}
[[ -x $FRONT ]] || { echo "env-start: no front at $FRONT: run make build (it builds the static front)" >&2; exit 1; }
install -d -m 0755 "$W/bin"
install -m 0755 "$FRONT" "$W/bin/sw-pool"
for p in sw-pool-full sw-pool-enter sw-pool-serve; do install -m 0755 "$REPO/target/release/$p" "$W/bin/"; done
SW=$W/bin/sw-pool
FRONT_IS="$FRONT ($(ldd "$FRONT" 2>&1 | grep -qE "statically linked|not a dynamic" && echo static || echo dynamic))"
OUT=$REPO/bench/results/env-start-$(date +%Y%m%d-%H%M)
: > "$OUT.log"

cc -O2 -Wall -Wextra -o "$W/env-floor" "$REPO/bench/env-floor.c"
# the site's helper for uid 65534 (its configuration and sudoers line bound in this script's
# mount namespace only, below)
HB=$REPO/target/release/sw-pool-mount-helper
install -d -m 0755 "$W/sbin" "$W/etc"
[[ -x $HB ]] && install -m 0755 "$HB" "$W/sbin/sw-pool-mount-helper"
printf 'environment_trees = ["/usr"]\n' > "$W/etc/helper.toml"
chmod 0644 "$W/etc/helper.toml"
cp /etc/sudoers "$W/sudoers" 2>/dev/null || : > "$W/sudoers"
echo "nobody ALL=(root) NOPASSWD: $W/sbin/sw-pool-mount-helper" >> "$W/sudoers"
mkdir -p /etc/sw-pool
mknod -m 666 "$W/fuse" c 10 229
install -d -o 65534 -g 65534 -m 700 "$W/layers" "$W/state" "$W/floor" "$W/floor/lower"
install -d -o 65534 -g 65534 -m 755 "$W/floor/lower/usr"
# a minimal charliecloud image: /bin/true, its libraries, the directories ch-run binds over
I=$W/chimg
mkdir -p "$I"/{bin,dev,proc,sys,etc,home,tmp,root,run,mnt,var/tmp,lib64,usr/bin}
cp /bin/true "$I/bin/"
for l in $(ldd /bin/true | grep -o '/lib[^ ]*'); do mkdir -p "$I$(dirname "$l")"; cp "$l" "$I$l"; done
touch "$I"/etc/{passwd,group,hosts,resolv.conf}
chmod -R a+rX "$I"
# the same tree as a root file system pool for `run --base` (built by root: its files are root's)
mkdir -p "$I"/{sys,usr/local/bin}
chmod 1777 "$I/tmp"
"$SW" build -q --format squashfs --name envbase --version 1 "$W/envbase.sqfs" "$I" >/dev/null 2>&1
chmod 644 "$W/envbase.sqfs"

# the inner script runs as nobody: NAME REP SECONDS per line. The contenders take turns: each
# repetition runs every contender's 100 starts once, so that a machine that drifts over the run
# (measured here: the same contender 1.7 ms a start, then 2.4 ms minutes later) weighs on all alike
cat > "$W/inner.sh" <<'EOS'
set -euo pipefail
W=$1 SW=$2 REPS=$3
now() { date +%s.%N; }
# one start of contender NAME
start() {
  case $1 in
    floor-ns) "$W/env-floor" ns 1 ;;
    floor-init) "$W/env-floor" init 1 ;;
    sw-pool-run) "$SW" run -- true ;;
    unshare-Urmpf) unshare -Urmpf --mount-proc true ;;
    bwrap) bwrap --dev-bind / / --unshare-user --unshare-pid --proc /proc true ;;
    ch-run) ch-run "$W/chimg" -- /bin/true ;;
    floor-ovl) "$W/env-floor" ovl 1 "$W/floor/lower" "$W/floor" ;;
    sw-pool-run-layer) "$SW" run --layer bench -- true ;;
    # the site helper's kernel path: each start asks the helper (sudo) for the idmapped view of /usr
    sw-pool-run-layer-kernel) SW_POOL_MOUNT_HELPER="$W/sbin/sw-pool-mount-helper" "$SW" run --layer bench -- true ;;
    # a layer whose environment runs (the holder below): each start joins it
    sw-pool-run-layer-joined) "$SW" run --layer benchj -- true ;;
    # --base: the pool (loaded by the user) mounted by squashfuse in each new environment, the
    # layer written through the kernel's overlay without the helper
    sw-pool-run-base-layer) "$SW" run --base envbase/1 --layer benchb -- /bin/true ;;
  esac
}
burst() { # NAME CMD... : 128 at once
  local name=$1; shift
  local s; s=$(now)
  for _ in $(seq 128); do "$@" >/dev/null 2>&1 & done
  wait
  echo "$name 1 $(awk -v a="$s" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }')"
}
export SW_POOL_LAYER_DIR=$W/layers SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= HOME=$W USER=nobody \
  SW_POOL_STATE_DIR=$W/state
cd "$W"
for l in bench benchj benchb; do "$SW" layer create "$l" >/dev/null; done
"$SW" load --json "$W/envbase.sqfs" >/dev/null 2>&1 || true
"$SW" run --layer benchj -- sleep 3600 & holder=$!
for _ in $(seq 200); do [ -S "$(ls "$W"/state/envs/layer-*.sock 2>/dev/null | head -1)" ] && break; sleep 0.05; done
names=(floor-ns floor-init sw-pool-run unshare-Urmpf bwrap ch-run floor-ovl sw-pool-run-layer
  sw-pool-run-layer-kernel sw-pool-run-layer-joined sw-pool-run-base-layer)
ok=()
for n in "${names[@]}"; do
  if start "$n" >/dev/null 2>&1; then ok+=("$n"); else echo "$n FAILED: $(start "$n" 2>&1 | tail -1)"; fi
done
for r in $(seq "$REPS"); do
  for n in "${ok[@]}"; do
    s=$(now)
    for _ in $(seq 100); do start "$n" >/dev/null; done
    echo "$n $r $(awk -v a="$s" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }')"
  done
done
kill "$holder"; wait "$holder" 2>/dev/null || true
"$SW" unload envbase/1 >/dev/null 2>&1 || true
burst burst-sw-pool-run "$SW" run -- true
# the tasks of one job step on a node share one environment
SLURM_JOB_ID=60 SLURM_STEP_ID=0 burst burst-sw-pool-run-step "$SW" run -- true
burst burst-unshare-Urmpf unshare -Urmpf --mount-proc true
burst burst-bwrap bwrap --dev-bind / / --unshare-user --unshare-pid --proc /proc true
EOS
log "# Environment starts: 100 in a row, rootless (uid 65534), median of $REPS ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg))"
log ""
log "sw-pool run: the front $FRONT_IS"
log ""
# shellcheck disable=SC2016  # $1 and $@ are the inner sh's
unshare -m --propagation private -- sh -c 'mount --bind "$1" /dev/fuse && mount --bind "$2/etc" /etc/sw-pool && mount --bind "$2/sudoers" /etc/sudoers && shift 2 && exec setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"' \
  sh "$W/fuse" "$W" bash "$W/inner.sh" "$W" "$SW" "$REPS" > "$W/raw.txt"
cat "$W/raw.txt" >> "$OUT.log"
# (three decimals: 100 starts take about 0.2 s, and the goal is a ratio of 1.1)
med() { awk -v n="$1" '$1 == n { print $3 }' "$W/raw.txt" | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
failed() { grep "^$1 FAILED" "$W/raw.txt" | cut -d' ' -f3- || true; }
SWR=$(med sw-pool-run)
{
  echo "| contender | 100 starts (s) | per start (ms) | ÷ sw-pool run |"
  echo "|---|---|---|---|"
  for n in floor-ns floor-init sw-pool-run unshare-Urmpf bwrap ch-run floor-ovl sw-pool-run-layer sw-pool-run-layer-kernel sw-pool-run-layer-joined sw-pool-run-base-layer; do
    f=$(failed "$n")
    if [[ -n $f ]]; then echo "| $n | failed: $f | | |"; continue; fi
    m=$(med "$n")
    echo "| $n | $m | $(calc "$m * 10") | $(calc "$m / $SWR") |"
  done
  echo "| SDEE (published, seed 003) | 2.848 | 28.5 | $(calc "2.848 / $SWR") |"
  echo "| Docker / Singularity (published, seed 003) | 16.93 / 12.49 | | |"
  echo ""
  echo "128 starts at once (one node's tasks), wall time (s):"
  echo ""
  for n in burst-sw-pool-run burst-sw-pool-run-step burst-unshare-Urmpf burst-bwrap; do
    echo "- $n: $(awk -v n="$n" '$1 == n { print $3 }' "$W/raw.txt")"
  done
  echo ""
  echo "The contenders take turns (each repetition runs every contender's 100 starts once)."
  echo "floor-ns / floor-ovl: bench/env-floor.c, one process per start (the launcher's exec included"
  echo "via a fresh process each time); /bin/true is pid 1, as with unshare -f. floor-init: the same"
  echo "with a pid 1 that stays the environment's init (posix_spawn of /bin/true, wait), the process"
  echo "structure of sw-pool run (launcher, init, command) and bwrap."
  echo "sw-pool-run-layer: each start makes the environment (a fresh fuse-overlayfs mount: the"
  echo "program and its libraries are read through a cold FUSE mount);"
  echo "sw-pool-run-layer-kernel: the same with the site's helper (environment_trees = [\"/usr\"]):"
  echo "each start runs \`sudo -n sw-pool-mount-helper idmap\` and mounts the kernel's overlay."
  echo "sw-pool-run-layer-joined: an environment on the layer runs, each start joins it."
  echo "sw-pool-run-base-layer: \`run --base envbase/1 --layer\` (the ch-run tree as a pool, loaded by"
  echo "the user): each start mounts the pool with squashfuse inside the new environment and the"
  echo "layer over it with the kernel's overlay, rootless."
  echo "burst-sw-pool-run-step: 128 starts with one job step's SLURM_JOB_ID/SLURM_STEP_ID (one"
  echo "environment for all). ch-run makes no PID namespace. podman: not measured (rootless podman"
  echo "needs an image store, subuid ranges and an image; none without network)."
} | tee "$OUT.md"
echo "wrote $OUT.md"
