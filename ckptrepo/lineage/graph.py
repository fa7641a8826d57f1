"""Graph queries over the ``edges`` table as recursive CTEs (run on SQLite and PostgreSQL).

Contracts: every function takes a ``Session`` owned by the caller and *full* commit ids
(resolve revisions first, ``revparse``); nothing here writes, and every value travels as a
bound parameter. *Ancestors* follow edges from child to parent, *descendants* from parent
to child, through edges of the given ``kinds`` only (default: all of ``EDGE_KINDS``). Walks
are set recursions (UNION, not UNION ALL), so they end on any DAG, however many paths reconverge;
the exceptions, a line of parents (``_line_of_parents``) and descendants on SQLite
(``_walk_edges``), are cut off by a LIMIT. Unbounded descendants through parent edges walk
first-parent lines instead (``_line_ranges``): one step per line, not per commit.

Ancestors and descendants come nearest first (breadth-first). ``commits.generation`` (1 +
the highest generation of a commit's parents, through any edge kind; written once, at
commit) orders merge bases and bounds the merge-base, path and log-page searches: every
edge goes from a higher generation to a lower one, so walking the ancestors of some
commits band by band of generations, highest first, sees every commit after all of its
children. Those searches stop as soon as nothing below can change the answer, instead of
walking whole histories down to their roots.
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from itertools import pairwise
from operator import itemgetter
from typing import Any

from sqlalchemy import CTE, ColumnElement, Select, and_, bindparam, cast, func, literal, select
from sqlalchemy.orm import Session, aliased, defer

from ckptrepo.db import lines
from ckptrepo.db.engine import fetch_tuples
from ckptrepo.db.models import Commit, Edge, Id
from ckptrepo.errors import UsageError
from ckptrepo.types import EDGE_KINDS

FIRST_BAND = 64  # generations in the first band of a banded search; each next band is twice as deep
_A, _B, _STALE = 1, 2, 4
_IN_BATCH = 500


def check_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """``kinds`` as a sorted tuple of distinct edge kinds; UsageError for an empty or unknown one."""
    chosen = tuple(sorted({k.strip() for k in kinds}))
    unknown = [k for k in chosen if k not in EDGE_KINDS]
    if unknown or not chosen:
        what = f"unknown edge kind {unknown[0]!r}" if unknown else "no edge kind given"
        raise UsageError(what, hint=f"Edge kinds are {', '.join(EDGE_KINDS)} (comma-separated).")
    return chosen


def _kind_filter(kinds: Collection[str]) -> list[ColumnElement[bool]]:
    """No condition when every kind is wanted: the walk then reads nothing but the key index."""
    excluded = sorted(set(EDGE_KINDS) - set(kinds))
    return [Edge.kind.not_in(excluded)] if excluded else []


def _walk(start: str, kinds: Collection[str], max_depth: int | None, *, down: bool) -> CTE:
    """Recursive CTE (``id``) of ``start`` and every commit reachable from it, at most ``max_depth``
    edges away (any distance when None); ``down`` follows child -> parent, else parent -> child."""
    src, dst = (Edge.child_id, Edge.parent_id) if down else (Edge.parent_id, Edge.child_id)
    name = "ancestors" if down else "descendants"  # distinct names: one query may hold both
    if max_depth is None:
        walk = select(cast(literal(start), Id).label("id")).cte(name, recursive=True)
        return walk.union(select(dst).join(walk, src == walk.c.id).where(*_kind_filter(kinds)))
    deep = select(cast(literal(start), Id).label("id"), literal(0).label("depth")).cte(name, recursive=True)
    # (id, depth) pairs are bounded by max_depth, so a DAG's many paths cannot multiply rows without end.
    step = select(dst, deep.c.depth + 1).join(deep, src == deep.c.id)
    return deep.union(step.where(deep.c.depth < max_depth, *_kind_filter(kinds)))


def ancestors_cte(start: str, kinds: Collection[str] = EDGE_KINDS, max_depth: int | None = None) -> Select[tuple[str]]:
    """Ids of ``start`` and every commit reachable through parent edges of ``kinds``
    (at most ``max_depth`` edges away when given)."""
    walk = _walk(start, kinds, max_depth, down=True)
    return select(walk.c.id) if max_depth is None else select(walk.c.id).distinct()


def descendants_cte(start: str, kinds: Collection[str] = EDGE_KINDS,
                    max_depth: int | None = None) -> Select[tuple[str]]:
    """Ids of ``start`` and every commit that reaches it through parent edges of ``kinds``."""
    walk = _walk(start, kinds, max_depth, down=False)
    return select(walk.c.id) if max_depth is None else select(walk.c.id).distinct()


def _edge_walk(start: str, kinds: Collection[str], max_depth: int | None, *, down: bool,
               repeat: bool = False) -> Select[Any]:
    """Rows (from, to, position) of every edge of ``kinds`` on a walk from ``start`` (``down``: to
    parents) through at most ``max_depth`` edges; rows (from, to) walking up to children, whose
    order needs no position (siblings go by id), so each step reads nothing but the covering
    ``ix_edges_parent_walk``. A commit reached through several edges is expanded once per edge;
    UNION drops the repeated rows that makes. With ``repeat`` (``max_depth`` None only) the walk
    is a UNION ALL: an edge comes once per path from ``start`` to it, so where paths reconverge
    (merges) the rows above repeat, and multiply with every further reconvergence."""
    src, dst = (Edge.child_id, Edge.parent_id) if down else (Edge.parent_id, Edge.child_id)
    cols: list[Any] = [src, dst, Edge.position] if down else [src, dst]
    depth = [literal(1).label("depth")] if max_depth is not None else []
    walk = select(*cols, *depth).where(src == start, *_kind_filter(kinds)).cte("edge_walk", recursive=True)
    more = [walk.c.depth + 1] if max_depth is not None else []
    step = select(*cols, *more).join(walk, src == walk.c[dst.key]).where(*_kind_filter(kinds))
    if max_depth is not None:
        step = step.where(walk.c.depth < max_depth)
    walk = walk.union_all(step) if repeat and max_depth is None else walk.union(step)
    rows = select(*[walk.c[c.key] for c in cols])
    return rows if max_depth is None else rows.distinct()


def _nearest_first(session: Session, start: str, kinds: Collection[str], max_depth: int | None,
                   *, down: bool) -> list[str]:
    """The commits reachable from ``start`` (itself excluded) in breadth-first order (see ``ancestor_ids``)."""
    rows = _walk_edges(session, start, kinds, max_depth, down=down)
    if not rows:
        return []
    srcs, dsts, *_ = zip(*rows, strict=True)
    # Most commits have one edge of the walk out of them: a plain mapping. Those with several
    # (merges going down, forks going up) get their edges' targets in order.
    single: dict[str, str] = dict(zip(srcs, dsts, strict=True))
    several: dict[str, list[str]] = {}
    if len(single) < len(rows):
        many = {src for src, n in Counter(srcs).items() if n > 1}
        ranked: dict[str, list[tuple[Any, str]]] = {src: [] for src in many}
        for row in rows:
            if row[0] in many:
                ranked[row[0]].append((row[2] if down else row[1], row[1]))
        several = {src: [dst for _, dst in sorted(edges)] for src, edges in ranked.items()}
    # Breadth-first: ``order`` is the queue, read while it grows; ``level_end`` is where the
    # commits one edge further away than the one being read start.
    order, seen = [start], {start}
    depth, level_end = 0, 1
    for i, node in enumerate(order):
        if i == level_end:
            depth, level_end = depth + 1, len(order)
            if depth == max_depth:
                break
        if node in several:
            for other in several[node]:
                if other not in seen:
                    seen.add(other)
                    order.append(other)
        else:
            only = single.get(node)
            if only is not None and only not in seen:
                seen.add(only)
                order.append(only)
    return order[1:]


def _walk_edges(session: Session, start: str, kinds: Collection[str], max_depth: int | None,
                *, down: bool) -> Sequence[Any]:
    """The rows of ``_edge_walk``, each edge at least once (maybe more: callers skip repeats).

    SQLite's UNION keeps every row in a B-tree of both 64-character ids, about a third of what
    a walk up to the children costs (PostgreSQL's hash table costs little). So on SQLite an
    unbounded walk up goes as a UNION ALL, capped at as many rows as the repository has
    edges: no walk without repeats has more. A walk that reaches the cap (merges on top of
    merges, where paths multiply) is abandoned for the UNION walk; at worst the cap's rows
    were read for nothing. Rows are the driver's tuples, fetched at once (``fetch_tuples``)."""
    conn = session.connection()
    if not down and max_depth is None and conn.dialect.name == "sqlite":
        cap = session.scalar(select(func.count()).select_from(Edge)) or 0
        rows = fetch_tuples(conn, _edge_walk(start, kinds, None, down=False, repeat=True).limit(cap + 1))
        if len(rows) <= cap:
            return rows
    return fetch_tuples(conn, _edge_walk(start, kinds, max_depth, down=down))


def _line_of_parents(session: Session, start: str, kinds: Collection[str], max_depth: int | None) -> list[str] | None:
    """The proper ancestors of ``start`` nearest first if they form a single line (no commit on
    the way has two parents through edges of ``kinds``: a training run, its forks, their forks),
    else None.

    A line cannot reach one commit twice, so this walk goes without UNION's check for rows seen
    before (about half of what each step costs SQLite). It stops after ``generation(start)``
    rows, more than a line of parents can have (every edge lowers the generation), so a walk
    that branches and multiplies paths stays cheap; branching shows as two rows of one depth.
    """
    limit = session.scalar(select(Commit.generation).where(Commit.id == start))
    if limit is None:
        return None
    line = (select(Edge.parent_id, literal(1).label("depth")).where(Edge.child_id == start, *_kind_filter(kinds))
            .cte("line", recursive=True))
    step = select(Edge.parent_id, line.c.depth + 1).join(line, Edge.child_id == line.c.parent_id).where(
        *_kind_filter(kinds))
    if max_depth is not None:
        step = step.where(line.c.depth < max_depth)
    line = line.union_all(step)
    rows = sorted(fetch_tuples(session.connection(), select(line.c.parent_id, line.c.depth).limit(limit)),
                  key=itemgetter(1))
    if len(rows) >= limit or (rows and rows[-1][1] != len(rows)):
        return None  # cut short by the limit, or branched (a depth seen twice)
    return [row[0] for row in rows]


def ancestor_ids(session: Session, start: str, kinds: Collection[str] = EDGE_KINDS,
                 max_depth: int | None = None) -> list[str]:
    """The proper ancestors of ``start`` (itself excluded), at most ``max_depth`` edges away, nearest
    first: breadth-first from ``start``, each commit's parents in position order (first parents
    first). One recursive query; the order is worked out in memory from the edges it returns.
    A linear commit's ancestors are its first-parent chain, read as such (``db.lines``); when
    the ancestors form one line of parents otherwise, a cheaper walk answers first."""
    if _is_linear(session, start):
        if "parent" not in kinds:
            return []  # a linear commit has parent edges only
        limit = None if max_depth is None else max_depth + 1
        rows = sorted(fetch_tuples(session.connection(), lines.chain_commits(start, limit, Commit.id)))
        return [cid for _, cid in rows[1:]]
    line = _line_of_parents(session, start, kinds, max_depth)
    return line if line is not None else _nearest_first(session, start, kinds, max_depth, down=True)


def _is_linear(session: Session, commit_id: str) -> bool:
    """Whether every ancestor of ``commit_id`` is on its first-parent chain (``Commit.linear``)."""
    return bool(session.scalar(select(Commit.linear).where(Commit.id == commit_id)))


def descendant_ids(session: Session, start: str, kinds: Collection[str] = EDGE_KINDS,
                   max_depth: int | None = None) -> list[str]:
    """The proper descendants of ``start`` (itself excluded), at most ``max_depth`` edges away,
    nearest first: breadth-first from ``start``, each commit's children by id.

    Without ``max_depth``, through ``parent`` edges among others, they are read by first-parent
    line (``_line_ranges``); otherwise (a walk that stops early, or one that may not follow a
    line) by walking edges."""
    if max_depth is None and "parent" in kinds:
        return _line_descendants(session, start, kinds)
    return _nearest_first(session, start, kinds, max_depth, down=False)


def _line_ranges(start: Any, kinds: Collection[str]) -> CTE:
    """CTE ``(line, lo)``: for each first-parent line that holds descendants of ``start`` (or
    ``start``), the lowest depth from which all of the line's commits are: ``start``'s place,
    then the place of each child reached through an edge of ``kinds`` leaving a line range
    (``Edge.fork_line_id``). One recursive step per line, not per commit; assumes ``parent``
    in ``kinds`` (a line's commits follow each other through parent edges)."""
    seed = select(Commit.line_id.label("line"), Commit.fp_depth.label("lo")).where(Commit.id == start)
    walk = seed.cte("line_walk", recursive=True)
    child = aliased(Commit, name="fork_child")
    step = (select(child.line_id, child.fp_depth)
            .select_from(walk)
            .join(Edge, and_(Edge.fork_line_id == walk.c.line, Edge.fork_depth >= walk.c.lo))
            .join(child, child.id == Edge.child_id)
            .where(*_kind_filter(kinds)))
    # UNION: a line reached again at a depth seen before adds nothing, so the walk ends.
    walk = walk.union(step)
    return select(walk.c.line, func.min(walk.c.lo).label("lo")).group_by(walk.c.line).cte("line_ranges")


@functools.cache
def _line_statements(kinds: tuple[str, ...]) -> tuple[Any, Any]:
    """The two queries of ``_line_descendants`` through edges of ``kinds``, built once (an alias
    of ``commits`` costs about a millisecond to build) and run with ``start`` bound: rows
    (line_id, fp_depth, id) of the commits in the line ranges, and (parent, child) of the
    edges forking off them."""
    ranges = _line_ranges(bindparam("start", type_=Id), kinds)
    placed = (select(Commit.line_id, Commit.fp_depth, Commit.id)
              .join(ranges, and_(Commit.line_id == ranges.c.line, Commit.fp_depth >= ranges.c.lo)))
    forks = (select(Edge.parent_id, Edge.child_id)
             .join(ranges, and_(Edge.fork_line_id == ranges.c.line, Edge.fork_depth >= ranges.c.lo))
             .where(*_kind_filter(kinds)))
    return placed, forks


def _line_descendants(session: Session, start: str, kinds: Collection[str]) -> list[str]:
    """``descendant_ids`` without a depth limit, ``parent`` among ``kinds``: the commits of the
    line ranges (``_line_ranges``), each one's child on its line, and the edges of ``kinds``
    forking off the ranges, in two queries; breadth-first order is worked out in memory."""
    conn = session.connection()
    in_lines, off_lines = _line_statements(tuple(sorted(kinds)))
    placed = fetch_tuples(conn, in_lines, {"start": start})
    if not placed:
        return []
    forks = fetch_tuples(conn, off_lines, {"start": start})
    # Along a line, a commit's child there is the commit one depth above it (rows mostly come
    # in that order already, which makes the sort cheap).
    placed.sort()
    along = {cid: up for (line, depth, cid), (line2, depth2, up) in pairwise(placed)
             if depth2 == depth + 1 and line == line2}
    off: dict[str, list[str]] = {}
    for parent, child in forks:
        off.setdefault(parent, []).append(child)
    order, seen = [start], {start}
    for node in order:
        more = off.get(node)
        if more is None:
            up = along.get(node)
            if up is not None and up not in seen:
                seen.add(up)
                order.append(up)
            continue
        up = along.get(node)
        for c in sorted([*more, up] if up is not None else more):
            if c not in seen:
                seen.add(c)
                order.append(c)
    return order[1:]


class _Bands:
    """The ancestors of some start commits, handed out band by band of generations, highest first.

    ``next()`` returns the commits of the next band (each after all of its children, ties by
    id) with ``parents`` (position order) and ``gen`` filled in for them and their parents;
    parents below the band join ``pending``. One recursive query per band; owned by one caller.
    """

    def __init__(self, session: Session, starts: Sequence[str], kinds: Collection[str]) -> None:
        self.session = session
        self.kinds = kinds
        rows = session.execute(select(Commit.id, Commit.generation, Commit.created_at)
                               .where(Commit.id.in_(list(starts))))
        self.gen: dict[str, int] = {}
        self.time: dict[str, datetime] = {}
        for cid, gen, created in rows:
            self.gen[cid], self.time[cid] = gen, created
        self.pending: set[str] = set(self.gen)
        self.parents: dict[str, list[str]] = {}
        self.size = FIRST_BAND

    def next(self) -> list[str]:
        floor = max(self.gen[p] for p in self.pending) - self.size + 1
        self.size *= 2
        seeds = sorted(p for p in self.pending if self.gen[p] >= floor)
        band: set[str] = set(seeds)
        edges: list[tuple[str, str, int]] = []
        for child, parent, position, gen, created in self.session.execute(self._query(seeds, floor)):
            edges.append((child, parent, position))
            self.gen[parent], self.time[parent] = gen, created
            band.add(child)
            if gen >= floor:
                band.add(parent)
        for child, parent, _ in sorted(edges, key=lambda e: (e[0], e[2])):
            self.parents.setdefault(child, []).append(parent)
        for node in band:
            self.parents.setdefault(node, [])
        self.pending -= band
        self.pending.update(p for n in band for p in self.parents[n] if self.gen[p] < floor)
        return sorted(band, key=lambda n: (-self.gen[n], n))

    def _query(self, seeds: list[str], floor: int) -> Select[Any]:
        """Edges (child, parent, position, parent generation, parent time) out of every commit
        reachable from ``seeds`` through commits of generation >= ``floor``."""
        pc = aliased(Commit)
        first = (select(Edge.child_id, Edge.parent_id, Edge.position, pc.generation.label("gen"), pc.created_at)
                 .join(pc, pc.id == Edge.parent_id).where(Edge.child_id.in_(seeds), *_kind_filter(self.kinds)))
        band = first.cte("band", recursive=True)
        nc = aliased(Commit)
        step = (select(Edge.child_id, Edge.parent_id, Edge.position, nc.generation, nc.created_at)
                .join(band, Edge.child_id == band.c.parent_id).join(nc, nc.id == Edge.parent_id)
                .where(band.c.gen >= floor, *_kind_filter(self.kinds)))
        band = band.union(step)
        return select(band.c.child_id, band.c.parent_id, band.c.position, band.c.gen, band.c.created_at)


def merge_bases(session: Session, a: str, b: str, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
    """The best common ancestors of ``a`` and ``b`` (git's merge bases), highest generation first.

    A commit counts as its own ancestor, so when ``a`` is an ancestor of ``b`` the answer is
    ``[a]``. Best: a common ancestor that is no ancestor of another common ancestor;
    criss-cross merges have several. ``[]`` when the two share no ancestor. Git's paint-down:
    commits are marked reachable from ``a``, from ``b``, or *stale* (below a common ancestor
    already found), in generation order; the search ends when only stale commits are left.
    """
    if a == b:
        return [a]
    bands = _Bands(session, [a, b], kinds)
    if len(bands.gen) < 2:
        return []
    flags = {a: _A, b: _B}
    found: list[str] = []
    while any(not flags[p] & _STALE for p in bands.pending):
        for node in bands.next():
            mark = flags.get(node, 0)
            if mark == _A | _B:
                found.append(node)
                mark |= _STALE
            for parent in bands.parents[node]:
                flags[parent] = flags.get(parent, 0) | mark
    return found


def shortest_path(session: Session, a: str, b: str, kinds: Collection[str] = EDGE_KINDS) -> list[str]:
    """A shortest chain of commits from ``a`` to ``b``, both included; ``[]`` when they share no ancestor.

    The chain goes down from ``a`` through parents to a common ancestor ``c`` and up through
    children to ``b``; ``c`` minimises dist(a, c) + dist(b, c), counted in edges. When one is
    an ancestor of the other, ``c`` is that one and the chain only goes down (or up), unless
    a shorter way round exists (a transfer edge can make one). Ties go to the ``c`` of the
    highest generation, then the smallest id; each half is the breadth-first one, parents
    in position order (first parents first). Distances are exact band by band (every child
    is seen before its parents); the search stops when no commit below the bands can be
    nearer to both ends.
    """
    if a == b:
        return [a]
    bands = _Bands(session, [a, b], kinds)
    if len(bands.gen) < 2:
        return []
    dist: tuple[dict[str, int], dict[str, int]] = ({a: 0}, {b: 0})
    best: tuple[int, int, str] | None = None  # (length, -generation, id) of the best turning commit
    while bands.pending:
        for node in bands.next():
            if node in dist[0] and node in dist[1]:
                key = (dist[0][node] + dist[1][node], -bands.gen[node], node)
                best = key if best is None or key < best else best
            for d in dist:
                if node in d:
                    for parent in bands.parents[node]:
                        d[parent] = min(d.get(parent, d[node] + 1), d[node] + 1)
        if best is not None:
            # Below the bands, a commit reachable from both ends is at least as far from each
            # as the nearest pending commit on that side.
            near = [min((d[p] for p in bands.pending if p in d), default=1 << 62) for d in dist]
            if best[0] <= near[0] + near[1]:
                break
    if best is None:
        return []
    return _bfs_chain(a, best[2], bands.parents) + _bfs_chain(b, best[2], bands.parents)[::-1][1:]


def _bfs_chain(start: str, end: str, parents: dict[str, list[str]]) -> list[str]:
    """The breadth-first chain [start, ..., end] down through ``parents`` (first parents first)."""
    pred: dict[str, str] = {}
    queue = deque([start])
    while queue and end not in pred:
        node = queue.popleft()
        for parent in parents.get(node, ()):
            if parent not in pred and parent != start:
                pred[parent] = node
                queue.append(parent)
    chain = [end]
    while chain[-1] != start:
        chain.append(pred[chain[-1]])
    return chain[::-1]


def log_commits(session: Session, start: str | None, limit: int | None, offset: int = 0,
                where: ColumnElement[bool] | None = None) -> list[Commit]:
    """Commits newest first (``created_at``, then generation, then id): ``start`` and its
    ancestors, or every commit when ``start`` is None; only those matching ``where`` (a filter
    on ``Commit``, see ``lineage.where``); ``offset`` skipped, at most ``limit``.

    With a ``limit``, the ancestors of ``start`` are walked band by band of generations only
    until the page is certain, like ``git log``: that takes a commit to be younger than its
    parents (clocks in step between the machines that committed). Where a clock ran ahead, a
    commit can show up later in the listing than its time says, as in git. A linear ``start``
    (``Commit.linear``) reads its first-parent chain instead: the nearest commits for a page,
    the whole chain sorted for a filtered page or a full listing.
    """
    if start is not None and _is_linear(session, start):
        # Every ancestor is on the first-parent chain: sort the chain itself, exactly. Along a
        # linear chain the generation grows with ``fp_depth``, which the chain's index holds.
        # Without a filter, a page is the nearest ``offset + limit`` commits of the chain (taking,
        # as the band walk below does, each commit to be younger than its parents), read with
        # their rows at once. With one, the page takes the ids first (PostgreSQL sorts them
        # from the index alone), then its rows.
        if where is None and limit is not None:
            page = lines.chain_commits(start, offset + limit, Commit).order_by(
                Commit.created_at.desc(), Commit.fp_depth.desc(), Commit.id).offset(offset).limit(limit)
            # Without the skeleton: a listing never shows it (loaded on access if asked for).
            return [c for _, c in session.execute(page.options(defer(Commit.skeleton)))]
        q = lines.chain_commits(start, None, Commit.id if limit is not None else Commit)
        if where is not None:
            q = q.where(where)
        q = q.order_by(Commit.created_at.desc(), Commit.fp_depth.desc(), Commit.id).offset(offset).limit(limit)
        if limit is None:
            return [c for _, c in session.execute(q)]
        ids = [cid for _, cid in session.execute(q)]
        return _commits_in_order(session, ids)
    if start is not None and limit is not None:
        ids = _log_page(session, start, offset + limit, where)[offset:]
        return _commits_in_order(session, ids)
    q = select(Commit)
    if start is not None:
        q = q.where(Commit.id.in_(ancestors_cte(start)))
    if where is not None:
        q = q.where(where)
    q = q.order_by(Commit.created_at.desc(), Commit.generation.desc(), Commit.id).offset(offset)
    if limit is not None:
        q = q.limit(limit)
    return list(session.scalars(q))


def _commits_in_order(session: Session, ids: list[str]) -> list[Commit]:
    """The commit rows of ``ids``, in that order (one query)."""
    rows = {c.id: c for c in session.scalars(select(Commit).where(Commit.id.in_(ids)))}
    return [rows[i] for i in ids]


def _log_page(session: Session, start: str, count: int, where: ColumnElement[bool] | None) -> list[str]:
    """The first ``count`` ids of ``start``'s log (see ``log_commits``), walking no further than needed."""
    bands = _Bands(session, [start], EDGE_KINDS)
    matched: list[str] = []
    while bands.pending:
        band = bands.next()
        if where is None:
            matched += band
        else:
            for i in range(0, len(band), _IN_BATCH):
                matched += session.scalars(select(Commit.id).where(Commit.id.in_(band[i : i + _IN_BATCH]), where))
        key = {c: (-bands.time[c].timestamp(), -bands.gen[c], c) for c in matched}
        matched.sort(key=key.__getitem__)
        del matched[count:]
        # Every commit not walked yet is an ancestor of a pending one, so no younger than it.
        if len(matched) == count and bands.pending and bands.time[matched[-1]] >= max(
            bands.time[p] for p in bands.pending
        ):
            break
    return matched
