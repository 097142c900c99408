"""Issue 27: what a change of rank count costs the store (cells, `dcp::cell_rows`).

A state of TENSORS float32 (or bf16) tensors of ROWS x COLS is trained a little between saves
(each weight moves by about 1e-3 of itself, as late fine-tuning does) and saved through
`ckpt.dcp.Writer` once per epoch, DTensor `Shard(0)` on a sequence of rank counts (gloo on CPU,
ranks spawned on loopback). Each save's compaction is waited for, so the store holds the newest
save whole and older ones as reverse deltas. Printed: the store's size after each save, for the
resharding sequence and for the same epochs at a constant rank count, and their ratio.

    $CKPT_CORPUS/venv/bin/python benches/dcp_reshard.py [--ranks 4,2,8,4] [--tensors 4] [--rows 2048 --cols 2048]
"""

import argparse
import os
import socket
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

import ckpt
import ckpt.dcp
from ckpt._native import Repo as NativeRepo


def state(epoch, args):
    g = torch.Generator().manual_seed(1)
    out = {}
    for i in range(args.tensors):
        w = torch.randn(args.rows, args.cols, generator=g) * 0.02
        for e in range(epoch):
            step = torch.Generator().manual_seed(100 * e + i)
            w = w * (1 + 1e-3 * torch.randn(args.rows, args.cols, generator=step))
        out[f"layer{i}.weight"] = w.to(getattr(torch, args.dtype))
    return out


def worker(rank, world, port, repo, epoch, args):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    sd = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in state(epoch, args).items()}
    dcp.save(sd, storage_writer=ckpt.dcp.Writer(repo, message=f"epoch {epoch} on {world} ranks"))
    dist.destroy_process_group()


def port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def store_bytes(repo):
    total = 0
    for root, _, files in os.walk(os.path.join(repo, ".ckpt", "objects")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def series(repo, worlds, args):
    ckpt.Repo.init(repo)
    sizes = []
    for epoch, world in enumerate(worlds):
        mp.spawn(worker, args=(world, port(), repo, epoch, args), nprocs=world, join=True)
        native = NativeRepo.discover(repo)
        while native.has_pending_deltas():
            time.sleep(0.01)
        sizes.append(store_bytes(repo))
    return sizes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="4,2,8,4")
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    worlds = [int(r) for r in args.ranks.split(",")]
    raw = args.tensors * args.rows * args.cols * getattr(torch, args.dtype).itemsize
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        resharded = series(os.path.join(tmp, "resharded"), worlds, args)
        constant = series(os.path.join(tmp, "constant"), [worlds[0]] * len(worlds), args)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# {args.tensors} x {args.rows}x{args.cols} {args.dtype} ({raw / 1e6:.1f} MB a save), ranks {worlds}, {commit}")
    print("| save | ranks | store, resharded (MB) | store, constant ranks (MB) | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for i, (w, a, b) in enumerate(zip(worlds, resharded, constant)):
        print(f"| {i} | {w} | {a / 1e6:.2f} | {b / 1e6:.2f} | {a / b:.3f} |")


if __name__ == "__main__":
    main()
