"""First-parent lines: first-parent chains read as a few index ranges instead of a walk.

The first parents of all commits form a forest. It is cut into *lines*: a commit continues
its first parent's line when it is the first child there to do so, and otherwise starts a
line of its own, named by its own id (a root starts one too). Each commit stores
``line_id`` and ``fp_depth``, its number of first-parent hops to a root; a line holds one
commit per depth, consecutive and each the first parent of the next (unique index
``ux_commits_line``). A training run and the runs forked from it are then a handful of
lines, and the first-parent chain of a commit ``C`` is:

    C's line up to C's depth, then the line of the first parent of that line's first commit
    (whose id is the line's id) up to that parent's depth, and so on to a root,

one recursive step per fork on the way (``line_hops``) and one index range per line, not
one step per commit. ``place`` assigns a new commit's line inside the transaction that
inserts it; ``assign_all`` does the same for many commits at once (schema migration, bulk
loads). Nothing else writes these columns: they never change once a commit exists (gc
deletes a commit only with every commit above it on its line).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.orm import Session, aliased

from ckptrepo.db.models import Commit


def place(session: Session, commit_id: str, first_parent_id: str | None) -> tuple[str, int]:
    """``(line_id, fp_depth)`` for a new commit whose first parent is ``first_parent_id``.

    The commit continues the parent's line unless another child already does. On
    PostgreSQL the parent's row is locked (``FOR NO KEY UPDATE``, which foreign-key checks
    do not wait for) until the caller's transaction ends, so two children of one parent
    committed at once take turns and the second sees the first; SQLite's writers are
    serialized already. A parent that does not exist (the caller's foreign keys refuse the
    commit) gives a line of its own.
    """
    if first_parent_id is None:
        return commit_id, 0
    query = select(Commit.line_id, Commit.fp_depth).where(Commit.id == first_parent_id)
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(key_share=True)
    row = session.execute(query).one_or_none()
    if row is None:
        return commit_id, 0
    line, depth = row
    taken = session.scalar(select(Commit.id).where(Commit.line_id == line, Commit.fp_depth == depth + 1))
    return (commit_id if taken is not None else line), depth + 1


def assign_all(commits: Iterable[tuple[str, str | None]],
               known: dict[str, tuple[str, int]] | None = None) -> dict[str, tuple[str, int]]:
    """``{id: (line_id, fp_depth)}`` for ``commits`` given as ``(id, first_parent_id)`` with
    every parent before its children (generation order, for instance); the first child of a
    parent in that order continues its line. ``known`` places commits stored already (a
    parent missing from both starts a line of its own, as in ``place``)."""
    placed: dict[str, tuple[str, int]] = dict(known or {})
    taken = set(placed.values())
    out: dict[str, tuple[str, int]] = {}
    for cid, parent in commits:
        if parent is None or parent not in placed:
            spot = (cid, 0)
        else:
            line, depth = placed[parent]
            spot = (line, depth + 1) if (line, depth + 1) not in taken else (cid, depth + 1)
        placed[cid] = out[cid] = spot
        taken.add(spot)
    return out


def line_hops(head: str, limit: int | None = None) -> Any:
    """Recursive CTE ``(line, upto, top)``: the lines of ``head``'s first-parent chain, each
    with the depth of the chain's last commit on it (``upto``) and ``head``'s depth (``top``).
    With a ``limit`` (commits), lines past the first ``limit`` commits of the chain are left out."""
    hops = (select(Commit.line_id.label("line"), Commit.fp_depth.label("upto"), Commit.fp_depth.label("top"))
            .where(Commit.id == head)
            .cte("line_hops", recursive=True))
    first, fork = aliased(Commit), aliased(Commit)
    step = (select(fork.line_id, fork.fp_depth, hops.c.top)
            .select_from(hops)
            .join(first, first.id == hops.c.line)
            .join(fork, fork.id == first.first_parent_id))
    if limit is not None:
        step = step.where(hops.c.top - fork.fp_depth < limit)
    return hops.union_all(step)


def chain_commits(head: str, limit: int | None = None, *columns: Any) -> Any:
    """A select of ``(depth, *columns)`` over the commits of ``head``'s first-parent chain
    (``columns`` of ``Commit``, the commit's row in the FROM), depth 0 = ``head``, at most
    ``limit`` commits, in no particular order: one index range of ``commits`` per line."""
    hops = line_hops(head, limit)
    depth = (hops.c.top - Commit.fp_depth).label("depth")
    query = (select(depth, *columns)
             .select_from(hops)
             .join(Commit, and_(Commit.line_id == hops.c.line, Commit.fp_depth <= hops.c.upto)))
    if limit is not None:
        query = query.where(Commit.fp_depth > hops.c.top - limit)
    return query
