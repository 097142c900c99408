"""A Hugging Face ``Trainer`` callback that commits every checkpoint the trainer saves.

    from ckpt.transformers import CkptCallback
    trainer = Trainer(..., args=TrainingArguments(output_dir="out", save_strategy="epoch",
                                                  save_total_limit=1),
                      callbacks=[CkptCallback()])

Each ``checkpoint-N/`` folder becomes one version holding exactly that folder's files, under the
folder's own names (``model.safetensors``, ``optimizer.pt``, ``trainer_state.json``, ...), so each
file is delta-coded against the same file of the previous checkpoint; message ``step N``, tag
``step-N``. Old folders can then be deleted (``save_total_limit``): ``ckpt checkout step-500
--output out/checkpoint-500`` brings one back, bit for bit.

Importing this module imports neither torch nor transformers: the callback class is built on
first access, as a ``transformers.TrainerCallback`` when transformers is installed.
"""

from __future__ import annotations

import os
from typing import Any

from ckpt import _callbacks

__all__ = ["CkptCallback"]

_CLASS = None


def _make_class():
    base = _callbacks.lazy_base(["transformers", "transformers.trainer_callback"], "TrainerCallback")

    class CkptCallback(base):  # type: ignore[misc, valid-type]
        """Commits each checkpoint folder the trainer writes (``on_save``).

        `repo`: a :class:`ckpt.Repo`, a path, or ``None`` for the repository holding the
        trainer's ``output_dir`` (created there if there is none). With ``background=True`` the
        commit runs while training continues: the folder's files are opened at the save, so the
        trainer may delete the folder (``save_total_limit``) before they are read; a checkpoint
        that cannot be committed is logged as a warning and never stops training (see
        ``ckpt._callbacks.Committer``). The next save (and the end of training) waits for it.
        """

        def __init__(self, repo: Any = None, background: bool = False):
            _callbacks.check_arguments(repo, background)
            self._repo_arg = repo
            self.repo = None
            self.background = background
            self.versions = []
            self._committer = _callbacks.Committer(background)

        def on_save(self, args, state, control, **kwargs):
            if not getattr(state, "is_world_process_zero", True):
                return control
            if self.repo is None:
                self.repo = _callbacks.open_or_init(self._repo_arg, args.output_dir)
            folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            files = _callbacks.folder_files(folder)
            if files:
                result = self._committer.commit(self.repo, files, state.global_step)
                if result is not None:
                    self.versions.append(result)
            return control

        def on_train_end(self, args, state, control, **kwargs):
            self._committer.collect(wait=True)
            return control

        if base is object:
            # Without transformers: answer every other event of the TrainerCallback interface.
            def __getattr__(self, name):
                if name.startswith("on_"):
                    return lambda *args, **kwargs: kwargs.get("control", args[2] if len(args) > 2 else None)
                raise AttributeError(name)

    return CkptCallback


def __getattr__(name):
    global _CLASS
    if name == "CkptCallback":
        if _CLASS is None:
            _CLASS = _make_class()
        return _CLASS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
