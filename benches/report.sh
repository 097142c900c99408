#!/usr/bin/env bash
# What `ckpt report` costs against checkouts: commits a synthetic bf16 series (default 10 epochs
# of 512 MiB, default settings: reverse deltas, compacted inline), then times
#   1. checking out every version once (to a scratch directory, deleted after each);
#   2. the first report of the series (nothing cached) and its peak RSS;
#   3. the same report again (everything cached);
#   4. one more commit, then the report again (one new column) against one checkout of it.
# Prints one line per figure; `--json FILE` also writes them as JSON.
#
# usage: benches/report.sh [--size 512M] [--epochs 10] [--decay 0.8] [--dir DIR] [--ckpt BIN] [--json FILE]
#   --dir needs (EPOCHS + 1) × SIZE for the data, the store and one checkout.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIZE=512M
EPOCHS=10
DECAY=0.8
DIR="${TMPDIR:-/tmp}/ckpt-report-bench"
CKPT=""
JSON=""
while (($#)); do
    case "$1" in
        --size) SIZE="$2"; shift 2 ;;
        --epochs) EPOCHS="$2"; shift 2 ;;
        --decay) DECAY="$2"; shift 2 ;;
        --dir) DIR="$(realpath -m "$2")"; shift 2 ;;
        --ckpt) CKPT="$(realpath "$2")"; shift 2 ;;
        --json) JSON="$(realpath -m "$2")"; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

cd "$ROOT"
cargo build --release --quiet --bin ckpt --example synthetic_series
CKPT="${CKPT:-$ROOT/target/release/ckpt}"
export CKPT_COMPACT=inline
rm -rf "$DIR"
mkdir -p "$DIR/repo"
DATA="$DIR/data"
# One epoch more than the series: the commit after the first report.
"$ROOT/target/release/examples/synthetic_series" "$DATA" "$SIZE" "$((EPOCHS + 1))" "$DECAY" >&2

# Wall seconds, peak RSS (KiB) and CPU seconds (user + system, all threads) of a command, from
# /usr/bin/time -v. CPU seconds are the steadier figure on a shared machine.
measure() {
    /usr/bin/time -v "$@" >/dev/null 2>"$DIR/time.txt"
    local wall rss cpu
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {n=split($2,t,":"); s=0; for(i=1;i<=n;i++) s=s*60+t[i]; print s}' "$DIR/time.txt")
    rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$DIR/time.txt")
    cpu=$(awk -F': ' '/(User|System) time \(seconds\)/ {s+=$2} END {print s}' "$DIR/time.txt")
    echo "$wall $rss $cpu"
}

cd "$DIR/repo"
"$CKPT" init -q >/dev/null
for ((e = 0; e < EPOCHS; e++)); do
    mv "$DATA/epoch_$e.safetensors" model.safetensors
    "$CKPT" commit -q -m "epoch $e" model.safetensors >/dev/null
done
rm -f model.safetensors
sync

checkout_one() { # rev -> "wall cpu" seconds
    rm -rf "$DIR/out"
    local wall rss cpu
    read -r wall rss cpu < <(measure "$CKPT" checkout -q "$1" --output "$DIR/out")
    rm -rf "$DIR/out"
    echo "$wall $cpu"
}
all=0
all_cpu=0
for ((k = EPOCHS - 1; k >= 0; k--)); do
    read -r s c < <(checkout_one "HEAD~$k")
    all=$(echo "$all + $s" | bc -l)
    all_cpu=$(echo "$all_cpu + $c" | bc -l)
done
read -r first first_rss first_cpu < <(measure "$CKPT" report -q -o "$DIR/r1.html")
read -r again again_rss again_cpu < <(measure "$CKPT" report -q -o "$DIR/r2.html")
mv "$DATA/epoch_$EPOCHS.safetensors" model.safetensors
"$CKPT" commit -q -m "epoch $EPOCHS" model.safetensors >/dev/null
rm -f model.safetensors
read -r one one_cpu < <(checkout_one HEAD)
read -r next next_rss next_cpu < <(measure "$CKPT" report -q -o "$DIR/r3.html")
html=$(stat -c %s "$DIR/r3.html")

ratio() { echo "scale=2; $1 / $2" | bc -l; }
echo "checkout of every version once: ${all}s (CPU ${all_cpu}s)"
echo "first report: ${first}s = $(ratio "$first" "$all")x (CPU ${first_cpu}s = $(ratio "$first_cpu" "$all_cpu")x); peak RSS $((first_rss / 1024)) MiB"
echo "second report (cached): ${again}s (CPU ${again_cpu}s); peak RSS $((again_rss / 1024)) MiB"
echo "after one more commit: report ${next}s = $(ratio "$next" "$one")x one checkout (${one}s) (CPU ${next_cpu}s = $(ratio "$next_cpu" "$one_cpu")x of ${one_cpu}s); peak RSS $((next_rss / 1024)) MiB"
echo "page: $html bytes"
if [[ -n "$JSON" ]]; then
    printf '{"size":"%s","epochs":%d,"checkout_all_s":%s,"checkout_all_cpu_s":%s,"first_s":%s,"first_cpu_s":%s,"first_rss_kib":%s,"cached_s":%s,"one_checkout_s":%s,"one_checkout_cpu_s":%s,"next_s":%s,"next_cpu_s":%s,"next_rss_kib":%s,"html_bytes":%s}\n' \
        "$SIZE" "$EPOCHS" "$all" "$all_cpu" "$first" "$first_cpu" "$first_rss" "$again" "$one" "$one_cpu" "$next" "$next_cpu" "$next_rss" "$html" >"$JSON"
fi
rm -rf "$DIR"
