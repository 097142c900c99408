"""A Lightning callback that commits every checkpoint file Lightning saves.

    from ckpt.lightning import CkptCallback
    trainer = lightning.Trainer(callbacks=[ModelCheckpoint(dirpath="ckpts", save_top_k=1),
                                           CkptCallback()])

Lightning writes a checkpoint (``torch.save`` of a dict: ``epoch=3-step=400.ckpt``) after the
callbacks' ``on_save_checkpoint`` hook ran, so the file is committed at the next hook (the next
batch, epoch or validation, or the end of fitting): one version per checkpoint holding exactly
that file, under its own name, message ``step N``, tag ``step-N``. ckpt stores ``.ckpt`` files
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
    """Checkpoint files the trainer's checkpoint callbacks name, newest first."""
    callbacks = list(getattr(trainer, "checkpoint_callbacks", None) or [])
    single = getattr(trainer, "checkpoint_callback", None)
    if single is not None and single not in callbacks:
        callbacks.append(single)
    paths = set()
    for cb in callbacks:
        for attr in ("_last_checkpoint_saved", "last_model_path", "best_model_path"):
            p = getattr(cb, attr, None)
            if p:
                paths.add(os.fspath(p))
        for p in (getattr(cb, "best_k_models", None) or {}):
            paths.add(os.fspath(p))
    existing = [p for p in paths if os.path.isfile(p)]
    return sorted(existing, key=lambda p: os.stat(p).st_mtime_ns, reverse=True)


def _make_class():
    base = _callbacks.lazy_base(["lightning.pytorch", "pytorch_lightning"], "Callback")

    class CkptCallback(base):  # type: ignore[misc, valid-type]
        """Commits each checkpoint file Lightning saves.

        `repo`: a :class:`ckpt.Repo`, a path, or ``None`` for the repository holding the
        trainer's ``default_root_dir`` (created there if there is none).
        """

        def __init__(self, repo: Any = None, background: bool = False):
            super().__init__()
            self._repo_arg = repo
            self.repo = None
            self.background = background
            self.versions = []
            self._pending_step = None
            self._committed = {}

        def on_save_checkpoint(self, trainer, pl_module, checkpoint):
            if getattr(trainer, "is_global_zero", True):
                self._pending_step = int(getattr(trainer, "global_step", 0))

        def _commit_pending(self, trainer):
            if self._pending_step is None:
                return
            step, self._pending_step = self._pending_step, None
            if self.repo is None:
                root = getattr(trainer, "default_root_dir", None) or os.getcwd()
                self.repo = _callbacks.open_or_init(self._repo_arg, root)
            for path in _saved_paths(trainer):
                stamp = os.stat(path).st_mtime_ns
                if self._committed.get(path) == stamp:
                    continue
                self._committed[path] = stamp
                self.repo.wait()
                files = {os.path.basename(path): path}
                self.versions.append(_callbacks.commit_checkpoint(self.repo, files, step, self.background))
                break

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
            if self.repo is not None:
                self.repo.wait()

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
