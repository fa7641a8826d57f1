"""Public value types (``ckptrepo.types``) built from database rows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
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
    metrics = catalog.metrics_of(s, ids)
    refs = catalog.refs_at(s, ids)
    return [
        t.Commit(
            id=r.id, message=r.message, created_at=aware(r.created_at), author=r.author, host=r.host,
            branch=r.branch, step=r.step, epoch=r.epoch,
            parents=tuple(t.Parent(e.parent_id, e.kind, e.mapping) for e in edges.get(r.id, [])),
            metrics=metrics.get(r.id, {}), config=r.config, code_version=r.code_version, n_tensors=r.n_tensors,
            logical_bytes=r.logical_bytes, new_bytes=r.new_bytes, stored_bytes=r.stored_bytes,
            stall_s=r.stall_s, wait_s=r.wait_s, persist_s=r.persist_s, nonfinite=r.nonfinite,
            refs=tuple(refs.get(r.id, [])),
        )
        for r in rows
    ]


def aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=timezone.utc)
