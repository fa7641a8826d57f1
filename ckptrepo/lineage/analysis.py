"""Per-tensor analysis of commits: ``diff`` of two commits and ``history`` of one tensor.

Both answer from the database first. ``diff`` in its default (stat) mode and ``history``
read no tensor bytes: they compare tensors (identical tensors are one row), the chunks at
each position (a tensor's ``seq``-th chunk always covers the same byte range for a given
chunk size), both by their keys in the database (one key per id), and the statistics stored
at ingest; results name tensors by id. ``diff(exact=True)`` reads only the chunk pairs whose
ids differ, through the repository's verifying ``ChunkReader``: the difference over
identical chunks is zero, and their share of the norms is recovered from the stored L2
norms (``ckptrepo.lineage.exact``). Result types are in ``ckptrepo.types``.

Query budget: ``diff`` runs two queries whatever the number of tensors (and one to see whether
either commit is pruned, plus one for a pruned commit's tensors without chunk lists); ``history`` two: the
first-parent chain (one index range per line, ``ckptrepo.db.lines``) and the tensor's runs
along it (``entry_runs``: one key range per line, joined with tensors where it changes), plus
one query for close name matches when the tensor is nowhere on the chain.
Functions take a session factory (and for an exact diff a reader and a pool) and open their own
short read session; they never write.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import replace
from datetime import datetime, timezone
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Integer, Text, and_, bindparam, case, cast, func, select
from sqlalchemy.orm import Session, aliased

from ckptrepo import dtypes
from ckptrepo.chunks.chunker import chunk_step
from ckptrepo.db import catalog, integers, lines
from ckptrepo.db.engine import Sessions, fetch_tuples, serial_plans
from ckptrepo.db.models import Chunk, Commit, Entry, EntryRun, Id, Metric, Tensor, TensorChunk, utc_datetime
from ckptrepo.entries import file_path, is_file_entry
from ckptrepo.errors import CommitDamaged, UnknownTensor, UsageError, did_you_mean
from ckptrepo.ids import short
from ckptrepo.lineage import nearest, revparse
from ckptrepo.lineage.exact import ChunkPair, ExactRequest
from ckptrepo.locations import ChunkLocation
from ckptrepo.types import (
    STAT_FIELDS,
    Diff,
    ExactDelta,
    HistoryPoint,
    MetricPoint,
    TensorDelta,
    TensorInfo,
    TensorStats,
)

if TYPE_CHECKING:
    from ckptrepo.chunks.store import ChunkReader

__all__ = [
    "diff", "history", "metric_names", "metrics_along",
]

_TENSOR_FIELDS = ("id", "dtype", "shape", "nbytes", "chunk_size", "n_chunks", *STAT_FIELDS)
# ``ChunkLocation``'s fields in its order but the last, ``base_id`` (read from the base's row by ``base_key``).
_CHUNK_FIELDS = ("id", "pack_id", "offset", "length", "raw_length", "encoding", "depth")


# -- shared helpers ----------------------------------------------------------------------------


class _Side(NamedTuple):  # a tuple: history makes one per distinct tensor, thousands
    info: TensorInfo
    chunk_size: int


def _tensor_cols(entity: Any) -> list[Any]:
    # ``shape`` comes back as JSON text, cast so on PostgreSQL too (psycopg would parse a json
    # column into a new list per row): ``_side`` parses each distinct text once, which matters
    # when one tensor fills thousands of history rows (PostgreSQL history: 181 -> 164 ms).
    return [cast(entity.shape, Text) if f == "shape" else getattr(entity, f) for f in _TENSOR_FIELDS]


def _side(name: str, values: Sequence[Any], shapes: dict[Any, tuple[int, ...]] | None = None) -> _Side | None:
    """A tensor from ``_TENSOR_FIELDS`` column values (None for an outer join's missing row);
    ``shapes`` keeps the shapes parsed so far by their JSON text."""
    tid, dtype, shape, nbytes, chunk_size, n_chunks, *stats = values
    if tid is None:
        return None
    dims = shapes.get(shape) if shapes is not None and isinstance(shape, str | bytes) else None
    if dims is None:
        dims = tuple(int(d) for d in (json.loads(shape) if isinstance(shape, str | bytes) else shape))
        if shapes is not None and isinstance(shape, str | bytes):
            shapes[shape] = dims
    info = TensorInfo(name=name, tensor_id=tid, dtype=dtype, shape=dims, nbytes=nbytes,
                      n_chunks=n_chunks, stats=TensorStats(*stats))
    return _Side(info, chunk_size)


def _compare(a: _Side | None, b: _Side | None, differing: int) -> tuple[str, int, int]:
    """Status, chunks changed and chunk count of a -> b, given how many common positions hold
    different chunk ids (meaningful only for equal chunk sizes)."""
    if a is None and b is None:
        return "absent", 0, 0
    if a is None or b is None:
        n = (a or b).info.n_chunks  # type: ignore[union-attr]
        return ("added" if a is None else "removed"), n, n
    n_a, n_b = a.info.n_chunks, b.info.n_chunks
    if a.info.tensor_id == b.info.tensor_id:
        return "unchanged", 0, n_a
    n = max(n_a, n_b)
    return "changed", differing + abs(n_a - n_b) if a.chunk_size == b.chunk_size else n, n


def _check_limit(limit: int | None) -> None:
    if limit is not None:
        integers.count("limit (commits)", limit, minimum=1)


def _first_parent_chain(head: str, limit: int | None) -> Any:
    """Subquery (depth, id, step, created_at) of ``head`` and its first parents, depth 0 = head,
    at most ``limit`` rows."""
    return lines.chain_commits(head, limit, Commit.id, Commit.step, Commit.created_at).subquery("chain")


# -- diff --------------------------------------------------------------------------------------


def diff(reading: Sessions, a: str, b: str, *, exact: bool = False, reader: ChunkReader | None = None,
         pool: Executor | None = None) -> Diff:
    """Compare every tensor name of revisions ``a`` and ``b`` (see the module docstring).

    Unrelated commits compare fine: matching is by name. With ``exact``, changed tensors of
    equal shape and dtype also get an ``ExactDelta``, reading only the chunk pairs that differ
    (all chunks when the chunk sizes differ); tensors holding NaN/Inf, dtypes without numeric
    values, and shape or dtype changes get a ``note`` instead. UnknownRevision for a bad
    revision; IntegrityError when a chunk read fails its hash check. ``reading``: sessions
    whose snapshot holds no pending layout (``db.pending.reading``); ``reader`` and ``pool``
    read the chunks of an exact diff.

    A pruned commit compares by tensor ids and statistics, which it keeps; once gc dropped the
    chunk lists of its tensors, a changed tensor among them counts every chunk as changed (with
    a ``note`` saying so). An exact diff of a pruned commit raises CommitPruned; of a damaged
    one (``Commit.damage``, whose missing tensors have no chunk list either), CommitDamaged.
    """
    with reading() as s:
        a_id, b_id = revparse.resolve(s, a), revparse.resolve(s, b)
        marks = {cid: (bool(p), damage) for cid, p, damage in s.execute(
            select(Commit.id, Commit.pruned, Commit.damage).where(Commit.id.in_([a_id, b_id])))}
        pruned = [cid for cid in (a_id, b_id) if marks[cid][0]]
        if exact and pruned:
            nearest.refuse(s, pruned[0])
        damaged = [cid for cid in (a_id, b_id) if marks[cid][1] is not None]
        if exact and damaged:
            raise CommitDamaged(commit=short(damaged[0]), why=marks[damaged[0]][1])
        dropped = _dropped_tensors(s, sorted({*pruned, *damaged}))
        sides: dict[str, list[_Side | None]] = {}
        differing: dict[str, int] = {}
        shapes: dict[Any, tuple[int, ...]] = {}  # layers share shapes: each JSON text parsed once
        width = len(_TENSOR_FIELDS)
        conn = s.connection()
        serial_plans(conn)
        files: dict[str, str] = {}  # a commit's files are no tensors: only whether they changed
        for name, same, changed, *columns in fetch_tuples(conn, _diff_query(), {"a": a_id, "b": b_id}):
            if is_file_entry(name):
                if not same:
                    files[file_path(name)] = "added" if columns[0] is None else \
                        "removed" if columns[width] is None else "changed"
                continue
            sa = _side(name, columns[:width], shapes)
            # An unchanged tensor comes once, on a's side.
            sb = sa if sa is not None and same else _side(name, columns[width:], shapes)
            sides[name] = [sa, sb]
            if changed:
                differing[name] = changed
        pairs: dict[str, list[ChunkPair]] = {}
        if exact:
            _differing_chunks(s, a_id, b_id, pairs)
        requests = _exact_requests(s, (a_id, b_id), sides, pairs) if exact else []
    out: list[TensorDelta] = []
    for name in sorted(sides):
        sa, sb = sides[name]
        status, changed, n = _compare(sa, sb, differing.get(name, 0))
        note = None
        if status == "changed" and dropped and {x.info.tensor_id for x in (sa, sb) if x} & dropped:
            changed, note = n, "pruned data: its chunk list is gone, every chunk counted as changed"
        out.append(TensorDelta(name, status, sa.info if sa else None, sb.info if sb else None, changed, n,
                               note=note))
    if exact:
        from ckptrepo.lineage.exact import compare  # torch: only an exact diff reads tensors

        if reader is None or pool is None:
            raise UsageError("an exact diff needs a chunk reader and a worker pool")
        out = _with_exact(out, sides, compare(reader, pool, requests))
    return Diff(a_id, b_id, exact, tuple(out), files=dict(sorted(files.items())))


def _dropped_tensors(s: Session, commits: Sequence[str]) -> set[str]:
    """Ids of the tensors of ``commits`` whose chunk lists gc dropped (``catalog.drop_chunk_lists``)."""
    if not commits:
        return set()
    q = (select(Tensor.id).join(Entry, Entry.tensor_key == Tensor.key)
         .where(Entry.commit_id.in_(list(commits)), Tensor.lead_key < 0))
    return set(s.scalars(q))


@functools.cache
def _diff_query() -> Any:
    """Rows (name, same, differing, a's tensor columns, b's tensor columns) of every tensor name
    of commits ``:a`` and ``:b`` (bound at execution), one query, built once (to be fetched
    with ``fetch_tuples``): a tensor missing on a side has NULL columns there; ``same`` is true
    when b has a's tensor (their tensor keys are equal; NULL when a side lacks the name), and
    b's columns are then NULL too (one lookup per distinct tensor); ``differing`` counts the
    positions whose chunks differ when both sides have different tensors, else 0. Entries and
    chunk lists are joined by tensor and chunk keys (``tensors.key``, ``chunks.key``)."""
    a_id, b_id = bindparam("a", type_=Id), bindparam("b", type_=Id)
    # Grouped by name rather than a join of a's entries with b's: PostgreSQL estimates a group
    # per name, where it took the join for 17,800 rows (500 in fact) and chose to read all of
    # ``tensors`` in key order (a plan of 1 s instead of 12 ms).
    both = (select(Entry.name,
                   func.max(case((Entry.commit_id == a_id, Entry.tensor_key))).label("ta"),
                   func.max(case((Entry.commit_id == b_id, Entry.tensor_key))).label("tb"))
            .where(Entry.commit_id.in_([a_id, b_id]))
            .group_by(Entry.name)
            .subquery("both_sides"))
    tc1, tc2 = aliased(TensorChunk), aliased(TensorChunk)
    differing = (
        select(func.count())
        .select_from(tc1)
        .join(tc2, and_(tc2.tensor_key == both.c.tb, tc2.seq == tc1.seq))
        .where(tc1.tensor_key == both.c.ta, tc1.chunk_key != tc2.chunk_key)
        .correlate(both)
        .scalar_subquery()
    )
    ta, tb = aliased(Tensor, name="ta_row"), aliased(Tensor, name="tb_row")
    return (
        select(both.c.name, (both.c.ta == both.c.tb).label("same"),
               case((both.c.ta != both.c.tb, differing), else_=0), *_tensor_cols(ta), *_tensor_cols(tb))
        .select_from(both)
        .outerjoin(ta, ta.key == both.c.ta)
        .outerjoin(tb, tb.key == case((both.c.tb.is_distinct_from(both.c.ta), both.c.tb)))
    )


def _differing_chunks(
    s: Session, a_id: str, b_id: str, pairs: dict[str, list[ChunkPair]] | None
) -> dict[str, int]:
    """Per name in both commits with different tensors: positions whose chunks differ (joined
    by tensor and chunk keys). With ``pairs``, also collect those chunk rows (a's, b's) in
    position order, each with its delta base's id."""
    ea, eb, ca, cb = aliased(Entry), aliased(Entry), aliased(TensorChunk), aliased(TensorChunk)
    joined = (
        select(ea.name).select_from(ea)
        .join(eb, and_(eb.commit_id == b_id, eb.name == ea.name))
        .join(ca, ca.tensor_key == ea.tensor_key)
        .join(cb, and_(cb.tensor_key == eb.tensor_key, cb.seq == ca.seq))
        .where(ea.commit_id == a_id, ea.tensor_key != eb.tensor_key, ca.chunk_key != cb.chunk_key)
    )
    if pairs is None:
        return {name: int(n) for name, n in s.execute(joined.add_columns(func.count()).group_by(ea.name))}
    ka, kb, base_a, base_b = aliased(Chunk), aliased(Chunk), aliased(Chunk), aliased(Chunk)
    q = (joined.add_columns(*[getattr(ka, f) for f in _CHUNK_FIELDS], base_a.id,
                            *[getattr(kb, f) for f in _CHUNK_FIELDS], base_b.id)
         .join(ka, ka.key == ca.chunk_key).join(kb, kb.key == cb.chunk_key)
         .outerjoin(base_a, base_a.key == ka.base_key).outerjoin(base_b, base_b.key == kb.base_key)
         .order_by(ea.name, ca.seq))
    counts: dict[str, int] = {}
    width = len(_CHUNK_FIELDS) + 1
    for row in s.execute(q):
        pair = (ChunkLocation(*row[1 : 1 + width]), ChunkLocation(*row[1 + width :]))
        pairs.setdefault(row[0], []).append(pair)
        counts[row[0]] = counts.get(row[0], 0) + 1
    return counts


def _comparable(sa: _Side | None, sb: _Side | None) -> str | None:
    """Why an exact comparison of a -> b is impossible (None when it is possible)."""
    if sa is None or sb is None or sa.info.tensor_id == sb.info.tensor_id:
        return None
    if sa.info.dtype != sb.info.dtype:
        return f"dtype changed ({sa.info.dtype} -> {sb.info.dtype})"
    if sa.info.shape != sb.info.shape:
        return "shape changed"
    if sa.info.stats.l2_norm is None or sb.info.stats.l2_norm is None:
        return f"dtype {sa.info.dtype} has no numeric statistics"
    nonfinite = sum(x.info.stats.nan_count + x.info.stats.inf_count for x in (sa, sb))
    if nonfinite:
        return f"{nonfinite} NaN/Inf values"
    return None


def _exact_requests(
    s: Session, commits: tuple[str, str], sides: dict[str, list[_Side | None]], pairs: dict[str, list[ChunkPair]]
) -> list[ExactRequest]:
    """What an exact diff of ``commits`` (a, b) reads: the differing chunk pairs of each comparable
    changed tensor, or, when the chunk sizes differ, both tensors whole (their chunk rows are
    looked up here, through the commits' entries)."""
    requests: list[ExactRequest] = []
    whole: list[tuple[str, _Side, _Side]] = []
    changed = {name: (sa, sb) for name, (sa, sb) in sorted(sides.items())
               if sa is not None and sb is not None and sa.info.tensor_id != sb.info.tensor_id
               and _comparable(sa, sb) is None}
    boxed = set(s.scalars(select(Tensor.id).where(Tensor.id.in_({x.info.tensor_id for pair in changed.values()
                                                                    for x in pair}), Tensor.boxes.is_not(None))))
    for name, (sa, sb) in changed.items():
        # Chunk pairs by position hold the same elements only on the tensors' plain grid (not a
        # distributed commit's edge pieces or boxes): else both are read whole.
        if sa.chunk_size != sb.chunk_size or not (_on_grid(sa, boxed) and _on_grid(sb, boxed)):
            whole.append((name, sa, sb))
            continue
        found = pairs.get(name, [])
        requests.append(ExactRequest(name, sa.info.dtype, sa.info.stats.l2_norm or 0.0,
                                     sb.info.stats.l2_norm or 0.0, found, len(found) < sa.info.n_chunks))
    if whole:
        names = [name for name, _, _ in whole]
        items_a, items_b = (catalog.tensors_of(s, cid, names) for cid in commits)
        for name, sa, sb in whole:
            requests.append(ExactRequest(name, sa.info.dtype, sa.info.stats.l2_norm or 0.0,
                                         sb.info.stats.l2_norm or 0.0, whole=(items_a[name], items_b[name])))
    return requests


def _on_grid(side: _Side, boxed: set[str]) -> bool:
    """Whether a tensor's chunks lie on its plain grid: chunk ``i`` at byte ``i * step``."""
    if side.info.tensor_id in boxed:
        return False
    step = chunk_step(dtypes.dtype(side.info.dtype).itemsize, side.chunk_size)
    return side.info.n_chunks == max(1, -(-side.info.nbytes // step))


def _with_exact(deltas: list[TensorDelta], sides: dict[str, list[_Side | None]],
                exact: dict[str, ExactDelta]) -> list[TensorDelta]:
    """``deltas`` with ``exact`` (computed, or identity for unchanged tensors) or ``note`` set."""
    out: list[TensorDelta] = []
    for d in deltas:
        if d.status == "unchanged":
            out.append(replace(d, exact=ExactDelta.identical(d.a.stats.l2_norm if d.a else None)))
        elif d.name in exact:
            out.append(replace(d, exact=exact[d.name]))
        elif d.status == "changed":
            out.append(replace(d, note=_comparable(*sides[d.name])))
        else:
            out.append(d)
    return out


# -- history -----------------------------------------------------------------------------------


def history(reading: Sessions, name: str, *, along: str = "main", limit: int | None = None) -> list[HistoryPoint]:
    """Tensor ``name`` in each commit of ``along``'s first-parent chain, newest first (the head
    of ``along`` first, like ``log``), each compared with its first parent; at most ``limit``
    commits. Reads no tensor bytes. UnknownRevision for a bad revision; UnknownTensor (with
    close matches from the head commit) when no commit of the chain has the tensor.
    """
    _check_limit(limit)
    if is_file_entry(name):  # a commit's file is stored as an entry, but it has no tensor history
        raise UsageError(f"{name!r} names a file a commit keeps, not a tensor",
                         hint="Read it with `Repo.read_file(REV, PATH)`; `ckpt diff A B` lists changed files.")
    # One commit further than is shown: the last one shown is compared with its first parent.
    walked = None if limit is None else limit + 1
    with reading() as s:
        head = revparse.resolve(s, along)
        # The driver's tuples, not ORM or Core rows: one per commit of the chain, 10,000 for a long
        # run. Sorted head first here: the queries promise no order, and rows mostly come in order.
        conn = s.connection()
        chain, along_chain = _history_statements(walked is not None)
        params: dict[str, Any] = {"head": head} if walked is None else {"head": head, "walked": walked}
        rows = sorted(fetch_tuples(conn, chain, params), key=itemgetter(0))
        runs = sorted(fetch_tuples(conn, along_chain, {**params, "name": name}), key=itemgetter(0))
        tensors, differing = _history_tensors(name, rows, runs)
        if not any(tensors[:limit]):
            names = [n for n in s.scalars(select(Entry.name).where(Entry.commit_id == head)) if not is_file_entry(n)]
            which = f"None of the last {limit} commits" if limit is not None and len(rows) > limit else "No commit"
            raise UnknownTensor(
                f"{which} on the first-parent chain of {along!r} has a tensor named {name!r}.",
                hint=did_you_mean("tensor", name, names, f"`ckpt show {along}`"),
                commit=short(head), name=name,
            )
    shown = rows[:limit]
    times = _utc_datetimes([row[3] for row in shown])
    tensors.append(None)  # the first parent of the chain's root: nothing
    point = HistoryPoint._fast
    points: list[HistoryPoint] = []
    for i, row in enumerate(shown):
        this, prev = tensors[i], tensors[i + 1]
        pruned = bool(row[5])
        if this is prev:  # the same tensor as its first parent's (or absent from both)
            if this is None:
                points.append(point(row[1], row[2], times[i], row[0], "absent", None, None, 0, 0, pruned))
            else:
                info = this.info
                points.append(point(row[1], row[2], times[i], row[0], "unchanged", info, info, 0, info.n_chunks,
                                    pruned))
            continue
        status, changed, n = _compare(prev, this, differing.get(i, 0))
        points.append(point(row[1], row[2], times[i], row[0], status, this.info if this else None,
                            prev.info if prev else None, changed, n, pruned))
    return points


def _utc_datetimes(values: list[Any]) -> list[datetime]:
    """``models.utc_datetime`` of each value, a column of one query: SQLite's texts parsed in one
    pass (``fromisoformat`` of the text with its UTC offset appended), psycopg's UTC datetimes
    kept as they are."""
    if values and all(type(v) is str for v in values):
        try:
            parse = datetime.fromisoformat
            return [parse(v + "+00:00") for v in values]
        except ValueError:
            pass
    if all(type(v) is datetime and v.tzinfo is timezone.utc for v in values):
        return values
    return [utc_datetime(v) for v in values]


def _history_tensors(name: str, rows: Sequence[Any], runs: Sequence[Any]) -> tuple[list[_Side | None], dict[int, int]]:
    """The tensor of each row of the chain query (head first), from the rows of the runs query
    (head first; ``_history_statements``), and for each depth where a run begins with a tensor
    other than its first parent's, how many chunk positions differ between the two.

    A run covers its depth and the depths above it (nearer the head) up to the next run; a
    line's first commit (``starts``) begins afresh: without a run there, the tensor is absent.
    Equal tensor ids give the one ``_Side`` object (``history`` compares them by identity).
    """
    sides: dict[str, _Side] = {}
    shapes: dict[Any, tuple[int, ...]] = {}  # usually one shape for thousands of tensors
    at: dict[int, _Side | None] = {}
    differing: dict[int, int] = {}
    side: _Side | None = None
    deepest = len(rows) - 1
    for depth, tid, changed, *columns in reversed(runs):  # oldest first
        if tid is None:
            side = None
        else:
            known = sides.get(tid)
            if known is None:
                known = _side(name, [tid, *columns], shapes)
                assert known is not None  # a tensor id: a tensor
                sides[tid] = known
            side = known
        if depth > deepest:  # the run in effect at the deepest commit walked, begun below it
            at[deepest] = side
        else:
            at[depth] = side
            if changed:
                differing[depth] = changed
    out: list[_Side | None] = []
    side = None
    for depth in range(deepest, -1, -1):
        if depth in at:
            side = at[depth]
        elif rows[depth][4]:
            side = None
        out.append(side)
    out.reverse()
    return out, differing


@functools.cache
def _history_statements(limited: bool) -> tuple[Any, Any]:
    """The two queries of ``history``, built once (with or without a limit) and run with bound
    ``head``, ``name`` and (``limited``) ``walked``; fetched with ``fetch_tuples``.

    The chain: rows (depth, id, step, created_at, starts, pruned) of ``head``'s first-parent
    chain, at most ``walked`` commits, depth 0 = head, in no particular order; ``starts``: the
    commit is the first of its line. One index range per line (``lines``; on PostgreSQL the index
    covers all but ``pruned``, read from the rows); ``utc_datetime`` reads ``created_at``.

    The runs: rows (depth, tid, changed_chunks, tensor columns but the id...) of the runs of
    tensor ``name`` along that chain (``EntryRun``), in no particular order: one key range of
    ``entry_runs`` per line of the chain, from the line's first commit (or, when ``walked``
    cuts the chain inside a line, from the run in effect at the deepest commit walked) up to
    the chain's last commit on it. ``depth``: the chain depth of the run's first commit;
    ``tid`` the id of its tensor (NULL: absent), from the ``tensors`` row of the run's
    ``tensor_key``.
    """
    head, name = bindparam("head", type_=Id), bindparam("name", type_=Text)
    walked = bindparam("walked", type_=Integer) if limited else None
    chain = lines.chain_commits(head, walked, Commit.id, Commit.step, Commit.created_at,
                                (Commit.id == Commit.line_id).label("starts"), Commit.pruned)
    hops = lines.line_hops(head, walked)
    run = aliased(EntryRun, name="run")
    cond = [run.name == name, run.line_id == hops.c.line, run.fp_depth <= hops.c.upto]
    if walked is not None:
        lowest = hops.c.top - walked + 1
        older = aliased(EntryRun, name="older_run")
        begun = (select(func.max(older.fp_depth))
                 .where(older.name == name, older.line_id == hops.c.line, older.fp_depth <= lowest)
                 .correlate(hops).scalar_subquery())
        cond.append(run.fp_depth >= func.coalesce(begun, lowest))
    runs = (select((hops.c.top - run.fp_depth).label("depth"), Tensor.id, run.changed_chunks,
                   *_tensor_cols(Tensor)[1:])
            .select_from(hops).join(run, and_(*cond)).outerjoin(Tensor, Tensor.key == run.tensor_key))
    return chain, runs


# -- metrics -----------------------------------------------------------------------------------


def metrics_along(
    sessions: Sessions, names: Sequence[str], *, along: str = "main", limit: int | None = None
) -> list[MetricPoint]:
    """The metrics ``names`` along ``along``'s first-parent chain, newest first, at most ``limit``
    commits; every commit of the chain is listed, with the requested metrics it records (maybe none)."""
    _check_limit(limit)
    with sessions() as s:
        chain = _first_parent_chain(revparse.resolve(s, along), limit)
        q = (
            select(chain.c.depth, chain.c.id, chain.c.step, chain.c.created_at, Metric.name, Metric.value,
                   Metric.annotated)
            .select_from(chain)
            .outerjoin(Metric, and_(Metric.commit_id == chain.c.id, Metric.name.in_(list(names))))
            .order_by(chain.c.depth)
        )
        points: list[MetricPoint] = []
        marked: list[set[str]] = []
        for depth, cid, step, created, metric, value, annotated in s.execute(q):
            if not points or points[-1].depth != depth:
                points.append(MetricPoint(cid, step, created, depth, {}))
                marked.append(set())
            if metric is not None:
                points[-1].values[metric] = value
                if annotated:
                    marked[-1].add(metric)
    return [replace(p, annotated=frozenset(m)) if m else p for p, m in zip(points, marked, strict=True)]


def metric_names(sessions: Sessions) -> list[str]:
    """Every metric name any commit records, sorted."""
    with sessions() as s:
        return list(s.scalars(select(Metric.name).distinct().order_by(Metric.name)))
