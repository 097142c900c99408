"""What the training-framework callbacks share: committing a checkpoint folder or file."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Dict, Optional, Union

from ckpt import CkptError, Repo, _bool_arg, _type_error

_log = logging.getLogger("ckpt")


def check_arguments(repo: object, background: object) -> None:
    """A callback's arguments, checked when it is made: a wrong one would otherwise surface
    at the first checkpoint, or (in the background) only as a warning there."""
    if repo is not None and not isinstance(repo, (Repo, str, os.PathLike)):
        raise _type_error("repo", "a ckpt.Repo, a path or None", repo)
    _bool_arg(background, "background")


def open_or_init(repo: Optional[Union[Repo, str, os.PathLike]], default_dir: str) -> Repo:
    """`repo` itself, the repository holding the path `repo`, or (None) the one holding
    `default_dir`, created there if there is none."""
    if isinstance(repo, Repo):
        return repo
    path = os.fspath(repo) if repo is not None else default_dir
    os.makedirs(path, exist_ok=True)
    try:
        return Repo(path)
    except CkptError as e:
        # Only "no repository here" makes one: any other error (a damaged repository, one
        # that cannot be read) is the user's to see, not a reason to start a second
        # repository inside the first and commit there.
        if "not a ckpt repository" not in str(e):
            raise
    return Repo.init(path)


def folder_files(folder: str) -> Dict[str, str]:
    """Every regular file under `folder`, by its path relative to it (`/`-separated)."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if os.path.isfile(full):
                files[os.path.relpath(full, folder).replace(os.sep, "/")] = full
    return files


def commit_checkpoint(repo: Repo, files: Dict[str, str], step: int, background: bool):
    """One version holding exactly `files`, message ``step N``, tagged ``step-N`` (unless that
    tag exists: a resumed run saving the same step again)."""
    tags = [] if f"step-{step}" in repo.tags() else [f"step-{step}"]
    if not tags:
        warnings.warn(f"ckpt: tag step-{step} exists already; this version of step {step} is not tagged")
    return repo.commit(files, f"step {step}", tags, background=background, exact=True)


class Committer:
    """Commits checkpoints for a training callback. In the background, nothing it does raises
    into the training loop: a checkpoint that cannot be committed (its file gone before it could
    be opened, rewritten in place before it was read, a full disk) is logged as a warning, and
    training goes on; the next checkpoint is committed all the same. Such a failure counts as
    reported (the process does not exit with status 1 for it: the warning is the report).
    In the foreground, errors are raised as ``Repo.commit`` raises them."""

    def __init__(self, background: bool):
        self.background = background
        self.handles = []

    def commit(self, repo: Repo, files: Dict[str, str], step: int):
        """The version id (foreground), a handle (background), or None (background, not
        committed: logged)."""
        self.collect()
        if not self.background:
            return commit_checkpoint(repo, files, step, False)
        try:
            handle = commit_checkpoint(repo, files, step, True)
        except Exception as e:  # noqa: BLE001 - never into the training loop; logged
            _log.warning("ckpt: the checkpoint of step %s was not committed: %s", step, e)
            return None
        self.handles.append((step, handle))
        return handle

    def collect(self, wait: bool = False) -> None:
        """Logs the failures of finished background commits (all, waiting for them, with
        `wait`)."""
        still = []
        for step, handle in self.handles:
            if wait:
                try:
                    handle.join()
                except Exception as e:  # noqa: BLE001 - a forked child: not ours to wait for
                    _log.warning("ckpt: %s", e)
                    continue
            if not handle.done():
                still.append((step, handle))
            elif handle.error is not None and not handle.reported:
                handle.mark_reported()
                _log.warning("ckpt: the checkpoint of step %s was not committed: %s", step, handle.error)
        self.handles = still


def lazy_base(module_names, attr):
    """The class `attr` of the first of `module_names` that is imported or importable, else
    `object`."""
    for name in module_names:
        module = sys.modules.get(name)
        if module is None:
            try:
                module = __import__(name, fromlist=[attr])
            except Exception:
                continue
        base = getattr(module, attr, None)
        if isinstance(base, type):
            return base
    return object
