"""What a training run wrote beside its weights: step, epoch and metrics of a checkpoint.

A Lightning ``.ckpt`` holds ``global_step`` and ``epoch`` (the commit's step and epoch) and,
per ``ModelCheckpoint`` callback, the ``current_score`` of its ``monitor`` (a metric).

A Hugging Face ``Trainer`` checkpoint folder (``checkpoint-N``) holds ``trainer_state.json``:
``global_step``, a fractional ``epoch`` and ``log_history``, a list of logged dicts each with
its ``step``. The commit's step is ``global_step``, its epoch the completed epochs
(``floor(epoch)``), its metrics every number logged at that step (training and evaluation
entries merged; ``step``, ``epoch`` and non-numbers left out). Reads JSON or an already loaded
state only; never imports torch and never unpickles.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from ckptrepo.errors import InvalidInput

__all__ = ["RUN_HINT", "RunMeta", "checkpoint_step", "fill_run_meta", "lightning_meta", "logged_at",
           "run_checkpoints", "run_meta"]

TRAINER_STATE = "trainer_state.json"
RUN_HINT = ("`ckpt import-run DIR` takes a Hugging Face Trainer's output_dir (its checkpoint-N folders) or a folder "
            "of Lightning .ckpt files (with step=S in their names, or holding global_step).")
_CHECKPOINT_DIR = re.compile(r"^checkpoint-(\d+)$")
_STEP_IN_NAME = re.compile(r"(?:^|[-_])step=(\d+)(?:$|[-_])")


class RunMeta(TypedDict, total=False):
    step: int
    epoch: int
    metrics: dict[str, float]


def run_meta(path: Path) -> RunMeta:
    """Step, epoch and metrics recorded beside the checkpoint at ``path``; empty when there are none.

    InvalidInput for a ``trainer_state.json`` that is not valid JSON or lacks ``global_step``.
    """
    state_file = path / TRAINER_STATE if path.is_dir() else None
    if state_file is None or not state_file.is_file():
        return {}
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(path=str(state_file), reason=f"not readable JSON: {exc}") from exc
    step = _count(state.get("global_step")) if isinstance(state, dict) else None
    if step is None:
        raise InvalidInput(path=str(state_file), reason="no global_step (a non-negative integer)")
    out: RunMeta = {"step": step}
    epoch = state.get("epoch")
    if isinstance(epoch, int | float) and not isinstance(epoch, bool) and math.isfinite(epoch) and epoch >= 0:
        out["epoch"] = math.floor(epoch)
    metrics = logged_at(state.get("log_history") or [], step)
    if metrics:
        out["metrics"] = metrics
    return out


def logged_at(log_history: list[Any], step: int) -> dict[str, float]:
    """Every number a Trainer's ``log_history`` logged at ``step`` (its entries merged)."""
    metrics: dict[str, float] = {}
    for entry in log_history:
        if isinstance(entry, dict) and entry.get("step") == step:
            metrics.update({k: float(v) for k, v in entry.items() if _is_metric(k, v)})
    return metrics


def _count(value: Any) -> int | None:
    """``value`` when it is a non-negative int (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _is_metric(key: Any, value: Any) -> bool:
    return (isinstance(key, str) and key not in ("step", "epoch") and isinstance(value, int | float)
            and not isinstance(value, bool) and math.isfinite(value))


def run_checkpoints(run_dir: Path, step_of: Callable[[Path], int | None]) -> tuple[list[Path], list[Path]]:
    """The checkpoints a training run wrote in ``run_dir``, in step order, and those left out.

    A Hugging Face Trainer's ``checkpoint-N`` folders (step N) when there are any; else the
    Lightning ``.ckpt`` files, each at the step its name gives (``epoch=E-step=S.ckpt``, the
    default) or, for other names, the step ``step_of(path)`` reads from the file. Of files at one
    step, the first by name is kept and ``last*.ckpt`` (ModelCheckpoint's copy of the newest)
    comes last: the others are returned as left out. InvalidInput when ``run_dir`` is not a
    folder, holds neither kind, or a file's step cannot be found.
    """
    if not run_dir.is_dir():
        raise InvalidInput(path=str(run_dir), reason="not a folder", hint=RUN_HINT)
    folders = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT_DIR.match(p.name))]
    if folders:
        return [p for _, p in sorted(folders)], []
    files = sorted((p for p in run_dir.iterdir() if p.is_file() and p.suffix == ".ckpt"),
                   key=lambda p: (p.name.startswith("last"), p.name))
    if not files:
        raise InvalidInput(path=str(run_dir), hint=RUN_HINT,
                           reason="no checkpoint-N folders (a Hugging Face Trainer's output_dir) "
                                  "and no .ckpt files (a Lightning run's checkpoints)")
    kept: dict[int, Path] = {}
    left: list[Path] = []
    for path in files:
        step = checkpoint_step(path, step_of)
        if step is None:
            raise InvalidInput(path=str(path), reason="no step in its name or its content (global_step)",
                               hint=RUN_HINT)
        if step in kept:
            left.append(path)
        else:
            kept[step] = path
    return [kept[s] for s in sorted(kept)], left


def checkpoint_step(path: Path, step_of: Callable[[Path], int | None]) -> int | None:
    """The step of one checkpoint of a run (``run_checkpoints``): a folder's ``global_step`` in its
    ``trainer_state.json``, else (none, or one that cannot be read: committing the folder reports it)
    the N of its name ``checkpoint-N``; a file's ``step=S`` in its name, else ``step_of(path)`` (the
    step it holds); None when there is none."""
    if path.is_dir():
        try:
            recorded = run_meta(path).get("step")
        except InvalidInput:
            recorded = None
        folder = _CHECKPOINT_DIR.match(path.name)
        return recorded if recorded is not None else int(folder.group(1)) if folder else None
    m = _STEP_IN_NAME.search(path.stem)
    return int(m.group(1)) if m else step_of(path)


def lightning_meta(state: Any) -> RunMeta:
    """Step, epoch and monitored scores of a loaded Lightning checkpoint; empty for any other state."""
    if not isinstance(state, Mapping) or not ("pytorch-lightning_version" in state or "loops" in state):
        return {}
    step, epoch = _count(state.get("global_step")), _count(state.get("epoch"))
    if step is None:
        return {}
    out: RunMeta = {"step": step}
    if epoch is not None:
        out["epoch"] = epoch
    metrics: dict[str, float] = {}
    callbacks = state.get("callbacks")
    for cb in callbacks.values() if isinstance(callbacks, Mapping) else ():
        if isinstance(cb, Mapping) and isinstance(cb.get("monitor"), str) and cb.get("current_score") is not None:
            try:
                score = float(cb["current_score"])  # a 0-d tensor or a number
            except (TypeError, ValueError, RuntimeError):
                continue
            if math.isfinite(score):
                metrics[cb["monitor"]] = score
    if metrics:
        out["metrics"] = metrics
    return out


M = TypeVar("M", bound=Mapping[str, Any])


def fill_run_meta(meta: M, path: Path, state: Any = None) -> M:
    """``meta`` with step, epoch and metrics it lacks (None or absent) taken from what the run
    recorded: beside ``path`` (``run_meta``) or in its loaded ``state`` (``lightning_meta``)."""
    recorded = {**lightning_meta(state), **run_meta(path)}
    target: MutableMapping[str, Any] = meta  # type: ignore[assignment]  # a TypedDict of commit metadata
    for key, value in recorded.items():
        if target.get(key) is None:
            target[key] = value
    return meta
