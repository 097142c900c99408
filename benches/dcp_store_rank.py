"""One rank's store path of a `ckpt.dcp.Writer` save, alone, for profiling and A/B runs of CPU
per byte: a `.distcp` file written by stock `dcp.save` in one process (ITEMS float32 `randn`
tensors, MIB MiB in all), copied into a memfd as the Writer spools it, and stored with
`Repo.store_objects` (the Writer's call) into a fresh repository, RUNS times. Prints the median
CPU time (user + system of the process, all threads) and wall time of the call.

    python benches/dcp_store_rank.py DIR [--runs 11] [--mib 64] [--items 16]
    perf record -g -D 5000 python benches/dcp_store_rank.py DIR --runs 30   # skip torch's import

A/B of two builds: unzip each wheel into its own directory and run with `PYTHONPATH=` that
directory (it comes before site-packages), alternating.
"""

import argparse
import os
import resource
import shutil
import statistics
import time


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir", help="scratch directory (the .distcp file is kept there between runs)")
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--items", type=int, default=16)
    a = p.parse_args()
    import torch
    import torch.distributed.checkpoint as dcp

    from ckpt._native import Repo

    src = os.path.join(a.dir, f"dcp_{a.mib}mib_{a.items}")
    if not os.path.exists(os.path.join(src, "__0_0.distcp")):
        g = torch.Generator().manual_seed(0)
        rows = (a.mib << 20) // 4 // a.items // 1024
        sd = {f"layer{i}.w": torch.randn(rows, 1024, generator=g) for i in range(a.items)}
        dcp.save(sd, checkpoint_id=src, no_dist=True)
    with open(os.path.join(src, "__0_0.distcp"), "rb") as f:
        data = f.read()
    wall, cpu = [], []
    for i in range(a.runs):
        repo = os.path.join(a.dir, "repo")
        shutil.rmtree(repo, ignore_errors=True)
        r = Repo.init(repo)
        fd = os.memfd_create("rank", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            start, start_cpu = time.perf_counter(), cpu_seconds()
            r.store_objects(f"/proc/self/fd/{fd}", "__0_0.distcp", None)
            wall.append(time.perf_counter() - start)
            cpu.append(cpu_seconds() - start_cpu)
        finally:
            os.close(fd)
    shutil.rmtree(os.path.join(a.dir, "repo"), ignore_errors=True)
    print(
        f"store_objects of {len(data) / 2**20:.1f} MiB, median of {a.runs}: cpu {statistics.median(cpu) * 1000:.1f} ms, "
        f"wall {statistics.median(wall) * 1000:.1f} ms ({', '.join(f'{x * 1000:.0f}' for x in wall)})"
    )


if __name__ == "__main__":
    main()
