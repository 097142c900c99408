#!/usr/bin/env bash
# The first thing to run, with no downloads: build ckpt, train a small model for three epochs,
# and see what ckpt makes of the checkpoints: how small one of them gets, what each epoch adds to
# a repository, and that every checkout gives back the very bytes that were committed.
# (The per-byte-group table of one file is `ckpt stats FILE.ckz`.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin ckpt --example make_checkpoint
bin=$PWD/target/release
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir"
ckpt() { # runs ckpt and shows the command, as typed, before what it prints
  local shown=() arg
  for arg; do [[ $arg == *" "* ]] && shown+=("\"$arg\"") || shown+=("$arg"); done
  echo "\$ ckpt ${shown[*]}"
  "$bin/ckpt" "$@" 2>&1
}
size() { wc -c <"$1" | tr -d " "; }
share() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%8d bytes  %5.1f%%", a, 100 * a / b }'; }

# One run's checkpoints after 20, 40 and 60 SGD steps: BF16 weights, F32 master copies, a step.
for epoch in 1 2 3; do
  "$bin/examples/make_checkpoint" "epoch$epoch.safetensors" $((20 * epoch)) >/dev/null
done
original=$(size epoch1.safetensors)

echo "== One checkpoint, epoch1.safetensors ($original bytes), compressed on its own"
"$bin/ckpt" compress -q epoch1.safetensors -o epoch1.ckz
"$bin/ckpt" decompress -q epoch1.ckz -o restored.safetensors
cmp epoch1.safetensors restored.safetensors
echo "  ckpt compress  $(share "$(size epoch1.ckz)" "$original")  (decompressed: bit-exact)"
if command -v zstd >/dev/null; then
  zstd -q epoch1.safetensors -o epoch1.zst
  echo "  zstd           $(share "$(size epoch1.zst)" "$original")"
fi

echo
echo "== The three epochs committed to a repository, as a training loop would"
ckpt init
for epoch in 1 2 3; do
  cp "epoch$epoch.safetensors" model.safetensors
  ckpt commit -m "epoch $epoch" model.safetensors
done
# Wait for the background compaction that turns each earlier epoch into XOR deltas against the
# next, so that the sizes below are final.
"$bin/ckpt" compact -q >/dev/null
echo "# each epoch: bytes stored / bytes of its file; the newest stays whole for a fast checkout"
ckpt log --oneline

echo
echo "== Bit-exact: each epoch checked out (its hash verified) and compared with the file committed"
epoch=0
for rev in HEAD~2 HEAD~1 HEAD; do
  epoch=$((epoch + 1))
  ckpt checkout "$rev" -o "epoch$epoch"
  cmp "epoch$epoch.safetensors" "epoch$epoch/model.safetensors"
  echo "cmp epoch$epoch.safetensors epoch$epoch/model.safetensors: identical"
done
