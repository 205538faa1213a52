#!/usr/bin/env bash
# Run the fuzz targets one after the other, SECONDS (default 600) each; exit non-zero if any target
# crashed (a panic, an arithmetic overflow, an allocation over -rss_limit_mb, a unit running longer
# than -timeout) or did not build.
#   fuzz/run-all.sh [SECONDS [TARGET...]]      default: every target
#
# Each target reads seeds/<target>/ (committed, small) and grows corpus/<target>/ (not committed).
# A crash leaves its input in artifacts/<target>/; the whole libFuzzer log of the last run of a
# target is logs/<target>.log. Two builds of the same targets, the same corpora:
#
#   nightly  `cargo +nightly fuzz run -a`, when the nightly toolchain and cargo-fuzz are installed:
#            AddressSanitizer, debug assertions and overflow checks.
#   stable   otherwise: `cargo build --release --bins --target <host>` with the instrumentation
#            cargo-fuzz adds, all of it stable -C flags (SanitizerCoverage through
#            -Cpasses=sancov-module: inline 8-bit counters, PC table, compare tracing, stack depth;
#            --cfg fuzzing; debug assertions and overflow checks). libfuzzer-sys compiles libFuzzer
#            itself (the cc crate: a C++ compiler, g++ from build-essential), and links it as the
#            program's main, so each binary is a libFuzzer program run directly. The explicit
#            --target keeps the flags off build scripts and proc macros (which would not load
#            instrumented). No sanitizer: they are nightly-only. Safe Rust's bounds checks, panics,
#            overflow checks, the RSS limit and the timeout catch the same failures; an invalid
#            memory access in unsafe or C code (OpenSSL's PEM parser, under signature_block) is
#            seen only if it crashes the process.
#            Built into $CARGO_TARGET_DIR (default fuzz/target).
#
# FUZZ_BUILD=stable or FUZZ_BUILD=nightly forces one; FUZZ_TIMEOUT (default 20) is libFuzzer's
# -timeout in seconds for one input.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-600}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(manifest pool_trailer signature_block superblock layer_manifest squashfs)
unit_timeout=${FUZZ_TIMEOUT:-20}
libfuzzer_args=(-max_total_time="$secs" -rss_limit_mb=2048 -timeout="$unit_timeout" -print_final_stats=1)

build=${FUZZ_BUILD:-}
if [ -z "$build" ]; then
  if cargo +nightly fuzz --version >/dev/null 2>&1; then build=nightly; else build=stable; fi
fi

case $build in
  nightly) ;;
  stable)
    host=$(rustc -vV | sed -n 's/^host: //p')
    flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
    flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
    flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares"
    case $host in *-linux-*) flags+=" -Cllvm-args=-sanitizer-coverage-stack-depth" ;; esac
    flags+=" -Cllvm-args=-simplifycfg-branch-fold-threshold=0 -Cdebug-assertions -Coverflow-checks"
    # one codegen unit, as cargo-fuzz does in release: the sancov pass otherwise blocks ThinLTO's imports
    flags+=" -Ccodegen-units=1"
    echo "== stable build ($host) of: ${targets[*]}"
    bin_args=()
    for t in "${targets[@]}"; do bin_args+=(--bin "$t"); done
    RUSTFLAGS="$flags ${RUSTFLAGS:-}" cargo build --locked --release --target "$host" \
      --config 'profile.release.debug="line-tables-only"' "${bin_args[@]}"
    bindir=${CARGO_TARGET_DIR:-target}/$host/release
    ;;
  *) echo "run-all: FUZZ_BUILD must be stable or nightly, not '$build'" >&2; exit 2 ;;
esac

failed=()
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" logs
  log=logs/$t.log
  echo "== fuzz $t for ${secs}s ($build build)"
  rc=0
  if [ "$build" = nightly ]; then
    cargo +nightly fuzz run -a "$t" "corpus/$t" "seeds/$t" -- "${libfuzzer_args[@]}" >"$log" 2>&1 || rc=$?
  else
    "$bindir/$t" "corpus/$t" "seeds/$t" "${libfuzzer_args[@]}" -artifact_prefix="artifacts/$t/" >"$log" 2>&1 || rc=$?
  fi
  # the last status line (executions, cov:, ft:, corp:) and the final stats
  grep -E '^#[0-9]+' "$log" | tail -n 1 || true
  grep -E '^stat::' "$log" || true
  echo "corpus/$t: $(find "corpus/$t" -type f | wc -l) inputs"
  if [ "$rc" != 0 ]; then
    echo "!! $t exited $rc; the end of $log:"
    tail -n 40 "$log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "run-all: crashed or failed: ${failed[*]} (inputs in artifacts/<target>/)" >&2
  exit 1
fi
echo "run-all: ${#targets[@]} target(s), no crash"
