"""Pending layouts: a commit's tensor-level rows recorded as one value, indexed later.

A commit of a 212-tensor training state adds ~1,100 catalog rows (its chunks, tensors, their
chunk lists, entries and entry runs); inserting them and writing the pages they dirty to
SQLite's log is about half of the background thread's CPU per commit, and the chunk-id index
takes a random page per new chunk, so it grows with the catalog. An asynchronous commit on
SQLite (``Repo._persist``) inserts instead its commit row, edges, metrics, packs and one
``pending_layouts`` row holding those rows (``encode``); the commit is visible and complete
when that transaction commits, because its layout is stored, only not yet spread over the
tables queries read.

``index_pending`` spreads pending layouts into those tables (``catalog.record_layout``), in
``seq`` order so that a parent comes before its children, a batch per write transaction that
also deletes their pending rows: a crash leaves each layout either pending or indexed, never
half. Whoever reads the tensor-level tables runs it first (every ``Repo`` method that does,
``gc`` inside its own transaction, ``verify``, ``repack``), and the background repack of
an idle repository does too; a training loop thus pays for the rows when something reads them
or the machine has spare CPU, not in each commit. A database that may not be written (a
read-only ``Repo``) cannot be indexed: its readers read an indexed private copy (``db.readcopy``).

The payload is zstd-compressed JSON (never pickle: reading a repository never executes code):
``{"v": 2, "chunks": [chunk row, ...], "tensors": [tensor, ...], "entries": {name: tensor id}}``,
a chunk row as ``ChunkLocation``'s fields in order, a tensor as ``[tensor_id, dtype, shape,
nbytes, chunk_size, chunk_ids, stats, boxes]`` (``rows.TensorRow``'s fields, converted by name
here; version 1 had no ``boxes``). ``decode`` refuses anything else with FormatError.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import zstandard
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from ckptrepo import faults
from ckptrepo.db import catalog
from ckptrepo.db.engine import write_transaction
from ckptrepo.db.models import Commit, PendingLayout
from ckptrepo.errors import ConcurrentChange, FormatError
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

_VERSION = 2  # 2: each tensor's boxes (schema 0012)
_BATCH = 64  # layouts per indexing transaction
_READ_ATTEMPTS = 20  # snapshots ``reading`` tries for one without pending layouts

_compressor = zstandard.ZstdCompressor(level=1)
_decompressor = zstandard.ZstdDecompressor()


def encode(chunks: Iterable[ChunkLocation], tensors: Iterable[TensorRow], entries: dict[str, str]) -> bytes:
    """The payload of a pending layout: every new chunk row, every tensor row of ``entries``
    and the entries themselves."""
    doc = {
        "v": _VERSION,
        "chunks": [list(c) for c in chunks],
        "tensors": [[t.tensor_id, t.dtype, t.shape, t.nbytes, t.chunk_size, t.chunk_ids, t.stats, t.boxes]
                    for t in tensors],
        "entries": entries,
    }
    return _compressor.compress(json.dumps(doc, separators=(",", ":")).encode())


def decode(payload: bytes) -> tuple[list[ChunkLocation], list[TensorRow], dict[str, str]]:
    """``(chunks, tensors, entries)`` of a payload made by ``encode``; FormatError otherwise."""
    try:
        doc = json.loads(_decompressor.decompress(payload))
        if doc.get("v") not in (1, _VERSION):  # version 1: tensors without boxes
            raise ValueError(f"version {doc.get('v')!r}")
        chunks = [ChunkLocation(*c) for c in doc["chunks"]]
        tensors = [_tensor_row(*t) for t in doc["tensors"]]
        entries = {str(k): str(v) for k, v in doc["entries"].items()}
    except (zstandard.ZstdError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise FormatError(f"a pending commit layout does not decode: {exc}",
                          hint="Run `ckpt verify`; restore the database from a backup if it reports damage.") from exc
    return chunks, tensors, entries


def _tensor_row(tensor_id: str, dtype: str, shape: list[int], nbytes: int, chunk_size: int, chunk_ids: list[str],
                stats: dict[str, Any], boxes: list[list[list[int]]] | None = None) -> TensorRow:
    """The row of a payload's tensor (``encode``'s list, version 1's without ``boxes``)."""
    return TensorRow(tensor_id=tensor_id, dtype=dtype, shape=shape, nbytes=nbytes, chunk_size=chunk_size,
                     chunk_ids=chunk_ids, boxes=boxes, stats=stats)


def defer_layout(session: Session, commit_id: str, chunks: Iterable[ChunkLocation],
                 tensors: Iterable[TensorRow], entries: dict[str, str]) -> None:
    """Record a commit's layout as pending, in the caller's transaction (after its commit row)."""
    session.add(PendingLayout(commit_id=commit_id, payload=encode(chunks, tensors, entries)))
    session.flush()


def exists(session: Session) -> bool:
    """Whether any commit has a pending layout (in the session's snapshot)."""
    return session.scalar(select(PendingLayout.seq).limit(1)) is not None


def count(session: Session) -> int:
    """How many commits have a pending layout."""
    return int(session.scalar(select(func.count()).select_from(PendingLayout)) or 0)


def index_in(session: Session) -> int:
    """Index every pending layout in the caller's write transaction (``gc``: before it reads
    what is live), ``_BATCH`` payloads in memory at a time; return how many."""
    total, last = 0, None
    while True:
        n, last = index_batch(session, limit=_BATCH, last=last)
        total += n
        if n < _BATCH:
            return total


def index_batch(session: Session, *, limit: int,
                last: catalog.CommitLayout | None = None) -> tuple[int, catalog.CommitLayout | None]:
    """Index up to ``limit`` pending layouts in the caller's write transaction, in ``seq``
    order, and delete their pending rows. ``last``: a layout the caller knows (the first parent
    of the first pending commit, usually), so it need not be read. Returns how many were
    indexed and the layout of the last one."""
    query = (select(PendingLayout.seq, PendingLayout.commit_id, PendingLayout.payload,
                    Commit.line_id, Commit.fp_depth, Commit.first_parent_id)
             .join(Commit, Commit.id == PendingLayout.commit_id).order_by(PendingLayout.seq).limit(limit))
    done: list[int] = []
    for seq, commit_id, payload, line, depth, first in session.execute(query).all():
        chunks, tensors, entries = decode(payload)
        if first is None:
            parent = None
        elif last is not None and last.commit_id == first:
            parent = last
        else:
            parent = catalog.commit_layout(session, first)
        last = catalog.record_layout(session, commit_id=commit_id, place=(line, depth), first=first,
                                     chunks=chunks, tensors=tensors, entries=entries, parent=parent)
        done.append(seq)
        faults.point("db.index_pending")
    if done:
        session.execute(delete(PendingLayout).where(PendingLayout.seq.in_(done)))
    return len(done), last


def index_pending(sessions: sessionmaker[Session], *, stop: Callable[[], bool] | None = None,
                  batch: int = _BATCH) -> int:
    """Index every pending layout, ``batch`` per write transaction, until none is left (or
    ``stop()`` turns true between batches); return how many were indexed. Cheap when none is:
    one read."""
    with sessions() as s:
        if not exists(s):
            return 0
    total, last = 0, None
    while stop is None or not stop():
        with write_transaction(sessions) as s:
            n, last = index_batch(s, limit=batch, last=last)
        total += n
        if n < batch:
            break
    return total



@contextmanager
def reading(sessions: sessionmaker[Session], *, defers: bool = True) -> Iterator[Session]:
    """A session for reading the tensor-level tables whose snapshot holds no pending layout,
    whatever other threads and processes commit meanwhile: when one holds some, they are
    indexed and a new snapshot is taken (ConcurrentChange after ``_READ_ATTEMPTS``). With
    ``defers`` False (a database where no process defers layouts: PostgreSQL) a plain session."""
    if not defers:
        with sessions() as s:
            yield s
            return
    for _ in range(_READ_ATTEMPTS):
        with sessions() as s:
            if not exists(s):  # the snapshot starts here (SQLite: BEGIN DEFERRED)
                yield s
                return
        index_pending(sessions)
    raise ConcurrentChange(what="read", other="commit",
                           detail=f"commits kept deferring their layouts over {_READ_ATTEMPTS} attempts")
