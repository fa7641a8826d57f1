"""Repack: encode the chunks that commits stored raw (deferred encoding), and compact packs
that hold mostly bytes of deleted chunks, without changing any chunk's id or bytes.

What moves: every chunk row of a *deferred* pack (written by a commit that left encoding to
repack, ``packs.deferred``): a RAW chunk is encoded the way ingest would have (byte groups,
zstd of the planes that pay, and a delta against the same-offset chunk of the same tensor in
the first parent of the oldest commit using it, or that chunk's keyframe; none when that
parent is pruned); an already
encoded chunk is copied as it is. With ``compact_below``, also every live chunk of a pack
whose chunk rows cover less than that fraction of its bytes (what ``gc`` leaves in packs it
keeps whole), copied as it is.

Write ordering, per batch of about one pack (the commit path's: docs/design.md):

1. The new pack is made durable in the store (``PackSink``: temporary file, fsync, rename,
   directory fsync; on an object store a completed PUT) before any row names it. The batch's
   lease (``ledger.leases``) is put before its temporary file and released once its
   transaction has ended, so a ``gc`` meanwhile (whatever its grace period) keeps the pack.
2. One transaction inserts its ``packs`` row, repoints the moved chunk rows at it (each
   only if it still is where this run read it: a concurrent repack or gc may have moved or
   removed it) and retires each old pack left without chunk rows (``retired_at``).
3. Old packs are never deleted here. ``gc`` deletes a retired pack once its ``retired_at``
   is older than the grace period, so a reader that looked up an old location before step 2
   (a checkout, a commit reading a delta base) still finds the bytes there.

A crash or failure before step 2 commits leaves the rows as they were (the new pack is
unreferenced: ``verify`` warns, ``gc`` reclaims it); after it, the batch is complete.
Earlier batches stay done. Chunks keep their ids, so tensors, commits and deduplication
are untouched; every RAW chunk is hash-checked when read, so a damaged chunk fails the run
(IntegrityError) instead of being rewritten.

Delta chains: a chunk becomes a delta only if no chunk row uses it as a base (it would
lengthen their chains), and only against a base at most ``max_delta_depth - 1`` deep, as at
ingest. A commit of another process that takes such a chunk as its base between this run's
check and its transaction records one hop less than its chain has: reads stay exact (every
chunk is verified), only the bound on hops per read is exceeded by one.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, cast

from sqlalchemy import Table, bindparam, exists, func, select, update
from sqlalchemy.orm import Session, aliased, sessionmaker

from ckptrepo import dtypes, faults
from ckptrepo.chunks.codecs import Encoding, PlaneHint, encode_with_base
from ckptrepo.chunks.pack import pack_key
from ckptrepo.chunks.store import ChunkReader, PackSink, SealedPack
from ckptrepo.config import RepoConfig
from ckptrepo.db import catalog
from ckptrepo.db import pending as layouts
from ckptrepo.db.engine import insert_ignore, write_transaction
from ckptrepo.db.models import Chunk, Commit, Entry, Pack, Tensor, TensorChunk
from ckptrepo.errors import ConcurrentChange, UsageError
from ckptrepo.ledger import leases
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage import Backend
from ckptrepo.types import RepackReport

_IN_BATCH = 500
_CHUNKS = cast(Table, Chunk.__table__)
_PACKS = cast(Table, Pack.__table__)
_BASE = aliased(Chunk, name="base")  # a delta's base row, for its id


@dataclass
class _Item:
    """One chunk to move: where it is, and for a RAW chunk of a deferred pack how to encode it."""

    loc: ChunkLocation
    alone_length: int | None
    encode: bool
    itemsize: int = 1
    order: tuple[int, str, str, int] = (0, "", "", 0)  # owner's generation, commit, tensor name, seq
    hint_key: str = ""
    base: ChunkLocation | None = None  # the same-offset chunk of the owner's first parent


@dataclass
class _Moved:
    """A chunk written to the sink this run, and where its row pointed before."""

    loc: ChunkLocation
    old_pack: str
    alone_length: int | None


@dataclass
class _Run:
    sessions: sessionmaker[Session]
    backend: Backend
    reader: ChunkReader
    pool: Executor
    config: RepoConfig
    window: int
    stop: Callable[[], bool]
    moved: dict[str, ChunkLocation] = field(default_factory=dict)
    batch: list[_Moved] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hints: dict[str, PlaneHint] = field(default_factory=dict)
    dependents: set[str] = field(default_factory=set)
    orig: dict[str, ChunkLocation] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    lease: leases.Lease = field(init=False)  # the batch's, from its first chunk until its transaction ended

    def __post_init__(self) -> None:
        self.lease = leases.Lease(self.backend, "repack")


def repack(
    sessions: sessionmaker[Session],
    backend: Backend,
    reader: ChunkReader,
    pool: Executor,
    config: RepoConfig,
    *,
    compact_below: float = 0.0,
    dry_run: bool = False,
    stop: Callable[[], bool] | None = None,
    window: int = 6,
    max_packs: int | None = None,
    index_batch: int = 64,
) -> RepackReport:
    """Move the chunks of deferred packs (and, with ``compact_below`` > 0, of packs whose
    live chunks fill less than that fraction) into new packs; see the module docstring.

    ``max_packs``: take only the oldest that many deferred packs (a background run plans a
    bounded amount of work however large the backlog; delta bases, older, come first).
    Indexes the pending layouts first (``db.pending``, ``index_batch`` per transaction; then
    nothing else happens when ``stop`` turns true meanwhile). ``stop`` is asked once the plan
    is read and before each chunk: when it turns true the batch in progress is dropped (its
    temporary pack deleted, nothing recorded) and the run returns with ``stopped``; batches
    already recorded stay. On any failure the batch in progress changes nothing and the failure
    is raised.
    """
    if not 0.0 <= compact_below <= 1.0:
        raise UsageError(f"compact-below {compact_below} is not a fraction", hint="Pass a value from 0 to 1.")
    started, cpu0 = time.perf_counter(), time.process_time()
    # Pending layouts first (``db.pending``): until indexed, a commit's new chunks have no rows,
    # and its deferred packs look empty.
    layouts.index_pending(sessions, stop=stop, batch=index_batch)
    if stop is not None and stop():
        return RepackReport(dry_run=dry_run, stopped=True)
    with sessions() as s:
        deferred, sparse, items = _plan(s, config, compact_below, max_packs)
    report: dict[str, Any] = dict(dry_run=dry_run, deferred_packs=len(deferred), sparse_packs=len(sparse),
                                  packs_read=len(deferred) + len(sparse))
    halted = stop is not None and stop()
    if dry_run or not items or halted:
        report["bytes_before"] = sum(i.loc.length for i in items)
        return RepackReport(**report, seconds=time.perf_counter() - started, cpu_s=time.process_time() - cpu0,
                            stopped=halted and not dry_run and bool(items))
    run = _Run(sessions, backend, reader, pool, config, max(1, window), stop or (lambda: False))
    run.orig = {i.loc.chunk_id: i.loc for i in items}
    with sessions() as s:
        run.dependents = _with_dependents(s, [i.loc.chunk_id for i in items if i.encode])
    stopped = _execute(run, items)
    c = run.counts
    return RepackReport(
        **report, chunks_encoded=c["encoded"], delta_chunks=c["delta"], chunks_copied=c["copied"],
        bytes_before=c["before"], bytes_after=c["after"], packs_written=c["packs"],
        pack_bytes_written=c["pack_bytes"], packs_retired=c["retired"], stopped=stopped,
        seconds=time.perf_counter() - started, cpu_s=time.process_time() - cpu0,
    )


# -- planning ---------------------------------------------------------------------------------


def _plan(s: Session, config: RepoConfig, compact_below: float,
          max_packs: int | None = None) -> tuple[list[str], list[str], list[_Item]]:
    """The packs to read and their chunks, in the order they are to be written (``max_packs``:
    only the oldest that many deferred packs)."""
    oldest = (select(Pack.id).where(Pack.deferred.is_(True), Pack.retired_at.is_(None))
              .order_by(Pack.created_at, Pack.id).limit(max_packs))
    deferred = sorted(s.scalars(oldest))
    sparse: list[str] = []
    if compact_below > 0:
        live = (
            select(Pack.id, Pack.size, func.coalesce(func.sum(Chunk.length), 0), func.count(Chunk.id))
            .outerjoin(Chunk, Chunk.pack_id == Pack.id)
            .where(Pack.deferred.is_(False), Pack.retired_at.is_(None))
            .group_by(Pack.id, Pack.size)
        )
        sparse = sorted(str(pid) for pid, size, used, n in s.execute(live) if n and used < compact_below * size)
    # In ``ChunkLocation``'s field order (a delta's base by its id), then ``alone_length``.
    fields = (Chunk.id, Chunk.pack_id, Chunk.offset, Chunk.length, Chunk.raw_length, Chunk.encoding, Chunk.depth,
              _BASE.id, Chunk.alone_length)
    items: list[_Item] = []
    for packs, is_deferred in ((deferred, True), (sparse, False)):
        for batch in _batches(packs):
            q = select(*fields).outerjoin(_BASE, _BASE.key == Chunk.base_key).where(Chunk.pack_id.in_(batch))
            items.extend(
                _Item(ChunkLocation(*row[:8]), row[8],
                      encode=is_deferred and config.compression and row[5] == Encoding.RAW)
                for row in s.execute(q)
            )
    _owners(s, config, [i for i in items if i.encode])
    # Oldest owner first (a chunk's base is processed before it), then pack order for copies.
    items.sort(key=lambda i: (i.order, i.loc.pack_id, i.loc.offset))
    return deferred, sparse, items


def _owners(s: Session, config: RepoConfig, items: list[_Item]) -> None:
    """Fill in, for each chunk to encode, its element size, the oldest commit and tensor
    name using it, and its delta base (same name in that commit's first parent, same seq)."""
    by_id = {i.loc.chunk_id: i for i in items}
    best: dict[str, tuple[int, str, str, int, str, str, str | None]] = {}
    ids = sorted(by_id)
    for batch in _batches(ids):
        q = (
            select(Chunk.id, TensorChunk.seq, Tensor.id, Tensor.dtype, Tensor.chunk_size,
                   Entry.commit_id, Entry.name, Commit.generation, Commit.first_parent_id)
            .select_from(Chunk)
            .join(TensorChunk, TensorChunk.chunk_key == Chunk.key)
            .join(Tensor, Tensor.key == TensorChunk.tensor_key)
            .join(Entry, Entry.tensor_key == Tensor.key)
            .join(Commit, Commit.id == Entry.commit_id)
            .where(Chunk.id.in_(batch))
        )
        for cid, seq, tid, dtype, csize, commit, name, gen, parent in s.execute(q):
            key = (int(gen), str(commit), str(name), int(seq), str(tid), str(dtype), parent)
            if cid not in best or key < best[cid]:
                best[cid] = key
            del csize
    wanted: dict[str, dict[str, list[tuple[_Item, int, str]]]] = defaultdict(lambda: defaultdict(list))
    for cid, (gen, commit, name, seq, tid, dtype, parent) in best.items():
        item = by_id[cid]
        item.order = (gen, commit, name, seq)
        item.itemsize = dtypes.dtype(dtype).itemsize or 1
        item.hint_key = tid
        if parent is not None and config.delta:
            wanted[parent][name].append((item, seq, dtype))
    # Not against a pruned commit's chunks: that would keep them live, which pruning is to free.
    pruned = {str(c) for batch in _batches(sorted(wanted))
              for c in s.scalars(select(Commit.id).where(Commit.id.in_(batch), Commit.pruned.is_(True)))}
    for parent, names in wanted.items():
        if parent in pruned:
            continue
        for name, (row, chunks) in catalog.tensors_of(s, parent, sorted(names)).items():
            for item, seq, dtype in names[name]:
                if row.dtype == dtype and row.chunk_size == config.chunk_size and seq < len(chunks):
                    item.base = chunks[seq]


def _with_dependents(s: Session, ids: Sequence[str]) -> set[str]:
    """Those of ``ids`` that some chunk row names as its delta base."""
    found: set[str] = set()
    dependent = aliased(Chunk, name="dependent")
    for batch in _batches(sorted(ids)):
        named = select(dependent.key).where(dependent.base_key == Chunk.key).exists()
        found.update(str(x) for x in s.scalars(select(Chunk.id).where(Chunk.id.in_(batch), named)))
    return found


def _batches(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i : i + _IN_BATCH] for i in range(0, len(ids), _IN_BATCH)]


# -- execution --------------------------------------------------------------------------------


def _execute(run: _Run, items: list[_Item]) -> bool:
    """Encode or copy ``items`` into new packs, recording a batch per pack; True if stopped."""
    sink = PackSink(run.backend, run.config.pack_target)
    inflight: list[tuple[_Item, Future[tuple[int, Any, int | None, ChunkLocation | None]]]] = []
    generation = None
    try:
        for item in items:
            if run.stop():
                _drop(inflight, sink, run)
                return True
            # A chunk's base belongs to an older generation: finish that one before starting this.
            if item.encode and item.order[0] != generation:
                while inflight:
                    _write(run, sink, *inflight.pop(0))
                generation = item.order[0]
            inflight.append((item, run.pool.submit(_produce, run, item)))
            if len(inflight) >= run.window:
                _write(run, sink, *inflight.pop(0))
        while inflight:
            _write(run, sink, *inflight.pop(0))
        _record(run, sink)
    except BaseException:
        _drop(inflight, sink, run)
        raise
    return False


def _drop(inflight: list[tuple[_Item, Future[Any]]], sink: PackSink, run: _Run) -> None:
    """Abandon the batch in progress: no job may outlive the run; the open pack is deleted."""
    for _, future in inflight:
        future.cancel()
    for _, future in inflight:
        if not future.cancelled():
            future.exception()
    inflight.clear()
    sink.abort()
    run.batch.clear()
    run.lease.release()  # after abort: no pack of the batch is still being put


def _produce(run: _Run, item: _Item) -> tuple[int, Any, int | None, ChunkLocation | None]:
    """(encoding, payload, standalone length of a delta, base) for one chunk (pool thread)."""
    faults.point("repack.chunk")
    loc = item.loc
    if not item.encode:
        return loc.encoding, run.backend.get_range(pack_key(loc.pack_id), loc.offset, loc.length), \
            item.alone_length, None
    raw = memoryview(bytearray(loc.raw_length))
    run.reader.read_into(loc, raw)  # verified: a damaged chunk fails the run, it is never rewritten
    base = _base(run, item)
    base_bytes = _read_base(run, item, base[0]) if base is not None else None
    if base_bytes is None or len(base_bytes) != len(raw):
        base, base_bytes = None, None
    with run.lock:
        hint = run.hints.setdefault(item.hint_key, PlaneHint())
    encoding, payload, alone = encode_with_base(raw, item.itemsize, base_bytes, level=run.config.zstd_level,
                                                hint=hint)
    if encoding == Encoding.DELTA and base is not None:
        return int(encoding), payload, alone, ChunkLocation(
            loc.chunk_id, "", 0, 0, loc.raw_length, int(encoding), base[1], base[0])
    return int(encoding), payload, None, None


def _base(run: _Run, item: _Item) -> tuple[str, int] | None:
    """The chunk to XOR ``item`` against and the depth it then has, as ingest chooses them."""
    loc = item.loc
    if item.base is None or loc.chunk_id in run.dependents:
        return None
    with run.lock:
        base = run.moved.get(item.base.chunk_id, item.base)
    if base.chunk_id == loc.chunk_id or base.raw_length != loc.raw_length:
        return None
    depth = base.depth + 1
    if depth > run.config.max_delta_depth:
        return None
    target = base.chunk_id
    if run.config.delta_base == "root" and base.base_id is not None:
        target = base.base_id  # the keyframe: standalone under this policy
    if target == loc.chunk_id:
        return None
    return target, depth


def _read_base(run: _Run, item: _Item, chunk_id: str) -> memoryview | None:
    """The bytes of ``chunk_id`` (unverified, as ingest reads bases), or None if unreadable.

    Read where this run found it (an old pack stays readable until a gc after its grace
    period) or where the index says it is."""
    loc = run.orig.get(chunk_id)
    if loc is None and item.base is not None and item.base.chunk_id == chunk_id:
        loc = item.base
    if loc is None:
        loc = run.reader.bases_for([ChunkLocation("", "", 0, 0, 0, 0, 1, chunk_id)]).get(chunk_id)
    if loc is None:
        return None
    out = memoryview(bytearray(loc.raw_length))
    try:
        run.reader.read_into(loc, out, verify=False)
    except Exception:  # a base that cannot be read only costs this chunk its delta
        return None
    return out


def _write(run: _Run, sink: PackSink, item: _Item,
           future: Future[tuple[int, Any, int | None, ChunkLocation | None]]) -> None:
    encoding, payload, alone, delta = future.result()
    loc = item.loc
    depth, base_id = (delta.depth, delta.base_id) if delta is not None else (
        (loc.depth, loc.base_id) if not item.encode else (0, None))
    data = payload
    if sink.pending_bytes + len(data) > run.config.pack_target and sink.pending_bytes:
        _record(run, sink)
    run.lease.take()  # before the batch's first chunk opens its temporary pack file
    sink.add(loc.chunk_id, encoding, data, loc.raw_length, depth=depth, base_id=base_id)
    new = ChunkLocation(loc.chunk_id, "", 0, len(data), loc.raw_length, encoding, depth, base_id)
    with run.lock:
        run.moved[loc.chunk_id] = new
    run.batch.append(_Moved(new, loc.pack_id, alone))
    c = run.counts
    c["encoded" if item.encode else "copied"] += 1
    c["delta"] += int(encoding == Encoding.DELTA and item.encode)
    c["before"] += loc.length
    c["after"] += len(data)


def _record(run: _Run, sink: PackSink) -> None:
    """Seal the open pack (write-ordering step 1), then one transaction repoints the batch's
    rows and retires old packs left without chunks (step 2)."""
    packs = sink.seal()
    batch, run.batch = run.batch, []
    if not packs:
        run.lease.release()
        return
    where: dict[str, ChunkLocation] = {loc.chunk_id: loc for p in packs for loc in p.locations}
    now = datetime.now(timezone.utc)
    params: list[dict[str, Any]] = []
    for m in batch:
        loc = where[m.loc.chunk_id]
        params.append({
            "b_id": loc.chunk_id, "b_old": m.old_pack, "b_pack": loc.pack_id, "b_offset": loc.offset,
            "b_length": loc.length, "b_encoding": loc.encoding, "b_depth": loc.depth, "b_base": loc.base_id,
            "b_alone": m.alone_length,
        })
    olds = sorted({m.old_pack for m in batch})
    with write_transaction(run.sessions) as s:
        _insert_packs(s, packs, now)
        keys = _keys_of(s, sorted({p["b_base"] for p in params if p["b_base"] is not None}))
        for p in params:
            p["b_base"] = None if p["b_base"] is None else keys[p["b_base"]]
        # Bases before their deltas: a row may name as base a chunk this batch also moves.
        params.sort(key=lambda p: (p["b_depth"], p["b_id"]))
        s.connection().execute(
            update(_CHUNKS)
            .where(_CHUNKS.c.id == bindparam("b_id"), _CHUNKS.c.pack_id == bindparam("b_old"))
            .values(pack_id=bindparam("b_pack"), offset=bindparam("b_offset"), length=bindparam("b_length"),
                    encoding=bindparam("b_encoding"), depth=bindparam("b_depth"), base_key=bindparam("b_base"),
                    alone_length=bindparam("b_alone")),
            params,
        )
        packs_t = _PACKS
        retired = s.connection().execute(
            update(packs_t)
            .where(packs_t.c.id.in_(olds), packs_t.c.retired_at.is_(None),
                   ~exists(select(_CHUNKS.c.id).where(_CHUNKS.c.pack_id == packs_t.c.id)))
            .values(retired_at=now)
        )
        faults.point("repack.before_commit")
    run.lease.release()  # rows name the new pack now: the batch's transaction committed
    faults.point("repack.after_commit")
    run.counts["packs"] += len(packs)
    run.counts["pack_bytes"] += sum(p.size for p in packs)
    run.counts["retired"] += int(retired.rowcount or 0)
    with run.lock:
        for loc in where.values():
            run.moved[loc.chunk_id] = loc


def _keys_of(s: Session, ids: Sequence[str]) -> dict[str, int]:
    """The ``key`` of each chunk of ``ids`` (the delta bases a batch names). ConcurrentChange
    when one is no longer in the chunk index (a gc removed it meanwhile): the batch fails."""
    keys = catalog.chunk_keys_of(s, ids)
    missing = [cid for cid in ids if cid not in keys]
    if missing:
        raise ConcurrentChange(what="repack", other="gc", detail=f"delta base {missing[0][:10]} was removed")
    return keys


def _insert_packs(s: Session, packs: list[SealedPack], now: datetime) -> None:
    rows = [{"id": p.pack_id, "size": p.size, "n_chunks": len(p.locations), "created_at": now, "deferred": False}
            for p in sorted(packs, key=lambda p: p.pack_id)]
    s.execute(insert_ignore(Pack), rows)
