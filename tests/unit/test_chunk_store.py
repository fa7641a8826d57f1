"""PackSink (write ordering step 1) and ChunkReader (verified reads)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import numpy as np
import pytest
import torch

from ckptrepo.chunks.chunker import chunk_spans
from ckptrepo.chunks.codecs import Encoding, encode
from ckptrepo.chunks.pack import read_index
from ckptrepo.chunks.store import ChunkReader, PackSink, SealedPack, pack_key
from ckptrepo.errors import IntegrityError, StorageError, UsageError
from ckptrepo.ids import hash_bytes
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage import Backend, LocalBackend, MemoryBackend


@pytest.fixture(params=["local", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    store: Backend = LocalBackend(tmp_path / "store") if request.param == "local" else MemoryBackend()
    yield store
    store.close()


def chunks_of(t: torch.Tensor, chunk_size: int) -> list[bytes]:
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    return [raw[o : o + n] for o, n in chunk_spans(len(raw), t.element_size(), chunk_size)]


def add_all(sink: PackSink, chunks: list[bytes], itemsize: int) -> dict[str, bytes]:
    by_id = {}
    for raw in chunks:
        cid = hash_bytes(raw)
        encoding, payload = encode(raw, itemsize)
        sink.add(cid, encoding, payload, len(raw))
        by_id[cid] = raw
    return by_id


def locations(sealed: list[SealedPack]) -> list[ChunkLocation]:
    return [loc for pack in sealed for loc in pack.locations]


def test_pack_key() -> None:
    pack_id = "ab" + "0" * 62
    assert pack_key(pack_id) == f"packs/ab/{pack_id}.pack"


def test_round_trip_through_packs(backend: Backend) -> None:
    gen = torch.Generator().manual_seed(0)
    tensors = [
        (torch.randn(300_000, generator=gen), 4),
        (torch.randn(70_001, generator=gen).to(torch.bfloat16), 2),
        (torch.randint(0, 9, (50_000,), generator=gen, dtype=torch.int64), 8),
        (torch.randint(0, 2, (90_000,), generator=gen, dtype=torch.uint8), 1),
        (torch.empty(0), 4),
    ]
    sink = PackSink(backend, 1 << 20)
    expected: dict[str, bytes] = {}
    for t, itemsize in tensors:
        expected.update(add_all(sink, chunks_of(t, 256 << 10), itemsize))
    sealed = sink.seal()
    assert sink.pending_bytes == 0
    locs = locations(sealed)
    assert {loc.chunk_id for loc in locs} == set(expected)
    assert {Encoding(loc.encoding) for loc in locs} >= {Encoding.RAW, Encoding.BYTEGROUP, Encoding.ZSTD}
    reader = ChunkReader(backend)
    for loc in locs:
        assert reader.read(loc) == expected[loc.chunk_id]
        out = bytearray(b"\xaa" * loc.raw_length)
        reader.read_into(loc, memoryview(out))
        assert out == expected[loc.chunk_id]


def test_packs_are_named_by_their_hash_and_rebuild_the_index(backend: Backend) -> None:
    sink = PackSink(backend, 1 << 20)
    add_all(sink, chunks_of(torch.randn(500_000), 128 << 10), 4)
    sealed = sink.seal()
    assert len(sealed) == 2
    for pack in sealed:
        data = backend.get(pack_key(pack.pack_id))
        index_offset = int.from_bytes(data[-52:-44], "little")
        assert blake3.blake3(data[:10] + data[index_offset:]).hexdigest() == pack.pack_id
        assert pack.size == len(data)
        rebuilt = [
            ChunkLocation(e.chunk_id, pack.pack_id, e.offset, e.length, e.raw_length, e.encoding, e.depth, e.base_id)
            for e in read_index(backend, pack_key(pack.pack_id))
        ]
        assert rebuilt == pack.locations


def test_full_packs_are_handed_off_by_add_the_rest_by_seal(backend: Backend) -> None:
    sink = PackSink(backend, 100_000)
    chunk = np.random.default_rng(1).integers(0, 256, 60_000, dtype=np.uint8).tobytes()
    sink.add(hash_bytes(chunk), Encoding.RAW, chunk, len(chunk))
    assert list(backend.list("packs/")) == []
    assert sink.pending_bytes == 10 + 60_000
    chunk2 = chunk[::-1]
    sink.add(hash_bytes(chunk2), Encoding.RAW, chunk2, len(chunk2))
    assert sink.pending_bytes == 0  # the full pack is being finished and put in the background
    chunk3 = chunk[1:] + b"!"
    sink.add(hash_bytes(chunk3), Encoding.RAW, chunk3, len(chunk3))
    assert sink.pending_bytes > 0
    sealed = sink.seal()
    assert [len(p.locations) for p in sealed] == [2, 1]
    assert sorted(backend.list("packs/")) == sorted(pack_key(p.pack_id) for p in sealed)
    assert sink.seal() == []


def test_seal_without_chunks_writes_nothing(backend: Backend) -> None:
    sink = PackSink(backend, 1 << 20)
    assert sink.seal() == []
    assert list(backend.list()) == []


def test_duplicate_chunks_in_one_batch_are_stored_once(backend: Backend) -> None:
    sink = PackSink(backend, 1 << 20)
    raw = b"same bytes" * 100
    for _ in range(3):
        sink.add(hash_bytes(raw), Encoding.RAW, raw, len(raw))
    assert [len(p.locations) for p in sink.seal()] == [1]
    sink.add(hash_bytes(raw), Encoding.RAW, raw, len(raw))
    assert [len(p.locations) for p in sink.seal()] == [1]


def test_abort_removes_the_open_pack_and_keeps_put_ones(backend: Backend) -> None:
    sink = PackSink(backend, 50_000)
    rng = np.random.default_rng(2)
    for _ in range(3):
        raw = rng.integers(0, 256, 30_000, dtype=np.uint8).tobytes()
        sink.add(hash_bytes(raw), Encoding.RAW, raw, len(raw))
    assert sink.pending_bytes > 0
    sink.abort()  # waits for the pack handed off before
    assert sink.pending_bytes == 0
    assert list(backend.staging_dir().iterdir()) == []
    assert len(list(backend.list("packs/"))) == 1
    assert sink.seal() == []


def test_failed_put_leaves_no_temp_file(tmp_path: Path) -> None:
    class FailingBackend(MemoryBackend):
        def put_file(self, key: str, local_path: Path) -> None:
            raise StorageError(detail="disk full")

    store = FailingBackend()
    sink = PackSink(store, 1 << 20)
    sink.add("ab" * 32, Encoding.RAW, b"abc", 3)
    with pytest.raises(StorageError, match="disk full"):
        sink.seal()
    assert list(store.staging_dir().iterdir()) == []


def corrupt(backend: Backend, key: str, position: int) -> None:
    data = bytearray(backend.get(key))
    data[position] ^= 0x40
    backend.put_bytes(key, bytes(data))


@pytest.mark.parametrize("kind", ["raw", "bytegroup", "zstd"])
def test_corrupt_pack_bytes_raise_integrity_error(backend: Backend, kind: str) -> None:
    if kind == "raw":
        raw, itemsize = np.random.default_rng(3).integers(0, 256, 8192, dtype=np.uint8).tobytes(), 1
    elif kind == "bytegroup":
        raw, itemsize = torch.randn(4096).numpy().tobytes(), 4
    else:
        raw, itemsize = b"compressible " * 1000, 1
    encoding, payload = encode(raw, itemsize)
    assert encoding.name.lower() == kind
    sink = PackSink(backend, 1 << 20)
    sink.add(hash_bytes(raw), encoding, payload, len(raw))
    (loc,) = locations(sink.seal())
    reader = ChunkReader(backend)
    assert reader.read(loc) == raw
    corrupt(backend, pack_key(loc.pack_id), loc.offset + loc.length - 3)
    with pytest.raises(IntegrityError) as info:
        reader.read(loc)
    assert loc.chunk_id in str(info.value) and loc.pack_id in str(info.value)
    with pytest.raises(IntegrityError):
        reader.read_into(loc, memoryview(bytearray(len(raw))))


def stored_chunk(backend: Backend, raw: bytes = b"0123456789" * 50) -> ChunkLocation:
    sink = PackSink(backend, 1 << 20)
    sink.add(hash_bytes(raw), Encoding.RAW, raw, len(raw))
    (loc,) = locations(sink.seal())
    return loc


def test_bad_locations(backend: Backend) -> None:
    loc = stored_chunk(backend)
    reader = ChunkReader(backend)
    with pytest.raises(IntegrityError):
        reader.read(loc._replace(offset=loc.offset + 1))
    with pytest.raises(IntegrityError):
        reader.read_into(loc._replace(length=loc.length - 1), memoryview(bytearray(loc.raw_length)))
    with pytest.raises(IntegrityError, match=r"delta base \w+ is missing"):
        reader.read(loc._replace(encoding=Encoding.DELTA, base_id="cd" * 32, depth=1))
    with pytest.raises(IntegrityError):
        reader.read(loc._replace(encoding=7))
    with pytest.raises(StorageError):
        reader.read(loc._replace(pack_id="ef" * 32))
    with pytest.raises(UsageError):
        reader.read_into(loc, memoryview(bytearray(loc.raw_length + 1)))


def test_a_location_whose_pack_is_gone_is_read_where_the_index_places_the_chunk_now(backend: Backend) -> None:
    # A reader looked up a delta and its base, then a commit moved the base's row to a new copy
    # and gc deleted the old pack: the read goes to the index's current places instead of failing.
    from ckptrepo.chunks.codecs import encode_with_base

    rng = np.random.default_rng(7)
    base_raw = rng.standard_normal(16_384).astype(np.float32).tobytes()
    new = np.frombuffer(base_raw, dtype=np.float32).copy()
    new[::97] += 1.0
    new_raw = new.tobytes()
    base_id, new_id = hash_bytes(base_raw), hash_bytes(new_raw)

    def pack_of(*chunks: tuple[str, bytes, bytes | None]) -> list[ChunkLocation]:
        sink = PackSink(backend, 1 << 20)
        for cid, raw, against in chunks:
            encoding, payload, _ = encode_with_base(raw, 4, against)
            sink.add(cid, encoding, payload, len(raw), depth=1 if encoding == Encoding.DELTA else 0,
                     base_id=hash_bytes(against) if encoding == Encoding.DELTA and against else None)
        return locations(sink.seal())

    (old_base,) = pack_of((base_id, base_raw, None))
    (_, moved_base) = pack_of((hash_bytes(b"x" * 64), b"x" * 64, None), (base_id, base_raw, None))  # another pack
    (delta,) = pack_of((new_id, new_raw, base_raw))
    assert delta.encoding == Encoding.DELTA and delta.base_id == base_id
    assert moved_base.pack_id != old_base.pack_id
    index = {base_id: moved_base, new_id: delta}
    reader = ChunkReader(backend, lambda ids: {i: index[i] for i in ids if i in index})
    backend.delete(pack_key(old_base.pack_id))

    assert reader.read(delta, {base_id: old_base}) == new_raw  # the stale base location is not used again
    assert reader.read(old_base) == base_raw
    out = bytearray(len(new_raw))
    reader.read_into(delta, memoryview(out), {base_id: old_base}, verify=False)
    assert out == new_raw
    index[base_id] = old_base  # the index has no other place: the store's error stands
    with pytest.raises(StorageError):
        reader.read(delta, {base_id: old_base})
    with pytest.raises(StorageError):
        ChunkReader(backend).read(old_base)  # no index to ask


def test_read_into_a_typed_buffer(backend: Backend) -> None:
    values = np.arange(256, dtype=np.float64)
    loc = stored_chunk(backend, values.tobytes())
    out = np.zeros(256, dtype=np.float64)
    ChunkReader(backend).read_into(loc, out.data)
    np.testing.assert_array_equal(out, values)


def test_concurrent_reads(backend: Backend) -> None:
    sink = PackSink(backend, 2 << 20)
    gen = torch.Generator().manual_seed(4)
    expected = add_all(sink, chunks_of(torch.randn(1_000_000, generator=gen), 64 << 10), 4)
    locs = locations(sink.seal())
    reader = ChunkReader(backend)

    def check(loc: ChunkLocation) -> bool:
        out = bytearray(loc.raw_length)
        reader.read_into(loc, memoryview(out))
        return out == expected[loc.chunk_id]

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(check, locs * 4))


def test_chunk_spans() -> None:
    assert chunk_spans(0, 4, 1024) == [(0, 0)]
    assert chunk_spans(100, 4, 1024) == [(0, 100)]
    assert chunk_spans(1024, 4, 1024) == [(0, 1024)]
    assert chunk_spans(2500, 4, 1024) == [(0, 1024), (1024, 1024), (2048, 452)]
    assert chunk_spans(30, 3, 10) == [(0, 9), (9, 9), (18, 9), (27, 3)]
    assert chunk_spans(48, 16, 10) == [(0, 16), (16, 16), (32, 16)]
    with pytest.raises(UsageError):
        chunk_spans(10, 4, 1024)
    with pytest.raises(UsageError):
        chunk_spans(8, 0, 1024)
    with pytest.raises(UsageError):
        chunk_spans(8, 4, 0)


def test_raw_chunks_are_read_straight_into_the_buffer() -> None:
    class NoRangeBackend(MemoryBackend):
        def get_range(self, key: str, offset: int, length: int) -> bytes:
            raise AssertionError("read_into of a RAW chunk must not fetch a copy")

    store = NoRangeBackend()
    loc = stored_chunk(store)
    out = bytearray(loc.raw_length)
    ChunkReader(store).read_into(loc, memoryview(out))
    assert out == b"0123456789" * 50


def test_typed_payloads_are_sized_in_bytes(backend: Backend) -> None:
    values = np.arange(1000, dtype=np.float32)
    sink = PackSink(backend, 1 << 20)
    sink.add(hash_bytes(values.tobytes()), Encoding.RAW, values.data, values.nbytes)
    (loc,) = locations(sink.seal())
    assert (loc.length, loc.raw_length) == (4000, 4000)
    assert ChunkReader(backend).read(loc) == values.tobytes()
