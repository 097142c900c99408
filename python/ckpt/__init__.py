"""ckpt: version control for machine-learning checkpoints, from Python.

    import ckpt, numpy as np
    repo = ckpt.Repo.init("runs/exp1")            # or ckpt.Repo("runs/exp1"): finds .ckpt upwards
    vid = repo.commit({"model.safetensors": {"w": np.zeros((4, 4), np.float32)}}, "epoch 0")
    tensors = repo.load()                         # {"w": array(...)}, read from the store

A dict of tensors is committed as a safetensors file without writing it to disk first: its bytes
are laid out in memory exactly as ``safetensors.numpy.save_file`` / ``safetensors.torch.save_file``
would write them, so a checkout yields that file. ``background=True`` returns once the bytes are
copied (and the files named on disk opened); the commit (coding, deltas, compaction) then runs on a
Rust thread without the GIL.

Background commits are kept in a registry of this module, not in the ``Repo`` object: a commit
made through a temporary ``Repo`` is waited for at exit like any other, and a failed one that
nobody was told about (no ``wait()`` raised it) makes the process exit with status 1. A forked
child (a ``DataLoader`` worker) starts with an empty registry: the parent's commits are the
parent's to wait for. See "How Python commits survive exit and fork" in docs/architecture.md.
"""

from __future__ import annotations

import atexit
import builtins
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from ckpt import _native as _ext
from ckpt._native import CkptError, CommitHandle
from ckpt._native import Repo as _NativeRepo

__all__ = ["Repo", "ReportPage", "CkptError", "CommitHandle", "wait", "open", "safe_open", "RemoteRepo", "SafeOpen"]

_log = logging.getLogger("ckpt")

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
            raise TypeError(f"tensor {name!r}: dtype {x.dtype} is not supported")
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
            raise TypeError(
                f"tensor {name!r}: expected a numpy array or a torch tensor, got {type(x).__name__}"
            )
    dtype = _NUMPY_DTYPES.get(x.dtype.name)
    if dtype is None:
        raise TypeError(f"tensor {name!r}: dtype {x.dtype} is not supported")
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
            raise TypeError(f"{path}: tensor names must be str, got {name!r}")
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


# ---- arguments ---------------------------------------------------------------------------------
#
# Every public entry point (Repo's methods, ckpt.torch, ckpt.dcp's Writer and Reader, the training
# callbacks) checks its arguments with these when it is called: a wrong type raises TypeError and a
# wrong value ValueError, as Python's own functions do; never CkptError (which is for operations
# that fail: a missing revision, an existing tag, damage; and for an invalid ref name, refused
# with the CLI's message), never another exception from deeper down, and never later (inside a
# background commit, a `dcp.save` or the first checkpoint).


def _type_error(what: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{what}: expected {expected}, got {type(value).__name__}")


def _str_arg(value: Any, what: str, optional: bool = False) -> Optional[str]:
    """`value`, a str (or None, with `optional`)."""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _type_error(what, "a str or None" if optional else "a str", value)
    return value


def _bool_arg(value: Any, what: str) -> bool:
    """`value`, a bool: a flag given as a string ("false") or a number is a mistake, not a
    truth value."""
    kind = type(value)
    # numpy's bool (`numpy.bool_`, `numpy.bool` from numpy 2) too, as the extension takes it.
    if not isinstance(value, bool) and not (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_")):
        raise _type_error(what, "True or False", value)
    return bool(value)


def _count_arg(value: Any, what: str, minimum: int = 1, why: str = "") -> int:
    """`value`, an int (not a bool) of at least `minimum`; `why` says what a smaller one would
    mean."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(what, f"an int of at least {minimum}", value)
    if value < minimum:
        raise ValueError(f"{what}: expected at least {minimum}, got {value}{why}")
    return value


def _choice_arg(value: Any, what: str, choices: Sequence[str]) -> str:
    """`value`, one of the strings `choices`."""
    expected = " or ".join(repr(c) for c in choices)
    if not isinstance(value, str):
        raise _type_error(what, expected, value)
    if value not in choices:
        raise ValueError(f"{what} {value!r}: expected {expected}")
    return value


def _str_list(value: Any, what: str, paths: bool = False) -> List[str]:
    """`value` as a list of str: a single str (or path, with `paths`) is one item, never its
    characters; anything else must be an iterable of them."""
    single = (str, os.PathLike) if paths else (str,)
    if isinstance(value, single):
        return [os.fspath(value)]
    if isinstance(value, (bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        raise _type_error(what, "a str or a list of str", value)
    out = []
    for item in value:
        if not isinstance(item, single):
            raise TypeError(f"{what}: expected a str or a list of str, got an item {item!r}")
        out.append(os.fspath(item))
    return out


# ---- the registry of background commits --------------------------------------------------------
#
# Every background commit started in this process and not settled yet: running, or failed and not
# reported to anyone. A module-level list, not a field of Repo: a commit made through a temporary
# Repo (`ckpt.Repo(d).commit(..., background=True)`) is waited for at exit all the same, and a
# Repo's garbage collection never cancels one (the Rust thread holds the repository itself).


class _Pending:
    __slots__ = ("handle", "key", "logged")

    def __init__(self, handle: CommitHandle, key: str):
        self.handle = handle
        self.key = key
        self.logged = False


_PENDING: List[_Pending] = []
_PENDING_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    # The child has a copy of the list but none of the threads: its at-exit wait must not wait for
    # (nor report) the parent's commits. A lock a parent's thread held at the fork is replaced.
    global _PENDING, _PENDING_LOCK
    _PENDING = []
    _PENDING_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _register(handle: CommitHandle, key: str) -> None:
    with _PENDING_LOCK:
        # Settled entries go: finished well, or failed and reported.
        _PENDING[:] = [p for p in _PENDING if not _settled(p)]
        _PENDING.append(_Pending(handle, key))


def _settled(p: _Pending) -> bool:
    return p.handle.done() and (p.handle.error is None or p.handle.reported)


def _snapshot(key: Optional[str]) -> List[_Pending]:
    with _PENDING_LOCK:
        return [p for p in _PENDING if key is None or p.key == key]


def _forget(done: List[_Pending]) -> None:
    with _PENDING_LOCK:
        _PENDING[:] = [p for p in _PENDING if p not in done]


def _describe(p: _Pending) -> str:
    return f"background commit {p.handle.message!r} in {os.fspath(p.handle.root)} failed: {p.handle.error}"


def _settle(key: Optional[str]) -> None:
    """Waits for the background commits of repository `key` (all with None). A failure is logged
    (once) and stays recorded for `wait()` and the exit status; it is never raised here: each
    commit stands alone, and a later one goes ahead."""
    pending = _snapshot(key)
    for p in pending:
        p.handle.join()
        if p.handle.error is not None and not p.handle.reported and not p.logged:
            p.logged = True
            _log.error("ckpt: %s", _describe(p))
    _forget([p for p in pending if _settled(p)])


def _wait(key: Optional[str], timeout: Optional[float]) -> None:
    """Waits for the background commits of repository `key` (all with None), up to `timeout`
    seconds in all; raises TimeoutError if one still runs then, and CkptError naming every
    failed one nobody was told about (which then counts as reported)."""
    if timeout is not None and not timeout >= 0:
        raise ValueError(f"timeout {timeout!r}: expected seconds >= 0")
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = _snapshot(key)
    for p in pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not p.handle.join(left):
            running = sum(1 for q in pending if not q.handle.done())
            raise TimeoutError(f"{running} background commit(s) still running after {timeout} s")
    failed = [p for p in pending if p.handle.error is not None and not p.handle.reported]
    for p in failed:
        p.handle.mark_reported()
    _forget([p for p in pending if _settled(p)])
    if len(failed) == 1:
        raise CkptError(_describe(failed[0]))
    if failed:
        raise CkptError(f"{len(failed)} background commits failed: " + "; ".join(_describe(p) for p in failed))


def wait(timeout: Optional[float] = None) -> None:
    """Waits for every background commit of this process, in every repository, up to `timeout`
    seconds (None: as long as they take). Raises TimeoutError if one is still running then, and
    CkptError for the failed ones whose error was not raised yet (by their handle's ``wait()`` or
    an earlier ``wait``)."""
    _wait(None, timeout)


@atexit.register
def _wait_at_exit() -> None:
    """Waits for every background commit before the interpreter exits. A failed one whose error
    nobody was told about (no ``wait()`` raised it) is printed, and the process then exits with
    status 1 instead of 0 (see docs/architecture.md)."""
    pending = _snapshot(None)
    try:
        if any(not p.handle.done() for p in pending):
            if not all(p.handle.join(1.0) for p in pending):
                running = sum(1 for p in pending if not p.handle.done())
                print(f"ckpt: waiting for {running} background commit(s) to finish", file=sys.stderr, flush=True)
            for p in pending:
                p.handle.join()
    except KeyboardInterrupt:
        running = [p for p in pending if not p.handle.done()]
        print(f"ckpt: interrupted: {len(running)} background commit(s) not finished: "
              + ", ".join(repr(p.handle.message) for p in running), file=sys.stderr, flush=True)
        _exit_with_failure()
        return
    failed = [p for p in pending if p.handle.error is not None and not p.handle.reported]
    for p in failed:
        print(f"ckpt: {_describe(p)}", file=sys.stderr)
    if failed:
        _exit_with_failure()


def _exit_with_failure() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream: nothing to flush
            pass
    # The status becomes 1 once the interpreter is finalized (the other at-exit handlers run,
    # buffers are flushed); should that hook be missing, exit now.
    if not _ext.exit_with_failure():
        os._exit(1)


class ReportPage:
    """A ``ckpt report`` page (self-contained HTML). Jupyter shows it inline, in a sandboxed
    iframe so that its styles and script stay its own; ``str()`` is the page itself."""

    def __init__(self, html: str):
        self.html = html

    def _repr_html_(self) -> str:
        import html

        return (
            '<iframe sandbox="allow-scripts" style="width:100%;height:760px;border:0" srcdoc="'
            + html.escape(self.html, quote=True)
            + '"></iframe>'
        )

    def save(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the page to `path`."""
        with builtins.open(path, "w", encoding="utf-8") as f:
            f.write(self.html)

    def __str__(self) -> str:
        return self.html


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
        reuse_buffers = _bool_arg(reuse_buffers, "reuse_buffers")
        self._native = _native if _native is not None else _NativeRepo.discover(os.fspath(path))
        self._native.set_reuse_buffers(reuse_buffers)
        # Background commits of this repository, whichever Repo object started them.
        self._key = os.path.realpath(os.fspath(self._native.root))
        # With reuse_buffers: path -> ((dev, inode, length), writable mapping) of its kept memory.
        self._maps: Optional[Dict[str, Any]] = {} if reuse_buffers else None
        # One commit at a time from this object: two threads must not capture into the same kept
        # memory, nor lose track of each other's background commit.
        self._commit_lock = threading.Lock()
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        # In a forked child: the kept memory is shared with the parent (whose commit may be
        # reading it), and the lock may have been held by a thread the child does not have.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._commit_lock = threading.Lock()
            if self._maps is not None:
                self._maps = {}

    @classmethod
    def init(cls, path: Union[str, os.PathLike], *, reuse_buffers: bool = False) -> "Repo":
        """Creates a repository in `path` (created if missing) and returns it.

        `reuse_buffers` (also for ``Repo(path)``): keep the memory a dict's bytes were captured
        into for the next commit of the same path, which then writes into pages that exist
        (about 3x faster: the stall of a background commit becomes a plain copy), at the cost of
        holding one checkpoint's bytes in memory between commits."""
        # Checked before the repository is created, not after.
        reuse_buffers = _bool_arg(reuse_buffers, "reuse_buffers")
        return cls(_native=_NativeRepo.init(os.fspath(path)), reuse_buffers=reuse_buffers)

    @property
    def root(self) -> str:
        """The working tree's root directory."""
        return os.fspath(self._native.root)

    def commit(
        self,
        files: Mapping[str, Any],
        message: str,
        tags: Union[str, Sequence[str]] = (),
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
        these). Each of `tags` (a name, or a list of names) is created on the new version.

        Everything is checked before anything is written: paths, tag names (valid, each once,
        none that exists), the files on disk (opened now). A commit that raises has written no
        version.

        With ``background=True`` this returns a :class:`CommitHandle` as soon as the tensors'
        bytes are copied and the files on disk opened: the commit reads those files from the
        descriptors opened here, so a file deleted or replaced (by a rename) meanwhile is still
        committed as it was at this call; one rewritten in place makes the commit fail, saying
        so. ``handle.wait(timeout=None)`` returns the id or raises the commit's error. The next
        commit to the repository waits for it; a failure never stops a later commit: it is
        logged, raised by ``wait()`` (the handle's, ``Repo.wait()`` or ``ckpt.wait()``), and if
        nothing raised it by the end, the process exits with status 1.
        """
        if not isinstance(files, Mapping):
            raise _type_error(
                "files",
                "a dict of repository path -> source (a path on disk, a dict of tensors, or bytes)",
                files,
            )
        if not files:
            raise CkptError("nothing to commit: name the files to commit")
        _str_arg(message, "message")
        tags = _str_list(tags, "tags")
        background = _bool_arg(background, "background")
        exact = _bool_arg(exact, "exact")
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise _type_error("metadata", "a dict of path -> dict", metadata)
            for path, meta in metadata.items():
                if path not in files or not isinstance(files[path], Mapping):
                    raise ValueError(f"metadata: {path!r} is not a dict of tensors in this commit")
                if not isinstance(meta, Mapping):
                    raise TypeError(f"metadata for {path!r}: expected a dict of str -> str")
        for path, value in files.items():
            if not isinstance(path, str):
                raise TypeError(f"{path!r}: repository paths must be str")
            if not isinstance(value, (Mapping, bytes, bytearray, memoryview, str, os.PathLike)):
                raise TypeError(
                    f"{path}: expected a path on disk, a dict of tensors or bytes, got {type(value).__name__}"
                )
        self._after_fork()
        with self._commit_lock:
            return self._commit_locked(files, message, tags, background, exact, metadata)

    def _commit_locked(self, files, message, tags, background, exact, metadata):
        # The last commit first (its memory may be taken for this capture); its failure is
        # logged and kept for wait(), and this commit goes ahead.
        _settle(self._key)
        # Tags are checked before the (costly) capture; again when committing.
        self._native.check_tags(tags)
        sources = []
        for path, value in files.items():
            if isinstance(value, Mapping):
                meta = (metadata or {}).get(path)
                sources.append((path, _capture(self._native, path, value, meta, self._maps)))
            elif isinstance(value, (bytes, bytearray, memoryview)):
                sources.append((path, self._native.prepare_bytes(path, bytes(value))))
            else:
                sources.append((path, os.path.abspath(os.fspath(value))))
        result = self._native.commit(sources, message, tags, exact, background)
        if background:
            _register(result, self._key)
        return result

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for the background commits of this repository (made through any ``Repo``
        object), up to `timeout` seconds (None: as long as they take). Raises TimeoutError if
        one still runs then, and CkptError for the failed ones whose error was not raised yet."""
        _wait(self._key, timeout)

    def log(self, rev: str = "HEAD") -> List[Dict[str, Any]]:
        """The history from `rev`, newest first: dicts as ``ckpt log --json`` prints them."""
        _settle(self._key)
        return json.loads(self._native.log_json(rev))

    def report(
        self, range: str = "HEAD", tensor: Optional[str] = None, max_versions: Optional[int] = None
    ) -> List[Dict[str, Any]]:
        """The numbers of ``ckpt report`` for `range` (``"HEAD"``, a version, or ``"FROM..TO"``):
        one dict per (tensor, version) with ``file``, ``tensor``, ``version`` (full id),
        ``short``, ``dtype``, ``shape``, ``status`` (``"compared"``, ``"first"`` or
        ``"reshaped"``), ``rel_change`` (‖w_v − w_{v−1}‖₂ / ‖w_{v−1}‖₂; None for non-float
        dtypes and when not compared), ``frac_changed``, ``non_finite`` (elements that are NaN or
        infinite) and ``stored_bytes``. `tensor` selects tensors as ``ckpt checkout --tensor``;
        `max_versions` keeps the newest."""
        _settle(self._key)
        rng = _str_arg(range, "range")
        pattern = _str_arg(tensor, "tensor", optional=True)
        limit = None if max_versions is None else _count_arg(max_versions, "max_versions")
        return json.loads(self._native.report_text(rng, pattern, limit, False))

    def report_html(
        self, range: str = "HEAD", tensor: Optional[str] = None, max_versions: Optional[int] = None
    ) -> "ReportPage":
        """The ``ckpt report`` page of `range` (arguments as :meth:`report`): a
        :class:`ReportPage`, which a Jupyter cell shows inline and :meth:`ReportPage.save`
        writes to a file."""
        _settle(self._key)
        rng = _str_arg(range, "range")
        pattern = _str_arg(tensor, "tensor", optional=True)
        limit = None if max_versions is None else _count_arg(max_versions, "max_versions")
        return ReportPage(self._native.report_text(rng, pattern, limit, True))

    def prune(
        self,
        keep_last: int,
        branches: Iterable[str] = (),
        dry_run: bool = False,
        grace_seconds: Optional[float] = None,
    ) -> Dict[str, Any]:
        """Keeps the newest `keep_last` versions of each branch in `branches` (default: the
        current one) and drops the rest of their history, then frees the space as ``ckpt gc``
        does (objects younger than `grace_seconds`, default the config's, stay until a later
        gc). What a tag, another branch or a remote-tracking ref needs stays. Returns the
        report as ``ckpt prune --json`` prints it ("dropped", "kept_by", "gc", ...)."""
        keep_last = _count_arg(
            keep_last, "keep_last", 1, " (a branch keeps at least its newest version: delete the branch to drop it all)"
        )
        names = _str_list(branches, "branches") if branches else []
        dry_run = _bool_arg(dry_run, "dry_run")
        _settle(self._key)
        return json.loads(self._native.prune_json(keep_last, names, dry_run, grace_seconds))

    def resolve(self, rev: str = "HEAD") -> str:
        """The full id of the version `rev` names (HEAD, a branch, a tag, an id prefix, ~N)."""
        _settle(self._key)
        return self._native.resolve(rev)

    def files(self, rev: str = "HEAD") -> List[str]:
        """Paths of the files of version `rev`."""
        _settle(self._key)
        return [f[0] for f in self._native.files(rev)]

    def file_info(self, rev: str = "HEAD") -> Dict[str, Dict[str, Any]]:
        """The files of version `rev`: path -> {"format", "len", "hash", "manifest"}; format is
        "safetensors", "torch" (stored storage by storage) or "bytes"."""
        _settle(self._key)
        return {
            p: {"format": kind, "len": n, "hash": h, "manifest": m}
            for p, kind, n, h, m in self._native.files(rev)
        }

    def tag(self, name: str, rev: Optional[str] = None) -> str:
        """Tags `rev` (default HEAD) as `name`; returns the version id."""
        _str_arg(name, "tag name")
        _str_arg(rev, "rev", optional=True)
        _settle(self._key)
        return self._native.tag(name, rev)

    def tags(self) -> Dict[str, str]:
        """Every tag and the version id it names."""
        _settle(self._key)
        return dict(self._native.tags())

    def checkout(
        self,
        rev: str = "HEAD",
        output: Optional[Union[str, os.PathLike]] = None,
        files: Optional[Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]]] = None,
        force: bool = False,
    ) -> List[str]:
        """Writes the files of `rev` (all, or `files`: a path or a list of them) under `output`
        (default: the working tree, where changes the repository does not hold are not
        overwritten unless `force`); each file is verified against its hash. Returns the paths
        written."""
        out = None if output is None else os.fspath(output)
        names = None if files is None else _str_list(files, "files", paths=True)
        _settle(self._key)
        return self._native.checkout(rev, out, names, force)

    def read_file(self, path: str, rev: str = "HEAD") -> bytes:
        """The bytes of a (small) file of `rev`, read from the store."""
        _settle(self._key)
        return self._native.read_file(rev, path)

    def load(
        self,
        rev: str = "HEAD",
        path: Optional[str] = None,
        names: Optional[Union[str, Iterable[str]]] = None,
        framework: str = "numpy",
    ) -> Dict[str, Any]:
        """Tensors of a file of `rev`, read straight from the store (no file is written).

        `path` defaults to the version's only file holding tensors. `names` selects tensors (a
        name or a list of them; all by default). ``framework="numpy"`` gives numpy arrays (bf16
        and fp8 as their raw uint16 / uint8 bits, numpy has no such types), ``"pt"`` torch
        tensors of the stored dtype. Each tensor is checked against its hash as it is decoded.
        """
        import numpy as np

        _choice_arg(framework, "framework", ("numpy", "np", "pt", "torch"))
        wanted = None if names is None else _str_list(names, "names")
        _settle(self._key)
        if path is None:
            holding = [f[0] for f in self._native.files(rev) if f[1] in ("safetensors", "torch")]
            if len(holding) != 1:
                raise CkptError(
                    f"{rev}: {len(holding)} files hold tensors ({', '.join(holding) or 'none'}); "
                    "name one with path="
                )
            path = holding[0]
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


# Last: `open` is ckpt.open from here on (this module uses builtins.open).
from ckpt._remote import RemoteRepo, SafeOpen, open, safe_open  # noqa: E402
