"""What the torch.distributed tests of `ckpt.dcp` share: ranks spawned on loopback with gloo on
CPU, DTensor shards, and each rank's outcome reported through a file. Imported by the test
modules only after they have skipped themselves when torch is missing."""

import datetime
import json
import os
import time

import torch
import torch.distributed as dist


def sharded(full, mesh, zero=False):
    """`full`'s tensors sharded on dim 0 over `mesh` (zeros with `zero`), plus a `step`."""
    from torch.distributed.tensor import Shard, distribute_tensor

    sd = {k: distribute_tensor(torch.zeros_like(v) if zero else v, mesh, [Shard(0)]) for k, v in full.items()}
    sd["step"] = 0 if zero else 1234
    return sd


def init(rank, world, port, timeout=None):
    """Joins the process group of `world` ranks on loopback; returns a 1-D CPU device mesh."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    kwargs = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
    dist.init_process_group("gloo", rank=rank, world_size=world, **kwargs)
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


def leave():
    """Ends a rank's process once it has reported, as a normal exit would but without torch's C++
    teardown, which sometimes aborts at interpreter exit ("terminate called without an active
    exception": a thread still joinable), which `mp.spawn` takes for the rank's failure (seen
    once in each of the last two sessions' runs of the two-jobs tests, after both jobs had
    reported). Only for workers that catch and report every exception. What a normal exit
    waits for is waited for first: threads that are not daemons (ckpt prunes a rank's cache on
    one after the save), then the exit handlers."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    os._exit(0)


def report(out, rank, value):
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(value, f)


def results(out, world):
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]


def wait_for(path, limit=60):
    end = time.time() + limit
    while not os.path.exists(path):
        if time.time() > end:
            raise TimeoutError(path)
        time.sleep(0.05)


def hold_write_data(writer, gate):
    """Makes `writer.write_data` announce itself (creates `gate[0]`) and wait for `gate[1]`: a
    save held in the middle, for races."""
    started, proceed = gate
    inner = writer.write_data

    def write_data(plan, planner):
        open(started, "w").close()
        wait_for(proceed)
        return inner(plan, planner)

    writer.write_data = write_data


def replicated_state(seed, mesh, zero=False):
    """A state dict of plain (replicated) tensors, which DCP's de-duplication hands to one rank
    each, so a save on another number of ranks moves them to other files; plus one small
    DTensor sharded on dim 0 and a `step`. Seed 1 is random; another seed is seed 1 with one
    element in 97 moved a little (a training step's worth of change, which deltas pay on)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    g = torch.Generator().manual_seed(1)
    full = {f"layer{i}.weight": torch.randn(128, 96, generator=g) for i in range(6)}
    full["sharded"] = torch.randn(32, 8, generator=g)
    if seed != 1:
        g = torch.Generator().manual_seed(seed)
        for t in full.values():
            flat = t.view(-1)
            flat[::97] += 1e-3 * torch.randn(flat[::97].shape, generator=g)
    if zero:
        full = {k: torch.zeros_like(v) for k, v in full.items()}
    sd = {k: v for k, v in full.items() if k != "sharded"}
    sd["sharded"] = distribute_tensor(full["sharded"], mesh, [Shard(0)])
    sd["step"] = 0 if zero else seed
    return sd


def same_state(loaded, seed, mesh):
    """Whether `loaded` (a `replicated_state` loaded in place) is bit-exactly save `seed`."""
    want = replicated_state(seed, mesh)

    def full(t):
        return t.full_tensor() if hasattr(t, "full_tensor") else t

    tensors = all(torch.equal(full(loaded[k]), full(want[k])) for k in want if k != "step")
    return tensors and loaded["step"] == want["step"]


def as_rank(rank, world, port, out, body):
    """Runs `body(mesh)` as rank `rank` of `world` (gloo on loopback) and reports what it
    returns, or the exception it raised as `{"ok": False, "error": ...}`; then leaves."""
    mesh = init(rank, world, port)
    try:
        report(out, rank, body(mesh))
    except BaseException as e:  # noqa: BLE001 - reported to the test (CheckpointException is one)
        report(out, rank, {"ok": False, "error": repr(e)})
    finally:
        dist.destroy_process_group()
        leave()


def replicated_save_worker(rank, world, port, target, seed, out):
    """A rank of a save of `replicated_state(seed)` through `ckpt.dcp.Writer(target)` (a
    repository or a remote URL)."""
    import torch.distributed.checkpoint as dcp

    import ckpt.dcp

    def body(mesh):
        dcp.save(replicated_state(seed, mesh), storage_writer=ckpt.dcp.Writer(target, message=f"seed {seed}"))
        return {"ok": True}

    as_rank(rank, world, port, out, body)


def replicated_load_worker(rank, world, port, target, seed, out):
    """A rank of a load through `ckpt.dcp.Reader(target)`, reporting whether it is bit-exactly
    `replicated_state(seed)`."""
    import torch.distributed.checkpoint as dcp

    import ckpt.dcp

    def body(mesh):
        sd = replicated_state(seed, mesh, zero=True)
        dcp.load(sd, storage_reader=ckpt.dcp.Reader(target))
        return {"ok": same_state(sd, seed, mesh)}

    as_rank(rank, world, port, out, body)
