"""What the training-framework callbacks share: committing a checkpoint folder or file."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Dict, Optional, Union

from ckpt import Repo


def open_or_init(repo: Optional[Union[Repo, str, os.PathLike]], default_dir: str) -> Repo:
    """`repo` itself, the repository holding the path `repo`, or (None) the one holding
    `default_dir`, created there if there is none."""
    if isinstance(repo, Repo):
        return repo
    path = os.fspath(repo) if repo is not None else default_dir
    os.makedirs(path, exist_ok=True)
    try:
        return Repo(path)
    except Exception:
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
