"""From a pruned commit to the nearest one whose state can still be read.

Nearest: by fewest edge hops in either direction over edges of any kind (parents and children,
merges and transfers), ties broken toward the newer commit (``created_at``, then generation).
A breadth-first walk, one query per hop, read in the caller's session.
"""

from __future__ import annotations

from typing import NoReturn

from sqlalchemy import select
from sqlalchemy.orm import Session

from ckptrepo.db.models import Commit, Edge
from ckptrepo.errors import CommitPruned
from ckptrepo.ids import short

_IN_BATCH = 500


def nearest_with_data(s: Session, commit_id: str) -> tuple[str, int] | None:
    """``(id, hops)`` of the nearest commit to ``commit_id`` that is not pruned, or None when
    no commit connected to it has data."""
    seen = {commit_id}
    frontier = [commit_id]
    hops = 0
    while frontier:
        hops += 1
        found: set[str] = set()
        for start in range(0, len(frontier), _IN_BATCH):
            batch = frontier[start : start + _IN_BATCH]
            found.update(s.scalars(select(Edge.parent_id).where(Edge.child_id.in_(batch))))
            found.update(s.scalars(select(Edge.child_id).where(Edge.parent_id.in_(batch))))
        frontier = sorted(found - seen)
        seen.update(frontier)
        best: tuple[object, ...] | None = None
        for start in range(0, len(frontier), _IN_BATCH):
            rows = s.execute(select(Commit.created_at, Commit.generation, Commit.id)
                             .where(Commit.id.in_(frontier[start : start + _IN_BATCH]), Commit.pruned.is_(False)))
            for row in rows:
                key = tuple(row)
                if best is None or key > best:
                    best = key
        if best is not None:
            return str(best[2]), hops
    return None


def refuse(s: Session, commit_id: str) -> NoReturn:
    """Raise CommitPruned for ``commit_id``, its hint naming the nearest commit with data."""
    found = nearest_with_data(s, commit_id)
    if found is None:
        hint = ("No commit connected to it has data any more: pruned commits keep only their metadata "
                "and statistics.")
    else:
        nearest, hops = found
        hint = (f"The nearest commit with data is {short(nearest)} ({hops} hop{'s' if hops != 1 else ''} "
                "away along the lineage); check that out instead.")
    raise CommitPruned(commit=short(commit_id), nearest=found[0] if found else None,
                       hops=found[1] if found else None, hint=hint)
