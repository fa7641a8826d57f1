"""Value types of tensor analysis: ``Diff`` / ``TensorDelta`` (``diff``), ``HistoryPoint``
(``history``) and ``MetricPoint`` (``metrics_along``). Plain frozen dataclasses; ``to_json``
gives JSON-safe dicts (non-finite floats become None, times ISO 8601)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from ckptrepo.ids import short
from ckptrepo.lineage.exact import ExactDelta
from ckptrepo.types import TensorInfo, TensorStats

__all__ = ["STAT_FIELDS", "Diff", "ExactDelta", "HistoryPoint", "MetricPoint", "TensorDelta", "stat_deltas"]

#: The stored statistics, in ``TensorStats`` field order (numel, mean, std, min, max, l2_norm, ...).
STAT_FIELDS = tuple(f.name for f in fields(TensorStats))


def _finite(value: Any) -> Any:
    """JSON has no NaN/Inf: such floats become None."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def stat_deltas(a: TensorInfo | None, b: TensorInfo | None) -> dict[str, float]:
    """b − a of each stored statistic both tensors have (empty when either is missing)."""
    if a is None or b is None:
        return {}
    out: dict[str, float] = {}
    for f in STAT_FIELDS:
        va, vb = getattr(a.stats, f), getattr(b.stats, f)
        if va is not None and vb is not None:
            out[f] = vb - va
    return out


def _jsonable(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _jsonable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [_jsonable(v) for v in data]
    return _finite(data)


@dataclass(frozen=True)
class TensorDelta:
    """One tensor name in a diff a -> b.

    ``status``: ``added`` (only in b), ``removed`` (only in a), ``changed`` (different
    tensor), ``unchanged`` (the same tensor). ``chunks_changed`` of ``n_chunks`` (the larger
    side's count) are the positions whose chunk ids differ; every chunk counts when the
    chunk sizes differ or one side is missing. ``deltas`` are b − a of the stored statistics
    both sides have. ``exact`` is set by an exact diff when comparable; ``note`` says why not.
    """

    name: str
    status: str
    a: TensorInfo | None
    b: TensorInfo | None
    chunks_changed: int = 0
    n_chunks: int = 0
    exact: ExactDelta | None = None
    note: str | None = None

    @property
    def deltas(self) -> dict[str, float]:
        """b − a of the stored statistics (see ``stat_deltas``)."""
        return stat_deltas(self.a, self.b)

    @property
    def changed_fraction(self) -> float | None:
        """``chunks_changed / n_chunks`` (None for a tensor without chunks)."""
        return self.chunks_changed / self.n_chunks if self.n_chunks else None

    @property
    def dtype_changed(self) -> bool:
        return self.a is not None and self.b is not None and self.a.dtype != self.b.dtype

    @property
    def shape_changed(self) -> bool:
        return self.a is not None and self.b is not None and self.a.shape != self.b.shape

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(changed_fraction=self.changed_fraction, dtype_changed=self.dtype_changed,
                    shape_changed=self.shape_changed, deltas=self.deltas)
        return _jsonable(data)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Diff:
    """Every tensor name of commits ``a`` and ``b`` (full ids), by name."""

    a: str
    b: str
    exact: bool
    tensors: tuple[TensorDelta, ...]

    def names(self, status: str) -> list[str]:
        return [t.name for t in self.tensors if t.status == status]

    @property
    def counts(self) -> dict[str, int]:
        """Number of tensors per status (every status present, possibly 0)."""
        out = dict.fromkeys(("added", "removed", "changed", "unchanged"), 0)
        for t in self.tensors:
            out[t.status] += 1
        return out

    def to_json(self, *, changed_only: bool = False) -> dict[str, Any]:
        """``a``, ``b``, ``exact``, ``counts`` and ``tensors`` (without unchanged ones if ``changed_only``)."""
        shown = [t for t in self.tensors if not (changed_only and t.status == "unchanged")]
        return {"a": self.a, "b": self.b, "exact": self.exact, "counts": self.counts,
                "tensors": [t.to_json() for t in shown]}


@dataclass(frozen=True)
class HistoryPoint:
    """One tensor in one commit of a first-parent chain, compared with the commit's first parent.

    ``depth`` 0 is the chain's head. ``tensor`` is None where the commit has no tensor of that
    name, ``previous`` where its first parent has none (or it has no parent: a root commit
    counts as following an empty state). ``status`` is ``added``, ``removed``, ``changed``,
    ``unchanged`` or ``absent`` (in neither). ``chunks_changed`` of ``n_chunks`` and ``deltas``
    (tensor − previous) are as in ``TensorDelta``.
    """

    commit_id: str
    step: int | None
    created_at: datetime
    depth: int
    status: str
    tensor: TensorInfo | None
    previous: TensorInfo | None = None
    chunks_changed: int = 0
    n_chunks: int = 0

    @classmethod
    def _fast(cls, commit_id: str, step: int | None, created_at: datetime, depth: int, status: str,
              tensor: TensorInfo | None, previous: TensorInfo | None, chunks_changed: int,
              n_chunks: int) -> HistoryPoint:
        """The constructor's result (every field given), without its ``object.__setattr__`` call
        per field of a frozen dataclass: a third of the time, for ``history``'s 10,000 points."""
        point = object.__new__(cls)
        fields = point.__dict__
        fields["commit_id"], fields["step"], fields["created_at"], fields["depth"] = commit_id, step, created_at, depth
        fields["status"], fields["tensor"], fields["previous"] = status, tensor, previous
        fields["chunks_changed"], fields["n_chunks"] = chunks_changed, n_chunks
        return point

    @property
    def deltas(self) -> dict[str, float]:
        """tensor − previous of the stored statistics (see ``stat_deltas``)."""
        return stat_deltas(self.previous, self.tensor)

    @property
    def present(self) -> bool:
        return self.tensor is not None

    @property
    def changed(self) -> bool:
        return self.status in ("added", "removed", "changed")

    @property
    def changed_fraction(self) -> float | None:
        return self.chunks_changed / self.n_chunks if self.n_chunks else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        del data["previous"]  # the previous point's tensor, or deltas say what matters of it
        data.update(created_at=self.created_at.isoformat(), short_id=short(self.commit_id), present=self.present,
                    changed=self.changed, changed_fraction=self.changed_fraction, deltas=self.deltas)
        return _jsonable(data)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class MetricPoint:
    """The requested metrics a commit of a first-parent chain records (``depth`` 0 = head)."""

    commit_id: str
    step: int | None
    created_at: datetime
    depth: int
    values: dict[str, float]
