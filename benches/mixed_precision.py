#!/usr/bin/env python3
"""Mixed-precision loop on the corpus series (issue #28, item 1: cross-precision references).

A training loop that keeps fp32 master weights, saves a bf16 copy of them beside, and the AdamW
state where the corpus has it, commits one version per epoch: `model_fp32.safetensors`
(series/fp32/epoch_NN), `model_bf16.safetensors` (series/bf16/epoch_NN, the same weights cast
to bf16 by rounding to nearest even) and, at epochs 1, 2, 9 and 10, `optim.safetensors`
(series/optim/adamw_epoch_NN). Default config (delta policy `reverse`, compaction inline).

Runs the loop twice with the same binary: with cross-precision references (the default) and
with them off (`CKPT_CROSS_PRECISION=off`, what a build without them stores), and reports the
store, what each file's tensors take in it (objects attributed to the first file, in commit
order, whose manifest lists them: the reference of a derived bf16 blob is an fp32 blob, so it
counts for fp32), against the sum of ZipNN standalone sizes of the same files (computed in the
same run), and checks every version out again byte for byte.

usage: $CKPT_CORPUS/venv/bin/python benches/mixed_precision.py [--ckpt target/release/ckpt]
       [--epochs 11] [--json OUT] [--level default|max]
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings

CORPUS = os.environ.get("CKPT_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "ckpt-corpus")
OPTIM_EPOCHS = (1, 2, 9, 10)


def run(cmd, cwd, env=None):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def zipnn_size(ZipNN, path):
    data = open(path, "rb").read()
    dtype = "bfloat16" if "bf16" in path else "float32"
    z = ZipNN(method="HUFFMAN", input_format="byte", bytearray_dtype=dtype, threads=os.cpu_count())
    return len(z.compress(bytearray(data)))


def epoch_files(e):
    files = {
        "model_fp32.safetensors": os.path.join(CORPUS, "series", "fp32", f"epoch_{e:02d}.safetensors"),
        "model_bf16.safetensors": os.path.join(CORPUS, "series", "bf16", f"epoch_{e:02d}.safetensors"),
    }
    if e in OPTIM_EPOCHS:
        files["optim.safetensors"] = os.path.join(CORPUS, "series", "optim", f"adamw_epoch_{e:02d}.safetensors")
    return files


def object_sizes(repo):
    sizes = {}
    objects = os.path.join(repo, ".ckpt", "objects")
    for d in os.listdir(objects):
        for f in os.listdir(os.path.join(objects, d)):
            sizes[d + f] = os.path.getsize(os.path.join(objects, d, f))
    return sizes


def attribute(ckpt, repo, ids):
    """Store bytes per file name: each object counted once, for the first version and file
    (commit order, files in path order) whose `show --json` lists it, plus its reference chain
    as `ckpt show` reports the blob (its own object only: chains are counted where their objects
    are first listed). Objects no file lists (references of derived blobs whose files were
    never listed, versions, manifests) go to "(other)"."""
    sizes = object_sizes(repo)
    seen, per_file = set(), {}
    for vid in ids:
        shown = json.loads(run([ckpt, "show", vid, "--json"], repo))
        for f in shown["files"]:
            for s in f["segments"]:
                blob = s["blob"]
                if blob in seen:
                    continue
                seen.add(blob)
                per_file[f["path"]] = per_file.get(f["path"], 0) + sizes.get(blob, 0)
    per_file["(other)"] = sum(v for k, v in sizes.items() if k not in seen)
    return per_file


def loop(ckpt, epochs, scratch, cross_precision, level="default"):
    repo = tempfile.mkdtemp(prefix="mixed-", dir=scratch)
    env = dict(os.environ, CKPT_COMPACT="inline", CKPT_CROSS_PRECISION="on" if cross_precision else "off")
    try:
        run([ckpt, "-q", "init", repo], scratch)
        cfg_path = os.path.join(repo, ".ckpt", "config")
        cfg = json.load(open(cfg_path))
        cfg.update(compression_level=level)
        json.dump(cfg, open(cfg_path, "w"), indent=2)
        commit_s, ids = [], []
        for e in range(epochs):
            files = epoch_files(e)
            for name, src in files.items():
                shutil.copyfile(src, os.path.join(repo, name))
            t = time.perf_counter()
            run([ckpt, "-q", "commit", "-m", f"epoch {e}"] + sorted(files), repo, env)
            commit_s.append(time.perf_counter() - t)
        ids = [v["id"] for v in json.loads(run([ckpt, "log", "--json"], repo))][::-1]
        exact = True
        for e, vid in enumerate(ids):
            out = os.path.join(repo, "co")
            run([ckpt, "-q", "checkout", vid, "--output", out], repo)
            for name, src in epoch_files(e).items():
                exact = exact and sha(os.path.join(out, name)) == sha(src)
            shutil.rmtree(out)
        run([ckpt, "-q", "verify"], repo)
        store = sum(object_sizes(repo).values())
        return dict(store=store, per_file=attribute(ckpt, repo, ids), commit_s=commit_s, bit_exact=exact)
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="target/release/ckpt")
    ap.add_argument("--epochs", type=int, default=11)
    ap.add_argument("--json")
    ap.add_argument("--level", default="default", choices=["default", "max"],
                    help="compression_level of the run with references (the run without them, today's "
                         "build as the issue's baseline, stays at the default level)")
    args = ap.parse_args()
    ckpt = os.path.abspath(args.ckpt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from zipnn import ZipNN
    scratch = os.path.join(CORPUS, "work")
    os.makedirs(scratch, exist_ok=True)
    zipnn = {}
    for e in range(args.epochs):
        for name, src in epoch_files(e).items():
            zipnn[name] = zipnn.get(name, 0) + zipnn_size(ZipNN, src)
    raw = {}
    for e in range(args.epochs):
        for name, src in epoch_files(e).items():
            raw[name] = raw.get(name, 0) + os.path.getsize(src)
    on = loop(ckpt, args.epochs, scratch, True, args.level)
    off = loop(ckpt, args.epochs, scratch, False)
    print(f"# ckpt {ckpt}, {args.epochs} epochs, level {args.level} (with references), load {os.getloadavg()}")
    print(f"\nstore with cross-precision references {on['store']:,} B, without {off['store']:,} B: "
          f"{on['store'] / off['store']:.3f}x; raw {sum(raw.values()):,} B; "
          f"bit-exact {'yes' if on['bit_exact'] and off['bit_exact'] else 'NO'}\n")
    print("| file | raw MB | ZipNN sum MB | stored MB (on) | x ZipNN (on) | stored MB (off) | x ZipNN (off) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in sorted(raw):
        a, b = on["per_file"].get(name, 0), off["per_file"].get(name, 0)
        print(f"| {name} | {raw[name] / 1e6:.1f} | {zipnn[name] / 1e6:.1f} | {a / 1e6:.2f} | {a / zipnn[name]:.3f} "
              f"| {b / 1e6:.2f} | {b / zipnn[name]:.3f} |")
    print(f"| (other) | | | {on['per_file']['(other)'] / 1e6:.2f} | | {off['per_file']['(other)'] / 1e6:.2f} | |")
    median = lambda xs: sorted(xs)[len(xs) // 2]
    print(f"\ncommit s per epoch, median: on {median(on['commit_s']):.2f}, off {median(off['commit_s']):.2f}")
    if args.json:
        json.dump(dict(on=on, off=off, zipnn=zipnn, raw=raw), open(args.json, "w"), indent=1)
    return 0 if on["bit_exact"] and off["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
