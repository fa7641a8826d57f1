"""Annotations: results attached to commits after they were made, like git notes.

Every value is a row of ``annotations`` (a metric's value, or a note with no name), never changed
or removed while its commit exists; per (commit, metric name) the newest one (by its time, then
its journal key) is current, and is mirrored as a ``metrics`` row marked ``annotated``, so that
``where``, ``best``, ``history`` and charts read results and logged metrics alike. A commit's
logged metrics are part of its id: a name the commit logged cannot be annotated on it
(``record`` raises UsageError, or, for what a store supplies, skips it).

The caller owns the write transaction and the journal entry (``ledger.journal``, op
``annotate``) that holds the same values in the store, and passes its key: ``record`` is what an
``annotate``, a rebuild and a fetch each insert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from ckptrepo import types as t
from ckptrepo.db.engine import insert_tuples
from ckptrepo.db.models import Annotation, Metric
from ckptrepo.errors import UsageError
from ckptrepo.ids import short

_IN_BATCH = 500


def logged_names(s: Session, commit_id: str, names: Sequence[str]) -> list[str]:
    """The names among ``names`` that ``commit_id`` logged when it was made (not annotations)."""
    return sorted(s.scalars(select(Metric.name).where(Metric.commit_id == commit_id, Metric.name.in_(list(names)),
                                                      Metric.annotated.is_(False))))


def refuse_logged(s: Session, commit_id: str, names: Sequence[str]) -> None:
    """UsageError when ``commit_id`` logged any of ``names`` when it was made."""
    clash = logged_names(s, commit_id, names)
    if clash:
        raise UsageError(f"commit {short(commit_id)} logged {', '.join(clash)} when it was made; a logged metric "
                         "is part of the commit's id and cannot be annotated",
                         hint=f"Record the result under another name, e.g. eval/{clash[0]}.")


def record(s: Session, commit_id: str, metrics: Mapping[str, float], note: str | None, source: str | None,
           at: datetime, key: str | None, *, strict: bool = True) -> int:
    """Insert one annotation's values (``metrics``, and ``note`` as a row of its own) on
    ``commit_id`` at time ``at`` from the journal entry ``key``, and make each the current value
    of its name unless a newer one is current already. A name the commit logged: UsageError when
    ``strict``, else skipped. An entry whose key is recorded already inserts nothing. Returns how
    many rows it inserted."""
    if key is not None and s.scalar(select(Annotation.key).where(Annotation.journal_key == key).limit(1)) is not None:
        return 0
    if strict:
        refuse_logged(s, commit_id, list(metrics))
    clash = set(logged_names(s, commit_id, list(metrics)))
    values = {name: float(v) for name, v in metrics.items() if name not in clash}
    rows: list[tuple[Any, ...]] = [(commit_id, name, value, None, source, at, key)
                                   for name, value in sorted(values.items())]
    if note is not None:
        rows.append((commit_id, None, None, note, source, at, key))
    insert_tuples(s.connection(), Annotation, ("commit_id", "name", "value", "note", "source", "at", "journal_key"),
                  rows)
    for name, value in sorted(values.items()):
        newest = s.execute(select(Annotation.at, Annotation.journal_key).where(
            Annotation.commit_id == commit_id, Annotation.name == name)
            .order_by(Annotation.at.desc(), Annotation.journal_key.desc()).limit(1)).first()
        if newest is not None and (newest[0], newest[1] or "") > (at, key or ""):
            continue  # a newer value (fetched from another clone) stays current
        current = s.scalar(select(Metric.annotated).where(Metric.commit_id == commit_id, Metric.name == name))
        if current is None:
            insert_tuples(s.connection(), Metric, ("commit_id", "name", "value", "annotated"),
                          [(commit_id, name, value, True)])
        else:
            s.execute(update(Metric).where(Metric.commit_id == commit_id, Metric.name == name).values(value=value))
    return len(rows)


def history(s: Session, commit_id: str, name: str | None = None) -> list[t.Annotation]:
    """Every annotation of ``commit_id`` (only metric ``name``'s when given), oldest first, each
    marked ``current`` when it is its name's current value (every note is current)."""
    q = select(Annotation.commit_id, Annotation.name, Annotation.value, Annotation.note, Annotation.source,
               Annotation.at, Annotation.journal_key).where(Annotation.commit_id == commit_id)
    if name is not None:
        q = q.where(Annotation.name == name)
    rows = list(s.execute(q.order_by(Annotation.at, Annotation.journal_key, Annotation.key)))
    newest: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row[1] is not None:
            newest[row[1]] = i
    return [t.Annotation(cid, n, v, note, source, at, n is None or newest[n] == i)
            for i, (cid, n, v, note, source, at, _) in enumerate(rows)]


def current_of(s: Session, commit_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """The current annotated values per commit id (commits without any are left out)."""
    out: dict[str, dict[str, float]] = {}
    ids = list(commit_ids)
    for start in range(0, len(ids), _IN_BATCH):
        for cid, name, value in s.execute(select(Metric.commit_id, Metric.name, Metric.value).where(
                Metric.commit_id.in_(ids[start : start + _IN_BATCH]), Metric.annotated.is_(True))):
            out.setdefault(cid, {})[name] = value
    return out


def journal_keys(s: Session) -> set[str]:
    """The journal keys of every annotation this database holds."""
    return {k for k in s.scalars(select(Annotation.journal_key).distinct()) if k is not None}
