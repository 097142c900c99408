"""Save and load time of one DCP checkpoint through ckpt.dcp.Writer / ckpt.dcp.Reader (a
repository) against stock FileSystemWriter / FileSystemReader (a directory on the same disk):
same ranks (gloo on CPU, spawned on loopback), same DTensor state dict, interleaved, median of
N saves and N loads each (each load reads the save just made, into zeroed DTensors, and is
checked against the saved values).

    python benches/dcp_save.py [--ranks 4] [--mib 256] [--repeat 3] [--dir DIR]
    python benches/dcp_save.py --profile OUT   # also cProfile rank 0's last Writer save and
                                               # Reader load: OUT.save.prof, OUT.load.prof
"""

import argparse
import os
import shutil
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def worker(rank, world, port, mib, repeat, root, profile, queue):
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
    times = {"FileSystemWriter": [], "ckpt.dcp.Writer": [], "FileSystemReader": [], "ckpt.dcp.Reader": []}
    zeroed = {k: distribute_tensor(torch.zeros(t.shape), mesh, [Shard(0)]) for k, t in sd.items()}
    repo = os.path.join(root, "repo")
    for r in range(repeat):
        # A training step between saves: every value changes a little.
        for t in sd.values():
            t.to_local().add_(1e-3)
        for name in ("FileSystemWriter", "ckpt.dcp.Writer", "FileSystemReader", "ckpt.dcp.Reader"):
            profiler = None
            if profile and rank == 0 and r == repeat - 1 and name.startswith("ckpt"):
                import cProfile

                profiler = cProfile.Profile()
            for t in zeroed.values():
                t.to_local().zero_()
            dist.barrier()
            start = time.perf_counter()
            if profiler:
                profiler.enable()
            if name == "FileSystemWriter":
                dcp.save(sd, checkpoint_id=os.path.join(root, f"plain{r}"))
            elif name == "ckpt.dcp.Writer":
                dcp.save(sd, storage_writer=ckpt.dcp.Writer(repo, message=f"save {r}"))
            elif name == "FileSystemReader":
                dcp.load(zeroed, checkpoint_id=os.path.join(root, f"plain{r}"))
            else:
                dcp.load(zeroed, storage_reader=ckpt.dcp.Reader(repo))
            if profiler:
                profiler.disable()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
            if profiler:
                profiler.dump_stats(f"{profile}.{'save' if 'Writer' in name else 'load'}.prof")
            if "Reader" in name:
                assert all(torch.equal(zeroed[k].to_local(), sd[k].to_local()) for k in sd), name
        if r + 1 < repeat:
            # Each plain save in its own directory, as each Writer save is a new version; only
            # the last is kept (disk).
            if rank == 0:
                shutil.rmtree(os.path.join(root, f"plain{r}"))
    if rank == 0:
        queue.put(times)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=None)
    p.add_argument("--profile", default=None, help="cProfile rank 0's last Writer save and Reader load")
    a = p.parse_args()
    import ckpt

    with tempfile.TemporaryDirectory(dir=a.dir) as root:
        ckpt.Repo.init(os.path.join(root, "repo"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(a.ranks, port, a.mib, a.repeat, root, a.profile, queue), nprocs=a.ranks)
        times = queue.get()
    print(f"{a.ranks} ranks, {a.mib} MiB of float32 DTensor shards, median of {a.repeat}:")
    for name, t in times.items():
        print(f"  {name:18} {statistics.median(t):7.2f} s  ({', '.join(f'{x:.2f}' for x in t)})")
    for ours, stock in (("ckpt.dcp.Writer", "FileSystemWriter"), ("ckpt.dcp.Reader", "FileSystemReader")):
        print(f"  {ours} / {stock}: {statistics.median(times[ours]) / statistics.median(times[stock]):.2f}x")


if __name__ == "__main__":
    main()
