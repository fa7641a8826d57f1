"""AppendFile: the same bytes with direct I/O and through the page cache, and its fallbacks."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from ckptrepo.errors import UsageError
from ckptrepo.storage import appendfile
from ckptrepo.storage.appendfile import ALIGN, AppendFile


def write_all(directory: Path, parts: list[bytes], buffer_bytes: int) -> tuple[bytes, bool]:
    f = AppendFile(directory, "t-", ".tmp", buffer_bytes=buffer_bytes)
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
)
def test_content_is_exact_whatever_the_appends(tmp_path: Path, sizes: list[int], buffer_pages: int) -> None:
    parts = [os.urandom(n) for n in sizes]
    data, _ = write_all(tmp_path, parts, buffer_pages * ALIGN)
    assert data == b"".join(parts)


def test_direct_io_on_a_disk_filesystem(tmp_path: Path) -> None:
    parts = [os.urandom(n) for n in (10, 5 << 20, 1, ALIGN, 3 << 20)]
    data, direct = write_all(tmp_path, parts, 1 << 20)
    if not direct:
        pytest.skip(f"{tmp_path} does not take O_DIRECT here")
    assert data == b"".join(parts)


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
