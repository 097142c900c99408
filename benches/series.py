#!/usr/bin/env python3
"""Repository benchmark on the corpus training series (issue #3 targets).

For each series (bf16, fp32) and delta policy (previous, base, skip, reverse), commits
epoch_00..epoch_10 one by one into a fresh repository (as `model.safetensors`), checking the new
HEAD out right after each commit (median of 3: what resuming from the latest checkpoint costs at
that point), then checks every version out again and verifies it byte for byte. Reports per
version: bytes the store grew by, commit and checkout wall time, peak RSS (from /usr/bin/time),
and `cp` of the same file for scale; and the whole store against the sum of ZipNN standalone
sizes of the same files (computed in the same run).

Also commits the AdamW state series (epochs 01, 02, 09, 10) to see whether deltas pay for
optimizer state.

With `reverse`, the commit leaves the rewrite of the parent's blobs pending (CKPT_COMPACT=manual)
and `ckpt compact` runs right after it as its own timed step: what the default background
compaction does while training goes on. "stored" is what the store grew by after both.
`--compact inline` times the two together in the commit instead.

usage: $CKPT_CORPUS/venv/bin/python benches/series.py [--ckpt target/release/ckpt] [--json OUT]
       [--only bf16/reverse,...] [--compact manual|inline] [--ballast MB] [--level default|max]
"""
import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

CORPUS = os.environ.get("CKPT_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "ckpt-corpus")


# Written and deleted right before every timed command (`--ballast MB`). On the VM this was
# measured on, writing new data into the page cache runs at ~3 GB/s after memory was freed and
# ~0.4 GB/s otherwise (docs/BENCHMARKS.md, "Fixed costs again"); freeing some first puts `cp`,
# commit and checkout in the same phase, as benches/big_checkpoint.sh does.
BALLAST = b""
BALLAST_DIR = tempfile.gettempdir()


def settle():
    if BALLAST:
        path = os.path.join(BALLAST_DIR, "ballast")
        with open(path, "wb") as f:
            f.write(BALLAST)
        os.remove(path)


def timed(cmd, cwd, env=None):
    """Wall seconds and peak RSS (KiB) of a command; raises on failure."""
    settle()
    t = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "%M"] + cmd, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    rss = int(r.stderr.strip().splitlines()[-1])
    return wall, rss, r.stdout


def store_bytes(repo):
    total = 0
    for root, _, files in os.walk(os.path.join(repo, ".ckpt", "objects")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


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


def cp_time(src, tmp):
    times = []
    for _ in range(3):
        dst = os.path.join(tmp, "cp.out")
        settle()
        t = time.perf_counter()
        subprocess.run(["cp", src, dst], check=True)
        times.append(time.perf_counter() - t)
        os.remove(dst)
    return statistics.median(times)


def run_series(ckpt, files, policy, base_every, scratch, zipnn_sizes, compact, level="default"):
    repo = tempfile.mkdtemp(prefix="series-", dir=scratch)
    try:
        subprocess.run([ckpt, "-q", "init", repo], check=True, capture_output=True)
        cfg_path = os.path.join(repo, ".ckpt", "config")
        cfg = json.load(open(cfg_path))
        cfg.update(delta_policy=policy, base_every=base_every, compression_level=level)
        json.dump(cfg, open(cfg_path, "w"), indent=2)
        rows, before = [], store_bytes(repo)
        for i, f in enumerate(files):
            shutil.copyfile(f, os.path.join(repo, "model.safetensors"))
            env = dict(os.environ, CKPT_COMPACT=compact)
            wall, rss, _ = timed([ckpt, "-q", "commit", "-m", os.path.basename(f), "model.safetensors"], repo, env)
            compact_s = timed([ckpt, "-q", "compact"], repo)[0] if compact == "manual" else 0.0
            after = store_bytes(repo)
            head_times = []
            for _ in range(3):
                outdir = os.path.join(repo, "co")
                head_times.append(timed([ckpt, "-q", "checkout", "HEAD", "--output", outdir], repo)[0])
                shutil.rmtree(outdir)
            rows.append(dict(file=os.path.basename(f), raw=os.path.getsize(f), stored=after - before,
                             commit_s=wall, compact_s=compact_s, commit_rss_kib=rss, cp_s=cp_time(f, repo),
                             zipnn=zipnn_sizes[f],
                             head_checkout_s=statistics.median(head_times)))
            before = after
        _, _, out = timed([ckpt, "log", "--json"], repo)
        ids = [v["id"] for v in json.loads(out)][::-1]  # oldest first
        for row, vid, f in zip(rows, ids, files):
            outdir = os.path.join(repo, "co")
            wall, rss, _ = timed([ckpt, "-q", "checkout", vid, "--output", outdir], repo)
            row.update(checkout_s=wall, checkout_rss_kib=rss,
                       bit_exact=sha(os.path.join(outdir, "model.safetensors")) == sha(f))
            shutil.rmtree(outdir)
        return rows, store_bytes(repo)
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="target/release/ckpt")
    ap.add_argument("--base-every", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--level", default="default", choices=["default", "max"],
                    help="the repository's compression_level")
    ap.add_argument("--only", help="comma-separated series/policy pairs, e.g. bf16/previous")
    ap.add_argument("--compact", default="manual", choices=["manual", "inline"],
                    help="reverse deltas: timed apart after each commit (manual), or inside it")
    ap.add_argument("--ballast", type=int, default=200,
                    help="MB written and deleted before each timed command (0: none)")
    args = ap.parse_args()
    global BALLAST, BALLAST_DIR
    BALLAST = os.urandom(1 << 20) * args.ballast
    ckpt = os.path.abspath(args.ckpt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from zipnn import ZipNN
    scratch = os.path.join(CORPUS, "work")
    BALLAST_DIR = scratch
    series = {s: [os.path.join(CORPUS, "series", s, f"epoch_{e:02d}.safetensors") for e in range(11)]
              for s in ("bf16", "fp32")}
    series["optim"] = [os.path.join(CORPUS, "series", "optim", f"adamw_epoch_{e:02d}.safetensors") for e in (1, 2, 9, 10)]
    if args.only:
        wanted = {o.split("/")[0] for o in args.only.split(",")}
        series = {k: v for k, v in series.items() if k in wanted}
    zipnn_sizes = {f: zipnn_size(ZipNN, f) for fs in series.values() for f in fs}
    results, ok = {}, True
    print(f"# ckpt {ckpt}, base_every {args.base_every}, compaction {args.compact}, ballast {args.ballast} MB, "
          f"load {os.getloadavg()}")
    for name, files in series.items():
        for policy in ("previous", "base", "skip", "reverse"):
            if args.only and f"{name}/{policy}" not in args.only.split(","):
                continue
            rows, total = run_series(ckpt, files, policy, args.base_every, scratch, zipnn_sizes, args.compact, args.level)
            raw = sum(r["raw"] for r in rows)
            zsum = sum(r["zipnn"] for r in rows)
            ok = ok and all(r["bit_exact"] for r in rows)
            results[f"{name}/{policy}"] = dict(rows=rows, store=total, raw=raw, zipnn_sum=zsum)
            print(f"\n### {name}, delta policy `{policy}`: store {total / 1e6:.1f} MB = {100 * total / raw:.2f}% of raw, "
                  f"{total / zsum:.3f}x the sum of ZipNN standalone sizes ({zsum / 1e6:.1f} MB)\n")
            print("| file | raw MB | stored MB | stored % | ZipNN % | commit s | cp s | commit/cp | compact s | HEAD checkout s "
                  "| HEAD checkout/cp | checkout s (at the end) | checkout/cp | commit RSS MiB | checkout RSS MiB | bit-exact |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
            for r in rows:
                print(f"| {r['file']} | {r['raw'] / 1e6:.1f} | {r['stored'] / 1e6:.2f} | {100 * r['stored'] / r['raw']:.2f} "
                      f"| {100 * r['zipnn'] / r['raw']:.2f} | {r['commit_s']:.3f} | {r['cp_s']:.3f} "
                      f"| {r['commit_s'] / r['cp_s']:.1f} | {r['compact_s']:.3f} | {r['head_checkout_s']:.3f} "
                      f"| {r['head_checkout_s'] / r['cp_s']:.1f} "
                      f"| {r['checkout_s']:.3f} | {r['checkout_s'] / r['cp_s']:.1f} "
                      f"| {r['commit_rss_kib'] / 1024:.0f} | {r['checkout_rss_kib'] / 1024:.0f} | {'yes' if r['bit_exact'] else 'NO'} |")
    if args.json:
        json.dump(results, open(args.json, "w"), indent=1)
    print("\nall versions bit-exact: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
