"""Row-level reads and writes of the catalog: chunk index, tensors, commits, refs.

Functions take a ``Session`` owned by the caller, who also owns the transaction:
``record_commit`` must run inside the single write transaction that makes a commit
visible (after its packs are durable). Only plain values cross this boundary, so the
chunk layer and the database layer never import each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import BindParameter, Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from ckptrepo.db import lines
from ckptrepo.db.engine import insert_ignore
from ckptrepo.db.models import Chunk, Commit, Edge, Entry, EntryRun, Metric, Pack, Ref, Tensor, TensorChunk

_IN_BATCH = 500


@dataclass(frozen=True)
class ChunkRow:
    chunk_id: str
    pack_id: str
    offset: int
    length: int
    raw_length: int
    encoding: int
    depth: int = 0
    base_id: str | None = None
    alone_length: int | None = None


@dataclass(frozen=True)
class PackRow:
    pack_id: str
    size: int
    n_chunks: int


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


def existing_chunks(session: Session, ids: Sequence[str]) -> set[str]:
    """The subset of ``ids`` already in the chunk index."""
    found: set[str] = set()
    for start in range(0, len(ids), _IN_BATCH):
        batch = ids[start : start + _IN_BATCH]
        found.update(session.scalars(select(Chunk.id).where(Chunk.id.in_(batch))))
    return found


def chunks_by_id(session: Session, ids: Sequence[str]) -> dict[str, Chunk]:
    """The chunk-index rows of those ``ids`` that exist, by id."""
    found: dict[str, Chunk] = {}
    for start in range(0, len(ids), _IN_BATCH):
        batch = ids[start : start + _IN_BATCH]
        found.update((c.id, c) for c in session.scalars(select(Chunk).where(Chunk.id.in_(batch))))
    return found


def chunk_ids_of(session: Session, commit_ids: Sequence[str]) -> frozenset[str]:
    """Every chunk id used by the given commits' tensors."""
    if not commit_ids:
        return frozenset()
    q = (
        select(TensorChunk.chunk_id)
        .join(Entry, Entry.tensor_id == TensorChunk.tensor_id)
        .where(Entry.commit_id.in_(list(commit_ids)))
    )
    return frozenset(session.scalars(q))


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
) -> None:
    """Insert everything one commit adds. Rows another commit inserted concurrently
    (same chunk, same tensor) are kept as they are: content ids make them equal.
    The commit's ``first_parent_id`` is taken from ``edges`` (its ``parent`` edge at
    position 0), whatever ``commit`` says, and its first-parent line from ``lines.place``;
    the rows kept by line (``edges.fork_line_id``, ``entry_runs``) are derived here too."""
    edge_list = list(edges)
    # Rows go in key order: two transactions inserting overlapping keys then lock them in the
    # same order and cannot deadlock (PostgreSQL); base chunks sort before their deltas.
    pack_rows = [
        {"id": p.pack_id, "size": p.size, "n_chunks": p.n_chunks, "created_at": now}
        for p in sorted(packs, key=lambda p: p.pack_id)
    ]
    if pack_rows:
        session.execute(insert_ignore(Pack), pack_rows)
    chunk_rows = [
        {
            "id": c.chunk_id, "pack_id": c.pack_id, "offset": c.offset, "length": c.length,
            "raw_length": c.raw_length, "encoding": c.encoding, "depth": c.depth, "base_id": c.base_id,
            "alone_length": c.alone_length,
        }
        for c in sorted(chunks, key=lambda c: (c.depth, c.chunk_id))
    ]
    if chunk_rows:
        session.execute(insert_ignore(Chunk), chunk_rows)
    tensor_list = sorted({t.tensor_id: t for t in tensors}.values(), key=lambda t: t.tensor_id)
    if tensor_list:
        session.execute(
            insert_ignore(Tensor),
            [
                {
                    "id": t.tensor_id, "dtype": t.dtype, "shape": t.shape, "nbytes": t.nbytes,
                    "chunk_size": t.chunk_size, "n_chunks": len(t.chunk_ids), **t.stats,
                }
                for t in tensor_list
            ],
        )
        session.execute(
            insert_ignore(TensorChunk),
            [
                {"tensor_id": t.tensor_id, "seq": i, "chunk_id": cid}
                for t in tensor_list
                for i, cid in enumerate(t.chunk_ids)
            ],
        )
    first = next((e.parent_id for e in edge_list if e.kind == "parent" and e.position == 0), None)
    extra = any(lines.extra_parent(e.kind, e.position) for e in edge_list)
    spot = lines.place(session, commit["id"], first, extra)
    session.add(Commit(**{**commit, "first_parent_id": first, **spot._asdict()}))
    session.flush()
    if entries:
        session.execute(
            insert_ignore(Entry),
            [{"commit_id": commit["id"], "name": n, "tensor_id": tid} for n, tid in entries.items()],
        )
    # Where this commit's tensors change along its line: against its first parent's entries
    # when it continues that parent's line, all of them when it starts a line; with how many
    # chunk positions differ from the first parent's tensor of the same name.
    before: dict[str, str] = {}
    if first is not None:
        before = dict(session.execute(select(Entry.name, Entry.tensor_id).where(Entry.commit_id == first)).all())
    continues = first is not None and spot.line_id != commit["id"]
    runs = lines.runs_of(spot.line_id, spot.fp_depth, entries, before if continues else None)
    pairs = {(r["tensor_id"], before[r["name"]]) for r in runs
             if r["tensor_id"] is not None and before.get(r["name"]) not in (None, r["tensor_id"])}
    if pairs:
        counts = changed_chunks(session, pairs)
        for r in runs:
            r["changed_chunks"] = counts.get((r["tensor_id"], before.get(r["name"], "")), 0)
    if runs:  # through the table: plain rows, without the ORM's per-row bulk handling
        session.execute(insert(cast(Table, EntryRun.__table__)), runs)
    parents = {cid: (line, depth) for cid, line, depth in session.execute(
        select(Commit.id, Commit.line_id, Commit.fp_depth).where(Commit.id.in_([e.parent_id for e in edge_list])))}
    for e in edge_list:
        # A parent that does not exist is refused by the foreign key at the flush below.
        fork = lines.fork_of(e.kind, e.position, (spot.line_id, spot.fp_depth), parents.get(e.parent_id, ("", -1)))
        session.add(
            Edge(child_id=commit["id"], parent_id=e.parent_id, kind=e.kind, position=e.position, mapping=e.mapping,
                 fork_line_id=fork[0] if fork else None, fork_depth=fork[1] if fork else None)
        )
    for name, value in metrics.items():
        session.add(Metric(commit_id=commit["id"], name=name, value=value))
    session.flush()


def changed_chunks(session: Session, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """For each pair of tensor ids ``(a, b)``: how many chunk positions both have hold different
    chunk ids (pairs whose tensors are not stored count 0)."""
    wanted = set(pairs)
    ids = sorted({t for pair in wanted for t in pair})
    chunks: dict[str, dict[int, str]] = {}
    for start in range(0, len(ids), _IN_BATCH):
        rows = session.execute(select(TensorChunk.tensor_id, TensorChunk.seq, TensorChunk.chunk_id)
                               .where(TensorChunk.tensor_id.in_(ids[start : start + _IN_BATCH])))
        for tid, seq, cid in rows:
            chunks.setdefault(tid, {})[seq] = cid
    out: dict[tuple[str, str], int] = {}
    for a, b in wanted:
        ca, cb = chunks.get(a, {}), chunks.get(b, {})
        out[a, b] = sum(1 for seq, cid in ca.items() if seq in cb and cb[seq] != cid)
    return out


def move_branch(session: Session, name: str, new_id: str, expected: str | None, now: datetime) -> str | None:
    """Compare-and-swap a branch: point ``name`` at ``new_id`` if it is at ``expected``
    (``None``: the branch must not exist). Returns None on success, else where it is."""
    if expected is None:
        current = session.get(Ref, ("branch", name))
        if current is not None:
            return current.commit_id
        # Insert-or-ignore, then read back: a concurrent creator of the same branch wins cleanly.
        session.execute(
            insert_ignore(Ref),
            [{"kind": "branch", "name": name, "commit_id": new_id, "updated_at": now}],
        )
        current = session.get(Ref, ("branch", name), populate_existing=True)
        assert current is not None
        return None if current.commit_id == new_id else current.commit_id
    moved = session.execute(
        update(Ref)
        .where(Ref.kind == "branch", Ref.name == name, Ref.commit_id == expected)
        .values(commit_id=new_id, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if moved.rowcount == 1:  # type: ignore[attr-defined]
        return None
    current = session.get(Ref, ("branch", name), populate_existing=True)
    return current.commit_id if current is not None else ""


def parents_of(session: Session, commit_id: str) -> list[Edge]:
    """Edges from ``commit_id`` to its parents, first parent first."""
    return list(session.scalars(select(Edge).where(Edge.child_id == commit_id).order_by(Edge.position)))


# Built once, run with the ids bound (an expanding IN): building a statement whose IN list
# holds fifty ids cost more than running it. Plain rows, not ORM objects.
_IDS: BindParameter[Any] = bindparam("ids", expanding=True)
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
