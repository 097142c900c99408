#!/usr/bin/env bash
# Runs one fuzz target for MINUTES minutes (0: replay its corpus once) with libFuzzer, on the
# stable toolchain, and prints the final coverage and speed. See fuzz/README.md.
#
#   fuzz/run.sh TARGET MINUTES [libFuzzer flags...]
#
# Builds the target as cargo-fuzz does (SanitizerCoverage: 8-bit counters, PC table, comparison
# tracing; `--cfg fuzzing`; release with debug assertions and overflow checks) plus
# AddressSanitizer. `-Zsanitizer` is a nightly flag: with a stable rustc it is enabled by
# RUSTC_BOOTSTRAP=1, set for this build only (acceptable for a fuzz build, never for a
# release). FUZZ_SANITIZER=none builds without ASan and needs no RUSTC_BOOTSTRAP (coverage
# instrumentation is stable codegen flags), but then -malloc_limit_mb is not enforced.
#
# Environment:
#   FUZZ_SANITIZER        address (default) or none
#   FUZZ_DIR              where to build and work (default: $CARGO_TARGET_DIR, or fuzz/target):
#                         the build in fuzz-asan/ (or fuzz-cov/ without ASan), and per target
#                         fuzz-work/corpus/TARGET (what runs find), fuzz-work/artifacts/TARGET
#                         (crashing inputs), fuzz-work/logs/TARGET.log
#   FUZZ_RSS_LIMIT_MB     libFuzzer -rss_limit_mb (default 2048)
#   FUZZ_MALLOC_LIMIT_MB  libFuzzer -malloc_limit_mb: one allocation above this is a crash
#                         (default 2048; needs ASan's allocator hooks)
#   FUZZ_TIMEOUT          seconds one input may take (default 30)
set -euo pipefail

if [ $# -lt 2 ]; then
    echo "usage: fuzz/run.sh TARGET MINUTES [libFuzzer flags...]" >&2
    exit 2
fi
target=$1
minutes=$2
shift 2
case $minutes in
    '' | *[!0-9]*) echo "MINUTES must be a whole number, not '$minutes'" >&2; exit 2 ;;
esac

fuzz=$(cd "$(dirname "$0")" && pwd)
seeds="$fuzz/corpus/$target"
if ! grep -q "^name = \"$target\"$" "$fuzz/Cargo.toml"; then
    echo "no fuzz target '$target' in $fuzz/Cargo.toml" >&2
    exit 2
fi
[ -d "$seeds" ] || { echo "no seed corpus $seeds (fuzz/make_seeds.sh writes it)" >&2; exit 2; }

sanitizer=${FUZZ_SANITIZER:-address}
base=${FUZZ_DIR:-${CARGO_TARGET_DIR:-$fuzz/target}}
work=$base/fuzz-work
triple=$(rustc -vV | sed -n 's/^host: //p')

flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-simplifycfg-branch-fold-threshold=0"
# Unlike cargo-fuzz, codegen units are left at the default: on a small shared machine the
# build time matters more than the last factor of speed.
flags+=" --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
case $sanitizer in
    address)
        flags+=" -Zsanitizer=address -Cforce-frame-pointers"
        build=$base/fuzz-asan
        export RUSTC_BOOTSTRAP=1
        export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0
        ;;
    none) build=$base/fuzz-cov ;;
    *) echo "FUZZ_SANITIZER must be address or none, not '$sanitizer'" >&2; exit 2 ;;
esac

# --target: the flags must reach the target's code only, not build scripts or proc macros.
RUSTFLAGS="$flags" cargo build --quiet --manifest-path "$fuzz/Cargo.toml" --release \
    --target "$triple" --target-dir "$build" --bin "$target"
bin="$build/$triple/release/$target"

mkdir -p "$work/corpus/$target" "$work/artifacts/$target" "$work/logs"
log="$work/logs/$target.log"
run=(-rss_limit_mb="${FUZZ_RSS_LIMIT_MB:-2048}" -malloc_limit_mb="${FUZZ_MALLOC_LIMIT_MB:-2048}"
    -timeout="${FUZZ_TIMEOUT:-30}" -print_final_stats=1 -artifact_prefix="$work/artifacts/$target/")
if [ "$minutes" -eq 0 ]; then
    run+=(-runs=0)
else
    run+=(-max_total_time=$((minutes * 60)))
fi
# New inputs go to the first directory (the scratch corpus); the checked-in seeds stay as they are.
echo "== $target: $bin ${run[*]} $* (log: $log)"
status=0
"$bin" "${run[@]}" "$@" "$work/corpus/$target" "$seeds" >"$log" 2>&1 || status=$?

# The last status line (cov: edges, ft: features, corp: inputs, exec/s) and the final stats.
grep -E '^#[0-9]+[[:space:]]+(INITED|DONE|pulse|NEW|REDUCE)' "$log" | tail -n 1 || true
grep -E '^(stat::|Done [0-9]+ runs)' "$log" || true
if [ "$status" -ne 0 ]; then
    echo "== $target FAILED (exit $status): see $log and $work/artifacts/$target/" >&2
    grep -E -m 5 "panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer|==[0-9]+==ERROR|Test unit written" "$log" >&2 || true
fi
exit "$status"
