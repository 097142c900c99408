"""`torch.distributed.checkpoint` (DCP) storage straight into a ckpt repository.

    import torch.distributed.checkpoint as dcp
    import ckpt.dcp

    dcp.save(state_dict, storage_writer=ckpt.dcp.Writer("/shared/ckpts", message="step 1000"))
    dcp.load(state_dict, storage_reader=ckpt.dcp.Reader("/shared/ckpts", rev="HEAD"))

`Writer` plans and serializes exactly as DCP's `FileSystemWriter` (the same `__R_I.distcp`
files, byte for byte, and the same `.metadata`), but each rank writes its files into memory
(a memfd) and stores them in the repository's object store itself, in parallel with the other
ranks, without a version and without the repository's writer lock (objects are named by their
content and written create-if-absent). `finish()` on the coordinator stores `.metadata` and
writes one version listing every rank's files, then moves the branch by compare-and-swap
against the tip it saw when the save began: if another save moved the branch meanwhile, the
save raises on every rank and nothing is overwritten. Under a delta policy other than
`reverse`, each rank's file is delta-coded against the same file of the branch's previous
version; under `reverse` (the default) the files are stored whole and the version is left
pending for `ckpt compact`, which rewrites the previous version's tensors as deltas.

A rank that raises leaves no version and no ref change (DCP raises on every rank); what it
stored is unreferenced and `ckpt gc` deletes it. `gc` has no grace period: a `gc` run during
a save may delete what the save stored so far, and `finish()` then refuses the version.

`Reader` reads `.metadata` and each rank file from the store, in memory (a whole file at a
time), with DCP's own planning (so a save on 4 ranks loads on 2). A version written by
`Writer` also checks out (`ckpt checkout`) as a DCP directory that stock `dcp.load` reads.

`target` is a repository path (a shared file system every rank sees). Remote targets (S3)
are not supported yet.

torch is imported when a `Writer` or `Reader` is made, not when this module is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import threading
from typing import Any, Dict, Iterable, List, Optional, Tuple

__all__ = ["Writer", "Reader"]

_METADATA = ".metadata"


def _open_repo(target: Any):
    from ckpt._native import Repo as _NativeRepo

    return _NativeRepo.discover(os.fspath(target))


def _classes():
    """The DCP classes, built on first use (torch is imported here, not at module import)."""
    global _BUILT
    if _BUILT is not None:
        return _BUILT
    from torch.distributed.checkpoint import filesystem as fs
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    @dataclasses.dataclass
    class _Prefix(fs._StoragePrefix):
        """The file prefix of a rank, with the branch and the tip the save follows."""

        branch: str = ""
        tip: Optional[str] = None

    @dataclasses.dataclass(frozen=True)
    class _StoredResult(WriteResult):
        """A `WriteResult` that also carries its file as stored: (path, manifest, hash, len)."""

        stored: Optional[Tuple[str, str, str, int]] = None

    class _StoreFS(fs.FileSystem):
        """DCP's `FileSystem`, with files kept in a repository's store instead of a directory.

        Written files go to a memfd, stored when closed; read files come from a version."""

        def __init__(self, native, version: Optional[str] = None, previous: Optional[str] = None):
            super().__init__()
            self.native = native
            self.version = version
            self.previous = previous
            self.stored: Dict[str, Tuple[str, str, str, int]] = {}
            self.lock = threading.Lock()

        def init_path(self, path):
            return os.fspath(path)

        def concat_path(self, path, suffix):
            return suffix

        def mkdir(self, path):
            pass

        def exists(self, path):
            return False

        def rm_file(self, path):
            pass

        def rename(self, path, new_path):
            pass

        @contextlib.contextmanager
        def create_stream(self, path, mode):
            name = os.fspath(path)
            if "w" in mode:
                # `finish` writes `.metadata.tmp` and renames it: stored under the final name.
                if name.endswith(".tmp"):
                    name = name[: -len(".tmp")]
                fd = os.memfd_create(name.replace("/", "_"), os.MFD_CLOEXEC)
                # DCP may close the stream itself: the file is read through a descriptor of ours.
                kept = os.dup(fd)
                try:
                    with os.fdopen(fd, "wb") as f:
                        yield f
                    stored = self.native.store_objects(f"/proc/self/fd/{kept}", name, self.previous)
                finally:
                    os.close(kept)
                with self.lock:
                    self.stored[name] = stored
            else:
                data = self.native.read_file(self.version, name, 1 << 62)
                with io.BytesIO(data) as f:
                    yield f

    class Writer(fs.FileSystemWriter):
        """A DCP `StorageWriter` that saves into the ckpt repository at `target` as one
        version on `branch` (default: the repository's current branch), with `message` and
        `tags`. Other keyword arguments go to `FileSystemWriter` (`thread_count`,
        `single_file_per_rank`, ...)."""

        def __init__(
            self,
            target: Any,
            message: Optional[str] = None,
            tags: Iterable[str] = (),
            branch: Optional[str] = None,
            **kwargs: Any,
        ) -> None:
            kwargs.setdefault("sync_files", False)  # the store syncs what it writes
            super().__init__(path=os.fspath(target), **kwargs)
            self.target = os.fspath(target)
            self.message = message if message is not None else "dcp save"
            self.tags = list(tags)
            self.branch = branch
            self._native = None
            self.fs = _StoreFS(None)

        def _repo(self):
            # Opened in the rank's own process (a Writer may be made before a fork or spawn).
            if self._native is None:
                self._native = _open_repo(self.target)
            return self._native

        def reset(self, checkpoint_id=None) -> None:
            if checkpoint_id:
                self.target = os.fspath(checkpoint_id)
                self._native = None
            super().reset(None)

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            super().set_up_storage_writer(is_coordinator, *args, **kwargs)
            self.fs = _StoreFS(self._repo())
            if is_coordinator and self.tags:
                self._repo().check_tags(self.tags)

        def prepare_local_plan(self, plan):
            plan = super().prepare_local_plan(plan)
            if not self.use_collectives:
                raise RuntimeError("ckpt.dcp.Writer needs rank coordination (use_collectives=True)")
            return plan

        def prepare_global_plan(self, plans):
            native = self._repo()
            if self.branch is None:
                branch, tip = native.current_branch()
            else:
                branch, tip = self.branch, native.branch_tip(self.branch)
            self._branch, self._tip = branch, tip
            plans = super().prepare_global_plan(plans)
            return [
                dataclasses.replace(p, storage_data=_Prefix(p.storage_data.prefix, branch=branch, tip=tip))
                for p in plans
            ]

        def write_data(self, plan, planner):
            self.fs = _StoreFS(self._repo(), previous=plan.storage_data.tip)
            results = super().write_data(plan, planner).value()
            stored = self.fs.stored
            out = [
                _StoredResult(r.index, r.size_in_bytes, r.storage_data, stored[r.storage_data.relative_path])
                for r in results
            ]
            fut: Future = Future()
            fut.set_result(out)
            return fut

        def finish(self, metadata, results) -> None:
            files: Dict[str, Tuple[str, str, str, int]] = {}
            plain = []
            for rank_results in results:
                for r in rank_results:
                    files[r.stored[0]] = r.stored
                plain.append([WriteResult(r.index, r.size_in_bytes, r.storage_data) for r in rank_results])
            self.fs = _StoreFS(self._repo(), previous=self._tip)
            super().finish(metadata, plain)
            files.update(self.fs.stored)
            self.version = self._repo().commit_stored(
                self._branch, self._tip, list(files.values()), self.message, self.tags
            )

        def storage_meta(self):
            return StorageMeta(checkpoint_id=self.target, save_id=self.save_id)

        @property
        def checkpoint_id(self):
            return self.target

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id) -> bool:
            return False

    class Reader(fs.FileSystemReader):
        """A DCP `StorageReader` of version `rev` of the ckpt repository at `target`, read
        from the store (no files written)."""

        def __init__(self, target: Any, rev: str = "HEAD") -> None:
            super().__init__(path=os.fspath(target))
            self.target = os.fspath(target)
            self.rev = rev
            self._native = None
            self._version: Optional[str] = None

        def _store_fs(self):
            if self._native is None:
                self._native = _open_repo(self.target)
                # One version for every read of this load, whatever moves meanwhile.
                self._version = self._native.resolve(self.rev)
            return _StoreFS(self._native, version=self._version)

        def reset(self, checkpoint_id=None) -> None:
            if checkpoint_id:
                self.target = os.fspath(checkpoint_id)
                self._native = None
            super().reset(None)

        def read_metadata(self, *args: Any, **kwargs: Any):
            self.fs = self._store_fs()
            return super().read_metadata(*args, **kwargs)

        def read_data(self, plan, planner):
            self.fs = self._store_fs()
            return super().read_data(plan, planner)

        @property
        def checkpoint_id(self):
            return self.target

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id) -> bool:
            return False

    built = {"_Prefix": _Prefix, "_StoredResult": _StoredResult, "_StoreFS": _StoreFS, "Writer": Writer, "Reader": Reader}
    for name, cls in built.items():
        # Plans and write results cross processes pickled: found by name in this module.
        cls.__module__, cls.__qualname__ = __name__, f"_{name}" if not name.startswith("_") else name
    _BUILT = built
    return _BUILT


def __getattr__(name: str) -> Any:
    # Pickle finds the classes this way in a process that has not built them yet.
    if name in ("_Prefix", "_StoredResult", "_StoreFS", "_Writer", "_Reader"):
        return _classes()[name.lstrip("_") if name in ("_Writer", "_Reader") else name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_BUILT: Optional[Dict[str, Any]] = None


def Writer(target: Any, message: Optional[str] = None, tags: Iterable[str] = (), branch: Optional[str] = None, **kwargs: Any):
    """A DCP `StorageWriter` saving into the ckpt repository at `target` (see the module
    docstring): one version on `branch` (default: the current branch) with `message`, `tags`."""
    return _classes()["Writer"](target, message=message, tags=tags, branch=branch, **kwargs)


def Reader(target: Any, rev: str = "HEAD"):
    """A DCP `StorageReader` of version `rev` of the ckpt repository at `target`."""
    return _classes()["Reader"](target, rev=rev)
