"""Type stubs of ``ckpt._native``, the Rust side of the package (python/src/lib.rs): the Python
modules turn tensors into the layout it asks for and copy their bytes; everything else
(committing, deltas, reading back) is the ``ckpt`` library. Use ``ckpt.Repo``, not this."""

import os
import pathlib
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

_Path = Union[str, os.PathLike[str]]

# One item a DCP rank wrote into its file (from DCP's `WriteResult` and the plan's
# `TensorWriteData`): `(offset, length, fqn, chunk, transformed)`, `chunk` being `None` for a
# bytes item or `(torch dtype name, tensor size, chunk offsets, chunk sizes)`.
WrittenItem = Tuple[int, int, str, Optional[Tuple[str, Sequence[int], Sequence[int], Sequence[int]]], bool]

PIECE_MIN: int
"""Writes shorter than this are never taken by a `PieceSink`."""

class CkptError(Exception):
    """An error of a ckpt operation; its message is the CLI's."""

def dcp_metadata_classes() -> List[str]:
    """The globals a DCP `.metadata` pickle may name (``module.name``): the Rust reader's
    allow-list."""

def check_layout(name: str) -> None:
    """Raises ValueError unless `name` is a remote layout (``"mirror"``, ``"deltas"``), as
    ``RemoteStore.open`` takes it."""

def check_names(names: Sequence[str]) -> None:
    """Raises CkptError for the first of `names` that is not a valid branch or tag name (as a
    commit refuses it)."""

def exit_with_failure() -> bool:
    """Makes the process exit with status 1 once the interpreter is finalized (a background
    commit failed and nobody was told). Returns whether that is in place; if not, the caller
    exits itself."""

class CommitHandle:
    """A commit running in the background (``Repo.commit`` with ``background=True``)."""

    def wait(self, timeout: Optional[float] = None) -> str:
        """Waits for the commit (without holding the GIL) up to `timeout` seconds (``None``: as
        long as it takes); returns the version id, or raises the commit's error (every time it
        is called), or ``TimeoutError``. A negative `timeout` is a ``ValueError``."""
    def join(self, timeout: Optional[float] = None) -> bool:
        """Waits like ``wait()``, but neither raises the commit's error nor counts as reporting
        it: whether it has finished."""
    def done(self) -> bool:
        """Whether the commit has finished (successfully or not). In a forked child, ``True``:
        the commit runs in the parent, never here."""
    @property
    def error(self) -> Optional[str]:
        """The commit's error message once it has failed; ``None`` while it runs, or if it
        succeeded."""
    @property
    def reported(self) -> bool:
        """Whether its outcome reached the caller (see ``mark_reported``)."""
    def mark_reported(self) -> None:
        """Records that the outcome was handed to someone who took charge of it (logged by a
        training callback): the process then does not exit with status 1 for it."""
    @property
    def message(self) -> str:
        """The commit's message."""
    @property
    def root(self) -> pathlib.Path:
        """The root of the repository it commits to."""
    @property
    def ours(self) -> bool:
        """Whether this process runs the commit (``False`` in a forked child)."""

class MemoryImage:
    """A safetensors file laid out in memory: the header written, each tensor's bytes to be
    written by the caller (``os.pwrite(fd, buffer, start)``) before it is committed."""

    @property
    def fd(self) -> int:
        """The memory file's descriptor (valid until the image is committed)."""
    @property
    def ranges(self) -> List[Tuple[int, int]]:
        """``(start, end)`` of each tensor's bytes, in the order the tensors were given."""
    @property
    def len(self) -> int:
        """The file's total length."""
    @property
    def path(self) -> str:
        """The path it is committed under."""

class SaveRecord:
    """A save in flight announced in a repository (``Repo.begin_save``)."""

    def end(self) -> None:
        """Ends the save: the record is deleted (again: nothing)."""

class Repo:
    """An open repository."""

    @staticmethod
    def init(path: _Path) -> Repo:
        """Creates a repository in `path` (created if missing)."""
    @staticmethod
    def discover(path: _Path) -> Repo:
        """Opens the repository holding `path` (this directory or a parent, as the CLI finds
        it)."""
    def set_reuse_buffers(self, reuse: bool) -> None:
        """Keep each capture's memory for the next capture of the same path (``True``), or free
        it once committed (``False``, the default). Keeping it makes the next capture about 3x
        faster (no page allocation) at the cost of holding one checkpoint's bytes between
        commits."""
    @property
    def root(self) -> pathlib.Path:
        """The working tree's root."""
    def prepare(
        self,
        path: str,
        tensors: Sequence[Tuple[str, str, Sequence[int]]],
        metadata: Optional[Mapping[str, str]] = None,
    ) -> MemoryImage:
        """Lays out a safetensors file of `tensors` (``(name, dtype, shape)``, dtype a
        safetensors name such as ``"F32"``; another name is a ``ValueError``) and `metadata` in
        memory, as ``safetensors``' ``save_file`` would write it; the caller writes each
        tensor's bytes at its range."""
    def prepare_bytes(self, path: str, data: bytes) -> MemoryImage:
        """A memory file holding `data` as it is, to commit under `path`."""
    def check_tags(self, tags: Sequence[str]) -> None:
        """Checks `tags` as a commit would before writing anything: valid names, each once,
        none that exists as a tag or a branch."""
    def commit(
        self,
        files: List[Tuple[str, Union[MemoryImage, _Path]]],
        message: str,
        tags: Sequence[str] = ...,
        exact: bool = False,
        background: bool = False,
    ) -> Union[str, CommitHandle]:
        """Commits `files` (a list of ``(path, MemoryImage | disk path)``; another source is a
        ``TypeError``) with `message`, then tags the version with each of `tags`. With `exact`,
        the version holds only these files. Everything is checked first (paths, tags; files on
        disk are opened now, and read from there): an error is raised before anything is
        written. Returns the version id; with `background`, a ``CommitHandle`` at once, the
        commit running on another thread. The caller waits for an earlier background commit of
        the repository first (the Python package does)."""
    def current_branch(self) -> Tuple[str, Optional[str]]:
        """The current branch and the version it points at (`None`: none yet); a detached
        `HEAD` is an error."""
    def begin_save(self, what: str) -> SaveRecord:
        """Announces a save whose objects are stored before anything names them (a
        ``ckpt.dcp.Writer`` save): gc keeps them, whatever its grace period, until the
        record's ``end()``."""
    def branch_tip(self, name: str) -> Optional[str]:
        """The version branch `name` points at (`None`: no such branch or no version yet)."""
    def store_objects(
        self,
        disk: str,
        path: str,
        previous: Optional[str] = None,
        items: Optional[Sequence[WrittenItem]] = None,
        pieces: Optional[PieceSink] = None,
    ) -> Tuple[str, str, str, int]:
        """Stores the file at `disk` as the content of `path`: objects only (no version, no
        ref, no writer lock), delta-coded against the same items in version `previous` where
        the delta policy allows. A `.distcp` file is cut into `items`, the items its writer
        wrote into it, named by fqn and chunk offsets as `.metadata` names them (a report
        that does not fit the file: cut by walking its archives, `archive.<n>`). `pieces`:
        the sink that took tensors of this file while it was written (holes in the file at
        `disk`). Returns `(path, manifest, file hash, length)` for `commit_stored`."""
    def piece_sink(
        self, hints: Sequence[Tuple[Any, int, str, Optional[Tuple[List[int], List[int], List[int]]]]]
    ) -> Optional[PieceSink]:
        """A sink for the tensors of a save's files, with `hints` `(storage, tensor length in
        bytes, torch dtype name, chunk)` of the tensors about to be written (each storage asked
        for `data_ptr()` and `nbytes()`; `chunk`: the whole tensor's size, the chunk's offsets
        and sizes, which say where the chunk is cut into cells, or `None`); `None` under a delta
        policy other than ``reverse``."""
    def commit_stored(
        self,
        branch: str,
        expected: Optional[str],
        files: Sequence[Tuple[str, str, str, int]],
        message: str,
        tags: Sequence[str] = (),
    ) -> str:
        """Writes one version of `files` (as `store_objects` returned them) on top of
        `expected` and moves `branch` to it unless the branch has moved since (an error,
        nothing written); tags it with `tags`. Returns the version id."""
    def compaction_mode(self) -> str:
        """When versions left pending by `commit_stored` become deltas: ``"background"``,
        ``"inline"`` or ``"manual"`` (``CKPT_COMPACT``, else the config's ``compact``)."""
    def has_pending_deltas(self) -> bool:
        """Whether versions wait for their parent's blobs to become deltas."""
    def compact(self, yield_to_writers: bool = False) -> Tuple[int, int, int, int, int, int]:
        """Codes what the saves of pending versions stored uncoded and rewrites their parents
        as deltas (``ckpt compact``); returns ``(versions, blobs rewritten, bytes before, bytes
        after, versions still pending, blobs coded)``."""
    def prune_json(
        self,
        keep_last: int,
        branches: List[str] = ...,
        dry_run: bool = False,
        grace_seconds: Optional[float] = None,
    ) -> str:
        """Keeps the newest `keep_last` versions of `branches` (default: the current one), drops
        the rest of their history and frees the space (``ckpt prune --json``, a JSON string)."""
    def resolve(self, rev: str) -> str:
        """The full id of the version `rev` names."""
    def log_json(self, rev: str = "HEAD") -> str:
        """The history from `rev`, newest first, as ``ckpt log --json`` prints it (a JSON
        string)."""
    def report_text(
        self,
        range: str = "HEAD",
        tensor: Optional[str] = None,
        max_versions: Optional[int] = None,
        html: bool = False,
    ) -> str:
        """``ckpt report`` of `range`: with `html` the page, otherwise the cells as a JSON list."""
    def files(self, rev: str = "HEAD") -> List[Tuple[str, str, int, str, str]]:
        """The files of version `rev`: ``(path, format, length, file hash, manifest id)``,
        format ``"safetensors"``, ``"torch"`` or ``"bytes"``."""
    def read_tensors(
        self, rev: str, path: str, names: Optional[Sequence[str]] = None
    ) -> List[Tuple[str, str, List[int], bytearray]]:
        """The tensors of `path` in `rev` whose names are in `names` (all if ``None``), read from
        the store: a list of ``(name, dtype, shape, bytearray)``."""
    def read_file(self, rev: str, path: str, limit: int = ...) -> bytes:
        """The bytes of the (small) file `path` in `rev`, at most `limit` bytes (1 GiB by
        default)."""
    def checkout(
        self,
        rev: str = "HEAD",
        output: Optional[_Path] = None,
        files: Optional[Sequence[_Path]] = None,
        force: bool = False,
    ) -> List[str]:
        """Writes the files of `rev` (all, or `files`) under `output` (default: the working
        tree, which refuses to overwrite changes the repository does not hold unless `force`).
        Returns the paths written."""
    def tag(self, name: str, rev: Optional[str] = None) -> str:
        """Tags `rev` (default ``HEAD``) as `name`."""
    def tags(self) -> List[Tuple[str, str]]:
        """Every tag and its version id."""
    def open_file(self, rev: str, path: str) -> "StoredFile":
        """A reader of byte ranges of the file `path` in version `rev`, from the store."""

class StoredFile:
    """Byte ranges of one stored file, decoded and verified segment by segment."""

    @property
    def len(self) -> int:
        """The file's length."""
    def read(self, offset: int, length: int) -> bytes:
        """The `length` bytes at `offset` (only the segments they cover are decoded), decoded
        straight into the returned ``bytes``."""
    def tensor_in(self, offset: int, length: int, torch_dtype: str) -> Optional[Tuple[int, List[int]]]:
        """The tensor stored in bytes `offset`..`offset + length` (a DCP item) if it has the
        torch dtype `torch_dtype`: where its bytes start in the file and its shape (its bytes
        are its elements in row-major order); else ``None``."""
    def read_into_buffer(self, offset: int, length: int, out: Any) -> None:
        """Decodes the `length` bytes at `offset` (verified) straight into `out`, a writable
        contiguous buffer of exactly `length` bytes, untouched by the caller until it returns."""

class ReadAhead:
    """Items of stored files decoded ahead of their consumer on a thread of the extension
    (``ckpt.dcp.Reader``): at most `max_items` items and `max_bytes` bytes held ahead; larger
    items are read when taken."""

    def __init__(self, items: List[Tuple[StoredFile, int, int]], max_items: int, max_bytes: int) -> None:
        """Starts reading `items` (stored file, offset, length), in the order they will be
        asked for."""
    def take(self, index: int) -> Optional[bytes]:
        """Item `index`, waiting while it is being read; ``None`` when it was not read ahead
        (the caller reads it). An item whose read failed raises ``CkptError``."""
    def close(self) -> None:
        """Stops the worker after the item it is reading and drops what it holds."""

class PieceSink:
    """The tensors one ``ckpt.dcp.Writer`` rank hands over while DCP writes its file: each
    ``write`` that is exactly a hinted storage is stored at once as an uncoded blob (read in
    place, without the GIL) and left out of the file (`Repo.piece_sink`)."""

    def take(self, data: Any, file: str, offset: int) -> bool:
        """Stores `data` (a contiguous buffer) written at `offset` of `file` if it is exactly
        one of the hinted storages, or as long as hinted tensors of one dtype (a copy);
        ``False``: the caller writes it into the file."""
    def __len__(self) -> int: ...

class RemoteStore:
    """A remote (``s3://…``, ``file://…``) the ranks of a distributed save write to and read
    from without a repository, each through a cache of its own (``ckpt.dcp``)."""

    @staticmethod
    def open(
        url: str,
        cache: _Path,
        layout: str = "mirror",
        endpoint: Optional[str] = None,
        region: Optional[str] = None,
        allow_http: bool = False,
        create: bool = False,
    ) -> "RemoteStore":
        """Opens the remote at `url` (S3 settings from the ``AWS_*`` environment, overridden by
        these; a directory remote is created if missing when `create`) with its cache in
        `cache` (created if missing); uploads go in `layout` (``"mirror"`` or ``"deltas"``)."""
    @property
    def url(self) -> str:
        """The remote's URL, without credentials."""
    def branch_tip(self, name: str) -> Tuple[Optional[str], Optional[str]]:
        """Where branch `name` is: ``(version or None, tag or None)``, the tag being what
        `commit` compares against."""
    def check_tags(self, tags: Sequence[str]) -> None:
        """Raises if a tag is invalid, given twice or exists on the remote."""
    def resolve(self, rev: str) -> str:
        """The full id of the version `rev` (``HEAD``, a branch, a tag, an id) names there."""
    def store_objects(
        self,
        disk: str,
        path: str,
        previous: Optional[str] = None,
        items: Optional[Sequence[WrittenItem]] = None,
        defer_recodes: bool = False,
    ) -> Tuple[str, str, str, int, int]:
        """Stores the file at `disk` as `path` in the cache (a `.distcp` file cut into
        `items`, as `Repo.store_objects`) and uploads what the remote lacks, coded against the
        same items in version `previous` (for a `.distcp` file, in any `.distcp` file there;
        only the manifests and blobs that pairing needs are downloaded; the remote is not
        listed). Returns `(path, manifest, file hash, length, stored bytes)`: the first four
        for `commit`, the last what the upload created on the remote (its new objects; not the
        mirror layout's recodes of the previous version's). With `defer_recodes` those
        recodes are left for `finish_recodes`."""
    def pending_recodes(self) -> int:
        """Blobs the recodes left by ``store_objects(..., defer_recodes=True)`` will recode."""
    def finish_recodes(self) -> int:
        """Does the recodes ``store_objects(..., defer_recodes=True)`` left (the previous
        version's blobs become XOR deltas against the new ones on the remote), without the
        GIL; returns the objects replaced."""
    def commit(
        self,
        branch: str,
        expected: Optional[str],
        tag: Optional[str],
        files: Sequence[Tuple[str, str, str, int]],
        message: str,
        tags: Sequence[str] = (),
        stored_bytes: int = 0,
    ) -> str:
        """Writes one version of `files` to the remote and moves `branch` there by
        compare-and-swap against ``(expected, tag)`` from `branch_tip`; then creates `tags`.
        `stored_bytes` is the version's figure (``ckpt log``): what the files' uploads created,
        added up. Returns the version id; raises, moving nothing, if the branch moved
        meanwhile."""
    def open_file(self, version: str, path: str) -> StoredFile:
        """A reader of byte ranges of `path` in `version` (a full id), after downloading that
        file's objects (only that file's) into the cache."""

class RemoteReader:
    """A read-only handle on a remote without a repository (``ckpt.open``, ``ckpt.safe_open``):
    only what a read needs is downloaded, through a cache."""

    @staticmethod
    def open(
        url: str,
        cache: Optional[_Path] = None,
        temporary: bool = False,
        endpoint: Optional[str] = None,
        region: Optional[str] = None,
        allow_http: bool = False,
    ) -> "RemoteReader": ...
    @property
    def url(self) -> str: ...
    @property
    def cache_dir(self) -> str: ...
    def requests(self) -> int: ...
    def resolve(self, rev: str) -> str: ...
    def refs(self) -> List[Tuple[str, str, str]]: ...
    def log(
        self, rev: str, max: Optional[int] = None
    ) -> List[Tuple[str, List[str], int, str, List[str], int, int]]: ...
    def files(self, version: str) -> List[Tuple[str, int, str]]: ...
    def holds_tensors(self, version: str, path: str) -> bool: ...
    def tensors(self, version: str, path: str) -> List[Tuple[str, str, List[int]]]: ...
    def metadata(self, version: str, path: str) -> Optional[Dict[str, str]]: ...
    def read(
        self, version: str, path: str, name: str, start: Optional[int] = None, stop: Optional[int] = None
    ) -> Tuple[str, List[int], bytearray]: ...
    def close(self, prune: bool = False) -> None: ...
