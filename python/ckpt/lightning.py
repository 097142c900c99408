"""A Lightning callback that commits every checkpoint file Lightning saves.

    from ckpt.lightning import CkptCallback
    trainer = lightning.Trainer(callbacks=[ModelCheckpoint(dirpath="ckpts", save_top_k=1),
                                           CkptCallback()])

Lightning writes a checkpoint (``torch.save`` of a dict: ``epoch=3-step=400.ckpt``) after the
callbacks' ``on_save_checkpoint`` hook ran, so the files are committed at the next hook (the next
batch, epoch or validation, or the end of fitting): one version per save step holding exactly
the files written at that step (the top-k checkpoint and, with ``save_last=True``, ``last.ckpt``),
each under its own name, message ``step N``, tag ``step-N``. ckpt stores ``.ckpt`` files
storage by storage (its pickle is read, never executed), so the weights and the optimizer state
are delta-coded against the previous checkpoint's although the file name differs.

Importing this module imports neither torch nor lightning: the callback class is built on first
access, as a ``lightning.pytorch.Callback`` (or ``pytorch_lightning.Callback``) when installed.
"""

from __future__ import annotations

import os
from typing import Any

from ckpt import _callbacks

__all__ = ["CkptCallback"]

_CLASS = None


def _saved_paths(trainer):
    """The checkpoint files the trainer's checkpoint callbacks name (the kept top-k, the last,
    the best), sorted."""
    callbacks = list(getattr(trainer, "checkpoint_callbacks", None) or [])
    single = getattr(trainer, "checkpoint_callback", None)
    if single is not None and single not in callbacks:
        callbacks.append(single)
    paths = set()
    for cb in callbacks:
        for attr in ("_last_checkpoint_saved", "last_model_path", "best_model_path", "kth_best_model_path"):
            p = getattr(cb, attr, None)
            if p:
                paths.add(os.fspath(p))
        for p in (getattr(cb, "best_k_models", None) or {}):
            paths.add(os.fspath(p))
    return sorted(p for p in paths if os.path.isfile(p))


def _stamp(path):
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _names(paths):
    """Each path's name in the version: its file name, or its path below the folder they share
    when two would have the same name (two checkpoint callbacks, two folders)."""
    names = [os.path.basename(p) for p in paths]
    if len(set(names)) == len(names):
        return dict(zip(names, paths))
    common = os.path.commonpath([os.path.abspath(p) for p in paths])
    return {os.path.relpath(os.path.abspath(p), common).replace(os.sep, "/"): p for p in paths}


def _make_class():
    base = _callbacks.lazy_base(["lightning.pytorch", "pytorch_lightning"], "Callback")

    class CkptCallback(base):  # type: ignore[misc, valid-type]
        """Commits each checkpoint Lightning saves: one version per save step, holding exactly
        the files written at that step (with ``save_last=True``, the top-k file under its own
        name and ``last.ckpt``).

        `repo`: a :class:`ckpt.Repo`, a path, or ``None`` for the repository holding the
        trainer's ``default_root_dir`` (created there if there is none). With
        ``background=True`` the commit runs while training continues (the files are opened when
        it starts, so Lightning may delete or replace them); a checkpoint that cannot be
        committed is logged as a warning and never stops training.
        """

        def __init__(self, repo: Any = None, background: bool = False):
            _callbacks.check_arguments(repo, background)
            super().__init__()
            self._repo_arg = repo
            self.repo = None
            self.background = background
            self.versions = []
            self._pending_step = None
            self._committed = {}
            self._committer = _callbacks.Committer(background)

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if getattr(trainer, "is_global_zero", True):
                # Lightning writes the files after this hook, `last.ckpt` over the one a
                # background commit may still be reading (in place, when its temporary file is
                # on another file system): that commit finishes first.
                self._committer.collect(wait=True)
                self._pending_step = int(getattr(trainer, "global_step", 0))

        def _commit_pending(self, trainer):
            if self._pending_step is None:
                return
            step, self._pending_step = self._pending_step, None
            if self.repo is None:
                root = getattr(trainer, "default_root_dir", None) or os.getcwd()
                self.repo = _callbacks.open_or_init(self._repo_arg, root)
            # Every file written since the last commit: Lightning writes the top-k checkpoint
            # and `last.ckpt` at the same step (and may rewrite `last.ckpt` in place of an old
            # one); each is committed under its own name.
            written = {}
            for path in _saved_paths(trainer):
                try:
                    stamp = _stamp(path)
                except OSError:
                    continue  # deleted meanwhile (an old top-k file)
                if self._committed.get(path) != stamp:
                    written[path] = stamp
            if not written:
                return
            result = self._committer.commit(self.repo, _names(sorted(written)), step)
            self._committed.update(written)
            if result is not None:
                self.versions.append(result)

        def on_train_batch_start(self, trainer, *args, **kwargs):
            self._commit_pending(trainer)

        def on_train_epoch_start(self, trainer, *args, **kwargs):
            self._commit_pending(trainer)

        def on_train_epoch_end(self, trainer, *args, **kwargs):
            self._commit_pending(trainer)

        def on_validation_start(self, trainer, *args, **kwargs):
            self._commit_pending(trainer)

        def on_fit_end(self, trainer, *args, **kwargs):
            self._commit_pending(trainer)
            self._committer.collect(wait=True)

        if base is object:
            # Without Lightning: answer every other hook of its Callback interface.
            @property
            def state_key(self):
                return type(self).__qualname__

            def state_dict(self):
                return {}

            def load_state_dict(self, state_dict):
                pass

            def __getattr__(self, name):
                if name.startswith("on_") or name in ("setup", "teardown"):
                    return lambda *args, **kwargs: None
                raise AttributeError(name)

    return CkptCallback


def __getattr__(name):
    global _CLASS
    if name == "CkptCallback":
        if _CLASS is None:
            _CLASS = _make_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
