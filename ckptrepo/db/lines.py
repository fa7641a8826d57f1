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

Two things are kept by line for the queries that would otherwise step once per commit:
``edges.fork_line_id``/``fork_depth`` mark each edge that leaves a line (``fork_of``), so the
descendants of a commit are a few line ranges plus the edges forking off them; and
``entry_runs`` holds where each tensor name changes along a line (``runs_of``), so a tensor's
history reads the changes of each line range instead of one entry per commit.

A commit is also *linear* when it has no parent other than its first parent, and that one
(if any) is linear: its ancestors through every edge kind are then its first-parent chain,
so ancestor and log queries read the chain instead of walking edges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, and_, bindparam, select
from sqlalchemy.orm import Session, aliased

from ckptrepo.db.models import Commit


class Placement(NamedTuple):
    """Where a commit sits among the first-parent lines, and whether its ancestry is linear."""

    line_id: str
    fp_depth: int
    linear: bool  # its ancestors (through every edge kind) are exactly its first-parent chain


def extra_parent(kind: str, position: int) -> bool:
    """Whether an edge of ``kind`` at ``position`` makes its child non-linear: every edge but
    the ``parent`` edge at position 0 (the first parent) does."""
    return not (kind == "parent" and position == 0)


def place(session: Session, commit_id: str, first_parent_id: str | None, extra_parents: bool) -> Placement:
    """The placement of a new commit whose first parent is ``first_parent_id`` and which has
    other parents (merge, transfer, or a parent edge past position 0) when ``extra_parents``.

    The commit continues the parent's line unless another child already does. On
    PostgreSQL the parent's row is locked (``FOR NO KEY UPDATE``, which foreign-key checks
    do not wait for) until the caller's transaction ends, so two children of one parent
    committed at once take turns and the second sees the first; SQLite's writers are
    serialized already. A parent that does not exist (the caller's foreign keys refuse the
    commit) gives a line of its own.
    """
    if first_parent_id is None:
        return Placement(commit_id, 0, not extra_parents)
    conn = session.connection()
    row = conn.execute(_PARENT_PLACE, {"parent": first_parent_id}).one_or_none()
    if row is None:
        return Placement(commit_id, 0, False)
    line, depth, linear = row
    taken = conn.execute(_PLACE_TAKEN, {"line": line, "depth": depth + 1}).scalar()
    return Placement(commit_id if taken is not None else line, depth + 1, bool(linear) and not extra_parents)


# Built once (``place`` runs with every commit). FOR NO KEY UPDATE renders on PostgreSQL only.
_PARENT_PLACE = (select(Commit.line_id, Commit.fp_depth, Commit.linear).where(Commit.id == bindparam("parent"))
                 .with_for_update(key_share=True))
_PLACE_TAKEN = select(Commit.id).where(Commit.line_id == bindparam("line"), Commit.fp_depth == bindparam("depth"))


def assign_all(commits: Iterable[tuple[str, str | None, bool]],
               known: dict[str, Placement] | None = None) -> dict[str, Placement]:
    """``{id: Placement}`` for ``commits`` given as ``(id, first_parent_id, extra_parents)``
    (see ``place``) with every parent before its children (generation order, for instance);
    the first child of a parent in that order continues its line. ``known`` places commits
    stored already (a parent missing from both starts a line of its own, as in ``place``)."""
    placed: dict[str, Placement] = dict(known or {})
    taken = {(p.line_id, p.fp_depth) for p in placed.values()}
    out: dict[str, Placement] = {}
    for cid, parent, extra in commits:
        if parent is None:
            spot = Placement(cid, 0, not extra)
        elif parent not in placed:
            spot = Placement(cid, 0, False)
        else:
            up = placed[parent]
            line = up.line_id if (up.line_id, up.fp_depth + 1) not in taken else cid
            spot = Placement(line, up.fp_depth + 1, up.linear and not extra)
        placed[cid] = out[cid] = spot
        taken.add((spot.line_id, spot.fp_depth))
    return out


def fork_of(kind: str, position: int, child: tuple[str, int], parent: tuple[str, int]) -> tuple[str, int] | None:
    """``(fork_line_id, fork_depth)`` of an edge of ``kind`` at ``position`` from a child placed at
    ``child`` to a parent placed at ``parent`` (each ``(line_id, fp_depth)``): the parent's place,
    unless the edge is the one along which the child continues the parent's line (None)."""
    if kind == "parent" and position == 0 and child[0] == parent[0]:
        return None
    return parent


def with_forks(edges: Iterable[Mapping[str, Any]], places: Mapping[str, tuple[str, int]]) -> list[dict[str, Any]]:
    """Edge rows (``child_id``, ``parent_id``, ``kind``, ``position``, ...) with the
    ``fork_line_id`` and ``fork_depth`` that ``catalog.record_commit`` stores (``fork_of``),
    given every commit's ``(line_id, fp_depth)``: for rows inserted in bulk."""
    out: list[dict[str, Any]] = []
    for e in edges:
        fork = fork_of(e["kind"], e["position"], places[e["child_id"]], places[e["parent_id"]])
        out.append({**e, "fork_line_id": fork[0] if fork else None, "fork_depth": fork[1] if fork else None})
    return out


def runs_of(line_id: str, fp_depth: int, entries: Mapping[str, str],
            parent_entries: Mapping[str, str] | None) -> list[dict[str, Any]]:
    """The ``entry_runs`` rows of a commit placed at ``(line_id, fp_depth)`` whose tensors are
    ``entries`` (name -> tensor id): every entry when it starts its line (``parent_entries``
    None), else the names whose tensor differs from ``parent_entries`` (its first parent's, on
    the same line), with ``tensor_id`` None for those the parent has and it has not.
    ``changed_chunks`` is left 0 for the caller to fill in (it needs the chunk lists)."""
    if parent_entries is None:
        changed: dict[str, str | None] = dict(entries)
    else:
        changed = {n: t for n, t in entries.items() if parent_entries.get(n) != t}
        changed.update((n, None) for n in parent_entries if n not in entries)
    return [{"name": n, "line_id": line_id, "fp_depth": fp_depth, "tensor_id": t, "changed_chunks": 0}
            for n, t in changed.items()]


# Made once: building an alias's column proxies cost ~5 ms per query (``commits`` is wide).
_FIRST = aliased(Commit, name="line_first")
_FORK = aliased(Commit, name="line_fork")


def line_hops(head: str | ColumnElement[str], limit: int | ColumnElement[int] | None = None) -> Any:
    """Recursive CTE ``(line, upto, top)``: the lines of ``head``'s first-parent chain, each
    with the depth of the chain's last commit on it (``upto``) and ``head``'s depth (``top``).
    With a ``limit`` (commits), lines past the first ``limit`` commits of the chain are left out.
    ``head`` and ``limit`` may be bound parameters (a statement built once, run with values)."""
    hops = (select(Commit.line_id.label("line"), Commit.fp_depth.label("upto"), Commit.fp_depth.label("top"))
            .where(Commit.id == head)
            .cte("line_hops", recursive=True))
    first, fork = _FIRST, _FORK
    step = (select(fork.line_id, fork.fp_depth, hops.c.top)
            .select_from(hops)
            .join(first, first.id == hops.c.line)
            .join(fork, fork.id == first.first_parent_id))
    if limit is not None:
        step = step.where(hops.c.top - fork.fp_depth < limit)
    return hops.union_all(step)


def chain_commits(head: str | ColumnElement[str], limit: int | ColumnElement[int] | None = None,
                  *columns: Any) -> Any:
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
