"""Pack files: exact bytes, index round trips, and detection of damaged packs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from ckptrepo.chunks.pack import PackWriter, parse_index, read_index
from ckptrepo.errors import IntegrityError, UsageError
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage import Backend, LocalBackend, MemoryBackend

ID_A = "11" * 32
ID_B = "22" * 32


def u64(value: int) -> bytes:
    return value.to_bytes(8, "little")


def two_chunk_pack(staging: Path) -> tuple[str, Path, list[ChunkLocation]]:
    writer = PackWriter(staging)
    writer.add(ID_A, 0, b"abc", 3)
    writer.add(ID_B, 2, memoryview(b"xyz12"), 10, depth=1, base_id=ID_A)
    return writer.finish()


def test_exact_bytes(tmp_path: Path) -> None:
    pack_id, path, entries = two_chunk_pack(tmp_path)
    index = (
        b"\x11" * 32 + u64(10) + u64(3) + u64(3) + b"\x00" + b"\x00" + b"\x00" * 32
        + b"\x22" * 32 + u64(13) + u64(5) + u64(10) + b"\x02" + b"\x01" + b"\x11" * 32
    )  # fmt: skip
    expected = (
        b"CKPTPACK\x01\x00"
        + b"abc"
        + b"xyz12"
        + index
        + u64(18)
        + (2).to_bytes(4, "little")
        + blake3.blake3(index).digest()
        + b"CKPTIDX1"
    )
    data = path.read_bytes()
    assert len(index) == 2 * 90
    assert data == expected
    trailer = expected[-52:]
    assert pack_id == blake3.blake3(b"CKPTPACK\x01\x00" + index + trailer).hexdigest()
    assert entries == [
        ChunkLocation(ID_A, pack_id, 10, 3, 3, 0, 0, None),
        ChunkLocation(ID_B, pack_id, 13, 5, 10, 2, 1, ID_A),
    ]


def test_writer_tracks_size_and_count(tmp_path: Path) -> None:
    writer = PackWriter(tmp_path)
    assert (writer.size, writer.count) == (10, 0)
    writer.add(ID_A, 0, b"x" * 100, 100)
    assert (writer.size, writer.count) == (110, 1)
    _, path, _ = writer.finish()
    assert writer.size == path.stat().st_size == 110 + 90 + 52
    assert path.parent == tmp_path


def test_empty_pack(tmp_path: Path) -> None:
    _, path, entries = PackWriter(tmp_path).finish()
    assert entries == []
    assert path.read_bytes()[:10] == b"CKPTPACK\x01\x00"
    assert parse_index(path.read_bytes()) == []


def test_abort_removes_the_file(tmp_path: Path) -> None:
    writer = PackWriter(tmp_path)
    writer.add(ID_A, 0, b"abc", 3)
    writer.abort()
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError):
        writer.add(ID_B, 0, b"abc", 3)


def test_finish_twice_is_a_usage_error_and_keeps_the_file(tmp_path: Path) -> None:
    writer = PackWriter(tmp_path)
    _, path, _ = writer.finish()
    with pytest.raises(UsageError):
        writer.finish()
    assert path.exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"chunk_id": "xyz"},
        {"chunk_id": "AB" * 32},
        {"base_id": "12"},
        {"encoding": 256},
        {"depth": -1},
        {"raw_length": -1},
    ],
)
def test_add_validates_before_writing(tmp_path: Path, kwargs: dict[str, object]) -> None:
    writer = PackWriter(tmp_path)
    args: dict[str, object] = {"chunk_id": ID_A, "encoding": 0, "payload": b"abc", "raw_length": 3, **kwargs}
    with pytest.raises(UsageError):
        writer.add(**args)  # type: ignore[arg-type]
    assert (writer.size, writer.count) == (10, 0)
    writer.abort()


def test_parse_index_round_trip_and_from_tail(tmp_path: Path) -> None:
    pack_id, path, entries = two_chunk_pack(tmp_path)
    data = path.read_bytes()
    assert parse_index(data, pack_id=pack_id) == entries
    assert parse_index(data[18:], file_size=len(data), pack_id=pack_id) == entries
    assert [e.pack_id for e in parse_index(data)] == ["", ""]  # the index does not know its own pack's id
    with pytest.raises(UsageError):
        parse_index(data[19:], file_size=len(data))


@pytest.fixture(params=["local", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    store: Backend = LocalBackend(tmp_path / "store") if request.param == "local" else MemoryBackend()
    yield store
    store.close()


class CountingBackend:
    """Wraps a backend and records what a reader asked it for."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.ranges: list[tuple[int, int]] = []

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.ranges.append((offset, length))
        return self.inner.get_range(key, offset, length)


def test_read_index_reads_only_header_and_tail(backend: Backend) -> None:
    writer = PackWriter(backend.staging_dir())
    for i in range(8):
        writer.add(f"{i:064x}", 0, bytes([i]) * (1 << 20), 1 << 20)
    pack_id, path, entries = writer.finish()
    backend.put_file("packs/p.pack", path)
    counting = CountingBackend(backend)
    assert read_index(counting, "packs/p.pack", pack_id=pack_id) == entries  # type: ignore[arg-type]
    assert sum(length for _, length in counting.ranges) < 80_000


def test_read_index_with_an_index_larger_than_the_first_read(backend: Backend) -> None:
    writer = PackWriter(backend.staging_dir())
    for i in range(2000):
        writer.add(f"{i:064x}", 1, b"p", 7)
    pack_id, path, entries = writer.finish()
    backend.put_file("big.pack", path)
    assert read_index(backend, "big.pack", pack_id=pack_id) == entries
    assert len(entries) * 90 > 64 << 10


def stored_pack(backend: Backend) -> bytes:
    _, path, _ = two_chunk_pack(backend.staging_dir())
    data = path.read_bytes()
    path.unlink()
    return data


def damaged(data: bytes, position: int) -> bytes:
    broken = bytearray(data)
    broken[position] ^= 0x01
    return bytes(broken)


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("header magic", lambda d: damaged(d, 0)),
        ("version", lambda d: damaged(d, 8)),
        ("index byte", lambda d: damaged(d, 18 + 40)),
        ("index offset", lambda d: damaged(d, len(d) - 52)),
        ("entry count", lambda d: damaged(d, len(d) - 44)),
        ("index hash", lambda d: damaged(d, len(d) - 20)),
        ("trailer magic", lambda d: damaged(d, len(d) - 1)),
        ("truncated by one byte", lambda d: d[:-1]),
        ("truncated index", lambda d: d[:18] + d[18 + 90 :]),
        ("cut in half", lambda d: d[: len(d) // 2]),
        ("only a header", lambda d: d[:10]),
        ("empty", lambda d: b""),
        ("trailing garbage", lambda d: d + b"\x00"),
    ],
)
def test_damaged_packs_raise_integrity_errors(backend: Backend, name: str, damage: object) -> None:
    bad = damage(stored_pack(backend))  # type: ignore[operator]
    with pytest.raises(IntegrityError):
        parse_index(bad)
    backend.put_bytes("packs/bad.pack", bad)
    with pytest.raises(IntegrityError, match=re.escape("packs/bad.pack")):
        read_index(backend, "packs/bad.pack")


def test_index_entry_outside_payload_area_is_rejected(tmp_path: Path) -> None:
    # A self-consistent index (correct hash) whose entry points into the index itself.
    index = b"\x11" * 32 + u64(10) + u64(100) + u64(3) + b"\x00\x00" + b"\x00" * 32
    data = b"CKPTPACK\x01\x00abc" + index + u64(13) + (1).to_bytes(4, "little")
    data += blake3.blake3(index).digest() + b"CKPTIDX1"
    with pytest.raises(IntegrityError, match="outside"):
        parse_index(data)
