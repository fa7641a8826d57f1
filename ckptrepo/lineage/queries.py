"""Lineage queries on a repository: ancestors, descendants, paths, merge bases, best commits, filtered logs.

Each function takes ``sessions`` (a factory of read sessions: ``Repo``'s methods of the same
names delegate here), resolves revisions itself and reads in one short session; nothing is written.
Revisions that do not resolve raise UnknownRevision (or AmbiguousRevision); bad arguments
UsageError, before any query runs. Results are full commit ids or public ``Commit`` values.
Graph semantics are ``lineage.graph``'s; ``where`` expressions are ``lineage.where``'s.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from ckptrepo.db import integers, refs, views
from ckptrepo.db.engine import Sessions, fetch_tuples
from ckptrepo.db.models import Commit as CommitRow
from ckptrepo.db.models import Edge, Metric, utc_datetime
from ckptrepo.lineage import graph, revparse
from ckptrepo.lineage import where as where_lang
from ckptrepo.types import EDGE_KINDS, Commit, GraphEdge, GraphNode, LineageGraph


def _depth(max_depth: int | None) -> int | None:
    return None if max_depth is None else integers.count("max_depth", max_depth, minimum=1)


def ancestors(sessions: Sessions, rev: str, *, kinds: Collection[str] = EDGE_KINDS,
              max_depth: int | None = None) -> list[str]:
    """Full ids of the commits ``rev`` descends from through edges of ``kinds`` (``rev`` itself
    excluded), at most ``max_depth`` edges away when given; nearest first (breadth-first,
    first parents first: ``graph.ancestor_ids``)."""
    kinds, max_depth = graph.check_kinds(kinds), _depth(max_depth)
    with sessions() as s:
        return graph.ancestor_ids(s, revparse.resolve(s, rev), kinds, max_depth)


def descendants(sessions: Sessions, rev: str, *, kinds: Collection[str] = EDGE_KINDS,
                max_depth: int | None = None) -> list[str]:
    """Full ids of the commits that descend from ``rev`` through edges of ``kinds`` (``rev``
    excluded), at most ``max_depth`` edges away when given; nearest first (breadth-first,
    siblings by id: ``graph.descendant_ids``)."""
    kinds, max_depth = graph.check_kinds(kinds), _depth(max_depth)
    with sessions() as s:
        return graph.descendant_ids(s, revparse.resolve(s, rev), kinds, max_depth)


def path(sessions: Sessions, a: str, b: str, *, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
    """Full ids along a shortest chain from ``a`` to ``b`` (both included): down through parents
    to a common ancestor, then up through children (``graph.shortest_path``). ``[a]`` when they
    name the same commit; ``[]`` when the two share no ancestor."""
    kinds = graph.check_kinds(kinds)
    with sessions() as s:
        return graph.shortest_path(s, revparse.resolve(s, a), revparse.resolve(s, b), kinds)


def merge_base(sessions: Sessions, a: str, b: str, *, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
    """Full ids of the best common ancestors of ``a`` and ``b`` (git's merge bases; a commit is
    its own ancestor), highest generation first: one normally, several after criss-cross
    merges, ``[]`` when unrelated."""
    kinds = graph.check_kinds(kinds)
    with sessions() as s:
        return graph.merge_bases(s, revparse.resolve(s, a), revparse.resolve(s, b), kinds)


def best(sessions: Sessions, metric: str, *, maximize: bool = False, branch: str | None = None,
         subtree: str | None = None, limit: int = 1) -> list[Commit]:
    """The ``limit`` commits with the lowest (``maximize``: highest) value of ``metric``, best first.

    Only commits recording the metric with a finite-or-infinite value (not NaN) compete;
    ties go to the lower generation, then the earlier commit. ``branch``: only ``branch`` and
    its ancestors (any revision works); ``subtree``: only ``subtree`` and its descendants; both:
    commits in both. UsageError for a metric no commit records.
    """
    integers.count("limit", limit, minimum=1)
    with sessions() as s:
        where_lang.check_metrics(s, {metric})
        value = Metric.value
        q = (select(CommitRow).join(Metric, Metric.commit_id == CommitRow.id)
             .where(Metric.name == metric, value.between(-math.inf, math.inf)))  # NaN sorts above inf: out
        if branch is not None:
            q = q.where(CommitRow.id.in_(graph.ancestors_cte(revparse.resolve(s, branch))))
        if subtree is not None:
            q = q.where(CommitRow.id.in_(graph.descendants_cte(revparse.resolve(s, subtree))))
        order = value.desc() if maximize else value.asc()
        rows = list(s.scalars(q.order_by(order, CommitRow.generation, CommitRow.created_at, CommitRow.id)
                              .limit(limit)))
        return _public(s, rows)


def log(sessions: Sessions, rev: str | None = None, *, where: str | None = None, limit: int | None = None,
        offset: int = 0) -> list[Commit]:
    """``rev`` and its ancestors (every commit when None), newest first, only those matching the
    expression ``where`` (``lineage.where``: UsageError when malformed or naming an unknown
    field or metric); ``offset`` skipped, at most ``limit`` (see ``graph.log_commits``)."""
    if limit is not None:
        integers.count("limit", limit, minimum=1)
    integers.count("offset", offset)
    node = where_lang.parse(where) if where is not None else None
    with sessions() as s:
        start = revparse.resolve(s, rev) if rev is not None else None
        condition = where_lang.compile_checked(s, node, where or "") if node is not None else None
        return _public(s, graph.log_commits(s, start, limit, offset, condition))


def commits(sessions: Sessions, ids: Sequence[str]) -> list[Commit]:
    """The commits with these full ids, in the order given; ids that name no commit are left out."""
    with sessions() as s:
        return views.commits_by_id(s, ids)


_GRAPH_NODES = select(CommitRow.id, CommitRow.message, CommitRow.created_at, CommitRow.branch, CommitRow.step,
                      CommitRow.pruned, CommitRow.generation, CommitRow.line_id, CommitRow.fp_depth,
                      CommitRow.damage)
_GRAPH_EDGES = select(Edge.child_id, Edge.parent_id, Edge.kind, Edge.position)


def lineage_graph(sessions: Sessions, rev: str | None = None) -> LineageGraph:
    """The lineage graph as a drawing needs it (``LineageGraph``): every commit, or ``rev`` and its
    ancestors through every edge kind when given, the edges between them, and every ref; read in
    one session, three queries of the few columns a node needs (no metrics, config or figures),
    as the driver's tuples (10,000 commits in tens of milliseconds)."""
    with sessions() as s:
        within: set[str] | None = None
        if rev is not None:
            start = revparse.resolve(s, rev)
            # The ancestors' ids (a first-parent line's ranges when linear), then every row
            # filtered here: cheaper than joining both reads with a recursive walk each.
            within = {start, *graph.ancestor_ids(s, start)}
        conn = s.connection()
        node_rows = fetch_tuples(conn, _GRAPH_NODES)
        edge_rows = fetch_tuples(conn, _GRAPH_EDGES.order_by(Edge.child_id, Edge.position))
        ref_rows = refs.listing(s, "branch") + refs.listing(s, "tag") + refs.listing(s, "remote")
    if within is not None:
        node_rows = [r for r in node_rows if r[0] in within]
        edge_rows = [r for r in edge_rows if r[0] in within]
    made = [GraphNode(cid, message.split("\n", 1)[0].rstrip("\r") if message else "", utc_datetime(created),
                      branch, step, bool(pruned), generation, line, depth, damage is not None)
            for cid, message, created, branch, step, pruned, generation, line, depth, damage in node_rows]
    made.sort(key=lambda n: (n.generation, n.created_at, n.id))
    return LineageGraph(nodes=tuple(made), edges=tuple(GraphEdge(*row) for row in edge_rows), refs=tuple(ref_rows))


def _public(s: Session, rows: list[CommitRow]) -> list[Commit]:
    return views.commits(s, rows)
