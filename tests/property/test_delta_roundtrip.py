"""Delta encoding (word difference or XOR) against any base, every dtype width, chains up to the bound — bit-exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from ckptrepo.chunks import codecs
from ckptrepo.chunks.codecs import Encoding, decode, decode_delta, encode_with_base
from ckptrepo.chunks.store import ChunkReader, PackSink
from ckptrepo.errors import IntegrityError
from ckptrepo.ids import hash_bytes
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage import MemoryBackend

WIDTHS = [1, 2, 3, 4, 8, 16]


def _decode_any(encoding: Encoding, payload: bytes | memoryview, base: bytes | None, n: int) -> bytes:
    out = bytearray(n)
    if encoding == Encoding.DELTA:
        assert base is not None
        decode_delta(payload, base, memoryview(out))
    else:
        decode(encoding, payload, n, memoryview(out))
    return bytes(out)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    width=hst.sampled_from(WIDTHS),
    base=hst.binary(min_size=0, max_size=3000),
    flips=hst.lists(hst.tuples(hst.integers(0, 2999), hst.integers(1, 255)), max_size=40),
    mode=hst.sampled_from(["flips", "random", "zeros"]),
)
def test_delta_against_any_base_round_trips(width: int, base: bytes, flips: list[tuple[int, int]], mode: str) -> None:
    if mode == "random":
        raw = np.random.default_rng(len(base)).integers(0, 256, len(base), dtype=np.uint8).tobytes()
    elif mode == "zeros":
        raw = bytes(len(base))
    else:
        data = bytearray(base)
        for pos, bits in flips:
            if data:
                data[pos % len(data)] ^= bits
        raw = bytes(data)
    encoding, payload, alone = encode_with_base(raw, width, base)
    assert _decode_any(encoding, payload, base, len(raw)) == raw
    if encoding == Encoding.DELTA:
        assert len(payload) < 0.95 * alone  # delta only wins when it saves on the standalone choice


@settings(max_examples=60, deadline=None)
@given(
    width=hst.sampled_from([2, 4, 8]),
    n=hst.integers(1, 5000),
    scale=hst.sampled_from([1e-7, 1e-4, 1e-2]),
    seed=hst.integers(0, 2**16),
)
def test_related_floats_prefer_delta(width: int, n: int, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    dtype = {2: np.float16, 4: np.float32, 8: np.float64}[width]
    base = rng.normal(0, 0.02, n).astype(dtype)
    new = (base.astype(np.float64) * (1 + rng.normal(0, scale, n))).astype(dtype)
    encoding, payload, _ = encode_with_base(new.tobytes(), width, base.tobytes())
    assert _decode_any(encoding, payload, base.tobytes(), new.nbytes) == new.tobytes()
    if scale <= 1e-4 and n >= 256:
        assert encoding == Encoding.DELTA


def _chain(depth: int, width: int, n: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 0.02, n // width).astype(np.float32 if width == 4 else np.float16)
    versions = [x.tobytes()]
    for _ in range(depth):
        x = (x * (1 + rng.normal(0, 1e-4, x.shape))).astype(x.dtype)
        versions.append(x.tobytes())
    return versions


def _store_chain(versions: list[bytes], width: int) -> tuple[MemoryBackend, dict[str, ChunkLocation]]:
    """Store each version as a delta against the one before (the first standalone)."""
    backend = MemoryBackend()
    sink = PackSink(backend, 1 << 20)
    prev: tuple[str, int] | None = None
    for version in versions:
        cid = hash_bytes(version)
        base = versions[versions.index(version) - 1] if prev is not None else None
        encoding, payload, _ = encode_with_base(version, width, base)
        if prev is not None:
            assert encoding == Encoding.DELTA
            sink.add(cid, encoding, payload, len(version), depth=prev[1] + 1, base_id=prev[0])
            prev = (cid, prev[1] + 1)
        else:
            sink.add(cid, encoding, payload, len(version))
            prev = (cid, 0)
    locations = {loc.chunk_id: loc for pack in sink.seal() for loc in pack.locations}
    return backend, locations


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("depth", [1, 3, 8])
def test_chains_up_to_the_bound_round_trip(width: int, depth: int) -> None:
    versions = _chain(depth, width, 40_000, seed=depth)
    backend, locations = _store_chain(versions, width)
    lookups: list[int] = []

    def lookup(ids: object) -> dict[str, ChunkLocation]:
        wanted = list(ids)  # type: ignore[call-overload]
        lookups.append(len(wanted))
        return {i: locations[i] for i in wanted if i in locations}

    reader = ChunkReader(backend, lookup)
    last = locations[hash_bytes(versions[-1])]
    assert last.depth == depth and last.encoding == Encoding.DELTA
    bases = reader.bases_for([last])
    assert len(bases) == depth and len(lookups) == depth  # one lookup per chain level
    for version in versions:
        assert reader.read(locations[hash_bytes(version)], bases) == version
    # Without a prepared mapping the reader asks its lookup as it walks.
    assert ChunkReader(backend, lookup).read(last) == versions[-1]


def test_a_corrupt_base_fails_the_hash_check_not_silently() -> None:
    versions = _chain(2, 4, 40_000, seed=7)
    backend, locations = _store_chain(versions, 4)
    root = locations[hash_bytes(versions[0])]
    key = f"packs/{root.pack_id[:2]}/{root.pack_id}.pack"
    blob = bytearray(backend.get_range(key, 0, backend.size(key)))
    blob[root.offset + root.length // 2] ^= 0x10  # inside the root's stored mantissa planes
    backend.put_bytes(key, bytes(blob))
    reader = ChunkReader(backend, lambda ids: {i: locations[i] for i in ids if i in locations})
    last = locations[hash_bytes(versions[-1])]
    with pytest.raises(IntegrityError, match="delta against"):
        reader.read(last)


def test_a_missing_base_is_an_integrity_error() -> None:
    versions = _chain(1, 4, 4000, seed=3)
    backend, locations = _store_chain(versions, 4)
    last = locations[hash_bytes(versions[-1])]
    with pytest.raises(IntegrityError, match="missing"):
        ChunkReader(backend, lambda ids: {}).read(last)


@pytest.mark.skipif(codecs._native is None, reason="the byte-plane extension is not built")
@pytest.mark.parametrize("width", [2, 4])
@given(data=hst.binary(min_size=0, max_size=5000))
@settings(max_examples=50, deadline=None)
def test_native_split_and_join_match_numpy(width: int, data: bytes) -> None:
    n = len(data) // width
    planes = np.empty((width, n), dtype=np.uint8)
    codecs._split_planes(memoryview(data), width, planes)
    expected = np.frombuffer(data, dtype=np.uint8, count=n * width).reshape(n, width).T
    assert np.array_equal(planes, expected)
    out = np.zeros(n * width, dtype=np.uint8)
    codecs._join_planes(planes, width, out)
    assert out.tobytes() == data[: n * width]


@pytest.mark.skipif(codecs._native is None, reason="the byte-plane extension is not built")
@pytest.mark.parametrize("width", [2, 4, 8])
@given(data=hst.binary(min_size=0, max_size=3000), seed=hst.integers(0, 2**16))
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_native_word_delta_matches_numpy(width: int, data: bytes, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """zigzag(chunk - base) in C and in numpy: same bytes, and each inverts to the chunk.
    (``monkeypatch.context`` undoes its change within each example.)"""
    base = np.random.default_rng(seed).integers(0, 256, len(data), dtype=np.uint8).tobytes()
    native, version = codecs.delta_words(data, base, width)
    with monkeypatch.context() as m:
        m.setattr(codecs, "_native", None)
        fallback, _ = codecs.delta_words(data, base, width)
        undone = fallback.copy()
        codecs._undo_word_delta(undone, memoryview(base), width)
    assert version == codecs.WORD_DELTA_VERSION and native.tobytes() == fallback.tobytes()
    assert undone.tobytes() == data
    codecs._undo_word_delta(native, memoryview(base), width)
    assert native.tobytes() == data


@pytest.mark.parametrize("width", [2, 3, 4, 8])
def test_numpy_fallback_round_trips(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds without the C extension take the numpy paths: same payloads, same bytes."""
    rng = np.random.default_rng(width)
    base = (rng.normal(0, 0.02, 3001).astype(np.float32)).tobytes()[: 3001 * width // 4 * 4]
    raw = bytearray(base)
    raw[10] ^= 1
    native = encode_with_base(bytes(raw), width, base)
    monkeypatch.setattr(codecs, "_native", None)
    fallback = encode_with_base(bytes(raw), width, base)
    assert (fallback[0], bytes(fallback[1])) == (native[0], bytes(native[1]))
    assert _decode_any(fallback[0], fallback[1], base, len(raw)) == bytes(raw)
    standalone, payload, _ = encode_with_base(base, width, None)
    assert _decode_any(standalone, payload, None, len(base)) == base
