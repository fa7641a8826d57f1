"""Property tests: every encoding round-trips bit-exactly, alone and through packs; decode never lies."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ckptrepo.chunks.chunker import chunk_spans
from ckptrepo.chunks.codecs import Encoding, decode, encode
from ckptrepo.chunks.store import ChunkReader, PackSink
from ckptrepo.errors import IntegrityError
from ckptrepo.ids import hash_bytes
from ckptrepo.storage import MemoryBackend

DTYPES = [
    np.dtype(name)
    for name in [
        "bool", "uint8", "int8", "float16", "int16", "uint16", "float32", "int32",
        "float64", "int64", "complex64", "complex128",
    ]
]  # fmt: skip
assert sorted({d.itemsize for d in DTYPES}) == [1, 2, 4, 8, 16]

PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays of any itemsize: arbitrary values (NaN, inf, subnormals) or low-entropy ones."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.integers(0, 5000))
    if draw(st.booleans()):
        return draw(hnp.arrays(dtype, shape))
    small = draw(hnp.arrays(np.dtype("uint8"), shape, elements=st.integers(0, draw(st.integers(0, 255)))))
    return small.astype(dtype)


def round_trip(raw: bytes | memoryview, itemsize: int) -> None:
    encoding, payload = encode(raw, itemsize, min_saving=0.0)
    assert bytes(decode(encoding, payload, len(raw))) == bytes(raw)
    out = bytearray(len(raw))
    decode(encoding, payload, len(raw), memoryview(out))
    assert out == bytes(raw)


@PROFILE
@given(raw=st.binary(max_size=20_000), itemsize=st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_random_bytes_round_trip(raw: bytes, itemsize: int) -> None:
    round_trip(raw, itemsize)


@PROFILE
@given(array=arrays())
def test_arrays_round_trip(array: np.ndarray) -> None:
    round_trip(array.tobytes(), array.dtype.itemsize)
    round_trip(array.data.cast("B") if array.size else b"", array.dtype.itemsize)


@PROFILE
@given(array=arrays(), level=st.sampled_from([1, 3]))
def test_arrays_round_trip_with_default_saving_and_levels(array: np.ndarray, level: int) -> None:
    raw = array.tobytes()
    encoding, payload = encode(raw, array.dtype.itemsize, level=level)
    if encoding is Encoding.RAW:
        assert payload is raw
    else:
        assert len(payload) < 0.95 * len(raw)
    assert bytes(decode(encoding, payload, len(raw))) == raw


@PROFILE
@given(
    batch=st.lists(arrays(), min_size=1, max_size=6),
    chunk_size=st.sampled_from([64, 1000, 4096]),
    pack_target=st.sampled_from([1, 5000, 1 << 20]),
)
def test_arrays_round_trip_through_packs(batch: list[np.ndarray], chunk_size: int, pack_target: int) -> None:
    backend = MemoryBackend()
    sink = PackSink(backend, pack_target)
    expected: dict[str, bytes] = {}
    for array in batch:
        raw = array.tobytes()
        for offset, length in chunk_spans(len(raw), array.dtype.itemsize, chunk_size):
            piece = raw[offset : offset + length]
            encoding, payload = encode(piece, array.dtype.itemsize, min_saving=0.0)
            sink.add(hash_bytes(piece), encoding, payload, len(piece))
            expected[hash_bytes(piece)] = piece
    locations = [loc for pack in sink.seal() for loc in pack.locations]
    assert sorted(loc.chunk_id for loc in locations) == sorted(expected)
    reader = ChunkReader(backend)
    for loc in locations:
        assert reader.read(loc) == expected[loc.chunk_id]
        out = bytearray(loc.raw_length)
        reader.read_into(loc, memoryview(out))
        assert out == expected[loc.chunk_id]


@PROFILE
@given(array=arrays(), data=st.data())
def test_damaged_payloads_fail_cleanly(array: np.ndarray, data: st.DataObject) -> None:
    raw = array.tobytes()
    encoding, payload = encode(raw, array.dtype.itemsize, min_saving=0.0)
    damaged = bytearray(payload)
    if damaged and data.draw(st.booleans()):
        for _ in range(data.draw(st.integers(1, 4))):
            damaged[data.draw(st.integers(0, len(damaged) - 1))] ^= data.draw(st.integers(1, 255))
    else:
        cut = data.draw(st.integers(0, len(damaged)))
        damaged = damaged[:cut] + data.draw(st.binary(max_size=8))
    try:
        result = decode(encoding, bytes(damaged), len(raw))
    except IntegrityError:
        return
    assert len(result) == len(raw)
