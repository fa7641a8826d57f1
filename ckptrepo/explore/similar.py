"""The commits nearest to a model (a commit, or a checkpoint not committed), in three stages of
growing cost, each on fewer commits (``search``):

1. **Shared chunks** (one aggregate query per 500 chunk keys over ``tensor_chunks`` and
   ``entries``): for every commit holding any of the query's chunks, the bytes of the query's
   distinct chunks it holds. Equal chunk ids are equal bytes, so this finds frozen parts, copies
   and unchanged tensors at no read; a full fine-tune changes every chunk and shares none.
2. **Statistics** (no tensor bytes read): for up to ``PROBES`` of the query's largest weights, every
   tensor ever stored under that name (``entry_runs`` is indexed by name: one index range each)
   with the commits holding it; each commit gets the lower bound of ``distance.directed`` over those
   probes. The best ``max(4 n, 16)`` by that bound and the best ``max(2 n, 8)`` by shared bytes are
   kept; for those, every tensor's statistics give the bound over all the query's weights.
3. **Exact** (``distance.pair_sums``: only differing chunks are read) on the candidates in order of
   their bound: at least ``max(n, 3)`` of them, then on while a candidate's bound is below the
   ``n``-th best exact distance found (a bound is never above its exact figure, so none better is
   skipped among those), and never more than ``4 max(n, 3)``.

Pruned and damaged commits are left out (their state cannot be read), as are ``exclude``.
The work is bounded by ``n`` and the query's size, not by the number of commits, but for stages 1
and 2's index reads (one row per commit holding a shared chunk or a probed tensor).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.orm import Session

from ckptrepo.db import catalog
from ckptrepo.db.engine import Sessions
from ckptrepo.db.models import Chunk, Commit, Entry, EntryRun, Tensor, TensorChunk
from ckptrepo.entries import is_file_entry
from ckptrepo.explore import distance
from ckptrepo.explore.weights import Model, TensorSummary

PROBES = 8  # the query's largest weights probed in stage 2
_BATCH = 500  # keys per IN list

_CT, _ET, _RT, _TT, _TCT, _CMT = (cast(Table, m.__table__) for m in (Chunk, Entry, EntryRun, Tensor, TensorChunk,
                                                                       Commit))
_C, _E, _R, _T, _TC, _CM = _CT.c, _ET.c, _RT.c, _TT.c, _TCT.c, _CMT.c

_PAIRS = (select(_E.commit_id.label("commit_id"), _TC.chunk_key.label("chunk_key"))
          .select_from(_TCT).join(_ET, _E.tensor_key == _TC.tensor_key)
          .where(_TC.chunk_key.in_(bindparam("keys", expanding=True))).distinct().subquery())
_SHARED = (select(_PAIRS.c.commit_id, func.sum(_C.raw_length))
           .join(_CT, _C.key == _PAIRS.c.chunk_key).group_by(_PAIRS.c.commit_id))
_COMMIT_CHUNKS = (select(_C.key, _C.raw_length).select_from(_ET).join(_TCT, _TC.tensor_key == _E.tensor_key)
                  .join(_CT, _C.key == _TC.chunk_key).where(_E.commit_id == bindparam("commit_id")).distinct())
_NAMED = (select(_E.commit_id, _T.id, _T.dtype, _T.shape, _T.numel, _T.mean, _T.std, _T.l2_norm, _T.abs_max)
          .select_from(_RT).join(_ET, (_E.tensor_key == _R.tensor_key) & (_E.name == _R.name))
          .join(_TT, _T.key == _R.tensor_key).where(_R.name == bindparam("name")).distinct())
_READABLE = select(_CM.id).where(_CM.id.in_(bindparam("ids", expanding=True)), _CM.pruned.is_(False),
                                 _CM.damage.is_(None))


@dataclass
class Found:
    """A commit near the query: its model, the query's chunk bytes it holds (and their share of the
    query's distinct chunk bytes), ``D(commit -> query)``'s bound from statistics and, when the
    exact stage reached it, its exact figure."""

    model: Model
    shared_bytes: int
    shared_fraction: float
    bound: distance.Directed
    exact: distance.Directed | None = None

    @property
    def distance(self) -> float:
        return self.exact.distance if self.exact is not None else self.bound.distance


def query_chunks(query: Model, chunk_ids: Mapping[str, int] | None, session: Session) -> dict[int, int]:
    """The query's distinct chunks stored here: key -> bytes. ``chunk_ids``: a state's chunk id ->
    length; None for a stored commit (read from its entries)."""
    if query.commit_id is not None and chunk_ids is None:
        return {key: length for key, length in session.execute(_COMMIT_CHUNKS, {"commit_id": query.commit_id})}
    lengths = dict(chunk_ids or {})
    keys = catalog.chunk_keys_of(session, lengths)
    return {key: lengths[cid] for cid, key in keys.items()}


def shared_chunks(session: Session, chunks: Mapping[int, int]) -> dict[str, int]:
    """Stage 1: commit id -> bytes of ``chunks`` (key -> bytes) it holds, each distinct chunk once."""
    keys = sorted(chunks)
    out: dict[str, int] = {}
    for start in range(0, len(keys), _BATCH):
        for commit_id, nbytes in session.execute(_SHARED, {"keys": keys[start:start + _BATCH]}):
            out[commit_id] = out.get(commit_id, 0) + int(nbytes or 0)
    return out


def probe_rows(session: Session, names: Collection[str]) -> dict[str, dict[str, TensorSummary]]:
    """Stage 2's reads: commit id -> {probed name: that commit's tensor of the name (statistics)}."""
    out: dict[str, dict[str, TensorSummary]] = {}
    for name in names:
        for cid, tid, dtype, shape, numel, mean, std, l2, top in session.execute(_NAMED, {"name": name}):
            stats = {"numel": numel, "mean": mean, "std": std, "l2_norm": l2, "abs_max": top}
            out.setdefault(cid, {})[name] = TensorSummary(dtype, tuple(shape), stats, tid)
    return out


def probes(query: Model) -> list[str]:
    """The query's ``PROBES`` largest weights (by elements, then name)."""
    weights = query.weights()
    return sorted(weights, key=lambda n: (-weights[n].numel, n))[:PROBES]


def search(reading: Sessions, query: Model, load: Callable[[str], Model], pool: Executor, *, n: int,
           chunk_ids: Mapping[str, int] | None = None, exclude: Collection[str] = (),
           exact: bool = True) -> list[Found]:
    """The commits nearest to ``query`` (see the module docstring), nearest first: those the exact
    stage measured by their exact ``D(commit -> query)``, then the others by their bound; at most
    ``n``. ``load(commit_id)``: a commit's model (statistics; chunks on demand). ``exact=False``:
    stages 1 and 2 alone (no tensor bytes read), ranked by the bound."""
    if n <= 0:
        return []
    skip = set(exclude) | ({query.commit_id} if query.commit_id else set())
    with reading() as s:
        mine = query_chunks(query, chunk_ids, s)
        shared = {cid: b for cid, b in shared_chunks(s, mine).items() if cid not in skip} if mine else {}
        probed = probe_rows(s, probes(query))
        ids = sorted((set(shared) | set(probed)) - skip)
        readable: set[str] = set()
        for start in range(0, len(ids), _BATCH):
            readable.update(s.scalars(_READABLE, {"ids": ids[start:start + _BATCH]}))
    total = sum(mine.values()) if query.commit_id else sum((chunk_ids or {}).values())
    bound = _probe_bound(query)
    by_bound = sorted(readable, key=lambda cid: (bound(probed.get(cid, {})), cid))
    by_shared = sorted((c for c in readable if shared.get(c)), key=lambda cid: (-shared[cid], cid))
    keep = list(dict.fromkeys(by_bound[:max(4 * n, 16)] + by_shared[:max(2 * n, 8)]))
    found = []
    for cid in keep:
        model = load(cid)
        got = shared.get(cid, 0)
        found.append(Found(model, got, got / total if total else 0.0, distance.directed(model, query)))
    found.sort(key=lambda f: (f.bound.distance, -f.shared_bytes, f.model.label))
    if exact:
        measure(found, query, pool, n=n)
    found.sort(key=lambda f: (f.exact is None, f.distance, f.model.label))
    return found[:n]


def measure(found: list[Found], query: Model, pool: Executor, *, n: int) -> None:
    """Stage 3 over ``found`` (in order of bound): set ``exact`` on the first ``max(n, 3)``, then on
    while a bound is below the ``n``-th best exact distance, at most ``4 max(n, 3)`` in all."""
    least = max(n, 3)
    done: list[float] = []
    for i, f in enumerate(found):
        if i >= 4 * least:
            break
        if i >= least and len(done) >= n and f.bound.distance >= sorted(done)[n - 1]:
            break
        f.exact = distance.directed(f.model, query, distance.pair_sums(f.model, query, pool))
        done.append(f.exact.distance)


def _probe_bound(query: Model) -> Callable[[Mapping[str, TensorSummary]], float]:
    """``D(commit -> query)``'s bound over the probed weights alone, as a function of a commit's
    probed rows (a probe the commit lacks, or holds at another shape, counts whole); the query's
    side is computed once."""
    weights = query.weights()
    names = probes(query)
    total = math.fsum(weights[name].l2 ** 2 for name in names)

    def bound(theirs: Mapping[str, TensorSummary]) -> float:
        parts = []
        for name in names:
            mine, other = weights[name], theirs.get(name)
            if other is None or other.shape != mine.shape:
                parts.append(mine.l2 ** 2)
            else:
                parts.append(distance.tensor_bound(mine, other))
        return math.sqrt(math.fsum(parts) / total) if total > 0 else 0.0

    return bound


def commit_rows(session: Session, commit_id: str) -> dict[str, tuple[str, Any, dict[str, Any], str]]:
    """A commit's tensors (name -> dtype, shape, statistics, tensor id) from the catalog alone."""
    return {entry.name: (tensor.dtype, tensor.shape,
                         {"numel": tensor.numel, "mean": tensor.mean, "std": tensor.std, "min": tensor.min,
                          "max": tensor.max, "l2_norm": tensor.l2_norm, "abs_max": tensor.abs_max}, tensor.id)
            for entry, tensor in catalog.tensor_layout(session, commit_id) if not is_file_entry(entry.name)}
