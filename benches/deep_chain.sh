#!/usr/bin/env bash
# What delta-chain depth costs: commits a synthetic bf16 series epoch by epoch with the default
# settings (delta against the previous version, a full base every 20 versions, so version k sits
# at chain depth k; or another --policy), then checks out every version. Prints per version: chain depth, stored
# bytes, method mix, commit and checkout wall time against `cp` of the same file, peak RSS.
#
# usage: benches/deep_chain.sh [--size 256M] [--epochs 20] [--decay 0.8] [--policy P] [--dir DIR] [-j THREADS] [--ckpt BIN]
#   --size    size of each epoch file, GiB or MiB with an M suffix (examples/synthetic_series.rs)
#   --epochs  versions to commit (default 20: one whole chain under base_every = 20)
#   --decay   factor by which the update shrinks per epoch (default 0.8: bits keep changing)
#   --policy  delta_policy of the repository: previous (default), base, skip or reverse
#   --dir     scratch directory, needs EPOCHS × SIZE for the data plus the store and one output
#   --ckpt    the ckpt binary to measure (default: this tree's release build), for A/B runs
#   --compact reverse deltas (CKPT_COMPACT): manual (default) runs `ckpt compact` right after each
#             commit as its own timed column, as the default background compaction does while
#             training goes on; inline times both in the commit (and suits builds before 28b9982)
#
# cp of each epoch file is timed three times (median) as the scale. Each checkout is preceded by
# an untimed cp and rm of the same file, so it finds the page cache as the timed cp did.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE=256M
EPOCHS=20
DECAY=0.8
POLICY=previous
DIR="${TMPDIR:-/tmp}/ckpt-deep"
JOBS="$(nproc)"
CKPT=""
COMPACT=manual
while (($#)); do
    case "$1" in
        --size) SIZE="$2"; shift 2 ;;
        --epochs) EPOCHS="$2"; shift 2 ;;
        --decay) DECAY="$2"; shift 2 ;;
        --policy) POLICY="$2"; shift 2 ;;
        --dir) DIR="$(realpath -m "$2")"; shift 2 ;;
        -j) JOBS="$2"; shift 2 ;;
        --ckpt) CKPT="$(realpath "$2")"; shift 2 ;;
        --compact) COMPACT="$2"; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

cd "$ROOT"
cargo build --release --quiet --bin ckpt --example synthetic_series
CKPT="${CKPT:-$ROOT/target/release/ckpt}"
export CKPT_COMPACT="$COMPACT"
DATA="$DIR/data-$SIZE-$EPOCHS-$DECAY"
last=$((EPOCHS - 1))
if [[ ! -f "$DATA/epoch_$last.safetensors" ]]; then
    rm -rf "$DATA" "$DATA.tmp"
    "$ROOT/target/release/examples/synthetic_series" "$DATA.tmp" "$SIZE" "$EPOCHS" "$DECAY" >&2
    mv "$DATA.tmp" "$DATA"
fi

REPO="$DIR/repo"
OUT="$DIR/out"
rm -rf "$REPO" "$OUT"
mkdir -p "$REPO"
"$CKPT" -q init "$REPO" > /dev/null
echo "{\"delta_policy\": \"$POLICY\"}" > "$REPO/.ckpt/config"

# timed OUTFILE CMD...: runs CMD, appends "wall_s rss_kib" to OUTFILE.
timed() {
    local out="$1"
    shift
    /usr/bin/time -f "%e %M" -o "$out" -a "$@" > /dev/null
}
median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
cp_time() { # FILE: median wall seconds of three cp runs to a fresh name
    local f="$1" t
    t="$(mktemp)"
    for _ in 1 2 3; do
        rm -f "$OUT.cp"
        timed "$t" cp "$f" "$OUT.cp"
    done
    rm -f "$OUT.cp"
    cut -d' ' -f1 "$t" | median
    rm -f "$t"
}

declare -a ids commit_s commit_rss cp_s head_s compact_s
for e in $(seq 0 "$last"); do
    f="$DATA/epoch_$e.safetensors"
    cat "$f" > /dev/null
    cp_s[e]="$(cp_time "$f")"
    cp "$f" "$REPO/model.safetensors"
    t="$(mktemp)"
    timed "$t" "$CKPT" -q -j "$JOBS" -C "$REPO" commit -m "epoch $e" model.safetensors
    read -r "commit_s[e]" "commit_rss[e]" < "$t"
    rm -f "$t"
    compact_s[e]=0
    if [[ "$COMPACT" == manual ]]; then
        t="$(mktemp)"
        timed "$t" "$CKPT" -q -j "$JOBS" -C "$REPO" compact
        read -r "compact_s[e]" _ < "$t"
        rm -f "$t"
    fi
    ids[e]="$("$CKPT" -C "$REPO" log -n 1 --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["id"])')"
    # The newest version right after its commit (median of 3): what resuming training from it
    # costs then.
    t="$(mktemp)"
    for _ in 1 2 3; do
        rm -rf "$OUT"
        cp "$f" "$OUT.warm" && rm -f "$OUT.warm"
        timed "$t" "$CKPT" -q -j "$JOBS" -C "$REPO" checkout HEAD --output "$OUT"
    done
    head_s[e]="$(cut -d' ' -f1 "$t" | median)"
    rm -f "$t" && rm -rf "$OUT"
done

echo "synthetic bf16 series: $EPOCHS epochs of $SIZE, update decay $DECAY per epoch; delta policy $POLICY; compaction $COMPACT; -j $JOBS; $(date -u '+%Y-%m-%d %H:%M UTC'), $CKPT at commit $(git rev-parse --short HEAD)"
echo
echo "| version | depth | stored MiB | methods | commit s | commit/cp | compact s | HEAD checkout s (after its commit, median of 3) | HEAD checkout/cp | checkout s (at the end) | checkout/cp | commit RSS MiB | checkout RSS MiB | bit-exact |"
echo "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
for e in $(seq 0 "$last"); do
    f="$DATA/epoch_$e.safetensors"
    rm -rf "$OUT"
    # Untimed: write and delete a file of the same size, so the checkout writes into just-freed
    # page-cache pages like the timed cp did (fresh pages cost several times more on some VMs).
    cp "$f" "$OUT.warm" && rm -f "$OUT.warm"
    t="$(mktemp)"
    timed "$t" "$CKPT" -q -j "$JOBS" -C "$REPO" checkout "${ids[e]}" --output "$OUT"
    read -r co_s co_rss < "$t"
    rm -f "$t"
    if cmp -s "$f" "$OUT/model.safetensors"; then exact=yes; else exact=NO; fi
    show="$("$CKPT" -C "$REPO" show "${ids[e]}")"
    # Deepest chain among the version's tensors ("delta vs ... d=N"); none for a full base.
    depth="$( (grep -o 'd=[0-9]*' <<< "$show" || true) | sort -t= -k2 -n | tail -1 | cut -d= -f2)"
    stored="$(grep '^bytes' <<< "$show" | sed -E 's/.*, ([0-9.]+ (B|[KMG]iB)) added.*/\1/')"
    methods="$(grep '^methods' <<< "$show" | sed -E 's/^methods *//')"
    python3 - "$e" "${depth:-0}" "$stored" "$methods" "${commit_s[e]}" "${compact_s[e]}" "${cp_s[e]}" "${head_s[e]}" "$co_s" "${commit_rss[e]}" "$co_rss" "$exact" <<'EOF'
import sys
e, depth, stored, methods, commit, compact, cp, head, co, crss, corss, exact = sys.argv[1:]
num, unit = stored.split()
mib = float(num) * {"B": 1 / 1048576, "KiB": 1 / 1024, "MiB": 1, "GiB": 1024}[unit]
commit, cp, head, co = float(commit), max(float(cp), 0.01), float(head), float(co)
print(f"| {e} | {depth} | {mib:.1f} | {methods} | {commit:.2f} | {commit / cp:.1f} | {float(compact):.2f} | {head:.2f} | {head / cp:.1f} "
      f"| {co:.2f} | {co / cp:.1f} "
      f"| {int(crss) // 1024} | {int(corss) // 1024} | {exact} |")
EOF
done
rm -rf "$OUT"
echo
echo "store: $(du -sm "$REPO/.ckpt" | cut -f1) MiB for $EPOCHS × $SIZE"
