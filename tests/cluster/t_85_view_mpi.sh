#!/usr/bin/env bash
# An unprepared tree read once (`sw-pool run --cache TREE`, issue 55) under real Slurm, as the
# unprivileged test user on 4 nodes. TREE is on shared storage (the storage server's export, seen
# by the nodes through the coherent sshfs mount): an MPI program (bin/), the shared library it is
# linked with (lib/, RUNPATH $ORIGIN/../lib), plugins it `dlopen`s (plugins/) and data files, built
# by this test with mpicc against Open MPI and against MPICH; nothing in it was packed or changed.
# - two ranks per node, the first task arriving last on its node: it joins the environment (0c)
# - job-wide (a step of several nodes: `view-serve` servers started by task 0): the tree listed
#   once by the nodes together, the small files of a directory fetched ahead at the first read of
#   one of them, each file read from storage at most once for the job (the servers' own figures);
#   what the job read
#   on a node listed by `sw-pool cache trace --view TREE`;
# - unmodified on 4 nodes, Open MPI (`srun --mpi=pmix`) and MPICH (`srun --mpi=pmi2`): every rank
#   runs the program from the tree, calls the library and the plugin, reads a data file; then the
#   tree is made unreadable on the storage server (chmod 000, every directory) while the job waits
#   at a barrier, and the job still completes from what it read, while a file it never read (listed) and a `dlopen`
#   of a plugin it never loaded fail with EIO and a name the tree never had with ENOENT, at once;
# - one version per job: the data file is rewritten on storage after 3 nodes read it and before the
#   4th node's environment (and view) starts: the 4th is served the version the others were (the
#   job's view lists the tree once and its owner reads each file once);
#   the same as a race for 12 s: the storage server rewrites 48 times, the 4 nodes' views start 0 to
#   9 s into the step and open 40 files each: no file is served in two versions;
# - the view of one node killed (SIGKILL) while the job runs: that node's next open fails at once
#   (ENOTCONN), the others go on, the job ends, and the Slurm epilog finds nothing left: no view
#   server, no mount of the tree, no record, no rendezvous socket on any node.
# T85_VIEW_BIN runs another sw-pool-view (e.g. an older build, to see a check fail).
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
require_testbed
cd /
lazy_fixture t85
VIEW=${T85_VIEW_BIN:-$REPO/target/release/sw-pool-view}
[[ -x $VIEW ]] || { fail "sw-pool-view built" "$VIEW missing (cargo build --release -p swpool-serve)"; finish; }
cp "$VIEW" "$W/bin/sw-pool-view"
cp "$REPO/tests/cluster/srun-mpi" "$W/bin/"
chmod -R a+rX "$W/bin"
install_epilog
# the views this test's jobs started (their command line names $W's server), then the fixture's
t85_cleanup() {
  local p
  # shellcheck disable=SC2009  # the exact server of this test, not a name
  for p in $(ps -u "$uid" -o pid=,args= | awk -v s="$W/bin/sw-pool-view" '$2 == s {print $1}'); do
    kill -9 "$p" 2>/dev/null || true
  done
  lazy_cleanup
}
[[ -n ${LAZY_KEEP:-} ]] || trap t85_cleanup EXIT
T=$E/tree                      # the storage server's side
TREE=$TB/coherent/t85-$$/tree  # what the nodes see

# --- the tree: a program for each MPI, its library, two plugins, data
mkdir -p "$T/bin" "$T/lib" "$T/plugins" "$T/data" "$W/src"
cat > "$W/src/lib.c" <<'C'
const char *t85_lib(void) { return "libt85-1"; }
C
cat > "$W/src/plugin.c" <<'C'
const char *t85_plugin(void) { return "plugin-1"; }
C
cat > "$W/src/other.c" <<'C'
const char *t85_plugin(void) { return "other-1"; }
/* over 64 KiB: not among the small files a job-wide view fetches ahead */
const char t85_pad[100000] = {1};
C
cat > "$W/src/prog.c" <<'C'
/* prog MODE OUT: MODE basic, version or kill (see t_85_view_mpi.sh); OUT: where the test and the
 * ranks leave each other marks. The tree is found from the program's own path (TREE/bin/prog). */
#include <mpi.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *t85_lib(void);
static char tree[PATH_MAX], host[256];

static void hang(int s) {
  (void)s;
  static const char m[] = "HANG: a call on the tree did not return within 20 s\n";
  (void)!write(2, m, sizeof m - 1);
  _exit(9);
}
static void mark(const char *out, const char *name) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", out, name);
  int fd = open(p, O_CREAT | O_WRONLY, 0644);
  if (fd >= 0) close(fd);
}
static void wait_mark(const char *out, const char *name) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", out, name);
  for (int i = 0; i < 2400; i++) {
    if (access(p, F_OK) == 0) return;
    usleep(50000);
  }
  fprintf(stderr, "%s: no %s after 120 s\n", host, p);
  MPI_Abort(MPI_COMM_WORLD, 3);
}
/* the first line of TREE/REL, or "ERR " and why */
static const char *slurp(const char *rel, char *buf, size_t n) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", tree, rel);
  alarm(20);
  int fd = open(p, O_RDONLY);
  ssize_t k = -1;
  int e = errno;
  if (fd >= 0) {
    k = read(fd, buf, n - 1);
    e = errno;
    close(fd);
  }
  alarm(0);
  if (k < 0) {
    snprintf(buf, n, "ERR %s", strerror(e));
    return buf;
  }
  buf[k] = 0;
  buf[strcspn(buf, "\n")] = 0;
  return buf;
}
/* what plugins/NAME's t85_plugin says, or "ERR " and dlerror */
static const char *plugin(const char *name, char *buf, size_t n) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/plugins/%s", tree, name);
  alarm(20);
  void *h = dlopen(p, RTLD_NOW);
  alarm(0);
  if (!h) {
    snprintf(buf, n, "ERR %s", dlerror());
    return buf;
  }
  const char *(*f)(void) = (const char *(*)(void))dlsym(h, "t85_plugin");
  snprintf(buf, n, "%s", f ? f() : "ERR no t85_plugin");
  return buf;
}
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: prog basic|version|kill OUT\n");
    return 2;
  }
  const char *mode = argv[1], *out = argv[2];
  ssize_t k = readlink("/proc/self/exe", tree, sizeof tree - 1);
  if (k <= 0) {
    perror("/proc/self/exe");
    return 2;
  }
  tree[k] = 0;
  for (int up = 0; up < 2; up++) *strrchr(tree, '/') = 0;
  gethostname(host, sizeof host);
  signal(SIGALRM, hang);
  char a[512], b[512], c[512], d[512], e[512];
  if (!strcmp(mode, "version")) {
    /* before MPI_Init: this node's environment may be the last to start */
    printf("version %s %s\n", host, slurp("data/version.txt", a, sizeof a));
    fflush(stdout);
    char m[300];
    snprintf(m, sizeof m, "read.%s", host);
    mark(out, m);
  }
  if (!strcmp(mode, "race")) {
    /* 40 files, each node in its own order, one every 50 ms, before MPI_Init */
    const char *id = getenv("SLURM_NODEID");
    for (int i = 0; i < 40; i++) {
      int f = (i + (id ? atoi(id) : 0) * 10) % 40;
      char rel[64];
      snprintf(rel, sizeof rel, "data/race/f%02d", f);
      printf("race %s f%02d %s\n", host, f, slurp(rel, a, sizeof a));
      usleep(50000);
    }
    fflush(stdout);
  }
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (strcmp(mode, "version") && strcmp(mode, "race")) {
    printf("start %d/%d %s lib=%s plugin=%s data=%s\n", rank, size, host, t85_lib(),
           plugin("plugin.so", a, sizeof a), slurp("data/seen.txt", b, sizeof b));
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) mark(out, "ready");
    wait_mark(out, "go");
    double t0 = now();
    printf("after %d/%d %s lib=%s plugin=%s data=%s never=%s missing=%s plugin2=%s ms=%.0f\n", rank,
           size, host, t85_lib(), plugin("plugin.so", a, sizeof a), slurp("data/seen.txt", b, sizeof b),
           slurp("data/never.txt", c, sizeof c), slurp("data/no-such-file", d, sizeof d),
           plugin("other.so", e, sizeof e), (now() - t0) * 1000);
    fflush(stdout);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
C
built=1
(
  set -e
  cd "$T"
  gcc -shared -fPIC -o lib/libt85.so "$W/src/lib.c"
  gcc -shared -fPIC -o plugins/plugin.so "$W/src/plugin.c"
  gcc -shared -fPIC -o plugins/other.so "$W/src/other.c"
  mpicc.openmpi -o bin/prog-ompi "$W/src/prog.c" -Llib -lt85 -ldl -Wl,--enable-new-dtags,-rpath,'$ORIGIN/../lib'
  if command -v mpicc.mpich >/dev/null; then
    mpicc.mpich -o bin/prog-mpich "$W/src/prog.c" -Llib -lt85 -ldl -Wl,--enable-new-dtags,-rpath,'$ORIGIN/../lib'
  fi
  echo seen-1 > data/seen.txt
  # (over 64 KiB: not among the small files a job-wide view fetches ahead)
  { echo never-1; head -c 100000 /dev/zero | tr '\0' x; } > data/never.txt
  echo v1 > data/version.txt
  mkdir data/race
  # (over 64 KiB at first, so that each is read when a node first opens it; a rewrite makes it small)
  for f in $(seq -w 0 39); do { echo "f$f v0"; head -c 70000 /dev/zero | tr '\0' x; } > "data/race/f$f"; done
  # a venv's interpreter link: absolute (some sftp servers refuse to read such a link: EPERM)
  ln -s /usr/bin/python3 bin/abs-python3
) || built=0
chmod -R a+rX "$T"
if [[ $built == 1 ]]; then
  pass "built the tree on shared storage: a program per MPI, its library, two plugins, data"
else
  fail "built the tree on shared storage" "gcc / mpicc.openmpi / mpicc.mpich failed"; finish
fi
# a view serves no file changed in the second its job step started or after (one version per job):
# the step starts at least a second after the tree was written
sleep 1.1

swenv() { as_user env SW_POOL_SYSTEM_CONFIG= SW_POOL_USER_CONFIG= "$@"; }
# run_job NAME SRUN-ARGS...: the step in the background (bounded), its output in $W/out/NAME/
run_job() {
  local o=$W/out/$1; shift
  mkdir -p "$o" && chmod 1777 "$o"
  (
    rc=0
    swenv timeout 240 "$@" > "$o/log" 2> "$o/err" || rc=$?
    echo "$rc" > "$o/rc"
  ) &
}
# wait_mark NAME FILE: up to 120 s for $W/out/NAME/FILE
wait_mark() { wait_for 1200 test -e "$W/out/$1/$2"; }
job_rc() { wait_mark "$1" rc && cat "$W/out/$1/rc"; }
show() { sed 's/^/    /' "$W/out/$1/log" "$W/out/$1/err" | tail -n 30; }

# --- 0. an absolute symlink in the tree: listed, its target as storage gives it (or refused as
# storage refuses it), never the whole view lost
out=$(swenv timeout 120 srun -N1 --chdir="$W" "$SW" run --cache "$TREE" -- sh -c \
  "readlink $TREE/bin/abs-python3 || echo refused; cat $TREE/data/seen.txt" 2>"$W/abs-link.err") && rc=0 || rc=$?
assert_eq "abs-link: a tree with an absolute symlink is viewed (exit status)" 0 "$rc"
assert_match "abs-link: its target as storage gives it, or refused; the rest served" \
  "^(/usr/bin/python3|refused)"$'\n'"seen-1$" "$out"

# --- 0b. the servers' step cannot start (srun refuses the node list task 0 gives it): task 0's
# view is told at once (SOCKET.failed, written when that srun ends), says why and lists and reads
# the tree itself, instead of waiting --job-wait (90 s) for a server that will not come
t0=$SECONDS
out=$(swenv timeout 150 srun -N1 --chdir="$W" env SLURM_STEP_NODELIST=no-such-node "$SW" run --cache "$TREE" -- \
  cat "$TREE/data/seen.txt" 2>"$W/no-servers.err") && rc=0 || rc=$?
took=$((SECONDS - t0))
assert_eq "no-servers: the step ran without the servers (exit status, output)" "0 seen-1" "$rc $out"
assert_match "no-servers: the view names the servers' failure and goes on by itself" \
  "servers' step \(srun\) ended before serving.*this node lists and reads" "$(tr '\n' ' ' < "$W/no-servers.err")"
assert_le "no-servers: it went on at once, not after the 90 s wait (seconds)" "$took" 45

# --- 0c. two ranks per node, the first task (it starts the servers) the second to arrive on its
# node: it joins the environment the other rank made; a multithreaded task cannot join its user
# namespace (EINVAL, a step lost one rank of 32 so in bench/storm.sh on 2026-11-29)
out=$(swenv timeout 150 srun -N2 --ntasks-per-node=2 --overcommit --chdir="$W" bash -c \
  "if [ \"\$SLURM_PROCID\" = 0 ]; then sleep 3; fi; exec $SW run --cache $TREE -- cat $TREE/data/seen.txt" \
  2>"$W/join.err") && rc=0 || rc=$?
assert_eq "join: 2 nodes x 2 ranks, the first task last on its node: every rank read through the view (exit status, ranks)" \
  "0 4" "$rc $(grep -cx seen-1 <<< "$out" || true)"
[[ $rc == 0 ]] || sed 's/^/    /' "$W/join.err" | tail -n 10

# --- 1. unmodified on 4 nodes, then the tree unreadable on storage mid-job
# Every directory of the tree, not its top only: a view server keeps the directories it read
# below open (as descriptors), and below a directory held open a file stays reachable when only
# a directory above it is closed to the user, for the server as for any process holding it open.
tree_dirs() {  # tree_dirs MODE: every directory of the tree (storage side, as root) to MODE
  find "$T" -depth -type d -exec chmod "$1" {} +
}
basic() {  # basic NAME PROG SRUN...
  local name=$1 prog=$2 out o rc try; shift 2
  o=$W/out/$name
  for try in 1 2 3; do
    # this job's servers' log only (an earlier step's, such as abs-link's one-node view or a
    # failed try's, goes)
    "$TESTBED/exec" node1 sh -c "rm -f /tmp/sw-pool-$uid/view-*.log" || true
    rm -rf "$o"
    tree_dirs 755
    run_job "$name" "$@" -N4 --ntasks-per-node=1 --chdir="$W" "$SW" run --cache "$TREE" -- "$TREE/bin/$prog" basic "$o"
    wait_for 1200 sh -c "[ -e $o/ready ] || [ -e $o/rc ]" || true
    [[ -e $o/ready ]] && break
    # MPICH's start-up on the testbed fails now and then in MPI_Init, after every rank loaded
    # its program and library from the view and before any reaches the tree's checks: UCX's
    # address exchange between the nodes times out (2026-11-28, probes of 4-node steps: 3 of 68
    # through the view, 0 of 22 without; 2 of 4 in this test): up to twice more, said
    # The failed try's ranks had read the program and library through their views, which keep
    # them in each node's warm start (of this tree: made by this test, so newer than its sources);
    # they go, or the next try would find them warm and fetch nothing ahead
    if [[ $try != 3 ]] && grep -q 'initial_address_exchange' "$o/err" 2>/dev/null; then
      echo "    $name: MPI_Init failed in UCX's address exchange (no rank reached the tree's checks): once more, the nodes' warm starts of this test removed"
      for n in "${nodes[@]:0:4}"; do
        "$TESTBED/exec" "$n" sh -c "find $TB/local/sw-pool-$uid/views -mindepth 1 -maxdepth 1 -newer $W/src/prog.c -exec rm -rf {} +" </dev/null >/dev/null 2>&1 || true
      done
      continue
    fi
    fail "$name: the ranks started and read the tree" "no ready mark in 120 s"; show "$name"; return
  done
  # the storage server's side: nobody but root may enter the tree any more
  tree_dirs 000
  out=$("$TESTBED/exec" node2 runuser -u "$TB_USER" -- cat "$TREE/data/never.txt" 2>&1 || true)
  assert_match "$name: the tree is unreadable to $TB_USER on storage (node2, straight)" "Permission denied" "$out"
  touch "$o/go"
  rc=$(job_rc "$name" || true)
  tree_dirs 755
  out=$(cat "$o/log" 2>/dev/null || true)
  assert_eq "$name: the job completed (srun exit status)" 0 "$rc"
  assert_eq "$name: 4 ranks on 4 nodes ran the program from the tree, with its library and dlopened plugin" \
    "4 4" "$(grep -cE '^start [0-3]/4 node[0-9]+ lib=libt85-1 plugin=plugin-1 data=seen-1$' <<< "$out") $(awk '/^start/ {print $3}' <<< "$out" | sort -u | grep -c .)"
  assert_eq "$name: after the tree became unreadable every rank still had its library, plugin and data; a file never read and a plugin never loaded gave EIO, a name never there ENOENT" \
    4 "$(grep -cE '^after [0-3]/4 node[0-9]+ lib=libt85-1 plugin=plugin-1 data=seen-1 never=ERR Input/output error missing=ERR No such file or directory plugin2=ERR .*other.so: .*Input/output error ms=[0-9]+$' <<< "$out")"
  assert_le "$name: those failures came at once (slowest rank, ms)" "$(awk '/^after/ {sub("ms=", "", $NF); if ($NF > m) m = $NF} END {print m + 0}' <<< "$out")" 2000
  assert_match "$name: the job's standard error names the file not served and why" "data/never.txt: opening it on storage: Permission denied" "$(cat "$o/err")"
  # the job's view servers (their log on task 0's node, node1): one listing; on every node the
  # small files of a directory the job read in fetched ahead (data/version.txt when the program
  # read data/seen.txt), and every file read from storage at most once for the 4 nodes (storage
  # opens, all servers: at most the tree's 48 files, plus the two refused after the chmod)
  local logs ends opens k ahead
  for k in $(seq 300); do
    logs=$("$TESTBED/exec" node1 sh -c "cat /tmp/sw-pool-$uid/view-*.log 2>/dev/null || true")
    [[ $(grep -c 'view server of .* ends' <<< "$logs" || true) -ge 4 ]] && break
    sleep 0.1
  done
  "$TESTBED/exec" node1 sh -c "rm -f /tmp/sw-pool-$uid/view-*.log" || true
  ends=$(grep -c 'view server of .* ends' <<< "$logs" || true)
  opens=$( (grep -o 'storage_opens=[0-9]*' <<< "$logs" || true) | cut -d= -f2 | awk '{s += $1} END {print s + 0}')
  ahead=$( (grep -o ' ahead=[1-9][0-9]*' <<< "$logs" || true) | wc -l)
  assert_eq "$name: the job's 4 view servers ended, one listing made" "4 1" "$ends $(grep -c 'listed once for the job' <<< "$logs" || true)"
  assert_eq "$name: every node fetched the small files of a directory it read in ahead of its reads (servers with ahead > 0)" 4 "$ahead"
  assert_le "$name: every file read from storage at most once for the 4 nodes (storage opens, all servers)" "$opens" 50
  echo "    $name: job-wide view: $opens storage opens for 4 nodes; $(grep -o 'listed once for the job.*' <<< "$logs" | head -1 || true)"
  [[ $ends == 4 ]] || { echo "    the servers' log:"; tail -20 <<< "$logs"; "$TESTBED/exec" node1 sh -c "ls -la /tmp/sw-pool-$uid/" || true; }
  # what the job read, to make a pool of later: the node's warm cache of the tree, listed (the
  # program, its plugin and data file read; the file never read and the plugin never loaded not)
  local tr
  tr=$(swenv timeout 60 srun -N1 -w node2 "$SW" cache trace --view "$TREE" 2>&1 || true)
  assert_eq "$name: cache trace --view on node2 lists the program, plugin and data file the job read there, not the ones it never read" \
    "3 0" "$(grep -cxF -e "$TREE/bin/$prog" -e "$TREE/plugins/plugin.so" -e "$TREE/data/seen.txt" <<< "$tr" || true) $(grep -cE 'never.txt|other.so' <<< "$tr" || true)"
  [[ $(grep -c "^$TREE/" <<< "$tr" || true) -ge 3 ]] || echo "    cache trace --view: $tr"
  [[ $rc == 0 && $(grep -c '^after' <<< "$out") == 4 ]] || show "$name"
}
basic ompi prog-ompi "$W/bin/srun-mpi"
if [[ -x $T/bin/prog-mpich ]]; then
  basic mpich prog-mpich srun --mpi=pmi2
else
  fail "mpich: the program built against MPICH" "mpicc.mpich not found (apt-get install mpich libmpich-dev)"
fi

# --- 2. a file changed on storage mid-job: one version on every node
o=$W/out/version
run_job version "$W/bin/srun-mpi" -N4 --ntasks-per-node=1 --chdir="$W" bash -c \
  "if [ \"\$SLURM_NODEID\" = 3 ]; then for i in \$(seq 1200); do [ -e $o/changed ] && break; sleep 0.1; done; fi
   exec $SW run --cache $TREE -- $TREE/bin/prog-ompi version $o"
if wait_for 1200 sh -c "[ \$(ls $o | grep -c '^read\\.') -ge 3 ]"; then
  # in place on the storage server, after three nodes read it and before the fourth's view starts
  printf 'v2, written during the job\n' > "$T/data/version.txt"
  touch "$o/changed"
  rc=$(job_rc version || true)
  out=$(cat "$o/log" 2>/dev/null || true)
  assert_eq "version: the job completed" 0 "$rc"
  # one listing and one read of the file for the job (its owner kept what it read): the node whose
  # view started after the change is served the version the other three were
  assert_eq "version: all 4 nodes read v1, the one whose view started after the change too: one version in the job" \
    4 "$(grep -cE '^version node[0-9]+ v1$' <<< "$out")"
  grep '^version' <<< "$out" | sed 's/^/    /'
  [[ $rc == 0 ]] || show version
else
  fail "version: three nodes read the file" "not within 120 s"; show version
fi
printf 'v1\n' > "$T/data/version.txt"

# --- 2b. the same as a race, for 12 s: the nodes' environments start 0, 3, 6 and 9 s into the step
# and each opens 40 files in its own order while the storage server rewrites one of them every
# 250 ms (48 rewrites, in place); then no file was served in two versions
o=$W/out/race
run_job race "$W/bin/srun-mpi" -N4 --ntasks-per-node=1 --chdir="$W" bash -c \
  "sleep \$((SLURM_NODEID * 3)); exec $SW run --cache $TREE -- $TREE/bin/prog-ompi race $o"
t0=$(now)
for k in $(seq 1 48); do
  f=$(printf %02d $(((k - 1) % 40)))
  echo "f$f v$k" > "$T/data/race/f$f"
  sleep 0.25
done
took=$(elapsed "$t0")
rc=$(job_rc race || true)
out=$(cat "$o/log" 2>/dev/null || true)
assert_eq "race: the job completed, 4 nodes x 40 files opened" "0 160" "$rc $(grep -c '^race node' <<< "$out")"
assert_le "race: the writer ran at least 10 s" 10 "$took" s
served=$(awk '$1 == "race" && $4 != "ERR" {print $3, $4, $5}' <<< "$out" | sort -u)
assert_eq "race: no file was served in two versions (files with more than one)" 0 "$(awk '{print $1}' <<< "$served" | uniq -d | grep -c . || true)"
echo "    race: $(awk '$1 == "race" && $4 != "ERR"' <<< "$out" | grep -c . || true) opens served, $(grep -c '^race .* ERR Input/output error$' <<< "$out" || true) refused (changed since the step's start), $(grep -c . <<< "$served") (file, version) pairs"
assert_match "race: both happened: files served and files refused" "^[1-9][0-9]* [1-9]" "$(awk '$1 == "race" && $4 != "ERR"' <<< "$out" | grep -c . || true) $(grep -c '^race .* ERR Input/output error$' <<< "$out" || true)"
[[ $rc == 0 ]] || show race

# --- 3. one node's view killed while the job runs
o=$W/out/kill
run_job kill "$W/bin/srun-mpi" -N4 --ntasks-per-node=1 --chdir="$W" "$SW" run --cache "$TREE" -- "$TREE/bin/prog-ompi" kill "$o"
if wait_mark kill ready; then
  ns=$("$TESTBED/exec" node2 readlink /proc/self/ns/net)
  victim=
  # shellcheck disable=SC2009  # this test's server (its path) in node2's network namespace
  for p in $(ps -u "$uid" -o pid=,stat=,args= | awk -v s="$W/bin/sw-pool-view" '$2 !~ /^Z/ && $3 == s {print $1}'); do
    [[ $(readlink "/proc/$p/ns/net" 2>/dev/null) == "$ns" ]] && victim=$p
  done
  assert_match "kill: node2's view server found" "^[0-9]+$" "$victim"
  [[ -n $victim ]] && kill -9 "$victim"
  touch "$o/go"
  rc=$(job_rc kill || true)
  out=$(cat "$o/log" 2>/dev/null || true)
  assert_eq "kill: the job completed" 0 "$rc"
  assert_eq "kill: on node2 every open after the kill failed (ENOTCONN), library and plugin already mapped" 1 \
    "$(grep -cE '^after [0-3]/4 node2 lib=libt85-1 plugin=plugin-1 data=ERR Transport endpoint is not connected never=ERR Transport endpoint is not connected missing=ERR Transport endpoint is not connected plugin2=ERR .*not connected ms=[0-9]+$' <<< "$out")"
  assert_le "kill: ... at once (ms)" "$(awk '/^after .* node2 / {sub("ms=", "", $NF); print $NF + 0}' <<< "$out")" 2000
  assert_eq "kill: the other nodes read on (a file not read before included)" 3 \
    "$(grep -cE '^after [0-3]/4 node[0-9]+ lib=libt85-1 plugin=plugin-1 data=seen-1 never=never-1 missing=ERR No such file or directory plugin2=other-1 ms=[0-9]+$' <<< "$out")"
  [[ $rc == 0 ]] || show kill
else
  fail "kill: the ranks started" "no ready mark in 120 s"; show kill
fi

# --- 4. nothing left after the jobs (the epilog has run)
wait_nothing_left sw-pool-view
assert_eq "after the jobs: no mount, no record on any node (epilog)" "$NOTHING_LEFT" "$(left_of_user sw-pool-view)"
# shellcheck disable=SC2009
assert_eq "... no view server left" 0 "$(ps -u "$uid" -o stat=,args= | grep -E '^[^Z]+ +\S*sw-pool-view ' | grep -c . || true)"
assert_eq "... no mount of the tree in any process's namespace" 0 "$(grep -l " $TREE " /proc/[0-9]*/mountinfo 2>/dev/null | grep -c . || true)"
assert_eq "... no environment's rendezvous socket on any node" 0 \
  "$(for n in "${nodes[@]:0:4}"; do "$TESTBED/exec" "$n" sh -c "ls /tmp/sw-pool-$uid/envs/ 2>/dev/null | grep -c '\.sock$'"; done | awk '{s += $1} END {print s + 0}')"
finish
