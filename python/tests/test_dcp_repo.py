"""`ckpt.dcp.Reader` and `Writer` on a repository, in one process: `.metadata` is unpickled
allowing only the classes DCP's metadata names (a store's bytes may come from a remote or a
clone of one, and DCP's own reader runs `pickle.load` on them); a Reader of a directory committed
under the root reads that directory. The refusal needs no torch; the loads do (skipped without
it)."""

import io
import json
import os
import pickle
import subprocess
import sys

import pytest

import ckpt
import ckpt.dcp
from ckpt.dcp import _MetadataUnpickler

from conftest import ckpt_binary


class _Runs:
    """Pickles as a call of `os.system`: what a hostile `.metadata` would hold."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_a_metadata_naming_any_other_callable_is_refused_before_the_call(tmp_path):
    marker = tmp_path / "ran"
    payload = pickle.dumps({"storage_data": _Runs(f"touch {marker}")})
    with pytest.raises(pickle.UnpicklingError) as e:
        _MetadataUnpickler(io.BytesIO(payload), "run1 at abc: .metadata").load()
    assert "run1 at abc: .metadata" in str(e.value)
    assert "system" in str(e.value) and "trust_metadata" in str(e.value)
    assert not marker.exists()
    # Names of builtins and of modules next to DCP's are refused the same way.
    for module, name in [("builtins", "eval"), ("torch.distributed.checkpoint.filesystem", "FileSystemReader")]:
        hostile = b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c" + bytes([len(module)]) + module.encode()
        hostile += b"\x8c" + bytes([len(name)]) + name.encode() + b"\x93."
        with pytest.raises(pickle.UnpicklingError, match=name):
            _MetadataUnpickler(io.BytesIO(hostile), "m").load()


def _torch():
    return pytest.importorskip("torch")


def _stock_save(directory):
    """A one-process DCP save (no process group) of a small state dict into `directory`."""
    torch = _torch()
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g), "step": 7}
    dcp.save(state, checkpoint_id=str(directory))
    return state


def _commit(repo_dir, directory, message):
    subprocess.run([ckpt_binary(), "commit", "-q", "-m", message, str(directory)], cwd=repo_dir, check=True)


def test_a_reader_loads_stock_metadata_and_refuses_a_hostile_one(tmp_path):
    torch = _torch()
    import torch.distributed.checkpoint as dcp

    repo_dir = tmp_path / "repo"
    ckpt.Repo.init(str(repo_dir))
    # The DCP directory is the repository's root, where the Reader reads it.
    saved = _stock_save(repo_dir)
    _commit(repo_dir, repo_dir, "stock")

    # The metadata of a stock save names only allowed classes: loads bit-exact.
    target = {"w": torch.zeros(64, 32), "b": torch.zeros(32), "step": 0}
    dcp.load(target, storage_reader=ckpt.dcp.Reader(str(repo_dir)))
    assert torch.equal(target["w"], saved["w"]) and torch.equal(target["b"], saved["b"])
    assert target["step"] == 7

    # The same files with a `.metadata` that calls `os.system` when unpickled.
    marker = tmp_path / "ran"
    with open(repo_dir / ".metadata", "wb") as f:
        pickle.dump(_Runs(f"touch {marker}"), f)
    _commit(repo_dir, repo_dir, "hostile")
    with pytest.raises(BaseException) as e:  # DCP raises CheckpointException, a BaseException
        dcp.load({"w": torch.zeros(64, 32)}, storage_reader=ckpt.dcp.Reader(str(repo_dir)))
    assert "system" in str(e.value) and ".metadata" in str(e.value), str(e.value)
    assert not marker.exists()

    # A damaged pickle is refused with the file named, not a bare unpickling error.
    with open(repo_dir / ".metadata", "wb") as f:
        f.write(b"\x80\x04not a pickle")
    _commit(repo_dir, repo_dir, "damaged")
    with pytest.raises(BaseException) as e:  # DCP raises CheckpointException, a BaseException
        dcp.load({"w": torch.zeros(64, 32)}, storage_reader=ckpt.dcp.Reader(str(repo_dir)))
    assert ".metadata" in str(e.value) and "not a DCP metadata pickle" in str(e.value), str(e.value)

    # trust_metadata=True reads as DCP does: the stock version still loads through it.
    target = {"w": torch.zeros(64, 32), "b": torch.zeros(32), "step": 0}
    dcp.load(target, storage_reader=ckpt.dcp.Reader(str(repo_dir), rev="HEAD~2", trust_metadata=True))
    assert torch.equal(target["w"], saved["w"])


def test_a_reader_of_a_directory_committed_under_the_root_reads_that_directory(tmp_path):
    """Two DCP saves committed as directories (`ckpt commit step_100`): a Reader of each path
    loads that save, not whatever the root holds; a Writer of a directory inside the repository
    is refused (it saves at the root, where a Reader of that path would not find it)."""
    torch = _torch()
    import torch.distributed.checkpoint as dcp

    repo_dir = tmp_path / "repo"
    ckpt.Repo.init(str(repo_dir))
    saved = {}
    for step, seed in ((100, 1), (200, 2)):
        g = torch.Generator().manual_seed(seed)
        saved[step] = {"w": torch.randn(48, 16, generator=g)}
        dcp.save(saved[step], checkpoint_id=str(repo_dir / f"step_{step}"))
        _commit(repo_dir, repo_dir / f"step_{step}", f"step {step}")
    for step in (100, 200):
        target = {"w": torch.zeros(48, 16)}
        dcp.load(target, storage_reader=ckpt.dcp.Reader(str(repo_dir / f"step_{step}")))
        assert torch.equal(target["w"], saved[step]["w"]), step
    # The version before step 200's commit has no step_200: a clear error, not another save.
    with pytest.raises(BaseException, match="step_200/.metadata"):
        dcp.load({"w": torch.zeros(48, 16)}, storage_reader=ckpt.dcp.Reader(str(repo_dir / "step_200"), rev="HEAD~1"))

    versions = len(ckpt.Repo(str(repo_dir)).log())
    (repo_dir / "step_300").mkdir()
    with pytest.raises(BaseException, match="a directory inside the repository"):
        dcp.save({"w": torch.ones(4)}, storage_writer=ckpt.dcp.Writer(str(repo_dir / "step_300")))
    assert len(ckpt.Repo(str(repo_dir)).log()) == versions


def _two_saves(tmp_path, mode, monkeypatch):
    """Two versions written as a Writer writes them (`store_objects`, then `commit_stored`
    through the coordinator's `_RepoTarget.commit`), under the default `reverse` policy with
    `CKPT_COMPACT=mode`; returns the native repository."""
    import numpy as np
    from safetensors.numpy import save_file

    from ckpt.dcp import _RepoTarget

    monkeypatch.setenv("CKPT_COMPACT", mode)
    repo_dir = tmp_path / "repo"
    ckpt.Repo.init(str(repo_dir))
    target = _RepoTarget(str(repo_dir))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 256)).astype(np.float32)
    tip = None
    for step in range(2):
        w.ravel()[:: 97] += np.float32(0.01)  # a training step's change
        spool = tmp_path / f"spool{step}.safetensors"
        save_file({"w": w}, str(spool))
        stored = target.store_objects(str(spool), "model.safetensors", tip)
        tip = target.commit("main", tip, None, [stored], f"step {step}", [])
    return target.native


def _wait_compacted(native, limit=60.0):
    import time

    end = time.monotonic() + limit
    while native.has_pending_deltas():
        assert time.monotonic() < end, "the background compaction did not finish"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["background", "inline"])
def test_a_save_under_reverse_leaves_the_previous_version_as_deltas(tmp_path, monkeypatch, mode):
    """A Writer's save leaves its version pending (the previous version's tensors become
    deltas against it in a compaction): the save compacts as `ckpt commit` does, in a niced
    background process or before returning. Without it every save would stay whole."""
    native = _two_saves(tmp_path, mode, monkeypatch)
    if mode == "inline":
        assert not native.has_pending_deltas()
    _wait_compacted(native)
    log = json.loads(native.log_json("HEAD"))
    # The older version now costs a delta, a fraction of the newer's whole tensor.
    assert log[1]["stored_now_bytes"] < log[0]["stored_now_bytes"] / 4, log


def test_a_save_with_manual_compaction_leaves_it_pending(tmp_path, monkeypatch):
    native = _two_saves(tmp_path, "manual", monkeypatch)
    assert native.has_pending_deltas()
    # Both saves: the first to code what its writers stored uncoded (nothing here), the
    # second also to rewrite the first's blobs as deltas.
    assert native.compact()[0] == 2
    assert not native.has_pending_deltas()


def test_a_compaction_that_cannot_start_leaves_the_save_committed(tmp_path, monkeypatch, caplog):
    """Starting the compaction fails (here made to raise, as a failed fork would): the
    save's version stands, pending, and a warning says so; the save does not raise."""
    import ckpt.dcp as ckpt_dcp

    def fails(native):
        raise OSError("cannot fork")

    monkeypatch.setattr(ckpt_dcp, "_compact_after_save", fails)
    native = _two_saves(tmp_path, "background", monkeypatch)
    assert len(json.loads(native.log_json("HEAD"))) == 2
    assert native.has_pending_deltas()
    assert "is committed, but its compaction did not start (cannot fork)" in caplog.text


@pytest.mark.parametrize("mode", ["inline", "background"])
def test_keep_last_leaves_the_newest_saves_and_frees_the_rest(tmp_path, monkeypatch, mode):
    """`Writer(keep_last=N)` as the coordinator runs it (`_RepoTarget.commit(..., keep_last)`):
    after five saves the branch holds the newest two, each reading back bit-exact, the store
    holds less than without it, and what a tag names stays. The prune runs where the
    compaction does: before the save returns (`inline`), or in the background process (the
    default), which the ranks do not wait for."""
    import numpy as np
    from safetensors.numpy import save_file

    from ckpt.dcp import _RepoTarget

    import time

    monkeypatch.setenv("CKPT_COMPACT", mode)
    sizes = {}
    for keep_last in (None, 2):
        repo_dir = tmp_path / f"repo{keep_last}"
        ckpt.Repo.init(str(repo_dir))
        if mode == "inline":
            # No grace period: the dropped saves' blobs go at once (by default they stay an
            # hour, as `ckpt gc` keeps young objects that a save in flight may be writing; in
            # the background the next save is such a save, whose objects a gc without grace
            # deletes before its commit, which then refuses it).
            config = repo_dir / ".ckpt" / "config"
            config.write_text(json.dumps(dict(json.loads(config.read_text()), gc_grace_seconds=0)))
        target = _RepoTarget(str(repo_dir))
        rng = np.random.default_rng(0)
        w = rng.standard_normal((256, 256)).astype(np.float32)
        tip, saved = None, []
        for step in range(5):
            w = w + rng.standard_normal(w.shape).astype(np.float32) * np.float32(0.1)  # every weight moves
            spool = tmp_path / f"spool{step}.safetensors"
            save_file({"w": w}, str(spool))
            stored = target.store_objects(str(spool), "model.safetensors", tip)
            tip = target.commit("main", tip, None, [stored], f"step {step}", ["first"] if step == 0 else [], keep_last)
            saved.append((tip, spool.read_bytes()))
        end = time.monotonic() + 60
        while True:
            log = json.loads(target.native.log_json("HEAD"))
            done = not target.native.has_pending_deltas() and len(log) == (5 if keep_last is None else keep_last)
            if done or time.monotonic() > end:
                break
            time.sleep(0.05)
        if keep_last:
            assert [v["id"] for v in log] == [v for v, _ in reversed(saved[-2:])], log
        else:
            assert len(log) == 5
        # The newest saves, and the tagged first one, read back as saved.
        for version, data in saved[-2:] + saved[:1]:
            f = target.native.open_file(version, "model.safetensors")
            assert bytes(f.read(0, len(data))) == data
        assert subprocess.run([ckpt_binary(), "verify"], cwd=repo_dir, capture_output=True).returncode == 0
        sizes[keep_last] = sum(
            os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(repo_dir / ".ckpt" / "objects") for f in fs
        )
    if mode == "inline":
        assert sizes[2] < sizes[None] * 0.8, sizes


def test_keep_last_is_a_positive_count_for_a_repository_target(tmp_path):
    _torch()
    for bad in (0, -1):
        with pytest.raises(ValueError, match="keep_last"):
            ckpt.dcp.Writer(str(tmp_path), keep_last=bad)
    for bad in (True, 1.5):
        with pytest.raises(TypeError, match="keep_last"):
            ckpt.dcp.Writer(str(tmp_path), keep_last=bad)
    with pytest.raises(ValueError, match="keep_last is for a repository"):
        ckpt.dcp.Writer("s3://bucket/run", keep_last=3)
    assert ckpt.dcp.Writer(str(tmp_path), keep_last=3).keep_last == 3


class _Storage:
    """What `PieceSink` asks of a hinted storage (a torch `UntypedStorage` in a save): where
    its bytes lie. Here a numpy array's."""

    def __init__(self, array):
        self.array = array

    def data_ptr(self):
        return self.array.ctypes.data

    def nbytes(self):
        return self.array.nbytes


def test_tensors_taken_while_a_file_is_written_are_stored_as_the_whole_file_would_be(tmp_path):
    """A Writer rank's stream hands each tensor's own memory to a `PieceSink` (stored at once,
    uncoded) and leaves a hole in the file; `store_objects` then gives the entry the whole file
    gives, the compaction codes the pieces, and the version reads back bit-exact. A copy of a
    hinted tensor is known by its length; any other buffer is refused, and the caller writes it
    into the file."""
    import numpy as np
    from safetensors.numpy import save

    rng = np.random.default_rng(7)
    tensors = {
        "a": (rng.standard_normal((128, 256)) * 0.02).astype(np.float32),
        "b": (rng.standard_normal((256, 512)) * 0.02).astype(np.float16),
        "c": rng.standard_normal(16).astype(np.float32),
    }
    whole = save(tensors)
    header = 8 + int.from_bytes(whole[:8], "little")
    # Where each tensor lies in the file.
    spans = {n: header + t["data_offsets"][0] for n, t in json.loads(whole[8:header]).items() if n in tensors}
    a, b = (range(spans[n], spans[n] + tensors[n].nbytes) for n in "ab")
    assert a.stop <= b.start

    plain = tmp_path / "plain"
    ckpt.Repo.init(str(plain))
    spool = tmp_path / "m.safetensors"
    spool.write_bytes(whole)
    expected = ckpt._native.Repo.discover(str(plain)).store_objects(str(spool), "m.safetensors")

    repo_dir = tmp_path / "repo"
    ckpt.Repo.init(str(repo_dir))
    native = ckpt._native.Repo.discover(str(repo_dir))
    dtypes = {"a": "float32", "b": "float16"}
    sink = native.piece_sink([(_Storage(tensors[n]), tensors[n].nbytes, dtypes[n], None) for n in "ab"])
    fd = os.memfd_create("m.safetensors")
    try:
        os.ftruncate(fd, len(whole))
        os.pwrite(fd, whole[: a.start], 0)
        assert sink.take(memoryview(tensors["a"]).cast("B"), "m.safetensors", a.start)
        os.pwrite(fd, whole[a.stop : b.start], a.stop)
        # A copy of `b` (as DCP copies a GPU tensor first) is known by its length and dtype.
        assert sink.take(memoryview(tensors["b"].copy()).cast("B"), "m.safetensors", b.start)
        # Neither a hinted storage nor as long as a hinted tensor; too short to be one.
        assert not sink.take(bytes(a.stop - a.start + 8), "m.safetensors", 0)
        assert not sink.take(b"small", "m.safetensors", 0)
        os.pwrite(fd, whole[b.stop :], b.stop)
        assert len(sink) == 2
        # The file holds holes where the pieces went.
        assert os.pread(fd, 64, a.start) == bytes(64)
        stored = native.store_objects(f"/proc/self/fd/{fd}", "m.safetensors", None, None, sink)
    finally:
        os.close(fd)
    assert stored == expected
    version = native.commit_stored("main", None, [stored], "save", [])
    assert native.compact()[5] == 2  # both pieces coded
    f = native.open_file(version, "m.safetensors")
    assert f.read(0, f.len) == whole
    verify = subprocess.run([ckpt_binary(), "verify"], cwd=repo_dir, capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr


def test_a_writer_killed_after_taking_a_tensor_leaves_only_a_temp_file_that_gc_removes(tmp_path):
    """A rank killed while DCP writes its file, after its sink stored a tensor and before the
    file was stored: the tensor is a temp file in the store, nothing names it, `ckpt gc
    --prune=now` deletes it, and the store verifies."""
    repo_dir = tmp_path / "repo"
    ckpt.Repo.init(str(repo_dir))
    script = f"""
import os, signal, numpy as np, ckpt
native = ckpt._native.Repo.discover({str(repo_dir)!r})
class Storage:
    def __init__(self, a): self.a = a
    def data_ptr(self): return self.a.ctypes.data
    def nbytes(self): return self.a.nbytes
w = np.random.default_rng(3).standard_normal((256, 256)).astype(np.float32)
sink = native.piece_sink([(Storage(w), w.nbytes, "float32", None)])
assert sink.take(memoryview(w).cast("B"), "__0_0.distcp", 4096)
os.kill(os.getpid(), signal.SIGKILL)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    tmp = repo_dir / ".ckpt" / "tmp"
    assert len(os.listdir(tmp)) == 1
    assert not any(files for _, _, files in os.walk(repo_dir / ".ckpt" / "objects"))
    for args in (["gc", "--prune=now"], ["verify"]):
        run = subprocess.run([ckpt_binary(), *args], cwd=repo_dir, capture_output=True, text=True)
        assert run.returncode == 0, (args, run.stderr)
    assert os.listdir(tmp) == []
