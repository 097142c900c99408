#!/usr/bin/env python3
"""Pushing a training series one epoch at a time to an S3-protocol remote (issue #21 targets).

For each series (fp32, bf16 of the corpus: epoch_00..epoch_10.safetensors), commits the epochs
one by one into a fresh repository (as `model.safetensors`, compaction run right after each
commit: `ckpt compact`), and pushes after each epoch to an `s3s-fs` server started here on a
loopback port. Reports per epoch:

  added     what the epoch added to the local store once compacted (sum of object file sizes
            under .ckpt/objects after the epoch minus before it)
  sent      bytes the push uploaded (its --json report), and what the remote's object files
            grew by (file sizes under s3s-fs's root: the same bytes counted at the far end)
  ratio     sent / added (target: <= 1.05)
  file      the checkpoint's size: what Git LFS or DVC would upload (the whole file)

then a second push of the last version (target: uploads nothing, <= 10 requests), and clones of
the series remote: whole and `--depth 1` (bytes received).

usage: python3 benches/push_series.py [--ckpt target/release/ckpt] [--series fp32,bf16]
       [--data DIR] [--epochs 11] [--base-every N] [--json OUT]
  --data DIR: a directory of epoch_NN.safetensors to use instead of the corpus series.
Needs `s3s-fs` on PATH (cargo install s3s-fs --version 0.14.1 --features binary).
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

CORPUS = os.environ.get("CKPT_CORPUS") or os.path.join(os.path.expanduser("~"), ".cache", "ckpt-corpus")
BUCKET = "bench"
KEY, SECRET = "bench-key", "bench-secret"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3s(root):
    os.makedirs(os.path.join(root, BUCKET), exist_ok=True)
    port = free_port()
    proc = subprocess.Popen(
        ["s3s-fs", "--host", "127.0.0.1", "--port", str(port), "--access-key", KEY, "--secret-key", SECRET, root],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                sys.exit("s3s-fs exited at start")
            time.sleep(0.05)
    proc.kill()
    sys.exit("s3s-fs did not start")


def object_bytes(objects):
    """Sum of object file sizes under an objects/ directory (names of 62 hex digits: s3s-fs
    keeps metadata files of its own elsewhere)."""
    total = 0
    if not os.path.isdir(objects):
        return 0
    for fan in os.listdir(objects):
        d = os.path.join(objects, fan)
        if len(fan) != 2 or not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if len(name) == 62:
                total += os.path.getsize(os.path.join(d, name))
    return total


def run(ckpt, args, cwd, env):
    r = subprocess.run([ckpt] + args, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ckpt {' '.join(args)} failed:\n{r.stderr}")
    return r


def series_files(series, data, epochs):
    base = data or os.path.join(CORPUS, "series", series)
    files = [os.path.join(base, f"epoch_{e:02d}.safetensors") for e in range(epochs)]
    missing = [f for f in files if not os.path.exists(f)]
    if missing:
        sys.exit(f"missing {missing[0]} (build the corpus, or pass --data DIR)")
    return files


def bench_series(ckpt, name, files, s3root, env, base_every=None):
    work = tempfile.mkdtemp(prefix=f"push-{name}-")
    url = f"s3://{BUCKET}/{name}"
    remote_objects = os.path.join(s3root, BUCKET, name, "objects")
    local_objects = os.path.join(work, ".ckpt", "objects")
    run(ckpt, ["init"], work, env)
    if base_every:
        with open(os.path.join(work, ".ckpt", "config"), "w") as f:
            json.dump({"base_every": base_every}, f)
    run(ckpt, ["remote", "add", "origin", url], work, env)
    rows = []
    local_before = object_bytes(local_objects)
    for e, src in enumerate(files):
        shutil.copyfile(src, os.path.join(work, "model.safetensors"))
        run(ckpt, ["commit", "-q", "-m", f"epoch {e}", "model.safetensors"], work, env)
        run(ckpt, ["compact", "-q"], work, env)
        local_after = object_bytes(local_objects)
        remote_before = object_bytes(remote_objects)
        t = time.perf_counter()
        report = json.loads(run(ckpt, ["push", "--json"], work, env).stdout)
        wall = time.perf_counter() - t
        remote_after = object_bytes(remote_objects)
        added = local_after - local_before
        rows.append(
            {
                "epoch": e,
                "file": os.path.getsize(src),
                "added": added,
                "sent": report["bytes_sent"],
                "remote_grew": remote_after - remote_before,
                "as_deltas": report.get("objects_sent_as_deltas", 0),
                "objects": report["objects_sent"],
                "requests": report["requests"],
                "push_s": wall,
                "ratio": report["bytes_sent"] / added if added else float("nan"),
            }
        )
        local_before = local_after
    again = json.loads(run(ckpt, ["push", "--json"], work, env).stdout)
    clones = {}
    for label, extra in (("whole", []), ("depth 1", ["--depth", "1"])):
        dest = tempfile.mkdtemp(prefix="clone-")
        t = time.perf_counter()
        r = json.loads(run(ckpt, ["clone", "--json"] + extra + [url, os.path.join(dest, "c")], dest, env).stdout)
        clones[label] = {"bytes": r["bytes_received"], "objects": r["objects_received"], "s": time.perf_counter() - t}
        shutil.rmtree(dest)
    shutil.rmtree(work)
    return {"series": name, "epochs": rows, "second_push": again, "clones": clones}


def mb(n):
    return f"{n / 1e6:.1f} MB"


def print_result(res):
    print(f"\n### {res['series']}\n")
    print("| epoch | checkpoint (LFS/DVC upload) | added locally (compacted) | push sent | remote grew | sent / added | as deltas | requests | push s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["epochs"]:
        print(
            f"| {r['epoch']:02d} | {mb(r['file'])} | {mb(r['added'])} | {mb(r['sent'])} | {mb(r['remote_grew'])} "
            f"| {r['ratio']:.3f} | {r['as_deltas']}/{r['objects']} | {r['requests']} | {r['push_s']:.2f} |"
        )
    later = [r for r in res["epochs"] if r["epoch"] > 0]
    if later:
        print(
            f"\nepochs 01+: median sent/added {statistics.median(r['ratio'] for r in later):.3f}, "
            f"max {max(r['ratio'] for r in later):.3f}; median sent {mb(statistics.median(r['sent'] for r in later))} "
            f"vs checkpoint {mb(statistics.median(r['file'] for r in later))}"
        )
    a = res["second_push"]
    print(f"second push of the same version: {a['objects_sent']} objects, {a['bytes_sent']} bytes, {a['requests']} requests")
    for label, c in res["clones"].items():
        print(f"clone ({label}): {mb(c['bytes'])} received, {c['objects']} objects, {c['s']:.1f} s")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", default="target/release/ckpt")
    p.add_argument("--series", default="fp32,bf16")
    p.add_argument("--data")
    p.add_argument("--epochs", type=int, default=11)
    p.add_argument("--json")
    p.add_argument("--base-every", type=int, help="the repository's base_every (default: ckpt's)")
    args = p.parse_args()
    ckpt = os.path.abspath(args.ckpt)
    s3root = tempfile.mkdtemp(prefix="s3s-")
    proc, port = start_s3s(s3root)
    env = dict(os.environ)
    env.update(
        {
            "AWS_ACCESS_KEY_ID": KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_ALLOW_HTTP": "true",
            "CKPT_COMPACT": "manual",
        }
    )
    results = []
    try:
        load = os.getloadavg()
        print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {os.cpu_count()} cores")
        for name in args.series.split(","):
            files = series_files(name, args.data, args.epochs)
            label = args.data and os.path.basename(args.data.rstrip("/")) or name
            if args.base_every:
                label += f"-base{args.base_every}"
            res = bench_series(ckpt, label, files, s3root, env, args.base_every)
            print_result(res)
            results.append(res)
        load = os.getloadavg()
        print(f"\nload average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(s3root, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
