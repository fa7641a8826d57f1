"""Lazy sources in ingest (``ingest.sources.LazySource``, ``ingest.pipeline``) and delta bases the
caller holds (``ChunkReader.read_into(known=)``): what lets a merge commit computed tensors while
holding about one of them.

What is checked: lazy sources give the same rows, chunks and packs as eager ones of the same bytes,
mixed with eager ones too; each is produced once, in order, and its bytes are let go before the next
is produced (weak references die); a source that produces the wrong number of bytes is refused;
delta chunks decoded against bytes the caller holds equal the normal read and are still verified.
"""

from __future__ import annotations

import functools
import gc
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from ckptrepo.chunks.codecs import Encoding, encode_with_base
from ckptrepo.chunks.store import ChunkReader, PackSink
from ckptrepo.errors import IntegrityError
from ckptrepo.ids import hash_bytes
from ckptrepo.ingest.pipeline import IngestOptions, IngestResult, ingest
from ckptrepo.ingest.sources import LazySource, Source
from ckptrepo.storage import LocalBackend

CHUNK = 4096


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalBackend]:
    backend = LocalBackend(tmp_path / "store")
    yield backend
    backend.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as workers:
        yield workers


def _arrays(n: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(1000 * (i + 1)).astype(np.float32) for i in range(n)]


def _ingest(sources: list[Source | LazySource], store: LocalBackend, pool: ThreadPoolExecutor,
            compression: bool = True) -> IngestResult:
    return ingest(sources, PackSink(store, 1 << 20), lambda ids: set(), pool,
                  IngestOptions(chunk_size=CHUNK, compression=compression, lookahead=8))


@pytest.mark.parametrize("compression", [True, False])
def test_lazy_sources_store_what_eager_ones_do(store: LocalBackend, pool: ThreadPoolExecutor,
                                                compression: bool) -> None:
    arrays = _arrays()
    eager = [Source(f"t{i}", "float32", a.shape, a.data.cast("B")) for i, a in enumerate(arrays)]
    lazy: list[Source | LazySource] = [
        LazySource(f"t{i}", "float32", a.shape, functools.partial(lambda a: a.copy().data.cast("B"), a))
        for i, a in enumerate(arrays)]
    mixed: list[Source | LazySource] = [lazy[0], eager[1], eager[2], lazy[3], eager[4]]
    expected = _ingest(list(eager), store, pool, compression)
    for sources in (lazy, mixed):
        got = _ingest(sources, store, pool, compression)
        assert [(r.name, r.row) for r in got.tensors] == [(r.name, r.row) for r in expected.tensors]
        assert got.logical_bytes == expected.logical_bytes
    reader = ChunkReader(store)
    locations = {loc.chunk_id: loc for pack in expected.packs for loc in pack.locations}
    for r, a in zip(expected.tensors, arrays, strict=True):
        data = b"".join(reader.read(locations[cid]) for cid in r.row.chunk_ids)
        assert data == a.tobytes()


def test_each_lazy_source_is_produced_once_in_order_and_released_before_the_next(
        store: LocalBackend, pool: ThreadPoolExecutor) -> None:
    arrays = _arrays(6)
    alive: list[weakref.ref[np.ndarray]] = []
    order: list[int] = []

    def produce(i: int) -> memoryview:
        gc.collect()
        assert all(ref() is None for ref in alive), f"tensor {len(alive) - 1} is still held when {i} is asked for"
        order.append(i)
        fresh = arrays[i].copy()
        alive.append(weakref.ref(fresh))
        return fresh.data.cast("B")

    sources: list[Source | LazySource] = [
        LazySource(f"t{i}", "float32", a.shape, functools.partial(produce, i)) for i, a in enumerate(arrays)]
    result = _ingest(sources, store, pool)
    assert order == list(range(len(arrays)))
    assert [r.row.nbytes for r in result.tensors] == [a.nbytes for a in arrays]


def test_a_lazy_source_of_the_wrong_size_is_refused(store: LocalBackend, pool: ThreadPoolExecutor) -> None:
    bad = LazySource("t", "float32", (10,), lambda: memoryview(bytearray(36)))
    with pytest.raises(ValueError, match="produced 36 bytes, not 40"):
        _ingest([bad], store, pool)


def test_delta_chunks_decode_against_bytes_the_caller_holds(store: LocalBackend) -> None:
    rng = np.random.default_rng(1)
    base = rng.standard_normal(1024).astype(np.float32)
    child = base + rng.standard_normal(1024).astype(np.float32) * 1e-4
    base_id, child_id = hash_bytes(base.tobytes()), hash_bytes(child.tobytes())
    sink = PackSink(store, 1 << 20)
    encoding, payload, _ = encode_with_base(child.tobytes(), 4, base.tobytes())
    assert encoding == Encoding.DELTA
    sink.add(child_id, int(encoding), payload, child.nbytes, depth=1, base_id=base_id)
    (pack,) = sink.seal()
    (loc,) = pack.locations
    reader = ChunkReader(store)  # no lookup: the base is nowhere but in ``known``
    out = bytearray(child.nbytes)
    reader.read_into(loc, memoryview(out), known={base_id: memoryview(base.tobytes())})
    assert bytes(out) == child.tobytes()
    wrong = base.copy()
    wrong[0] += 1
    with pytest.raises(IntegrityError, match="hash"):  # still verified against the chunk id
        reader.read_into(loc, memoryview(out), known={base_id: memoryview(wrong.tobytes())})
    with pytest.raises(IntegrityError, match="missing from the index"):
        reader.read_into(loc, memoryview(out))
