"""ckpt.open / ckpt.safe_open: a remote read without a repository, against a directory remote
and, when `s3s-fs` is installed, an S3 server on loopback. The remote is written by the `ckpt`
CLI (skipped when it is not built)."""

import contextlib
import subprocess

import numpy as np
import pytest

import ckpt
from conftest import ckpt_cli
from object_servers import served


def epoch(e):
    return {
        "embed": np.arange(256 * 32, dtype=np.float32).reshape(256, 32) * (e + 1),
        "bias": np.full(32, e, dtype=np.float32),
        "cube": np.arange(2 * 3 * 4, dtype=np.int64).reshape(2, 3, 4) + e,
    }


@pytest.fixture(autouse=True)
def cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPT_CACHE_DIR", str(tmp_path / "caches"))


@pytest.fixture(params=["dir", "s3"])
def remote(request, tmp_path, monkeypatch):
    """A remote holding epochs 0 (tagged v0) and 1 of model.safetensors on main."""
    binary = ckpt_cli()
    with contextlib.ExitStack() as stack:
        if request.param == "s3":
            url = stack.enter_context(served("s3", tmp_path, monkeypatch))
        else:
            url = str(tmp_path / "remote")
        repo = ckpt.Repo.init(tmp_path / "work")
        repo.commit({"model.safetensors": epoch(0)}, "epoch 0", tags="v0", metadata={"model.safetensors": {"step": "0"}})
        repo.commit({"model.safetensors": epoch(1)}, "epoch 1", metadata={"model.safetensors": {"step": "1"}})
        for args in (["remote", "add", "origin", url], ["push", "--all"]):
            done = subprocess.run([binary, *args], cwd=tmp_path / "work", capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        yield url


def test_open_lists_and_loads_without_a_repository(remote):
    with ckpt.open(remote) as r:
        log = r.log()
        assert [v["message"] for v in log] == ["epoch 1", "epoch 0"]
        assert log[0]["parents"] == [log[1]["id"]]
        assert r.files() == ["model.safetensors"]
        assert r.tags() == {"v0": log[1]["id"]}
        assert r.branches() == {"main": log[0]["id"]}
        assert r.resolve("main~1") == r.resolve("v0") == r.resolve(log[1]["id"][:8])
        got = r.load("v0")
        assert sorted(got) == ["bias", "cube", "embed"]
        for name, arr in epoch(0).items():
            np.testing.assert_array_equal(got[name], arr)
        only = r.load(names=["bias"])
        assert list(only) == ["bias"]
        np.testing.assert_array_equal(only["bias"], epoch(1)["bias"])
        with pytest.raises(ckpt.CkptError, match="no tensor named"):
            r.load(names=["absent"])
        with pytest.raises(ckpt.CkptError, match="nope"):
            r.resolve("nope")


def test_safe_open_is_shaped_like_safetensors(remote):
    want = epoch(1)
    with ckpt.safe_open(remote, "model.safetensors", framework="np") as f:
        assert f.keys() == ["bias", "cube", "embed"]
        assert f.metadata() == {"step": "1"}
        np.testing.assert_array_equal(f.get_tensor("embed"), want["embed"])
        s = f.get_slice("embed")
        assert s.get_shape() == [256, 32] and s.get_dtype() == "F32"
        np.testing.assert_array_equal(s[10:20], want["embed"][10:20])
        np.testing.assert_array_equal(s[-3:], want["embed"][-3:])
        np.testing.assert_array_equal(s[5], want["embed"][5])
        np.testing.assert_array_equal(s[1:30:7], want["embed"][1:30:7])
        np.testing.assert_array_equal(s[2:4, 1:3], want["embed"][2:4, 1:3])
        np.testing.assert_array_equal(s[9:9], want["embed"][9:9])
        cube = f.get_slice("cube")
        np.testing.assert_array_equal(cube[1], want["cube"][1])
        np.testing.assert_array_equal(cube[:, 2], want["cube"][:, 2])
        with pytest.raises(IndexError):
            s[256]
        with pytest.raises(ckpt.CkptError, match="no tensor named"):
            f.get_tensor("absent")
    with ckpt.safe_open(remote, "model.safetensors", rev="v0", framework="numpy") as f:
        np.testing.assert_array_equal(f.get_slice("embed")[100:200], epoch(0)["embed"][100:200])
    with pytest.raises(ValueError):
        ckpt.safe_open(remote, "model.safetensors", framework="jax")


def test_a_second_read_comes_from_the_cache(remote, tmp_path):
    cache = tmp_path / "one-cache"
    with ckpt.safe_open(remote, "model.safetensors", cache=cache, framework="np") as f:
        f.get_slice("embed")[3:9]
        f.get_tensor("bias")
    r = ckpt.open(remote, cache=cache)
    with r.safe_open("model.safetensors", framework="np") as f:
        after_open = r.requests
        np.testing.assert_array_equal(f.get_slice("embed")[3:9], epoch(1)["embed"][3:9])
        np.testing.assert_array_equal(f.get_tensor("bias"), epoch(1)["bias"])
        assert r.requests == after_open, "a second read went to the remote"
    r.close()


def test_torch_tensors(remote):
    torch = pytest.importorskip("torch")
    with ckpt.safe_open(remote, "model.safetensors") as f:
        t = f.get_slice("embed")[0:2]
        assert isinstance(t, torch.Tensor) and t.shape == (2, 32)
        assert torch.equal(t, torch.from_numpy(epoch(1)["embed"][0:2]))
