#!/usr/bin/env bash
# A checkpoint of many small tensors (issue 18, item 5): 20,000 F32 tensors of 128 bytes each
# (biases and norms of a mixture-of-experts model) behind a 2 MB JSON header.
# Measures `ckpt commit` against `cp` (medians), the store's size and object-file count, a
# second version with 4 tensors changed (store growth), checkout, and the standalone sizes of
# `ckpt compress`, `zstd -3` and ZipNN (when the corpus venv has it).
#
# usage: benches/small_tensors.sh [--runs R] [--dir DIR] [--tensors N]
#   --runs     repetitions; medians are reported (default 7)
#   --dir      scratch directory (default $TMPDIR/ckpt-small)
#   --tensors  number of tensors (default 20000)
# CKPT=path runs that binary instead of building one. PYTHON=path: the interpreter with zipnn
# (default ~/.cache/ckpt-corpus/venv/bin/python; ZipNN is skipped when it cannot import it).
#
# Method: the file is generated once (Python, deterministic: gauss(0, 0.02) as F32) and read into
# the page cache. Each run makes a fresh repository and times cp of the file into the working
# tree, then `ckpt commit` of it (a first commit, no compaction), then `ckpt checkout` into a
# fresh directory (checked with cmp). Commit fsyncs its objects and cp does not; both are
# reported, with cp + fsync.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS=7
DIR="${TMPDIR:-/tmp}/ckpt-small"
TENSORS=20000
PYTHON="${PYTHON:-$HOME/.cache/ckpt-corpus/venv/bin/python}"
while (($#)); do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        --tensors) TENSORS="$2"; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

cd "$ROOT"
if [[ -z "${CKPT:-}" ]]; then
    cargo build --release --quiet --bin ckpt
    CKPT="$ROOT/target/release/ckpt"
fi
mkdir -p "$DIR"
FILE="$DIR/small-$TENSORS.safetensors"
FILE2="$DIR/small-$TENSORS-v2.safetensors"
# gen PATH CHANGED...: the file, with the tensors numbered CHANGED drawn again (a second epoch).
gen() {
    python3 - "$TENSORS" "$@" <<'EOF'
import json, random, struct, sys
n, path, changed = int(sys.argv[1]), sys.argv[2], {int(c) for c in sys.argv[3:]}
header, data = {"__metadata__": {"format": "pt"}}, bytearray()
for i in range(n):
    layer, e = divmod(i, 500)
    kind = ("bias", "norm.weight", "gate.bias", "scale")[e % 4]
    rng = random.Random(i * 2 + (i in changed))
    header[f"model.layers.{layer}.mlp.experts.{e // 4}.{kind}"] = {
        "dtype": "F32", "shape": [32], "data_offsets": [len(data), len(data) + 128]}
    data += struct.pack("<32f", *[rng.gauss(0, 0.02) for _ in range(32)])
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * (-len(h) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + data)
EOF
}
[[ -f "$FILE" ]] || gen "$FILE"
[[ -f "$FILE2" ]] || gen "$FILE2" 3 4000 12345 $((TENSORS - 1))
cat "$FILE" "$FILE2" > /dev/null

REPO="$DIR/repo"
OUT="$DIR/out"
SAMPLES="$(mktemp)"
trap 'rm -f "$SAMPLES"' EXIT
# measure LABEL CMD...: wall seconds appended to $SAMPLES.
measure() {
    local label="$1"
    shift
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > /dev/null
    t1=$(date +%s.%N)
    echo "$label $(echo "$t1 - $t0" | bc)" >> "$SAMPLES"
}

export CKPT_COMPACT=manual
for ((run = 1; run <= RUNS; run++)); do
    rm -rf "$REPO" "$OUT"
    mkdir -p "$REPO"
    "$CKPT" -q init "$REPO" > /dev/null
    measure cp cp "$FILE" "$REPO/model.safetensors"
    rm -f "$REPO/model.safetensors"
    measure cp_fsync sh -c 'cp "$1" "$2" && sync "$2"' sh "$FILE" "$REPO/model.safetensors"
    measure commit "$CKPT" -q -C "$REPO" commit -m v1 model.safetensors
    measure checkout "$CKPT" -q -C "$REPO" checkout HEAD --output "$OUT"
    cmp -s "$OUT/model.safetensors" "$FILE" || { echo "checkout differs" >&2; exit 1; }
done
objects=$(find "$REPO/.ckpt/objects" -type f | wc -l)
stored=$(find "$REPO/.ckpt/objects" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
# A second version, 4 tensors changed, compacted inline (the first becomes a delta).
cp "$FILE2" "$REPO/model.safetensors"
CKPT_COMPACT=inline "$CKPT" -q -C "$REPO" commit -m v2 model.safetensors > /dev/null
objects2=$(find "$REPO/.ckpt/objects" -type f | wc -l)
stored2=$(find "$REPO/.ckpt/objects" -type f -printf '%s\n' | awk '{s += $1} END {print s}')
"$CKPT" -q -C "$REPO" verify > /dev/null
rm -rf "$OUT"
"$CKPT" -q -C "$REPO" checkout HEAD~1 --output "$OUT"
cmp -s "$OUT/model.safetensors" "$FILE" || { echo "checkout of v1 differs" >&2; exit 1; }

"$CKPT" -q compress "$FILE" -o "$DIR/small.ckz"
"$CKPT" -q decompress "$DIR/small.ckz" -o "$DIR/small.back"
cmp -s "$DIR/small.back" "$FILE" || { echo "decompress differs" >&2; exit 1; }
ckz=$(stat -c %s "$DIR/small.ckz")
zst=$(zstd -3 -q -c "$FILE" | wc -c)
zipnn=$("$PYTHON" - "$FILE" 2> /dev/null <<'EOF' || echo "-"
import sys, warnings
warnings.simplefilter("ignore")
from zipnn import ZipNN
data = open(sys.argv[1], "rb").read()
z = ZipNN(method="HUFFMAN", input_format="byte", bytearray_dtype="float32", threads=1)
comp = bytes(z.compress(bytearray(data)))  # (reorders its input in place: a copy)
z = ZipNN(method="HUFFMAN", input_format="byte", bytearray_dtype="float32", threads=1)
assert bytes(z.decompress(comp)) == data
print(len(comp))
EOF
)
rm -rf "$REPO" "$OUT" "$DIR/small.ckz" "$DIR/small.back"

python3 - "$SAMPLES" "$(stat -c %s "$FILE")" "$TENSORS" "$RUNS" "$objects" "$stored" "$objects2" "$stored2" "$ckz" "$zst" "$zipnn" <<'EOF'
import statistics, sys
samples, size, tensors, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
objects, stored, objects2, stored2, ckz, zst = map(int, sys.argv[5:11])
zipnn = sys.argv[11]
wall = {}
for line in open(samples):
    label, w = line.split()
    wall.setdefault(label, []).append(float(w))
med = {k: statistics.median(v) for k, v in wall.items()}
print(f"{tensors} F32 tensors of 128 bytes, {size / 1e6:.2f} MB file, median of {runs} runs\n")
print("| operation | ms (median) | all runs (ms) | ÷ cp | ÷ cp+fsync |")
print("|---|---:|---|---:|---:|")
for k in ["cp", "cp_fsync", "commit", "checkout"]:
    runs_ms = " ".join(f"{1000 * w:.0f}" for w in wall[k])
    print(f"| {k} | {1000 * med[k]:.1f} | {runs_ms} | {med[k] / med['cp']:.2f} | {med[k] / med['cp_fsync']:.2f} |")
print(f"\ncommit target 3 x cp + 50 ms = {1000 * (3 * med['cp'] + 0.05):.1f} ms\n")
print("| what | bytes | % of file | ÷ zstd -3 |")
print("|---|---:|---:|---:|")
rows = [("repository after v1 (" + str(objects) + " object files)", stored),
        ("repository after v2, 4 tensors changed (" + str(objects2) + " object files)", stored2),
        ("ckpt compress", ckz), ("zstd -3", zst)]
if zipnn not in ("-", ""):
    rows.append(("ZipNN 0.5.4 (HUFFMAN, byte API, float32)", int(zipnn)))
for label, n in rows:
    print(f"| {label} | {n} | {100 * n / size:.1f} | {n / zst:.3f} |")
EOF
