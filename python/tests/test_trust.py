"""Issue 24, the Python package: background commits survive exit and fork, each stands alone, a
commit that raises wrote nothing, single strings are single items, paths are captured at the call,
Lightning's save_last keeps the top-k file, and waits take a timeout. No torch needed."""

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file as st_save_file

import ckpt

HERE = os.path.dirname(os.path.abspath(__file__))


def big(seed=0, mib=24):
    """Random float32 tensors of `mib` MiB: a commit of them takes a while (no dedup, no delta)."""
    rng = np.random.default_rng(seed)
    n = mib * (1 << 20) // 4 // 4
    return {f"layer{i}.weight": rng.standard_normal(n).astype(np.float32) for i in range(4)}


def small(seed=0):
    return {"w": np.full((16, 16), seed, np.float32), "step": np.array(seed)}


def messages(repo, rev="HEAD"):
    return [v["message"] for v in repo.log(rev)]


def run_script(body, timeout=60):
    """Runs `body` in a new interpreter that imports this ckpt; returns the CompletedProcess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(ckpt.__file__)),
                                                      env.get("PYTHONPATH", "")] if p)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def wait_until_locked(root, limit=30.0):
    """Returns once a writer holds the repository's lock (probed with a shared lock that is let go
    at once), i.e. a commit is in its write."""
    deadline = time.monotonic() + limit
    with open(os.path.join(root, ".ckpt", "lock"), "a") as f:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return
            fcntl.flock(f, fcntl.LOCK_UN)
            time.sleep(0.001)
    raise AssertionError("no commit took the lock")


def reap(pid, limit):
    """The exit status of child `pid`, or None if it has not exited within `limit` seconds (then
    it is killed)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


# ---- 1. a background commit through a temporary Repo is kept at exit ----------------------------


def test_background_commits_through_temporary_repos_are_kept_at_exit(tmp_path):
    d = tmp_path / "r"
    ckpt.Repo.init(d)
    result = run_script(f"""
        import gc, numpy as np, ckpt
        rng = np.random.default_rng(1)
        def weights():
            return {{"w": rng.standard_normal(6 << 20).astype(np.float32)}}
        def save_in_a_function():
            ckpt.Repo({str(d)!r}).commit({{"a.safetensors": weights()}}, "in a function", background=True)
        save_in_a_function()
        gc.collect()
        ckpt.Repo({str(d)!r}).commit({{"b.safetensors": weights()}}, "temporary", background=True)
        gc.collect()
    """)
    assert result.returncode == 0, result.stderr
    repo = ckpt.Repo(d)
    assert messages(repo) == ["temporary", "in a function"]
    assert repo.files() == ["a.safetensors", "b.safetensors"]


def test_commits_of_one_repository_through_several_repo_objects_keep_their_order(tmp_path):
    d = tmp_path / "r"
    ckpt.Repo.init(d)
    handles = [ckpt.Repo(d).commit({"m.safetensors": big(i, 4)}, f"v{i}", background=True) for i in range(3)]
    ckpt.Repo(d).wait()
    repo = ckpt.Repo(d)
    assert messages(repo) == ["v2", "v1", "v0"]
    assert [h.wait() for h in handles] == [v["id"] for v in repo.log()][::-1]


# ---- 2. fork ------------------------------------------------------------------------------------


def test_a_fork_during_a_background_commit_does_not_hand_the_lock_to_the_child(tmp_path):
    repo = ckpt.Repo.init(tmp_path / "r")
    handle = repo.commit({"m.safetensors": big(0)}, "forked during", background=True)
    wait_until_locked(repo.root)
    pid = os.fork()
    if pid == 0:  # a DataLoader worker: lives on, holding copies of the parent's descriptors
        time.sleep(30)
        os._exit(0)
    try:
        handle.wait(timeout=60)
        # The lock is free as soon as the parent's commit is done, although the child lives.
        nxt = repo.commit({"m.safetensors": small(1)}, "next", background=True)
        assert nxt.wait(timeout=20)
        repo.commit({"m.safetensors": small(2)}, "and the next")
        assert messages(repo) == ["and the next", "next", "forked during"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_forked_child_that_exits_normally_does_not_wait_for_the_parents_commits(tmp_path):
    d = tmp_path / "r"
    result = run_script(f"""
        import os, sys, time, numpy as np, ckpt
        repo = ckpt.Repo.init({str(d)!r})
        rng = np.random.default_rng(0)
        handle = repo.commit({{"m.safetensors": {{"w": rng.standard_normal(8 << 20).astype(np.float32)}}}},
                             "parent", background=True)
        pid = os.fork()
        if pid == 0:
            # The parent's handle is not the child's to wait for: it says so at once.
            try:
                handle.wait()
                print("child: waited for the parent's commit")
            except ckpt.CkptError as e:
                print("child:", e)
            ckpt.wait(timeout=5)  # nothing of its own
            sys.exit(0)  # a normal exit: the at-exit wait runs here
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("child exit", os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            print("child hung")
        print("parent:", len(handle.wait()))
    """)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert 'child: the background commit "parent" runs in process' in out, out
    assert "child exit 0" in out, out
    assert "parent: 64" in out, out
    assert messages(ckpt.Repo(d)) == ["parent"]


def test_a_forked_child_commits_on_its_own(tmp_path):
    repo = ckpt.Repo.init(tmp_path / "r")
    repo.commit({"m.safetensors": big(0, 4)}, "parent before")  # the parent's threads are in use
    handle = repo.commit({"m.safetensors": big(1, 4)}, "parent during", background=True)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            child = repo.commit({"c.safetensors": small(7)}, "child", background=True)
            child.wait(timeout=30)
            repo.commit({"c.safetensors": small(8)}, "child again")
            ckpt.wait(timeout=30)
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported through the exit status
            print("child failed:", repr(e), file=sys.stderr)
        finally:
            os._exit(code)
    status = reap(pid, 60)
    handle.wait()
    assert status == 0
    log = messages(repo)
    assert set(log) == {"parent before", "parent during", "child", "child again"}
    assert log.index("child again") < log.index("child")
    assert repo.load("HEAD", "c.safetensors")["w"][0, 0] == 8


# ---- 3. each background commit stands alone; the exit status tells of a failure -----------------


def test_a_failed_background_commit_never_costs_the_next_one(repo, caplog):
    caplog.set_level(logging.ERROR, logger="ckpt")
    broken = repo.commit({"broken.safetensors": b"not safetensors"}, "broken", background=True)
    nxt = repo.commit({"m.safetensors": small(1)}, "next", background=True)  # does not raise
    assert len(nxt.wait()) == 64
    last = repo.commit({"m.safetensors": small(2)}, "last")
    assert messages(repo) == ["last", "next"]
    assert repo.resolve("HEAD") == last
    # Reported: logged once, raised by the handle's wait(), recorded for Repo.wait() ...
    logged = [r.getMessage() for r in caplog.records if "broken" in r.getMessage()]
    assert len(logged) == 1 and "broken.safetensors: invalid safetensors file" in logged[0]
    assert broken.error is not None and not broken.reported
    with pytest.raises(ckpt.CkptError, match="invalid safetensors"):
        ckpt.wait()
    ckpt.wait()  # ... once
    with pytest.raises(ckpt.CkptError, match="invalid safetensors"):
        broken.wait()  # the handle, every time


def test_the_exit_status_is_1_when_a_background_commit_fails_unreported(tmp_path):
    d = tmp_path / "r"
    result = run_script(f"""
        import ckpt
        repo = ckpt.Repo.init({str(d)!r})
        print("training done")  # buffered: must still come out
        ckpt.Repo({str(d)!r}).commit({{"x.safetensors": b"garbage"}}, "last checkpoint", background=True)
    """)
    assert result.returncode == 1
    assert "training done" in result.stdout
    assert "ckpt: background commit 'last checkpoint' in" in result.stderr
    assert "x.safetensors: invalid safetensors file" in result.stderr
    # One that a wait() raised (and the script handled) is the script's business: status 0.
    result = run_script(f"""
        import ckpt
        repo = ckpt.Repo({str(d)!r})
        repo.commit({{"x.safetensors": b"garbage"}}, "handled", background=True)
        try:
            repo.wait()
        except ckpt.CkptError as e:
            print("handled:", e)
    """)
    assert result.returncode == 0, result.stderr
    assert "handled: background commit 'handled'" in result.stdout


# ---- 4. a commit that raises has written nothing ------------------------------------------------


@pytest.mark.parametrize("background", [False, True])
def test_a_commit_that_raises_writes_no_version(repo, tmp_path, background):
    repo.commit({"m.safetensors": small(0)}, "first", tags=["t"])
    head = repo.resolve("HEAD")
    bad = [
        ({"m.safetensors": small(1)}, {"tags": ["x", "x"]}, 'tag "x" is given twice'),
        ({"m.safetensors": small(1)}, {"tags": ["t"]}, 'tag "t" already exists'),
        ({"m.safetensors": small(1)}, {"tags": ["main"]}, "a branch of that name exists"),
        ({"m.safetensors": small(1)}, {"tags": ["ok", "bad name"]}, "bad name"),
        ({"m.safetensors": small(1)}, {"tags": [""]}, "1 to 200 characters"),
        ({"m.safetensors": small(1), "../out": b"x"}, {}, "out"),
        ({"m.safetensors": small(1), "gone.bin": str(tmp_path / "gone.bin")}, {}, "gone.bin"),
        ({"m.safetensors": small(1), "dir": str(tmp_path)}, {}, "not a regular file"),
        ({"m.safetensors": small(1), "a/b.bin": b"1", "a//b.bin": b"2"}, {}, "empty path component"),
        ({"m.safetensors": small(1)}, {"metadata": {"other.safetensors": {"k": "v"}}}, "metadata"),
        (["m.safetensors"], {}, "expected a dict"),
    ]
    # Wrong arguments are TypeError / ValueError; the others, the operation's CkptError.
    arguments = {"metadata": ValueError, "expected a dict": TypeError}
    for files, kwargs, text in bad:
        # Raised by the call itself, background or not: nothing to wait for.
        with pytest.raises(arguments.get(text, ckpt.CkptError), match=text):
            repo.commit(files, "must not exist", background=background, **kwargs)
        assert repo.resolve("HEAD") == head, (files, kwargs)
        assert set(repo.tags()) == {"t"}
    assert messages(repo) == ["first"]


# ---- 5. a single str is one item ----------------------------------------------------------------


def test_a_single_string_is_one_item_everywhere(repo, tmp_path):
    repo.commit({"a.safetensors": small(1), "b.safetensors": small(2)}, "two", tags="best")
    assert set(repo.tags()) == {"best"}
    out = tmp_path / "out"
    assert repo.checkout("best", output=out, files="a.safetensors") == ["a.safetensors"]
    assert sorted(os.listdir(out)) == ["a.safetensors"]
    out2 = tmp_path / "out2"
    import pathlib

    assert repo.checkout("best", output=out2, files=pathlib.Path("b.safetensors")) == ["b.safetensors"]
    assert list(repo.load("best", "a.safetensors", names="w")) == ["w"]
    for bad in (b"best", 3, {"x": 1}, ["ok", 3]):
        with pytest.raises(TypeError, match="tags: expected a str or a list of str"):
            repo.commit({"a.safetensors": small(3)}, "bad tags", tags=bad)
    assert messages(repo) == ["two"]


# ---- 6. files on disk are captured at the call ---------------------------------------------------


def test_a_background_commit_of_a_path_keeps_the_file_as_it_was_at_the_call(repo, tmp_path):
    deleted, replaced = tmp_path / "deleted.safetensors", tmp_path / "replaced.safetensors"
    st_save_file(small(1), str(deleted))
    st_save_file(small(2), str(replaced))
    handle = repo.commit({"d.safetensors": deleted, "r.safetensors": replaced}, "captured", background=True)
    deleted.unlink()  # save_total_limit
    st_save_file(small(9), str(tmp_path / "new"))
    os.replace(tmp_path / "new", replaced)  # an atomic save over the old file
    handle.wait()
    assert repo.load("HEAD", "d.safetensors")["w"][0, 0] == 1
    assert repo.load("HEAD", "r.safetensors")["w"][0, 0] == 2


def test_a_file_deleted_while_it_is_being_committed_is_committed(repo, tmp_path):
    path = tmp_path / "big.safetensors"
    weights = big(3)
    st_save_file(weights, str(path))
    handle = repo.commit({"big.safetensors": path}, "deleted during", background=True)
    wait_until_locked(repo.root)
    path.unlink()
    handle.wait(timeout=120)
    assert repo.load()["layer2.weight"].tobytes() == weights["layer2.weight"].tobytes()


def test_a_file_rewritten_in_place_after_the_call_fails_its_commit_only(repo, tmp_path):
    path = tmp_path / "m.safetensors"
    st_save_file(small(1), str(path))
    time.sleep(0.01)
    handle = repo.commit({"m.safetensors": path}, "rewritten", background=True)
    with open(path, "r+b") as f:  # in place, same inode: what was asked for is gone
        f.write(b"\0")
    # Caught before the commit reads the file, or while it does: the thread's timing decides.
    caught = "rewritten in place after the commit was asked for|the file changed while it was being committed"
    with pytest.raises(ckpt.CkptError, match=caught):
        handle.wait()
    st_save_file(small(2), str(path))
    repo.commit({"m.safetensors": path}, "next")
    assert messages(repo) == ["next"]


def test_callbacks_in_the_background_survive_deleted_and_rewritten_files(tmp_path, caplog):
    from ckpt.transformers import CkptCallback

    caplog.set_level(logging.WARNING, logger="ckpt")
    out = tmp_path / "out"
    callback = CkptCallback(background=True)
    args = SimpleNamespace(output_dir=str(out))
    control = object()
    for step in (10, 20, 30):
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        st_save_file(small(step), str(folder / "model.safetensors"))
        (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        state = SimpleNamespace(global_step=step, is_world_process_zero=True)
        assert callback.on_save(args, state, control) is control
        if step == 10:
            shutil.rmtree(folder)  # save_total_limit, before the commit read it
        if step == 20:
            with open(folder / "trainer_state.json", "r+") as f:  # rewritten in place
                f.write("{}")
    assert callback.on_train_end(args, state, control) is control  # never raises
    repo = ckpt.Repo(out)
    assert messages(repo) == ["step 30", "step 10"]
    assert repo.load("step-10")["w"][0, 0] == 10
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # The rewrite is caught before the commit reads the file ("rewritten in place") or while it
    # does ("changed while it was being committed"), depending on the background thread's timing.
    assert any(
        "step 20 was not committed" in w
        and ("rewritten in place" in w or "changed while it was being committed" in w)
        for w in warned
    ), warned
    ckpt.wait()  # reported by the callback's warning: nothing left to raise


# ---- 7. Lightning's save_last keeps the top-k file ----------------------------------------------


def test_lightning_save_last_commits_the_top_k_file_and_last(tmp_path, fixtures):
    from ckpt.lightning import CkptCallback

    root = tmp_path / "lightning"
    ckpts = root / "ckpts"
    ckpts.mkdir(parents=True)
    checkpointer = SimpleNamespace(last_model_path="", best_model_path="", best_k_models={},
                                   _last_checkpoint_saved="")
    trainer = SimpleNamespace(default_root_dir=str(root), global_step=0, is_global_zero=True,
                              checkpoint_callbacks=[checkpointer])
    callback = CkptCallback(background=True)
    for step, source in ((100, "model_epoch1.pt"), (200, "model_epoch2.pt")):
        trainer.global_step = step
        callback.on_save_checkpoint(trainer, None, {})
        # ModelCheckpoint(save_top_k=1, save_last=True): the top-k file, then last.ckpt (a copy,
        # rewritten each time); the old top-k file is deleted.
        best = ckpts / f"epoch={step // 100}-step={step}.ckpt"
        shutil.copy(fixtures / source, best)
        for old in list(checkpointer.best_k_models):
            os.unlink(old)
        checkpointer.best_k_models = {str(best): 0.5}
        checkpointer.best_model_path = str(best)
        shutil.copy(fixtures / source, ckpts / "last.ckpt")
        checkpointer.last_model_path = checkpointer._last_checkpoint_saved = str(ckpts / "last.ckpt")
        callback.on_train_epoch_start(trainer, None)
        callback.on_train_batch_start(trainer, None, None, 0)  # nothing new: no second version
    callback.on_fit_end(trainer, None)
    repo = ckpt.Repo(root)
    assert messages(repo) == ["step 200", "step 100"]
    assert repo.files("step-100") == ["epoch=1-step=100.ckpt", "last.ckpt"]
    assert repo.files("step-200") == ["epoch=2-step=200.ckpt", "last.ckpt"]
    out = tmp_path / "out"
    repo.checkout("step-100", output=out)
    for name in ("epoch=1-step=100.ckpt", "last.ckpt"):
        assert (out / name).read_bytes() == (fixtures / "model_epoch1.pt").read_bytes()


# ---- 8. waits take a timeout ---------------------------------------------------------------------


def test_waits_take_a_timeout(repo):
    handle = repo.commit({"m.safetensors": big(5)}, "slow", background=True)
    with pytest.raises(TimeoutError, match="still running"):
        handle.wait(timeout=0)
    with pytest.raises(TimeoutError):
        repo.wait(timeout=0.001)
    with pytest.raises(TimeoutError):
        ckpt.wait(timeout=0)
    with pytest.raises(ValueError):
        handle.wait(timeout=-1)
    assert len(handle.wait(timeout=120)) == 64
    repo.wait(timeout=0)
    ckpt.wait(timeout=0)


def test_a_callback_never_starts_a_second_repository_inside_a_damaged_one(tmp_path):
    """The callbacks make a repository only where there is none: a repository that exists but
    cannot be opened (here its config is not JSON) is an error, not a reason to `init` a nested
    one that the checkpoints would then go to."""
    from ckpt._callbacks import open_or_init

    ckpt.Repo.init(str(tmp_path))
    (tmp_path / ".ckpt" / "config").write_text("{ not json")
    runs = tmp_path / "runs"
    with pytest.raises(ckpt.CkptError, match="config"):
        open_or_init(str(runs), str(runs))
    assert not (runs / ".ckpt").exists()
    # Where there is no repository at all, one is made.
    fresh = tmp_path.parent / (tmp_path.name + "-fresh")
    assert isinstance(open_or_init(None, str(fresh)), ckpt.Repo)
    assert (fresh / ".ckpt").is_dir()
