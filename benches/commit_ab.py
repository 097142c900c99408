#!/usr/bin/env python3
"""A/B of `ckpt commit` on one corpus series file, against `cp` in the same loop.

Builds a repository holding epoch 0 of a series with epoch 1 in the working tree (once), then
N times, for each variant in turn: copies that repository (`cp -a`), writes and deletes a
200 MB ballast file (the VM this was written on writes new page-cache data at ~3 GB/s after
memory was freed and at ~0.4 GB/s otherwise; see docs/BENCHMARKS.md, "Fixed costs again"), and
times one command in the copy. Copies are kept until the end: deleting files between runs
makes the next ones' inode allocations slower on ext4. Prints medians and each run.

Variants: cp (of the epoch file), A and B (`ckpt commit` with CKPT_COMPACT=manual, the binaries
given), A-nosync (A under eatmydata, if installed: what the fsyncs cost), compress (A's
`ckpt compress` of the file: the coding alone).

usage: $CKPT_CORPUS/venv/bin/python benches/commit_ab.py --a target/release/ckpt [--b OTHER]
       [--series bf16|fp32] [--runs 11] [--variants cp,A,B,A-nosync,compress]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time

CORPUS = os.environ.get("CKPT_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "ckpt-corpus")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", required=True)
    ap.add_argument("--b")
    ap.add_argument("--series", default="bf16")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--variants", default=None)
    args = ap.parse_args()
    a = os.path.abspath(args.a)
    b = os.path.abspath(args.b) if args.b else None
    variants = (args.variants or ("cp,A,B,compress" if b else "cp,A,A-nosync,compress")).split(",")
    commands = {
        "cp": ["cp", "model.safetensors", "copy"],
        "A": [a, "commit", "-q", "-m", "x", "model.safetensors"],
        "B": [b, "commit", "-q", "-m", "x", "model.safetensors"] if b else None,
        "A-nosync": ["eatmydata", a, "commit", "-q", "-m", "x", "model.safetensors"],
        "compress": [a, "compress", "-q", "model.safetensors", "-o", "out.ckz"],
    }
    series = os.path.join(CORPUS, "series", args.series)
    work = tempfile.mkdtemp(prefix="ckpt-commit-ab-")
    template = os.path.join(work, "template")
    os.makedirs(template)
    env = dict(os.environ, CKPT_COMPACT="manual")
    shutil.copy(os.path.join(series, "epoch_00.safetensors"), os.path.join(template, "model.safetensors"))
    subprocess.run([a, "init", "-q", template], check=True, capture_output=True)
    subprocess.run([a, "commit", "-q", "-m", "e0", "model.safetensors"], cwd=template, env=env, check=True,
                   capture_output=True)
    shutil.copy(os.path.join(series, "epoch_01.safetensors"), os.path.join(template, "model.safetensors"))
    ballast = os.urandom(1 << 20) * 200
    times = {v: [] for v in variants}
    try:
        for run in range(args.runs):
            for v in variants:
                copy = os.path.join(work, f"run-{run}-{v}")
                subprocess.run(["cp", "-a", template, copy], check=True)
                os.sync()
                with open(os.path.join(work, "ballast"), "wb") as f:
                    f.write(ballast)
                os.remove(os.path.join(work, "ballast"))
                t = time.perf_counter()
                r = subprocess.run(commands[v], cwd=copy, env=env, capture_output=True, text=True)
                times[v].append(time.perf_counter() - t)
                if r.returncode != 0:
                    raise SystemExit(f"{v} failed: {r.stderr.strip()[-400:]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(times["cp"]) if "cp" in times else None
    print(f"{args.series} epoch 1 after epoch 0, {args.runs} runs each, medians")
    for v in variants:
        m = statistics.median(times[v])
        ratio = f"{m / base:5.2f}x cp" if base else ""
        print(f"{v:9s} {m * 1000:7.1f} ms  {ratio}   runs: {' '.join(f'{x * 1000:.0f}' for x in times[v])}")


if __name__ == "__main__":
    main()
