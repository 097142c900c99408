"""`torch.distributed.checkpoint` (DCP) storage straight into a ckpt repository or remote.

    import torch.distributed.checkpoint as dcp
    import ckpt.dcp

    dcp.save(state_dict, storage_writer=ckpt.dcp.Writer("/shared/ckpts", message="step 1000"))
    dcp.load(state_dict, storage_reader=ckpt.dcp.Reader("/shared/ckpts", rev="HEAD"))

    dcp.save(state_dict, storage_writer=ckpt.dcp.Writer("s3://bucket/run1", message="step 1000"))
    dcp.load(state_dict, storage_reader=ckpt.dcp.Reader("s3://bucket/run1"))

`Writer` plans and serializes exactly as DCP's `FileSystemWriter` (the same `__R_I.distcp`
files, byte for byte, and the same `.metadata`), but each rank writes its files into memory
(a memfd) and stores them itself, in parallel with the other ranks, without a version and
without a lock (objects are named by their content and written create-if-absent). A rank
stores its files once DCP has written them and reported where each item lies: each file is cut
into its items, each tensor chunk named by fqn and chunk offsets (`fc1.weight[0:16,0:8]`) as
`ckpt commit` of the same DCP directory names it from `.metadata` (which does not exist yet),
so `ckpt show` lists these names and the two kinds of versions pair with each other. `finish()`
on the coordinator stores `.metadata` and writes one version listing every rank's files, then
moves the branch by compare-and-swap against the tip it saw when the save began: if another
save moved the branch meanwhile, the save raises on every rank and nothing is overwritten.

`target` is either

- a repository path (a shared file system every rank sees): for a `Writer`, the repository's
  root (a directory inside it is refused: the save would go to the root); a `Reader` of a
  directory inside it reads the DCP files the version holds under that directory (a save
  committed with `ckpt commit step_1000`). Under a delta policy other than
  `reverse`, each item of a rank's file is delta-coded against the same item in any rank file
  of the branch's previous version (its own first: DCP's de-duplication, or a save on another
  number of ranks, moves items between files); under `reverse` (the default) each tensor is
  stored as DCP writes it: the stream hands the tensor's own memory to the store, which writes
  it at once as an uncoded blob (grouped bytes, no entropy coding: one pass) and leaves a hole
  in the rank's file, so no tensor byte is copied into the file first. The compaction the
  coordinator starts after the save, as `ckpt commit` does (the config's `compact` or
  `CKPT_COMPACT`: a niced background process by default, `inline`, or `manual` for `ckpt
  compact`), then codes those blobs and rewrites the previous version's tensors as deltas
  against the same items; until it has run, the save takes about its raw size in the store; or
- a remote URL, as `ckpt remote add` takes them: `s3://bucket/prefix` (S3-compatible storage;
  credentials, region and endpoint from the `AWS_*` environment variables as for ckpt's S3
  remotes, or the `endpoint`, `region` and `allow_http` arguments), `gs://bucket/prefix`
  (Google Cloud Storage: Google's environment, `STORAGE_EMULATOR_HOST` for an emulator),
  `az://container/prefix` (Azure Blob Storage: the `AZURE_STORAGE_*` environment,
  `AZURE_STORAGE_USE_EMULATOR=true` for Azurite) or `file:///dir` (a
  directory remote; the writer creates it if missing). The ranks need no repository: each
  keeps a cache of objects (`cache`, see below), pairs its items with the same items in any
  rank file of the branch's previous version, downloading only the manifests that takes and
  the objects of the items it pairs that its cache lacks, and uploads its file in the remote's
  `layout` (`"mirror"`, the default of `ckpt remote add`: new tensors whole,
  then the previous version's changed tensors recoded on the remote as deltas against them,
  which only saves space and so runs after `dcp.save` returns, on a thread of each rank while
  training goes on: the next save or load in the process waits for it, and so does the
  interpreter at exit; a process killed first leaves the previous version's tensors whole;
  or `"deltas"`: new tensors as forward deltas against the previous version's), as `ckpt push`
  and the git filter's transfers do (docs/format.md, "Distributed saves to a remote"). The
  version and the remote branch are what `ckpt clone`/`fetch` of that remote read; `branch`
  defaults to `main`.

A rank's cache for a remote target (`cache=` of `Writer` and `Reader`):

- default (`cache=None`): a cache kept on the rank's machine from save to save, one per remote
  and rank, under `$CKPT_CACHE_DIR`, else `$XDG_CACHE_HOME/ckpt`, else `~/.cache/ckpt`, in
  `dcp/<hash of the remote>/rank-<r>/` (its file `remote` names the remote). A save on top of
  the previous one then finds that save's objects of its rank there instead of downloading
  them, and a load after a save on the same rank downloads only what it lacks. After each
  successful save or load the cache keeps only the newest file of each path it stored or read
  (about one save of the rank) and deletes the rest. A rank holds a lock on its cache while it
  saves or loads: a second process on the same cache (another job, or an overlapping save)
  uses a temporary cache instead (correct, only slower; logged at debug level on the
  `ckpt.dcp` logger), and a killed process holds nothing (the kernel releases its lock). A
  cache of another remote, or one that does not read back, is emptied and rebuilt; every
  object is checked against its id as it is read, and a save that finds one damaged is done
  again on a rebuilt cache.
- `cache=False`: a temporary directory per save or load, deleted when the rank is done (each
  save downloads what it pairs).
- `cache=DIR`: that directory, used as it is (give each rank its own; never pruned: it grows
  with every save).

A rank that raises leaves no version and no ref change (DCP raises on every rank); what it
stored is unreferenced. In a repository `ckpt gc` deletes it once it is older than the grace
period (`gc_grace_seconds`, one hour by default), so a `gc` during a save leaves the save's
objects alone; a save that outlasts the grace period, or a `gc --prune=now` during one, may lose
objects, and `finish()` then refuses the version. On a remote nothing is ever deleted.

`Reader` reads `.metadata`, then for each item DCP asks for only that item's byte range of its
rank file, decoded from the store (a repository's, or the reader's cache, into which a remote
reader downloads the objects of the rank files it reads from, and no others), with DCP's own
planning: a save on 4 ranks loads on 2. Nothing is checked out. A version written by `Writer`
also checks out (`ckpt checkout`, after `ckpt clone` for a remote) as a DCP directory that
stock `dcp.load` reads. `.metadata` is unpickled allowing only the classes DCP's metadata names
(DCP's own reader runs `pickle.load` on it, which calls whatever the bytes name; a store's bytes
may come from a remote or a clone of one): anything else is refused with the file named, unless
the Reader is made with `trust_metadata=True`.

torch is imported when a `Writer` or `Reader` is made, not when this module is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import pickle
import subprocess
import sys
import threading
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ckpt import _bool_arg, _count_arg, _str_arg, _str_list, _type_error
from ckpt._native import check_layout, check_names, dcp_metadata_classes

__all__ = ["Writer", "Reader"]

_METADATA = ".metadata"

_log = logging.getLogger(__name__)

# How far a Reader's rank decodes ahead of DCP's loads: at most this many items and bytes held
# decoded and not yet loaded (an item larger than the bytes is decoded when DCP asks for it), so
# a rank holds at most this much more than stock DCP does (issue 27: memory per rank <= its
# shard + 300 MiB).
READ_AHEAD_ITEMS = 8
READ_AHEAD_BYTES = 64 << 20


def _spare_cpu() -> bool:
    """Whether this machine has more CPUs than ranks: only then does a rank's read-ahead run
    beside DCP's own work instead of taking CPU from it (docs/BENCHMARKS.md, "ckpt.dcp.Reader:
    items read ahead": 1 rank on 2 CPUs loaded faster with it, 2 and 4 ranks slower). The ranks
    here: `LOCAL_WORLD_SIZE` (torchrun), else the whole process group."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    if local.isdigit():
        ranks = int(local)
    else:
        import torch.distributed as dist

        ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return cpus > ranks


def _is_remote(target: str) -> bool:
    """Whether `target` is a remote URL (`s3://`, `gs://`, `az://`, `file://`) rather than a
    repository path."""
    return "://" in target


class _Target:
    """Where a save goes or a load comes from; `native` (a `Repo` or a `RemoteStore`) answers
    the calls both kinds make the same way."""

    native: Any
    # Where the DCP files lie in a version: a subdirectory for a Reader of a directory that
    # `ckpt commit` stored under one; "" (the version's root) for everything the Writer saves.
    prefix: str = ""

    def check_tags(self, tags: List[str]) -> None:
        self.native.check_tags(tags)

    def piece_sink(self, hints):
        """A sink that stores tensors while DCP writes them (`_PieceStream`), or `None` where
        the target takes whole files only."""
        return None

    def begin_save(self, what: str):
        """A record that keeps `ckpt gc` off what the save writes until its `end()`, or `None`
        where gc has another rule (a remote's)."""
        return None

    def resolve(self, rev: str) -> str:
        return self.native.resolve(rev)

    def open_file(self, version: str, path: str):
        return self.native.open_file(version, f"{self.prefix}/{path}" if self.prefix else path)


class _RepoTarget(_Target):
    """A repository every rank opens (a shared file system)."""

    def __init__(self, path: str) -> None:
        from ckpt._native import Repo as _NativeRepo

        self.native = _NativeRepo.discover(path)
        inside = os.path.relpath(os.path.realpath(path), os.path.realpath(self.native.root))
        self.prefix = "" if inside == "." else inside.replace(os.sep, "/")

    def store_objects(self, disk: str, path: str, previous: Optional[str], items=None, pieces=None):
        return self.native.store_objects(disk, path, previous, items, pieces)

    def piece_sink(self, hints):
        # `None` under a delta policy other than `reverse` (see `Repo.piece_sink`).
        return self.native.piece_sink(hints)

    def begin_save(self, what: str):
        return self.native.begin_save(what)

    def tip(self, branch: Optional[str]) -> Tuple[str, Optional[str], Optional[str]]:
        """(branch, its version, the tag its compare-and-swap expects)."""
        if branch is None:
            branch, tip = self.native.current_branch()
        else:
            tip = self.native.branch_tip(branch)
        return branch, tip, None

    def commit(self, branch, tip, cas, files, message, tags, keep_last: Optional[int] = None) -> str:
        version = self.native.commit_stored(branch, tip, files, message, tags)
        try:
            if keep_last is None:
                _compact_after_save(self.native)
            else:
                _compact_after_save(self.native, prune=(branch, keep_last))
        except Exception as e:  # noqa: BLE001 (the save stands: a compaction is only owed)
            # As `ckpt commit` warns: the version is committed and stays pending for the next
            # compaction; failing the save here would report a committed save as lost.
            _log.warning(
                "ckpt: version %s is committed, but its compaction did not start (%s); `ckpt compact` "
                "rewrites it",
                version,
                e,
            )
        return version

    def close(self, prune: bool = False) -> None:
        pass


# Mirror recodes of remote saves still running, one thread each (`_RemoteTarget.close_after_recodes`).
# The next save or load in this process waits for them when it begins (they hold the rank's kept
# cache, and the next save's recodes follow theirs). The interpreter waits for them at exit
# (they are not daemon threads).
_RECODES: List[threading.Thread] = []
_RECODES_LOCK = threading.Lock()


def _wait_for_recodes() -> None:
    """Waits until the recodes of this process's earlier saves are done."""
    with _RECODES_LOCK:
        threads = list(_RECODES)
        _RECODES.clear()
    for thread in threads:
        thread.join()


class _RemoteTarget(_Target):
    """A remote every rank reaches through a cache of its own: `cache` a directory, `False`
    (a temporary one) or `None` (this rank's kept cache; see the module docstring)."""

    def __init__(self, url: str, cache: Any, layout: str, s3: Dict[str, Any], create: bool) -> None:
        from ckpt._native import RemoteStore

        where: Dict[str, Any] = {}
        if cache is None or cache is True:
            where["rank"] = _rank()
        elif cache is not False:
            where["cache"] = os.fspath(cache)
        self.native = RemoteStore.open(url, layout=layout, create=create, **where, **s3)
        if self.native.cache_fallback is not None:
            _log.debug("rank %d: a temporary cache for %s: %s", where["rank"], url, self.native.cache_fallback)
        # What moved, once closed (`RemoteStore.traffic`).
        self.traffic: Dict[str, int] = {}

    def tip(self, branch: Optional[str]) -> Tuple[str, Optional[str], Optional[str]]:
        branch = branch if branch is not None else "main"
        tip, cas = self.native.branch_tip(branch)
        return branch, tip, cas

    def commit(self, branch, tip, cas, files, message, tags, keep_last: Optional[int] = None) -> str:
        # Each file as stored: `(path, manifest, hash, length, bytes its upload created)`.
        stored_bytes = sum(f[4] for f in files)
        return self.native.commit(branch, tip, cas, [f[:4] for f in files], message, tags, stored_bytes)

    def store_objects(self, disk: str, path: str, previous: Optional[str], items=None, pieces=None):
        # The mirror layout's recodes of the previous version's blobs (only space on the
        # remote, never needed by this save) are left for `close_after_recodes`.
        return self.native.store_objects(disk, path, previous, items, defer_recodes=True)

    def close(self, prune: bool = False) -> None:
        """Releases the cache (`prune`, after a successful save or load: a kept cache keeps
        only what the next one needs). Recodes a save left undone are dropped: their journals
        stay noted in the cache, and its next save deletes them (the previous version's blobs
        stay whole)."""
        if self.native is not None:
            native, self.native = self.native, None
            self.traffic = native.traffic()
            native.close(prune=prune)

    def close_after_recodes(self, done) -> None:
        """After a successful save: `done(traffic)` with what the save moved; then the recodes
        its uploads left (the mirror layout replacing the previous version's blobs on the remote
        by deltas against the new ones) run on a thread of their own while training goes on,
        after which the cache is pruned and released and `done` is called again with what the
        recodes moved. Without recodes the cache is released now. A recode that fails is
        logged; the save stands (its journal stays noted in the cache, which the next save
        deletes)."""
        if self.native is None:
            return
        if not self.native.pending_recodes():
            self.close(prune=True)
            done(self.traffic)
            return
        saved = self.native.traffic()
        done(saved)

        def recode() -> None:
            try:
                self.native.finish_recodes()
            except Exception as e:  # noqa: BLE001 (the save is committed: only space is owed)
                _log.warning("ckpt: the recodes after a save to %s failed: %s", self.native.url, e)
            finally:
                self.close(prune=True)
                done({key: n - saved.get(key, 0) for key, n in self.traffic.items()})

        thread = threading.Thread(target=recode, name="ckpt-dcp-recodes")
        with _RECODES_LOCK:
            _RECODES.append(thread)
        thread.start()


def _prune_after_save(native, branch: str, keep_last: int) -> None:
    """`Writer(keep_last=N)`: the branch keeps its newest `keep_last` versions (`ckpt prune
    --keep-last N --branch BRANCH`: a tag keeps its version, another branch its history). A
    prune that fails is a warning: the save stands, and the next one prunes again."""
    try:
        report = json.loads(native.prune_json(keep_last, [branch]))
    except Exception as e:  # noqa: BLE001 (the save is committed; the next save prunes again)
        _log.warning("ckpt: the save is committed, but keeping the last %d of %s failed: %s", keep_last, branch, e)
        return
    if report.get("dropped"):
        _log.info("ckpt: dropped %d old versions of %s (keep_last=%d)", len(report["dropped"]), branch, keep_last)


# The background process after a save: `argv[1]` the repository; with `argv[2:4]` (branch,
# keep_last) it first prunes the branch (`Writer(keep_last=N)`; a failure is logged and the
# compaction still runs), then compacts, yielding to the next save.
_AFTER_SAVE_SCRIPT = (
    "import os, sys\n"
    "os.setpriority(os.PRIO_PROCESS, 0, 10)\n"
    "from ckpt._native import Repo\n"
    "repo = Repo.discover(sys.argv[1])\n"
    "if len(sys.argv) > 3:\n"
    "    try:\n"
    "        repo.prune_json(int(sys.argv[3]), [sys.argv[2]])\n"
    "    except Exception as e:\n"
    "        print(f'ckpt: keeping the last {sys.argv[3]} of {sys.argv[2]} failed: {e}', file=sys.stderr)\n"
    "repo.compact(yield_to_writers=True)\n"
)


def _compact_after_save(native, prune: Optional[Tuple[str, int]] = None) -> None:
    """Under the `reverse` delta policy a save leaves its version pending: the previous
    version's tensors become deltas against it only in a compaction. As after `ckpt commit`
    (the config's `compact`, or `CKPT_COMPACT`): in a background process at low priority that
    outlives this one and yields to the next save (the default), before returning (`inline`),
    or not at all (`manual`: `ckpt compact`). Without it every save would stay whole.

    `prune=(branch, keep_last)` (`Writer(keep_last=N)`): the branch is pruned first, in the same
    background process by default (a prune reads every kept version and runs a gc: about 2 s
    for a save of 16,000 items, which the ranks would otherwise wait for in `finish`), else
    before returning (`inline`, `manual`)."""
    mode = native.compaction_mode()
    if mode == "background" and sys.executable:
        if prune is None and not native.has_pending_deltas():
            return
        root = os.fspath(native.root)
        log_path = os.path.join(root, ".ckpt", "compact.log")
        # What the CLI's background compaction does (`ckpt compact --background`): niced, in a
        # session of its own, errors appended to the log `ckpt status` shows.
        args = [root] if prune is None else [root, prune[0], str(prune[1])]
        with open(log_path, "ab") as log:
            subprocess.Popen(
                [sys.executable, "-c", _AFTER_SAVE_SCRIPT, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        return
    if prune is not None:
        _prune_after_save(native, *prune)
    # `background` without an interpreter to start runs inline, as `inline` does.
    if mode != "manual" and native.has_pending_deltas():
        native.compact()


def _rank() -> int:
    """This process's rank (0 outside a process group): which kept cache it uses."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _open_target(target: str, cache: Any, layout: str, s3: Dict[str, Any], create: bool):
    if _is_remote(target):
        return _RemoteTarget(target, cache, layout, s3, create)
    return _RepoTarget(target)


_MAX_METADATA = 1 << 30


class _Unread(io.RawIOBase):
    """The stream of a rank file while loading: never read as a whole (each item's range is
    read by `Reader._slice_file`)."""

    def readable(self) -> bool:
        return False


class _RefusedGlobal(pickle.UnpicklingError):
    """A `.metadata` names a global DCP's metadata does not."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles a `.metadata` naming only what DCP's own metadata names (its dataclasses and
    enum, `torch.Size`, the dtypes, the layout helper, the path class of `checkpoint_id`: the
    Rust reader's list, `torch_zip::dcp::METADATA_CLASSES`): the store's bytes may
    come from a remote or a clone of one, and a plain `pickle.load`, which DCP's own reader
    does, runs whatever callable the bytes name. Anything else is refused before it is called."""

    _ALLOWED = frozenset(tuple(name.rsplit(".", 1)) for name in dcp_metadata_classes())

    def __init__(self, file, where: str) -> None:
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise _RefusedGlobal(
            f"{self.where}: names {module}.{name}, which DCP's metadata does not: refused, nothing "
            "was called (a Reader made with trust_metadata=True unpickles it as DCP would)"
        )


def _metadata_name(rank: Optional[int]) -> str:
    """The name of the metadata file DCP reads: `.metadata`, or a rank's own."""
    return ".metadata" if rank is None else f"__{rank}.metadata"


def _load_metadata(file, where: str) -> Any:
    """The `Metadata` pickled in `file` (read with [`_MetadataUnpickler`]); `where` names it in
    errors."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(file, where).load()
    except _RefusedGlobal:
        raise
    except Exception as e:  # a damaged pickle: any of the many errors unpickling raises
        raise pickle.UnpicklingError(f"{where}: not a DCP metadata pickle ({type(e).__name__}: {e})") from e
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"{where}: a pickled {type(metadata).__name__}, not DCP's Metadata")
    return metadata


def _classes():
    """The DCP classes, built on first use (torch is imported here, not at module import)."""
    global _BUILT
    if _BUILT is not None:
        return _BUILT
    from torch.distributed.checkpoint import filesystem as fs
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    from ckpt._native import PIECE_MIN as _PIECE_MIN  # writes that may be a storage a `PieceSink` takes
    from ckpt._native import CkptError, ReadAhead

    @dataclasses.dataclass
    class _Prefix(fs._StoragePrefix):
        """The file prefix of a rank, with the branch and the tip the save follows."""

        branch: str = ""
        tip: Optional[str] = None

    @dataclasses.dataclass(frozen=True)
    class _StoredResult(WriteResult):
        """A `WriteResult` that also carries its file as stored: (path, manifest, hash, len),
        and for a remote target the bytes its upload created."""

        stored: Optional[Tuple[Any, ...]] = None

    class _PieceStream(io.RawIOBase):
        """The stream DCP writes a rank file into (a memfd, `fd`), for a repository target:
        each `write` that is exactly a tensor's storage (`torch.save` hands over the tensor's
        own memory in one `write`) goes to `sink` (`PieceSink.take`), which stores it as a blob
        at once, and leaves a hole in the file; everything else (zip headers, pickles, small
        tensors) is written into the file. So no tensor is copied into the file and then read
        again to be stored."""

        def __init__(self, fd: int, name: str, sink) -> None:
            super().__init__()
            self.fd, self.name, self.sink = fd, name, sink
            self.at = 0
            # Small writes, gathered and written at `pending_at` in one `pwrite`.
            self.pending = bytearray()
            self.pending_at = 0

        def writable(self) -> bool:
            return True

        def tell(self) -> int:
            return self.at

        def write(self, data) -> int:
            n = memoryview(data).nbytes
            if n >= _PIECE_MIN and self.sink.take(data, self.name, self.at):
                self._write_pending()
            elif n >= _PIECE_MIN:
                self._write_pending()
                _pwrite_all(self.fd, data, self.at)
            else:
                if not self.pending:
                    self.pending_at = self.at
                self.pending += data
                if len(self.pending) >= 1 << 20:
                    self._write_pending()
            self.at += n
            return n

        def _write_pending(self) -> None:
            if self.pending:
                _pwrite_all(self.fd, self.pending, self.pending_at)
                self.pending = bytearray()

        def flush(self) -> None:
            self._write_pending()

        def close(self) -> None:
            if not self.closed:
                self._write_pending()
                # A hole at the end (a piece written last) still counts in the file's length.
                os.ftruncate(self.fd, self.at)
                os.close(self.fd)
            super().close()

    def _pwrite_all(fd: int, data, at: int) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.pwrite(fd, view, at)
            view, at = view[n:], at + n

    def _storage_hints(plan, planner) -> List[Tuple[Any, int, str, Any]]:
        """`(storage, length in bytes, dtype, chunk)` of each tensor DCP is about to write
        (`PieceSink`), resolved as DCP's writer resolves them: for a tensor in memory the
        storage is the memory `torch.save` will hand over; one DCP copies first (on a GPU, or a
        view of a larger storage) is known by its length and dtype."""
        import torch
        from torch.distributed.checkpoint.planner import WriteItemType

        hints = []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                continue
            tensor = planner.resolve_data(item)
            if not isinstance(tensor, torch.Tensor):
                continue
            length = tensor.numel() * tensor.element_size()
            if max(length, tensor.untyped_storage().nbytes()) >= _PIECE_MIN:
                # The chunk's place in its tensor: where the file's cut divides it into cells.
                data = item.tensor_data
                chunk = None
                if data is not None:
                    chunk = (list(data.size), list(data.chunk.offsets), list(data.chunk.sizes))
                hints.append((tensor.untyped_storage(), length, str(tensor.dtype).removeprefix("torch."), chunk))
        return hints

    class _StoreFS(fs.FileSystem):
        """DCP's `FileSystem`, with files kept in a store instead of a directory.

        Written files go to a memfd, stored when closed, or with `defer` kept (`written`) until
        the writer knows the items DCP wrote into each (`Writer.write_data`); with `sink` their
        tensors go to it instead, as they are written (`_PieceStream`). Read, only `.metadata`
        is read whole (each item of a rank file is read on its own, `Reader._slice_file`)."""

        def __init__(
            self,
            target,
            version: Optional[str] = None,
            previous: Optional[str] = None,
            defer: bool = False,
            sink=None,
        ):
            super().__init__()
            self.target = target
            self.version = version
            self.previous = previous
            self.defer = defer
            self.sink = sink
            self.stored: Dict[str, Tuple[Any, ...]] = {}
            # With `defer`: each written file's name and a descriptor of its memfd.
            self.written: Dict[str, int] = {}
            self.lock = threading.Lock()

        def store(self, name: str, fd: int, items=None) -> None:
            """Stores the memfd `fd` as the file `name` (cut into `items` if given)."""
            stored = self.target.store_objects(f"/proc/self/fd/{fd}", name, self.previous, items, self.sink)
            with self.lock:
                self.stored[name] = stored

        def close_written(self) -> None:
            with self.lock:
                fds, self.written = list(self.written.values()), {}
            for fd in fds:
                os.close(fd)

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
                    with _PieceStream(fd, name, self.sink) if self.sink is not None else os.fdopen(fd, "wb") as f:
                        yield f
                    if self.defer:
                        with self.lock:
                            self.written[name], kept = kept, -1
                    else:
                        self.store(name, kept)
                finally:
                    if kept >= 0:
                        os.close(kept)
            elif name.endswith(_METADATA):
                f = self.target.open_file(self.version, name)
                if f.len > _MAX_METADATA:
                    raise ValueError(f"{name}: {f.len} bytes, over the {_MAX_METADATA} bytes read into memory")
                with io.BytesIO(f.read(0, f.len)) as data:
                    yield data
            else:
                yield _Unread()

    def _allow_open_files(files: int) -> None:
        """Raises this process's soft limit of open files (up to the hard limit) so that `files`
        memfds fit beside what is already open; beyond the hard limit DCP's own error stands."""
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = files + 256
        if soft != resource.RLIM_INFINITY and soft < wanted:
            raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            if raised > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))

    def _written_item(result, chunks):
        """What `store_objects` takes of an item DCP wrote (`WriteResult`): `(offset, length,
        fqn, chunk, transformed)`, `chunk` `(dtype, tensor size, chunk offsets, chunk sizes)`
        from the plan's `TensorWriteData`, or `None` for a bytes item."""
        info, index = result.storage_data, result.index
        data = chunks.get(index)
        chunk = None
        if data is not None and index.offset is not None:
            dtype = str(data.properties.dtype).removeprefix("torch.")
            chunk = (dtype, list(data.size), list(data.chunk.offsets), list(data.chunk.sizes))
        transformed = bool(getattr(info, "transform_descriptors", None))
        return (info.offset, info.length, index.fqn, chunk, transformed)

    def _target_options(cache, layout, endpoint, region, allow_http) -> Dict[str, Any]:
        """The target's options, checked when the Writer or Reader is made (a repository target
        ignores them, but a wrong one is still a mistake): not at the first save or load."""
        if cache is not None and not isinstance(cache, bool) and not isinstance(cache, (str, os.PathLike)):
            raise _type_error("cache", "None, False or a directory", cache)
        # The extension's own parse of a layout name, as `RemoteStore.open` does it.
        check_layout(_str_arg(layout, "layout"))
        return {
            "cache": cache if cache is None or isinstance(cache, bool) else os.fspath(cache),
            "layout": layout,
            "s3": {
                "endpoint": _str_arg(endpoint, "endpoint", optional=True),
                "region": _str_arg(region, "region", optional=True),
                "allow_http": _bool_arg(allow_http, "allow_http"),
            },
        }

    class Writer(fs.FileSystemWriter):
        """A DCP `StorageWriter` that saves into the ckpt repository or remote at `target` as
        one version on `branch` (default: the repository's current branch; `main` on a remote),
        with `message` and `tags` (a name, or a list of names). For a remote: `layout`
        (`"mirror"` or `"deltas"`), `cache` (default `None`: a cache per remote and rank kept on
        this machine from save to save, locked while in use and pruned to about one save after
        each; `False`: a temporary one per save; or a directory used as it is; see the module
        docstring) and the S3 settings
        `endpoint`, `region`, `allow_http` (else from `AWS_*`). With the kept cache a save on top
        of the previous one downloads nothing of the rank's own previous file. After a save,
        `traffic` says what this rank moved for it (`RemoteStore.traffic`: downloads, uploads,
        recodes, requests, and their bytes). `keep_last=N` (a repository target only): after
        each save the branch keeps its newest N versions and the older ones are dropped and
        their space freed, as `ckpt prune --keep-last N` does (torchtitan's `keep_latest_k`);
        what a tag, another branch or a remote-tracking ref needs stays. Other keyword
        arguments go to `FileSystemWriter` (`thread_count`, `single_file_per_rank`, ...)."""

        def __init__(
            self,
            target: Any,
            message: Optional[str] = None,
            tags: Union[str, Iterable[str]] = (),
            branch: Optional[str] = None,
            layout: str = "mirror",
            cache: Any = None,
            endpoint: Optional[str] = None,
            region: Optional[str] = None,
            allow_http: bool = False,
            keep_last: Optional[int] = None,
            **kwargs: Any,
        ) -> None:
            # Every argument is checked here, not at the first save (inside `dcp.save`, on every
            # rank): a string of tags is one name, as `Repo.commit` takes it.
            tags = _str_list(tags, "tags")
            _str_arg(message, "message", optional=True)
            # Names as a commit checks them (CkptError, as `Repo.commit` raises for a tag name).
            branch = _str_arg(branch, "branch", optional=True)
            check_names(tags if branch is None else [*tags, branch])
            if keep_last is not None:
                _count_arg(keep_last, "keep_last", 1)
                if _is_remote(os.fspath(target)):
                    raise ValueError(
                        f"{os.fspath(target)}: keep_last is for a repository target; a remote keeps every "
                        "save (prune a clone, or the repository that pushes to it)"
                    )
            options = _target_options(cache, layout, endpoint, region, allow_http)
            kwargs.setdefault("sync_files", False)  # the store syncs what it writes
            super().__init__(path=os.fspath(target), **kwargs)
            self.target = os.fspath(target)
            self.keep_last = keep_last
            self.message = message if message is not None else "dcp save"
            self.tags = tags
            self.branch = branch
            self.options = options
            self._opened = None
            self.fs = _StoreFS(None)
            self.traffic: Dict[str, int] = {}
            # Saves are numbered as they begin (`set_up_storage_writer`); each thread knows the
            # number of the save it runs (`dcp.async_save` runs each in a thread of its own). A
            # save overtaken by a newer one on this Writer stops at its next step
            # (`_check_current`) instead of reading the state the newer one set.
            self._serial = 0
            self._serial_lock = threading.Lock()
            self._local = threading.local()
            # Per save: the branch, its tip and the tag its compare-and-swap expects
            # (`prepare_global_plan`, read by `finish`).
            self._tips: Dict[int, Tuple[Any, Any, Any]] = {}
            # Per save, the coordinator's record of it in flight (a repository target), from
            # before any rank stores an object until `finish` (or the next save, if it failed).
            self._save_records: Dict[int, Any] = {}

        def _end_save_records(self, serial: Optional[int] = None) -> None:
            with self._serial_lock:
                if serial is None:
                    records, self._save_records = list(self._save_records.values()), {}
                else:
                    records = [r for r in [self._save_records.pop(serial, None)] if r is not None]
            for record in records:
                record.end()

        def _is_current(self) -> bool:
            """Whether no newer save has begun on this Writer since the one this thread runs
            (two overlapping `dcp.async_save` calls with one Writer)."""
            mine = getattr(self._local, "serial", None)
            with self._serial_lock:
                return mine is not None and mine == self._serial

        def _check_current(self) -> int:
            """The number of the save this thread runs; an error if it is overtaken."""
            if not self._is_current():
                raise RuntimeError(
                    f"ckpt.dcp.Writer({self.target!r}): another save began on this Writer before this one "
                    "finished (overlapping dcp.async_save calls); this save is abandoned and commits nothing. "
                    "Wait for the previous save's future first, or give each save in flight a Writer of its own"
                )
            return self._local.serial

        def _target(self):
            # Opened in the rank's own process (a Writer may be made before a fork or spawn),
            # after the recodes of this process's earlier saves.
            if self._opened is None:
                if _is_remote(self.target):
                    _wait_for_recodes()
                opened = _open_target(self.target, create=True, **self.options)
                if opened.prefix:
                    opened.close()
                    # Saved at the root regardless, its load from this path would read whatever
                    # the root holds: refused instead.
                    raise ValueError(
                        f"{self.target}: a directory inside the repository at {opened.native.root}; the "
                        "Writer saves each checkpoint as one version of the repository's root: pass the "
                        "root (a run of its own: `branch=`), and find a save again by its version, tag "
                        "or message"
                    )
                self._opened = opened
            return self._opened

        def _close(self, saved: bool = False) -> None:
            """Releases the target; after a successful save to a remote the recodes its uploads
            left run first, in the background (`_RemoteTarget.close_after_recodes`): `traffic`
            says what the save moved at once, and adds the recodes once they are done
            (`ckpt.dcp._wait_for_recodes()` waits for them)."""
            if self._opened is None:
                return
            opened, self._opened = self._opened, None

            def count(traffic: Dict[str, int]) -> None:
                for key, n in traffic.items():
                    self.traffic[key] = self.traffic.get(key, 0) + n

            if saved and isinstance(opened, _RemoteTarget):
                opened.close_after_recodes(count)
            else:
                opened.close(prune=saved)
                count(getattr(opened, "traffic", {}))

        def reset(self, checkpoint_id=None) -> None:
            if checkpoint_id:
                self.target = os.fspath(checkpoint_id)
                self._close()
            self.traffic = {}
            super().reset(None)

        def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
            # The first step of every save, in the thread that runs it (DCP calls `reset` only
            # when given a checkpoint_id, and `async_save` calls it in the caller's thread).
            # A save that failed before `finish` left its record: it is over now.
            self._end_save_records()
            with self._serial_lock:
                self._serial += 1
                self._local.serial = self._serial
            super().set_up_storage_writer(is_coordinator, *args, **kwargs)
            self._is_coordinator = is_coordinator
            self.fs = _StoreFS(self._target())
            if is_coordinator and self.tags:
                self._target().check_tags(self.tags)

        def prepare_local_plan(self, plan):
            plan = super().prepare_local_plan(plan)
            if not self.use_collectives:
                raise RuntimeError("ckpt.dcp.Writer needs rank coordination (use_collectives=True)")
            return plan

        def prepare_global_plan(self, plans):
            # Before any rank stores an object (they do once the plans are scattered): `ckpt gc`,
            # even `--prune=now`, keeps what this save writes until `finish` names it.
            serial = self._check_current()
            record = self._target().begin_save(f"ckpt.dcp.Writer save to {self.target}")
            if record is not None:
                with self._serial_lock:
                    self._save_records[serial] = record
            # The tip (and, on a remote, its tag) that `finish` compares the branch against.
            branch, tip, cas = self._target().tip(self.branch)
            with self._serial_lock:
                self._tips[serial] = (branch, tip, cas)
            plans = super().prepare_global_plan(plans)
            return [
                dataclasses.replace(p, storage_data=_Prefix(p.storage_data.prefix, branch=branch, tip=tip)) for p in plans
            ]

        def write_data(self, plan, planner):
            self._check_current()
            saved = False
            current = True
            try:
                # Each file is stored once DCP has written all of them and said where each item
                # lies: cut into its items and named by fqn and chunk offsets, as `.metadata`
                # names them (it does not exist yet).
                # A repository target (under `reverse`) takes each tensor as DCP writes it.
                sink = self._target().piece_sink(_storage_hints(plan, planner))
                # This save's files, whatever a newer save on this Writer sets `self.fs` to.
                files = self.fs = _StoreFS(self._target(), previous=plan.storage_data.tip, defer=True, sink=sink)
                try:
                    # One memfd per file stays open until every file is written: with
                    # `single_file_per_rank=False` that is one per item, past the usual 1024.
                    _allow_open_files(len(plan.items))
                    results = super().write_data(plan, planner).value()
                    current = self._is_current()
                    self._check_current()
                    chunks = {i.index: i.tensor_data for i in plan.items if i.tensor_data is not None}
                    by_file: Dict[str, List[Any]] = {}
                    for r in results:
                        by_file.setdefault(r.storage_data.relative_path, []).append(_written_item(r, chunks))
                    for name, fd in sorted(files.written.items()):
                        files.store(name, fd, by_file.get(name, []))
                    saved = True
                finally:
                    files.close_written()
            finally:
                # This rank's part is uploaded (or failed): its cache is released (pruned if
                # kept and the upload succeeded; deleted if temporary), after the recodes the
                # upload left, which run on in the background. The coordinator keeps it for
                # `finish` (which stores `.metadata` through it) and releases it there.
                # (Not an overtaken save's: the target is the newer save's now.)
                if current and _is_remote(self.target) and not (saved and getattr(self, "_is_coordinator", False)):
                    self._close(saved=saved)
            stored = files.stored
            out = [
                _StoredResult(r.index, r.size_in_bytes, r.storage_data, stored[r.storage_data.relative_path])
                for r in results
            ]
            fut: Future = Future()
            fut.set_result(out)
            return fut

        def finish(self, metadata, results) -> None:
            files: Dict[str, Tuple[Any, ...]] = {}
            plain = []
            for rank_results in results:
                for r in rank_results:
                    files[r.stored[0]] = r.stored
                plain.append([WriteResult(r.index, r.size_in_bytes, r.storage_data) for r in rank_results])
            serial = self._check_current()
            saved = False
            current = True
            try:
                target = self._target()
                with self._serial_lock:
                    branch, tip, cas = self._tips.pop(serial)
                metadata_file = self.fs = _StoreFS(target, previous=tip)
                super().finish(metadata, plain)
                # Checked last before the commit: a newer save that began meanwhile may have
                # taken `self.fs` (and `.metadata` with it).
                current = self._is_current()
                self._check_current()
                files.update(metadata_file.stored)
                self.version = target.commit(
                    branch, tip, cas, list(files.values()), self.message, self.tags, self.keep_last
                )
                saved = True
            finally:
                # After the version names the objects (or the save failed: they are garbage).
                self._end_save_records(serial)
                if current and _is_remote(self.target):
                    self._close(saved=saved)

        def storage_meta(self):
            return StorageMeta(checkpoint_id=self.target, save_id=self.save_id)

        @property
        def checkpoint_id(self):
            return self.target

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id) -> bool:
            return False

    class Reader(fs.FileSystemReader):
        """A DCP `StorageReader` of version `rev` of the ckpt repository or remote at `target`,
        read item by item from the store (nothing checked out). For a remote: `cache` (default
        `None`: this rank's kept cache, the one its saves use, so a load after a save on the same
        rank downloads nothing of the rank's own file; `False`: a temporary one; or a
        directory) and the S3 settings. `.metadata` is unpickled allowing only the classes DCP's
        metadata names (`trust_metadata=True`: any, as DCP's own reader does; only for a store
        whose every writer you trust)."""

        def __init__(
            self,
            target: Any,
            rev: str = "HEAD",
            cache: Any = None,
            endpoint: Optional[str] = None,
            region: Optional[str] = None,
            allow_http: bool = False,
            trust_metadata: bool = False,
        ) -> None:
            _str_arg(rev, "rev")
            _bool_arg(trust_metadata, "trust_metadata")
            options = _target_options(cache, "mirror", endpoint, region, allow_http)
            super().__init__(path=os.fspath(target))
            self.target = os.fspath(target)
            self.rev = rev
            self.trust_metadata = trust_metadata
            self.options = options
            self._opened = None
            self._version: Optional[str] = None
            self._files: Dict[str, Any] = {}
            # What this rank moved for its last load from a remote (`RemoteStore.traffic`).
            self.traffic: Dict[str, int] = {}
            self._ahead = None
            # (file, offset, length) of each item read ahead -> its indices in the read-ahead.
            self._ahead_index: Dict[Any, List[int]] = {}

        def _store_fs(self):
            if self._opened is None:
                if _is_remote(self.target):
                    _wait_for_recodes()
                self._opened = _open_target(self.target, create=False, **self.options)
            if self._version is None:
                # One version for every read of this load, whatever moves meanwhile.
                self._version = self._opened.resolve(self.rev)
            return _StoreFS(self._opened, version=self._version)

        def _close(self) -> None:
            if self._ahead is not None:
                self._ahead.close()
                self._ahead = None
            self._ahead_index = {}
            self._files = {}
            if self._opened is not None:
                # A kept cache keeps what this load read (and what the rank's saves stored).
                self._opened.close(prune=True)
                self.traffic = getattr(self._opened, "traffic", {})
                self._opened = None

        def reset(self, checkpoint_id=None) -> None:
            if checkpoint_id:
                self.target = os.fspath(checkpoint_id)
                self._close()
                self._version = None
            super().reset(None)

        def read_metadata(self, *args: Any, **kwargs: Any):
            self.fs = self._store_fs()
            if self.trust_metadata:
                return super().read_metadata(*args, **kwargs)
            # As DCP's reader does, but through the restricted unpickler.
            from torch.distributed.checkpoint.metadata import StorageMeta

            path = self.fs.concat_path(self.path, _metadata_name(kwargs.get("rank")))
            with self.fs.create_stream(path, "rb") as file:
                metadata = _load_metadata(file, f"{self.target} at {self._version}: {os.path.basename(path)}")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def _stored(self, path: str):
            stored = self._files.get(path)
            if stored is None:
                stored = self._opened.open_file(self._version, path)
                self._files[path] = stored
            return stored

        def _slice_file(self, file, sinfo):
            # Only this item's bytes, decoded from the store into the `bytes` that BytesIO
            # shares: memory is about the item (and what is read ahead).
            key = (sinfo.relative_path, sinfo.offset, sinfo.length)
            try:
                data = None
                ahead = self._ahead_index.get(key)
                if ahead and self._ahead is not None:
                    data = self._ahead.take(ahead.pop(0))
                if data is None:
                    data = self._stored(sinfo.relative_path).read(sinfo.offset, sinfo.length)
            except CkptError as e:
                raise CkptError(f"{sinfo.relative_path}: bytes {sinfo.offset}+{sinfo.length}: {e}") from e
            return io.BytesIO(data)

        def _read_direct(self, plan, planner):
            """Loads each tensor item it can by decoding its stored bytes straight into the
            tensor DCP loads it into, and returns the plan of the other items (for
            FileSystemReader.read_data). Stock DCP reads the item's `torch.save` archive,
            `torch.load`s it (a copy into a new tensor) and copies the part it needs into
            the destination; here the store decodes (verified, on every core) into the
            destination itself. Taken when the item's archive holds one row-major tensor of the
            destination's dtype (`StoredFile.tensor_in`), the part read is a range of its rows
            (a load on another rank count), and the destination is a contiguous CPU tensor of
            that part's shape; anything else goes the stock way."""
            import torch
            from torch.distributed.checkpoint.planner import LoadItemType

            rest = []
            for req in plan.items:
                if req.type != LoadItemType.TENSOR or not self._load_direct(req, planner, torch):
                    rest.append(req)
            return dataclasses.replace(plan, items=rest) if len(rest) != len(plan.items) else plan

        def _load_direct(self, req, planner, torch) -> bool:
            sinfo = self.storage_data[req.storage_index]
            if getattr(sinfo, "transform_descriptors", None):
                return False
            offsets, lengths = list(req.storage_offsets), list(req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.device.type != "cpu" or not target.is_contiguous() or list(target.shape) != lengths:
                return False
            stored = self._stored(sinfo.relative_path)
            found = stored.tensor_in(sinfo.offset, sinfo.length, str(target.dtype).removeprefix("torch."))
            if found is None:
                return False
            start, shape = found
            if not shape or len(shape) != len(offsets) or any(offsets[1:]) or lengths[1:] != shape[1:]:
                return False
            if offsets[0] + lengths[0] > shape[0]:
                return False
            row = target.element_size()
            for d in shape[1:]:
                row *= d
            if target.numel():
                out = target.reshape(-1).view(torch.uint8).numpy()
                try:
                    stored.read_into_buffer(start + offsets[0] * row, lengths[0] * row, out)
                except CkptError as e:
                    raise CkptError(f"{sinfo.relative_path}: bytes {sinfo.offset}+{sinfo.length}: {e}") from e
            planner.commit_tensor(req, target)
            return True

        def _read_ahead(self, plan) -> None:
            """Starts decoding the plan's items on a thread of the extension, in the order
            FileSystemReader.read_data asks for them (file by file, in the order each file
            first appears; items in plan order), while DCP loads the ones before. An item
            asked for in another order is read then instead; none is read twice."""
            per_file: Dict[str, List[Any]] = {}
            for item in plan.items:
                sinfo = self.storage_data[item.storage_index]
                per_file.setdefault(sinfo.relative_path, []).append(sinfo)
            order = [sinfo for infos in per_file.values() for sinfo in infos]
            if len(order) < 2 or READ_AHEAD_ITEMS <= 0 or READ_AHEAD_BYTES <= 0 or not _spare_cpu():
                return
            items = []
            for i, sinfo in enumerate(order):
                items.append((self._stored(sinfo.relative_path), sinfo.offset, sinfo.length))
                self._ahead_index.setdefault((sinfo.relative_path, sinfo.offset, sinfo.length), []).append(i)
            self._ahead = ReadAhead(items, READ_AHEAD_ITEMS, READ_AHEAD_BYTES)

        def prepare_global_plan(self, plans):
            # Every rank reads the version the coordinator resolved (each resolved `rev` itself
            # to read `.metadata`): a branch moved in between is an error, not a mixed load.
            plans = super().prepare_global_plan(plans)
            return [dataclasses.replace(p, storage_data=self._version) for p in plans]

        def read_data(self, plan, planner):
            self.fs = self._store_fs()
            if plan.storage_data is not None and plan.storage_data != self._version:
                raise RuntimeError(
                    f"{self.rev!r} moved during the load ({plan.storage_data} on the coordinator, "
                    f"{self._version} here): load a version id or a tag"
                )
            try:
                plan = self._read_direct(plan, planner)
                self._read_ahead(plan)
                return super().read_data(plan, planner)
            finally:
                # The last step of a load: what is read ahead and a temporary cache go.
                self._close()

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


def Writer(
    target: Any,
    message: Optional[str] = None,
    tags: Union[str, Iterable[str]] = (),
    branch: Optional[str] = None,
    **kwargs: Any,
):
    """A DCP `StorageWriter` saving into the ckpt repository or remote at `target` (see the
    module docstring): one version on `branch` (default: the current branch; `main` on a
    remote) with `message`, `tags` (a name, or a list of names). For a remote also `layout`,
    `cache`, `endpoint`, `region`, `allow_http`. Every argument is checked here (TypeError,
    ValueError), not at the first save."""
    return _classes()["Writer"](target, message=message, tags=tags, branch=branch, **kwargs)


def Reader(target: Any, rev: str = "HEAD", **kwargs: Any):
    """A DCP `StorageReader` of version `rev` of the ckpt repository or remote at `target`
    (for a remote also `cache`, `endpoint`, `region`, `allow_http`; `trust_metadata`: unpickle
    `.metadata` as DCP does, any class it names)."""
    return _classes()["Reader"](target, rev=rev, **kwargs)
