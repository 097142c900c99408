"""ckpt: version control for machine-learning checkpoints, from Python.

    import ckpt, numpy as np
    repo = ckpt.Repo.init("runs/exp1")            # or ckpt.Repo("runs/exp1"): finds .ckpt upwards
    vid = repo.commit({"model.safetensors": {"w": np.zeros((4, 4), np.float32)}}, "epoch 0")
    tensors = repo.load()                         # {"w": array(...)}, read from the store

A dict of tensors is committed as a safetensors file without writing it to disk first: its bytes
are laid out in memory exactly as ``safetensors.numpy.save_file`` / ``safetensors.torch.save_file``
would write them, so a checkout yields that file. ``background=True`` returns once the bytes are
copied; the commit (coding, deltas, compaction) then runs on a Rust thread without the GIL.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import weakref
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from ckpt._native import CkptError, CommitHandle
from ckpt._native import Repo as _NativeRepo

__all__ = ["Repo", "CkptError", "CommitHandle"]

# numpy dtype name -> safetensors dtype name (little-endian data).
_NUMPY_DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",  # ml_dtypes.bfloat16
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fn": "F8_E4M3",
}

# torch dtype (str) -> safetensors dtype name.
_TORCH_DTYPES = {
    "torch.bool": "BOOL",
    "torch.uint8": "U8",
    "torch.int8": "I8",
    "torch.int16": "I16",
    "torch.uint16": "U16",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int32": "I32",
    "torch.uint32": "U32",
    "torch.float32": "F32",
    "torch.float64": "F64",
    "torch.int64": "I64",
    "torch.uint64": "U64",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e4m3fn": "F8_E4M3",
}

# safetensors dtype name -> numpy dtype used to view the bytes (bf16 and fp8 as raw integers,
# numpy has no such types; framework="pt" reinterprets them).
_NUMPY_VIEW = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
    "F8_E5M2": "uint8",
    "F8_E4M3": "uint8",
}


def _is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _as_bytes_view(name: str, x: Any):
    """(safetensors dtype, shape, 1-D uint8 numpy view of the C-contiguous little-endian bytes)."""
    import numpy as np

    if _is_torch_tensor(x):
        import torch

        dtype = _TORCH_DTYPES.get(str(x.dtype))
        if dtype is None:
            raise CkptError(f"tensor {name!r}: dtype {x.dtype} is not supported")
        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        shape = list(t.shape)
        if t.numel() == 0:
            return dtype, shape, np.empty(0, np.uint8)
        return dtype, shape, t.reshape(-1).view(torch.uint8).numpy()
    if not isinstance(x, np.ndarray):
        if np.isscalar(x) and not isinstance(x, (str, bytes)):
            x = np.asarray(x)
        else:
            raise CkptError(
                f"tensor {name!r}: expected a numpy array or a torch tensor, got {type(x).__name__}"
            )
    dtype = _NUMPY_DTYPES.get(x.dtype.name)
    if dtype is None:
        raise CkptError(f"tensor {name!r}: dtype {x.dtype} is not supported")
    if x.dtype.byteorder == ">":
        x = x.astype(x.dtype.newbyteorder("<"))
    shape = list(x.shape)
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)  # (which makes a 0-d array 1-d: the shape is taken before)
    if x.size == 0:
        return dtype, shape, np.empty(0, np.uint8)
    return dtype, shape, x.reshape(-1).view(np.uint8)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    done = 0
    while done < len(view):
        # One syscall copies straight from the tensor's buffer (Linux caps one write at ~2 GiB).
        n = os.pwrite(fd, view[done : done + (1 << 30)], offset + done)
        if n <= 0:
            raise CkptError(f"writing tensor bytes to memory: pwrite wrote {n}")
        done += n


def _capture(
    native: _NativeRepo,
    path: str,
    tensors: Mapping,
    metadata: Optional[Mapping] = None,
    maps: Optional[Dict[str, Any]] = None,
):
    """Lays out `tensors` as a safetensors file in a memory file and copies their bytes in.

    With `maps` (``reuse_buffers``), the memory file is the previous capture's of this path, and
    it is written through a writable mapping kept in `maps`: the pages are resident and mapped
    already, so the copy is a plain memcpy (``os.pwrite`` costs about twice that: the kernel
    looks up and locks every page)."""
    specs = []
    views = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise CkptError(f"{path}: tensor names must be str, got {name!r}")
        dtype, shape, view = _as_bytes_view(name, value)
        specs.append((name, dtype, shape))
        views.append(view)
    meta = None
    if metadata is not None:
        meta = {str(k): str(v) for k, v in metadata.items()}
    image = native.prepare(path, specs, meta)
    for (start, end), view in zip(image.ranges, views):
        if end - start != view.nbytes:
            raise CkptError(f"{path}: tensor bytes do not match the layout ({view.nbytes} != {end - start})")
    if maps is not None and image.len > 0:
        import mmap

        import numpy as np

        kept = maps.get(path)
        # The same memory file (inode: the descriptor changes from capture to capture, and the
        # mapping keeps the file alive, so its inode is not reused) at the same length: the
        # mapping of the last capture still fits.
        st = os.fstat(image.fd)
        identity = (st.st_dev, st.st_ino, image.len)
        if kept is None or kept[0] != identity:
            if kept is not None:
                kept[1].close()
            kept = (identity, mmap.mmap(image.fd, image.len))
            maps[path] = kept
        target = np.frombuffer(kept[1], dtype=np.uint8)
        for (start, end), view in zip(image.ranges, views):
            if view.nbytes:
                np.copyto(target[start:end], view)
        del target
        return image
    for (start, end), view in zip(image.ranges, views):
        if view.nbytes:
            _pwrite_all(image.fd, view, start)
    return image


# Repositories with a background commit that may still run: waited for at exit, so that a
# script ending right after `commit(..., background=True)` does not lose its last version.
_OPEN = weakref.WeakSet()


@atexit.register
def _wait_at_exit() -> None:
    for repo in list(_OPEN):
        try:
            repo.wait()
        except CkptError as e:
            print(f"ckpt: background commit failed: {e}", file=sys.stderr)


class Repo:
    """A ckpt repository.

    ``Repo(path)`` opens the repository holding `path` (this directory or a parent, as the CLI
    finds it); ``Repo.init(path)`` creates one.
    """

    def __init__(
        self,
        path: Union[str, os.PathLike] = ".",
        *,
        reuse_buffers: bool = False,
        _native: Optional[_NativeRepo] = None,
    ):
        self._native = _native if _native is not None else _NativeRepo.discover(os.fspath(path))
        self._native.set_reuse_buffers(reuse_buffers)
        # With reuse_buffers: path -> ((dev, inode, length), writable mapping) of its kept memory.
        self._maps: Optional[Dict[str, Any]] = {} if reuse_buffers else None
        # One commit at a time from this object: two threads must not capture into the same kept
        # memory, nor lose track of each other's background commit.
        self._commit_lock = threading.Lock()

    @classmethod
    def init(cls, path: Union[str, os.PathLike], *, reuse_buffers: bool = False) -> "Repo":
        """Creates a repository in `path` (created if missing) and returns it.

        `reuse_buffers` (also for ``Repo(path)``): keep the memory a dict's bytes were captured
        into for the next commit of the same path, which then writes into pages that exist
        (about 3x faster: the stall of a background commit becomes a plain copy), at the cost of
        holding one checkpoint's bytes in memory between commits."""
        return cls(_native=_NativeRepo.init(os.fspath(path)), reuse_buffers=reuse_buffers)

    @property
    def root(self) -> str:
        """The working tree's root directory."""
        return os.fspath(self._native.root)

    def commit(
        self,
        files: Mapping[str, Any],
        message: str,
        tags: Sequence[str] = (),
        *,
        background: bool = False,
        exact: bool = False,
        metadata: Optional[Mapping[str, Mapping[str, str]]] = None,
    ) -> Union[str, CommitHandle]:
        """Commits `files` as a new version; returns its id.

        `files` maps paths in the repository (``"model.safetensors"``, ``"opt/state.safetensors"``)
        to a path on disk (committed under the key, wherever it lies), a dict of name -> tensor
        (numpy arrays, torch tensors; committed as a safetensors file without writing it first)
        or ``bytes`` (committed as they are).
        `metadata` optionally gives a dict's safetensors ``__metadata__``, by path. Files of the
        previous version not named stay in the version, unless `exact` (then it holds only
        these). Each of `tags` is created on the new version (checked before committing).

        With ``background=True`` this returns a :class:`CommitHandle` as soon as the tensors'
        bytes are copied; ``handle.wait()`` returns the id or raises the commit's error, and the
        next call on this repository waits for the commit (and raises its error, unless
        ``wait()`` did).
        """
        if not isinstance(files, Mapping) or not files:
            raise CkptError("nothing to commit: name the files to commit")
        with self._commit_lock:
            return self._commit_locked(files, message, tags, background, exact, metadata)

    def _commit_locked(self, files, message, tags, background, exact, metadata):
        self._native.wait()
        sources = []
        for path, value in files.items():
            if not isinstance(path, str):
                raise CkptError(f"{path!r}: repository paths must be str")
            if isinstance(value, Mapping):
                meta = (metadata or {}).get(path)
                sources.append((path, _capture(self._native, path, value, meta, self._maps)))
            elif isinstance(value, (bytes, bytearray, memoryview)):
                sources.append((path, self._native.prepare_bytes(path, bytes(value))))
            elif isinstance(value, (str, os.PathLike)):
                sources.append((path, os.path.abspath(os.fspath(value))))
            else:
                raise CkptError(
                    f"{path}: expected a path on disk or a dict of tensors, got {type(value).__name__}"
                )
        result = self._native.commit(sources, message, list(tags), exact, background)
        if background:
            _OPEN.add(self)
        return result

    def wait(self) -> None:
        """Waits for a background commit; raises its error unless its handle's wait() did."""
        self._native.wait()

    def log(self, rev: str = "HEAD") -> List[Dict[str, Any]]:
        """The history from `rev`, newest first: dicts as ``ckpt log --json`` prints them."""
        return json.loads(self._native.log_json(rev))

    def resolve(self, rev: str = "HEAD") -> str:
        """The full id of the version `rev` names (HEAD, a branch, a tag, an id prefix, ~N)."""
        return self._native.resolve(rev)

    def files(self, rev: str = "HEAD") -> List[str]:
        """Paths of the files of version `rev`."""
        return [f[0] for f in self._native.files(rev)]

    def file_info(self, rev: str = "HEAD") -> Dict[str, Dict[str, Any]]:
        """The files of version `rev`: path -> {"format", "len", "hash", "manifest"}; format is
        "safetensors", "torch" (stored storage by storage) or "bytes"."""
        return {
            p: {"format": kind, "len": n, "hash": h, "manifest": m}
            for p, kind, n, h, m in self._native.files(rev)
        }

    def tag(self, name: str, rev: Optional[str] = None) -> str:
        """Tags `rev` (default HEAD) as `name`; returns the version id."""
        return self._native.tag(name, rev)

    def tags(self) -> Dict[str, str]:
        """Every tag and the version id it names."""
        return dict(self._native.tags())

    def checkout(
        self,
        rev: str = "HEAD",
        output: Optional[Union[str, os.PathLike]] = None,
        files: Optional[Iterable[str]] = None,
        force: bool = False,
    ) -> List[str]:
        """Writes the files of `rev` (all, or `files`) under `output` (default: the working tree,
        where changes the repository does not hold are not overwritten unless `force`); each file
        is verified against its hash. Returns the paths written."""
        out = None if output is None else os.fspath(output)
        names = None if files is None else [os.fspath(f) for f in files]
        return self._native.checkout(rev, out, names, force)

    def read_file(self, path: str, rev: str = "HEAD") -> bytes:
        """The bytes of a (small) file of `rev`, read from the store."""
        return self._native.read_file(rev, path)

    def load(
        self,
        rev: str = "HEAD",
        path: Optional[str] = None,
        names: Optional[Iterable[str]] = None,
        framework: str = "numpy",
    ) -> Dict[str, Any]:
        """Tensors of a file of `rev`, read straight from the store (no file is written).

        `path` defaults to the version's only file holding tensors. `names` selects tensors
        (all by default). ``framework="numpy"`` gives numpy arrays (bf16 and fp8 as their raw
        uint16 / uint8 bits, numpy has no such types), ``"pt"`` torch tensors of the stored
        dtype. Each tensor is checked against its hash as it is decoded.
        """
        import numpy as np

        if framework not in ("numpy", "np", "pt", "torch"):
            raise CkptError(f"framework {framework!r}: expected 'numpy' or 'pt'")
        if path is None:
            holding = [f[0] for f in self._native.files(rev) if f[1] in ("safetensors", "torch")]
            if len(holding) != 1:
                raise CkptError(
                    f"{rev}: {len(holding)} files hold tensors ({', '.join(holding) or 'none'}); "
                    "name one with path="
                )
            path = holding[0]
        wanted = None if names is None else list(names)
        out: Dict[str, Any] = {}
        for name, dtype, shape, buf in self._native.read_tensors(rev, path, wanted):
            arr = np.frombuffer(buf, dtype=_NUMPY_VIEW[dtype]).reshape(shape)
            if framework in ("pt", "torch"):
                out[name] = _to_torch(arr, dtype)
            else:
                out[name] = arr
        return out

    def __repr__(self) -> str:
        return f"ckpt.Repo({self.root!r})"


def _to_torch(arr, dtype: str):
    import torch

    t = torch.from_numpy(arr)
    target = {"BF16": torch.bfloat16, "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn"}.get(dtype)
    if target is None:
        return t
    if isinstance(target, str):
        target = getattr(torch, target)
    return t.view(target)
