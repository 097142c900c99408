"""Save and load time of one DCP checkpoint through ckpt.dcp.Writer / ckpt.dcp.Reader (a
repository) against stock FileSystemWriter / FileSystemReader (a directory on the same disk):
same ranks (gloo on CPU, spawned on loopback), same DTensor state dict, interleaved, median of
N saves and N loads each (each load reads the save just made, into zeroed DTensors, and is
checked against the saved values). After each Writer save the bench waits, untimed, for the
compaction the save started in the background (it codes the tensors the save stored uncoded
and rewrites the previous save's as deltas), so it never runs under the next measured step;
the time from the save's start until it is done is printed as `Writer save + compaction`.

    python benches/dcp_save.py [--ranks 4] [--mib 256] [--repeat 3] [--dir DIR] [--no-read-ahead-too]
    python benches/dcp_save.py --profile OUT   # also cProfile rank 0's last Writer save and
                                               # Reader load: OUT.save.prof, OUT.load.prof
    python benches/dcp_save.py --s3 [--layout mirror|deltas] [--cache kept|temporary|dir] [--ranks 4] [--mib 256] [--repeat 3] [--dir DIR]

`--s3`: the same against an S3 server on loopback (`s3s-fs`, from PATH or `S3S_FS`, with its
root under DIR): DCP's fsspec writer (`FsspecWriter`, `s3fs`) to `s3://bench/plainR`, against
`ckpt.dcp.Writer("s3://bench/ckptR", endpoint=..., allow_http=True, layout=LAYOUT)` (default
`mirror`, as `ckpt remote add`). Each round, interleaved: a training step; an fsspec save;
the Writer's first save into a new prefix (everything new); a step; an fsspec save; the Writer's
second save into the same prefix (each rank pairs with its file of the first save; `mirror`: the
new tensors uploaded whole and the first save's recoded on the remote as deltas against them,
after `dcp.save` returns, on a thread of each rank: the bench waits for them, untimed, and
prints the time until they are done as `Writer save N + recodes`; `deltas`: the new tensors
uploaded as deltas against the first save's); then
`FsspecReader` and `ckpt.dcp.Reader` loads of the second save, checked. fsspec saves write
whole files every time, so both Writer saves are compared with the same round's fsspec saves.
`--cache`: the ranks' caches: `kept` (default options: each rank's kept cache, with
`CKPT_CACHE_DIR` pointed under DIR; the second save finds the first's objects there, and the
Reader its own rank's file), `temporary` (`cache=False`: a temporary cache per save and load,
which downloads what it pairs), `dir` (`cache=` a directory per rank and round, kept from the
first save to the second and the load, never pruned). Each Writer save's traffic (rank 0:
downloads, uploads, recodes, requests; `Writer.traffic`) is printed after the times.

`--no-read-ahead-too`: also load through the Reader with its read-ahead off
(`ckpt.dcp.READ_AHEAD_ITEMS = 0`: each item decoded when DCP asks for it), in the same rounds.
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


BUCKET = "bench"
ACCESS_KEY, SECRET_KEY = "ckptbench", "ckptbench-secret"


def s3fs_options(endpoint):
    return {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}


def s3_worker(rank, world, port, mib, repeat, root, endpoint, layout, cache, queue):
    """`cache`: `"kept"`, `"temporary"` or a directory (`--cache dir`)."""
    """The `--s3` rounds (see the module docstring); `root` is the server's root directory."""
    import warnings

    # DCP warns on every save into a prefix that holds one (the fsspec saves overwrite theirs).
    warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ckpt.dcp

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    n = 16
    rows = (mib << 20) // 4 // n // 1024
    sd = {f"layer{i}.w": distribute_tensor(torch.randn(rows, 1024, generator=g), mesh, [Shard(0)]) for i in range(n)}
    zeroed = {k: distribute_tensor(torch.zeros(t.shape), mesh, [Shard(0)]) for k, t in sd.items()}
    names = ("fsspec save", "Writer save 1", "fsspec save 2", "Writer save 2", "FsspecReader", "ckpt.dcp.Reader")
    times = {name: [] for name in names}
    # From a Writer save's start until the recodes it leaves running (mirror) are done on every rank.
    times.update({f"{name} + recodes": [] for name in names if name.startswith("Writer")})
    traffic = {name: [] for name in names if name.startswith("Writer")}
    s3 = {"endpoint": endpoint, "allow_http": True, "region": "us-east-1"}
    writer_options = dict(s3, layout=layout)
    reader_options = dict(s3)
    if cache == "temporary":
        writer_options["cache"] = reader_options["cache"] = False
    for r in range(repeat):
        plain, ours = f"s3://{BUCKET}/plain{r}", f"s3://{BUCKET}/ckpt{r}"
        if cache not in ("kept", "temporary"):
            # One cache per rank and prefix, kept from the first save to the second and the load.
            writer_options["cache"] = reader_options["cache"] = os.path.join(cache, f"rank{rank}", f"ckpt{r}")
        for name in names:
            if name in ("fsspec save", "fsspec save 2"):
                # A training step before each pair of saves: every value changes a little.
                for t in sd.values():
                    t.to_local().add_(1e-3)
            for t in zeroed.values():
                t.to_local().zero_()
            dist.barrier()
            start = time.perf_counter()
            if name.startswith("fsspec save"):
                dcp.save(sd, storage_writer=FsspecWriter(plain, sync_files=False, **s3fs_options(endpoint)))
            elif name.startswith("Writer save"):
                writer = ckpt.dcp.Writer(ours, message=f"{name} {r}", **writer_options)
                dcp.save(sd, storage_writer=writer)
            elif name == "FsspecReader":
                dcp.load(zeroed, storage_reader=FsspecReader(plain, **s3fs_options(endpoint)))
            else:
                dcp.load(zeroed, storage_reader=ckpt.dcp.Reader(ours, **reader_options))
            dist.barrier()
            times[name].append(time.perf_counter() - start)
            if name in traffic:
                # The mirror layout's recodes go on after `dcp.save` returns: waited for here,
                # outside the save's time, so that they never overlap the next measured step.
                ckpt.dcp._wait_for_recodes()
                dist.barrier()
                times[f"{name} + recodes"].append(time.perf_counter() - start)
                traffic[name].append(dict(writer.traffic))
            if "Reader" in name:
                assert all(torch.equal(zeroed[k].to_local(), sd[k].to_local()) for k in sd), name
        dist.barrier()
        if rank == 0:
            # The server keeps objects as files under its root: this round's go (disk).
            for prefix in (f"plain{r}", f"ckpt{r}"):
                shutil.rmtree(os.path.join(root, BUCKET, prefix), ignore_errors=True)
        if cache not in ("kept", "temporary"):
            shutil.rmtree(os.path.join(cache, f"rank{rank}"), ignore_errors=True)
        dist.barrier()
    if rank == 0:
        queue.put((times, traffic))
    dist.destroy_process_group()


def start_s3s(root):
    """`s3s-fs` on a free loopback port serving `root` (bucket `bench` made); returns (process,
    endpoint)."""
    import subprocess

    server = os.environ.get("S3S_FS") or shutil.which("s3s-fs") or "/root/.cargo/bin/s3s-fs"
    os.makedirs(os.path.join(root, BUCKET), exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [server, "--host", "127.0.0.1", "--port", str(port), "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, root],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    end = time.time() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.time() > end or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("s3s-fs did not start")
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


def worker(rank, world, port, mib, repeat, root, profile, queue, no_read_ahead_too=False):
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
    from ckpt._native import Repo as NativeRepo

    names = ["FileSystemWriter", "ckpt.dcp.Writer", "FileSystemReader", "ckpt.dcp.Reader"]
    if no_read_ahead_too:
        names.append("Reader, no read-ahead")
    times = {name: [] for name in names}
    times["Writer save + compaction"] = []
    zeroed = {k: distribute_tensor(torch.zeros(t.shape), mesh, [Shard(0)]) for k, t in sd.items()}
    repo = os.path.join(root, "repo")
    for r in range(repeat):
        # A training step between saves: every value changes a little.
        for t in sd.values():
            t.to_local().add_(1e-3)
        for name in names:
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
            elif name == "ckpt.dcp.Reader":
                dcp.load(zeroed, storage_reader=ckpt.dcp.Reader(repo))
            else:
                ahead, ckpt.dcp.READ_AHEAD_ITEMS = ckpt.dcp.READ_AHEAD_ITEMS, 0
                try:
                    dcp.load(zeroed, storage_reader=ckpt.dcp.Reader(repo))
                finally:
                    ckpt.dcp.READ_AHEAD_ITEMS = ahead
            if profiler:
                profiler.disable()
            dist.barrier()
            times[name].append(time.perf_counter() - start)
            if name == "ckpt.dcp.Writer":
                # The save's compaction (a niced background process: the tensors the save stored
                # uncoded are coded, the previous save's rewritten as deltas) is waited for,
                # untimed, so it never runs under the next measured step; the time until it is
                # done is reported on its own.
                if rank == 0:
                    native = NativeRepo.discover(repo)
                    while native.has_pending_deltas():
                        time.sleep(0.005)
                    times["Writer save + compaction"].append(time.perf_counter() - start)
                dist.barrier()
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
    p.add_argument("--no-read-ahead-too", action="store_true", help="also load with the Reader's read-ahead off")
    p.add_argument("--s3", action="store_true", help="against DCP's fsspec writer (s3fs) on an s3s-fs server")
    p.add_argument("--layout", default="mirror", choices=("mirror", "deltas"), help="the Writer's remote layout (--s3)")
    p.add_argument(
        "--cache",
        default="kept",
        choices=("kept", "temporary", "dir"),
        help="--s3: the ranks' caches: kept (the default options), temporary (cache=False), dir (cache=DIR)",
    )
    a = p.parse_args()
    if a.s3:
        return main_s3(a)
    import ckpt

    with tempfile.TemporaryDirectory(dir=a.dir) as root:
        ckpt.Repo.init(os.path.join(root, "repo"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        queue = mp.get_context("spawn").SimpleQueue()
        args = (a.ranks, port, a.mib, a.repeat, root, a.profile, queue, a.no_read_ahead_too)
        mp.spawn(worker, args=args, nprocs=a.ranks)
        times = queue.get()
    print(f"{a.ranks} ranks, {a.mib} MiB of float32 DTensor shards, median of {a.repeat}:")
    for name, t in times.items():
        print(f"  {name:18} {statistics.median(t):7.2f} s  ({', '.join(f'{x:.2f}' for x in t)})")
    pairs = [
        ("ckpt.dcp.Writer", "FileSystemWriter"),
        ("Writer save + compaction", "FileSystemWriter"),
        ("ckpt.dcp.Reader", "FileSystemReader"),
    ]
    if a.no_read_ahead_too:
        pairs.append(("Reader, no read-ahead", "FileSystemReader"))
    for ours, stock in pairs:
        print(f"  {ours} / {stock}: {statistics.median(times[ours]) / statistics.median(times[stock]):.2f}x")


def main_s3(a):
    with tempfile.TemporaryDirectory(dir=a.dir) as root:
        server, endpoint = start_s3s(os.path.join(root, "s3"))
        # The Writer and Reader take credentials from the environment, which the ranks inherit;
        # the kept caches go under the bench's directory, not ~/.cache.
        os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_REGION="us-east-1")
        os.environ["CKPT_CACHE_DIR"] = os.path.join(root, "kept")
        cache = os.path.join(root, "cache") if a.cache == "dir" else a.cache
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            queue = mp.get_context("spawn").SimpleQueue()
            mp.spawn(s3_worker, args=(a.ranks, port, a.mib, a.repeat, os.path.join(root, "s3"), endpoint, a.layout, cache, queue), nprocs=a.ranks)
            times, traffic = queue.get()
        finally:
            server.kill()
            server.wait()
    print(f"{a.ranks} ranks, {a.mib} MiB of float32 DTensor shards, s3s-fs on loopback, layout {a.layout}, {a.cache} caches, median of {a.repeat}:")
    for name, t in times.items():
        print(f"  {name:18} {statistics.median(t):7.2f} s  ({', '.join(f'{x:.2f}' for x in t)})")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"  Writer save 1 / fsspec save:   {med['Writer save 1'] / med['fsspec save']:.2f}x")
    print(f"  Writer save 2 / fsspec save 2: {med['Writer save 2'] / med['fsspec save 2']:.2f}x")
    print(f"  (Writer save 2 + its recodes) / fsspec save 2: {med['Writer save 2 + recodes'] / med['fsspec save 2']:.2f}x")
    print(f"  ckpt.dcp.Reader / FsspecReader: {med['ckpt.dcp.Reader'] / med['FsspecReader']:.2f}x")
    # Per round (same conditions within a round), for the spread.
    for ours, stock in (("Writer save 1", "fsspec save"), ("Writer save 2", "fsspec save 2"), ("ckpt.dcp.Reader", "FsspecReader")):
        per = [o / s for o, s in zip(times[ours], times[stock])]
        print(f"  {ours} / {stock} per round: {', '.join(f'{x:.2f}' for x in per)}")
    mib = 1 << 20
    for name, rounds in traffic.items():
        for r, t in enumerate(rounds):
            print(
                f"  rank 0, {name}, round {r}: downloaded {t.get('downloads', 0)} objects {t.get('downloaded_bytes', 0) / mib:.2f} MiB, "
                f"uploaded {t.get('uploads', 0)} objects {t.get('uploaded_bytes', 0) / mib:.2f} MiB, "
                f"recoded {t.get('replaces', 0)} objects {t.get('replaced_bytes', 0) / mib:.2f} MiB, {t.get('requests', 0)} requests"
            )


if __name__ == "__main__":
    main()
