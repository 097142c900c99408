#!/usr/bin/env bash
# Regenerates the seed corpus of every fuzz target (fuzz/corpus/TARGET/) from real ckpt output:
# see fuzz/src/bin/make_seeds.rs for what each seed is. Needs git. Files named regression-*
# (inputs that once failed, kept as regression tests) are left in place.
#
#   fuzz/make_seeds.sh [OUT_DIR]     (default: fuzz/corpus)
set -euo pipefail
fuzz=$(cd "$(dirname "$0")" && pwd)
out=${1:-$fuzz/corpus}

# The ckpt binary, for the git filter (`git add` and `git checkout` run it as git would).
cargo build --quiet --manifest-path "$fuzz/../Cargo.toml" --bin ckpt
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$fuzz/../Cargo.toml" |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
ckpt="$target_dir/debug/ckpt"

fresh=$(mktemp -d)
trap 'rm -rf "$fresh"' EXIT
cargo run --quiet --manifest-path "$fuzz/Cargo.toml" --bin make_seeds -- "$fresh" "$ckpt"

for dir in "$fresh"/*/; do
    target=$(basename "$dir")
    mkdir -p "$out/$target"
    find "$out/$target" -maxdepth 1 -type f ! -name 'regression-*' -delete
    cp "$dir"/* "$out/$target/"
done
du -sh "$out"
