"""The cache a rank keeps between saves to a remote (`RemoteStore.open(url, rank=R)`, what
`ckpt.dcp.Writer("s3://…")` uses by default), without torch: one process at a time holds it,
a save on top of the previous one downloads nothing of the file it holds, and it is pruned to
the newest file after each save. (tests/it/dcp_cache.rs covers the same in Rust, with damage
and killed holders; test_dcp_remote.py with real ranks.)"""

import os

import pytest

from ckpt._native import RemoteStore


@pytest.fixture
def url(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_CACHE_DIR", str(tmp_path / "caches"))
    return f"file://{tmp_path / 'remote'}"


def objects_size(store):
    root = os.path.join(store.cache_dir, ".ckpt", "objects")
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)


def save(store, tmp_path, data):
    """One save of `data` as `model.bin` on `main`, on top of its tip."""
    disk = tmp_path / "spool"
    disk.write_bytes(data)
    tip, tag = store.branch_tip("main")
    entry = store.store_objects(str(disk), "model.bin", tip)
    return store.commit("main", tip, tag, [entry[:4]], "save", [], entry[4])


def test_a_kept_cache_is_held_by_one_store_reused_and_pruned(url, tmp_path):
    first = RemoteStore.open(url, rank=0, create=True)
    assert first.cache_kept and first.cache_fallback is None
    # A second user at the same time gets a temporary cache, deleted when it is closed.
    second = RemoteStore.open(url, rank=0, create=True)
    assert not second.cache_kept and "in use" in second.cache_fallback
    temporary = second.cache_dir
    second.close()
    assert not os.path.exists(temporary)
    # Another rank's cache is its own.
    other = RemoteStore.open(url, rank=1, create=True)
    assert other.cache_kept and other.cache_dir != first.cache_dir
    other.close()

    files = [os.urandom(1 << 20) for _ in range(4)]
    versions = [save(first, tmp_path, files[0])]
    first.close(prune=True)
    with pytest.raises(Exception, match="closed"):
        first.resolve("HEAD")
    sizes = []
    for data in files[1:]:
        store = RemoteStore.open(url, rank=0, create=True)
        assert store.cache_kept
        versions.append(save(store, tmp_path, data))
        # The previous file was in the cache: only the previous version object came down.
        assert store.traffic()["downloaded_bytes"] < 4096, store.traffic()
        assert store.traffic()["uploaded_bytes"] >= 1 << 20, store.traffic()
        store.close(prune=True)
        reopened = RemoteStore.open(url, rank=0)
        sizes.append(objects_size(reopened))
        reopened.close()
    # Pruned to the newest file after each save.
    assert all((1 << 20) <= s < (1 << 20) + (64 << 10) for s in sizes), sizes

    # What the kept cache saves: a temporary one downloads the previous file whole.
    temporary = RemoteStore.open(url)
    assert not temporary.cache_kept and temporary.cache_fallback is None
    versions.append(save(temporary, tmp_path, os.urandom(1 << 20)))
    assert temporary.traffic()["downloaded_bytes"] >= 1 << 20, temporary.traffic()
    # Each version reads back as its file.
    for version, data in zip(versions, files):
        assert bytes(temporary.open_file(version, "model.bin").read(0, len(data))) == data
    temporary.close()


def safetensors_f32(values):
    """A safetensors file of one float32 tensor `w`."""
    import array
    import json
    import struct

    data = array.array("f", values).tobytes()
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def test_a_mirror_save_can_leave_its_recodes_to_run_after_the_commit(url, tmp_path):
    """`store_objects(..., defer_recodes=True)`: the file is complete on the remote and the
    version commits before the previous version's blobs are recoded; `finish_recodes` then
    recodes them. `ckpt.dcp`'s remote target runs that on a thread after the save, which the
    next save waits for."""
    import random

    from ckpt import dcp

    rng = random.Random(5)
    first = [rng.gauss(0, 1) for _ in range(1 << 17)]
    second = [x + 1e-3 for x in first]
    third = [x + 2e-3 for x in first]
    store = RemoteStore.open(url, cache=str(tmp_path / "cache"), create=True)
    v1 = save(store, tmp_path, safetensors_f32(first))

    disk = tmp_path / "spool"
    disk.write_bytes(safetensors_f32(second))
    tip, tag = store.branch_tip("main")
    entry = store.store_objects(str(disk), "model.bin", tip, defer_recodes=True)
    assert store.pending_recodes() >= 1
    v2 = store.commit("main", tip, tag, [entry[:4]], "save", [], entry[4])
    # (The journal of the recodes went up with one replace.)
    before = store.traffic()["replaces"]
    recoded = store.finish_recodes()
    assert recoded >= 1
    assert store.pending_recodes() == 0 and store.finish_recodes() == 0
    assert store.traffic()["replaces"] == before + recoded, store.traffic()
    store.close(prune=True)

    # Through ckpt.dcp's remote target: the recodes on a thread, the cache released after them.
    target = dcp._RemoteTarget(url, str(tmp_path / "cache"), "mirror", {}, create=False)
    disk.write_bytes(safetensors_f32(third))
    branch, tip, tag = target.tip("main")
    entry = target.store_objects(str(disk), "model.bin", tip)
    v3 = target.commit(branch, tip, tag, [entry], "save", [])
    done = []
    target.close_after_recodes(done.append)
    dcp._wait_for_recodes()
    # What the save moved at once (its journal's one replace), then what the recodes moved.
    assert len(done) == 2 and done[0]["replaces"] == 1 and done[1]["replaces"] >= 1, done
    assert target.native is None

    reader = RemoteStore.open(url)
    for version, values in [(v1, first), (v2, second), (v3, third)]:
        data = safetensors_f32(values)
        assert bytes(reader.open_file(version, "model.bin").read(0, len(data))) == data
    reader.close()


def test_recodes_left_running_finish_before_the_interpreter_exits_or_are_dropped_safely(url, tmp_path):
    """A training script that ends right after its last save: the recodes still running on
    their thread finish before the interpreter exits (no journal left on the remote). A process
    that stops without finishing them (killed) leaves its journal noted in the cache; the next
    save through that cache deletes it, and every version still reads back."""
    import subprocess
    import sys

    rng_values = [float(i % 97) / 7.0 for i in range(1 << 21)]
    versions = []
    store = RemoteStore.open(url, cache=str(tmp_path / "cache"), create=True)
    versions.append((save(store, tmp_path, safetensors_f32(rng_values)), rng_values))
    store.close(prune=True)

    # A script whose save leaves recodes running, then ends.
    second = [x + 1e-3 for x in rng_values]
    (tmp_path / "second").write_bytes(safetensors_f32(second))
    script = f"""
from ckpt import dcp
target = dcp._RemoteTarget({url!r}, {str(tmp_path / "cache")!r}, "mirror", {{}}, create=False)
branch, tip, tag = target.tip("main")
entry = target.store_objects({str(tmp_path / "second")!r}, "model.bin", tip)
print(target.commit(branch, tip, tag, [entry], "save", []))
assert target.native.pending_recodes() >= 1
target.close_after_recodes(lambda traffic: None)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    versions.append((done.stdout.strip(), second))
    remote = url.removeprefix("file://")
    assert not os.listdir(os.path.join(remote, "pending")), "a journal was left: the recodes did not finish"

    # A save whose recodes never run (the process stopped first).
    third = [x + 2e-3 for x in rng_values]
    store = RemoteStore.open(url, cache=str(tmp_path / "cache"))
    disk = tmp_path / "spool"
    disk.write_bytes(safetensors_f32(third))
    tip, tag = store.branch_tip("main")
    entry = store.store_objects(str(disk), "model.bin", tip, defer_recodes=True)
    versions.append((store.commit("main", tip, tag, [entry[:4]], "save", [], entry[4]), third))
    assert store.pending_recodes() >= 1 and os.listdir(os.path.join(remote, "pending"))
    store.close()
    # The next save deletes that journal (and does its own recodes).
    store = RemoteStore.open(url, cache=str(tmp_path / "cache"))
    fourth = [x + 3e-3 for x in rng_values]
    versions.append((save(store, tmp_path, safetensors_f32(fourth)), fourth))
    store.close(prune=True)
    assert not os.listdir(os.path.join(remote, "pending"))
    reader = RemoteStore.open(url)
    for version, values in versions:
        data = safetensors_f32(values)
        assert bytes(reader.open_file(version, "model.bin").read(0, len(data))) == data
    reader.close()
