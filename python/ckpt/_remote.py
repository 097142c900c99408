"""A read-only handle on a remote, without a repository: ``ckpt.open(URL)`` and
``ckpt.safe_open(URL, path)``.

    import ckpt
    with ckpt.safe_open("s3://bucket/run1", "model.safetensors", rev="main", framework="pt") as f:
        emb = f.get_slice("embed.weight")[1000:2000]   # only the chunks holding these rows
        w = f.get_tensor("lm_head.weight")             # only this tensor's blob (and its chain)

Only what a request needs is downloaded (the version, the file's manifest, the tensor's blob
and its delta chain; for a slice of the first dimension, the blob's chunk index and the chunks
holding the rows), each verified, into a cache kept under ``$CKPT_CACHE_DIR`` (else
``$XDG_CACHE_HOME/ckpt`` or ``~/.cache/ckpt``) as ``ckpt.dcp.Reader``'s is: a second read of
the same bytes sends no object request. See docs/guide/remotes.md.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Union

from ckpt._native import CkptError
from ckpt._native import RemoteReader as _NativeReader

_FRAMEWORKS = ("numpy", "np", "pt", "torch")


def _native_open(url: str, cache: Any, endpoint, region, allow_http) -> _NativeReader:
    if not isinstance(url, (str, os.PathLike)):
        raise TypeError(f"url: expected a string, got {type(url).__name__}")
    url = os.fspath(url)
    if cache is not None and not isinstance(cache, bool) and not isinstance(cache, (str, os.PathLike)):
        raise TypeError(f"cache: expected None, False or a directory, got {type(cache).__name__}")
    directory = None if cache is None or isinstance(cache, bool) else os.fspath(cache)
    return _NativeReader.open(url, directory, cache is False, endpoint, region, bool(allow_http))


def _framework(framework: str) -> str:
    if framework not in _FRAMEWORKS:
        raise ValueError(f"framework: expected one of {', '.join(_FRAMEWORKS)}, got {framework!r}")
    return "pt" if framework in ("pt", "torch") else "np"


def _array(dtype: str, shape: List[int], buf, framework: str):
    import numpy as np

    from ckpt import _NUMPY_VIEW, _to_torch

    arr = np.frombuffer(buf, dtype=_NUMPY_VIEW[dtype]).reshape(shape)
    return _to_torch(arr, dtype) if framework == "pt" else arr


class RemoteRepo:
    """A remote opened for reading (``ckpt.open``): its history, files and tensors, downloaded
    only as far as each call needs. Close it (or use ``with``) to release its cache."""

    def __init__(
        self,
        url: Union[str, "os.PathLike[str]"],
        *,
        cache: Any = None,
        endpoint: Optional[str] = None,
        region: Optional[str] = None,
        allow_http: bool = False,
    ) -> None:
        self._native = _native_open(url, cache, endpoint, region, allow_http)

    @property
    def url(self) -> str:
        """The remote's URL (without credentials)."""
        return self._native.url

    @property
    def requests(self) -> int:
        """Requests sent to the remote so far."""
        return self._native.requests()

    def resolve(self, rev: str = "HEAD") -> str:
        """The full id of the version `rev` names (HEAD, a branch, a tag, an id prefix, ~N)."""
        return self._native.resolve(rev)

    def log(self, rev: str = "HEAD", max_versions: Optional[int] = None) -> List[Dict[str, Any]]:
        """The history from `rev` along first parents, newest first: dicts with ``id``,
        ``short``, ``parents``, ``time``, ``message``, ``files``, ``raw_bytes``, ``stored_bytes``."""
        rows = self._native.log(rev, max_versions)
        return [
            {
                "id": i,
                "short": i[:12],
                "parents": p,
                "time": t,
                "message": m,
                "files": f,
                "raw_bytes": r,
                "stored_bytes": s,
            }
            for i, p, t, m, f, r, s in rows
        ]

    def files(self, rev: str = "HEAD") -> List[str]:
        """Paths of the files of version `rev`."""
        return [f[0] for f in self._native.files(self.resolve(rev))]

    def tags(self) -> Dict[str, str]:
        """Every tag of the remote and the version id it names."""
        return {n: i for k, n, i in self._native.refs() if k == "tag"}

    def branches(self) -> Dict[str, str]:
        """Every branch of the remote and the version id it names."""
        return {n: i for k, n, i in self._native.refs() if k == "branch"}

    def _tensor_file(self, version: str, path: Optional[str]) -> str:
        if path is not None:
            return path
        holding = [p for p, _, _ in self._native.files(version) if self._native.holds_tensors(version, p)]
        if len(holding) != 1:
            raise CkptError(
                f"{version[:12]}: {len(holding)} files hold tensors ({', '.join(holding) or 'none'}); name one with path="
            )
        return holding[0]

    def load(
        self,
        rev: str = "HEAD",
        path: Optional[str] = None,
        names: Optional[Union[str, Iterable[str]]] = None,
        framework: str = "np",
    ) -> Dict[str, Any]:
        """Tensors of a file of `rev`, as ``ckpt.Repo.load`` gives them, downloading only those
        tensors' blobs (`names`: a name or a list of them; all by default). `path` defaults to
        the version's only file holding tensors. ``framework="np"`` gives numpy arrays (bf16
        and fp8 as their raw bits), ``"pt"`` torch tensors."""
        fw = _framework(framework)
        version = self.resolve(rev)
        path = self._tensor_file(version, path)
        if names is None:
            wanted = [t[0] for t in self._native.tensors(version, path)]
        elif isinstance(names, str):
            wanted = [names]
        else:
            wanted = list(names)
        out: Dict[str, Any] = {}
        for name in wanted:
            dtype, shape, buf = self._native.read(version, path, name)
            out[name] = _array(dtype, shape, buf, fw)
        return out

    def safe_open(self, path: str, rev: str = "main", framework: str = "pt") -> "SafeOpen":
        """The safetensors file `path` of `rev`, shaped like ``safetensors.safe_open``."""
        return SafeOpen(self, path, rev, framework, owns=False)

    def close(self, prune: bool = False) -> None:
        """Releases the cache. With `prune`, a kept cache keeps only the newest file of each
        path read whole and deletes every other object (rows read, other versions)."""
        self._native.close(bool(prune))

    def __enter__(self) -> "RemoteRepo":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ckpt.open({self.url!r})"


class RemoteSlice:
    """A tensor not read yet (``SafeOpen.get_slice``): ``get_shape()``, ``get_dtype()``, and
    indexing, of which the first dimension is read from the remote (only the chunks holding
    those rows) and the rest applied to what came."""

    def __init__(self, owner: "SafeOpen", name: str, dtype: str, shape: List[int]) -> None:
        self._owner, self._name, self._dtype, self._shape = owner, name, dtype, list(shape)

    def get_shape(self) -> List[int]:
        return list(self._shape)

    def get_dtype(self) -> str:
        return self._dtype

    def __getitem__(self, index: Any):
        rest: tuple = ()
        if isinstance(index, tuple):
            index, rest = (index[0], index[1:]) if index else (slice(None), ())
        if not self._shape:
            raise IndexError(f"{self._name}: a scalar has no rows to slice")
        rows = self._shape[0]
        if index is Ellipsis:
            lo, hi, local = 0, rows, Ellipsis
        elif isinstance(index, slice):
            ids = range(*index.indices(rows))
            if len(ids) == 0:
                lo, hi, local = 0, 0, slice(None)
            elif ids.step == 1:
                lo, hi, local = ids.start, ids.stop, slice(None)
            else:
                lo, hi = min(ids), max(ids) + 1
                local = [i - lo for i in ids]
        else:
            i = int(index)
            if i < 0:
                i += rows
            if not 0 <= i < rows:
                raise IndexError(f"{self._name}: row {index} of a tensor of {rows} rows")
            lo, hi, local = i, i + 1, 0
        got = self._owner._rows(self._name, lo, hi)
        if isinstance(local, slice) and local == slice(None) and not rest:
            return got
        return got[(local,) + rest]


class SafeOpen:
    """A safetensors file of a remote version (``ckpt.safe_open``), shaped like
    ``safetensors.safe_open``: ``keys()``, ``metadata()``, ``get_tensor(name)``,
    ``get_slice(name)``. The revision is resolved once, when it is opened."""

    def __init__(self, repo: RemoteRepo, path: str, rev: str, framework: str, owns: bool) -> None:
        self._repo, self._path, self._framework, self._owns = repo, path, _framework(framework), owns
        self._version = repo.resolve(rev)
        self._tensors = {n: (d, s) for n, d, s in repo._native.tensors(self._version, path)}

    @property
    def version(self) -> str:
        """The full id of the version read."""
        return self._version

    def keys(self) -> List[str]:
        """The tensors' names, sorted (as safetensors gives them)."""
        return sorted(self._tensors)

    def metadata(self) -> Optional[Dict[str, str]]:
        """The file's ``__metadata__`` (None without one)."""
        return self._repo._native.metadata(self._version, self._path)

    def _info(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise CkptError(f"{self._path}: no tensor named {name!r}") from None

    def get_tensor(self, name: str):
        """Tensor `name`, its blob (and delta chain) downloaded and verified against its id."""
        self._info(name)
        dtype, shape, buf = self._repo._native.read(self._version, self._path, name)
        return _array(dtype, shape, buf, self._framework)

    def get_slice(self, name: str) -> RemoteSlice:
        """Tensor `name`, not read yet: index it (``[a:b]`` on its first dimension) to read those rows."""
        dtype, shape = self._info(name)
        return RemoteSlice(self, name, dtype, shape)

    def _rows(self, name: str, start: int, stop: int):
        dtype, shape, buf = self._repo._native.read(self._version, self._path, name, start, stop)
        return _array(dtype, shape, buf, self._framework)

    def close(self) -> None:
        if self._owns:
            self._repo.close()

    def __enter__(self) -> "SafeOpen":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open(  # noqa: A001 (ckpt.open, as the issue names it)
    url: Union[str, "os.PathLike[str]"],
    *,
    cache: Any = None,
    endpoint: Optional[str] = None,
    region: Optional[str] = None,
    allow_http: bool = False,
) -> RemoteRepo:
    """The remote at `url` (``s3://BUCKET/PREFIX`` with the ``AWS_*`` environment, or a
    directory), read-only and without a repository. `cache`: ``None`` (the kept cache of this
    remote), ``False`` (a temporary one) or a directory."""
    return RemoteRepo(url, cache=cache, endpoint=endpoint, region=region, allow_http=allow_http)


def safe_open(
    url: Union[str, "os.PathLike[str]"],
    path: str,
    rev: str = "main",
    framework: str = "pt",
    *,
    cache: Any = None,
    endpoint: Optional[str] = None,
    region: Optional[str] = None,
    allow_http: bool = False,
) -> SafeOpen:
    """The safetensors file `path` of `rev` on the remote at `url`, shaped like
    ``safetensors.safe_open`` (a context manager; closing it releases the cache)."""
    repo = RemoteRepo(url, cache=cache, endpoint=endpoint, region=region, allow_http=allow_http)
    try:
        return SafeOpen(repo, path, rev, framework, owns=True)
    except BaseException:
        repo.close()
        raise
