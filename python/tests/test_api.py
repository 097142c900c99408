"""The Python API without torch: numpy dicts and files, background commits, byte identity with
safetensors' own writer, torch.save fixtures, errors."""

import hashlib
import json
import os
import subprocess
import threading

import numpy as np
import pytest
from safetensors.numpy import save_file as st_save_file

import ckpt
from conftest import ckpt_binary


def sample(seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return {
        "encoder.weight": (rng.standard_normal((67, 33)) * scale).astype(np.float32),
        "encoder.bias": rng.standard_normal(33).astype(np.float32),
        "head.weight": rng.standard_normal((5, 3, 7)).astype(np.float16),
        "step": np.array(1234, dtype=np.int64),
        "mask": rng.integers(0, 2, (3, 5)).astype(bool),
        "ids": rng.integers(-100, 100, 11).astype(np.int32),
        "empty": np.zeros((0, 4), np.float32),
        "bytes": rng.integers(0, 255, 13).astype(np.uint8),
        "f64": rng.standard_normal((2, 2)),
        "u16": rng.integers(0, 60000, 9).astype(np.uint16),
        "i8": rng.integers(-100, 100, 3).astype(np.int8),
    }


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def assert_same_tensors(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def test_dict_round_trip_and_byte_identity_with_safetensors(repo, tmp_path):
    tensors = sample()
    vid = repo.commit({"model.safetensors": tensors}, "epoch 0")
    assert vid == repo.resolve("HEAD") and len(vid) == 64
    # Read back straight from the store.
    assert_same_tensors(repo.load(), tensors)
    assert_same_tensors(repo.load(names=["step", "mask"]), {k: tensors[k] for k in ("step", "mask")})
    # Checked out, the file is byte for byte what safetensors writes for the same dict.
    out = tmp_path / "out"
    assert repo.checkout("HEAD", output=out) == ["model.safetensors"]
    reference = tmp_path / "reference.safetensors"
    st_save_file(tensors, str(reference))
    assert (out / "model.safetensors").read_bytes() == reference.read_bytes()


@pytest.mark.parametrize("metadata", [None, {"format": "np"}])
def test_dict_and_saved_file_give_the_same_manifest_and_hash(repo, tmp_path, metadata):
    tensors = sample(1)
    # Many small tensors too: bundles must come out the same.
    tensors.update({f"norm{i}.weight": np.full(16, i, np.float32) for i in range(20)})
    disk = tmp_path / "saved.safetensors"
    st_save_file(tensors, str(disk), metadata=metadata)
    meta = None if metadata is None else {"from_dict.safetensors": metadata}
    repo.commit({"from_dict.safetensors": tensors, "from_disk.safetensors": str(disk)}, "both", metadata=meta)
    info = repo.file_info()
    a, b = info["from_dict.safetensors"], info["from_disk.safetensors"]
    assert a["format"] == b["format"] == "safetensors"
    assert (a["hash"], a["manifest"], a["len"]) == (b["hash"], b["manifest"], b["len"])
    assert a["len"] == disk.stat().st_size


def test_file_paths_are_committed_under_their_key_and_checked_out_bit_exactly(repo, tmp_path):
    src = tmp_path / "elsewhere"
    src.mkdir()
    st_save_file(sample(2), str(src / "w.safetensors"))
    (src / "notes.txt").write_bytes(b"plain bytes\x00\xff")
    repo.commit({"ckpt/w.safetensors": src / "w.safetensors", "notes.txt": str(src / "notes.txt")}, "files")
    out = tmp_path / "out"
    repo.checkout(output=out)
    assert sha(out / "ckpt" / "w.safetensors") == sha(src / "w.safetensors")
    assert (out / "notes.txt").read_bytes() == b"plain bytes\x00\xff"
    assert repo.read_file("notes.txt") == b"plain bytes\x00\xff"
    assert repo.file_info()["notes.txt"]["format"] == "bytes"


def test_versions_keep_unnamed_files_unless_exact_and_log_is_like_the_cli(repo):
    repo.commit({"a.safetensors": sample(0), "b.safetensors": sample(1)}, "two files", tags=["first"])
    repo.commit({"a.safetensors": sample(3)}, "a changes")
    assert repo.files() == ["a.safetensors", "b.safetensors"]
    repo.commit({"c.safetensors": sample(4)}, "only c", exact=True)
    assert repo.files() == ["c.safetensors"]
    log = repo.log()
    assert [v["message"] for v in log] == ["only c", "a changes", "two files"]
    assert set(log[0]) >= {"id", "parents", "date", "time", "message", "files", "raw_bytes", "stored_bytes",
                           "stored_now_bytes", "refs"}
    assert log[0]["parents"] == [log[1]["id"]]
    assert "tag: first" in log[2]["refs"] and "HEAD -> main" in log[0]["refs"]
    assert repo.tags() == {"first": log[2]["id"]}
    # Older versions stay readable.
    assert_same_tensors(repo.load("first", "b.safetensors"), sample(1))
    assert_same_tensors(repo.load("HEAD~1", "a.safetensors"), sample(3))


def test_deltas_apply_between_dict_commits(repo):
    base = sample(0)
    first = repo.commit({"model.safetensors": base}, "v1")
    nudged = dict(base)
    nudged["encoder.weight"] = base["encoder.weight"].copy()
    nudged["encoder.weight"][0, :5] += 1e-3
    repo.commit({"model.safetensors": nudged}, "v2")
    repo.commit({"model.safetensors": nudged}, "v3: unchanged")
    log = {v["message"]: v for v in repo.log()}
    assert log["v3: unchanged"]["stored_bytes"] < 1000  # dedup: only a version object
    assert_same_tensors(repo.load(first), base)
    assert_same_tensors(repo.load(), nudged)


def test_prune_keeps_the_newest_versions_and_a_tagged_one(repo):
    ids = [repo.commit({"model.safetensors": sample(i)}, f"epoch {i}") for i in range(5)]
    repo.tag("best", ids[1])
    dry = repo.prune(2, dry_run=True, grace_seconds=0)
    assert [v["id"] for v in dry["dropped"]] == [ids[2], ids[0]]
    assert [v["id"] for v in repo.log()] == ids[::-1]
    report = repo.prune(2, branches="main", grace_seconds=0)
    # The tag keeps its version, not the history before it.
    assert [v["id"] for v in report["dropped"]] == [ids[2], ids[0]]
    assert [(k["id"], k["root"]) for k in report["kept_by"]] == [(ids[1], "refs/tags/best")]
    assert report["gc"]["bytes_freed"] > 0
    assert [v["id"] for v in repo.log()] == [ids[4], ids[3]]
    assert_same_tensors(repo.load(ids[3]), sample(3))
    assert_same_tensors(repo.load("best"), sample(1))
    with pytest.raises(ckpt.CkptError, match="dropped by `ckpt prune`"):
        repo.load(ids[2])
    # A wrong argument (test_arguments.py), as `Writer(keep_last=0)`.
    with pytest.raises(ValueError, match="keep_last: expected at least 1, got 0"):
        repo.prune(0)


def test_background_commit_returns_a_handle_and_the_next_commit_waits(repo):
    handles = [repo.commit({"model.safetensors": sample(i)}, f"epoch {i}", background=True) for i in range(3)]
    ids = [h.wait() for h in handles]
    assert all(h.done() for h in handles)
    log = repo.log()
    assert [v["id"] for v in log] == ids[::-1]
    assert [v["message"] for v in log] == ["epoch 2", "epoch 1", "epoch 0"]
    for i, vid in enumerate(ids):
        assert_same_tensors(repo.load(vid), sample(i))


def test_the_tensors_are_captured_before_a_background_commit_returns(repo):
    tensors = sample(5)
    expected = {k: v.copy() for k, v in tensors.items()}
    handle = repo.commit({"model.safetensors": tensors}, "captured", background=True)
    for v in tensors.values():
        v[...] = 0  # the training loop moves on and overwrites its tensors
    handle.wait()
    assert_same_tensors(repo.load(), expected)


def test_a_failing_background_commit_raises_from_wait(repo):
    repo.commit({"ok.safetensors": sample(0)}, "ok")
    handle = repo.commit({"broken.safetensors": b"not a safetensors file"}, "broken", background=True)
    with pytest.raises(ckpt.CkptError, match="broken.safetensors: invalid safetensors file"):
        handle.wait()
    with pytest.raises(ckpt.CkptError, match="broken.safetensors"):
        handle.wait()  # every time
    # Delivered by wait(): the next call goes on, and nothing of the failed commit was stored.
    assert [v["message"] for v in repo.log()] == ["ok"]


def test_a_failing_background_commit_is_raised_by_wait_when_nobody_else_did(repo):
    repo.commit({"broken.safetensors": b"\x00" * 3}, "broken", background=True)
    # The next commit is not stopped by it (see test_trust.py) ...
    repo.commit({"ok.safetensors": sample(0)}, "next")
    # ... and Repo.wait() raises it, once.
    with pytest.raises(ckpt.CkptError, match="background commit 'broken' in .* failed: broken.safetensors"):
        repo.wait()
    repo.wait()
    assert [v["message"] for v in repo.log()] == ["next"]


def test_a_background_commit_does_not_hold_the_gil(repo):
    big = {"w": np.random.default_rng(0).standard_normal((2048, 1024)).astype(np.float32)}
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            stop.wait(0.001)

    t = threading.Thread(target=tick)
    t.start()
    handle = repo.commit({"big.safetensors": big}, "big", background=True)
    before = len(ticks)
    handle.wait()
    stop.set()
    t.join()
    # The Python thread kept running while the commit coded 8 MiB.
    assert len(ticks) > before


def test_torch_save_fixtures_are_stored_by_storage_and_checked_out_bit_exactly(repo, tmp_path, fixtures):
    names = ["model_epoch1.pt", "optimizer_epoch1.pt", "lightning.ckpt", "dtypes.pt", "shared.pt", "legacy.pt"]
    repo.commit({n: fixtures / n for n in names}, "fixtures")
    info = repo.file_info()
    assert info["model_epoch1.pt"]["format"] == "torch"
    assert info["optimizer_epoch1.pt"]["format"] == "torch"
    repo.commit({"model_epoch1.pt": fixtures / "model_epoch2.pt"}, "epoch 2 under the same name")
    out = tmp_path / "out"
    repo.checkout("HEAD~1", output=out)
    for n in names:
        assert sha(out / n) == sha(fixtures / n), n
    out2 = tmp_path / "out2"
    repo.checkout("HEAD", output=out2, files=["model_epoch1.pt"])
    assert sha(out2 / "model_epoch1.pt") == sha(fixtures / "model_epoch2.pt")
    # The storages read from the store are the archive's bytes.
    storages = repo.load("HEAD", "optimizer_epoch1.pt")
    assert storages
    import zipfile

    archive = zipfile.ZipFile(fixtures / "optimizer_epoch1.pt")
    data = {n for n in archive.namelist() if "/data/" in n}
    blobs = sorted(a.tobytes() for a in storages.values())
    assert blobs == sorted(archive.read(n) for n in data)


def test_a_pickle_that_would_run_code_is_stored_as_bytes_and_nothing_runs(repo, tmp_path, fixtures):
    marker = "/tmp/ckpt-torch-fixture-was-executed"
    if os.path.exists(marker):
        os.unlink(marker)
    repo.commit({"evil.pt": fixtures / "malicious.pt"}, "evil")
    assert repo.file_info()["evil.pt"]["format"] == "bytes"
    repo.checkout(output=tmp_path / "out")
    assert sha(tmp_path / "out" / "evil.pt") == sha(fixtures / "malicious.pt")
    assert not os.path.exists(marker)


@pytest.mark.parametrize("damage", ["truncated", "cut_central_directory", "flipped"])
def test_damaged_archives_are_stored_as_they_are(repo, tmp_path, fixtures, damage):
    data = bytearray((fixtures / "model_epoch1.pt").read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "cut_central_directory":
        data = data[:-30]
    else:
        for i in range(0, len(data), 97):
            data[i] ^= 0x5A
    path = tmp_path / "damaged.pt"
    path.write_bytes(bytes(data))
    repo.commit({"damaged.pt": path}, damage)
    repo.checkout(output=tmp_path / "out")
    assert (tmp_path / "out" / "damaged.pt").read_bytes() == bytes(data)


def test_errors_are_ckpt_errors_with_the_cli_message(repo, tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(ckpt.CkptError, match="not a ckpt repository"):
        ckpt.Repo(tmp_path / "plain")
    with pytest.raises(ckpt.CkptError, match="unknown revision"):
        repo.load("nosuchrev")
    with pytest.raises(ckpt.CkptError, match="nothing to commit"):
        repo.commit({}, "empty")
    with pytest.raises(TypeError, match="dtype complex64 is not supported"):  # an argument
        repo.commit({"c.safetensors": {"z": np.zeros(2, np.complex64)}}, "complex")
    with pytest.raises(ckpt.CkptError, match=r"\.\.' component|outside"):
        repo.commit({"../escape.safetensors": sample(0)}, "escape")
    with pytest.raises(ckpt.CkptError, match="No such file"):
        repo.commit({"x.bin": tmp_path / "missing.bin"}, "missing")
    assert issubclass(ckpt.CkptError, Exception)
    assert repo.log() == []
    repo.commit({"a.safetensors": sample(0)}, "ok", tags=["t"])
    with pytest.raises(ckpt.CkptError, match='tag "t" already exists'):
        repo.commit({"a.safetensors": sample(1)}, "again", tags=["t"])
    assert len(repo.log()) == 1  # refused before committing
    binary = ckpt_binary()
    if binary is None:
        pytest.skip("no ckpt binary built to compare messages with")
    cli = subprocess.run([binary, "log", "nosuchrev"], cwd=repo.root, capture_output=True, text=True)
    assert cli.returncode != 0
    with pytest.raises(ckpt.CkptError) as python:
        repo.log("nosuchrev")
    assert cli.stderr.strip() == f"error: {python.value}"


def test_callbacks_import_without_their_frameworks():
    import ckpt.lightning
    import ckpt.transformers

    assert callable(ckpt.transformers.CkptCallback)
    assert callable(ckpt.lightning.CkptCallback)


def test_transformers_callback_commits_each_checkpoint_folder(tmp_path):
    from types import SimpleNamespace

    from ckpt.transformers import CkptCallback

    out = tmp_path / "out"
    callback = CkptCallback()
    args = SimpleNamespace(output_dir=str(out))
    weights = sample(0)
    for step in (10, 20):
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        weights["encoder.weight"] = weights["encoder.weight"].copy()
        weights["encoder.weight"][step % 7, :4] += np.float32(1e-3)
        st_save_file(weights, str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        state = SimpleNamespace(global_step=step, is_world_process_zero=True)
        control = object()
        assert callback.on_save(args, state, control) is control
        if step == 10:
            import shutil

            shutil.rmtree(folder)  # save_total_limit: the trainer deletes old folders
    repo = ckpt.Repo(out)
    log = repo.log()
    assert [v["message"] for v in log] == ["step 20", "step 10"]
    assert repo.tags() == {"step-10": log[1]["id"], "step-20": log[0]["id"]}
    assert repo.files("step-10") == ["model.safetensors", "trainer_state.json"]
    restored = tmp_path / "restored"
    repo.checkout("step-10", output=restored)
    assert json.loads((restored / "trainer_state.json").read_text()) == {"global_step": 10}
    # The second checkpoint is a delta against the first (same file name in the version).
    assert log[0]["stored_bytes"] < log[1]["stored_bytes"] / 2
    # Other events are accepted without transformers.
    callback.on_epoch_end(args, state, control)


def test_lightning_callback_commits_each_saved_checkpoint_file(tmp_path, fixtures):
    import shutil
    from types import SimpleNamespace

    from ckpt.lightning import CkptCallback

    root = tmp_path / "lightning"
    (root / "ckpts").mkdir(parents=True)
    checkpointer = SimpleNamespace(last_model_path="", best_model_path="", best_k_models={})
    trainer = SimpleNamespace(default_root_dir=str(root), global_step=0, is_global_zero=True,
                              checkpoint_callbacks=[checkpointer])
    callback = CkptCallback()
    for step, source in ((100, "model_epoch1.pt"), (200, "model_epoch2.pt")):
        trainer.global_step = step
        callback.on_save_checkpoint(trainer, None, {})
        path = root / "ckpts" / f"epoch={step // 100}-step={step}.ckpt"
        shutil.copy(fixtures / source, path)  # Lightning writes the file after the hook
        checkpointer.best_model_path = str(path)
        callback.on_train_epoch_start(trainer, None)
        callback.on_train_batch_start(trainer, None, None, 0)  # nothing new: no second version
    callback.on_fit_end(trainer, None)
    repo = ckpt.Repo(root)
    log = repo.log()
    assert [v["message"] for v in log] == ["step 200", "step 100"]
    assert set(repo.tags()) == {"step-100", "step-200"}
    assert repo.files("step-100") == ["epoch=1-step=100.ckpt"]
    assert repo.file_info("step-200")["epoch=2-step=200.ckpt"]["format"] == "torch"
    repo.checkout("step-100", output=tmp_path / "out")
    assert sha(tmp_path / "out" / "epoch=1-step=100.ckpt") == sha(fixtures / "model_epoch1.pt")
    callback.on_validation_end(trainer, None)  # any other hook is accepted without Lightning


def test_a_script_that_ends_right_after_a_background_commit_keeps_it(tmp_path):
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import numpy as np, ckpt
        repo = ckpt.Repo.init({str(tmp_path / 'r')!r})
        repo.commit({{"m.safetensors": {{"w": np.ones((512, 512), np.float32)}}}}, "last", background=True)
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    assert [v["message"] for v in ckpt.Repo(tmp_path / "r").log()] == ["last"]


def test_reused_capture_buffers_never_change_a_commit_in_flight(tmp_path):
    repo = ckpt.Repo.init(tmp_path / "r", reuse_buffers=True)
    rng = np.random.default_rng(7)
    states = []
    for i in range(4):
        state = {"w": rng.standard_normal((256, 1024)).astype(np.float32), "step": np.array(i)}
        if i == 2:
            state["w"] = state["w"][:100]  # a smaller capture into the kept memory
        states.append(state)
        repo.commit({"m.safetensors": state}, f"step {i}", background=True)
    repo.wait()
    for i, state in enumerate(states):
        assert_same_tensors(repo.load(f"HEAD~{3 - i}"), state)
    same_again = ckpt.Repo(tmp_path / "r")  # reuse is off by default
    same_again.commit({"m.safetensors": states[0]}, "again")
    assert_same_tensors(same_again.load(), states[0])


def test_commits_from_several_threads_are_all_kept(tmp_path):
    repo = ckpt.Repo.init(tmp_path / "r", reuse_buffers=True)
    states = {i: sample(i) for i in range(6)}
    errors = []

    def worker(i):
        try:
            repo.commit({"m.safetensors": states[i]}, f"thread {i}", background=True)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    repo.wait()
    assert errors == []
    log = repo.log()
    assert len(log) == 6
    for v in log:
        i = int(v["message"].split()[1])
        assert_same_tensors(repo.load(v["id"]), states[i])


def test_dcp_module_imports_without_torch():
    """`ckpt.dcp` imports torch only when a Writer or Reader is made."""
    import sys

    code = "import sys, ckpt.dcp; assert 'torch' not in sys.modules; print(ckpt.dcp.__all__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "Writer" in out.stdout
