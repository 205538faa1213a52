#!/usr/bin/env bash
# `import scipy.stats` from a Python environment, on N nodes x P ranks of the virtual cluster (not
# a test). A venv over /usr/bin/python3 with numpy + scipy from PyPI lies on shared storage; it is
# imported three ways, same run, same storage delays as bench/storm.sh:
#   (a) shared    the venv's packages straight from shared storage (sshfs): /usr/bin/python3 with
#                 the venv's site-packages on PYTHONPATH (mpirun does not start the venv's python
#                 link on the sshfs mount)
#   (b) pool      `sw-pool build --from-env` of that venv, `sw-pool load` (broadcast to node-local
#                 storage, verified, mounted) and the pool's python; the load is inside the time
#   (c) in-place  the same pool file `sw-pool mount --in-place` on every node from shared storage
#                 (no copy, each chunk verified on first read: Apptainer/Tykky style)
#   (v) view      the venv as it lies, no build step: every rank under `sw-pool run --cache VENV`
#                 (one environment per node, its ranks join it; each node's view lists the venv
#                 once and reads each file once), the node's cache emptied first (cold)
#   (w) warm      (v) again right after it, the node's cache kept: the views' warm start
#   (j) job view  (v) under Slurm (`srun --mpi=pmix`, one step): the job-wide view, one listing and
#                 each file read from storage by one node, passed to the others over MPI (cold)
#   (s) shared    (a) launched by srun as (j) is
# Per run: time from launch to the slowest rank's end of import, the ranks' own CPU seconds summed
# (ranks_cpu_s; ÷ the cores, the least time any storage allows), bytes the storage server sent, and
# the requests it served (its own log, testbed/storage-ops), as bench/storm.sh counts them.
#
#   bench/pyenv-import.sh ["NODES"] ["RANKS"]     defaults: "1 8" "1 4"
#   env: STORM_LATENCY=0.5ms  STORM_MDS_DELAY_US=0  (as bench/storm.sh)  PYENV_WAYS="a b c"
#        PYENV_OUT=bench/results/pyenv-<date>   PYENV_WHEELS=target/tmp/pyenv-wheels (pip cache)
# Takes the machine-wide cluster lock, brings the testbed up with 8 nodes, always takes it down.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
[ "$(id -u)" = 0 ] || { echo "bench/pyenv-import.sh: must run as root (the testbed)" >&2; exit 1; }
if [ -z "${SWP_CLUSTER_SESSION:-}" ]; then
  SWP_CLUSTER_SESSION=1 exec flock -o -w 3600 /var/tmp/swp-cluster-session.lock "$0" "$@"
fi
NODES=${1:-"1 8"}
RANKS=${2:-"1 4"}
LAT=${STORM_LATENCY:-0.5ms}
MDS_US=${STORM_MDS_DELAY_US:-0}
WAYS=${PYENV_WAYS:-"a b c"}
WHEELS=${PYENV_WHEELS:-$REPO/target/tmp/pyenv-wheels}
OUT=${PYENV_OUT:-$REPO/bench/results/pyenv-$(date -u +%Y%m%d-%H%M)}
PY=/usr/bin/python3
SW=$REPO/target/release/sw-pool
built_from_tree "$SW" || exit 1
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
. testbed/env.sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
cleanup() { testbed/down --purge >/dev/null 2>&1 || testbed/down --purge || true; }
trap cleanup EXIT
t_begin=$(date +%s)
testbed/up -n 8 --sftp-log
. testbed/env.sh
E=$TB/export/pyenv S=$TB/shared/pyenv W=$TB/scratch/pyenv
mkdir -p "$E/pools/sci" "$W/bin"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$SW-view" "$W/bin/"; SW=$W/bin/sw-pool

server_pids() { ip netns pids "$TB_STOR"; }
server_ops() { testbed/storage-ops --by-op | awk '{t += $2} $1 == "read" {r = $2} END {print t + 0, r + 0}'; }
if [[ $LAT != 0 ]]; then
  rate=$(tc -n "$TB_STOR" qdisc show dev eth0 | sed -n 's/.*rate \([0-9.]*[KMG]\{0,1\}bit\).*/\1/p' | head -1)
  if tc -n "$TB_STOR" qdisc replace dev eth0 root handle 1: netem delay "$LAT" limit 100000 2>/dev/null; then
    tc -n "$TB_STOR" qdisc add dev eth0 parent 1: handle 2: tbf rate "${rate:-400Mbit}" burst 1mb latency 50ms
    echo "storage link: netem delay $LAT + tbf ${rate:-400Mbit}"
  else
    echo "storage link: tc netem is not available in this kernel; NO latency added"
    LAT="none (netem unavailable)"
  fi
fi
MDS_PID=""
stop_mds() { if [[ -n $MDS_PID ]]; then kill -INT "$MDS_PID" 2>/dev/null || true; wait "$MDS_PID" 2>/dev/null || true; MDS_PID=""; fi; }
if [[ $MDS_US != 0 ]]; then
  margs=()
  for q in $(server_pids); do margs+=(-p "$q"); done
  strace -qq -f -e trace=%file,getdents64 -e inject=%file,getdents64:delay_enter="$MDS_US" -o /dev/null "${margs[@]}" &
  MDS_PID=$!
  sleep 1
  echo "storage server: +${MDS_US} us per metadata syscall (strace inject, pid $MDS_PID)"
  trap 'stop_mds; cleanup' EXIT
fi

# --- the environment on the storage server's disk, and its pool
t=$(date +%s)
$PY -m venv "$E/sci-env"
mkdir -p "$WHEELS"
if ! "$E/sci-env/bin/pip" install -q --no-index --find-links "$WHEELS" numpy scipy 2>/dev/null; then
  "$E/sci-env/bin/pip" download -q -d "$WHEELS" numpy scipy
  "$E/sci-env/bin/pip" install -q --no-index --find-links "$WHEELS" numpy scipy
fi
"$SW" build -q --from-env "$E/sci-env" --name sci --version 1 "$E/pools/sci/1.sqfs"
chmod -R a+rX "$E"
FILES=$(find "$E/sci-env" | wc -l)
SITE=$(echo "$E"/sci-env/lib/python3*/site-packages)   # the host's path; nodes see it under $S
echo "venv: $FILES files+dirs, $(du -sh "$E/sci-env" | cut -f1); pool $(stat -c %s "$E/pools/sci/1.sqfs") bytes; $(( $(date +%s) - t )) s"
"$SW" inspect --no-check "$E/pools/sci/1.sqfs" | grep -i "python environment" || true

hosts() { local n=$1 p=$2 h="" i; for ((i = 1; i <= n; i++)); do h+="node$i:$p,"; done; echo "${h%,}"; }
RES=$OUT/runs.jsonl
: > "$RES"
MNT=$TB/local/pyenvmnt
DRIVER='import json, os, resource, time
t = time.time()
import scipy.stats
e = time.time()
u = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"since_t0_s": round(e - float(os.environ["T0"]), 3), "import_s": round(e - t, 3),
                  "cpu_s": round(u.ru_utime + u.ru_stime, 3)}))'

run_way() {  # run_way WAY N P -> one JSON line in $RES
  local way=$1 n=$2 p=$3 py pp="" t0 out rc=0 b0 o0 o1 bytes load_s="null"
  local np=$((n * p)) h1 hp
  h1=$(hosts "$n" 1); hp=$(hosts "$n" "$p")
  local keep=$TB/local/sw-pool-0
  [[ $way == w ]] && keep=""   # the warm start: the views' copies stay on the nodes
  # (j: the job-wide view's servers' log in root's state directory, removed)
  [[ $way == j ]] && keep+=" /run/sw-pool/view-*.log"
  testbed/exec all sh -c "rm -rf $keep $MNT; mkdir -p $MNT" >/dev/null 2>&1 || true
  drop
  b0=$(testbed/storage-bytes); o0=$(server_ops)
  t0=$(now)
  case $way in
    a) py=$PY; pp=$S/${SITE#"$E"/} ;;
    v|w|s|j) py=$PY; pp=$S/${SITE#"$E"/} ;;
    b) py=$MNT/install/sci/1/bin/python
       testbed/mpirun -np "$n" -H "$h1" "$SW" load -q -m "$MNT" "$S/pools/sci/1.sqfs" >/dev/null || rc=$?
       load_s=$(sub "$t0" "$(now)") ;;
    c) py=$MNT/install/sci/1/bin/python
       testbed/mpirun -np "$n" -H "$h1" "$SW" mount -q --in-place "$S/pools/sci/1.sqfs" "$MNT" >/dev/null || rc=$?
       load_s=$(sub "$t0" "$(now)") ;;
  esac
  local wrap=()
  [[ $way == v || $way == w || $way == j ]] && wrap=("$SW" run --cache "$S/sci-env" --)
  if [[ $way == s || $way == j ]]; then
    # under Slurm: (j) the job-wide view (one listing, each file read by one node), (s) the same
    # launcher straight from storage
    out=$(tb_srun "$n" "$np" T0="$t0",PYTHONPATH="$pp" "${wrap[@]}" "$py" -c "$DRIVER" 2>&1) || rc=$?
  else
    out=$(testbed/mpirun -np "$np" -H "$hp" -x T0="$t0" -x PYTHONPATH="$pp" "${wrap[@]}" "$py" -c "$DRIVER" 2>&1) || rc=$?
  fi
  local t_end; t_end=$(now)
  bytes=$(( $(testbed/storage-bytes) - b0 )); o1=$(server_ops)
  case $way in
    b) testbed/mpirun -np "$n" -H "$h1" "$SW" unload -q "$MNT" >/dev/null 2>&1 || true ;;
    c) testbed/mpirun -np "$n" -H "$h1" "$SW" umount "$MNT" >/dev/null 2>&1 || true ;;
  esac
  local ranks slow imp cpu
  ranks=$(grep -o '"since_t0_s": [0-9.]*' <<< "$out" | wc -l || true)
  slow=$(grep -o '"since_t0_s": [0-9.]*' <<< "$out" | sed 's/.*: //' | sort -g | tail -1 || true)
  imp=$(grep -o '"import_s": [0-9.]*' <<< "$out" | sed 's/.*: //' | sort -g | tail -1 || true)
  # the ranks' own CPU seconds (interpreter start to end of import), summed: ÷ the machine's cores,
  # the time no storage can take below
  cpu=$(grep -o '"cpu_s": [0-9.]*' <<< "$out" | sed 's/.*: //' | awk '{s += $1} END {printf "%.2f", s}' || true)
  [[ $ranks == "$np" ]] || { echo "run $way ${n}x$p: only $ranks of $np ranks reported (rc=$rc):"; tail -n 5 <<< "$out"; }
  printf '{"way":"%s","nodes":%d,"ppn":%d,"ranks":%d,"ok_ranks":%d,"slowest_s":%s,"slowest_import_s":%s,"ranks_cpu_s":%s,"load_s":%s,"wall_s":%s,"bytes":%d,"server_requests":%d,"server_reads":%d}\n' \
    "$way" "$n" "$p" "$np" "$ranks" "${slow:-null}" "${imp:-null}" "${cpu:-null}" "$load_s" \
    "$(sub "$t0" "$t_end")" "$bytes" $(( ${o1% *} - ${o0% *} )) $(( ${o1#* } - ${o0#* } )) | tee -a "$RES"
}

echo "=== N in $NODES x P in $RANKS, ways $WAYS"
for n in $NODES; do
  for p in $RANKS; do
    for way in $WAYS; do run_way "$way" "$n" "$p"; done
  done
done
stop_mds
cat > "$OUT/params.json" <<EOJ
{"nodes": "$NODES", "ranks": "$RANKS", "latency": "$LAT", "mds_delay_us": $MDS_US, "env_inodes": $FILES,
 "pool_bytes": $(stat -c %s "$E/pools/sci/1.sqfs"), "cores": $(nproc), "command": "bench/pyenv-import.sh \"$NODES\" \"$RANKS\"",
 "duration_s": $(( $(date +%s) - t_begin ))}
EOJ
echo "done in $(( $(date +%s) - t_begin )) s: $OUT"
