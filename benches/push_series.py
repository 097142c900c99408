#!/usr/bin/env python3
"""Pushing a training series one epoch at a time to a remote (issues #21 and #26 targets).

For each series (fp32, bf16 of the corpus: epoch_00..epoch_10.safetensors) and each remote
layout (`--layout mirror,deltas`), commits the epochs one by one into a fresh repository (as
`model.safetensors`, default settings; `ckpt compact` right after each commit waits for the
commit's background compaction, so every measurement sees the store compacted), and pushes after
each epoch to a directory remote (`--remote dir`, the default) or an `s3s-fs` server started here
on a loopback port (`--remote s3`). Reports per epoch:

  added     what the epoch added to the local store once compacted (sum of object file sizes
            under .ckpt/objects after the epoch minus before it)
  sent      bytes the push uploaded (its --json report), and what the remote's object files
            grew by (file sizes under s3s-fs's root: the same bytes counted at the far end)
  ratio     sent / added (deltas layout target: <= 1.05)
  target    mirror layout: 1.05 x (the new version's new objects + what the parent's rewritten
            objects take now) + 64 KiB; sent must stay below it
  remote/local  the remote's object bytes over the local store's after the push (mirror
            target: <= 1.05)
  file      the checkpoint's size: what Git LFS or DVC would upload (the whole file)

then a second push of the last version (target: uploads nothing, <= 10 requests), and clones of
the series remote: whole and `--depth 1` (bytes received), the depth-1 clone against the newest
version stored whole (the objects a mirror-layout depth-1 clone stores: the newest version, all
standalone; mirror target <= 1.1).

usage: python3 benches/push_series.py [--ckpt target/release/ckpt] [--series fp32,bf16]
       [--layout mirror,deltas] [--remote dir|s3] [--data DIR] [--epochs 11] [--base-every N]
       [--json OUT]
  --data DIR: a directory of epoch_NN.safetensors to use instead of the corpus series.
`--remote s3` needs `s3s-fs` on PATH (cargo install s3s-fs --version 0.14.1 --features binary).
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


def object_sizes(objects):
    """Object file name -> size under an objects/ directory (as object_bytes)."""
    out = {}
    if not os.path.isdir(objects):
        return out
    for fan in os.listdir(objects):
        d = os.path.join(objects, fan)
        if len(fan) != 2 or not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if len(name) == 62:
                out[fan + name] = os.path.getsize(os.path.join(d, name))
    return out


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


def bench_series(ckpt, name, files, s3root, env, base_every=None, layout="mirror", remote="dir"):
    work = tempfile.mkdtemp(prefix=f"push-{name}-")
    if remote == "s3":
        url = f"s3://{BUCKET}/{name}-{layout}"
        remote_objects = os.path.join(s3root, BUCKET, f"{name}-{layout}", "objects")
    else:
        url = os.path.join(s3root, f"{name}-{layout}")
        remote_objects = os.path.join(url, "objects")
    local_objects = os.path.join(work, ".ckpt", "objects")
    run(ckpt, ["init"], work, env)
    if base_every:
        with open(os.path.join(work, ".ckpt", "config"), "w") as f:
            json.dump({"base_every": base_every}, f)
    run(ckpt, ["remote", "add", "origin", url, "--layout", layout], work, env)
    rows = []
    local_before = object_bytes(local_objects)
    sizes_before = object_sizes(local_objects)
    for e, src in enumerate(files):
        shutil.copyfile(src, os.path.join(work, "model.safetensors"))
        run(ckpt, ["commit", "-q", "-m", f"epoch {e}", "model.safetensors"], work, env)
        run(ckpt, ["compact", "-q"], work, env)
        local_after = object_bytes(local_objects)
        sizes_after = object_sizes(local_objects)
        # The new version's new objects (whole, as the local store keeps the newest) and the
        # parent's objects the compaction rewrote (as deltas), at their size now.
        new_whole = sum(n for k, n in sizes_after.items() if k not in sizes_before)
        parent_delta = sum(n for k, n in sizes_after.items() if k in sizes_before and sizes_before[k] != n)
        sizes_before = sizes_after
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
                "new_whole": new_whole,
                "parent_delta": parent_delta,
                "target": 1.05 * (new_whole + parent_delta) + 65536,
                "recoded": report.get("objects_recoded", 0),
                "remote_total": remote_after,
                "local_total": local_after,
                "remote_over_local": remote_after / local_after if local_after else float("nan"),
            }
        )
        local_before = local_after
    again = json.loads(run(ckpt, ["push", "--json"], work, env).stdout)
    clones = {}
    for label, extra in (("whole", []), ("depth 1", ["--depth", "1"])):
        dest = tempfile.mkdtemp(prefix="clone-")
        t = time.perf_counter()
        r = json.loads(run(ckpt, ["clone", "--json"] + extra + [url, os.path.join(dest, "c")], dest, env).stdout)
        clones[label] = {
            "bytes": r["bytes_received"],
            "objects": r["objects_received"],
            "s": time.perf_counter() - t,
            "stored": object_bytes(os.path.join(dest, "c", ".ckpt", "objects")),
        }
        shutil.rmtree(dest)
    shutil.rmtree(work)
    return {"series": name, "layout": layout, "remote": remote, "epochs": rows, "second_push": again, "clones": clones}


def mb(n):
    return f"{n / 1e6:.1f} MB"


def print_result(res, newest_whole=None):
    print(f"\n### {res['series']}, {res['layout']} layout ({res['remote']} remote)\n")
    print(
        "| epoch | checkpoint (LFS/DVC upload) | added locally (compacted) | push sent | mirror target "
        "| remote grew | sent / added | remote / local | as deltas | recoded | requests | push s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in res["epochs"]:
        print(
            f"| {r['epoch']:02d} | {mb(r['file'])} | {mb(r['added'])} | {mb(r['sent'])} | {mb(r['target'])} "
            f"| {mb(r['remote_grew'])} | {r['ratio']:.3f} | {r['remote_over_local']:.3f} "
            f"| {r['as_deltas']}/{r['objects']} | {r['recoded']} | {r['requests']} | {r['push_s']:.2f} |"
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
    over = [r for r in res["epochs"] if r["sent"] > r["target"]]
    print(
        f"pushes above the mirror target: {len(over)} of {len(res['epochs'])}; max remote/local "
        f"{max(r['remote_over_local'] for r in res['epochs']):.3f}"
    )
    for label, c in res["clones"].items():
        line = f"clone ({label}): {mb(c['bytes'])} received, {c['objects']} objects, {c['s']:.1f} s, stores {mb(c['stored'])}"
        if label == "depth 1" and newest_whole:
            line += f"; {c['bytes'] / newest_whole:.2f}x the newest version stored whole ({mb(newest_whole)})"
        print(line)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ckpt", default="target/release/ckpt")
    p.add_argument("--series", default="fp32,bf16")
    p.add_argument("--data")
    p.add_argument("--epochs", type=int, default=11)
    p.add_argument("--json")
    p.add_argument("--base-every", type=int, help="the repository's base_every (default: ckpt's)")
    p.add_argument("--layout", default="mirror,deltas", help="remote layouts to measure (mirror first)")
    p.add_argument("--remote", default="dir", choices=["dir", "s3"])
    args = p.parse_args()
    ckpt = os.path.abspath(args.ckpt)
    s3root = tempfile.mkdtemp(prefix="s3s-")
    proc = None
    env = dict(os.environ)
    if args.remote == "s3":
        proc, port = start_s3s(s3root)
        env.update(
            {
                "AWS_ACCESS_KEY_ID": KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET,
                "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                "AWS_ALLOW_HTTP": "true",
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
            newest_whole = None
            for layout in args.layout.split(","):
                res = bench_series(ckpt, label, files, s3root, env, args.base_every, layout, args.remote)
                if layout == "mirror":
                    newest_whole = res["clones"]["depth 1"]["stored"]
                res["newest_whole"] = newest_whole
                print_result(res, newest_whole)
                results.append(res)
        load = os.getloadavg()
        print(f"\nload average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    finally:
        if proc:
            proc.kill()
            proc.wait()
        shutil.rmtree(s3root, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
