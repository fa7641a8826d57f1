"""Graph queries over the ``edges`` table as recursive CTEs (run on SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import Select, literal, select
from sqlalchemy.orm import Session

from ckptrepo.db.models import Commit, Edge

EDGE_KINDS = ("parent", "merge", "transfer")


def ancestors_cte(start: str, kinds: Collection[str] = EDGE_KINDS, max_depth: int | None = None) -> Select[tuple[str]]:
    """Ids of ``start`` and every commit reachable through parent edges of ``kinds``.

    UNION (not UNION ALL) keeps each commit once, so merges that reconverge do not
    multiply rows and the recursion ends on any DAG.
    """
    if max_depth is None:
        walk = select(literal(start).label("id")).cte("walk", recursive=True)
        step = select(Edge.parent_id).join(walk, Edge.child_id == walk.c.id)
        walk = walk.union(step.where(Edge.kind.in_(list(kinds))))
        return select(walk.c.id)
    deep = select(literal(start).label("id"), literal(0).label("depth")).cte("walk", recursive=True)
    dstep = select(Edge.parent_id, deep.c.depth + 1).join(deep, Edge.child_id == deep.c.id)
    deep = deep.union(dstep.where(Edge.kind.in_(list(kinds)), deep.c.depth < max_depth))
    return select(deep.c.id).distinct()


def log_commits(session: Session, start: str | None, limit: int | None, offset: int = 0) -> list[Commit]:
    """Commits newest first: ``start`` and its ancestors, or every commit when ``start`` is None."""
    q = select(Commit)
    if start is not None:
        q = q.where(Commit.id.in_(ancestors_cte(start)))
    q = q.order_by(Commit.created_at.desc(), Commit.generation.desc(), Commit.id).offset(offset)
    if limit is not None:
        q = q.limit(limit)
    return list(session.scalars(q))
