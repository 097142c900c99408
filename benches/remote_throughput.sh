#!/usr/bin/env bash
# Push and clone of one large checkpoint through an S3-protocol server on loopback (s3s-fs),
# against uploading / downloading the same file as one object with object_store alone
# (examples/s3_raw_copy.rs: the same client configuration, multipart upload with ckpt's part
# size and parts in flight). Issue #21 target: ckpt's throughput ≥ 0.8× the baseline's, that is
# baseline seconds ÷ ckpt seconds ≥ 0.8, for push and for clone.
#
# usage: benches/remote_throughput.sh [--gib N] [--runs R] [--dir DIR] [-j THREADS]
#   --gib   size of the checkpoint (default 2; examples/synthetic_series.rs, bf16, 128 MiB tensors)
#   --runs  repetitions; medians are reported (default 3)
#   --dir   scratch directory, needs about 6 × GIB free (default $TMPDIR/ckpt-remote)
#   -j      ckpt's threads (default: all cores); ckpt keeps 4 transfers per thread in flight
# CKPT=path runs that binary instead of building one. Needs s3s-fs on PATH
# (cargo install s3s-fs --version 0.14.1 --features binary).
#
# Method: the checkpoint is generated once and committed once (untimed; the commit is
# benches/big_checkpoint.sh's subject). Each run then times, in this order: the baseline upload,
# `ckpt push` to a fresh prefix, the baseline download, `ckpt clone` (download, verification of
# every object, checkout of the file). Outputs are compared with the original (cmp). Before every
# timed command a file of the checkpoint's size is written and deleted (untimed), so each command
# writes into just-freed page-cache pages (see benches/big_checkpoint.sh for why that matters on
# this VM). The server's copies of a run are deleted after it. The load average is printed
# before and after: the machine may be shared.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GIB=2
RUNS=3
DIR="${TMPDIR:-/tmp}/ckpt-remote"
JOBS="$(nproc)"
while (($#)); do
    case "$1" in
        --gib) GIB="$2"; shift 2 ;;
        --runs) RUNS="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        -j) JOBS="$2"; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
command -v s3s-fs > /dev/null || { echo "s3s-fs is not on PATH (cargo install s3s-fs --version 0.14.1 --features binary)" >&2; exit 1; }

cd "$ROOT"
cargo build --release --quiet --bin ckpt --example synthetic_series --example s3_raw_copy
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}/release"
CKPT="${CKPT:-$TARGET/ckpt}"
RAW="$TARGET/examples/s3_raw_copy"
mkdir -p "$DIR"
DATA="$DIR/data-${GIB}g"
if [[ ! -f "$DATA/epoch_0.safetensors" ]]; then
    rm -rf "$DATA"
    "$TARGET/examples/synthetic_series" "$DATA.tmp" "$GIB" 1 >&2
    mv "$DATA.tmp" "$DATA"
fi
FILE="$DATA/epoch_0.safetensors"
SIZE=$(stat -c %s "$FILE")

# The server, on a free port, with a fresh root.
SERVER_ROOT="$DIR/s3root"
rm -rf "$SERVER_ROOT"
mkdir -p "$SERVER_ROOT/bench"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export AWS_ACCESS_KEY_ID=bench-key AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_ALLOW_HTTP=true
s3s-fs --host 127.0.0.1 --port "$PORT" --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" \
    "$SERVER_ROOT" > "$DIR/s3s-fs.log" 2>&1 &
SERVER=$!
SAMPLES="$(mktemp)"
TIMING="$(mktemp)"
trap 'kill $SERVER 2> /dev/null; wait $SERVER 2> /dev/null; rm -f "$SAMPLES" "$TIMING"; rm -rf "$SERVER_ROOT"' EXIT
for _ in $(seq 100); do
    (echo > "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && break
    sleep 0.1
done

REPO="$DIR/repo"
rm -rf "$REPO"
mkdir -p "$REPO"
"$CKPT" -q init "$REPO" > /dev/null
cp "$FILE" "$REPO/model.safetensors"
"$CKPT" -q -C "$REPO" -j "$JOBS" commit -m "checkpoint" model.safetensors > /dev/null
STORE=$(du -sb "$REPO/.ckpt/objects" | cut -f1)

# measure LABEL CMD...: wall seconds and peak RSS (KiB) appended to $SAMPLES.
measure() {
    local label="$1"
    shift
    cp "$FILE" "$DIR/ballast"
    rm -f "$DIR/ballast"
    /usr/bin/time -f "%e %M" -o "$TIMING" "$@" > /dev/null
    echo "$label $(tail -n 1 "$TIMING")" >> "$SAMPLES"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((run = 1; run <= RUNS; run++)); do
    echo "run $run of $RUNS" >&2
    rm -rf "$DIR/raw.out" "$DIR/clone"
    measure raw_put "$RAW" put "$FILE" "s3://bench/raw/$run" 16 4
    "$CKPT" -q -C "$REPO" remote add "r$run" "s3://bench/ckpt/$run" > /dev/null
    measure push "$CKPT" -q -C "$REPO" -j "$JOBS" push "r$run"
    measure raw_get "$RAW" get "s3://bench/raw/$run" "$DIR/raw.out"
    cmp -s "$DIR/raw.out" "$FILE" || { echo "the baseline download differs" >&2; exit 1; }
    rm -f "$DIR/raw.out"
    measure clone "$CKPT" -q -j "$JOBS" clone "s3://bench/ckpt/$run" "$DIR/clone"
    cmp -s "$DIR/clone/model.safetensors" "$FILE" || { echo "the clone's checkpoint differs" >&2; exit 1; }
    SENT=$(du -sb --exclude='*.json' "$SERVER_ROOT/bench/ckpt/$run/objects" | cut -f1)
    rm -rf "$DIR/clone" "$SERVER_ROOT/bench/raw/$run" "$SERVER_ROOT/bench/ckpt/$run"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
rm -rf "$REPO"

python3 - "$SAMPLES" "$GIB" "$JOBS" "$RUNS" "$SIZE" "$STORE" "$SENT" <<'EOF'
import statistics, sys
samples, gib, jobs, runs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
size, store, sent = (int(x) for x in sys.argv[5:8])
wall, rss = {}, {}
for line in open(samples):
    label, w, r = line.split()
    wall.setdefault(label, []).append(float(w))
    rss.setdefault(label, []).append(int(r))
med = {k: statistics.median(v) for k, v in wall.items()}
mib = 2**20
print(f"{gib} GiB bf16 checkpoint ({size / mib:.0f} MiB; stored {store / mib:.0f} MiB; ckpt's objects on the server {sent / mib:.0f} MiB), "
      f"s3s-fs on loopback, ckpt -j {jobs}, median of {runs} runs\n")
print("| operation | wall s (median) | all runs | checkpoint MiB/s | on the wire MiB/s | baseline s ÷ ckpt s | peak RSS MiB |")
print("|---|---:|---|---:|---:|---:|---:|")
for k, base in [("raw_put", None), ("push", "raw_put"), ("raw_get", None), ("clone", "raw_get")]:
    runs_s = " ".join(f"{w:.2f}" for w in wall[k])
    ratio = f"{med[base] / med[k]:.2f}" if base else ""
    wire = sent if base else size
    print(f"| {k} | {med[k]:.2f} | {runs_s} | {size / mib / med[k]:.0f} | {wire / mib / med[k]:.0f} | {ratio} | {max(rss[k]) / 1024:.0f} |")
EOF
