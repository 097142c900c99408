#!/usr/bin/env bash
# What `ckpt gc --remote` costs on a remote holding a training series: the corpus bf16 series
# (11 epochs of a MiniLM fine-tune) committed and pushed to an S3-protocol server on loopback
# (s3s-fs), then `ckpt gc --remote --dry-run` run from the repository that holds the history
# and from a directory without one (by URL: every version and manifest downloaded). The walk
# is the cost (it reads every kept blob's header on the remote; deleting is one request per
# garbage object), so no garbage is made. Reported per run: seconds, requests, objects listed
# and kept, against a `ckpt clone` of the same remote in the same run (which downloads every
# object).
#
# usage: benches/remote_gc.sh [--runs R] [--dir DIR] [--series bf16|fp32]
# Needs the corpus (bash ../shared/corpus/make_corpus.sh) and s3s-fs on PATH
# (cargo install s3s-fs --version 0.14.1 --features binary).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS=3
DIR="${TMPDIR:-/tmp}/ckpt-remote-gc"
SERIES=bf16
while (($#)); do
    case "$1" in
        --runs) RUNS="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        --series) SERIES="$2"; shift 2 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
CORPUS="${CKPT_CORPUS:-$HOME/.cache/ckpt-corpus}/series/$SERIES"
[[ -d "$CORPUS" ]] || { echo "no corpus at $CORPUS (bash ../shared/corpus/make_corpus.sh)" >&2; exit 1; }
command -v s3s-fs > /dev/null || { echo "s3s-fs is not on PATH" >&2; exit 1; }

cd "$ROOT"
cargo build --release --quiet --bin ckpt
CKPT="${CKPT:-${CARGO_TARGET_DIR:-$ROOT/target}/release/ckpt}"
rm -rf "$DIR"
mkdir -p "$DIR/s3root/bench"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export AWS_ACCESS_KEY_ID=bench-key AWS_SECRET_ACCESS_KEY=bench-secret AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$PORT" AWS_ALLOW_HTTP=true
s3s-fs --host 127.0.0.1 --port "$PORT" --access-key "$AWS_ACCESS_KEY_ID" --secret-key "$AWS_SECRET_ACCESS_KEY" \
    "$DIR/s3root" > "$DIR/s3s-fs.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2> /dev/null; wait $SERVER 2> /dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do
    (echo > "/dev/tcp/127.0.0.1/$PORT") 2> /dev/null && break
    sleep 0.1
done

URL="s3://bench/series"
REPO="$DIR/repo"
"$CKPT" -q init "$REPO" > /dev/null
for f in "$CORPUS"/epoch_*.safetensors; do
    cp "$f" "$REPO/model.safetensors"
    "$CKPT" -q -C "$REPO" commit -m "$(basename "$f")" model.safetensors > /dev/null
done
"$CKPT" -q -C "$REPO" remote add origin "$URL" > /dev/null
"$CKPT" -q -C "$REPO" push > /dev/null
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ((run = 1; run <= RUNS; run++)); do
    rm -rf "$DIR/clone" "$DIR/nowhere"
    mkdir -p "$DIR/nowhere"
    s=$(date +%s.%N); "$CKPT" -q clone "$URL" "$DIR/clone" > /dev/null; e=$(date +%s.%N)
    echo "clone $(echo "$e - $s" | bc)"
    s=$(date +%s.%N); out=$("$CKPT" -C "$REPO" gc --remote origin --dry-run --json); e=$(date +%s.%N)
    echo "gc_repo $(echo "$e - $s" | bc) $(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["requests"], r["listed"], r["kept"], r["deleted"], r["recent"])')"
    s=$(date +%s.%N); out=$(cd "$DIR/nowhere" && "$CKPT" gc --remote "$URL" --dry-run --json); e=$(date +%s.%N)
    echo "gc_url $(echo "$e - $s" | bc) $(echo "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["requests"], r["listed"], r["kept"], r["deleted"], r["recent"])')"
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
