#!/usr/bin/env bash
# The main job on an example that needs no downloads: build ckpt, make a checkpoint, compress and
# decompress it (bit-exact, hash-verified), and show where the bytes went.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin ckpt --example make_checkpoint
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
target/release/examples/make_checkpoint "$dir/model.safetensors" 20
target/release/ckpt compress "$dir/model.safetensors" -o "$dir/model.ckz"
target/release/ckpt decompress "$dir/model.ckz" -o "$dir/restored.safetensors"
cmp "$dir/model.safetensors" "$dir/restored.safetensors" && echo "round trip: bit-exact"
ls -l "$dir/model.safetensors" "$dir/model.ckz" | awk '{print $5, $9}'
target/release/ckpt stats "$dir/model.ckz"
