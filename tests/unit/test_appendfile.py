"""AppendFile: the same bytes with direct I/O and through the page cache, and its fallbacks."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ckptrepo.errors import UsageError
from ckptrepo.storage import appendfile
from ckptrepo.storage.appendfile import ALIGN, AppendFile


def write_all(directory: Path, parts: list[bytes], buffer_bytes: int, inflight: int = 2) -> tuple[bytes, bool]:
    f = AppendFile(directory, "t-", ".tmp", buffer_bytes=buffer_bytes, inflight=inflight)
    direct = f.direct
    for part in parts:
        f.write(memoryview(part))
    assert f.size == sum(map(len, parts))
    path = f.finish()
    try:
        return path.read_bytes(), direct
    finally:
        path.unlink()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=hs.lists(hs.integers(0, 3 * ALIGN + 7), max_size=12),
    buffer_pages=hs.integers(1, 3),
    inflight=hs.integers(1, 4),
)
def test_content_is_exact_whatever_the_appends(tmp_path: Path, sizes: list[int], buffer_pages: int,
                                               inflight: int) -> None:
    parts = [os.urandom(n) for n in sizes]
    data, _ = write_all(tmp_path, parts, buffer_pages * ALIGN, inflight)
    assert data == b"".join(parts)


def test_direct_io_on_a_disk_filesystem(tmp_path: Path) -> None:
    parts = [os.urandom(n) for n in (10, 5 << 20, 1, ALIGN, 3 << 20)]
    data, direct = write_all(tmp_path, parts, 1 << 20)
    if not direct:
        pytest.skip(f"{tmp_path} does not take O_DIRECT here")
    assert data == b"".join(parts)


def test_a_file_read_back_soon_goes_through_the_page_cache(tmp_path: Path) -> None:
    parts = [os.urandom(5000), os.urandom(3 << 20)]
    out = AppendFile(tmp_path, "f-", ".tmp", buffer_bytes=1 << 20, direct=False)
    for p in parts:
        out.write(p)
    out.finish()
    assert not out._direct and out.path.read_bytes() == b"".join(parts)


def test_environment_turns_direct_io_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_DIRECT_IO", "0")
    assert not appendfile.direct_io_enabled()
    data, direct = write_all(tmp_path, [b"abc", os.urandom(9000)], ALIGN)
    assert not direct
    assert data[:3] == b"abc" and len(data) == 9003


@pytest.mark.parametrize("refuse", ["open", "probe"])
def test_filesystem_without_direct_io_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse: str) -> None:
    # Some filesystems refuse O_DIRECT at open, others at the first write: either way the
    # file is written through the page cache, with the same content.
    real_open = os.open

    def fake_open(path: str, flags: int, *args: int) -> int:
        if refuse == "open" and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def fake_pwrite(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(appendfile.os, "open", fake_open)
    if refuse == "probe":
        monkeypatch.setattr(appendfile.os, "pwrite", fake_pwrite)
    parts = [os.urandom(n) for n in (7, 2 * ALIGN + 1, 100)]
    data, direct = write_all(tmp_path, parts, ALIGN)
    assert not direct
    assert data == b"".join(parts)


def test_empty_file(tmp_path: Path) -> None:
    assert write_all(tmp_path, [], ALIGN)[0] == b""


def test_abort_removes_the_file_and_finish_closes_it(tmp_path: Path) -> None:
    f = AppendFile(tmp_path, "t-", ".tmp")
    f.write(b"x" * 10000)
    f.abort()
    f.abort()
    assert not f.path.exists()
    with pytest.raises(UsageError):
        f.write(b"y")
    g = AppendFile(tmp_path, "t-", ".tmp")
    g.write(b"z")
    g.finish()
    with pytest.raises(UsageError):
        g.finish()
    assert g.path.read_bytes() == b"z"


def test_a_failed_background_write_surfaces_at_finish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = AppendFile(tmp_path, "t-", ".tmp", buffer_bytes=ALIGN)
    if not f.direct:
        f.abort()
        pytest.skip("no direct I/O here: no background writes")

    def failing(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(appendfile.os, "pwrite", failing)
    with pytest.raises(OSError, match="No space left"):
        for _ in range(4):  # full buffers go to the writer thread; its failure surfaces here
            f.write(os.urandom(ALIGN))
        f.finish()  # finish aborts on failure; a failed write leaves that to the owner
    f.abort()
    assert not f.path.exists()


class _CountingMaps:
    """Stands in for ``mmap.mmap`` in appendfile: counts the live buffers and the most at once."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.created: list[int] = []  # the length of every map made

    def __call__(self, fileno: int, length: int) -> object:
        counter = self

        class Counted(mmap.mmap):
            def close(self) -> None:
                if not self.closed:
                    counter.live -= 1
                super().close()

        self.live += 1
        self.peak = max(self.peak, self.live)
        self.created.append(length)
        return Counted(fileno, length)


@pytest.mark.parametrize("inflight", [1, 2, 3])
def test_buffers_stay_within_inflight_plus_one_and_are_freed_before_the_fsync(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inflight: int) -> None:
    maps = _CountingMaps()
    monkeypatch.setattr(appendfile, "mmap", type("M", (), {"mmap": maps}))
    monkeypatch.setattr(appendfile, "_POOL", appendfile._BufferPool(0))  # returned buffers are unmapped
    live_at_fsync: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        live_at_fsync.append(maps.live)
        real_fsync(fd)

    monkeypatch.setattr(appendfile.os, "fsync", fsync)
    f = AppendFile(tmp_path, "t-", ".tmp", buffer_bytes=ALIGN, inflight=inflight)
    if not f.direct:
        f.abort()
        pytest.skip("no direct I/O here: no buffers")
    maps.live = maps.peak = 0  # the probe's page at open is gone already
    payload = os.urandom(40 * ALIGN + 5)
    for i in range(0, len(payload), 3000):
        f.write(payload[i : i + 3000])
    path = f.finish()
    assert path.read_bytes() == payload
    assert 2 <= maps.peak <= inflight + 1
    assert live_at_fsync == [0]


def test_writes_overlap_up_to_inflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    running = 0
    most = 0
    lock = threading.Lock()
    real_pwrite = os.pwrite

    def slow_pwrite(fd: int, data: memoryview, offset: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.01)
        try:
            return real_pwrite(fd, data, offset)
        finally:
            with lock:
                running -= 1

    f = AppendFile(tmp_path, "t-", ".tmp", buffer_bytes=ALIGN, inflight=3)
    if not f.direct:
        f.abort()
        pytest.skip("no direct I/O here: no background writes")
    monkeypatch.setattr(appendfile.os, "pwrite", slow_pwrite)
    payload = os.urandom(12 * ALIGN)
    f.write(payload)
    assert f.finish().read_bytes() == payload
    assert most == 3


def test_a_failed_write_among_several_in_flight_surfaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_pwrite = os.pwrite

    def failing_at_the_third_block(fd: int, data: memoryview, offset: int) -> int:
        if offset == 2 * ALIGN:
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, offset)

    f = AppendFile(tmp_path, "t-", ".tmp", buffer_bytes=ALIGN, inflight=3)
    if not f.direct:
        f.abort()
        pytest.skip("no direct I/O here: no background writes")
    monkeypatch.setattr(appendfile.os, "pwrite", failing_at_the_third_block)
    with pytest.raises(OSError, match="No space left"):
        for _ in range(6):
            f.write(os.urandom(ALIGN))
        f.finish()
    f.abort()
    assert not f.path.exists()


@pytest.mark.parametrize(("buffer_bytes", "inflight"), [(0, 2), (ALIGN, 0)])
def test_nonpositive_sizes_are_refused(tmp_path: Path, buffer_bytes: int, inflight: int) -> None:
    with pytest.raises(UsageError):
        AppendFile(tmp_path, "t-", ".tmp", buffer_bytes=buffer_bytes, inflight=inflight)
    assert list(tmp_path.iterdir()) == []


def test_environment_sets_request_size_and_writes_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPT_WRITE_BUFFER", str(3 * ALIGN))
    monkeypatch.setenv("CKPT_WRITES_IN_FLIGHT", "4")
    assert appendfile.write_buffer_bytes() == 3 * ALIGN
    assert appendfile.writes_in_flight() == 4


def test_a_later_file_reuses_the_buffers_of_an_earlier_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    maps = _CountingMaps()
    monkeypatch.setattr(appendfile, "mmap", type("M", (), {"mmap": maps}))
    pool = appendfile._BufferPool(3 * 8 * ALIGN)
    monkeypatch.setattr(appendfile, "_POOL", pool)
    payloads = []
    for _ in range(3):
        f = AppendFile(tmp_path, "t-", ".tmp", buffer_bytes=8 * ALIGN, inflight=2)
        if not f.direct:
            f.abort()
            pytest.skip("no direct I/O here: no buffers")
        payloads.append(os.urandom(50 * ALIGN + 3))
        f.write(payloads[-1])
        assert f.finish().read_bytes() == payloads[-1]
    # The first file mapped inflight + 1 buffers; the later ones took those from the pool
    # (the other maps are the probe pages of each open).
    assert maps.created.count(8 * ALIGN) == 3
    assert pool.idle_bytes() == 3 * 8 * ALIGN


def test_the_pool_keeps_at_most_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = appendfile._BufferPool(2 * ALIGN)
    bufs = [pool.take(ALIGN) for _ in range(3)]
    for b in bufs:
        pool.give(b)
    assert pool.idle_bytes() == 2 * ALIGN
    assert bufs[2].closed and not bufs[0].closed
    assert pool.take(ALIGN) in bufs[:2]
    other = pool.take(2 * ALIGN)  # no idle buffer of that size: a new one
    assert other not in bufs
