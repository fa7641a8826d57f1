"""Row-level reads and writes of the catalog: chunk index, tensors, commits, refs.

Functions take a ``Session`` owned by the caller, who also owns the transaction:
``record_commit`` must run inside the single write transaction that makes a commit
visible (after its packs are durable). Only plain values cross this boundary, so the
chunk layer and the database layer never import each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import BindParameter, Table, bindparam, func, select, update
from sqlalchemy.orm import Session

from ckptrepo.db import lines
from ckptrepo.db.engine import fetch_tuples, insert_tuples, present_values
from ckptrepo.db.models import Chunk, Commit, Edge, Entry, EntryRun, Metric, Pack, Ref, Tensor, TensorChunk

_IN_BATCH = 500


class ChunkRow(NamedTuple):
    """A ``chunks`` row, its fields in the order of ``CHUNK_COLUMNS`` (inserted as it is)."""

    chunk_id: str
    pack_id: str
    offset: int
    length: int
    raw_length: int
    encoding: int
    depth: int = 0
    base_id: str | None = None
    alone_length: int | None = None


class PackRow(NamedTuple):
    """A ``packs`` row but its creation time; ``deferred``: its chunks are left for ``repack``."""

    pack_id: str
    size: int
    n_chunks: int
    deferred: bool = False


CHUNK_COLUMNS = ("id", "pack_id", "offset", "length", "raw_length", "encoding", "depth", "base_id", "alone_length")
# ``TensorRow.stats`` holds exactly these (``ingest.stats.combine``).
STAT_COLUMNS = ("numel", "mean", "std", "min", "max", "l2_norm", "abs_max", "nan_count", "inf_count")
_TENSOR_COLUMNS = ("id", "dtype", "shape", "nbytes", "chunk_size", "n_chunks", *STAT_COLUMNS)
_RUN_COLUMNS = ("name", "line_id", "fp_depth", "tensor_id", "changed_chunks")
_EDGE_COLUMNS = ("child_id", "parent_id", "kind", "position", "mapping", "fork_line_id", "fork_depth")


@dataclass(frozen=True)
class TensorRow:
    tensor_id: str
    dtype: str
    shape: list[int]
    nbytes: int
    chunk_size: int
    chunk_ids: list[str]
    stats: dict[str, Any]


@dataclass(frozen=True)
class EdgeRow:
    parent_id: str
    kind: str
    position: int
    mapping: dict[str, str] | None = None


# Built once, run with the ids bound (an expanding IN): building a statement whose IN list
# holds fifty ids cost more than running it. Plain rows, not ORM objects.
_IDS: BindParameter[Any] = bindparam("ids", expanding=True)
_CHUNKS = cast(Table, Chunk.__table__).c
_TENSOR_CHUNKS = cast(Table, TensorChunk.__table__).c
_ENTRIES = cast(Table, Entry.__table__).c
_COMMITS = cast(Table, Commit.__table__).c
_CHUNK_LISTS_OF_COMMITS = (
    select(_TENSOR_CHUNKS.tensor_id, _TENSOR_CHUNKS.seq, _TENSOR_CHUNKS.chunk_id)
    .where(_TENSOR_CHUNKS.tensor_id.in_(select(_ENTRIES.tensor_id).where(_ENTRIES.commit_id.in_(_IDS))))
)
_ENTRIES_OF = select(_ENTRIES.name, _ENTRIES.tensor_id).where(_ENTRIES.commit_id == bindparam("commit_id"))
_PLACES_OF = select(_COMMITS.id, _COMMITS.line_id, _COMMITS.fp_depth, _COMMITS.generation).where(
    _COMMITS.id.in_(_IDS))


def existing_chunks(session: Session, ids: Sequence[str]) -> set[str]:
    """The subset of ``ids`` already in the chunk index."""
    return present_values(session.connection(), _CHUNKS.id, ids)


def chunks_by_id(session: Session, ids: Sequence[str]) -> dict[str, Chunk]:
    """The chunk-index rows of those ``ids`` that exist, by id."""
    found: dict[str, Chunk] = {}
    for start in range(0, len(ids), _IN_BATCH):
        batch = ids[start : start + _IN_BATCH]
        found.update((c.id, c) for c in session.scalars(select(Chunk).where(Chunk.id.in_(batch))))
    return found


class CommitLayout(NamedTuple):
    """A stored commit's entries (name -> tensor id) and its tensors' ordered chunk ids (by tensor
    id): never changed once committed, so whoever has them need not read them again."""

    commit_id: str
    entries: dict[str, str]
    chunk_lists: dict[str, list[str]]


def commit_layout(session: Session, commit_id: str) -> CommitLayout:
    """The layout of a stored commit (empty for an id that names none)."""
    entries = dict(fetch_tuples(session.connection(), _ENTRIES_OF, {"commit_id": commit_id}))
    return CommitLayout(commit_id, entries, chunk_lists_of(session, [commit_id]))


def chunk_lists_of(session: Session, commit_ids: Sequence[str]) -> dict[str, list[str]]:
    """The ordered chunk ids of every tensor of the given commits, by tensor id."""
    if not commit_ids:
        return {}
    by_seq: dict[str, dict[int, str]] = {}
    for tid, seq, cid in fetch_tuples(session.connection(), _CHUNK_LISTS_OF_COMMITS, {"ids": list(commit_ids)}):
        by_seq.setdefault(tid, {})[seq] = cid
    return {tid: [chunks[i] for i in sorted(chunks)] for tid, chunks in by_seq.items()}


def record_commit(
    session: Session,
    *,
    packs: Iterable[PackRow],
    chunks: Iterable[ChunkRow],
    tensors: Iterable[TensorRow],
    commit: dict[str, Any],
    entries: dict[str, str],
    edges: Iterable[EdgeRow],
    metrics: dict[str, float],
    now: datetime,
    parent: CommitLayout | None,
) -> None:
    """Insert everything one commit adds. Rows another commit inserted concurrently
    (same pack, chunk, tensor) are kept as they are: content ids make them equal.
    The commit's ``first_parent_id`` is taken from ``edges`` (its ``parent`` edge at
    position 0), its ``generation`` from its parents' (1 + the highest, 1 for a root) and its
    first-parent line from ``lines.place``, whatever ``commit`` says; the rows kept by line
    (``edges.fork_line_id``, ``entry_runs``) are derived here too, with ``parent``: the first
    parent's layout (``commit_layout``, or kept from recording it; None for a root), which
    the caller has read before ingest (ValueError when it is not that commit's).
    Rows are inserted through the driver (``engine.insert_tuples``), packs, chunks, tensors
    and their chunk lists in key order: two transactions inserting overlapping keys then lock
    them in the same order and cannot deadlock (PostgreSQL); base chunks sort before their deltas.
    """
    conn = session.connection()
    cid = commit["id"]
    edge_list = list(edges)
    first = next((e.parent_id for e in edge_list if e.kind == "parent" and e.position == 0), None)
    if (parent.commit_id if parent is not None else None) != first:
        raise ValueError(f"the layout given is not that of the first parent {first}")
    insert_tuples(conn, Pack, ("id", "size", "n_chunks", "deferred", "created_at"),
                  [(*p, now) for p in sorted(packs, key=lambda p: p.pack_id)], ignore=True)
    chunk_rows = sorted(chunks, key=lambda c: (c.depth, c.chunk_id))
    insert_tuples(conn, Chunk, CHUNK_COLUMNS, chunk_rows, ignore=True)
    tensor_list = sorted({t.tensor_id: t for t in tensors}.values(), key=lambda t: t.tensor_id)
    insert_tuples(conn, Tensor, _TENSOR_COLUMNS, [
        (t.tensor_id, t.dtype, t.shape, t.nbytes, t.chunk_size, len(t.chunk_ids), *[t.stats[k] for k in STAT_COLUMNS])
        for t in tensor_list
    ], ignore=True)
    insert_tuples(conn, TensorChunk, ("tensor_id", "seq", "chunk_id"), [
        (t.tensor_id, i, chunk_id) for t in tensor_list for i, chunk_id in enumerate(t.chunk_ids)
    ], ignore=True)
    extra = any(lines.extra_parent(e.kind, e.position) for e in edge_list)
    spot = lines.place(session, cid, first, extra)
    line, depth = spot.line_id, spot.fp_depth
    parents = {pid: (pline, pdepth, generation) for pid, pline, pdepth, generation in fetch_tuples(
        conn, _PLACES_OF, {"ids": [e.parent_id for e in edge_list]})} if edge_list else {}
    row = {**commit, "first_parent_id": first, **spot._asdict(),
           "generation": 1 + max((p[2] for p in parents.values()), default=0)}
    insert_tuples(conn, Commit, tuple(row), [tuple(row.values())])
    insert_tuples(conn, Entry, ("commit_id", "name", "tensor_id"),
                  [(cid, n, tid) for n, tid in entries.items()], ignore=True)
    # Where this commit's tensors change along its line: against its first parent's entries
    # when it continues that parent's line, all of them when it starts a line; with how many
    # chunk positions differ from the first parent's tensor of the same name.
    before = parent.entries if parent is not None else {}
    runs = lines.runs_of(line, depth, entries, before if first is not None and line != cid else None)
    pairs = {(r["tensor_id"], before[r["name"]]) for r in runs
             if r["tensor_id"] is not None and before.get(r["name"]) not in (None, r["tensor_id"])}
    counts = changed_chunks(pairs, {**(parent.chunk_lists if parent is not None else {}),
                                    **{t.tensor_id: t.chunk_ids for t in tensor_list}})
    insert_tuples(conn, EntryRun, _RUN_COLUMNS, [
        (r["name"], line, depth, r["tensor_id"], counts.get((r["tensor_id"], before.get(r["name"], "")), 0))
        for r in runs])
    edge_rows = []
    for e in edge_list:
        # A parent that does not exist is refused by the foreign key.
        up = parents.get(e.parent_id)
        fork = lines.fork_of(e.kind, e.position, (line, depth), up[:2] if up else ("", -1))
        edge_rows.append((cid, e.parent_id, e.kind, e.position, e.mapping, *(fork or (None, None))))
    insert_tuples(conn, Edge, _EDGE_COLUMNS, edge_rows)
    insert_tuples(conn, Metric, ("commit_id", "name", "value"), [(cid, n, v) for n, v in metrics.items()])


def changed_chunks(pairs: Iterable[tuple[str, str]],
                   chunk_lists: Mapping[str, Sequence[str]]) -> dict[tuple[str, str], int]:
    """For each pair of tensor ids ``(a, b)``: how many chunk positions both have hold different
    chunk ids, given the tensors' ordered chunk ids (a tensor missing there counts as none)."""
    return {(a, b): sum(1 for x, y in zip(chunk_lists.get(a, ()), chunk_lists.get(b, ()), strict=False) if x != y)
            for a, b in pairs}


_REFS = cast(Table, Ref.__table__)
_BRANCH_AT = select(_REFS.c.commit_id).where(_REFS.c.kind == "branch", _REFS.c.name == bindparam("ref_name"))
_MOVE_BRANCH = (update(_REFS)
                .where(_REFS.c.kind == "branch", _REFS.c.name == bindparam("ref_name"),
                       _REFS.c.commit_id == bindparam("expected"))
                .values(commit_id=bindparam("new_id"), updated_at=bindparam("now")))


def branch_head(session: Session, name: str) -> str | None:
    """The commit id branch ``name`` points at, or None when there is no such branch."""
    return session.connection().execute(_BRANCH_AT, {"ref_name": name}).scalar()


def move_branch(session: Session, name: str, new_id: str, expected: str | None, now: datetime) -> str | None:
    """Compare-and-swap a branch: point ``name`` at ``new_id`` if it is at ``expected``
    (``None``: the branch must not exist). Returns None on success, else where it is
    (``""``: the branch is gone)."""
    conn = session.connection()
    if expected is None:
        current = branch_head(session, name)
        if current is not None:
            return current
        # Insert-or-ignore, then read back: a concurrent creator of the same branch wins cleanly.
        insert_tuples(conn, Ref, ("kind", "name", "commit_id", "updated_at"), [("branch", name, new_id, now)],
                      ignore=True)
        current = branch_head(session, name)
        assert current is not None
        return None if current == new_id else current
    moved = conn.execute(_MOVE_BRANCH, {"ref_name": name, "expected": expected, "new_id": new_id, "now": now})
    if moved.rowcount == 1:
        return None
    return branch_head(session, name) or ""


def parents_of(session: Session, commit_id: str) -> list[Edge]:
    """Edges from ``commit_id`` to its parents, first parent first."""
    return list(session.scalars(select(Edge).where(Edge.child_id == commit_id).order_by(Edge.position)))


_REFS_AT = select(Ref.commit_id, Ref.kind, Ref.name).where(Ref.commit_id.in_(_IDS)).order_by(Ref.kind, Ref.name)
_METRICS_OF = select(Metric.commit_id, Metric.name, Metric.value).where(Metric.commit_id.in_(_IDS))
_EDGES_OF = (select(Edge.child_id, Edge.parent_id, Edge.kind, Edge.mapping)
             .where(Edge.child_id.in_(_IDS)).order_by(Edge.position))


class ParentEdge(NamedTuple):
    """An edge to a parent, as ``edges_of`` reads it."""

    parent_id: str
    kind: str
    mapping: dict[str, str] | None


def refs_at(session: Session, commit_ids: Sequence[str]) -> dict[str, list[str]]:
    """Ref names per commit id (branches plain, tags as ``tag:NAME``)."""
    out: dict[str, list[str]] = {}
    for start in range(0, len(commit_ids), _IN_BATCH):
        batch = list(commit_ids[start : start + _IN_BATCH])
        for cid, kind, name in session.execute(_REFS_AT, {"ids": batch}):
            out.setdefault(cid, []).append(name if kind == "branch" else f"tag:{name}")
    return out


def metrics_of(session: Session, commit_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """Metrics per commit id."""
    out: dict[str, dict[str, float]] = {}
    for start in range(0, len(commit_ids), _IN_BATCH):
        batch = list(commit_ids[start : start + _IN_BATCH])
        for cid, name, value in session.execute(_METRICS_OF, {"ids": batch}):
            out.setdefault(cid, {})[name] = value
    return out


def edges_of(session: Session, commit_ids: Sequence[str]) -> dict[str, list[ParentEdge]]:
    """Parent edges per commit id, first parent first."""
    out: dict[str, list[ParentEdge]] = {}
    for start in range(0, len(commit_ids), _IN_BATCH):
        batch = list(commit_ids[start : start + _IN_BATCH])
        for child, parent, kind, mapping in session.execute(_EDGES_OF, {"ids": batch}):
            out.setdefault(child, []).append(ParentEdge(parent, kind, mapping))
    return out


def tensor_layout(
    session: Session, commit_id: str, names: Sequence[str] | None = None
) -> list[tuple[Entry, Tensor]]:
    """The entries of a commit (all, or those named) with their tensor rows, by name."""
    q = select(Entry, Tensor).join(Tensor, Tensor.id == Entry.tensor_id).where(Entry.commit_id == commit_id)
    if names is not None:
        q = q.where(Entry.name.in_(list(names)))
    return [(row[0], row[1]) for row in session.execute(q.order_by(Entry.name))]


def chunk_locations(session: Session, tensor_ids: Sequence[str]) -> dict[str, list[Chunk]]:
    """Ordered chunk rows per tensor id."""
    out: dict[str, list[Chunk]] = {tid: [] for tid in tensor_ids}
    for start in range(0, len(tensor_ids), _IN_BATCH):
        batch = tensor_ids[start : start + _IN_BATCH]
        q = (
            select(TensorChunk.tensor_id, Chunk)
            .join(Chunk, Chunk.id == TensorChunk.chunk_id)
            .where(TensorChunk.tensor_id.in_(batch))
            .order_by(TensorChunk.tensor_id, TensorChunk.seq)
        )
        for row in session.execute(q):
            out[row[0]].append(row[1])
    return out


def totals(session: Session) -> dict[str, int]:
    """Counts and byte sums for ``Repo.stats``."""
    def scalar(q: Any) -> int:
        return int(session.scalar(q) or 0)

    return {
        "commits": scalar(select(func.count()).select_from(Commit)),
        "branches": scalar(select(func.count()).select_from(Ref).where(Ref.kind == "branch")),
        "tags": scalar(select(func.count()).select_from(Ref).where(Ref.kind == "tag")),
        "tensors": scalar(select(func.count()).select_from(Tensor)),
        "chunks": scalar(select(func.count()).select_from(Chunk)),
        "packs": scalar(select(func.count()).select_from(Pack)),
        "logical_bytes": scalar(select(func.sum(Commit.logical_bytes))),
        "unique_bytes": scalar(select(func.sum(Chunk.raw_length))),
        "stored_bytes": scalar(select(func.sum(Chunk.length))),
        "pack_bytes": scalar(select(func.sum(Pack.size))),
        "delta_chunks": scalar(select(func.count()).select_from(Chunk).where(Chunk.alone_length.is_not(None))),
        # What every chunk would occupy standalone: delta chunks count at their standalone size.
        "alone_bytes": scalar(select(func.sum(func.coalesce(Chunk.alone_length, Chunk.length)))),
    }
