#!/usr/bin/env bash
# Runs every fuzz target (or those named) over its seed corpus once, as a test: an ordinary
# debug build (no coverage instrumentation, no nightly), libFuzzer's -runs=0. For CI.
#
#   fuzz/replay.sh [TARGET...]
set -euo pipefail
fuzz=$(cd "$(dirname "$0")" && pwd)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(sed -n 's/^path = "fuzz_targets\/\(.*\)\.rs"$/\1/p' "$fuzz/Cargo.toml")
fi
cargo build --quiet --manifest-path "$fuzz/Cargo.toml" --bins
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$fuzz/Cargo.toml" |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
for t in "${targets[@]}"; do
    n=$(find "$fuzz/corpus/$t" -maxdepth 1 -type f | wc -l)
    [ "$n" -gt 0 ] || { echo "$t: no seeds in $fuzz/corpus/$t" >&2; exit 1; }
    if ! out=$("$target_dir/debug/$t" -runs=0 -rss_limit_mb=2048 "$fuzz/corpus/$t" 2>&1); then
        echo "$out" | tail -n 30 >&2
        echo "$t: FAILED on its seed corpus" >&2
        exit 1
    fi
    echo "$t: $n seeds ok"
done
