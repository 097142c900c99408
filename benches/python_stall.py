#!/usr/bin/env python3
"""Training-loop stall of a checkpoint from Python (issue 20, docs/BENCHMARKS.md "Python package").

Measures, on the same tensors in the same run (medians over --runs):

  memcpy      copying every tensor in memory (``arr.copy()``, fresh buffers)
  memcpy_reused  copying into buffers allocated once (``np.copyto``): no page faults
  background  ``repo.commit({...: dict}, background=True)`` until it returns (the stall), and
              until ``wait()`` returns (the whole commit, for information); ``_reused``: with
              ``Repo(reuse_buffers=True)`` (the capture writes into the previous one's memory)
  foreground  ``repo.commit({...: dict})``
  st_numpy    ``safetensors.numpy.save_file`` of the same dicts to local disk
  st_torch    ``safetensors.torch.save_file`` (if torch is installed)
  torch_save  ``torch.save`` of the same dicts (if torch is installed)

and the peak memory of a background commit in a fresh process: VmHWM (reset through
/proc/self/clear_refs before the commit) minus VmRSS before it, plus the captured bytes (held in
memory files, which RSS counts only while mapped), against the bytes captured plus 300 MiB.

Tensors: the corpus' fp32 fine-tune epoch and its AdamW state (~/.cache/ckpt-corpus/series:
model + optimizer, as a training loop checkpoints them), each run nudging one tensor so every
commit stores something new; else synthetic float32 tensors (--synthetic-mb).

    python3 benches/python_stall.py [--runs 5] [--json out.json]

Needs the package installed (pip install ./python), numpy and safetensors; torch optional.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

CORPUS = pathlib.Path(os.environ.get("CKPT_CORPUS", pathlib.Path.home() / ".cache" / "ckpt-corpus")) / "series"


def load_state(synthetic_mb):
    from safetensors.numpy import load_file

    model = CORPUS / "fp32" / "epoch_01.safetensors"
    optim = CORPUS / "optim" / "adamw_epoch_01.safetensors"
    if model.is_file() and optim.is_file() and synthetic_mb == 0:
        return {"model.safetensors": load_file(str(model)), "optimizer.safetensors": load_file(str(optim))}, \
            f"corpus {model.name} + {optim.name}"
    rng = np.random.default_rng(0)
    n = max(1, synthetic_mb // 16)
    model = {f"layer{i}.weight": (rng.standard_normal(4 << 20) * 0.02).astype(np.float32) for i in range(n)}
    return {"model.safetensors": model}, f"synthetic {n} x 16 MiB float32"


def nbytes(state):
    return sum(a.nbytes for d in state.values() for a in d.values())


def nudge(state, i):
    """A training step: every tensor changes (in place, as an optimizer step does; a few
    elements each, so nudging is cheap next to what is measured), so no commit is deduplicated."""
    for d in state.values():
        for a in d.values():
            flat = a.reshape(-1)[: 256]
            flat += a.dtype.type(1e-3) if a.dtype.kind == "f" else a.dtype.type(1)


def median_time(f, runs, setup=None):
    times = []
    for i in range(runs):
        if setup:
            setup(i)
        t = time.perf_counter()
        f(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times), times


def vm(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def peak_child(args):
    """Runs in a fresh process: peak memory of one background commit."""
    import ckpt

    state, _ = load_state(args.synthetic_mb)
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckpt-stall-peak-", dir=args.dir))
    try:
        repo = ckpt.Repo.init(work / "repo")
        repo.commit(state, "warm-up")  # the first version, so the measured one has a parent
        nudge(state, 1)
        before = vm("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        h = repo.commit(state, "measured", background=True)
        h.wait()
        peak = vm("VmHWM")
        # The captured bytes live in memory files, which RSS counts only while mapped (the commit
        # maps them window by window and drops what it has read): they are added in full.
        captured = nbytes(state)
        print(json.dumps({"rss_before": before, "peak": peak, "delta": peak - before, "captured": captured,
                          "total": peak - before + captured}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--synthetic-mb", type=int, default=0, help="use synthetic tensors of this size")
    p.add_argument("--dir", default=None, help="where the repositories and files go (default: $TMPDIR)")
    p.add_argument("--json", default=None)
    p.add_argument("--peak-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.peak_child:
        return peak_child(args)

    import ckpt
    from safetensors.numpy import save_file as np_save

    try:
        import torch
        from safetensors.torch import save_file as pt_save
    except ImportError:
        torch = None

    state, source = load_state(args.synthetic_mb)
    total = nbytes(state)
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckpt-stall-", dir=args.dir))
    results = {"tensors": source, "bytes": total, "runs": args.runs, "cpus": os.cpu_count(),
               "load_before": os.getloadavg()}
    try:
        repo = ckpt.Repo.init(work / "bg")
        repo.commit(state, "base")
        out = work / "files"
        out.mkdir()
        handles = []
        tstate = None
        if torch is not None:
            tstate = {f: {k: torch.from_numpy(v) for k, v in d.items()} for f, d in state.items()}

        def memcpy(i):
            return {f: {k: v.copy() for k, v in d.items()} for f, d in state.items()}

        # Into buffers allocated once and reused: no page faults, the fastest copy there is.
        reused = {f: {k: np.empty_like(v) for k, v in d.items()} for f, d in state.items()}

        def memcpy_reused(i):
            for f, d in state.items():
                for k, v in d.items():
                    np.copyto(reused[f][k], v)

        def background_stall(i):
            handles.append(repo.commit(state, f"bg {i}", background=True))

        repo_reuse = ckpt.Repo.init(work / "bg_reuse", reuse_buffers=True)
        repo_reuse.commit(state, "base")

        def background_stall_reused(i):
            handles.append(repo_reuse.commit(state, f"bg {i}", background=True))

        def background_stall_torch(i):
            handles.append(repo.commit(tstate, f"bg torch {i}", background=True))

        def st_numpy(i):
            for f, d in state.items():
                np_save(d, str(out / f))

        def st_torch(i):
            for f, d in tstate.items():
                pt_save(d, str(out / f))

        def torch_save(i):
            for f, d in tstate.items():
                torch.save(d, str(out / (f + ".pt")))

        measured = [memcpy, memcpy_reused, background_stall, background_stall_reused, st_numpy]
        if torch is not None:
            measured += [background_stall_torch, st_torch, torch_save]
        times = {f.__name__: [] for f in measured}
        # Interleaved: run i times every method once, in an order rotated by i, so that load
        # changes on this shared machine hit all of them alike. Each background commit is
        # waited for outside the timing (a training loop would overlap it with its next steps).
        for i in range(args.runs):
            for j in range(len(measured)):
                f = measured[(i + j) % len(measured)]
                nudge(state, i * len(measured) + j)
                t = time.perf_counter()
                f(i)
                times[f.__name__].append(time.perf_counter() - t)
                if handles:
                    handles.pop().wait()
        for name, ts in times.items():
            results[name] = (statistics.median(ts), ts)

        def background_whole(i):
            repo.commit(state, f"bg whole {i}", background=True).wait()

        results["background_whole"] = median_time(background_whole, args.runs, setup=lambda i: nudge(state, i))

        repo_fg = ckpt.Repo.init(work / "fg")
        repo_fg.commit(state, "base")
        results["foreground"] = median_time(lambda i: repo_fg.commit(state, f"fg {i}"), args.runs,
                                            setup=lambda i: nudge(state, i))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    child = subprocess.run([sys.executable, __file__, "--peak-child", "--synthetic-mb", str(args.synthetic_mb)]
                           + (["--dir", args.dir] if args.dir else []), capture_output=True, text=True)
    if child.returncode == 0:
        results["peak"] = json.loads(child.stdout.strip().splitlines()[-1])
    else:
        results["peak_error"] = child.stderr[-2000:]
    results["load_after"] = os.getloadavg()

    mib = total / 2**20
    print(f"tensors: {source}, {mib:.1f} MiB; medians of {args.runs}; load {results['load_before'][0]:.1f}")
    print("| what | median s | GB/s | vs memcpy |")
    print("|---|---:|---:|---:|")
    base = results["memcpy"][0]
    for key in ("memcpy", "memcpy_reused", "background_stall", "background_stall_reused", "background_stall_torch", "background_whole", "foreground",
                "st_numpy", "st_torch", "torch_save"):
        if key in results:
            t = results[key][0]
            print(f"| {key} | {t:.3f} | {total / t / 1e9:.2f} | {t / base:.2f}x |")
    if "peak" in results:
        pk = results["peak"]
        limit = pk["captured"] + (300 << 20)
        print(f"peak of a background commit: RSS +{pk['delta'] / 2**20:.0f} MiB over {pk['rss_before'] / 2**20:.0f} MiB"
              f" + captured {pk['captured'] / 2**20:.0f} MiB in memory files = {pk['total'] / 2**20:.0f} MiB "
              f"(limit captured + 300 MiB = {limit / 2**20:.0f} MiB: {'met' if pk['total'] <= limit else 'NOT met'})")
    reused = results["background_stall_reused"][0]
    print(f"with reuse_buffers: stall / memcpy into reused buffers = {reused / results['memcpy_reused'][0]:.2f}")
    stall = results["background_stall"][0]
    print(f"stall / memcpy (fresh buffers) = {stall / base:.2f}, stall / memcpy into reused buffers = "
          f"{stall / results['memcpy_reused'][0]:.2f} (target <= 1.5); stall < safetensors.numpy save_file: "
          f"{stall < results['st_numpy'][0]}" + (f", < safetensors.torch save_file: {stall < results['st_torch'][0]}"
                                                 if "st_torch" in results else ""))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
