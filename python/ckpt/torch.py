"""Save and restore a PyTorch training state (model, optimizer, scheduler) as one ckpt version.

    import ckpt, ckpt.torch
    repo = ckpt.Repo.init("runs/exp1")
    for epoch in range(10):
        train_one_epoch(model, optimizer)
        ckpt.torch.save(repo, model=model, optimizer=optimizer, message=f"epoch {epoch}")
    ckpt.torch.load(repo, "HEAD~3", model=model, optimizer=optimizer)

A version written by :func:`save` holds

- ``model.safetensors``: the model's ``state_dict()`` tensors, as ``safetensors.torch.save_file``
  would write them;
- ``optimizer.safetensors``: every tensor of the optimizer's ``state_dict()`` (Adam's
  ``exp_avg``, ``exp_avg_sq``, ``step``), named by their place in it (``state/0/exp_avg``);
- ``scheduler.safetensors`` likewise when a scheduler's state holds tensors;
- ``state.json``: everything else (the optimizer's ``param_groups``, the scheduler's state,
  ``extra``), with each tensor replaced by a reference to its name.

So each tensor is stored with byte grouping, deltas against the previous version and dedup, and
:func:`load` restores every tensor bit for bit. Nothing is pickled: no code runs on load.

This module imports torch only when called.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Dict, Sequence, Union

from ckpt import CkptError, Repo, _bool_arg, _str_arg, _type_error

STATE_FILE = "state.json"
STATE_FORMAT = 1

# Keys of the tagged JSON encoding of values JSON has no type for.
_TENSOR = "__ckpt_tensor__"
_TUPLE = "__ckpt_tuple__"
_ITEMS = "__ckpt_items__"
_FLOAT = "__ckpt_float__"


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def flatten(value: Any, prefix: str, tensors: Dict[str, Any]) -> Any:
    """`value` as JSON, with each tensor moved into `tensors` (under its path from `prefix`)
    and replaced by ``{"__ckpt_tensor__": name}``. Dicts with other keys than str, tuples and
    non-finite floats are tagged so that :func:`unflatten` rebuilds them exactly."""
    if _is_tensor(value):
        name = prefix or "tensor"
        if name in tensors:
            raise ValueError(f"two tensors at {name!r}")
        tensors[name] = value
        return {_TENSOR: name}
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    if isinstance(value, dict):
        join = (lambda k: f"{prefix}/{k}") if prefix else (lambda k: str(k))
        if all(isinstance(k, str) and not k.startswith("__ckpt_") for k in value):
            return {k: flatten(v, join(k), tensors) for k, v in value.items()}
        for k in value:
            if not isinstance(k, (str, int, bool, type(None), float)):
                raise TypeError(f"{prefix or 'state'}: dict key {k!r} cannot be saved as JSON")
        return {_ITEMS: [[k, flatten(v, join(k), tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [flatten(v, f"{prefix}/{i}" if prefix else str(i), tensors) for i, v in enumerate(value)]
        return {_TUPLE: items} if isinstance(value, tuple) else items
    raise TypeError(
        f"{prefix or 'state'}: a {type(value).__name__} cannot be saved as JSON "
        "(tensors, numbers, strings, None, lists, tuples and dicts can)"
    )


def unflatten(value: Any, tensors: Dict[str, Any]) -> Any:
    """The inverse of :func:`flatten`."""
    if isinstance(value, list):
        return [unflatten(v, tensors) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (key, inner), = value.items()
            if key == _TENSOR:
                if inner not in tensors:
                    raise CkptError(f"{STATE_FILE}: tensor {inner!r} is missing")
                return tensors[inner]
            if key == _TUPLE:
                return tuple(unflatten(v, tensors) for v in inner)
            if key == _ITEMS:
                return {k: unflatten(v, tensors) for k, v in inner}
            if key == _FLOAT:
                return float(inner)
        return {k: unflatten(v, tensors) for k, v in value.items()}
    return value


def save(
    repo: Repo,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    extra: Any = None,
    message: str = "checkpoint",
    tags: Union[str, Sequence[str]] = (),
    background: bool = False,
):
    """Commits the state of `model`, `optimizer` and `scheduler` (any of them; objects with a
    ``state_dict()``, or state dicts) and `extra` (JSON-like, tensors allowed) as one version,
    which holds only these files (other files of the previous version are not carried over).
    Returns the version id, or with ``background=True`` a handle (see :meth:`ckpt.Repo.commit`)."""
    _repo_arg(repo)
    parts = (("model", model), ("optimizer", optimizer), ("scheduler", scheduler))
    for part, obj in parts:
        if obj is not None and not (callable(getattr(obj, "state_dict", None)) or isinstance(obj, Mapping)):
            raise _type_error(part, "an object with a state_dict() method, or a state dict", obj)
    _str_arg(message, "message")
    _bool_arg(background, "background")
    files: Dict[str, Dict[str, Any]] = {}
    state: Dict[str, Any] = {"format": STATE_FORMAT}
    for part, obj in parts:
        if obj is None:
            continue
        sd = obj.state_dict() if callable(getattr(obj, "state_dict", None)) else obj
        if not isinstance(sd, Mapping):
            raise _type_error(f"{part}.state_dict()", "a dict", sd)
        tensors: Dict[str, Any] = {}
        if part == "model":
            # A model's state dict is a flat mapping of names to tensors; other values go to JSON.
            rest = {}
            for k, v in sd.items():
                if _is_tensor(v):
                    tensors[k] = v
                else:
                    rest[k] = v
            state[part] = flatten(rest, "", {}) if rest else {}
        else:
            state[part] = flatten(sd, "", tensors)
        if tensors or part == "model":
            files[f"{part}.safetensors"] = tensors
    if extra is not None:
        extra_tensors: Dict[str, Any] = {}
        state["extra"] = flatten(extra, "", extra_tensors)
        if extra_tensors:
            files["extra.safetensors"] = extra_tensors
    state["files"] = sorted(files)
    text = json.dumps(state, indent=1, allow_nan=False)  # key order kept: load restores it
    return _commit_with_state(repo, files, text, message, tags, background)


def _repo_arg(repo: Any) -> None:
    if not isinstance(repo, Repo):
        raise _type_error("repo", "a ckpt.Repo (ckpt.Repo(path) opens one)", repo)


def _commit_with_state(repo: Repo, files, state_text: str, message, tags, background):
    sources: Dict[str, Any] = dict(files)
    sources[STATE_FILE] = state_text.encode()
    return repo.commit(sources, message, tags, background=background, exact=True)


def load(
    repo: Repo,
    rev: str = "HEAD",
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    map_location: Any = "cpu",
    strict: bool = True,
) -> Dict[str, Any]:
    """Restores version `rev` (written by :func:`save`) into `model`, `optimizer` and
    `scheduler` (each optional) with their ``load_state_dict``. Returns a dict of the state
    dicts read (``"model"``, ``"optimizer"``, ``"scheduler"``) and ``"extra"``."""
    _repo_arg(repo)
    _str_arg(rev, "rev")
    _bool_arg(strict, "strict")
    for part, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler)):
        if obj is not None and not callable(getattr(obj, "load_state_dict", None)):
            raise _type_error(part, "an object with a load_state_dict() method", obj)
    state = json.loads(repo.read_file(STATE_FILE, rev))
    if state.get("format") != STATE_FORMAT:
        raise CkptError(f"{STATE_FILE} in {rev}: format {state.get('format')!r}, expected {STATE_FORMAT}")
    present = set(state.get("files", []))

    def tensors_of(part: str) -> Dict[str, Any]:
        name = f"{part}.safetensors"
        if name not in present:
            return {}
        loaded = repo.load(rev, name, framework="pt")
        if map_location is not None and map_location != "cpu":
            loaded = {k: v.to(map_location) for k, v in loaded.items()}
        return loaded

    out: Dict[str, Any] = {}
    for part, obj in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler)):
        if part not in state:
            if obj is not None:
                raise CkptError(f"{rev} holds no {part} state")
            continue
        tensors = tensors_of(part)
        if part == "model":
            sd = dict(tensors)
            sd.update(unflatten(state[part], {}))
        else:
            sd = unflatten(state[part], tensors)
        out[part] = sd
        if obj is not None:
            if part == "model":
                obj.load_state_dict(sd, strict=strict)
            else:
                obj.load_state_dict(sd)
    if "extra" in state:
        out["extra"] = unflatten(state["extra"], tensors_of("extra"))
    return out


__all__ = ["save", "load", "flatten", "unflatten", "STATE_FILE"]
