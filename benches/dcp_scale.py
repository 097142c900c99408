"""Issue 27 item 4: how a save through ckpt.dcp.Writer scales with the number of items, and what
it costs each rank in memory.

N ranks (gloo on CPU, spawned on loopback) each hold ITEMS float32 DTensor shards (a state dict
of ITEMS tensors sharded on dim 0, so every rank writes ITEMS items: 8 ranks x 2,000 items are
16,000 items in one save) of SHARD_MIB MiB in all. For each item count, into a new repository:
one save through stock `FileSystemWriter` to a directory on the same disk (for reference), then
two saves through `ckpt.dcp.Writer` (the first whole, the second after a training step, which
reads the previous version to pair items). Reported per save:

- `save`: the whole `dcp.save` on rank 0 (barrier to return);
- `write`: the slowest rank's `write_data` (coding and storing its own file);
- `finish`: the coordinator's `finish()` (the only part that serializes the ranks), split into
  `metadata` (DCP pickling `.metadata` and storing it) and `commit` (`Repo::commit_stored`:
  checks every file's objects and writes the version under the writer lock);
- memory (the largest over the ranks), against the rank's shard size: its peak RSS during the
  save (VmHWM, reset before the save through /proc/self/clear_refs) above its RSS just before
  it; and, sampled every 5 ms, the peak of RssAnon + RssFile + the memfds it has open (the
  Writer spools the rank's file in one; RSS counts those pages only while they are mapped)
  above the same just before the save.

    python benches/dcp_scale.py [--ranks 8] [--items 500,2000,8000] [--shard-mib 32] [--dir DIR]
    python benches/dcp_scale.py --ranks 8 --items 2000 --shard-mib 256   # memory per rank
    python benches/dcp_scale.py --commit-stored [--items ...] [--ranks 8]

`--commit-stored` times `Repo::commit_stored` alone, in one process, without DCP's planning or
the other ranks: RANKS `.distcp` files of ITEMS small items each (written by stock `dcp.save`
in one process, 4 KiB per item) are stored with `store_objects`, then listed in a version, twice
(the second save after a step, on top of the first); median of 5 calls each, on copies of the
repository state.
"""

import argparse
import json
import os
import socket
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

MIB = 1 << 20


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def memfd_bytes():
    """The memory the memfds this process has open hold (where the Writer spools a rank's file),
    each once (the Writer holds two descriptors of each): their allocated blocks, not their
    length, since the tensors the Writer stores as DCP writes them are holes."""
    sizes = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                st = os.stat(f"/proc/self/fd/{fd}")
                sizes[(st.st_dev, st.st_ino)] = st.st_blocks * 512
        except OSError:
            pass
    return sum(sizes.values())


class MemorySampler:
    """Samples, every 5 ms on a thread, what the rank holds: anonymous and file-mapped resident
    pages (RssAnon + RssFile) plus its open memfds, whose pages are shared memory that RSS counts
    only while mapped (RssShmem is left out, so a mapped memfd is not counted twice)."""

    def __init__(self):
        import threading

        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def now(self):
        return (rss_kib("RssAnon") + rss_kib("RssFile")) * 1024 + memfd_bytes()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.now())
            self.stop.wait(0.005)

    def __enter__(self):
        self.before = self.now()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, self.now())


def reset_peak():
    # Resets VmHWM to the current RSS (Linux >= 4.0).
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def state_dict(world, rank, items, shard_mib, mesh, seed):
    """`items` float32 DTensors sharded on dim 0; this rank's shards hold `shard_mib` MiB in all.
    Built from local shards (no collective per tensor)."""
    from torch.distributed.tensor import DTensor, Shard

    cols = 64
    rows = max(1, (shard_mib * MIB) // 4 // cols // items)  # rows per rank per tensor
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    sd = {}
    for i in range(items):
        local = torch.randn(rows, cols, generator=g)
        sd[f"layers.{i}.w"] = DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=torch.Size([rows * world, cols]), stride=(cols, 1)
        )
    return sd, rows * cols * 4 * items


def worker(rank, world, port, counts, shard_mib, root, queue, keep_last=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.checkpoint import filesystem as fs
    from torch.distributed.device_mesh import init_device_mesh

    import ckpt
    import ckpt.dcp

    mesh = init_device_mesh("cpu", (world,))
    timings = {}

    # DCP's own finish (pickling `.metadata` and writing it: for the Writer, into the store).
    inner_finish = fs._FileSystemWriter.finish

    def timed_finish(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return inner_finish(self, *args, **kwargs)
        finally:
            timings["metadata"] = time.perf_counter() - start

    fs._FileSystemWriter.finish = timed_finish

    def instrument(writer):
        inner_write, inner_fin = writer.write_data, writer.finish

        def write_data(plan, planner):
            start = time.perf_counter()
            fut = inner_write(plan, planner)
            fut.wait()
            timings["write"] = time.perf_counter() - start
            return fut

        def finish(metadata, results):
            start = time.perf_counter()
            inner_fin(metadata, results)
            timings["finish"] = time.perf_counter() - start

        writer.write_data, writer.finish = write_data, finish
        return writer

    rows = []
    for items in counts:
        repo = os.path.join(root, f"repo{items}")
        if rank == 0:
            ckpt.Repo.init(repo)
        dist.barrier()
        sd, shard_bytes = state_dict(world, rank, items, shard_mib, mesh, seed=1)
        for name, step in (("FileSystemWriter", 0), ("ckpt.dcp.Writer", 1), ("ckpt.dcp.Writer", 2)):
            if step == 2:
                for t in sd.values():
                    t.to_local().add_(1e-3)  # a training step: every value changes a little
            timings.clear()
            import gc

            gc.collect()
            reset_peak()
            before = rss_kib("VmRSS")
            dist.barrier()
            start = time.perf_counter()
            if name == "FileSystemWriter":
                writer = instrument(fs.FileSystemWriter(os.path.join(root, f"plain{items}")))
            else:
                writer = instrument(ckpt.dcp.Writer(repo, message=f"save {step}", keep_last=keep_last))
            with MemorySampler() as sampler:
                dcp.save(sd, storage_writer=writer)
            total = time.perf_counter() - start
            peak = rss_kib("VmHWM")
            mine = dict(
                items=items,
                writer=name,
                step=step,
                save=total,
                write=timings.get("write", 0.0),
                finish=timings.get("finish"),
                metadata=timings.get("metadata"),
                shard=shard_bytes,
                rss_before=before * 1024,
                rss_peak=peak * 1024,
                held_before=sampler.before,
                held_peak=sampler.peak,
            )
            if name != "FileSystemWriter":
                # The save's background compaction (it codes what the save stored uncoded, and
                # rewrites the previous save's blobs) is waited for, untimed, so that it never
                # runs under the next measured save, as in `dcp_save.py`.
                if rank == 0:
                    from ckpt._native import Repo as NativeRepo

                    native = NativeRepo.discover(repo)
                    waited = time.perf_counter()
                    while native.has_pending_deltas():
                        time.sleep(0.02)
                    mine["compaction"] = time.perf_counter() - waited
                dist.barrier()
            gathered = [None] * world
            dist.all_gather_object(gathered, mine)
            if rank == 0:
                rows.append(gathered)
        del sd
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def commit_stored_only(ranks, counts, root):
    import shutil
    import statistics

    import ckpt
    from ckpt._native import Repo as Native

    print(f"commit_stored alone: {ranks} rank files, median of 5 (s)")
    print("| items per file (in the version) | first version | on top of the previous |")
    print("|---|---:|---:|")
    for items in counts:
        g = torch.Generator().manual_seed(items)
        repo = os.path.join(root, f"cs{items}")
        ckpt.Repo.init(repo)
        native = Native.discover(repo)
        entries = [[], []]
        for step in range(2):
            for r in range(ranks):
                sd = {f"layers.{i}.w": torch.randn(32, 32, generator=g) for i in range(items)}
                out = os.path.join(root, f"dcp{items}_{step}_{r}")
                dcp.save(sd, checkpoint_id=out, no_dist=True)
                name = f"__{r}_0.distcp"
                os.rename(os.path.join(out, "__0_0.distcp"), os.path.join(out, name))
                entries[step].append(native.store_objects(os.path.join(out, name), name, None))
                shutil.rmtree(out)
        first, on_top = [], []
        for k in range(5):
            # A version with no parent, on a new branch each time.
            start = time.perf_counter()
            native.commit_stored(f"first{k}", None, entries[0], "timed")
            first.append(time.perf_counter() - start)
        # Versions on `main`, each on top of the other save: the second save on the first, then
        # the first on the second, and so on (every call has a parent of other content).
        tip = native.commit_stored("main", None, entries[0], "base")
        for k in range(5):
            start = time.perf_counter()
            tip = native.commit_stored("main", tip, entries[(k + 1) % 2], "timed")
            on_top.append(time.perf_counter() - start)
        print(f"| {items:,} ({items * ranks:,}) | {statistics.median(first):.4f} | {statistics.median(on_top):.4f} |")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--items", default="500,2000,8000", help="items per rank, comma-separated")
    p.add_argument("--shard-mib", type=int, default=32, help="MiB of tensors per rank")
    p.add_argument("--dir", default=None)
    p.add_argument("--json", default=None, help="also write the raw rows here")
    p.add_argument("--commit-stored", action="store_true", help="time Repo::commit_stored alone")
    p.add_argument(
        "--keep-last",
        type=int,
        default=None,
        help="Writer(keep_last=N): the coordinator prunes the branch in finish (the second save drops the first with 1)",
    )
    a = p.parse_args()
    counts = [int(x) for x in a.items.split(",")]
    if a.commit_stored:
        with tempfile.TemporaryDirectory(dir=a.dir) as root:
            commit_stored_only(a.ranks, counts, root)
        return

    with tempfile.TemporaryDirectory(dir=a.dir) as root:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(worker, args=(a.ranks, port, counts, a.shard_mib, root, queue, a.keep_last), nprocs=a.ranks)
        rows = queue.get()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)

    print(f"{a.ranks} ranks, {a.shard_mib} MiB of float32 DTensor shards per rank; times in s, memory in MiB")
    print("| items per rank (total) | writer | save | slowest write_data | finish | .metadata | commit_stored |"
          " finish / save | peak RSS above before | peak RSS + memfd above before | shard | compaction after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ranks in rows:
        r0 = ranks[0]
        write = max(r["write"] for r in ranks)
        extra = max(r["rss_peak"] - r["rss_before"] for r in ranks) / MIB
        held = max(r["held_peak"] - r["held_before"] for r in ranks) / MIB
        shard = max(r["shard"] for r in ranks) / MIB
        fin, meta = r0["finish"], r0["metadata"]
        name = r0["writer"] + (f" (save {r0['step']})" if r0["step"] else "")
        if fin is not None and meta is not None and r0["writer"] != "FileSystemWriter":
            commit = f"{fin - meta:.3f}"
        else:
            commit = "-"
        compaction = f"{r0['compaction']:.2f}" if "compaction" in r0 else "-"
        print(
            f"| {r0['items']} ({r0['items'] * len(ranks)}) | {name} | {r0['save']:.2f} | {write:.2f} | "
            f"{fin if fin is not None else float('nan'):.3f} | {meta if meta is not None else float('nan'):.3f} | "
            f"{commit} | {(fin or 0) / r0['save']:.1%} | {extra:.0f} | {held:.0f} | {shard:.0f} | {compaction} |"
        )


if __name__ == "__main__":
    main()
