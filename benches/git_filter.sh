#!/usr/bin/env bash
# The git filter against `ckpt commit` and Git LFS, in one run on the same files:
#   1. the corpus series (11 epochs of one checkpoint) added and committed epoch by epoch:
#      store size and total time; then a checkout of epoch 0 from the newest;
#   2. peak RSS of ckpt's clean and smudge of one large synthetic file (SIZE_MIB, default 1024).
# Opt-in 2 GiB run of part 2 alone (issue #19's target: ckpt's peak RSS <= 300 MiB):
#   ONLY_RSS=1 SIZE_MIB=2048 bash benches/git_filter.sh
# It needs about 4x SIZE_MIB of free space in $TMPDIR (file, clean's spool, store, smudged copy).
# Opt-in many-files run (issue #24): N (default 1000) small tracked files in one `git add`:
#   ONLY_MANY=1 N=1000 bash benches/git_filter.sh
# Opt-in mixed-precision run (issue #43 item 4): fp32 master + bf16 copy per epoch through git
# against `ckpt commit` (BEFORE=an older ckpt binary adds its figures):
#   ONLY_MIXED=1 bash benches/git_filter.sh
# Opt-in push run (issue #21 item 5): the series committed and `git push`ed epoch by epoch, the
# pre-push hook uploading to a directory ckpt remote; bytes uploaded per epoch vs the local store,
# then a fresh clone smudging the newest epoch and the first from the remote (cmp-checked):
#   ONLY_PUSH=1 bash benches/git_filter.sh
# Needs: a release build (cargo build --release), the corpus (bash ../shared/corpus/make_corpus.sh),
# git, and git-lfs for the LFS column (apt-get install git-lfs; skipped if absent).
# Compaction runs inline (CKPT_COMPACT=inline) for both ckpt columns, so each figure includes
# the reverse-delta rewrite and the stores are final when measured.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CKPT=${CKPT:-$ROOT/target/release/ckpt}
SERIES=${SERIES:-$HOME/.cache/ckpt-corpus/series/bf16}
SIZE_MIB=${SIZE_MIB:-1024}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PATH="$(dirname "$CKPT"):$PATH" CKPT_COMPACT=inline HOME="$WORK/home" GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.com GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.com
mkdir -p "$HOME"

now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc; }
size() { du -sb "$1" | cut -f1; }

if [ -n "${ONLY_MANY:-}" ]; then
    # Many small tracked files in one `git add` (issue #24: each clean used to write a version
    # listing every path so far, O(n^2)): time and store size.
    N=${N:-1000}
    mkdir "$WORK/many" && cd "$WORK/many" && git init -q -b main && ckpt git install 2>/dev/null && ckpt git track '*.bin' 2>/dev/null
    for i in $(seq 1 "$N"); do printf 'small file %s\n' "$i" > "f$i.bin"; done
    t=$(now); git add -A; add_s=$(since "$t")
    echo "git add of $N small tracked files: $add_s s, store $(size .git/ckpt/.ckpt/objects) bytes of objects ($(size .git/ckpt) in all)"
    exit 0
fi
if [ -n "${ONLY_PUSH:-}" ]; then
    epochs=("$SERIES"/epoch_*.safetensors)
    git init -q --bare -b main "$WORK/origin.git"
    mkdir "$WORK/push" && cd "$WORK/push" && git init -q -b main && ckpt git install 2>/dev/null && ckpt git track '*.safetensors' 2>/dev/null
    git config ckpt.remote "$WORK/weights" && git remote add origin "$WORK/origin.git"
    git add .gitattributes && git commit -qm attributes
    echo "epoch  file bytes  local store growth  uploaded by pre-push  remote total"
    prev_local=0
    for f in "${epochs[@]}"; do
        cp "$f" model.safetensors; git add model.safetensors; git commit -qm e
        git push -q origin main 2>push.err
        local_now=$(size .git/ckpt/.ckpt/objects)
        up=$(sed -n 's/.*uploaded [0-9]* objects (\(.*\))/\1/p' push.err)
        echo "$(basename "$f" .safetensors)  $(stat -c %s "$f")  $((local_now - prev_local))  $up  $(size "$WORK/weights/objects")"
        prev_local=$local_now
    done
    # A fresh clone smudges the newest epoch from the remote alone (its chain of deltas
    # included), bit-exact; then the first epoch.
    ckpt git install --global 2>/dev/null
    t=$(now); git clone -q -c ckpt.remote="$WORK/weights" "$WORK/origin.git" "$WORK/clone"; clone_s=$(since "$t")
    cmp "$WORK/clone/model.safetensors" "${epochs[-1]}"
    echo "clone: $clone_s s, downloaded into its store $(size "$WORK/clone/.git/ckpt/.ckpt/objects") bytes"
    cd "$WORK/clone" && t=$(now) && git checkout -q "HEAD~$(( ${#epochs[@]} - 1 ))" && first_s=$(since "$t")
    cmp model.safetensors "${epochs[0]}"
    echo "checkout of the first epoch: $first_s s, store now $(size .git/ckpt/.ckpt/objects) bytes"
    exit 0
fi
if [ -n "${ONLY_MIXED:-}" ]; then
    # Mixed precision (issue #43 item 4): each epoch's fp32 master weights and their bf16 copy
    # (series/fp32 and series/bf16) in one `git add` + `git commit`, against `ckpt commit` of
    # the same two files per epoch; git cleans in path order, so both orders are measured:
    # master first (master_fp32 < model_bf16) and copy first (model_bf16 < model_fp32).
    # BEFORE=path/to/older/ckpt adds that binary's git store (e.g. main's) for comparison.
    CORPUS_SERIES=$(dirname "$SERIES")
    fp32s=("$CORPUS_SERIES"/fp32/epoch_*.safetensors); bf16s=("$CORPUS_SERIES"/bf16/epoch_*.safetensors)
    mkdir "$WORK/ckpt" && cd "$WORK/ckpt" && ckpt init -q . >/dev/null
    for i in "${!fp32s[@]}"; do
        cp "${fp32s[$i]}" model_fp32.safetensors; cp "${bf16s[$i]}" model_bf16.safetensors
        ckpt -q commit -m e model_fp32.safetensors model_bf16.safetensors >/dev/null
    done
    ckpt_store=$(size .ckpt/objects)
    echo "ckpt commit: $ckpt_store bytes"
    through_git() { # $1: binary dir, $2: label, $3: master's file name
        local bin=$1 label=$2 master=$3
        mkdir "$WORK/$label" && cd "$WORK/$label" && git init -q -b main
        PATH="$bin:$PATH" ckpt git install --local 2>/dev/null && PATH="$bin:$PATH" ckpt git track '*.safetensors' 2>/dev/null
        git add .gitattributes && git commit -qm attributes
        for i in "${!fp32s[@]}"; do
            cp "${fp32s[$i]}" "$master"; cp "${bf16s[$i]}" model_bf16.safetensors
            PATH="$bin:$PATH" git add "$master" model_bf16.safetensors; PATH="$bin:$PATH" git commit -qm e
        done
        git_store=$(size .git/ckpt/.ckpt/objects)
        PATH="$bin:$PATH" git checkout -q HEAD~5
        cmp model_bf16.safetensors "${bf16s[-6]}" && cmp "$master" "${fp32s[-6]}"
        echo "git + ckpt ($label, $(basename "$bin")): $git_store bytes, $(echo "scale=3; $git_store / $ckpt_store" | bc)x ckpt commit"
    }
    for order in master_fp32.safetensors:master-first model_fp32.safetensors:copy-first; do
        through_git "$(dirname "$CKPT")" "${order#*:}" "${order%%:*}"
        [ -n "${BEFORE:-}" ] && through_git "$(dirname "$BEFORE")" "${order#*:}-before" "${order%%:*}"
    done
    exit 0
fi
if [ -z "${ONLY_RSS:-}" ]; then
epochs=("$SERIES"/epoch_*.safetensors)
raw=0
for f in "${epochs[@]}"; do raw=$((raw + $(stat -c %s "$f"))); done
echo "series: ${#epochs[@]} files from $SERIES, $raw bytes"

# ckpt commit
mkdir "$WORK/ckpt" && cd "$WORK/ckpt" && ckpt init -q . >/dev/null
t=$(now)
for f in "${epochs[@]}"; do cp "$f" model.safetensors; ckpt -q commit -m e model.safetensors >/dev/null; done
ckpt_commit_s=$(since "$t")
ckpt_store=$(size .ckpt/objects)
t=$(now); ckpt -q checkout "HEAD~$(( ${#epochs[@]} - 1 ))" model.safetensors >/dev/null; ckpt_checkout_s=$(since "$t")
cmp model.safetensors "${epochs[0]}"

# git + ckpt filter
mkdir "$WORK/git" && cd "$WORK/git" && git init -q -b main && ckpt git install 2>/dev/null && ckpt git track '*.safetensors' 2>/dev/null
git add .gitattributes && git commit -qm attributes
t=$(now)
for f in "${epochs[@]}"; do cp "$f" model.safetensors; git add model.safetensors; git commit -qm e; done
git_commit_s=$(since "$t")
git_store=$(size .git/ckpt/.ckpt/objects)
t=$(now); git checkout -q "HEAD~$(( ${#epochs[@]} - 1 ))"; git_checkout_s=$(since "$t")
cmp model.safetensors "${epochs[0]}"

# Git LFS
lfs="skipped (git-lfs not installed)"
if command -v git-lfs >/dev/null; then
    mkdir "$WORK/lfs" && cd "$WORK/lfs" && git init -q -b main && git lfs install --local >/dev/null && git lfs track '*.safetensors' >/dev/null
    git add .gitattributes && git commit -qm attributes
    t=$(now)
    for f in "${epochs[@]}"; do cp "$f" model.safetensors; git add model.safetensors; git commit -qm e; done
    lfs_commit_s=$(since "$t")
    lfs_store=$(size .git/lfs/objects)
    t=$(now); git checkout -q "HEAD~$(( ${#epochs[@]} - 1 ))"; lfs_checkout_s=$(since "$t")
    cmp model.safetensors "${epochs[0]}"
    lfs="$lfs_store bytes ($(echo "scale=3; $lfs_store / $raw" | bc) of raw), add+commit ${lfs_commit_s} s, checkout of epoch 0 ${lfs_checkout_s} s"
fi
echo "ckpt commit:     $ckpt_store bytes ($(echo "scale=3; $ckpt_store / $raw" | bc) of raw), commits ${ckpt_commit_s} s, checkout of epoch 0 ${ckpt_checkout_s} s"
echo "git + ckpt:      $git_store bytes ($(echo "scale=3; $git_store / $raw" | bc) of raw, $(echo "scale=3; $git_store / $ckpt_store" | bc)x ckpt commit), add+commit ${git_commit_s} s, checkout of epoch 0 ${git_checkout_s} s"
echo "git + LFS:       $lfs"
fi

# Peak RSS of clean and smudge (ckpt's own process; git's memory is git's).
if [ -n "${ONLY_RSS:-}" ]; then
    mkdir "$WORK/git" && cd "$WORK/git" && git init -q -b main && ckpt git install 2>/dev/null
fi
cd "$WORK/git"
python3 - "$SIZE_MIB" <<'EOF'
import json, os, struct, sys
mib = int(sys.argv[1])
n = mib << 20
header = json.dumps({"w": {"dtype": "BF16", "shape": [n // 2], "data_offsets": [0, n]}}).encode()
header += b" " * (-len(header) % 8)
with open("big.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header)
    chunk = os.urandom(64 << 20)
    for _ in range(n // len(chunk)):
        f.write(chunk)
EOF
/usr/bin/time -f "%M %e" -o clean.time ckpt git clean big.safetensors < big.safetensors > big.pointer
/usr/bin/time -f "%M %e" -o reclean.time ckpt git clean big.safetensors < big.safetensors > big.pointer2
cmp big.pointer big.pointer2
/usr/bin/time -f "%M %e" -o smudge.time ckpt git smudge big.safetensors < big.pointer > big.out
cmp big.out big.safetensors
read -r clean_kb clean_s < clean.time
read -r reclean_kb reclean_s < reclean.time
read -r smudge_kb smudge_s < smudge.time
echo "${SIZE_MIB} MiB file: clean peak RSS $((clean_kb / 1024)) MiB (${clean_s} s), re-clean of the stored file $((reclean_kb / 1024)) MiB (${reclean_s} s), smudge peak RSS $((smudge_kb / 1024)) MiB (${smudge_s} s)"
