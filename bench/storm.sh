#!/usr/bin/env bash
# The loading-storm benchmark (not a test). On the virtual cluster, a Pynamic-like Python
# package (bench/storm_gen.py: M extension modules, each linked to its own library of F functions)
# plus numpy from PyPI (pip --target) is imported by N nodes x P ranks, three ways:
#   (a) shared   straight from shared storage (PYTHONPATH on the sshfs mount)
#   (b) bundled  `sw-pool bundle --python --trace` into a pool, `sw-pool load` (broadcast to the
#                node-local cache, mounted), imported from the mount; the load is inside the time
#   (c) mounted  the same pool mounted on every node straight from shared storage (squashfuse_ll
#                run on the pool file over sshfs, no copy, no verification: Apptainer style;
#                `sw-pool mount` would copy a pool into the verified cache first)
#   (v) view     the unprepared tree, no build step: every rank under `sw-pool run --cache
#                $S/site --cache $S/pypi` (one environment per node: the ranks of a node join it),
#                each node's view lists the trees once and reads each file once (STORM_WAYS="a b v")
#   (j) job view the same under Slurm (`srun --mpi=pmix`, one step of N x P tasks): the job-wide
#                view: one node lists each tree, each file is read from storage by one node and
#                passed to the others over MPI (`view-serve`, started by the step's task 0)
#   (s) shared   (a) launched by srun as (j) is, to compare the two with the same launcher
# For every run: the time from launch to the end of the imports and calls on the slowest rank, the
# bytes the storage server sent (testbed/storage-bytes), and the storage server's work counted on
# the server: the requests it served (open, lstat, readdir, read, close ...) from its own log
# (testbed up --sftp-log: OpenSSH's sftp-server at DEBUG3, one line per request; testbed/storage-ops),
# metadata requests and reads apart; also the read + write system calls of every process in the
# storage namespace (/proc/PID/io syscr + syscw), which include the ssh transport's socket I/O and
# so vary with packet timing; and the CPU seconds the whole machine was busy during the run
# (machine_cpu_s, /proc/stat: every virtual node shares the same cores, so it is what all of the
# nodes' ranks, servers and storage took together). A separate pass (STORM_STRACE_CONFIGS) attaches `strace -c -f` to
# those processes for a per-syscall breakdown (open/stat/getdents/read ...); its times are not used.
# Also: both link modes of the bundle (DT_NEEDED $ORIGIN paths vs RUNPATH) compared on one node.
#
#   bench/storm.sh [M] [F] ["NODES"] ["RANKS"]      defaults: 200 200 "1 2 4 8" "1 2 4"
#   env: STORM_LATENCY=0.5ms  (tc netem delay added on the storage server's link; "0" for none)
#        STORM_MDS_DELAY_US=0 (microseconds added to every metadata syscall of the storage server,
#                              by strace -e inject=…:delay_enter; for kernels without netem)
#        STORM_PYPI="numpy"   (PyPI packages installed with pip --target and imported; "" for none)
#        STORM_WAYS="a b c"   STORM_STRACE_CONFIGS="1x1 8x4"
#        STORM_VIEW_TREES="site pypi" (the trees (v) and (j) view, one --cache each; "." = their
#                             parent, one view of both)
#        STORM_OUT=bench/results/storm-<date>
#        STORM_PERF=1         (perf record -a during each timed run: perf-WAY-NxP.txt, the machine's CPU by command;
#                             "keep": and its perf-WAY-NxP.data)
#        STORM_LOCAL_DISK=ext4 (the nodes' cache (sw-pool-0 in $LOCAL_TMPDIR: the pools' copies, the
#                             views' warm start) on a journaled ext4 of each node's own, as a node's
#                             SSD; "none": the testbed's directory on the VM's root file system)
# Takes the machine-wide cluster lock, brings the testbed up with 8 nodes, always takes it down.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
# shellcheck source=lib.sh
. "$REPO/bench/lib.sh"
[ "$(id -u)" = 0 ] || { echo "bench/storm.sh: must run as root (the testbed)" >&2; exit 1; }
if [ -z "${SWP_CLUSTER_SESSION:-}" ]; then
  SWP_CLUSTER_SESSION=1 exec flock -o -w 3600 /var/tmp/swp-cluster-session.lock "$0" "$@"
fi
M=${1:-200}
F=${2:-200}
NODES=${3:-"1 2 4 8"}
RANKS=${4:-"1 2 4"}
LAT=${STORM_LATENCY:-0.5ms}
MDS_US=${STORM_MDS_DELAY_US:-0}
PYPI=${STORM_PYPI-numpy}
WAYS=${STORM_WAYS:-"a b c"}
STRACE_CONFIGS=${STORM_STRACE_CONFIGS-"1x1 8x4"}
STAMP=$(date -u +%Y%m%d-%H%M)
OUT=${STORM_OUT:-$REPO/bench/results/storm-$STAMP}
PY=/usr/bin/python3
SW=$REPO/target/release/sw-pool
built_from_tree "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$SW-view" || exit 1
LOCAL_DISK=${STORM_LOCAL_DISK-ext4}
mkdir -p "$OUT"
LOG=$OUT/log.txt
exec > >(tee -a "$LOG") 2>&1
. testbed/env.sh
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

cleanup() { local_disk_down; testbed/down --purge >/dev/null 2>&1 || testbed/down --purge || true; }
trap cleanup EXIT
t_begin=$(date +%s)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
testbed/up -n 8 --sftp-log
. testbed/env.sh
E=$TB/export/storm S=$TB/shared/storm W=$TB/scratch/storm
mkdir -p "$E" "$W/bin"
cp "$SW" "$SW-full" "$SW-enter" "$SW-serve" "$SW-view" "$W/bin/"; SW=$W/bin/sw-pool

# --- the storage server's work: read+write syscalls of every process in its namespace
server_pids() { ip netns pids "$TB_STOR"; }
server_sys() {
  local p s=0 r w
  for p in $(server_pids); do
    r=$(awk '/^syscr/{print $2}' "/proc/$p/io" 2>/dev/null || echo 0)
    w=$(awk '/^syscw/{print $2}' "/proc/$p/io" 2>/dev/null || echo 0)
    s=$((s + ${r:-0} + ${w:-0}))
  done
  echo "$s"
}
# --- requests the server served (its own log), in all and the reads among them: "TOTAL READS"
server_ops() { testbed/storage-ops --by-op | awk '{t += $2} $1 == "read" {r = $2} END {print t + 0, r + 0}'; }
# --- storage latency (metadata cost of a parallel file system): netem under the existing tbf cap
if [[ $LAT != 0 ]]; then
  rate=$(tc -n "$TB_STOR" qdisc show dev eth0 | sed -n 's/.*rate \([0-9.]*[KMG]\{0,1\}bit\).*/\1/p' | head -1)
  if tc -n "$TB_STOR" qdisc replace dev eth0 root handle 1: netem delay "$LAT" limit 100000 2>/dev/null; then
    tc -n "$TB_STOR" qdisc add dev eth0 parent 1: handle 2: tbf rate "${rate:-400Mbit}" burst 1mb latency 50ms
    echo "storage link: netem delay $LAT + tbf ${rate:-400Mbit}"
  else
    # this kernel has no sch_netem (e.g. a Firecracker guest): measure without added latency, say so
    echo "storage link: tc netem is not available in this kernel; NO latency added (tbf ${rate:-400Mbit} only)"
    LAT="none (netem unavailable)"
  fi
  tc -n "$TB_STOR" qdisc show dev eth0
fi
# --- metadata latency on the server (STORM_MDS_DELAY_US): strace attached to the sftp sessions
# delays every file-metadata system call (open, stat, lstat, readlink, getdents, ...) by that many
# microseconds before it runs, as a parallel file system's metadata server would; data reads are
# not delayed. ptrace also costs every other server syscall a few microseconds.
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

# --- the software: generated package + PyPI set, on the storage server's disk
t=$(date +%s)
$PY bench/storm_gen.py "$E" "$M" "$F" --python "$PY" -j 2
if [[ -n $PYPI ]]; then
  # shellcheck disable=SC2086
  $PY -m pip install -q --disable-pip-version-check --no-compile --target "$E/pypi" $PYPI 2>&1 | grep -v -E 'dependency resolver|requires numpy|Running pip as' || true
  $PY -m compileall -q "$E/pypi" >/dev/null 2>&1 || true
fi
$PY -m compileall -q "$E/site" >/dev/null
chmod -R a+rX "$E"
EXTRA=$(echo "$PYPI" | tr ' ' ',')
echo "generated M=$M F=$F + pypi '$PYPI' in $(( $(date +%s) - t )) s; $(find "$E" -type f | wc -l) files, $(du -sh "$E" | cut -f1)"

# --- bundle it: the traced import, with --python; both link modes
mkdir -p "$E/pools/storm" "$E/pools/stormrp"
for mode in needed runpath; do
  dest=$E/pools/storm/1.sqfs; [[ $mode == runpath ]] && dest=$E/pools/stormrp/1.sqfs
  name=storm; [[ $mode == runpath ]] && name=stormrp
  t=$(now)
  PYTHONPATH=$E/site:$E/pypi STORM_EXTRA=$EXTRA "$SW" bundle --name "$name" --version 1 --link "$mode" \
    --python="$PY" -o "$dest" --trace -- "$PY" -m stormpkg.driver
  echo "bundle --link $mode: $(awk -v a="$t" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}') s, pool $(stat -c %s "$dest") bytes"
done
POOL_SIZE=$(stat -c %s "$E/pools/storm/1.sqfs")
chmod -R a+rX "$E"

# --- both link modes on one node (node1), pool mounted from local disk: loader work and time
linkcmp=$OUT/linkmodes.txt
: > "$linkcmp"
for name in storm stormrp; do
  mnt=$TB/local/lm-$name
  testbed/exec node1 sh -c "mkdir -p $TB/local/lmp $mnt && cp $S/pools/$name/1.sqfs $TB/local/lmp/$name.sqfs && $SW mount $TB/local/lmp/$name.sqfs $mnt" >/dev/null
  pp=$mnt/install/$name/1/python
  testbed/exec node1 env PYTHONPATH="$pp" STORM_EXTRA="$EXTRA" $PY -m stormpkg.driver >/dev/null   # warm
  calls=$(testbed/exec node1 sh -c "cd /tmp && PYTHONPATH=$pp STORM_EXTRA=$EXTRA strace -f -c -e trace=%file -o /tmp/lm.\$\$ $PY -m stormpkg.driver >/dev/null && tail -n 1 /tmp/lm.\$\$; rm -f /tmp/lm.\$\$")
  times=""
  for _ in 1 2 3 4 5; do
    times+=" $(testbed/exec node1 env PYTHONPATH="$pp" STORM_EXTRA="$EXTRA" $PY -c 'import time,runpy,sys,io; t=time.time(); sys.stdout=io.StringIO(); runpy.run_module("stormpkg.driver", run_name="__main__"); sys.stdout=sys.__stdout__; print(round(time.time()-t,4))')"
  done
  echo "$name file-syscalls(total calls, errors): $calls | import+call seconds (5 warm runs):$times" | tee -a "$linkcmp"
  testbed/exec node1 "$SW" umount "$mnt" >/dev/null
done
testbed/exec node1 rm -rf "$TB/local/lmp"

hosts() { local n=$1 p=$2 h="" i; for ((i = 1; i <= n; i++)); do h+="node$i:$p,"; done; echo "${h%,}"; }
RES=$OUT/runs.jsonl
: > "$RES"
MNT=$TB/local/stormmnt
CACHE=$TB/local/sw-pool-0

# The nodes' caches (the views' warm start, sw-pool-0) and mount point are removed after each run,
# and a run starts at least 21 s after that: every run starts cold, the nodes' sshfs included
# (its directory and attribute cache keeps an entry 20 s, cache_timeout: with a 6 s wait, as before
# 2026-11-29 23:20, a run could meet in it what the run before it listed).
# The node's cache is on a journaled ext4 of its own (STORM_LOCAL_DISK=ext4, an 8 GiB image in the
# node's directory, mounted in the node's mount namespace only), as a node's SSD would be. The
# testbed's node directories are on the VM's root file system, an aged ext4 without a journal: there
# a new inode skips those freed recently (ext4's recently_deleted(), checked only without a journal)
# and each costs about 10 times more. Measured in a node on 2026-11-29, 4,000 files (create, write
# 4 KiB, rename): 2.4 and 3.8 s there (the second right after removing the first's), 0.24 and 0.33 s
# on the node's ext4. The views' warm-start entries spent 1.6 to 2.5 of an 8 x 4 run's CPU seconds
# so (bench/results/storm-job-20261129-perf/README.md).
local_disk_up() {
  [[ $LOCAL_DISK == ext4 ]] || return 0
  testbed/exec all sh -c "rm -rf '$CACHE' && mkdir -m 0700 '$CACHE' && truncate -s 8G '$TB/local/cache.img' &&
    mkfs.ext4 -q -F '$TB/local/cache.img' && mount -o loop '$TB/local/cache.img' '$CACHE' && chmod 0700 '$CACHE'"
}
local_disk_down() {
  [[ ${LOCAL_DISK:-none} == ext4 && -n ${TB:-} ]] || return 0
  testbed/exec all sh -c "umount '$CACHE' 2>/dev/null; rm -f '$TB/local/cache.img'" >/dev/null 2>&1 || true
}
# perf_table DATA SORT LINES: the first LINES rows of perf's report of DATA by SORT, no comments
perf_table() {
  perf report -i "$1" --sort "$2" --stdio 2>/dev/null | grep -v -e '^#' -e '^$' | head -"$3" || true
}
CLEARED=0
clear_nodes() {
  # (the cache's contents: with STORM_LOCAL_DISK=ext4 it is the node's file system's root)
  testbed/exec all sh -c "rm -rf '$MNT'; [ -d '$CACHE' ] && find '$CACHE' -mindepth 1 -delete" >/dev/null 2>&1 || true
  sync; CLEARED=$(date +%s)
}
local_disk_up
clear_nodes
run_way() {  # run_way WAY N P TRACE(0/1) -> one JSON line in $RES
  local way=$1 n=$2 p=$3 tr=$4 pp t0 out rc=0 b0 s0 o0 o1 bytes sysc load_s="null" st_pid="" st_file=""
  local np=$((n * p)) h1 hp
  h1=$(hosts "$n" 1); hp=$(hosts "$n" "$p")
  local since=$(( $(date +%s) - CLEARED ))
  (( since >= 21 )) || sleep $(( 21 - since ))
  drop
  if [[ $tr == 1 ]]; then
    st_file=$OUT/strace-$way-${n}x$p.txt
    local args=() q
    for q in $(server_pids); do args+=(-p "$q"); done
    strace -c -f -o "$st_file" "${args[@]}" 2>/dev/null & st_pid=$!
    sleep 1
  fi
  b0=$(testbed/storage-bytes); s0=$(server_sys); o0=$(server_ops)
  local by0 cpu0; by0=$(testbed/storage-ops --by-op); cpu0=$(machine_busy)
  local pf_pid="" pf_data=""
  if [[ ${STORM_PERF:-0} != 0 ]]; then
    pf_data=$OUT/perf-$way-${n}x$p.data
    perf record -a -F 499 -o "$pf_data" >/dev/null 2>&1 & pf_pid=$!
    sleep 0.5
  fi
  t0=$(now)
  case $way in
    a|v|j|s) pp=$S/site:$S/pypi ;;
    b) pp=$MNT/install/storm/1/python
       testbed/mpirun -np "$n" -H "$h1" "$SW" load -q -m "$MNT" "$S/pools/storm/1.sqfs" >/dev/null || rc=$?
       load_s=$(sub "$t0" "$(now)") ;;
    c) pp=$MNT/install/storm/1/python
       testbed/mpirun -np "$n" -H "$h1" sh -c "mkdir -p $MNT && squashfuse_ll -o ro,nosuid,nodev $S/pools/storm/1.sqfs $MNT" >/dev/null || rc=$?
       load_s=$(sub "$t0" "$(now)") ;;
  esac
  local wrap=()
  if [[ $way == v || $way == j ]]; then
    local t
    wrap=("$SW" run)
    for t in ${STORM_VIEW_TREES:-site pypi}; do
      if [[ $t == . ]]; then wrap+=(--cache "$S"); else wrap+=(--cache "$S/$t"); fi
    done
    wrap+=(--)
  fi
  if [[ $way == j || $way == s ]]; then
    out=$(tb_srun "$n" "$np" PYTHONPATH="$pp",STORM_T0="$t0",STORM_EXTRA="$EXTRA" \
          "${wrap[@]}" $PY -m stormpkg.driver 2>&1) || rc=$?
  else
    out=$(testbed/mpirun -np "$np" -H "$hp" -x PYTHONPATH="$pp" -x STORM_T0="$t0" -x STORM_EXTRA="$EXTRA" \
          "${wrap[@]}" $PY -m stormpkg.driver 2>&1) || rc=$?
  fi
  local t_end cpu; t_end=$(now); cpu=$(sub "$cpu0" "$(machine_busy)")
  if [[ -n $pf_pid ]]; then
    kill -INT "$pf_pid" 2>/dev/null || true; wait "$pf_pid" 2>/dev/null || true
    { echo "# perf record -a -F 499 during $way ${n}x$p: the machine's CPU by command (swapper = idle)"
      perf_table "$pf_data" comm 40
      echo "# by command and object"
      perf_table "$pf_data" comm,dso 60
    } > "$OUT/perf-$way-${n}x$p.txt"
    [[ $STORM_PERF == keep ]] || rm -f "$pf_data" "$pf_data.old"
  fi
  if [[ $way == j ]]; then
    # the job-wide view's servers: their log (listing, figures) and the ranks' own lines
    { testbed/exec node1 sh -c 'cat /run/sw-pool/view-*.log 2>/dev/null; rm -f /run/sw-pool/view-*.log' || true
      grep -v '"since_t0_s"' <<< "$out" || true; } > "$OUT/j-${n}x$p.log"
  fi
  bytes=$(( $(testbed/storage-bytes) - b0 )); sysc=$(( $(server_sys) - s0 )); o1=$(server_ops)
  # the run's requests by kind (open, lstat, opendir, readdir, read, close ...)
  join -a 2 -e 0 -o 2.1,1.2,2.2 <(sort <<< "$by0") <(testbed/storage-ops --by-op | sort) \
    | awk '$3 - $2 > 0 {print $1, $3 - $2}' | sort -k2,2 -rn > "$OUT/ops-$way-${n}x$p.txt" || true
  if [[ -n $st_pid ]]; then kill -INT "$st_pid" 2>/dev/null || true; wait "$st_pid" 2>/dev/null || true; fi
  case $way in
    b) testbed/mpirun -np "$n" -H "$h1" "$SW" unload -q "$MNT" >/dev/null 2>&1 || true ;;
    c) testbed/mpirun -np "$n" -H "$h1" fusermount3 -u "$MNT" >/dev/null 2>&1 || true ;;
  esac
  clear_nodes
  local ranks slow imp
  # grep -o: mpirun may put two ranks' lines on one
  ranks=$( (grep -o '"since_t0_s": [0-9.]*' <<< "$out" || true) | wc -l)
  # (no rank reported: empty, and the run is still recorded)
  slow=$(grep -o '"since_t0_s": [0-9.]*' <<< "$out" | sed 's/.*: //' | sort -g | tail -1) || true
  imp=$(grep -o '"import_s": [0-9.]*' <<< "$out" | sed 's/.*: //' | sort -g | tail -1) || true
  [[ $ranks == "$np" ]] || { echo "run $way ${n}x$p: only $ranks of $np ranks reported (rc=$rc):"; tail -n 5 <<< "$out"; }
  printf '{"way":"%s","nodes":%d,"ppn":%d,"ranks":%d,"ok_ranks":%d,"slowest_s":%s,"slowest_import_s":%s,"load_s":%s,"wall_s":%s,"bytes":%d,"server_requests":%d,"server_reads":%d,"server_syscalls":%d,"machine_cpu_s":%s,"strace":%s}\n' \
    "$way" "$n" "$p" "$np" "$ranks" "${slow:-null}" "${imp:-null}" "$load_s" \
    "$(sub "$t0" "$t_end")" "$bytes" \
    $(( ${o1% *} - ${o0% *} )) $(( ${o1#* } - ${o0#* } )) "$sysc" "$cpu" \
    "$([[ -n $st_file ]] && echo "\"$(basename "$st_file")\"" || echo null)" | tee -a "$RES"
}

echo "=== matrix: N in $NODES x P in $RANKS, ways $WAYS"
for n in $NODES; do
  for p in $RANKS; do
    for way in $WAYS; do
      run_way "$way" "$n" "$p" 0
    done
  done
done
stop_mds   # one tracer per process: the counting pass below attaches its own
if [[ -n $STRACE_CONFIGS ]]; then
  echo "=== server-side strace -c pass (times not used): $STRACE_CONFIGS"
  RES_MAIN=$RES; RES=$OUT/runs-strace.jsonl; : > "$RES"
  for c in $STRACE_CONFIGS; do
    for way in $WAYS; do run_way "$way" "${c%x*}" "${c#*x}" 1; done
  done
  RES=$RES_MAIN
fi
cat > "$OUT/params.json" <<EOF
{"M": $M, "F": $F, "nodes": "$NODES", "ranks": "$RANKS", "latency": "$LAT", "mds_delay_us": $MDS_US, "pypi": "$PYPI",
 "pool_bytes": $POOL_SIZE, "files": $(find "$E/site" "$E/pypi" -type f 2>/dev/null | wc -l),
 "command": "bench/storm.sh $M $F \"$NODES\" \"$RANKS\"", "storage_rate": "$(cat "$TB/run/storage-rate" 2>/dev/null || echo default)",
 "local_disk": "$LOCAL_DISK", "source": "$(source_rev)",
 "duration_s": $(( $(date +%s) - t_begin )), "loadavg_start": "$LOAD_START", "loadavg_end": "$(cut -d' ' -f1-3 /proc/loadavg)"}
EOF
$PY bench/storm_report.py "$OUT" || echo "report failed (results kept in $OUT)"
echo "done in $(( $(date +%s) - t_begin )) s: $OUT"
