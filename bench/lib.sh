# shellcheck shell=bash
# Helpers shared by the benchmark scripts (bench/*.sh); source it: . "$REPO/bench/lib.sh"
#   now                 seconds since the epoch, with nanoseconds
#   el T0               seconds since T0 (2 decimals)
#   calc EXPR           awk arithmetic (3 decimals)
#   drop                sync and drop the page cache (the next read comes from the device or the wire)
#   log MSG...          print and append to $OUT.log
#   median              the median of the numbers on stdin (space- or newline-separated; 2 decimals)
now() { date +%s.%N; }
el() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
calc() { awk "BEGIN { printf \"%.3f\", $1 }"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
log() { echo "$*" | tee -a "$OUT.log"; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { printf "%.2f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
