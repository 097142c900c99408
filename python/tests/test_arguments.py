"""Wrong arguments raise Python's TypeError / ValueError (as Python's own functions do), never
CkptError, which is for operations that fail (a missing revision, an existing tag, damage), and
nothing is committed. Also: the package ships its type stubs."""

import pathlib

import numpy as np
import pytest

import ckpt
from ckpt import _native


def small(v=1.0):
    return {"w": np.full((4, 4), v, np.float32)}


def committed(repo):
    return [v["message"] for v in repo.log()]


TYPE_ERRORS = [
    # (what is wrong, call on the repository, expected message)
    ("files not a dict", lambda r: r.commit(["m.safetensors"], "m"), "files: expected a dict"),
    ("message not a str", lambda r: r.commit({"m.safetensors": small()}, 3), "message: expected a str"),
    ("a path not a str", lambda r: r.commit({3: small()}, "m"), "repository paths must be str"),
    ("a source of no kind", lambda r: r.commit({"m.bin": 3.5}, "m"), "expected a path on disk, a dict"),
    ("a tensor name not a str", lambda r: r.commit({"m.safetensors": {1: np.zeros(2)}}, "m"), "names must be str"),
    ("a tensor not an array", lambda r: r.commit({"m.safetensors": {"w": "text"}}, "m"), "expected a numpy array"),
    (
        "a dtype safetensors has not",
        lambda r: r.commit({"m.safetensors": {"w": np.zeros(2, np.complex128)}}, "m"),
        "dtype complex128 is not supported",
    ),
    ("tags of bytes", lambda r: r.commit({"m.safetensors": small()}, "m", tags=b"t"), "tags: expected a str"),
    ("a tag not a str", lambda r: r.commit({"m.safetensors": small()}, "m", tags=["ok", 3]), "got an item 3"),
    (
        "metadata not a dict",
        lambda r: r.commit({"m.safetensors": small()}, "m", metadata=["k"]),
        "metadata: expected a dict",
    ),
    (
        "metadata of a path not a dict",
        lambda r: r.commit({"m.safetensors": small()}, "m", metadata={"m.safetensors": 3}),
        "expected a dict of str -> str",
    ),
    ("a tag name not a str", lambda r: r.tag(3), "tag name: expected a str"),
    ("names of a load not str", lambda r: r.load(names=[1]), "names: expected a str or a list of str"),
    ("files of a checkout not paths", lambda r: r.checkout(files=3), "files: expected a str or a list of str"),
    # Checked by the extension's argument conversion.
    ("a revision not a str", lambda r: r.resolve(3), None),
    ("a read_file path not a str", lambda r: r.read_file(3), None),
    ("a flag not a bool", lambda r: r.commit({"m.safetensors": small()}, "m", background="no"), "background: expected"),
    ("keep_last not an int", lambda r: r.prune(1.5), "keep_last: expected an int"),
    ("keep_last a bool", lambda r: r.prune(True), "keep_last: expected an int"),
    ("dry_run not a bool", lambda r: r.prune(1, dry_run="yes"), "dry_run: expected True or False"),
    ("branches of bytes", lambda r: r.prune(1, branches=b"main"), "branches: expected a str"),
    ("a framework not a str", lambda r: r.load(framework=None), "framework: expected 'numpy'"),
    # A callback's arguments, when it is made (not at its first checkpoint).
    ("a Lightning callback's repo", lambda r: _callback("lightning", repo=5), "repo: expected a ckpt.Repo"),
    ("a Trainer callback's repo", lambda r: _callback("transformers", repo=5), "repo: expected a ckpt.Repo"),
    ("a callback's flag", lambda r: _callback("lightning", background="no"), "background: expected True"),
]

VALUE_ERRORS = [
    (
        "metadata for a file not in the commit",
        lambda r: r.commit({"m.safetensors": small()}, "m", metadata={"o.safetensors": {"k": "v"}}),
        "is not a dict of tensors in this commit",
    ),
    ("an unknown framework", lambda r: r.load(framework="jax"), "framework 'jax'"),
    ("a negative timeout", lambda r: r.wait(timeout=-1), "timeout -1"),
    # `Writer(keep_last=0)` says the same; `prune(-1)` used to raise OverflowError, `prune(0)`
    # CkptError.
    ("keep no version", lambda r: r.prune(0), "keep_last: expected at least 1, got 0"),
    ("keep fewer than none", lambda r: r.prune(-1), "keep_last: expected at least 1, got -1"),
]


def _callback(module, **kwargs):
    import importlib

    return importlib.import_module(f"ckpt.{module}").CkptCallback(**kwargs)


@pytest.mark.parametrize("what,call,text", TYPE_ERRORS, ids=[c[0] for c in TYPE_ERRORS])
def test_wrong_argument_types_raise_type_error(repo, what, call, text):
    repo.commit({"m.safetensors": small(0)}, "first")
    with pytest.raises(TypeError, match=text) as e:
        call(repo)
    assert not isinstance(e.value, ckpt.CkptError), what
    assert committed(repo) == ["first"]


@pytest.mark.parametrize("what,call,text", VALUE_ERRORS, ids=[c[0] for c in VALUE_ERRORS])
def test_wrong_argument_values_raise_value_error(repo, what, call, text):
    repo.commit({"m.safetensors": small(0)}, "first")
    with pytest.raises(ValueError, match=text) as e:
        call(repo)
    assert not isinstance(e.value, ckpt.CkptError), what
    assert committed(repo) == ["first"]


def test_the_extension_checks_its_own_arguments(repo, tmp_path):
    native = _native.Repo.init(str(tmp_path / "native"))
    with pytest.raises(ValueError, match="dtype C64 is not supported"):
        native.prepare("m.safetensors", [("w", "C64", [2])])
    with pytest.raises(TypeError, match="expected a path on disk or a tensor image, got float"):
        native.commit([("m.bin", 1.5)], "m")
    with pytest.raises(TypeError):
        native.commit("not a list", "m")
    with pytest.raises(TypeError):
        native.prepare_bytes("m.bin", "not bytes")
    handle = native.commit([("m.bin", native.prepare_bytes("m.bin", b"x"))], "m", background=True)
    with pytest.raises(ValueError, match="expected seconds >= 0"):
        handle.wait(timeout=-1.0)
    assert len(handle.wait()) == 64


def test_operations_that_fail_still_raise_ckpt_error(repo):
    with pytest.raises(ckpt.CkptError, match="unknown revision"):
        repo.resolve("nosuchrev")
    with pytest.raises(ckpt.CkptError, match="nothing to commit"):
        repo.commit({}, "empty")


def test_the_package_ships_its_type_stubs():
    package = pathlib.Path(ckpt.__file__).parent
    assert (package / "py.typed").is_file()
    stub = (package / "_native.pyi").read_text()
    # Every public name of the extension is declared in the stub.
    public = {n for n in dir(_native) if not n.startswith("_")}
    for name in public:
        assert f"class {name}" in stub or f"def {name}(" in stub or f"\n{name}: " in stub, name
    for cls in (_native.Repo, _native.CommitHandle, _native.MemoryImage):
        for name in (n for n in vars(cls) if not n.startswith("_")):
            assert f"def {name}(" in stub, f"{cls.__name__}.{name}"


def test_a_wrong_flag_of_repo_init_creates_no_repository(tmp_path):
    with pytest.raises(TypeError, match="reuse_buffers: expected True or False, got str"):
        ckpt.Repo.init(tmp_path / "r", reuse_buffers="yes")
    assert not (tmp_path / "r").exists()


# ---- with torch (skipped without it): ckpt.torch and ckpt.dcp ----------------------------------


def _torch():
    return pytest.importorskip("torch")


def _linear():
    torch = _torch()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _writer(*args, **kwargs):
    _torch()
    import ckpt.dcp

    return ckpt.dcp.Writer(*args, **kwargs)


def _reader(*args, **kwargs):
    _torch()
    import ckpt.dcp

    return ckpt.dcp.Reader(*args, **kwargs)


def _save(*args, **kwargs):
    _torch()
    import ckpt.torch

    return ckpt.torch.save(*args, **kwargs)


def _load(*args, **kwargs):
    _torch()
    import ckpt.torch

    return ckpt.torch.load(*args, **kwargs)


TORCH_TYPE_ERRORS = [
    # (what is wrong, call on the repository, expected message)
    ("a model of no state", lambda r: _save(r, model=5), "model: expected an object with a state_dict"),
    ("an optimizer of no state", lambda r: _save(r, model=_linear()[0], optimizer="x"), "optimizer: expected"),
    ("a scheduler of no state", lambda r: _save(r, scheduler=[1]), "scheduler: expected"),
    ("a repository as a path", lambda r: _save(r.root, model=_linear()[0]), "repo: expected a ckpt.Repo"),
    ("a save message not a str", lambda r: _save(r, model=_linear()[0], message=5), "message: expected a str"),
    ("a save flag not a bool", lambda r: _save(r, model=_linear()[0], background="no"), "background: expected"),
    ("a model to load into of no state", lambda r: _load(r, model=5), "model: expected an object with a load_state"),
    ("an optimizer to load into", lambda r: _load(r, optimizer="x"), "optimizer: expected an object"),
    ("a repository to load from as a path", lambda r: _load(r.root), "repo: expected a ckpt.Repo"),
    ("a revision to load not a str", lambda r: _load(r, 3), "rev: expected a str"),
    ("a strict flag not a bool", lambda r: _load(r, model=_linear()[0], strict="no"), "strict: expected True or False"),
    # ckpt.dcp: when the Writer or Reader is made, not inside `dcp.save` / `dcp.load`.
    ("a Writer's message", lambda r: _writer(r.root, message=5), "message: expected a str or None, got int"),
    ("a Writer's branch", lambda r: _writer(r.root, branch=5), "branch: expected a str or None, got int"),
    ("a Writer's tags of bytes", lambda r: _writer(r.root, tags=b"best"), "tags: expected a str or a list"),
    ("a Writer's tag not a str", lambda r: _writer(r.root, tags=["best", 3]), "got an item 3"),
    ("a Writer's layout not a str", lambda r: _writer(r.root, layout=None), "layout: expected a str"),
    ("a Writer's endpoint", lambda r: _writer("s3://b/run", endpoint=5), "endpoint: expected a str or None"),
    ("a Writer's allow_http", lambda r: _writer("s3://b/run", allow_http="false"), "allow_http: expected True"),
    ("a Writer's keep_last a bool", lambda r: _writer(r.root, keep_last=True), "keep_last: expected an int"),
    ("a Writer's keep_last a float", lambda r: _writer(r.root, keep_last=1.5), "keep_last: expected an int"),
    ("a Writer's cache", lambda r: _writer("s3://b/run", cache=5), "cache: expected None, False or a directory"),
    ("a Reader's revision", lambda r: _reader(r.root, rev=3), "rev: expected a str, got int"),
    ("a Reader's trust", lambda r: _reader(r.root, trust_metadata="no"), "trust_metadata: expected True or False"),
    ("a Reader's region", lambda r: _reader("s3://b/run", region=5), "region: expected a str or None"),
]

TORCH_VALUE_ERRORS = [
    ("a layout for a repository", lambda r: _writer(r.root, layout="bogus"), 'unknown remote layout "bogus"'),
    ("a layout for a remote", lambda r: _writer("s3://b/run", layout="bogus"), 'unknown remote layout "bogus"'),
    ("a Writer's keep_last of 0", lambda r: _writer(r.root, keep_last=0), "keep_last: expected at least 1, got 0"),
    ("a Writer's keep_last of -1", lambda r: _writer(r.root, keep_last=-1), "keep_last: expected at least 1"),
]


@pytest.mark.parametrize("what,call,text", TORCH_TYPE_ERRORS, ids=[c[0] for c in TORCH_TYPE_ERRORS])
def test_wrong_argument_types_of_the_torch_modules_raise_type_error_at_the_call(repo, what, call, text):
    model, optimizer = _linear()
    _save(repo, model=model, optimizer=optimizer, message="first")
    with pytest.raises(TypeError, match=text) as e:
        call(repo)
    assert not isinstance(e.value, ckpt.CkptError), what
    assert committed(repo) == ["first"]


@pytest.mark.parametrize("what,call,text", TORCH_VALUE_ERRORS, ids=[c[0] for c in TORCH_VALUE_ERRORS])
def test_wrong_argument_values_of_the_torch_modules_raise_value_error_at_the_call(repo, what, call, text):
    model, optimizer = _linear()
    _save(repo, model=model, optimizer=optimizer, message="first")
    with pytest.raises(ValueError, match=text) as e:
        call(repo)
    assert not isinstance(e.value, ckpt.CkptError), what
    assert committed(repo) == ["first"]


def test_a_dcp_writer_takes_a_string_of_tags_as_one_name(repo, monkeypatch):
    """`Writer(tags="best")` made four tags (b, e, s, t), and the next save's `tags="best2"` was
    then refused (`tag "b" already exists`): a loop tagging `f"step-{n}"` lost every save after
    its first."""
    torch = _torch()
    import torch.distributed.checkpoint as dcp

    monkeypatch.setenv("CKPT_COMPACT", "manual")  # no background process left behind
    for n, tag in enumerate(("best", "best2")):
        writer = _writer(repo.root, message=f"save {n}", tags=tag)
        dcp.save({"w": torch.full((8, 4), float(n))}, storage_writer=writer)
    assert committed(repo) == ["save 1", "save 0"]
    ids = [v["id"] for v in repo.log()]
    assert repo.tags() == {"best": ids[1], "best2": ids[0]}


def test_the_checks_take_what_the_calls_take(repo):
    """No false refusal: numpy's bools are flags (as the extension takes them), a path object
    is a callback's repository, a str is one branch."""
    repo.commit({"m.safetensors": small(0)}, "first")
    repo.commit({"m.safetensors": small(1)}, "second", background=np.True_).wait()
    report = repo.prune(1, branches="main", dry_run=np.bool_(True), grace_seconds=0)
    assert len(report["dropped"]) == 1 and committed(repo) == ["second", "first"]
    assert _callback("lightning", repo=pathlib.Path(repo.root), background=np.False_) is not None
    assert _callback("transformers", repo=repo) is not None


def test_a_dcp_writer_refuses_an_invalid_name_when_it_is_made(repo):
    """As `Repo.commit` refuses an invalid tag name at its call (CkptError, the CLI's message),
    not on every rank inside `dcp.save`; `tags=""` is one (empty, invalid) name, as there."""
    for tags, branch in (("", None), ("a b", None), (["ok", "-x"], None), ((), "a/b"), ((), "")):
        with pytest.raises(ckpt.CkptError, match="invalid name"):
            _writer(repo.root, tags=tags, branch=branch)
    with pytest.raises(ckpt.CkptError, match="invalid name"):
        repo.commit({"m.bin": b"x"}, "m", tags="")
    assert _writer(repo.root, tags="step-1", branch="run.2").tags == ["step-1"]
