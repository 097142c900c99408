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
]

VALUE_ERRORS = [
    (
        "metadata for a file not in the commit",
        lambda r: r.commit({"m.safetensors": small()}, "m", metadata={"o.safetensors": {"k": "v"}}),
        "is not a dict of tensors in this commit",
    ),
    ("an unknown framework", lambda r: r.load(framework="jax"), "framework 'jax'"),
    ("a negative timeout", lambda r: r.wait(timeout=-1), "timeout -1"),
]


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
