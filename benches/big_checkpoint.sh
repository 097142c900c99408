#!/usr/bin/env bash
# Commit and checkout of one large checkpoint against `cp` of the same file (issue #3 targets:
# commit ≤ 3× cp, checkout ≤ 2× cp, peak RSS ≤ 300 MiB for a 2 GB checkpoint).
#
# usage: benches/big_checkpoint.sh [--gib N] [--runs R] [--dir DIR] [-j THREADS] [--policy P]
#   --gib   size of each synthetic epoch file (default 2; examples/synthetic_series.rs)
#   --runs  repetitions; medians are reported (default 3)
#   --dir   scratch directory, needs 4 × GIB free plus the store (default $TMPDIR/ckpt-big)
#   -j      threads for ckpt (default: all cores)
#   --policy delta_policy of the repository (default: the repository default, reverse). With
#           reverse the second commit stores epoch 1 whole and rewrites epoch 0 as a delta, so
#           the checkout of HEAD reads one whole object and HEAD~1 a delta; with previous the
#           other way round
#   --compact when a reverse commit rewrites the parent's blobs (CKPT_COMPACT): manual (default)
#           times the commit and then `ckpt compact` as its own row, as a training loop sees
#           them with the default background compaction (the commit returns, the compaction
#           runs while training goes on); inline times both in the commit
# CKPT=path runs that binary instead of building one (for A/B runs of two builds).
#
# Method: the two epoch files are generated once and read into the page cache. Each run makes a
# fresh repository and times, in this order: cp of epoch 0 into the working tree, cp + fsync of
# the same, commit (a full base), cp of epoch 1, commit (an XOR delta), checkout of the delta
# version, checkout of the base version. Every output is deleted right before the operation that
# writes it, and a file of the same size is written and deleted just before each measured command,
# so cp and ckpt find the page cache in the same state. Why: on the VM this was measured on,
# writing into memory that was never touched (or freed long ago) costs up to 5x the kernel time
# of writing into just-freed pages (three back-to-back `cp` of 2 GiB to new names: 1.2, 3.5 and
# 6.4 s; after an `rm`: 0.7 s), and without this the operation that happened to follow a
# deletion looked fast.
# Commit fsyncs every object it writes; checkout does not fsync (like git and cp), so
# "cp + fsync" is the like-for-like scale for commit and "cp" for checkout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GIB=2
RUNS=3
DIR="${TMPDIR:-/tmp}/ckpt-big"
JOBS="$(nproc)"
POLICY=""
COMPACT=manual
while (($#)); do
    case "$1" in
        --gib) GIB="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        -j) JOBS="$2"; shift 2 ;;
        --policy) POLICY="$2"; shift 2 ;;
        --compact) COMPACT="$2"; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

cd "$ROOT"
cargo build --release --quiet --bin ckpt --example synthetic_series
CKPT="${CKPT:-$ROOT/target/release/ckpt}"
export CKPT_COMPACT="$COMPACT"
DATA="$DIR/data-${GIB}g"
if [[ ! -f "$DATA/epoch_1.safetensors" ]]; then
    rm -rf "$DATA"
    "$ROOT/target/release/examples/synthetic_series" "$DATA.tmp" "$GIB" 2 >&2
    mv "$DATA.tmp" "$DATA"
fi
cat "$DATA"/epoch_0.safetensors "$DATA"/epoch_1.safetensors > /dev/null

REPO="$DIR/repo"
OUT="$DIR/out"
SAMPLES="$(mktemp)"
TIMING="$(mktemp)"
trap 'rm -f "$SAMPLES" "$TIMING"' EXIT

# measure LABEL CMD...: wall seconds and peak RSS (KiB) appended to $SAMPLES. Right before the
# command, a file of the checkpoint's size is written and deleted (untimed), so every measured
# command writes into just-freed page-cache pages.
measure() {
    local label="$1"
    shift
    cp "$DATA/epoch_0.safetensors" "$DIR/ballast"
    rm -f "$DIR/ballast"
    /usr/bin/time -f "%e %M" -o "$TIMING" "$@" > /dev/null
    echo "$label $(tail -n 1 "$TIMING")" >> "$SAMPLES"
}

for ((run = 1; run <= RUNS; run++)); do
    echo "run $run of $RUNS" >&2
    rm -rf "$REPO" "$OUT"
    mkdir -p "$REPO"
    "$CKPT" -q init "$REPO" > /dev/null
    [[ -z "$POLICY" ]] || echo "{\"delta_policy\": \"$POLICY\"}" > "$REPO/.ckpt/config"
    measure cp cp "$DATA/epoch_0.safetensors" "$REPO/model.safetensors"
    rm -f "$REPO/model.safetensors"
    measure cp_fsync sh -c 'cp "$1" "$2" && sync "$2"' sh "$DATA/epoch_0.safetensors" "$REPO/model.safetensors"
    measure commit_epoch0 "$CKPT" -q -C "$REPO" -j "$JOBS" commit -m "epoch 0" model.safetensors
    rm -f "$REPO/model.safetensors"
    measure cp cp "$DATA/epoch_1.safetensors" "$REPO/model.safetensors"
    measure commit_epoch1 "$CKPT" -q -C "$REPO" -j "$JOBS" commit -m "epoch 1" model.safetensors
    if [[ "$COMPACT" == manual ]]; then
        measure compact "$CKPT" -q -C "$REPO" -j "$JOBS" compact
    fi
    measure checkout_epoch1_head "$CKPT" -q -C "$REPO" -j "$JOBS" checkout HEAD --output "$OUT"
    cmp -s "$OUT/model.safetensors" "$DATA/epoch_1.safetensors" || { echo "checkout of epoch 1 differs" >&2; exit 1; }
    rm -rf "$OUT"
    measure checkout_epoch0 "$CKPT" -q -C "$REPO" -j "$JOBS" checkout HEAD~1 --output "$OUT"
    cmp -s "$OUT/model.safetensors" "$DATA/epoch_0.safetensors" || { echo "checkout of epoch 0 differs" >&2; exit 1; }
    rm -rf "$OUT"
done
store_bytes=$(du -sb "$REPO/.ckpt/objects" | cut -f1)
rm -rf "$REPO" "$OUT"

python3 - "$SAMPLES" "$GIB" "$JOBS" "$RUNS" "$store_bytes" "${POLICY:-default}" "$COMPACT" <<'EOF'
import statistics, sys
samples, gib, jobs, runs, store, policy, compact = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7]
wall, rss = {}, {}
for line in open(samples):
    label, w, r = line.split()
    wall.setdefault(label, []).append(float(w))
    rss.setdefault(label, []).append(int(r))
med = {k: statistics.median(v) for k, v in wall.items()}
print(f"{gib} GiB bf16 checkpoint, delta policy {policy}, compaction {compact}, -j {jobs}, median of {runs} runs; store after both commits: {store / 2**20:.0f} MiB\n")
print("| operation | wall s (median) | all runs | ÷ cp | ÷ cp+fsync | peak RSS MiB |")
print("|---|---:|---|---:|---:|---:|")
for k in ["cp", "cp_fsync", "commit_epoch0", "commit_epoch1", "compact", "checkout_epoch1_head", "checkout_epoch0"]:
    if k not in wall:
        continue
    runs_s = " ".join(f"{w:.2f}" for w in wall[k])
    print(f"| {k} | {med[k]:.2f} | {runs_s} | {med[k] / med['cp']:.2f} | {med[k] / med['cp_fsync']:.2f} | {max(rss[k]) / 1024:.0f} |")
EOF
