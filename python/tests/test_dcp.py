"""ckpt.dcp.Writer / Reader under real torch.distributed: gloo on CPU, ranks spawned on loopback,
DTensor shards. Skipped without torch."""

import json
import os
import signal
import subprocess
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available", allow_module_level=True)

import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import ckpt  # noqa: E402
import ckpt.dcp  # noqa: E402
from ckpt._native import Repo as NativeRepo  # noqa: E402

from conftest import ckpt_binary  # noqa: E402
from object_servers import free_port  # noqa: E402
from dcp_ranks import (  # noqa: E402
    as_rank,
    hold_write_data,
    init,
    leave,
    replicated_load_worker,
    replicated_save_worker,
    report,
    results,
    sharded,
    wait_for,
)


def full_state(seed):
    """The whole tensors every rank shards (the same on all ranks)."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(64, 24, generator=g),
        "b": torch.randn(40, generator=g).to(torch.bfloat16),
        "m": torch.randn(32, 8, generator=g),
    }


def save_worker(rank, world, port, repo, seed, out, fail_rank, gate):
    mesh = init(rank, world, port)
    try:
        writer = ckpt.dcp.Writer(repo, message=f"seed {seed}", tags=[f"s{seed}"] if fail_rank is None else [])
        inner = writer.write_data
        if fail_rank == rank:

            def write_data(plan, planner):
                inner(plan, planner)  # its objects are stored, then the rank fails
                raise RuntimeError("rank failed on purpose")

            writer.write_data = write_data
        if gate is not None:
            hold_write_data(writer, gate)
        dcp.save(sharded(full_state(seed), mesh), storage_writer=writer)
        report(out, rank, {"ok": True})
    except BaseException as e:  # noqa: BLE001 - reported to the test (CheckpointException is one)
        report(out, rank, {"ok": False, "error": str(e)})
    finally:
        dist.destroy_process_group()
        leave()


def load_worker(rank, world, port, repo, seed, rev, out):
    mesh = init(rank, world, port)
    try:
        sd = sharded(full_state(seed), mesh, zero=True)
        dcp.load(sd, storage_reader=ckpt.dcp.Reader(repo, rev=rev))
        full = full_state(seed)
        same = all(torch.equal(sd[k].full_tensor(), full[k]) for k in full)
        report(out, rank, {"ok": same and sd["step"] == 1234, "local": list(sd["w"].to_local().shape)})
    except BaseException as e:  # noqa: BLE001
        report(out, rank, {"ok": False, "error": repr(e)})
    finally:
        dist.destroy_process_group()
        leave()


def run(fn, world, *args, out):
    os.makedirs(out, exist_ok=True)
    mp.spawn(fn, args=(world, free_port(), *args, out), nprocs=world, join=True)
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]


def run_save(world, repo, seed, out, fail_rank=None, gate=None):
    os.makedirs(out, exist_ok=True)
    return mp.spawn(
        save_worker, args=(world, free_port(), repo, seed, out, fail_rank, gate), nprocs=world, join=False
    )


def save(world, repo, seed, out, fail_rank=None):
    ctx = run_save(world, repo, seed, out, fail_rank)
    while not ctx.join():
        pass
    return results(out, world)


def log(repo):
    return json.loads(NativeRepo.discover(str(repo)).log_json("HEAD"))


@pytest.fixture
def repo_dir(tmp_path):
    ckpt.Repo.init(tmp_path / "repo")
    return str(tmp_path / "repo")


def test_four_ranks_save_one_version_and_load_with_resharding_and_as_a_checkout(repo_dir, tmp_path):
    assert save(4, repo_dir, 1, str(tmp_path / "s1")) == [{"ok": True}] * 4
    native = NativeRepo.discover(repo_dir)
    versions = log(repo_dir)
    assert len(versions) == 1
    # What the ranks stored is counted (`ckpt log` and `show` size figures).
    assert 0 < versions[0]["stored_bytes"] <= versions[0]["raw_bytes"] + 64 * 1024, versions[0]
    files = sorted(f[0] for f in native.files("HEAD"))
    assert files == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    assert dict(native.tags())["s1"] == native.resolve("HEAD")

    # A second save follows the first on the branch.
    assert save(4, repo_dir, 2, str(tmp_path / "s2")) == [{"ok": True}] * 4
    assert len(log(repo_dir)) == 2

    # Loaded on 4 ranks and, resharded, on 2; the first save by its tag.
    loaded = run(load_worker, 4, repo_dir, 2, "HEAD", out=str(tmp_path / "l4"))
    assert all(r["ok"] for r in loaded), loaded
    loaded = run(load_worker, 2, repo_dir, 1, "s1", out=str(tmp_path / "l2"))
    assert all(r["ok"] for r in loaded), loaded
    assert loaded[0]["local"] == [32, 24]

    # Checked out, the version is a DCP directory that stock dcp.load reads (one process).
    out = tmp_path / "checkout"
    native.checkout("HEAD", output=str(out))
    full = full_state(2)
    sd = {k: torch.zeros_like(v) for k, v in full.items()}
    sd["step"] = 0
    dcp.load(sd, checkpoint_id=str(out))
    assert all(torch.equal(sd[k], full[k]) for k in full) and sd["step"] == 1234


def test_a_rank_that_raises_leaves_no_version(repo_dir, tmp_path):
    got = save(4, repo_dir, 1, str(tmp_path / "f"), fail_rank=2)
    assert not any(r["ok"] for r in got), got
    assert "rank failed on purpose" in json.dumps(got)
    assert NativeRepo.discover(repo_dir).branch_tip("main") is None  # no version, no ref
    # The objects stored before the failure are garbage; the store works on.
    assert save(4, repo_dir, 1, str(tmp_path / "ok")) == [{"ok": True}] * 4
    assert len(log(repo_dir)) == 1


def test_two_jobs_saving_to_one_branch_at_once_one_is_refused(repo_dir, tmp_path):
    assert save(2, repo_dir, 1, str(tmp_path / "first")) == [{"ok": True}] * 2
    before = log(repo_dir)[0]["id"]
    started, proceed = str(tmp_path / "b_started"), str(tmp_path / "a_done")
    # Job B plans (sees the tip) and waits in write_data until job A has committed.
    job_b = run_save(2, repo_dir, 3, str(tmp_path / "b"), gate=(started, proceed))
    wait_for(started)
    assert save(2, repo_dir, 2, str(tmp_path / "a")) == [{"ok": True}] * 2
    open(proceed, "w").close()
    while not job_b.join():
        pass
    b = results(str(tmp_path / "b"), 2)
    assert not any(r["ok"] for r in b), b
    assert "another save committed first" in json.dumps(b)
    versions = log(repo_dir)
    assert len(versions) == 2 and versions[1]["id"] == before
    assert versions[0]["message"] == "seed 2"


def test_async_save_in_one_process_then_load(repo_dir):
    """`dcp.async_save` with the Writer (one process, no process group)."""
    full = full_state(4)
    sd = dict(full, step=1234)
    dcp.async_save(sd, storage_writer=ckpt.dcp.Writer(repo_dir, message="async")).result()
    assert [v["message"] for v in log(repo_dir)] == ["async"]
    out = {k: torch.zeros_like(v) for k, v in full.items()}
    out["step"] = 0
    dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
    assert all(torch.equal(out[k], full[k]) for k in full) and out["step"] == 1234


def test_two_overlapping_async_saves_with_one_writer_never_mix(repo_dir, monkeypatch):
    """One Writer, two `dcp.async_save`s in flight at once: the first, overtaken, raises and
    commits nothing; the second commits exactly its own tensors (it once committed one save's
    `.metadata` over the other's tensors, reported as the first's success)."""
    import threading

    import torch.distributed.checkpoint.filesystem as fsmod

    written = [threading.Event(), threading.Event()]
    release = [threading.Event(), threading.Event()]
    calls = []
    inner = fsmod._FileSystemWriter.write_data

    def held_write_data(self, plan, planner):
        # Each save is held after DCP wrote its file into memory, before ckpt stores it.
        future = inner(self, plan, planner)
        future.wait()
        i = len(calls)
        calls.append(i)
        written[i].set()
        release[i].wait(60)
        return future

    monkeypatch.setattr(fsmod._FileSystemWriter, "write_data", held_write_data)
    writer = ckpt.dcp.Writer(repo_dir, message="reused")
    first, second = dict(full_state(1), step=1), dict(full_state(2), step=2)
    f1 = dcp.async_save(first, storage_writer=writer)
    assert written[0].wait(60)
    f2 = dcp.async_save(second, storage_writer=writer)
    assert written[1].wait(60)
    release[0].set()
    with pytest.raises(BaseException) as overtaken:  # DCP's CheckpointException is one
        f1.result()
    # DCP wraps a rank's error in a CheckpointException that lists each rank's traceback.
    text = str(overtaken.value) + repr(getattr(overtaken.value, "failures", ""))
    assert "another save began on this Writer" in text, text
    release[1].set()
    f2.result()
    versions = log(repo_dir)
    assert len(versions) == 1, versions
    out = {k: torch.zeros_like(v) for k, v in full_state(2).items()}
    out["step"] = 0
    dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
    assert out["step"] == 2 and all(torch.equal(out[k], v) for k, v in full_state(2).items())
    subprocess.run([ckpt_binary(), "verify"], cwd=repo_dir, check=True, capture_output=True)


def test_gc_prune_now_during_a_save_keeps_what_the_save_wrote(repo_dir):
    """The coordinator announces the save in `.ckpt/saves/` before any rank stores an object:
    a `ckpt gc --prune=now` while the save is between storing its file and committing keeps
    its objects, the save commits, and the record is gone afterwards."""
    import threading

    stored, release = threading.Event(), threading.Event()
    writer = ckpt.dcp.Writer(repo_dir, message="held")
    inner = writer.finish

    def held_finish(metadata, results):
        stored.set()  # every rank's file is stored; nothing names it yet
        release.wait(60)
        return inner(metadata, results)

    writer.finish = held_finish
    full = full_state(6)
    future = dcp.async_save(dict(full, step=6), storage_writer=writer)
    assert stored.wait(60)
    saves = os.path.join(repo_dir, ".ckpt", "saves")
    assert len(os.listdir(saves)) == 1
    gc = subprocess.run([ckpt_binary(), "gc", "--prune=now", "--json"], cwd=repo_dir, check=True, capture_output=True)
    report = json.loads(gc.stdout)
    assert report["saves_in_flight"] == 1 and report["deleted"] == 0 and report["recent"] > 0, report
    release.set()
    future.result()
    assert os.listdir(saves) == []
    out = {k: torch.zeros_like(v) for k, v in full.items()}
    out["step"] = 0
    dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
    assert out["step"] == 6 and all(torch.equal(out[k], v) for k, v in full.items())


def test_a_file_per_item_save_past_the_open_file_limit(repo_dir):
    """`single_file_per_rank=False` writes a file per item, each kept in a memfd until DCP says
    where its items lie: more items than the soft limit of open files still save and load."""
    import resource

    g = torch.Generator().manual_seed(5)
    sd = {f"t{i}": torch.randn(8, generator=g) for i in range(300)}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard))
    try:
        writer = ckpt.dcp.Writer(repo_dir, message="per item", single_file_per_rank=False)
        dcp.save(sd, storage_writer=writer)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
    assert all(torch.equal(out[k], sd[k]) for k in sd)



def one_process_save(repo_dir, seed=7):
    """Tensors of several sizes (the largest alone at 1 MiB) saved through the Writer in one
    process (no process group): one rank file, `__0_0.distcp`."""
    g = torch.Generator().manual_seed(seed)
    sd = {f"t{i}": torch.randn(64 * (i + 1), 256, generator=g) for i in range(6)}
    sd["big"] = torch.randn(1024, 256, generator=g)
    sd["half"] = torch.randn(300, 7, generator=g).to(torch.bfloat16)
    dcp.save(sd, storage_writer=ckpt.dcp.Writer(repo_dir, message="sizes"))
    return sd


def test_a_load_in_another_order_than_the_file_and_than_read_ahead_expected(repo_dir, monkeypatch):
    """The Reader decodes the plan's items ahead of DCP. A plan in another order than the file's
    (a state dict built in reverse) loads; so does one whose items DCP asks for in another order
    than the read-ahead expected (here: the reverse): items it had not started are read when
    asked, the rest are taken from it, every value bit-exact. (Items that can be decoded
    straight into their destination are not read ahead: that path is off here.)"""
    monkeypatch.setattr(ckpt.dcp, "_spare_cpu", lambda: True)  # read ahead whatever the CPUs
    monkeypatch.setattr(ckpt.dcp._classes()["Reader"], "_read_direct", lambda self, plan, planner: plan)
    sd = one_process_save(repo_dir)
    out = {k: torch.zeros_like(sd[k]) for k in reversed(list(sd))}
    dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
    assert all(torch.equal(out[k], sd[k]) for k in sd)

    import dataclasses

    base = ckpt.dcp._classes()["Reader"]
    served = []

    class Counting:
        def __init__(self, inner):
            self.inner = inner

        def take(self, index):
            got = self.inner.take(index)
            served.append(got is not None)
            return got

        def close(self):
            self.inner.close()

    class Mispredicting(base):
        def _read_ahead(self, plan):
            super()._read_ahead(dataclasses.replace(plan, items=list(reversed(plan.items))))
            self._ahead = Counting(self._ahead)

    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=Mispredicting(repo_dir))
    assert all(torch.equal(out[k], sd[k]) for k in sd)
    assert len(served) == len(sd)
    # The last item asked for is the first the read-ahead started.
    assert served[-1], served


def test_items_are_decoded_straight_into_their_destinations(repo_dir, monkeypatch):
    """Each tensor item is decoded from the store straight into the tensor DCP loads it into
    (no torch.load, no copy), bit-exact; a destination that is not contiguous (a transposed
    view) is loaded the stock way, as exactly."""
    reader = ckpt.dcp._classes()["Reader"]
    direct = []
    inner = reader._load_direct

    def counted(self, req, planner, torch):
        taken = inner(self, req, planner, torch)
        direct.append(taken)
        return taken

    monkeypatch.setattr(reader, "_load_direct", counted)
    sd = one_process_save(repo_dir)
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
    assert all(torch.equal(out[k], sd[k]) for k in sd)
    assert direct == [True] * len(sd), direct

    direct.clear()
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    out["big"] = torch.zeros(256, 1024).t()
    assert not out["big"].is_contiguous()
    dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
    assert all(torch.equal(out[k], sd[k]) for k in sd)
    assert sorted(direct) == [False] + [True] * (len(sd) - 1), direct


def test_an_item_that_fails_to_decode_raises_naming_its_file(repo_dir, monkeypatch):
    """A damaged object under one item: the load raises naming the rank file, whether the item
    was read ahead or read when asked; it never loads other values."""
    monkeypatch.setattr(ckpt.dcp, "_spare_cpu", lambda: True)
    sd = one_process_save(repo_dir)
    objects = os.path.join(repo_dir, ".ckpt", "objects")
    paths = [os.path.join(d, f) for d, _, files in os.walk(objects) for f in files]
    biggest = max(paths, key=os.path.getsize)  # the 1 MiB tensor's blob
    data = bytearray(open(biggest, "rb").read())
    data[len(data) // 2] ^= 0x10
    os.chmod(biggest, 0o644)
    with open(biggest, "wb") as f:
        f.write(data)
    for ahead in (ckpt.dcp.READ_AHEAD_ITEMS, 0):
        monkeypatch.setattr(ckpt.dcp, "READ_AHEAD_ITEMS", ahead)
        out = {k: torch.zeros_like(v) for k, v in sd.items()}
        # DCP raises a CheckpointException (a BaseException) holding the rank's traceback.
        with pytest.raises(BaseException, match=r"__0_0\.distcp: bytes \d+\+\d+: ") as raised:
            dcp.load(out, storage_reader=ckpt.dcp.Reader(repo_dir))
        assert "corrupt" in str(raised.value).lower(), raised.value
        assert not torch.equal(out["big"], sd["big"])


# A rank killed mid-save: the others must not wait longer than this on it (process group and
# collectives), and the test waits for them at most `KILL_JOIN` seconds.
KILL_PG_TIMEOUT = 20
KILL_JOIN = 120


def kill_worker(rank, world, port, repo, seed, out, kill_rank):
    mesh = init(rank, world, port, timeout=KILL_PG_TIMEOUT)
    try:
        writer = ckpt.dcp.Writer(repo, message=f"seed {seed}")
        if rank == kill_rank:
            inner = writer.write_data

            def write_data(plan, planner):
                inner(plan, planner)  # its objects are in the store; then it dies, no cleanup
                os.kill(os.getpid(), signal.SIGKILL)

            writer.write_data = write_data
        dcp.save(sharded(full_state(seed), mesh), storage_writer=writer)
        report(out, rank, {"ok": True})
    except BaseException as e:  # noqa: BLE001
        report(out, rank, {"ok": False, "error": repr(e)[-2000:]})
    # No destroy_process_group: its peer is gone, and the process exits anyway.


def save_with_a_rank_killed(world, repo, seed, out, kill_rank):
    """Runs a save whose rank `kill_rank` is SIGKILLed in `write_data` (plain processes, not
    mp.spawn, which would terminate the other ranks as soon as one dies); returns the exit
    codes and the reports of the other ranks."""
    os.makedirs(out, exist_ok=True)
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [
        ctx.Process(target=kill_worker, args=(r, world, port, repo, seed, out, kill_rank)) for r in range(world)
    ]
    for p in procs:
        p.start()
    end = time.time() + KILL_JOIN
    for p in procs:
        p.join(max(0.0, end - time.time()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} still running {KILL_JOIN} s after a rank was killed"
    reports = {
        r: json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world) if r != kill_rank
    }
    return [p.exitcode for p in procs], reports


def test_a_rank_killed_mid_save_leaves_no_version_then_a_save_and_gc_keep_what_it_needs(repo_dir, tmp_path):
    assert save(4, repo_dir, 1, str(tmp_path / "s1")) == [{"ok": True}] * 4
    native = NativeRepo.discover(repo_dir)
    before = native.branch_tip("main")
    objects = lambda: sum(len(fs) for _, _, fs in os.walk(os.path.join(repo_dir, ".ckpt", "objects")))  # noqa: E731

    # The coordinator killed (the others wait on it to finish), then another rank (the
    # coordinator waits on it to gather the results).
    for kill_rank in (0, 2):
        stored_before = objects()
        codes, reports = save_with_a_rank_killed(
            4, repo_dir, 10 + kill_rank, str(tmp_path / f"killed{kill_rank}"), kill_rank
        )
        assert codes[kill_rank] == -signal.SIGKILL, codes
        # Every other rank raised (no rank believes the save succeeded) and exited.
        assert all(not r["ok"] for r in reports.values()), reports
        # No version, no ref change; the killed save's objects are in the store, unreferenced.
        assert native.branch_tip("main") == before
        assert len(log(repo_dir)) == 1
        assert objects() > stored_before

    # The next save works and follows the first; a gc then keeps all either version needs.
    assert save(4, repo_dir, 3, str(tmp_path / "s3")) == [{"ok": True}] * 4
    assert [v["message"] for v in log(repo_dir)] == ["seed 3", "seed 1"]
    binary = ckpt_binary()
    if binary is None:
        pytest.skip("no ckpt binary for `ckpt gc` (set CKPT_BIN)")
    for args in (["gc"], ["verify"]):
        done = subprocess.run([binary, *args], cwd=repo_dir, capture_output=True, text=True)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
    # (verify read every object both versions need; the newest also loads.)
    loaded = run(load_worker, 2, repo_dir, 3, "HEAD", out=str(tmp_path / "l3"))
    assert all(r["ok"] for r in loaded), loaded


def async_worker(rank, world, port, repo, seed, out):
    mesh = init(rank, world, port)
    try:
        full = full_state(seed)
        sd = sharded(full, mesh)
        future = dcp.async_save(sd, storage_writer=ckpt.dcp.Writer(repo, message=f"async {seed}"))
        # The Writer stages (copies) before async_save returns: training may go on meanwhile.
        for k in full:
            sd[k].to_local().add_(1.0)
        future.result()
        dist.barrier()
        loaded = sharded(full, mesh, zero=True)
        dcp.load(loaded, storage_reader=ckpt.dcp.Reader(repo))
        same = all(torch.equal(loaded[k].full_tensor(), full[k]) for k in full)
        report(out, rank, {"ok": same and loaded["step"] == 1234})
    except BaseException as e:  # noqa: BLE001
        report(out, rank, {"ok": False, "error": repr(e)[-2000:]})
    finally:
        dist.destroy_process_group()
        leave()


def test_async_save_on_four_ranks_then_load(repo_dir, tmp_path):
    got = run(async_worker, 4, repo_dir, 5, out=str(tmp_path / "a"))
    assert got == [{"ok": True}] * 4, got
    versions = log(repo_dir)
    assert [v["message"] for v in versions] == ["async 5"]
    files = sorted(f[0] for f in NativeRepo.discover(repo_dir).files("HEAD"))
    assert files == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]


def test_a_save_on_four_ranks_then_on_two_pairs_items_across_files_by_fqn(tmp_path):
    repo_dir = str(tmp_path / "repo")
    ckpt.Repo.init(repo_dir)
    # Deltas at commit time (under `reverse` the second save would be stored whole until
    # `ckpt compact`).
    with open(os.path.join(repo_dir, ".ckpt", "config"), "w") as f:
        json.dump({"delta_policy": "previous"}, f)
    assert run(replicated_save_worker, 4, repo_dir, 1, out=str(tmp_path / "s4")) == [{"ok": True}] * 4
    assert run(replicated_save_worker, 2, repo_dir, 2, out=str(tmp_path / "s2")) == [{"ok": True}] * 2
    second, first = log(repo_dir)
    # DCP moved the replicated tensors to other rank files: each is still a delta against
    # itself in the first save, found by its name in any of its files.
    print(f"stored: 4 ranks {first['stored_bytes']} bytes, then 2 ranks {second['stored_bytes']} bytes")
    assert second["stored_bytes"] * 4 < first["stored_bytes"], (first, second)

    binary = ckpt_binary()
    if binary is not None:
        done = subprocess.run([binary, "show", "--json"], cwd=repo_dir, capture_output=True, check=True)
        shown = json.loads(done.stdout)
        segments = [s for f in shown["files"] if f["path"].endswith(".distcp") for s in f["segments"] if s["is_tensor"]]
        names = {s["name"] for s in segments}
        assert {f"layer{i}.weight[0:128,0:96]" for i in range(6)} <= names, names
        assert {"sharded[0:16,0:8]", "sharded[16:32,0:8]"} <= names, names
        assert not any(n.startswith("archive.") for n in names), names
        deltas = [s for s in segments if s["name"].startswith("layer")]
        assert all(s["storage"] == "delta" for s in deltas), deltas

    loaded = run(replicated_load_worker, 2, repo_dir, 2, out=str(tmp_path / "l2"))
    assert loaded == [{"ok": True}] * 2, loaded


def big_state(seed):
    """Two tensors of 16 MiB: large enough to be cut into cells of 4 MiB (`dcp::cell_rows`)."""
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(1024, 4096, generator=g) * 0.02, "v": torch.randn(2048, 2048, generator=g) * 0.02}


def big_save_worker(rank, world, port, repo, seed, out):
    def body(mesh):
        dcp.save(sharded(big_state(seed), mesh), storage_writer=ckpt.dcp.Writer(repo, message=f"{world} ranks"))
        return {"ok": True}

    as_rank(rank, world, port, out, body)


def big_load_worker(rank, world, port, repo, seed, out):
    def body(mesh):
        sd = sharded(big_state(seed), mesh, zero=True)
        dcp.load(sd, storage_reader=ckpt.dcp.Reader(repo))
        full = big_state(seed)
        return {"ok": all(torch.equal(sd[k].full_tensor(), full[k]) for k in full)}

    as_rank(rank, world, port, out, body)


@pytest.mark.parametrize("worlds", [(4, 2), (2, 4)])
def test_a_change_of_rank_count_stores_the_same_cells_again_only_once(tmp_path, worlds):
    """The same state saved on 4 ranks and then on 2 (or 2, then 4): every chunk is cut into the
    cells of its tensor's rows, named alike at both rank counts, so the second save finds every
    cell already stored and adds only framing; it loads back on either count."""
    repo_dir = str(tmp_path / "repo")
    ckpt.Repo.init(repo_dir)
    first_world, second_world = worlds
    assert run(big_save_worker, first_world, repo_dir, 1, out=str(tmp_path / "a")) == [{"ok": True}] * first_world
    assert run(big_save_worker, second_world, repo_dir, 1, out=str(tmp_path / "b")) == [{"ok": True}] * second_world
    second, first = log(repo_dir)
    print(f"stored: {first_world} ranks {first['stored_bytes']} bytes, then {second_world} ranks {second['stored_bytes']}")
    assert first["stored_bytes"] > 30 << 20, first
    assert second["stored_bytes"] < 1 << 20, (first, second)

    binary = ckpt_binary()
    if binary is not None:
        done = subprocess.run([binary, "show", "--json"], cwd=repo_dir, capture_output=True, check=True)
        shown = json.loads(done.stdout)
        names = {s["name"] for f in shown["files"] for s in f["segments"] if s["is_tensor"]}
        assert {f"w[{r}:{r + 256},0:4096]" for r in range(0, 1024, 256)} <= names, names
        assert {f"v[{r}:{r + 512},0:2048]" for r in range(0, 2048, 512)} <= names, names
        verify = subprocess.run([binary, "verify"], cwd=repo_dir, capture_output=True, text=True)
        assert verify.returncode == 0, verify.stderr
    for world in worlds:
        loaded = run(big_load_worker, world, repo_dir, 1, out=str(tmp_path / f"l{world}"))
        assert loaded == [{"ok": True}] * world, loaded
