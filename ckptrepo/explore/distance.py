"""How far one model's weights are from another's: a bound from stored statistics (no bytes read)
and the exact figure from the chunks that differ.

**The distance from a source ``p`` to a model ``c``** (``directed``), relative to ``c``'s weights:

    D(p -> c) = sqrt( sum over c's weights t matched in p of ||c_t - p_t||^2
                      + sum over c's weights t that p lacks of ||c_t||^2 ) / ||c||

where ``||c||^2`` sums ``||c_t||^2`` over all of ``c``'s weights (``weights.Model.weights``). A weight
is matched by entry name and shape, else by content under another name (an identical tensor id:
a renamed tensor, reported as ``mapping``). A weight the source lacks counts whole, as if the
source held zeros there: 0 is an identical model, 1 a model the source explains nothing of. The
tensors the source has and ``c`` lacks do not count (``dropped``).

**Exact** (``pair_sums``): for each matched pair of tensors with the same chunk grid only the chunk
positions whose ids differ are read (equal ids: equal bytes, difference 0, and those bytes count
as ``identical``); pairs of other grids or dtypes are read whole. Each chunk pair is reduced with
numpy on the caller's executor (``values``), the sums added in float64.

**Bound** (``stat_bound``): for equal shapes, with n elements, means and sample standard deviations,
``||a - b||^2 >= n (mean_a - mean_b)^2 + (n - 1) (std_a - std_b)^2`` (the difference of the means
and of the centred parts, each bounded below), and ``||a - b|| >= | ||a|| - ||b|| |``; the larger
of the two, in the formula above, is a lower bound of ``D`` computed from stored statistics.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from ckptrepo.explore.weights import Model, Piece, TensorSummary


@dataclass(frozen=True)
class TensorSums:
    """A matched pair of tensors: squared L2 distance, their bytes, and how many are identical."""

    d2: float
    nbytes: int
    identical_bytes: int


@dataclass(frozen=True)
class Directed:
    """``D(p -> c)`` and what it rests on (see the module docstring). ``per_tensor``: each matched
    weight's own ``||c_t - p_t|| / ||c_t||`` (exact only), by ``c``'s name; ``frozen_fraction``: of
    the matched weights' bytes, the share identical in both (exact only; else of whole tensors equal
    by id); ``mapping``: ``{c name: p name}`` for weights matched under another name."""

    distance: float
    matched: int
    new: int
    dropped: int
    new_fraction: float  # of ``c``'s weights' squared norm, the share the source lacks
    frozen_fraction: float
    per_tensor: dict[str, float]
    mapping: dict[str, str]


def matched_names(parent: Model, child: Model) -> list[tuple[str, str]]:
    """``(child name, parent name)`` for each of the child's weights the parent holds: by name and
    shape (both compared dtypes), else by an identical tensor id under another name (renamed)."""
    theirs = parent.weights()
    pairs: list[tuple[str, str]] = []
    rest: list[str] = []
    for name, mine in child.weights().items():
        other = theirs.get(name)
        if other is not None and other.shape == mine.shape:
            pairs.append((name, name))
        else:
            rest.append(name)
    if rest:
        taken = {p for _, p in pairs}
        by_id: dict[str, str] = {}
        for name, s in sorted(theirs.items()):
            if name not in taken:
                by_id.setdefault(s.tensor_id, name)
        for name in rest:
            found = by_id.get(child.tensors[name].tensor_id)
            if found is not None:
                pairs.append((name, found))
    return pairs


def directed(parent: Model, child: Model, sums: Mapping[tuple[str, str], TensorSums] | None = None) -> Directed:
    """``D(parent -> child)`` from exact ``sums`` (keyed ``(child name, parent name)``, as
    ``pair_sums`` gives them for ``matched_names(parent, child)``); without ``sums``, the statistics'
    lower bound (``stat_bound``)."""
    weights = child.weights()
    pairs = matched_names(parent, child)
    matched = {c for c, _ in pairs}
    total = math.fsum(s.l2 ** 2 for s in weights.values())
    new_sq = math.fsum(weights[n].l2 ** 2 for n in weights if n not in matched)
    per_tensor: dict[str, float] = {}
    parts: list[float] = []
    same = nbytes = 0
    for c_name, p_name in pairs:
        mine, theirs = weights[c_name], parent.tensors[p_name]
        size = mine.numel * _itemsize(mine)
        nbytes += size
        if sums is not None:
            got = sums[(c_name, p_name)]
            parts.append(got.d2)
            same += got.identical_bytes
            per_tensor[c_name] = math.sqrt(got.d2) / mine.l2 if mine.l2 > 0 else (0.0 if got.d2 == 0 else math.inf)
        else:
            parts.append(tensor_bound(mine, theirs))
            same += size if mine.tensor_id == theirs.tensor_id else 0
    dropped = sum(1 for n in parent.weights() if n not in {p for _, p in pairs})
    d2 = math.fsum(parts) + new_sq
    # No weights at all: nothing to compare, so nothing explained.
    distance = math.sqrt(d2 / total) if total > 0 else (0.0 if d2 == 0 and weights else 1.0)
    return Directed(
        distance=distance, matched=len(pairs), new=len(weights) - len(pairs), dropped=dropped,
        new_fraction=new_sq / total if total > 0 else 0.0, frozen_fraction=same / nbytes if nbytes else 0.0,
        per_tensor=per_tensor, mapping={c: p for c, p in pairs if c != p})


def stat_bound(parent: Model, child: Model) -> float:
    """A lower bound of ``D(parent -> child)`` from stored statistics alone."""
    return directed(parent, child).distance


def tensor_bound(a: TensorSummary, b: TensorSummary) -> float:
    """A lower bound of ``||a - b||^2`` from two tensors' statistics (equal shapes); 0 for equal ids."""
    if a.tensor_id == b.tensor_id:
        return 0.0
    n = a.numel
    bound = (a.l2 - b.l2) ** 2
    mean_a, mean_b, std_a, std_b = (x.stats.get(k) for x, k in ((a, "mean"), (b, "mean"), (a, "std"), (b, "std")))
    if mean_a is not None and mean_b is not None and std_a is not None and std_b is not None:
        moments = n * (mean_a - mean_b) ** 2 + (n - 1) * (std_a - std_b) ** 2
        if math.isfinite(moments):
            bound = max(bound, moments)
    return bound


def _itemsize(s: TensorSummary) -> int:
    from ckptrepo import dtypes

    return dtypes.dtype(s.dtype).itemsize


# -- exact ----------------------------------------------------------------------------------------


def pair_sums(parent: Model, child: Model, pool: Executor,
              pairs: Sequence[tuple[str, str]] | None = None) -> dict[tuple[str, str], TensorSums]:
    """Exact ``TensorSums`` of ``pairs`` (default ``matched_names(parent, child)``), ``(child name,
    parent name)`` each, reading only the chunks that differ; chunk pairs are reduced on ``pool``.
    IntegrityError (from a commit's chunk reader) when a stored chunk fails its check."""
    pairs = list(matched_names(parent, child) if pairs is None else pairs)
    todo = [(c, p) for c, p in pairs if child.tensors[c].tensor_id != parent.tensors[p].tensor_id]
    differing = set(todo)
    out = {(c, p): TensorSums(0.0, child.tensors[c].numel * _itemsize(child.tensors[c]),
                              child.tensors[c].numel * _itemsize(child.tensors[c]))
           for c, p in pairs if (c, p) not in differing}
    if not todo:
        return out
    mine = child.pieces({c for c, _ in todo})
    theirs = parent.pieces({p for _, p in todo})
    jobs: dict[tuple[str, str], tuple[list[Future[float]], int, int]] = {}
    for c, p in todo:
        a, b = mine[c], theirs[p]
        dt_a, dt_b = child.tensors[c].dtype, parent.tensors[p].dtype
        nbytes = child.tensors[c].numel * _itemsize(child.tensors[c])
        if dt_a == dt_b and [x.length for x in a] == [x.length for x in b]:
            differ = [(x, y) for x, y in zip(a, b, strict=True) if x.chunk_id != y.chunk_id]
            same = sum(x.length for x, y in zip(a, b, strict=True) if x.chunk_id == y.chunk_id)
            jobs[(c, p)] = ([pool.submit(_piece_d2, x, y, dt_a, dt_b) for x, y in differ], nbytes, same)
        else:
            jobs[(c, p)] = ([pool.submit(_whole_d2, a, b, dt_a, dt_b)], nbytes, 0)
    for key, (futures, nbytes, same) in jobs.items():
        out[key] = TensorSums(math.fsum(f.result() for f in futures), nbytes, same)
    return out


def _piece_d2(a: Piece, b: Piece, dtype_a: str, dtype_b: str) -> float:
    return _d2(values(a.read(), dtype_a), values(b.read(), dtype_b))


def _whole_d2(a: Sequence[Piece], b: Sequence[Piece], dtype_a: str, dtype_b: str) -> float:
    return _d2(values(b"".join(bytes(x.read()) for x in a), dtype_a),
               values(b"".join(bytes(y.read()) for y in b), dtype_b))


def _d2(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    if a.shape != b.shape:
        raise ValueError(f"cannot compare {a.size} values with {b.size}")
    if a.dtype != b.dtype:
        a, b = a.astype(np.float64), b.astype(np.float64)
    d = a - b
    return float(np.dot(d, d))


def values(raw: bytes | bytearray | memoryview, dtype: str) -> np.ndarray[Any, Any]:
    """The elements whose bytes (host order) are ``raw``: float64 and float32 as they are, float16 and
    bfloat16 widened exactly to float32 (bfloat16 by its bits); ``weights.COMPARED_DTYPES`` only.
    A chunk's squared difference is reduced in its values' precision (a float32 dot product over
    at most a chunk: relative error around 1e-6, far below what tells models apart) and chunks'
    sums are added in float64: widening every float32 to float64 first costs 14 times as long."""
    if dtype == "bfloat16":  # the high half of a float32
        wide = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
        return wide.view(np.float32)
    if dtype == "float16":
        return np.frombuffer(raw, dtype=np.float16).astype(np.float32)
    if dtype in ("float64", "float32"):
        return np.frombuffer(raw, dtype=dtype)
    raise ValueError(f"values of dtype {dtype} are not compared")
