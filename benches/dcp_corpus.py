"""Issue 27's size target: the corpus training series saved through torch.distributed.checkpoint
by 4 ranks, stored three ways, each into a fresh repository:

  (a) stock `dcp.save` with `FileSystemWriter` to a directory of the working tree, then
      `ckpt commit` of that directory (`.metadata` and the `__R_0.distcp` files);
  (b) `dcp.save(storage_writer=ckpt.dcp.Writer(repo))`, then `ckpt compact` (a Writer save
      under the default `reverse` policy stores its files whole and leaves the previous
      version's deltas to a compaction, as a `ckpt commit` does in the background);
  (c) reference: the same tensors as safetensors files, `ckpt commit` of the corpus files
      (`model.safetensors`, and `optim.safetensors` in the epochs that have AdamW state; it is
      `ckpt rm`-ed in the others, so each version holds the tensors of that save only).

Ranks: gloo on CPU, spawned on loopback; each tensor is a DTensor on `init_device_mesh("cpu",
(RANKS,))`, `Shard(0)` where RANKS divides dim 0, else `Replicate()` (DCP saves a replicated
tensor once). The state dict of a save is {"model": epoch K's weights, "optim": AdamW moments of
epoch K} (`optim` only in the epochs the corpus has it: 01, 02, 09, 10). Commits run with
`CKPT_COMPACT=inline` so every size is final when read.

Store size: the bytes of the files under `.ckpt/objects` (apparent sizes; the store's content:
blobs, manifests, versions), after each epoch. Verified bit-exact: every version of (b) loaded
through `ckpt.dcp.Reader` on the same ranks; the `--verify` epochs of (a) checked out and loaded
by stock `dcp.load`; those of (c) checked out and compared byte for byte with the corpus files.

    python benches/dcp_corpus.py [--corpus ~/.cache/ckpt-corpus] [--ranks 4] [--dir DIR]
        [--epochs 0-10] [--verify 0,2,10] [--json OUT] [--keep]

CKPT_BIN: the ckpt CLI (default `ckpt` on PATH). Needs torch, safetensors and the ckpt package.
"""

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

CKPT = os.environ.get("CKPT_BIN", "ckpt")
WAYS = ("a", "b", "c")
LABEL = {
    "a": "stock DCP + ckpt commit",
    "b": "ckpt.dcp.Writer (+ ckpt compact)",
    "c": "safetensors + ckpt commit",
}


def cli(repo, *args, check=True):
    env = dict(os.environ, CKPT_COMPACT="inline")
    r = subprocess.run([CKPT, "-C", repo, *args], capture_output=True, text=True, env=env)
    if check and r.returncode != 0:
        raise RuntimeError(f"ckpt {' '.join(args)} in {repo}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def store_bytes(repo):
    total = 0
    for d, _, files in os.walk(os.path.join(repo, ".ckpt", "objects")):
        for f in files:
            try:
                total += os.lstat(os.path.join(d, f)).st_size
            except FileNotFoundError:
                pass
    return total


def breakdown(repo, tag):
    """Where version `tag`'s bytes are (`ckpt show --json`): per kind of segment (tensor,
    other: framing, headers, pickles, `.metadata`) and form (base, delta, duplicate), the count,
    raw bytes and stored bytes (each segment's blob at its size now)."""
    show = json.loads(cli(repo, "show", tag, "--json"))
    out = {}
    for f in show["files"]:
        for seg in f["segments"]:
            key = f"{'tensor' if seg['is_tensor'] else 'other'} {seg['storage'].lower()}"
            o = out.setdefault(key, {"n": 0, "raw": 0, "stored": 0})
            o["n"] += 1
            o["raw"] += seg["raw_bytes"]
            o["stored"] += seg["stored_bytes"]
    return out


def corpus_files(corpus, epoch):
    model = os.path.join(corpus, "series", "fp32", f"epoch_{epoch:02d}.safetensors")
    optim = os.path.join(corpus, "series", "optim", f"adamw_epoch_{epoch:02d}.safetensors")
    return model, (optim if os.path.exists(optim) else None)


def full_state(corpus, epoch):
    from safetensors.torch import load_file

    model, optim = corpus_files(corpus, epoch)
    sd = {"model": load_file(model)}
    if optim:
        sd["optim"] = load_file(optim)
    return sd


def distribute(sd, mesh, world):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def one(t):
        place = Shard(0) if t.dim() > 0 and t.shape[0] % world == 0 else Replicate()
        return distribute_tensor(t, mesh, [place])

    return {g: {k: one(t) for k, t in d.items()} for g, d in sd.items()}


def zeroed(sd):
    from torch.distributed.tensor import DTensor

    out = {}
    for g, d in sd.items():
        out[g] = {}
        for k, t in d.items():
            z = DTensor.from_local(torch.zeros_like(t.to_local()), t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride())
            out[g][k] = z
    return out


def equal(a, b):
    return all(torch.equal(a[g][k].to_local(), b[g][k].to_local()) and a[g][k].to_local().dtype == b[g][k].to_local().dtype for g in b for k in b[g])


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def worker(rank, world, port, corpus, epochs, verify, root, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh

    import ckpt.dcp

    mesh = init_device_mesh("cpu", (world,))
    repo = {w: os.path.join(root, w) for w in WAYS}
    plain = os.path.join(repo["a"], "ck")
    rows = []
    optim_tracked = False  # whether repository c's HEAD lists optim.safetensors
    for epoch in epochs:
        sd = distribute(full_state(corpus, epoch), mesh, world)
        row = {"epoch": epoch, "optim": "optim" in sd}
        tag = f"e{epoch:02d}"

        # (a) stock DCP to a directory of repo a's working tree, then `ckpt commit` of it.
        if rank == 0:
            shutil.rmtree(plain, ignore_errors=True)
        dist.barrier()
        start = time.perf_counter()
        dcp.save(sd, checkpoint_id=plain)
        dist.barrier()
        row["a_save_s"] = time.perf_counter() - start
        if rank == 0:
            names = sorted(os.listdir(plain))
            row["a_commit_s"] = timed(lambda: cli(repo["a"], "commit", "-m", tag, *[os.path.join("ck", n) for n in names]))
            cli(repo["a"], "tag", tag)
        dist.barrier()

        # (b) ckpt.dcp.Writer straight into repo b, then `ckpt compact`.
        start = time.perf_counter()
        dcp.save(sd, storage_writer=ckpt.dcp.Writer(repo["b"], message=tag, tags=(tag,)))
        dist.barrier()
        row["b_save_s"] = time.perf_counter() - start
        if rank == 0:
            row["b_compact_s"] = timed(lambda: cli(repo["b"], "compact"))

            # (c) the corpus files themselves (symbolic links: committed as the bytes they lead to).
            model, optim = corpus_files(corpus, epoch)
            named = ["model.safetensors"]
            for name, src in (("model.safetensors", model), ("optim.safetensors", optim)):
                link = os.path.join(repo["c"], name)
                if os.path.lexists(link):
                    os.unlink(link)
                if src:
                    os.symlink(src, link)
            if optim:
                named.append("optim.safetensors")
            elif optim_tracked:
                cli(repo["c"], "rm", "optim.safetensors")
            optim_tracked = bool(optim)
            row["c_commit_s"] = timed(lambda: cli(repo["c"], "commit", "-m", tag, *named))
            cli(repo["c"], "tag", tag)
            raw = os.path.getsize(model) + (os.path.getsize(optim) if optim else 0)
            row["raw_tensor_files"] = raw
            for w in WAYS:
                row[f"{w}_store"] = store_bytes(repo[w])
            row["a_raw_dcp"] = sum(os.path.getsize(os.path.join(plain, n)) for n in os.listdir(plain))
            rows.append(row)
            print(
                f"epoch {epoch:02d}: store a {row['a_store'] / 1e6:.1f} MB, b {row['b_store'] / 1e6:.1f} MB, "
                f"c {row['c_store'] / 1e6:.1f} MB; a/c {row['a_store'] / row['c_store']:.4f}, "
                f"b/c {row['b_store'] / row['c_store']:.4f}",
                flush=True,
            )
        dist.barrier()
        del sd

    # Verification: every Writer version through the Reader; the --verify epochs of (a) checked
    # out and loaded by stock dcp.load; of (c) checked out and compared with the corpus files.
    checked = {"b": [], "a": [], "c": []}
    for epoch in epochs:
        expect = distribute(full_state(corpus, epoch), mesh, world)
        tag = f"e{epoch:02d}"
        got = zeroed(expect)
        dcp.load(got, storage_reader=ckpt.dcp.Reader(repo["b"], rev=tag))
        assert equal(got, expect), f"(b) {tag} differs"
        checked["b"].append(epoch)
        if epoch in verify:
            out = os.path.join(root, "verify")
            if rank == 0:
                shutil.rmtree(out, ignore_errors=True)
                cli(repo["a"], "checkout", tag, "--output", out)
            dist.barrier()
            got = zeroed(expect)
            dcp.load(got, checkpoint_id=os.path.join(out, "ck"))
            assert equal(got, expect), f"(a) {tag} differs"
            dist.barrier()
            if rank == 0:
                shutil.rmtree(out)
                cli(repo["c"], "checkout", tag, "--output", out)
                for name, src in zip(("model.safetensors", "optim.safetensors"), corpus_files(corpus, epoch)):
                    if src:
                        with open(os.path.join(out, name), "rb") as f, open(src, "rb") as g:
                            assert hashlib.file_digest(f, "sha256").digest() == hashlib.file_digest(g, "sha256").digest(), f"(c) {tag} {name}"
                shutil.rmtree(out)
                checked["a"].append(epoch)
                checked["c"].append(epoch)
            dist.barrier()
        del expect, got
    if rank == 0:
        queue.put({"rows": rows, "verified": checked})
    dist.destroy_process_group()


def epochs_arg(s):
    if "-" in s and "," not in s:
        lo, hi = s.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(x) for x in s.split(",") if x]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--corpus", default=os.environ.get("CKPT_CORPUS", os.path.expanduser("~/.cache/ckpt-corpus")))
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--epochs", default="0-10")
    p.add_argument("--verify", default="0,2,10", help="epochs of (a) and (c) checked out and compared")
    p.add_argument("--dir", default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--keep", action="store_true", help="keep the three repositories (printed)")
    a = p.parse_args()
    epochs = epochs_arg(a.epochs)
    verify = set(epochs_arg(a.verify))

    root = tempfile.mkdtemp(prefix="dcp-corpus-", dir=a.dir)
    try:
        for w in WAYS:
            subprocess.run([CKPT, "init", os.path.join(root, w)], check=True, capture_output=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(a.ranks, port, a.corpus, epochs, verify, root, queue), nprocs=a.ranks)
        result = queue.get()
        rows = result["rows"]
        result["stored_now"] = {}
        for w in WAYS:
            log = json.loads(cli(os.path.join(root, w), "log", "--json"))
            result["stored_now"][w] = sum(v.get("stored_now_bytes", 0) for v in log)
        result["breakdown"] = {
            w: {f"e{e:02d}": breakdown(os.path.join(root, w), f"e{e:02d}") for e in epochs} for w in WAYS
        }
        if a.keep:
            result["repos"] = {w: os.path.join(root, w) for w in WAYS}
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)

    last = rows[-1]
    print(f"\n{a.ranks} ranks, epochs {epochs[0]:02d}-{epochs[-1]:02d}; store = bytes under .ckpt/objects")
    print("| after epoch | optim | raw tensors (MB) | (a) stock DCP + commit (MB) | (b) Writer (MB) | (c) safetensors (MB) | a/c | b/c |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    raw = 0
    for r in rows:
        raw += r["raw_tensor_files"]
        print(
            f"| {r['epoch']:02d} | {'yes' if r['optim'] else '-'} | {raw / 1e6:.1f} | {r['a_store'] / 1e6:.2f} | "
            f"{r['b_store'] / 1e6:.2f} | {r['c_store'] / 1e6:.2f} | {r['a_store'] / r['c_store']:.4f} | {r['b_store'] / r['c_store']:.4f} |"
        )
    print("stored_now_bytes summed over `ckpt log --json`: " + ", ".join(f"{w} {result['stored_now'][w] / 1e6:.2f} MB" for w in WAYS))
    for k in ("a_save_s", "a_commit_s", "b_save_s", "b_compact_s", "c_commit_s"):
        xs = [r[k] for r in rows]
        print(f"  {k:12} median {statistics.median(xs):6.2f} s (min {min(xs):.2f}, max {max(xs):.2f})")
    print("\nper version (`ckpt show --json`): kind form: segments, raw MB -> stored MB")
    for e in epochs:
        for w in WAYS:
            parts = [
                f"{k}: {v['n']}, {v['raw'] / 1e6:.2f} -> {v['stored'] / 1e6:.2f}"
                for k, v in sorted(result["breakdown"][w][f"e{e:02d}"].items())
            ]
            print(f"  e{e:02d} ({w}) " + "; ".join(parts))
    print(f"verified bit-exact: {result['verified']}")
    print(f"targets (<= 1.05x): a/c {last['a_store'] / last['c_store']:.4f}, b/c {last['b_store'] / last['c_store']:.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
