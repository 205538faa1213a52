# shellcheck shell=bash
# Helpers shared by the benchmark scripts (bench/*.sh, bench/run); source it: . "$REPO/bench/lib.sh"
# It sources tools/preamble.sh (strict mode, REPO, TESTBED, now, elapsed, drop_caches, median, log,
# die) and adds:
#   el T0 [T1]          seconds from T0 to T1 (default: now), 2 decimals (the preamble's elapsed)
#   sub A B             B - A, 3 decimals
#   timeit CMD...       runs CMD (its stdout discarded) and prints its wall time in seconds, 3 decimals
#   calc EXPR           awk arithmetic (3 decimals; the cluster tests' calc keeps 4 significant digits)
#   drop                the preamble's drop_caches
#   log MSG...          print and append to $OUT.log
#   tb_srun N NP EXPORTS CMD...  one Slurm step of NP tasks on testbed nodes 1..N, as a job
#                       launches its ranks (PMIx, oversubscribed; --export=ALL,EXPORTS)
#   built_from_tree BIN...  `make build` (a no-op when all is built), then each BIN must be there:
#                       a bench measures the sources it runs from, not an older build
#   source_rev          the commit the sources are at, "-dirty" when crates/ differ from it
# shellcheck source=../tools/preamble.sh
. "$(dirname "${BASH_SOURCE[0]}")/../tools/preamble.sh"
el() { elapsed "$@"; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
# CPU seconds the whole machine was busy so far (user, nice, system, irq, softirq, steal: /proc/stat)
machine_busy() { awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { printf "%.2f", ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat; }
timeit() { local s; s=$(now); "$@" >/dev/null; sub "$s" "$(now)"; }
calc() { awk "BEGIN { printf \"%.3f\", $1 }"; }
drop() { drop_caches; }
log() { echo "$*" | tee -a "$OUT.log"; }
tb_srun() {
  local n=$1 np=$2 exports=$3
  shift 3
  SLURM_CONF=$TB/etc/slurm.conf SLURM_PMIX_FENCE=tree srun --mpi=pmix --overcommit -N "$n" -n "$np" \
    -w "node[1-$n]" --export="ALL,$exports" "$@"
}
built_from_tree() {
  # (cargo rebuilds what changed and leaves the rest: a binary's age says nothing; make build
  # is a no-op when all is built)
  local b
  make -C "$REPO" --no-print-directory build >/dev/null || { echo "make build failed" >&2; return 1; }
  for b in "$@"; do [[ -x $b ]] || { echo "$b: missing after make build" >&2; return 1; }; done
}
source_rev() {
  local r; r=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [[ -z $(git -C "$REPO" status --porcelain -- crates Cargo.toml Cargo.lock 2>/dev/null) ]] || r+=-dirty
  echo "$r"
}
# cpu_report DATA TITLE: the whole machine's CPU time in a `perf record -a` file, split by command,
# by command and library, and by command and function (kernel and user), on stdout; DATA removed
cpu_report() {
  echo "# CPU of the whole machine ($(nproc) cores) $2 (perf record -a -F 199; swapper = idle)"
  perf report -i "$1" --sort comm --stdio -n 2>/dev/null | awk '!/^#/ && NF && n++ < 25'
  echo; echo "# by command and library"
  perf report -i "$1" --sort comm,dso --stdio -n 2>/dev/null | awk '!/^#/ && NF && n++ < 40'
  echo; echo "# by command and function (kernel and user)"
  perf report -i "$1" --sort comm,sym --stdio -n 2>/dev/null | awk '!/^#/ && NF && n++ < 80'
  rm -f "$1"
}
