"""Public value types (``ckptrepo.types``) built from database rows."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

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


def commits(s: Session, rows: list[CommitRow]) -> list[t.Commit]:
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
