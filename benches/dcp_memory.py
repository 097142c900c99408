"""Peak memory of each rank of a `ckpt.dcp` save and load (issue 27: a rank holds about its
shard plus at most 300 MiB). Ranks are spawned on loopback (gloo, CPU), each holding a DTensor
shard of `--mb` MiB of float32 weights in total; the save and the load run in fresh processes so
that each peak (VmHWM) is that phase's. Prints one JSON line per phase: the shard size, and per
rank the resident set before the phase (torch imported, state built) and its peak during it.

    python benches/dcp_memory.py TARGET [--world 4] [--mb 400]

TARGET: a repository path (`ckpt init` first) or a remote URL (`s3://…`, `file:///…`). Needs
torch and the ckpt package."""

import argparse
import json
import os
import socket
import sys
import tempfile


def rss_mib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def local_state(mb, world, rank, zero):
    """This rank's rows of each tensor (the whole tensors are never built: they would set the
    peak)."""
    import torch

    g = torch.Generator().manual_seed(rank)
    count, rows = 8, 1024
    cols = max(1, mb * (1 << 20) // 4 // count // rows)
    shape = (rows // world, cols)
    return {f"layer{i}.weight": torch.zeros(shape) if zero else torch.randn(shape, generator=g) for i in range(count)}


def worker(rank, world, port, target, mb, phase, out):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import ckpt.dcp

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    local = local_state(mb, world, rank, zero=phase == "load")
    sd = {k: DTensor.from_local(v, mesh, [Shard(0)]) for k, v in local.items()}
    shard = sum(v.to_local().numel() * 4 for v in sd.values()) / (1 << 20)
    # The peak from here on (Linux: "5" resets VmHWM to the current resident set).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss_mib("VmRSS")
    if phase == "save":
        dcp.save(sd, storage_writer=ckpt.dcp.Writer(target, message="memory"))
    else:
        dcp.load(sd, storage_reader=ckpt.dcp.Reader(target))
    peak = rss_mib("VmHWM")
    with open(os.path.join(out, f"{phase}{rank}.json"), "w") as f:
        json.dump({"shard_mib": round(shard, 1), "before_mib": round(before, 1), "peak_mib": round(peak, 1)}, f)
    dist.destroy_process_group()


def main():
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser()
    p.add_argument("target")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--mb", type=int, default=400)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as out:
        for phase in ("save", "load"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.spawn(worker, args=(a.world, port, a.target, a.mb, phase, out), nprocs=a.world, join=True)
            ranks = [json.load(open(os.path.join(out, f"{phase}{r}.json"))) for r in range(a.world)]
            growth = max(r["peak_mib"] - r["before_mib"] for r in ranks)
            print(json.dumps({"phase": phase, "target": a.target, "ranks": ranks, "max_growth_mib": round(growth, 1)}))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
