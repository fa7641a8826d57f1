"""What the pages and the API show, computed from ``Repo`` calls (no torch, nothing cached):
diff rows ordered by magnitude, metric series, tensor histories, and JSON-safe values.

JSON has no NaN or infinity (Starlette refuses them): ``json_safe`` turns non-finite floats into
None, times into ISO 8601 text and tuples into lists, everywhere in a value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ckptrepo import DEFAULT_BRANCH, Commit, Repo
from ckptrepo.errors import UsageError, did_you_mean
from ckptrepo.types import Annotation, Diff, HistoryPoint, MetricPoint, TensorDelta, TensorInfo
from ckptrepo.ui import explore

#: How the diff is ordered, as the page and the API say it.
DIFF_ORDER = ("largest change first: |Δ‖x‖₂| / max(‖a‖₂, ‖b‖₂) (1 for an added or removed tensor and for a "
              "norm that appeared or vanished: a tensor whose every value became NaN or Inf), then the fraction "
              "of chunks that changed, then name")


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None, datetimes as ISO 8601, tuples as lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def json_object(value: Mapping[str, Any]) -> dict[str, Any]:
    """``json_safe`` of a JSON object."""
    return {str(k): json_safe(v) for k, v in value.items()}


# -- diff --------------------------------------------------------------------------------------


def magnitude(delta: TensorDelta) -> float:
    """How much a tensor changed, in [0, 1]: |Δ‖x‖₂| / max(‖a‖₂, ‖b‖₂) of the stored norms (of
    the finite values); 0 when unchanged or when neither side has a norm, 1 when added or removed
    or when only one side has a norm (every value of the other is NaN or Inf)."""
    if delta.status == "unchanged":
        return 0.0
    if delta.status in ("added", "removed") or delta.a is None or delta.b is None:
        return 1.0
    na, nb = delta.a.stats.l2_norm, delta.b.stats.l2_norm
    if na is None or nb is None:
        return 0.0 if na is None and nb is None else 1.0
    if not (math.isfinite(na) and math.isfinite(nb)):  # not stored so; a catalog written otherwise
        return 1.0
    top = max(abs(na), abs(nb))
    return abs(nb - na) / top if top > 0 else 0.0


def ordered(diff: Diff) -> list[TensorDelta]:
    """The diff's tensors in ``DIFF_ORDER``."""
    return sorted(diff.tensors, key=lambda d: (-magnitude(d), -(d.changed_fraction or 0.0), d.name))


def diff_json(diff: Diff) -> dict[str, Any]:
    """``Diff.to_json`` with the tensors in ``DIFF_ORDER``, each with its ``magnitude``."""
    tensors = [{**d.to_json(), "magnitude": magnitude(d)} for d in ordered(diff)]
    return json_object({"a": diff.a, "b": diff.b, "exact": diff.exact, "counts": diff.counts, "order": DIFF_ORDER,
                      "tensors": tensors})


# -- metrics -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricChoice:
    """Which branches and metric names a metrics chart shows."""

    branches: list[str]
    names: list[str]


def choose_metrics(repo: Repo, branches: Sequence[str], names: Sequence[str]) -> MetricChoice:
    """The branches and names asked for, else defaults: every branch (at most 8, the default
    branch first) and one metric (the first whose name holds "loss", else the first). UsageError
    for a metric no commit records."""
    known = repo.metric_names()
    for name in names:
        if name not in known:
            raise UsageError(f"no commit records a metric named {name!r}",
                             hint=did_you_mean("metric", name, known, "the metrics page"))
    if not branches:
        every = sorted((r.name for r in repo.branches()), key=lambda n: (n != DEFAULT_BRANCH, n))
        branches = every[:8]
    if not names:
        names = [next((n for n in known if "loss" in n.lower()), known[0])] if known else []
    return MetricChoice(list(branches), list(names))


def _x_axis(points: Sequence[HistoryPoint | MetricPoint]) -> str:
    return "step" if points and all(p.step is not None for p in points) else "order"


def metrics_json(repo: Repo, choice: MetricChoice) -> dict[str, Any]:
    """One series per branch and metric, oldest first: ``{"x_axis": "step" | "order", "series":
    [{"branch", "name", "points": [{"x", "y", "step", "commit"}], "annotated": [i, ...]}],
    "annotated_names": [...]}``. ``x`` is the step when every commit of every chosen branch has
    one, else the commit's first-parent position from its root (0 = a root). ``annotated``: the
    indices of the points whose value is an annotation (attached after the commit: ``Repo.annotate``,
    ``ckpt eval``), not a metric logged with it; ``annotated_names``: the names with any such point.
    UnknownRevision for a branch that names nothing."""
    chains = {b: repo.metrics_along(choice.names, along=b) for b in choice.branches}
    axis = "step" if all(_x_axis(p) == "step" for p in chains.values() if p) else "order"
    annotated = {(p.commit_id, name) for points in chains.values() for p in points for name in p.annotated}
    series = []
    for branch, points in chains.items():
        length = len(points)
        for name in choice.names:
            shown = [{"x": p.step if axis == "step" else length - 1 - p.depth, "y": p.values[name], "step": p.step,
                      "commit": p.commit_id} for p in reversed(points) if name in p.values]
            marks = [i for i, p in enumerate(shown) if (p["commit"], name) in annotated] if annotated else []
            series.append({"branch": branch, "name": name, "points": shown, "annotated": marks})
    marked = {name for _, name in annotated}
    names = [n for n in choice.names if n in marked]
    return json_object({"branches": choice.branches, "names": choice.names, "x_axis": axis, "series": series,
                        "annotated_names": names})


# -- history -----------------------------------------------------------------------------------


def _history_x(points: Sequence[HistoryPoint]) -> tuple[str, list[int | None]]:
    """The x axis of a history (``step`` when every point has one, else ``order``: the
    first-parent position counted from the oldest point shown, 0) and each point's x."""
    axis, count = _x_axis(points), len(points)
    return axis, [p.step if axis == "step" else count - 1 - p.depth for p in points]


def history_json(name: str, along: str, head: str, points: Sequence[HistoryPoint]) -> dict[str, Any]:
    """``{"tensor", "along", "head", "x_axis", "points"}``: the points oldest first, each its
    ``to_json()`` plus ``x`` (``_history_x``)."""
    axis, xs = _history_x(points)
    shown = [{**p.to_json(), "x": x} for p, x in zip(reversed(points), reversed(xs), strict=True)]
    return json_object({"tensor": name, "along": along, "head": head, "x_axis": axis, "points": shown})


def history_series(points: Sequence[HistoryPoint]) -> dict[str, Any]:
    """What the history charts draw, as columns oldest first: ``x`` (``_history_x``, named by
    ``x_axis``), ``commit``, the tensor's ``l2_norm``, ``std`` and ``mean``, the
    ``changed_fraction`` of its chunks, and ``d_l2_norm``, ``d_std``, ``d_mean``: the change of
    those statistics from the previous commit (None where absent)."""
    axis, xs = _history_x(points)
    columns: dict[str, list[Any]] = {"x": xs[::-1], "commit": [p.commit_id for p in reversed(points)]}
    for stat in ("l2_norm", "std", "mean"):
        columns[stat] = [getattr(p.tensor.stats, stat) if p.tensor else None for p in reversed(points)]
    columns["changed_fraction"] = [p.changed_fraction for p in reversed(points)]
    deltas = [p.deltas for p in reversed(points)]
    for stat in ("l2_norm", "std", "mean"):
        columns[f"d_{stat}"] = [d.get(stat) for d in deltas]
    return json_object({"x_axis": axis, **columns})


def commit_json(commit: Commit, tensors: Sequence[TensorInfo],
                annotations: Sequence[Annotation] = ()) -> dict[str, Any]:
    """A commit's ``to_json()`` plus ``tensors`` (each ``TensorInfo.to_json()``),
    ``annotation_history`` (every annotation, oldest first: ``Annotation.to_json()``; ``annotations``
    holds the current values) and ``merge`` (``explore.Merge.to_json()`` of a merge ``ckpt merge``
    made, else None), JSON-safe."""
    merge = explore.merge_of(commit)
    return json_object({**commit.to_json(), "tensors": [t.to_json() for t in tensors],
                        "annotation_history": [a.to_json() for a in annotations],
                        "merge": merge.to_json() if merge is not None else None})
