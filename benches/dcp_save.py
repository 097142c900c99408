"""Save time of one DCP checkpoint through ckpt.dcp.Writer (into a repository) against stock
FileSystemWriter (to a directory on the same disk): same ranks (gloo on CPU, spawned on
loopback), same DTensor state dict, median of N saves each.

    python benches/dcp_save.py [--ranks 4] [--mib 256] [--repeat 3] [--dir DIR]
"""

import argparse
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def worker(rank, world, port, mib, repeat, root, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ckpt.dcp

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    n = 16  # tensors; rows divisible by every rank count used
    rows = (mib << 20) // 4 // n // 1024
    sd = {f"layer{i}.w": distribute_tensor(torch.randn(rows, 1024, generator=g), mesh, [Shard(0)]) for i in range(n)}
    times = {"FileSystemWriter": [], "ckpt.dcp.Writer": []}
    for r in range(repeat):
        for name in times:
            # A training step between saves: every value changes a little.
            for t in sd.values():
                t.to_local().add_(1e-3)
            dist.barrier()
            start = time.perf_counter()
            if name == "FileSystemWriter":
                dcp.save(sd, checkpoint_id=os.path.join(root, f"plain{r}"))
            else:
                dcp.save(sd, storage_writer=ckpt.dcp.Writer(os.path.join(root, "repo"), message=f"save {r}"))
            dist.barrier()
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        queue.put(times)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=None)
    a = p.parse_args()
    import ckpt

    with tempfile.TemporaryDirectory(dir=a.dir) as root:
        ckpt.Repo.init(os.path.join(root, "repo"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(a.ranks, port, a.mib, a.repeat, root, queue), nprocs=a.ranks)
        times = queue.get()
    print(f"{a.ranks} ranks, {a.mib} MiB of float32 DTensor shards, median of {a.repeat}:")
    for name, t in times.items():
        print(f"  {name:18} {statistics.median(t):7.2f} s  ({', '.join(f'{x:.2f}' for x in t)})")


if __name__ == "__main__":
    main()
