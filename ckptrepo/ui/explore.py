"""What the pages show of a lineage explored after the fact, from ``Repo`` reads of the catalog:
a commit's annotations (``Repo.annotations``), the method of a merge made by ``ckpt merge``
(``Repo.merge_weights``: the commit's config), the commits most similar to one (``Repo.similar``
in its catalog-only mode: shared chunks and statistics, no tensor bytes read), and which points of
a metric chart are annotated values (``Commit.annotations``, not logged ``Commit.metrics``).

A merge commit's config is only trusted as one when it has the shape ``Repo.merge_weights``
writes (``{"merge": {"method", "inputs", "base"?, "weights"?, "density"?, "lambda"?, "t"?}}``)
and its ``inputs`` are the commit's own parents (the first parent, then the merge edges) and its
``base`` one of its parents: a training config that merely holds a ``merge`` key is not a merge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ckptrepo import Commit, Repo
from ckptrepo.types import Annotation, LineageGraph

#: How many commits the similar panel lists, and the graph's merge labels at most read (their configs).
SIMILAR = 5
MERGE_LABELS = 2000
_BATCH = 1000  # ids per ``Repo.commits`` call
_PARAMS = (("density", "density"), ("lambda", "λ"), ("t", "t"))


# -- annotations ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Annotations:
    """A commit's annotations as its page shows them: ``values`` (the current value of each
    annotated metric, by name), ``notes`` (oldest first) and ``history`` (every entry, oldest
    first; a value a newer one replaced has ``current`` False)."""

    values: list[Annotation]
    notes: list[Annotation]
    history: list[Annotation]

    @property
    def superseded(self) -> int:
        return sum(1 for a in self.history if not a.current)


def annotations_of(repo: Repo, commit_id: str) -> Annotations:
    history = repo.annotations(commit_id)
    values = sorted((a for a in history if a.name is not None and a.current), key=lambda a: a.name or "")
    return Annotations(values, [a for a in history if a.name is None], history)


# -- merges --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Merge:
    """A merge ``ckpt merge`` made: ``method``, ``inputs`` (commit ids, in order), each input's
    weight (None: the method takes none), ``base`` (a commit id, or None), and the method's other
    parameters in display order (``density``, ``λ``, ``t``)."""

    method: str
    inputs: tuple[str, ...]
    weights: tuple[float, ...] | None
    base: str | None
    params: tuple[tuple[str, float], ...]

    @property
    def summary(self) -> str:
        """``ties, density 0.5, λ 1.0`` (the method and its scalar parameters)."""
        return ", ".join([self.method, *(f"{label} {plain(value)}" for label, value in self.params)])

    @property
    def weighted_inputs(self) -> list[tuple[str, str | None]]:
        """Each input's id with its weight as text (None: the method takes no weights)."""
        weights = self.weights or ()
        return [(cid, plain(weights[i]) if i < len(weights) else None) for i, cid in enumerate(self.inputs)]

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "summary": self.summary, "inputs": list(self.inputs),
                "weights": list(self.weights) if self.weights is not None else None, "base": self.base,
                "params": {label: value for label, value in self.params}}


def plain(value: float) -> str:
    """A parameter as a person gave it: ``0.5``, ``1.0``, ``0.333333``."""
    text = f"{value:.6g}"
    return text if any(c in text for c in ".enai") else text + ".0"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def merge_of(commit: Commit) -> Merge | None:
    """The merge ``commit`` records, if it is one ``Repo.merge_weights`` made (see the module
    docstring), else None."""
    config = commit.config
    spec = config.get("merge") if isinstance(config, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    method, inputs, base, weights = spec.get("method"), spec.get("inputs"), spec.get("base"), spec.get("weights")
    joined = [p.id for p in commit.parents if p.kind in ("parent", "merge")]
    if not (isinstance(method, str) and method and isinstance(inputs, list) and inputs == joined):
        return None
    if base is not None and base not in commit.parent_ids:
        return None
    if weights is not None and not (isinstance(weights, list) and len(weights) == len(inputs)
                                    and all(_number(w) for w in weights)):
        return None
    params = tuple((label, float(spec[key])) for key, label in _PARAMS if _number(spec.get(key)))
    return Merge(method, tuple(inputs), tuple(float(w) for w in weights) if weights is not None else None,
                 base, params)


def _commits(repo: Repo, ids: Sequence[str]) -> Iterable[Commit]:
    for start in range(0, len(ids), _BATCH):
        yield from repo.commits(ids[start:start + _BATCH])


def merge_labels(repo: Repo, graph: LineageGraph) -> dict[str, str]:
    """Commit id -> ``Merge.summary`` of the merges ``ckpt merge`` made among ``graph``'s nodes:
    only commits that a merge or transfer edge leaves are read (their configs), the newest
    ``MERGE_LABELS`` of them."""
    ends = {e.child for e in graph.edges if e.kind in ("merge", "transfer")}
    candidates = [n.id for n in reversed(graph.nodes) if n.id in ends][:MERGE_LABELS]
    out: dict[str, str] = {}
    for commit in _commits(repo, candidates):
        found = merge_of(commit)
        if found is not None:
            out[commit.id] = found.summary
    return out


# -- similar commits ------------------------------------------------------------------------------


def similar_json(repo: Repo, commit_id: str, n: int = SIMILAR) -> dict[str, Any]:
    """``{"commit", "exact": false, "similar": [...]}``: the ``n`` commits nearest to ``commit_id``
    from the catalog alone (``Repo.similar(exact=False)``: shared chunk bytes and the statistics'
    distance bound, no tensor bytes read), nearest first, each ``Similarity.to_json()`` plus the
    commit's ``message`` (first line), ``step`` and ``branch``."""
    found = repo.similar(commit_id, n=n, exact=False)
    known = {c.id: c for c in repo.commits([s.commit_id for s in found])}
    rows = []
    for s in found:
        c = known.get(s.commit_id)
        rows.append({**s.to_json(), "message": (c.message if c else "").split("\n", 1)[0],
                     "step": c.step if c else None, "branch": c.branch if c else None})
    return {"commit": commit_id, "exact": False, "similar": rows}
