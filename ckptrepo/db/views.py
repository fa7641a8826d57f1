"""Public value types (``ckptrepo.types``) built from database rows."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import Table, bindparam, select
from sqlalchemy.orm import Session

from ckptrepo import types as t
from ckptrepo.db import catalog
from ckptrepo.db.models import Commit as CommitRow


def tensor_info(name: str, row: Any) -> t.TensorInfo:
    return t.TensorInfo(
        name=name, tensor_id=row.id, dtype=row.dtype, shape=tuple(row.shape), nbytes=row.nbytes,
        n_chunks=row.n_chunks,
        stats=t.TensorStats(numel=row.numel, mean=row.mean, std=row.std, min=row.min, max=row.max,
                            l2_norm=row.l2_norm, abs_max=row.abs_max, nan_count=row.nan_count,
                            inf_count=row.inf_count),
    )


_IN_BATCH = 500
# Every column ``commits`` reads, by id: not the skeleton, whose parsing a large model's
# thousands of names make the dearest part of a commit's row.
_COMMITS = cast(Table, CommitRow.__table__).c
_COMMITS_BY_ID = (select(*[c for c in _COMMITS if c.name != "skeleton"])
                  .where(_COMMITS.id.in_(bindparam("ids", expanding=True))))


def commits_by_id(s: Session, ids: Sequence[str]) -> list[t.Commit]:
    """The commits with these full ids, in the order given; ids that name no commit are left out."""
    conn = s.connection()
    found: dict[str, Any] = {}
    for start in range(0, len(ids), _IN_BATCH):
        found.update((r.id, r) for r in conn.execute(_COMMITS_BY_ID, {"ids": list(ids[start : start + _IN_BATCH])}))
    return commits(s, [found[i] for i in ids if i in found])


def commits(s: Session, rows: Sequence[Any]) -> list[t.Commit]:
    """Public commits from rows of ``commits`` (ORM objects, or rows of a select of its columns
    but the skeleton), in their order."""
    ids = [r.id for r in rows]
    edges = catalog.edges_of(s, ids)
    metrics, annotations = catalog.metrics_and_annotations_of(s, ids)
    refs = catalog.refs_at(s, ids)
    tiers = catalog.tiers_of(s, ids)
    return [_commit(r, tuple(t.Parent(e.parent_id, e.kind, e.mapping) for e in edges.get(r.id, [])),
                    metrics.get(r.id, {}), tuple(refs.get(r.id, [])), tiers.get(r.id, ("local",)),
                    annotations.get(r.id, {})) for r in rows]


def _commit(r: Any, parents: tuple[t.Parent, ...], metrics: dict[str, float], refs: tuple[str, ...],
            tiers: tuple[str, ...] = ("local",), annotations: dict[str, float] | None = None) -> t.Commit:
    """A public commit from a row of ``commits`` (attribute access) and what other tables hold."""
    return t.Commit(
        id=r.id, message=r.message, created_at=aware(r.created_at), author=r.author, host=r.host,
        branch=r.branch, step=r.step, epoch=r.epoch, parents=parents, metrics=metrics, config=r.config,
        code_version=r.code_version, n_tensors=r.n_tensors, logical_bytes=r.logical_bytes, new_bytes=r.new_bytes,
        stored_bytes=r.stored_bytes, stall_s=r.stall_s, wait_s=r.wait_s, persist_s=r.persist_s,
        nonfinite=r.nonfinite, refs=refs, pruned=bool(r.pruned), damage=getattr(r, "damage", None), tiers=tiers,
        annotations=annotations or {},
    )


def recorded_commit(row: Mapping[str, Any], parents: Sequence[tuple[str, str, Any]],
                    metrics: Mapping[str, float], refs: Sequence[str]) -> t.Commit:
    """The public commit of a row its caller has just inserted and committed, equal to what
    ``commits_by_id`` reads back, without reading it: ``row`` holds the ``commits`` values
    given to ``catalog.record_commit``, ``parents`` its edges as ``(parent id, kind, mapping)``
    in position order, ``metrics`` the values inserted, ``refs`` the refs that point at it
    (``refs_at``'s names and order). JSON values (config, a transfer's mapping) come back as
    the database returns them: through the JSON columns' encoding."""
    stored = SimpleNamespace(**{"pruned": False, **row, "created_at": row["created_at"].astimezone(timezone.utc),
                                "config": _as_stored(row["config"])})
    return _commit(stored, tuple(t.Parent(pid, kind, _as_stored(mapping)) for pid, kind, mapping in parents),
                   dict(metrics), tuple(refs))


def _as_stored(value: Any) -> Any:
    """A JSON column's value as read back (tuples become lists, keys strings); None stays None."""
    return None if value is None else json.loads(json.dumps(value))


def aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
