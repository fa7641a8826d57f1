"""The straight line between two commits' weights (``Repo.interpolate``, ``ckpt interpolate``): mode
connectivity, evaluated at evenly spaced points and never committed.

At ``t`` the state is ``(1 - t) A + t B`` for every tensor ``explore.merging`` merges (floats whose
tensor ids differ), computed in fp32 and cast back as ``explore.merge`` does; the others, and every
tensor at ``t = 0`` and ``t = 1``, are A's (B's at 1) exactly, and so is the non-tensor part of the
state: the endpoints are the commits themselves. ``check`` of ``explore.merging`` applies first
(the same tensors, shapes and dtypes; equal integer tensors), before any state is written.

``write_state_at`` writes the state at ``t`` to a ``.safetensors`` file a tensor at a time when it
is a flat dict of tensors (a model's ``state_dict``: what ``Repo.export`` writes for such a
commit, ``formats.write_flat``), so memory holds about two tensors; any other state is built whole
and written by ``formats.write_state``. ``run_line`` evaluates each point: ``fn(state, t)`` in this
process (the state built whole), or a command on the written file (``explore.runner``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptrepo import types as t
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.errors import UsageError
from ckptrepo.explore.merging import Plan, read

if TYPE_CHECKING:
    import torch

MAX_POINTS = 10_000


def points(n: int) -> list[float]:
    """``n`` evenly spaced values of ``t`` from 0 to 1, both included (UsageError unless ``n >= 2``)."""
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= MAX_POINTS:
        raise UsageError(f"points {n!r} is not a whole number from 2 to {MAX_POINTS}",
                         hint="e.g. --points 11: t = 0, 0.1, ..., 1.")
    return [i / (n - 1) for i in range(n)]


def tensor_at(plan: Plan, name: str, at: float, reader: ChunkReader, pool: Executor) -> torch.Tensor:
    """Tensor ``name`` of the state at ``t = at`` on the line from ``plan.inputs[0]`` to ``plan.inputs[1]``."""
    from ckptrepo.explore.merge import linear

    a, b = plan.inputs
    if name not in plan.merge or at == 0:
        return read(a, name, reader, pool)
    if at == 1:
        return read(b, name, reader, pool)
    known: dict[str, memoryview] = {}
    xa = read(a, name, reader, pool, known=known)
    xb = read(b, name, reader, pool, known=known)
    return linear([xa, xb], (1 - at, at), normalize=False, out=xa)


def tensors_at(plan: Plan, at: float, reader: ChunkReader, pool: Executor,
               names: Sequence[str] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor (or those ``names``, in that order) of the state at ``t = at``, one at a time."""
    for name in names if names is not None else plan.names:
        yield name, tensor_at(plan, name, at, reader, pool)


def skeleton_at(plan: Plan, at: float) -> Any:
    """The non-tensor part of the state at ``t = at``: B's at 1, else A's."""
    return plan.inputs[1 if at == 1 else 0].skeleton


def state_at(plan: Plan, at: float, reader: ChunkReader, pool: Executor) -> Any:
    """The whole state at ``t = at``, as ``checkout`` gives a commit's."""
    from ckptrepo import state as st

    return st.unflatten(skeleton_at(plan, at), dict(tensors_at(plan, at, reader, pool)))


def write_state_at(path: Path, plan: Plan, at: float, reader: ChunkReader, pool: Executor) -> None:
    """Write the state at ``t = at`` to ``path`` (``.safetensors``): streamed for a flat dict of
    tensors, else built whole (see the module docstring)."""
    from ckptrepo import state as st
    from ckptrepo.formats import write_state
    from ckptrepo.formats.hf_layout import flat_keys
    from ckptrepo.formats.safetensors_io import flat_header, write_flat
    from ckptrepo.restore.export import METADATA

    keys = flat_keys(skeleton_at(plan, at))
    header = None
    if keys is not None:
        rows = {name: row for name, (row, _) in plan.inputs[0].items.items()}
        header = flat_header({k: (st.dtype_from_name(rows[e].dtype), list(rows[e].shape)) for k, e in keys.items()},
                             METADATA)
    if keys is None or header is None:
        write_state(state_at(plan, at, reader, pool), path)
        return
    order = [keys[key] for key in header[1]]
    write_flat(path, header[0], (st.tensor_bytes(x) for _, x in tensors_at(plan, at, reader, pool, order)))


def run_line(plan: Plan, ts: Sequence[float], reader: ChunkReader, pool: Executor, *,
             fn: Callable[[Any, float], Mapping[str, float]] | None = None,
             run: str | Sequence[str] | None = None, timeout: float | None = None,
             on_point: Callable[[t.InterpolationPoint], None] | None = None) -> list[t.InterpolationPoint]:
    """Evaluate the state at each ``t`` of ``ts``, in order: ``fn(state, t)`` (what it raises is
    raised; what it returns must be a mapping of metric names to finite numbers, else UsageError),
    or ``run``, a command on the state written to a private temporary file (``{path}`` in it;
    ``explore.runner.run_command``: the JSON object on its last line of stdout, killed after
    ``timeout`` seconds; a failure is that point's ``error`` and the others go on). ``on_point``
    gets each point as it is known."""
    from ckptrepo.explore import runner

    out: list[t.InterpolationPoint] = []
    for at in ts:
        started = time.perf_counter()
        if fn is not None:
            metrics = _metrics(fn(state_at(plan, at, reader, pool), at), at)
            point = t.InterpolationPoint(at, metrics, seconds=time.perf_counter() - started)
        else:
            assert run is not None
            write = functools.partial(write_state_at, plan=plan, at=at, reader=reader, pool=pool)
            with runner.exported(write, "safetensors") as path:
                outcome = runner.run_command(run, path, timeout=timeout)
            point = t.InterpolationPoint(at, dict(outcome.metrics or {}), outcome.error,
                                         outcome.stderr_tail if outcome.error else "",
                                         time.perf_counter() - started)
        out.append(point)
        if on_point is not None:
            on_point(point)
    return out


def _metrics(found: Any, at: float) -> dict[str, float]:
    if not isinstance(found, Mapping):
        raise UsageError(f"the evaluation at t={at:g} returned {type(found).__name__}, not a mapping of metrics",
                         hint="Return e.g. {'loss': 0.31}.")
    out: dict[str, float] = {}
    for name, value in found.items():
        if not isinstance(name, str) or not name or isinstance(value, bool | str | bytes) \
                or not hasattr(value, "__float__") or not math.isfinite(float(value)):
            raise UsageError(f"the evaluation at t={at:g} returned {name!r}: {value!r}, not a metric name and a "
                             "finite number")
        out[name] = float(value)
    return out
