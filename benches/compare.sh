#!/usr/bin/env bash
# Standalone compression benchmark: ckpt vs ZipNN vs zstd -3 (see benches/compare.py).
#
# usage: benches/compare.sh [FILES...] [-- compare.py options]
#   default FILES: $CKPT_CORPUS/standalone/*.safetensors, series/{bf16,fp32}/epoch_10.safetensors,
#                  series/optim/adamw_epoch_10.safetensors
#   compare.py options, e.g. --runs 5 --json out.json (also accepted mixed with FILES)
# Env: CKPT_CORPUS (default ~/.cache/ckpt-corpus; must hold venv/ with zipnn, see the corpus README).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CORPUS="${CKPT_CORPUS:-$HOME/.cache/ckpt-corpus}"
PY="$CORPUS/venv/bin/python"
export CKPT_CORPUS="$CORPUS"

files=()
opts=()
while (($#)); do
    case "$1" in
        --) shift; opts+=("$@"); break ;;
        --runs|--json|--threads|--tmpdir|--ckpt) opts+=("$1" "$2"); shift 2 ;;
        -*) opts+=("$1"); shift ;;
        *) files+=("$1"); shift ;;
    esac
done
if ((${#files[@]} == 0)); then
    files=("$CORPUS"/standalone/*.safetensors
           "$CORPUS/series/bf16/epoch_10.safetensors"
           "$CORPUS/series/fp32/epoch_10.safetensors"
           "$CORPUS/series/optim/adamw_epoch_10.safetensors")
fi
for f in "${files[@]}"; do
    [[ -f "$f" ]] || { echo "missing input: $f (build the corpus first, see its README)" >&2; exit 2; }
done
[[ -x "$PY" ]] || { echo "no corpus venv python at $PY" >&2; exit 2; }

cd "$ROOT"
echo "# building ckpt (release)" >&2
cargo build --release --quiet --bin ckpt --example codec_throughput

echo "# machine: nproc $(nproc), CPU $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then commit="$commit (working tree modified)"; fi
echo "# git commit: $commit"

exec "$PY" "$ROOT/benches/compare.py" --ckpt "$ROOT/target/release/ckpt" "${opts[@]}" "${files[@]}"
