#!/usr/bin/env bash
# The method-choice table of docs/BENCHMARKS.md: every corpus file standalone and every XOR delta
# between consecutive epochs, auto choice vs exhaustive best (single thread).
# usage: benches/method_table.sh [extra method_table flags, e.g. --chunk-kib 1024 --skip 0]
set -euo pipefail
cd "$(dirname "$0")/.."
C=${CKPT_CORPUS:-$HOME/.cache/ckpt-corpus}
cargo build --release --quiet --example method_table
args=("$@" "$C"/standalone/*.safetensors)
for s in bf16 fp32; do
  for e in $(seq 0 9); do
    args+=(--delta "$C/series/$s/epoch_$(printf %02d "$e").safetensors" "$C/series/$s/epoch_$(printf %02d $((e + 1))).safetensors")
  done
done
args+=("$C"/series/optim/adamw_epoch_01.safetensors "$C"/series/optim/adamw_epoch_10.safetensors)
args+=(--delta "$C/series/optim/adamw_epoch_01.safetensors" "$C/series/optim/adamw_epoch_02.safetensors")
args+=(--delta "$C/series/optim/adamw_epoch_09.safetensors" "$C/series/optim/adamw_epoch_10.safetensors")
target/release/examples/method_table "${args[@]}"
