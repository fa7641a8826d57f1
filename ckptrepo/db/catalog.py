"""Row-level reads and writes of the catalog: chunk index, tensors, commits (refs: ``db.refs``).

Functions take a ``Session`` owned by the caller, who also owns the transaction:
``record_commit`` must run inside the single write transaction that makes a commit
visible (after its packs are durable). Only plain values cross this boundary, so the
chunk layer and the database layer never import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import BindParameter, Table, bindparam, delete, exists, func, select, update
from sqlalchemy.orm import Session

from ckptrepo.db import lines
from ckptrepo.db.engine import Sessions, fetch_tuples, insert_tuples, present_values
from ckptrepo.db.models import (
    Chunk,
    Commit,
    Edge,
    Entry,
    EntryRun,
    JournalKey,
    Metric,
    Pack,
    Ref,
    RemoteCommit,
    Tensor,
    TensorChunk,
)
from ckptrepo.errors import ConcurrentChange
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import STAT_KEYS, TensorRow

_IN_BATCH = 500


class PackRow(NamedTuple):
    """A ``packs`` row but its creation time; ``deferred``: its chunks are left for ``repack``."""

    pack_id: str
    size: int
    n_chunks: int
    deferred: bool = False


CHUNK_COLUMNS = ("key", "id", "pack_id", "offset", "length", "raw_length", "encoding", "depth", "base_key",
                 "alone_length")
_TENSOR_COLUMNS = ("key", "id", "lead_key", "dtype", "shape", "nbytes", "chunk_size", "n_chunks", "boxes",
                   *STAT_KEYS)
_RUN_COLUMNS = ("name", "line_id", "fp_depth", "tensor_key", "changed_chunks")
_EDGE_COLUMNS = ("child_id", "parent_id", "kind", "position", "mapping", "fork_line_id", "fork_depth")


@dataclass(frozen=True)
class EdgeRow:
    parent_id: str
    kind: str
    position: int
    mapping: dict[str, str] | None = None


# Built once, run with the ids bound (an expanding IN): building a statement whose IN list
# holds fifty ids cost more than running it. Plain rows, not ORM objects.
_IDS: BindParameter[Any] = bindparam("ids", expanding=True)
_CHUNKS_T = cast(Table, Chunk.__table__)
_BASES_T = _CHUNKS_T.alias("base")
_TENSORS_T = cast(Table, Tensor.__table__)
_TENSOR_CHUNKS_T = cast(Table, TensorChunk.__table__)
_CHUNKS, _BASES, _TENSORS, _TENSOR_CHUNKS = _CHUNKS_T.c, _BASES_T.c, _TENSORS_T.c, _TENSOR_CHUNKS_T.c
_ENTRIES = cast(Table, Entry.__table__).c
_COMMITS = cast(Table, Commit.__table__).c
# A commit's tensors' chunk lists, with the keys of both (``CommitLayout``).
_CHUNK_LISTS_OF_COMMITS = (
    select(_TENSORS.id, _TENSORS.key, _TENSOR_CHUNKS.seq, _CHUNKS.id, _CHUNKS.key)
    .select_from(_TENSOR_CHUNKS_T)
    .join(_TENSORS_T, _TENSORS.key == _TENSOR_CHUNKS.tensor_key)
    .join(_CHUNKS_T, _CHUNKS.key == _TENSOR_CHUNKS.chunk_key)
    .where(_TENSOR_CHUNKS.tensor_key.in_(select(_ENTRIES.tensor_key).where(_ENTRIES.commit_id.in_(_IDS))))
)
_ENTRIES_OF = (select(_ENTRIES.name, _TENSORS.id, _TENSORS.key, _TENSORS.lead_key)
               .join(_TENSORS_T, _TENSORS.key == _ENTRIES.tensor_key)
               .where(_ENTRIES.commit_id == bindparam("commit_id")))
_PLACES_OF = select(_COMMITS.id, _COMMITS.line_id, _COMMITS.fp_depth, _COMMITS.generation).where(
    _COMMITS.id.in_(_IDS))
# A chunk row as a ``ChunkLocation``: the delta base named by its id (through its key).
_RECORD_COLUMNS = (_CHUNKS.id, _CHUNKS.pack_id, _CHUNKS.offset, _CHUNKS.length, _CHUNKS.raw_length,
                   _CHUNKS.encoding, _CHUNKS.depth, _BASES.id, _CHUNKS.alone_length)
_RECORDS_BY_ID = (select(*_RECORD_COLUMNS).outerjoin(_BASES_T, _BASES.key == _CHUNKS.base_key)
                  .where(_CHUNKS.id.in_(_IDS)))
_RECORDS_OF_TENSORS = (
    select(_TENSOR_CHUNKS.tensor_key, *_RECORD_COLUMNS)
    .select_from(_TENSOR_CHUNKS_T)
    .join(_CHUNKS_T, _CHUNKS.key == _TENSOR_CHUNKS.chunk_key)
    .outerjoin(_BASES_T, _BASES.key == _CHUNKS.base_key)
    .where(_TENSOR_CHUNKS.tensor_key.in_(bindparam("keys", expanding=True)))
    .order_by(_TENSOR_CHUNKS.tensor_key, _TENSOR_CHUNKS.seq)
)
_CHUNK_KEYS = select(_CHUNKS.id, _CHUNKS.key).where(_CHUNKS.id.in_(_IDS))
_PLACES_OF_CHUNKS = select(_CHUNKS.id, _CHUNKS.pack_id, _CHUNKS.offset, _CHUNKS.depth).where(_CHUNKS.id.in_(_IDS))
# A commit's entries with their tensors' columns (``tensors_of``): all of them, or those named.
_ENTRY_TENSORS = (select(_ENTRIES.name, _TENSORS.key, _TENSORS.id, _TENSORS.dtype, _TENSORS.shape, _TENSORS.nbytes,
                         _TENSORS.chunk_size, _TENSORS.boxes, *[_TENSORS[k] for k in STAT_KEYS])
                  .join(_TENSORS_T, _TENSORS.key == _ENTRIES.tensor_key)
                  .where(_ENTRIES.commit_id == bindparam("commit_id")).order_by(_ENTRIES.name))
_NAMED_ENTRY_TENSORS = _ENTRY_TENSORS.where(_ENTRIES.name.in_(bindparam("names", expanding=True)))
# Tensors by lead key alone, matched by id in Python (``tensor_keys_of``): SQLite (3.40) scans the
# whole (lead_key, id) index for a row-value ``(lead_key, id) IN (...)``.
_TENSORS_BY_LEAD = select(_TENSORS.lead_key, _TENSORS.id, _TENSORS.key).where(
    _TENSORS.lead_key.in_(bindparam("leads", expanding=True)))


def existing_chunks(session: Session, ids: Sequence[str]) -> set[str]:
    """The subset of ``ids`` already in the chunk index."""
    return present_values(session.connection(), _CHUNKS.id, ids)


def chunks_by_id(session: Session, ids: Sequence[str]) -> dict[str, ChunkLocation]:
    """The locations of those chunk ``ids`` that are stored, by id."""
    found: dict[str, ChunkLocation] = {}
    conn = session.connection()
    for start in range(0, len(ids), _IN_BATCH):
        batch = list(ids[start : start + _IN_BATCH])
        found.update((row[0], ChunkLocation(*row)) for row in fetch_tuples(conn, _RECORDS_BY_ID, {"ids": batch}))
    return found


def locator(sessions: Sessions) -> Callable[[Collection[str]], dict[str, ChunkLocation]]:
    """A lookup of stored chunks' locations by id, each call in a short session of its own
    (``ChunkReader``'s way to find delta bases)."""
    def locate(ids: Collection[str]) -> dict[str, ChunkLocation]:
        with sessions() as s:
            return chunks_by_id(s, sorted(ids))

    return locate


def chunk_keys_of(session: Session, ids: Iterable[str]) -> dict[str, int]:
    """The keys of those chunk ``ids`` that are stored, by id."""
    wanted = sorted(set(ids))
    conn = session.connection()
    out: dict[str, int] = {}
    for start in range(0, len(wanted), _IN_BATCH):
        out.update(fetch_tuples(conn, _CHUNK_KEYS, {"ids": wanted[start : start + _IN_BATCH]}))
    return out


def tensor_keys_of(session: Session, leads: Mapping[str, int]) -> dict[str, int]:
    """The keys of those tensors that are stored, by id, given each id's ``lead_key`` (the key
    of its first chunk, 0 for none: ``lead_key``)."""
    wanted = {(lead, tid) for tid, lead in leads.items()}
    keys = sorted({lead for lead, _ in wanted})
    conn = session.connection()
    out: dict[str, int] = {}
    # One index range per lead key (a tensor whose first chunk other versions share returns
    # those too, dropped here); a row-value IN of the pairs read the whole index on SQLite: 22
    # ms per commit at 250,000 tensors, for a commit whose tensors are stored but not its parent's.
    for start in range(0, len(keys), _IN_BATCH):
        out.update((tid, key) for lead, tid, key in fetch_tuples(conn, _TENSORS_BY_LEAD,
                                                                  {"leads": keys[start : start + _IN_BATCH]})
                   if (lead, tid) in wanted)
    return out


def allocate_keys(session: Session, table: str, n: int) -> list[int]:
    """``n`` new keys for rows of ``table`` ("chunks" or "tensors"), increasing, none given before
    (not even to a row since deleted). Inside the caller's write transaction: on SQLite, whose
    write lock it holds, the keys follow the table's AUTOINCREMENT high-water mark, which the
    inserts of those keys then move on; on PostgreSQL they are drawn from the table's sequence
    (``chunks_key_seq``, ``tensors_key_seq``), so concurrent transactions never share one."""
    if n <= 0:
        return []
    conn = session.connection()
    if conn.dialect.name == "postgresql":
        rows = conn.exec_driver_sql(f"SELECT nextval('{table}_key_seq') FROM generate_series(1, %s)", (n,))
        return sorted(k for (k,) in rows)
    top = conn.exec_driver_sql("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).scalar()
    if top is None:  # nothing inserted yet (or a copy without the sequence row): the largest key
        top = conn.exec_driver_sql(f"SELECT max(key) FROM {table}").scalar()
    first = int(top or 0) + 1
    return list(range(first, first + n))


class CommitLayout(NamedTuple):
    """A stored commit's entries (name -> tensor id), its tensors' ordered chunk ids (by tensor
    id) and the keys of those tensors and chunks (by id): never changed once committed, so
    whoever has them need not read them again."""

    commit_id: str
    entries: dict[str, str]
    chunk_lists: dict[str, list[str]]
    tensor_keys: dict[str, int]
    chunk_keys: dict[str, int]


def commit_layout(session: Session, commit_id: str) -> CommitLayout:
    """The layout of a stored commit (empty for an id that names none). Tensors whose chunk
    lists gc dropped (``drop_chunk_lists``: a pruned commit's) have no key or chunk list in it:
    a child of the same tensor records it anew."""
    entries: dict[str, str] = {}
    tensor_keys: dict[str, int] = {}
    for name, tid, key, lead in fetch_tuples(session.connection(), _ENTRIES_OF, {"commit_id": commit_id}):
        entries[name] = tid
        if lead >= 0:
            tensor_keys[tid] = key
    chunk_keys: dict[str, int] = {}
    return CommitLayout(commit_id, entries, _chunk_lists(session, [commit_id], chunk_keys), tensor_keys, chunk_keys)


def chunk_lists_of(session: Session, commit_ids: Sequence[str]) -> dict[str, list[str]]:
    """The ordered chunk ids of every tensor of the given commits, by tensor id."""
    return _chunk_lists(session, commit_ids, {})


def _chunk_lists(session: Session, commit_ids: Sequence[str], chunk_keys: dict[str, int]) -> dict[str, list[str]]:
    if not commit_ids:
        return {}
    by_seq: dict[str, dict[int, str]] = {}
    for tid, _, seq, cid, ckey in fetch_tuples(session.connection(), _CHUNK_LISTS_OF_COMMITS,
                                                {"ids": list(commit_ids)}):
        by_seq.setdefault(tid, {})[seq] = cid
        chunk_keys[cid] = ckey
    return {tid: [chunks[i] for i in sorted(chunks)] for tid, chunks in by_seq.items()}


def _insert_keyed(session: Session, table: str, model: type[Chunk] | type[Tensor], columns: Sequence[str],
                  rows: list[tuple[Any, ...]], keys: dict[str, int],
                  reread: Callable[[list[tuple[Any, ...]]], dict[str, int]]) -> None:
    """Insert ``rows`` (without their key: ``(id, *rest)``) under new keys, skipping ids already
    stored (a concurrent commit inserted them), and record every row's key in ``keys``
    (``reread``: the stored keys of such rows, by id)."""
    if not rows:
        return
    fresh = allocate_keys(session, table, len(rows))
    inserted = insert_tuples(session.connection(), model, columns,
                             [(k, *row) for k, row in zip(fresh, rows, strict=True)], ignore=True)
    if inserted == len(rows):
        keys.update((row[0], k) for k, row in zip(fresh, rows, strict=True))
    else:  # some ids were there already: their rows keep their keys
        keys.update(reread(rows))


def _stored_chunks_named(chunk_rows: Sequence[ChunkLocation], tensors: Iterable[TensorRow]) -> set[str]:
    """The chunks that ``chunk_rows`` (as delta bases) and ``tensors`` name and that are not
    among ``chunk_rows``: they must be stored already."""
    new = {c.chunk_id for c in chunk_rows}
    named = {c.base_id for c in chunk_rows if c.base_id is not None}
    named.update(x for t in tensors for x in t.chunk_ids)
    return named - new


def _require_stored(missing: set[str]) -> None:
    """Refuse a commit that refers to stored chunks which are gone (a gc in another process
    removed them after this commit looked them up)."""
    if missing:
        raise ConcurrentChange(what="commit", other="gc",
                               detail=f"{len(missing)} chunk(s) it shares, e.g. {min(missing)}, are no longer stored")


def insert_chunks(session: Session, chunks: Iterable[ChunkLocation]) -> dict[str, int]:
    """Insert chunk index rows (``maintenance.rebuild``: read from pack footers), delta bases
    first, and return every chunk's key by id. A base must be among ``chunks`` or stored.

    Bases first by the chains themselves, not by the depth each row records: a footer records
    the depth a chunk was encoded at, and the copy of its base that is stored may since have been
    re-encoded deeper (a repack), so a chunk at depth 2 can have its base at depth 7."""
    rows = sorted(chunks, key=lambda c: c.chunk_id)
    by_id = {c.chunk_id: c for c in rows}
    keys = chunk_keys_of(session, {c.base_id for c in rows if c.base_id is not None and c.base_id not in by_id})
    level: dict[str, int] = {}
    for c in rows:  # each chunk's distance from a base outside ``chunks`` (iteratively: chains can be long)
        chain: list[str] = []
        at: str | None = c.chunk_id
        while at is not None and at in by_id and at not in level:
            chain.append(at)
            at = by_id[at].base_id
            if at in chain:
                raise ValueError(f"chunk {at} is its own delta base")
        below = level.get(at, -1) if at is not None else -1
        for cid in reversed(chain):
            below += 1
            level[cid] = below

    def stored(found: list[tuple[Any, ...]]) -> dict[str, int]:
        return chunk_keys_of(session, [r[0] for r in found])

    for depth in sorted(set(level.values())):
        _insert_keyed(session, "chunks", Chunk, CHUNK_COLUMNS, [
            (c.chunk_id, c.pack_id, c.offset, c.length, c.raw_length, c.encoding, c.depth,
             None if c.base_id is None else keys[c.base_id], c.alone_length)
            for c in rows if level[c.chunk_id] == depth], keys, stored)
    return keys


def relocate_chunks(session: Session, locations: Iterable[ChunkLocation], now: datetime) -> int:
    """Move stored chunks' rows to new, shallower copies (``locations``: in packs whose rows
    exist, made durable before this transaction; a commit's bases stored again standalone,
    ``ingest.pipeline``), inside the caller's transaction; returns how many rows moved.

    A row moves only if the new copy is shallower and the row is still where this transaction
    reads it (a repack or another commit moving it meanwhile keeps its move: this copy is then
    garbage in its pack). A delta's row names its base by key, so the rows of chunks encoded
    against a moved chunk are untouched. An old pack left without chunk rows is retired
    (``retired_at``), as a repack retires one: ``gc`` deletes it only after the grace period, so
    a reader that looked up the old location still finds the bytes there."""
    olds: set[str] = set()
    moved = 0
    conn = session.connection()
    by_id = {loc.chunk_id: loc for loc in locations}
    ids = sorted(by_id)
    current = {row[0]: row for start in range(0, len(ids), _IN_BATCH) for row in fetch_tuples(
        conn, _PLACES_OF_CHUNKS, {"ids": ids[start : start + _IN_BATCH]})}
    for cid in sorted(current):  # id order: two transactions moving overlapping rows lock them alike
        _, old_pack, old_offset, old_depth = current[cid]
        loc = by_id[cid]
        if loc.depth >= old_depth or (old_pack, old_offset) == (loc.pack_id, loc.offset):
            continue
        done = conn.execute(
            update(_CHUNKS_T)
            .where(_CHUNKS.id == cid, _CHUNKS.pack_id == old_pack, _CHUNKS.offset == old_offset)
            .values(pack_id=loc.pack_id, offset=loc.offset, length=loc.length, raw_length=loc.raw_length,
                    encoding=loc.encoding, depth=loc.depth, alone_length=loc.alone_length,
                    base_key=None if loc.base_id is None else chunk_keys_of(session, [loc.base_id])[loc.base_id]))
        if done.rowcount:
            moved += 1
            olds.add(old_pack)
    if olds:
        packs = cast(Table, Pack.__table__)
        conn.execute(update(packs)
                     .where(packs.c.id.in_(sorted(olds)), packs.c.retired_at.is_(None),
                            ~exists(select(_CHUNKS.id).where(_CHUNKS.pack_id == packs.c.id)))
                     .values(retired_at=now))
    return moved


def record_commit(
    session: Session,
    *,
    packs: Iterable[PackRow],
    chunks: Iterable[ChunkLocation],
    tensors: Iterable[TensorRow],
    commit: dict[str, Any],
    entries: dict[str, str],
    edges: Iterable[EdgeRow],
    metrics: dict[str, float],
    now: datetime,
    parent: CommitLayout | None,
    dataless: Collection[str] = (),
) -> CommitLayout:
    """Insert everything one commit adds and return the commit's layout (``CommitLayout``):
    ``record_head`` then ``record_layout`` (see both). Rows another commit inserted
    concurrently (same pack, chunk, tensor) are kept as they are: content ids make them equal,
    and their keys are used. ``parent``: the first parent's layout (``commit_layout``, or kept
    from recording it; None for a root), which the caller has read before ingest (ValueError
    when it is not that commit's).
    """
    edge_list = list(edges)
    first = first_parent_of(edge_list)
    if (parent.commit_id if parent is not None else None) != first:
        raise ValueError(f"the layout given is not that of the first parent {first}")
    spot = record_head(session, packs=packs, commit=commit, edges=edge_list, metrics=metrics, now=now)
    return record_layout(session, commit_id=commit["id"], place=(spot.line_id, spot.fp_depth), first=first,
                         chunks=chunks, tensors=tensors, entries=entries, parent=parent, dataless=dataless)


def first_parent_of(edges: Iterable[EdgeRow]) -> str | None:
    """The parent of the ``parent`` edge at position 0, if any."""
    return next((e.parent_id for e in edges if e.kind == "parent" and e.position == 0), None)


def record_head(session: Session, *, packs: Iterable[PackRow], commit: dict[str, Any], edges: Iterable[EdgeRow],
                metrics: dict[str, float], now: datetime) -> lines.Placement:
    """Insert a commit's packs, its row, edges and metrics; return its placement. The commit's
    ``first_parent_id`` is taken from ``edges`` (its ``parent`` edge at position 0), its
    ``generation`` from its parents' (1 + the highest, 1 for a root) and its first-parent line
    from ``lines.place``, whatever ``commit`` says; so are ``edges.fork_line_id`` and
    ``fork_depth``. Packs are inserted in id order (see ``record_layout``)."""
    cid = commit["id"]
    edge_list = list(edges)
    first = first_parent_of(edge_list)
    conn = session.connection()
    insert_tuples(conn, Pack, ("id", "size", "n_chunks", "deferred", "created_at"),
                  [(*p, now) for p in sorted(packs, key=lambda p: p.pack_id)], ignore=True)
    extra = any(lines.extra_parent(e.kind, e.position) for e in edge_list)
    spot = lines.place(session, cid, first, extra)
    line, depth = spot.line_id, spot.fp_depth
    parents = {pid: (pline, pdepth, generation) for pid, pline, pdepth, generation in fetch_tuples(
        conn, _PLACES_OF, {"ids": [e.parent_id for e in edge_list]})} if edge_list else {}
    row = {**commit, "first_parent_id": first, **spot._asdict(),
           "generation": 1 + max((p[2] for p in parents.values()), default=0)}
    insert_tuples(conn, Commit, tuple(row), [tuple(row.values())])
    edge_rows = []
    for e in edge_list:
        # A parent that does not exist is refused by the foreign key.
        up = parents.get(e.parent_id)
        fork = lines.fork_of(e.kind, e.position, (line, depth), up[:2] if up else ("", -1))
        edge_rows.append((cid, e.parent_id, e.kind, e.position, e.mapping, *(fork or (None, None))))
    insert_tuples(conn, Edge, _EDGE_COLUMNS, edge_rows)
    insert_tuples(conn, Metric, ("commit_id", "name", "value"), [(cid, n, v) for n, v in metrics.items()])
    return spot


def record_layout(
    session: Session,
    *,
    commit_id: str,
    place: tuple[str, int],
    first: str | None,
    chunks: Iterable[ChunkLocation],
    tensors: Iterable[TensorRow],
    entries: dict[str, str],
    parent: CommitLayout | None,
    dataless: Collection[str] = (),
) -> CommitLayout:
    """Insert the tensor-level rows of a commit whose row exists (``record_head``), placed at
    ``place`` (``(line_id, fp_depth)``) with first parent ``first``, and return its layout.
    ``tensors``: every tensor of ``entries`` (those stored already are not inserted again).
    The rows kept by line (``entry_runs``) are derived here, with ``parent``: the first
    parent's layout (None for a root). Keys of tensors and chunks the parent's layout does not
    hold are looked up; new rows get new keys (``allocate_keys``). Rows are inserted through
    the driver (``engine.insert_tuples``), chunks and tensors in id order: two transactions
    inserting overlapping ids then lock them in the same order and cannot deadlock
    (PostgreSQL); base chunks are inserted before their deltas. ``dataless``: ids of tensors
    whose chunks are gone (a pruned commit's, recorded again by ``maintenance.rebuild``): their
    rows keep statistics and chunk counts but get no ``tensor_chunks`` rows.
    """
    cid = commit_id
    line, depth = place
    conn = session.connection()
    tensor_list = sorted({t.tensor_id: t for t in tensors}.values(), key=lambda t: t.tensor_id)
    chunk_keys = dict(parent.chunk_keys) if parent is not None else {}
    tensor_keys = dict(parent.tensor_keys) if parent is not None else {}
    new_tensors = [t for t in tensor_list if t.tensor_id not in tensor_keys]
    chunk_rows = sorted(chunks, key=lambda c: (c.depth, c.chunk_id))
    new_chunk_ids = {c.chunk_id for c in chunk_rows}
    without = set(dataless)
    with_data = [t for t in new_tensors if t.tensor_id not in without]
    # Keys of the chunks this commit refers to and does not insert, beyond the parent's.
    chunk_keys.update(chunk_keys_of(session, _stored_chunks_named(chunk_rows, new_tensors) - chunk_keys.keys()))
    # A tensor with a chunk new to the store is new; the others may be stored already (those
    # whose first chunk is stored: their lead key is known now).
    leads = {t.tensor_id: chunk_keys[t.chunk_ids[0]] if t.chunk_ids else 0 for t in new_tensors
             if new_chunk_ids.isdisjoint(t.chunk_ids) and (not t.chunk_ids or t.chunk_ids[0] in chunk_keys)}
    tensor_keys.update(tensor_keys_of(session, leads))
    new_tensors = [t for t in new_tensors if t.tensor_id not in tensor_keys]
    with_data = [t for t in with_data if t.tensor_id not in tensor_keys]
    _require_stored(_stored_chunks_named(chunk_rows, with_data) - chunk_keys.keys())

    def stored_chunks(rows: list[tuple[Any, ...]]) -> dict[str, int]:
        return chunk_keys_of(session, [r[0] for r in rows])

    def stored_tensors(rows: list[tuple[Any, ...]]) -> dict[str, int]:
        return tensor_keys_of(session, {r[0]: r[1] for r in rows})

    # By delta depth: a delta's base (in this commit or stored) has its key before the delta's row.
    for level in sorted({c.depth for c in chunk_rows}):
        _insert_keyed(session, "chunks", Chunk, CHUNK_COLUMNS, [
            (c.chunk_id, c.pack_id, c.offset, c.length, c.raw_length, c.encoding, c.depth,
             None if c.base_id is None else chunk_keys[c.base_id], c.alone_length)
            for c in chunk_rows if c.depth == level], chunk_keys, stored_chunks)
    _insert_keyed(session, "tensors", Tensor, _TENSOR_COLUMNS, [
        (t.tensor_id, chunk_keys.get(t.chunk_ids[0], 0) if t.chunk_ids else 0, t.dtype, t.shape, t.nbytes,
         t.chunk_size,
         len(t.chunk_ids), t.boxes, *[t.stats[k] for k in STAT_KEYS])
        for t in new_tensors
    ], tensor_keys, stored_tensors)
    insert_tuples(conn, TensorChunk, ("tensor_key", "seq", "chunk_key"), [
        (tensor_keys[t.tensor_id], i, chunk_keys[x]) for t in with_data for i, x in enumerate(t.chunk_ids)
    ], ignore=True)
    insert_tuples(conn, Entry, ("commit_id", "name", "tensor_key"),
                  [(cid, n, tensor_keys[tid]) for n, tid in sorted(entries.items())], ignore=True)
    # The tensors it shares must keep their chunk lists: a gc (of another process) may have
    # dropped them meanwhile, had only pruned commits named them (``drop_chunk_lists``).
    fresh = {t.tensor_id for t in new_tensors}
    _require_linked(session, {tensor_keys[tid] for tid in entries.values() if tid not in fresh and tid not in without})
    # Where this commit's tensors change along its line: against its first parent's entries
    # when it continues that parent's line, all of them when it starts a line; with how many
    # chunk positions differ from the first parent's tensor of the same name.
    before = parent.entries if parent is not None else {}
    runs = lines.runs_of(line, depth, entries, before if first is not None and line != cid else None)
    pairs = {(r["tensor_id"], before[r["name"]]) for r in runs
             if r["tensor_id"] is not None and before.get(r["name"]) not in (None, r["tensor_id"])}
    lists = {**(parent.chunk_lists if parent is not None else {}), **{t.tensor_id: t.chunk_ids for t in tensor_list}}
    counts = changed_chunks(pairs, lists)
    insert_tuples(conn, EntryRun, _RUN_COLUMNS, [
        (r["name"], line, depth, None if r["tensor_id"] is None else tensor_keys[r["tensor_id"]],
         counts.get((r["tensor_id"], before.get(r["name"], "")), 0))
        for r in runs])
    mine = set(entries.values())
    return CommitLayout(
        cid, dict(entries), {tid: lists[tid] for tid in mine if tid in lists},
        {tid: tensor_keys[tid] for tid in mine},
        {x: chunk_keys[x] for tid in mine for x in lists.get(tid, ()) if x in chunk_keys},
    )


_DROPPED = select(_TENSORS.key).where(_TENSORS.key.in_(bindparam("keys", expanding=True)), _TENSORS.lead_key < 0)


def _require_linked(session: Session, keys: Iterable[int]) -> None:
    """ConcurrentChange when one of the tensors ``keys`` has lost its chunk list."""
    wanted = sorted(keys)
    conn = session.connection()
    for start in range(0, len(wanted), _IN_BATCH):
        if conn.execute(_DROPPED, {"keys": wanted[start : start + _IN_BATCH]}).first() is not None:
            raise ConcurrentChange(what="commit", other="gc",
                                   detail="a tensor it shares lost its chunks meanwhile (only pruned commits used it)")


def drop_chunk_lists(session: Session, keys: Sequence[int]) -> None:
    """Delete the chunk lists (``tensor_chunks``) of the tensors ``keys`` and set each one's
    ``lead_key`` to ``-key``, so that no lookup by first chunk (``tensor_keys_of``) and no
    ``commit_layout`` offers it for reuse: gc, for the tensors only pruned commits name. Their
    rows, with statistics and chunk counts, stay. In the caller's write transaction."""
    conn = session.connection()
    for start in range(0, len(keys), _IN_BATCH):
        batch = list(keys[start : start + _IN_BATCH])
        conn.execute(delete(_TENSOR_CHUNKS_T).where(_TENSOR_CHUNKS.tensor_key.in_(batch)))
        conn.execute(update(_TENSORS_T).where(_TENSORS.key.in_(batch)).values(lead_key=-_TENSORS.key))


def record_journal_key(session: Session, key: str) -> None:
    """Record, in the caller's write transaction (the one that makes the change), that the journal
    entry at ``key`` (``ledger.journal``) is this database's: ``verify`` then reports it if it
    goes missing from the store."""
    insert_tuples(session.connection(), JournalKey, ("key",), [(key,)], ignore=True)


def changed_chunks(pairs: Iterable[tuple[str, str]],
                   chunk_lists: Mapping[str, Sequence[str]]) -> dict[tuple[str, str], int]:
    """For each pair of tensor ids ``(a, b)``: how many chunk positions both have hold different
    chunk ids, given the tensors' ordered chunk ids (a tensor missing there counts as none)."""
    return {(a, b): sum(1 for x, y in zip(chunk_lists.get(a, ()), chunk_lists.get(b, ()), strict=False) if x != y)
            for a, b in pairs}


def parents_of(session: Session, commit_id: str) -> list[Edge]:
    """Edges from ``commit_id`` to its parents, first parent first."""
    return list(session.scalars(select(Edge).where(Edge.child_id == commit_id).order_by(Edge.position)))


_REFS_AT = select(Ref.commit_id, Ref.kind, Ref.name).where(Ref.commit_id.in_(_IDS)).order_by(Ref.kind, Ref.name)
_METRICS_OF = select(Metric.commit_id, Metric.name, Metric.value, Metric.annotated).where(Metric.commit_id.in_(_IDS))
_EDGES_OF = (select(Edge.child_id, Edge.parent_id, Edge.kind, Edge.mapping)
             .where(Edge.child_id.in_(_IDS)).order_by(Edge.position))


class ParentEdge(NamedTuple):
    """An edge to a parent, as ``edges_of`` reads it."""

    parent_id: str
    kind: str
    mapping: dict[str, str] | None


def refs_at(session: Session, commit_ids: Sequence[str]) -> dict[str, list[str]]:
    """Ref names per commit id (branches and remote-tracking refs plain, tags as ``tag:NAME``)."""
    out: dict[str, list[str]] = {}
    for start in range(0, len(commit_ids), _IN_BATCH):
        batch = list(commit_ids[start : start + _IN_BATCH])
        for cid, kind, name in session.execute(_REFS_AT, {"ids": batch}):
            out.setdefault(cid, []).append(f"tag:{name}" if kind == "tag" else name)
    return out


def tiers_of(session: Session, commit_ids: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """Where each of the commits is durable (``types.Commit.tiers``), for those not only local:
    ``"local"`` unless some chunk of it is in a remote's pack only (``packs.remote``), then every
    remote that holds it (``remote_commits``), by name."""
    if not commit_ids:
        return {}
    held: dict[str, list[str]] = {}
    remote_only: set[str] = set()
    for start in range(0, len(commit_ids), _IN_BATCH):
        batch = list(commit_ids[start : start + _IN_BATCH])
        for cid, remote in session.execute(select(RemoteCommit.commit_id, RemoteCommit.remote).where(
                RemoteCommit.commit_id.in_(batch)).order_by(RemoteCommit.remote)):
            held.setdefault(cid, []).append(remote)
        if session.scalar(select(exists().where(Pack.remote.is_not(None)))):
            for cid, where in session.execute(
                    select(Entry.commit_id, Pack.remote).distinct()
                    .join(TensorChunk, TensorChunk.tensor_key == Entry.tensor_key)
                    .join(Chunk, Chunk.key == TensorChunk.chunk_key)
                    .join(Pack, Pack.id == Chunk.pack_id)
                    .where(Entry.commit_id.in_(batch), Pack.remote.is_not(None))):
                remote_only.add(cid)
                if where is not None and where not in held.setdefault(cid, []):  # its bytes are there
                    held[cid].append(where)
    return {cid: (*(() if cid in remote_only else ("local",)), *sorted(held.get(cid, ())))
            for cid in set(held) | remote_only}


def metrics_of(session: Session, commit_ids: Sequence[str]) -> dict[str, dict[str, float]]:
    """The metrics each commit logged when it was made (part of its id), per commit id."""
    return metrics_and_annotations_of(session, commit_ids)[0]


def metrics_and_annotations_of(session: Session, commit_ids: Sequence[str]
                               ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Per commit id: the metrics it logged, and the current values of its annotations
    (``db.notes``)."""
    logged: dict[str, dict[str, float]] = {}
    annotated: dict[str, dict[str, float]] = {}
    for start in range(0, len(commit_ids), _IN_BATCH):
        batch = list(commit_ids[start : start + _IN_BATCH])
        for cid, name, value, later in session.execute(_METRICS_OF, {"ids": batch}):
            (annotated if later else logged).setdefault(cid, {})[name] = value
    return logged, annotated


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
    q = select(Entry, Tensor).join(Tensor, Tensor.key == Entry.tensor_key).where(Entry.commit_id == commit_id)
    if names is not None:
        q = q.where(Entry.name.in_(list(names)))
    return [(row[0], row[1]) for row in session.execute(q.order_by(Entry.name))]


def tensors_of(session: Session, commit_id: str,
               names: Collection[str] | None = None) -> dict[str, tuple[TensorRow, list[ChunkLocation]]]:
    """The entries of a commit (all, or those ``names`` it has), by name, each with its tensor's
    row and the locations of its chunks in order (read by the tensors' keys: two queries). A
    row's chunk ids are those its chunk list holds: none for a tensor whose list gc dropped
    (``drop_chunk_lists``). Entries naming one tensor share one row."""
    conn = session.connection()
    if names is None:
        entries = conn.execute(_ENTRY_TENSORS, {"commit_id": commit_id}).all()
    else:
        entries = conn.execute(_NAMED_ENTRY_TENSORS, {"commit_id": commit_id, "names": list(names)}).all()
    keys = sorted({e[1] for e in entries})
    chunks: dict[int, list[ChunkLocation]] = {key: [] for key in keys}
    for start in range(0, len(keys), _IN_BATCH):
        for row in fetch_tuples(conn, _RECORDS_OF_TENSORS, {"keys": keys[start : start + _IN_BATCH]}):
            chunks[row[0]].append(ChunkLocation(*row[1:]))
    made: dict[int, tuple[TensorRow, list[ChunkLocation]]] = {}
    out: dict[str, tuple[TensorRow, list[ChunkLocation]]] = {}
    for name, key, tid, dtype, shape, nbytes, chunk_size, boxes, *stats in entries:
        item = made.get(key)
        if item is None:
            locations = chunks[key]
            item = made[key] = (TensorRow(tensor_id=tid, dtype=dtype, shape=shape, nbytes=nbytes,
                                          chunk_size=chunk_size, chunk_ids=[c.chunk_id for c in locations],
                                          boxes=boxes, stats=dict(zip(STAT_KEYS, stats, strict=True))), locations)
        out[name] = item
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
        "packs": scalar(select(func.count()).select_from(Pack).where(Pack.remote.is_(None))),
        "logical_bytes": scalar(select(func.sum(Commit.logical_bytes))),
        "unique_bytes": scalar(select(func.sum(Chunk.raw_length))),
        "stored_bytes": scalar(select(func.sum(Chunk.length))),
        "pack_bytes": scalar(select(func.sum(Pack.size)).where(Pack.remote.is_(None))),  # in this store
        "delta_chunks": scalar(select(func.count()).select_from(Chunk).where(Chunk.alone_length.is_not(None))),
        # What every chunk would occupy standalone: delta chunks count at their standalone size.
        "alone_bytes": scalar(select(func.sum(func.coalesce(Chunk.alone_length, Chunk.length)))),
    }


def awaiting_repack(session: Session) -> tuple[int, int]:
    """``(packs, bytes)`` that commits wrote raw and no repack has encoded yet."""
    row = session.execute(
        select(func.count(), func.coalesce(func.sum(Pack.size), 0))
        .where(Pack.deferred.is_(True), Pack.retired_at.is_(None))
    ).one()
    return int(row[0]), int(row[1])
