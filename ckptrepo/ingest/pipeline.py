"""Phase 2 of a commit: chunk, hash, deduplicate, encode and pack a flattened state.

``ingest`` turns tensors into durable packs plus the rows that describe them; it
does not touch the database except through the ``known`` callback (which chunk ids
the store already has). The caller (``repository``) inserts the rows in one
transaction *after* ``ingest`` returns, which is what makes packs durable before any
row names them (write ordering, DESIGN.md).

Threads: hashing, statistics and encoding run on the given executor (BLAKE3, zstd,
numpy and torch release the GIL); appending to packs happens on the calling thread,
in order, with at most ``window`` encoded chunks held in memory at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptrepo import state as st
from ckptrepo.chunks.chunker import chunk_spans
from ckptrepo.chunks.codecs import Encoding, encode
from ckptrepo.chunks.store import PackSink, SealedPack
from ckptrepo.ids import hash_bytes, hash_json
from ckptrepo.ingest.stats import tensor_stats

KnownFn = Callable[[list[str]], set[str]]


@dataclass
class TensorRecord:
    """One distinct tensor of the commit: identity, layout, chunk ids and statistics."""

    name: str
    tensor_id: str
    dtype: str
    shape: list[int]
    nbytes: int
    chunk_size: int
    chunk_ids: list[str]
    stats: dict[str, Any]


@dataclass
class IngestResult:
    """What ``ingest`` made durable, and the figures of that work."""

    tensors: list[TensorRecord]
    packs: list[SealedPack]
    logical_bytes: int = 0
    new_bytes: int = 0
    stored_bytes: int = 0
    nonfinite: int = 0
    new_chunk_ids: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class IngestOptions:
    """Knobs of one ingest: chunk size, compression on/off and zstd level, in-flight window."""

    chunk_size: int
    compression: bool = True
    zstd_level: int = 1
    window: int = 16


def ingest(
    tensors: dict[str, torch.Tensor],
    sink: PackSink,
    known: KnownFn,
    pool: Executor,
    opts: IngestOptions,
) -> IngestResult:
    """Store every tensor's chunks that the store lacks; return their records and packs.

    ``tensors`` must be CPU tensors that nobody mutates until this returns (the caller's
    snapshot). On any error nothing has been inserted anywhere; packs already put in the
    backend stay unreferenced (``gc`` reclaims them) and the sink is aborted.
    """
    try:
        return _ingest(tensors, sink, known, pool, opts)
    except BaseException:
        sink.abort()
        raise


def _ingest(
    tensors: dict[str, torch.Tensor], sink: PackSink, known: KnownFn, pool: Executor, opts: IngestOptions
) -> IngestResult:
    views: dict[str, memoryview] = {}
    hash_jobs: dict[str, list[Future[str]]] = {}
    stat_jobs: dict[str, Future[dict[str, Any]]] = {}
    spans_of: dict[str, list[tuple[int, int]]] = {}
    for name, t in tensors.items():
        view = st.tensor_bytes(t)
        views[name] = view
        spans = chunk_spans(len(view), t.element_size(), opts.chunk_size)
        spans_of[name] = spans
        hash_jobs[name] = [pool.submit(hash_bytes, view[off : off + ln]) for off, ln in spans]
        stat_jobs[name] = pool.submit(tensor_stats, t.reshape(-1) if t.dim() else t)

    records: list[TensorRecord] = []
    for name, t in tensors.items():
        chunk_ids = [f.result() for f in hash_jobs[name]]
        dtype = st.dtype_name(t.dtype)
        shape = list(t.shape)
        records.append(
            TensorRecord(
                name=name,
                tensor_id=hash_json([dtype, shape, opts.chunk_size, chunk_ids]),
                dtype=dtype,
                shape=shape,
                nbytes=len(views[name]),
                chunk_size=opts.chunk_size,
                chunk_ids=chunk_ids,
                stats=stat_jobs[name].result(),
            )
        )

    all_ids = list(dict.fromkeys(cid for r in records for cid in r.chunk_ids))
    have = known(all_ids)
    todo: list[tuple[str, memoryview, int]] = []
    queued: set[str] = set()
    for rec in records:
        itemsize = tensors[rec.name].element_size()
        for cid, (off, ln) in zip(rec.chunk_ids, spans_of[rec.name], strict=True):
            if cid in have or cid in queued:
                continue
            queued.add(cid)
            todo.append((cid, views[rec.name][off : off + ln], itemsize))

    result = IngestResult(tensors=records, packs=[], new_chunk_ids=queued)
    result.logical_bytes = sum(r.nbytes for r in records)
    result.nonfinite = sum(r.stats["nan_count"] + r.stats["inf_count"] for r in records)
    for cid, encoding, payload, raw_len in _encode_in_order(todo, pool, opts):
        sink.add(cid, encoding, payload, raw_len)
        result.new_bytes += raw_len
        result.stored_bytes += len(payload)
    result.packs = sink.seal()
    return result


def _encode_one(cid: str, raw: memoryview, itemsize: int, opts: IngestOptions) -> tuple[str, int, Any, int]:
    if not opts.compression:
        return cid, Encoding.RAW, raw, len(raw)
    encoding, payload = encode(raw, itemsize, level=opts.zstd_level)
    return cid, int(encoding), payload, len(raw)


def _encode_in_order(
    todo: Iterable[tuple[str, memoryview, int]], pool: Executor, opts: IngestOptions
) -> Iterable[tuple[str, int, Any, int]]:
    """Encode on the pool, yield in submission order, never more than ``window`` ahead."""
    pending: deque[Future[tuple[str, int, Any, int]]] = deque()
    for cid, raw, itemsize in todo:
        pending.append(pool.submit(_encode_one, cid, raw, itemsize, opts))
        if len(pending) >= opts.window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()
