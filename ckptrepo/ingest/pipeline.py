"""Phase 2 of a commit: chunk, hash, deduplicate, encode and pack a flattened state.

``ingest`` turns tensors into durable packs plus the rows that describe them; it
does not touch the database except through the ``known`` callback (which chunk ids
the store already has). The caller (``ingest.writer``) inserts the rows in one
transaction *after* ``ingest`` returns, which is what makes packs durable before any
row names them (the write ordering of docs/design.md). It reads bytes only (``Source``):
no torch.

Threads: stage 1 (one job per chunk: BLAKE3, and the statistics' moments unless the staging
copy took them: ``summaries``) runs up to
``lookahead`` chunks ahead on the given executor and holds only ids, since the bytes stay
in the caller's snapshot; the calling thread asks the store about the new ids in batches of
half that (one query per 32 chunks: a query per chunk cost more than hashing it), and
only the chunks the store lacks go to stage 2 (encoding, at most ``window`` encoded chunks
in memory) and are appended to packs, in order, on the calling thread. Window 6 by
measurement: the peak memory of a 1 GiB commit from a training loop then stays within the
state's copy + 300 MiB. BLAKE3, zstd, numpy and the byte-plane kernels release the GIL.

Lazy sources (``sources.LazySource``: computed tensors, a weight-space merge's) are hashed one
at a time, and each one's chunks are written before the next is produced, so the bytes of one
of them are in memory at once; eager sources go through as one run, as above. A lazy source
whose producer digested its chunks as it made them (``LazySource.digests``: a merge, chunk by
chunk) is not hashed again: its chunks' ids and moments are taken as they are.

Delta encoding: ``DeltaPlan`` names, per tensor, the base tensor's chunks (the same
name in the first parent, or the mapped tensor of a transfer source). A chunk whose
base has the same length and a chain shorter than ``max_depth`` is also encoded as a difference
against the base's bytes (from the ``BaseCache`` or decoded from the store) and stored
that way when that is smaller than its standalone encoding.

Keyframes out of a follower's way (``DeltaPlan.restore``: commits for followers, policy
``parent``): a chunk whose base is at ``max_depth`` is not stored standalone. The *base*'s bytes
(decoded already, and checked against its id here) are stored again, standalone, in this commit's
packs, and the chunk as a depth-1 delta against them; ``IngestResult.restored`` names such bases,
whose catalog rows the commit's transaction moves to the new, shallower copy
(``db.catalog.relocate_chunks``). A follower holds the base's bytes and reads only the delta.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ckptrepo import dtypes, faults
from ckptrepo.chunks.chunker import grid_spans, spans_of
from ckptrepo.chunks.codecs import Encoding, PlaneHint, encode_with_base
from ckptrepo.chunks.store import ChunkReader, PackSink, SealedPack
from ckptrepo.errors import CkptError, UsageError
from ckptrepo.ids import hash_bytes, tensor_id
from ckptrepo.ingest.basecache import BaseCache
from ckptrepo.ingest.sources import Digest, LazySource, Source
from ckptrepo.ingest.stats import Moments, combine, merged, moments_of_bytes
from ckptrepo.locations import ChunkLocation
from ckptrepo.rows import TensorRow

if TYPE_CHECKING:
    from ckptrepo.ingest.writeahead import WriteAhead

log = logging.getLogger("ckptrepo")

KnownFn = Callable[[list[str]], set[str]]


@dataclass(frozen=True, slots=True)
class Ingested:
    """One source of the commit after ingest: its entry name, the row it makes and the mergeable
    summary of the row's statistics (``moments``). A piece of a tensor (``box`` and ``start`` as
    its ``Source`` has them) makes the row of that piece alone, under the tensor's dtype and
    shape: its chunks, bytes and statistics, which ``distributed.merge`` assembles, with the
    other pieces', into the tensor's row."""

    name: str
    row: TensorRow
    moments: Moments
    box: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    start: int | None = None


@dataclass
class IngestResult:
    """What ``ingest`` made durable, and the figures of that work."""

    tensors: list[Ingested]
    packs: list[SealedPack]
    logical_bytes: int = 0
    new_bytes: int = 0
    stored_bytes: int = 0
    nonfinite: int = 0
    new_chunk_ids: set[str] = field(default_factory=set)
    alone_lengths: dict[str, int] = field(default_factory=dict)  # delta chunks' standalone sizes
    delta_chunks: int = 0
    deferred: bool = False  # stored raw for ``repack`` to encode (set by the caller)
    restored: set[str] = field(default_factory=set)  # stored chunks stored again standalone (bases)


@dataclass(frozen=True)
class BaseTensor:
    """The tensor a commit's tensor is delta-encoded against: its dtype name, chunking, chunks
    and the byte of its stream where each chunk starts (``at``); ``boxed``: stored as boxes."""

    dtype: str
    chunk_size: int
    chunks: list[ChunkLocation]
    boxed: bool = False

    @functools.cached_property
    def at(self) -> dict[int, ChunkLocation]:
        out, offset = {}, 0
        for loc in self.chunks:
            out[offset] = loc
            offset += loc.raw_length
        return out


@dataclass
class DeltaPlan:
    """Where delta bases come from: base tensors by name, the reader that decodes them
    (with every chain location they need), the cache of recent chunks, the chain bound.
    ``restore`` (policy ``parent`` only): a base at ``max_depth`` is stored again standalone
    and the chunk made a depth-1 delta against it (module docstring), instead of the chunk
    being stored standalone."""

    tensors: dict[str, BaseTensor]
    reader: ChunkReader
    chain: dict[str, ChunkLocation]
    cache: BaseCache
    max_depth: int
    policy: str = "parent"
    restore: bool = False


@dataclass(frozen=True)
class IngestOptions:
    """Knobs of one ingest: chunk size, compression on/off and zstd level, encoded chunks in
    flight (``window``), chunks hashed ahead (``lookahead``; looked up in halves)."""

    chunk_size: int
    compression: bool = True
    zstd_level: int = 1
    window: int = 6
    lookahead: int = 64
    min_saving: float = 0.05


def ingest(
    sources: Sequence[Source | LazySource],
    sink: PackSink,
    known: KnownFn,
    pool: Executor,
    opts: IngestOptions,
    likely_known: frozenset[str] = frozenset(),
    delta: DeltaPlan | Future[DeltaPlan] | None = None,
    hints: dict[str, PlaneHint] | None = None,
    ahead: WriteAhead | None = None,
    summaries: list[Moments | None] | None = None,
) -> IngestResult:
    """Store every tensor's chunks that the store lacks; return their records and packs.

    ``sources`` are bytes nobody mutates until this returns (the caller's snapshot), or
    ``LazySource`` s, whose bytes are asked for when the ingest reaches each and dropped once its
    chunks are written or found stored (one at a time: memory holds about one of them).
    ``likely_known`` (usually the parent commit's chunk ids) skips encoding of chunks that
    will deduplicate; ``known`` is asked about every other chunk before
    it is written. With ``delta``, chunks are also tried as deltas against their base
    (a base that cannot be read is skipped, never fatal); a plan still being computed (a
    future) lets hashing start at once and is waited for before the first chunk is encoded.
    ``hints`` (by tensor name) carries what encoding learnt about
    each tensor into later ingests of the same name — which byte planes pay, its standalone
    ratio, whether deltas win — so a commit of a state seen before samples less; entries
    are added for new names. ``summaries``: each chunk's moments in order (tensor by tensor,
    chunk by chunk; None where not taken), as the staging copy took them
    (``Slot.copy_summarized``); stage 1 only hashes those chunks. With ``ahead`` (raw chunks
    only: ``compression`` off), a new chunk of a tensor it writes ahead is indexed there
    instead of written again, and its packs are sealed with the sink's. On any error nothing has been
    inserted anywhere; packs already put in the backend stay unreferenced (``gc``
    reclaims them) and the sink is aborted.
    """
    if ahead is not None and opts.compression:
        raise UsageError("a write-ahead holds raw chunks: it needs compression off")
    job = _Ingest(sink, known, pool, opts, likely_known, delta, hints, ahead)
    try:
        return job.run(sources, summaries)
    except BaseException:
        job.drain()  # no job of this ingest may read the snapshot once it is released
        sink.abort()
        if ahead is not None:
            ahead.close()
        raise


_GROUP_BYTES = 4 << 20  # stage-1 jobs take consecutive chunks up to this many bytes ...
_GROUP_CHUNKS = 16  # ... or this many chunks
_AHEAD_LOOKUP = 256  # chunks per store lookup when a write-ahead already writes the new ones


def _runs(sources: Sequence[Source | LazySource]) -> list[tuple[int, int]]:
    """``[start, stop)`` of the runs ``_Ingest.run`` hashes in one go: consecutive eager sources
    together, each lazy one alone (a list of eager sources is one run, as before lazy ones)."""
    runs: list[tuple[int, int]] = []
    for i, src in enumerate(sources):
        if runs and not isinstance(src, LazySource) and not isinstance(sources[i - 1], LazySource):
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _bytes_of(src: Source | LazySource) -> memoryview:
    """A source's bytes: held by an eager one, made now by a lazy one (checked against its shape)."""
    if isinstance(src, Source):
        return src.data
    view = src.produce()
    expected = src.numel * dtypes.dtype(src.dtype).itemsize
    if len(view) != expected:
        raise ValueError(f"lazy source {src.name!r} produced {len(view)} bytes, not {expected}")
    return view


def _digests_of(src: Source | LazySource, spans: list[tuple[int, int]]) -> list[Digest] | None:
    """A lazy source's own digests of the bytes it just produced, when they are cut at ``spans``."""
    if not isinstance(src, LazySource) or src.digests is None:
        return None
    found = src.digests()
    if found is None or len(found) != len(spans) or any(
            (d[0], d[1]) != span for d, span in zip(found, spans, strict=True)):
        return None
    return found


_NO_MOMENTS = Moments()  # a placeholder, replaced by each chunk's own (frozen: shared safely)
# (tensor index, chunk seq, offset in it, bytes, dtype name, its moments if the staging copy took them)
_Job = tuple[int, int, int, memoryview, str, Moments | None]


@dataclass
class _Hashed:
    """A chunk after stage 1: its place, bytes (a view of the snapshot), id and statistics."""

    tensor: int
    seq: int
    offset: int  # of the chunk in its tensor's bytes
    raw: memoryview
    dtype: str
    chunk_id: str
    moments: Moments


@dataclass
class _Encoded:
    """A chunk after stage 2: its encoded payload, which a pack turns into a ``ChunkLocation``."""

    chunk_id: str
    encoding: int
    payload: Any
    raw_length: int
    depth: int = 0
    base_id: str | None = None
    alone_length: int | None = None
    restored: _Encoded | None = None  # the base's own standalone copy, written before this chunk


class _Ingest:
    """One ingest in two stages on the pool, consumed in order on the calling thread.

    Stage 1 hashes each chunk and summarises it for the statistics, up to ``lookahead``
    chunks ahead (it holds only ids: the bytes stay in the caller's snapshot). The calling
    thread checks the new ids against the store in batches of ``lookahead // 2`` (one
    query for many chunks instead of one per few; 256 when a write-ahead already writes the
    new chunks and nothing is encoded), and only chunks the store lacks go to
    stage 2, encoding, bounded by ``window`` encoded chunks in memory; they are appended to
    packs in order. Deduplicated chunks thus cost no encoding at all.
    """

    def __init__(self, sink: PackSink, known: KnownFn, pool: Executor, opts: IngestOptions,
                 likely_known: frozenset[str], delta: DeltaPlan | Future[DeltaPlan] | None,
                 hints: dict[str, PlaneHint] | None = None,
                 ahead: WriteAhead | None = None) -> None:
        self.sink, self.known, self.pool, self.opts, self.likely = sink, known, pool, opts, likely_known
        self.ahead = ahead
        self.delta: DeltaPlan | None = None
        self.cache: BaseCache | None = None
        self.pending_plan = delta if isinstance(delta, Future) else None
        if isinstance(delta, DeltaPlan):
            self._use_plan(delta)
        self.names: list[str] = []
        self.dtypes: list[str] = []
        self.bases: list[BaseTensor | None] = []
        self.starts: list[int | None] = []  # each source's byte in its tensor's stream (None: a box)
        self.hints: list[PlaneHint] = []
        self.known_hints = hints if hints is not None else {}
        self.queued: set[str] = set()
        self.restored: set[str] = set()  # bases this ingest stored again standalone
        self.hashing: deque[Future[list[_Hashed]]] = deque()
        self.encoding: deque[Future[_Encoded]] = deque()

    def drain(self) -> None:
        """Cancel the jobs not started and wait for the others, ignoring their outcome."""
        pending: list[Future[Any]] = [*self.hashing, *self.encoding]
        if self.pending_plan is not None:
            pending.append(self.pending_plan)
        for future in pending:
            future.cancel()
        for future in pending:
            if not future.cancelled():
                future.exception()

    def _use_plan(self, plan: DeltaPlan | None) -> None:
        self.delta = plan if self.opts.compression else None
        self.cache = self.delta.cache if self.delta is not None and self.delta.cache.budget else None

    def _plan_bases(self) -> None:
        """Resolve a plan given as a future (at the first chunk to encode) and name each
        tensor's base."""
        if self.pending_plan is not None:
            pending, self.pending_plan = self.pending_plan, None
            self._use_plan(pending.result())
        if len(self.bases) == len(self.names):
            return
        for name, dtype in zip(self.names, self.dtypes, strict=True):
            base = self.delta.tensors.get(name) if self.delta is not None else None
            ok = base is not None and base.dtype == dtype and base.chunk_size == self.opts.chunk_size
            self.bases.append(base if ok else None)

    def run(self, sources: Sequence[Source | LazySource],
            summaries: list[Moments | None] | None = None) -> IngestResult:
        names = [s.name for s in sources]
        self.names, self.dtypes = names, [s.dtype for s in sources]
        known = self.known_hints
        for name in names:
            hint = known.get(name)
            if hint is None:
                hint = known[name] = PlaneHint()
            self.hints.append(hint)
        ids: list[list[str]] = [[] for _ in sources]
        parts: list[list[Moments]] = [[] for _ in sources]
        sizes = [0] * len(sources)
        chunk = self.opts.chunk_size
        self.starts = [0 if isinstance(s, LazySource) or s.box is None else s.start for s in sources]
        runs = _runs(sources)
        if summaries is not None and len(runs) > 1:
            raise ValueError("chunk summaries are taken by a staging copy: not for lazy sources")
        if summaries and not runs:
            raise ValueError(f"{len(summaries)} chunk summaries given for 0 chunks")
        result = IngestResult(tensors=[], packs=[], new_chunk_ids=self.queued, restored=self.restored)
        hashing = self.hashing
        batch: list[_Hashed] = []
        # Lookups feed the encoding (and raw writes) as early as possible, in batches of
        # half the lookahead; with a write-ahead (nothing is encoded, see ``ingest``) the
        # chunks are being written already and a lookup only indexes them: fewer, larger ones.
        step = _AHEAD_LOOKUP if self.ahead is not None else max(1, self.opts.lookahead // 2)

        def take(h: _Hashed) -> None:
            ids[h.tensor][h.seq] = h.chunk_id
            parts[h.tensor][h.seq] = h.moments
            batch.append(h)
            if len(batch) >= step:
                self._resolve(batch, result)
                batch.clear()

        # Stage-1 jobs take runs of consecutive chunks (small tensors especially: a future per
        # chunk costs the interpreter lock more than hashing it).
        in_flight = 0  # chunks submitted to stage 1 and not yet taken
        group: list[_Job] = []
        size = 0

        def submit() -> None:
            nonlocal group, size, in_flight
            hashing.append(self.pool.submit(self._hash_group, group))
            in_flight += len(group)
            group, size = [], 0
            while in_flight >= self.opts.lookahead:
                done = hashing.popleft().result()
                in_flight -= len(done)
                for h in done:
                    take(h)

        def feed(jobs: list[_Job]) -> None:
            nonlocal size
            for job in jobs:
                group.append(job)
                size += len(job[3])
                if size >= _GROUP_BYTES or len(group) >= _GROUP_CHUNKS:
                    submit()
            if group:
                submit()

        def drain() -> None:
            nonlocal in_flight
            while hashing:
                for h in hashing.popleft().result():
                    take(h)
            in_flight = 0

        def adopt(i: int, dtype: str, view: memoryview, digests: list[Digest]) -> None:
            for seq, (off, ln, cid, moments) in enumerate(digests):
                faults.point("ingest.chunk")
                raw = view[off : off + ln]
                if self.cache is not None and cid in self.likely:
                    self.cache.put(cid, raw)
                take(_Hashed(i, seq, off, raw, dtype, cid, moments))

        # Eager sources (their bytes held by the caller) are one run; each lazy source is a run of
        # its own, whose bytes exist from its ``produce()`` until every chunk of it is written.
        for first, stop in runs:
            jobs: list[_Job] = []
            for i in range(first, stop):
                src = sources[i]
                view = _bytes_of(src)
                sizes[i] = len(view)
                itemsize = dtypes.dtype(src.dtype).itemsize
                if isinstance(src, Source) and src.box is not None and src.start is not None:
                    spans = grid_spans(len(view), src.start, itemsize, chunk)
                else:
                    spans = spans_of(len(view), itemsize, chunk)
                ids[i] = [""] * len(spans)
                parts[i] = [_NO_MOMENTS] * len(spans)
                known_digests = _digests_of(src, spans)
                if known_digests is not None:  # hashed by its producer, cut as here: taken as they are
                    adopt(i, src.dtype, view, known_digests)
                    del view
                    continue
                jobs.extend((i, seq, off, view[off : off + ln], src.dtype, None) for seq, (off, ln) in enumerate(spans))
                del view
            if summaries is not None:
                if len(summaries) != len(jobs):
                    raise ValueError(f"{len(summaries)} chunk summaries given for {len(jobs)} chunks")
                jobs = [(*job[:5], m) for job, m in zip(jobs, summaries, strict=True)]
            feed(jobs)  # in functions: no loop variable outlives them holding a view of the bytes
            del jobs
            drain()
            if isinstance(sources[first], LazySource):  # its chunks written: its bytes may go
                self._resolve(batch, result)
                batch.clear()
                while self.encoding:
                    self._write(self.encoding.popleft().result(), result)
        self._resolve(batch, result)
        self._plan_bases()  # a pending plan is waited for even when nothing needed encoding
        while self.encoding:
            self._write(self.encoding.popleft().result(), result)
        for i, src in enumerate(sources):
            shape = list(src.shape)
            total = merged(parts[i])
            stats = combine([total], sizes[i] // dtypes.dtype(src.dtype).itemsize)
            row = TensorRow(tensor_id=tensor_id(src.dtype, shape, self.opts.chunk_size, ids[i]), dtype=src.dtype,
                            shape=shape, nbytes=sizes[i], chunk_size=self.opts.chunk_size, chunk_ids=ids[i],
                            stats=stats)
            box, start = (None, None) if isinstance(src, LazySource) else (src.box, src.start)
            result.tensors.append(Ingested(name=src.name, row=row, moments=total, box=box, start=start))
            result.logical_bytes += sizes[i]
            result.nonfinite += stats["nan_count"] + stats["inf_count"]
        result.packs = self.sink.seal()
        if self.ahead is not None:
            result.packs += self.ahead.seal()
        if self.delta is not None:
            self.delta.cache.rotate()
        return result

    def _hash_group(self, group: list[_Job]) -> list[_Hashed]:
        """Stage 1 for consecutive chunks, in order: one job for several chunks (small tensors
        especially) costs the interpreter lock less than a future per chunk."""
        out = []
        for tensor, seq, offset, raw, dtype, summary in group:
            faults.point("ingest.chunk")
            cid = hash_bytes(raw)
            if self.cache is not None and cid in self.likely:
                self.cache.put(cid, raw)  # unchanged: the next commit's base (or its root's place)
            moments = summary if summary is not None else moments_of_bytes(raw, dtype)
            out.append(_Hashed(tensor, seq, offset, raw, dtype, cid, moments))
        return out

    def _resolve(self, batch: list[_Hashed], result: IngestResult) -> None:
        """Send the batch's chunks that neither this ingest nor the store has to stage 2."""
        fresh: dict[str, _Hashed] = {}
        for h in batch:
            if h.chunk_id not in self.likely and h.chunk_id not in self.queued:
                fresh.setdefault(h.chunk_id, h)
        have = self.known(list(fresh)) if fresh else set()
        if len(have) < len(fresh):
            self._plan_bases()
        for cid, h in fresh.items():
            if cid in have:
                if self.cache is not None:
                    self.cache.put(cid, h.raw)
                continue
            self.queued.add(cid)
            if not self.opts.compression and not self.encoding:
                # Stored as they are: no encoding job, whose round trip through the pool (behind
                # the hashing jobs queued there) would only delay the pack writes.
                if self.ahead is not None and self.ahead.add(h.tensor, h.offset, cid, len(h.raw)):
                    result.new_bytes += len(h.raw)  # already being written: only indexed
                    result.stored_bytes += len(h.raw)
                    continue
                self._write(_Encoded(cid, Encoding.RAW, h.raw, len(h.raw)), result)
                continue
            self.encoding.append(self.pool.submit(self._encode, h))
            if len(self.encoding) >= self.opts.window:
                self._write(self.encoding.popleft().result(), result)

    def _write(self, d: _Encoded, result: IngestResult) -> None:
        b = d.restored
        if b is not None and b.chunk_id not in self.restored and b.chunk_id not in self.queued:
            # The base first: every pack is durable before the transaction that names any of them.
            self.sink.add(b.chunk_id, b.encoding, b.payload, b.raw_length)
            self.restored.add(b.chunk_id)
            result.stored_bytes += len(b.payload)
        self.sink.add(d.chunk_id, d.encoding, d.payload, d.raw_length, depth=d.depth, base_id=d.base_id)
        result.new_bytes += d.raw_length
        result.stored_bytes += len(d.payload)
        if d.alone_length is not None:
            result.alone_lengths[d.chunk_id] = d.alone_length
            result.delta_chunks += 1

    def _base(self, tensor: int, offset: int,
              length: int) -> tuple[ChunkLocation, int, bytes | memoryview, bool] | None:
        """The delta base of a chunk at byte ``offset`` of its source: the base tensor's chunk
        at the same byte of its stream, the new chunk's depth, the base's decoded bytes and
        whether the base is to be stored again standalone (``DeltaPlan.restore``: its chain is
        full), or None (no base, chain full, or the base cannot be read)."""
        plan, base, start = self.delta, self.bases[tensor], self.starts[tensor]
        if plan is None or base is None or base.boxed or start is None:
            return None
        loc = base.at.get(start + offset)
        if loc is None or loc.raw_length != length:
            return None
        restore = loc.depth + 1 > plan.max_depth
        if restore and not (plan.restore and plan.policy == "parent" and plan.max_depth >= 1):
            return None
        depth = 1 if restore else loc.depth + 1
        if plan.policy == "root" and loc.base_id is not None:
            root = plan.chain.get(loc.base_id)
            if root is None:
                return None
            loc = root
        data: bytes | memoryview | None = plan.cache.get(loc.chunk_id)
        if data is None:
            data = memoryview(bytearray(length))  # this chunk's own: no copy into bytes
            try:
                plan.reader.read_into(loc, data, plan.chain, verify=False)
            except CkptError as exc:  # a damaged base only costs this chunk its delta
                log.warning("delta base %s unreadable, storing standalone: %s", loc.chunk_id[:12], exc)
                return None
        if restore and hash_bytes(data) != loc.chunk_id:
            # Stored again under its id, these bytes must be the chunk's: else no delta at all.
            log.warning("delta base %s does not match its id, storing standalone", loc.chunk_id[:12])
            return None
        return loc, depth, data, restore

    def _encode(self, h: _Hashed) -> _Encoded:
        raw, cid, tensor = h.raw, h.chunk_id, h.tensor
        if not self.opts.compression:
            return _Encoded(cid, Encoding.RAW, raw, len(raw))
        itemsize = dtypes.dtype(h.dtype).itemsize
        # A tensor whose chunks lately lost as deltas (e.g. Adam's first moments) skips the
        # base fetch and the delta encode, except for a periodic retry.
        try_delta = len(raw) > 0 and self.hints[tensor].try_delta()
        base = self._base(tensor, h.offset, len(raw)) if try_delta else None
        encoding, payload, alone = encode_with_base(
            raw, itemsize, base[2] if base is not None else None,
            level=self.opts.zstd_level, min_saving=self.opts.min_saving, hint=self.hints[tensor],
        )
        cache = self.cache
        if encoding == Encoding.DELTA and base is not None:
            restored = None
            if base[3]:  # the base's chain is full: the base itself stored again, standalone
                b_enc, b_payload, _ = encode_with_base(base[2], itemsize, None, level=self.opts.zstd_level,
                                                       min_saving=self.opts.min_saving, hint=self.hints[tensor])
                restored = _Encoded(base[0].chunk_id, int(b_enc), b_payload, len(base[2]))
            if cache is not None:
                # The next commit's base: this chunk (policy parent) or the same keyframe (root).
                if self.delta is not None and self.delta.policy == "root":
                    cache.put(base[0].chunk_id, base[2])
                else:
                    cache.put(cid, raw)
            return _Encoded(cid, int(encoding), payload, len(raw),
                            depth=base[1], base_id=base[0].chunk_id, alone_length=alone, restored=restored)
        if cache is not None:
            cache.put(cid, raw)  # stored standalone: a keyframe for the next commits
        return _Encoded(cid, int(encoding), payload, len(raw))
