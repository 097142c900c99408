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
