"""ckptrepo.formats.read_ahead: a safetensors file read on a thread of its own, whose bytes the
next ``ReadBuffer.read`` of the unchanged file takes over; a file that changed is read again,
one whose header is refused is not read, and other formats are left alone."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckptrepo.errors import InvalidInput
from ckptrepo.formats import ReadBuffer, read_ahead
from ckptrepo.formats.safetensors_file import read_flat


def _safetensors(path: Path, data: bytes) -> Path:
    """A safetensors file holding ``data`` as one uint8 tensor."""
    header = json.dumps({"t": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread of every ``os.preadv`` call (the reads of ``ReadBuffer``)."""
    threads: list[str] = []
    preadv: Callable[..., int] = os.preadv

    def counted(*args: Any) -> int:
        threads.append(threading.current_thread().name)
        return preadv(*args)

    monkeypatch.setattr(os, "preadv", counted)
    return threads


def _wait_for_read_aheads() -> None:
    for thread in threading.enumerate():
        if thread.name == "ckpt-read-ahead":
            thread.join()


def test_the_next_read_takes_the_bytes_read_ahead(tmp_path: Path, reads: list[str]) -> None:
    data = os.urandom(3 << 20)
    path = _safetensors(tmp_path / "a.safetensors", data)
    read_ahead(path)
    flat = read_flat(path, buffer=ReadBuffer())
    assert bytes(flat.tensors[0].data) == data
    assert reads and set(reads) == {"ckpt-read-ahead"}  # nothing read twice, nothing by this thread
    reads.clear()
    assert bytes(ReadBuffer().read(path)[-len(data):]) == data  # a second read reads the file itself
    assert set(reads) == {threading.current_thread().name}


def test_a_file_changed_after_its_read_ahead_is_read_again(tmp_path: Path, reads: list[str]) -> None:
    path = _safetensors(tmp_path / "a.safetensors", b"\x01" * 4096)
    read_ahead(path)
    _wait_for_read_aheads()
    _safetensors(path, b"\x02" * 4096)  # same size, new bytes: its change times differ
    assert bytes(read_flat(path, buffer=ReadBuffer()).tensors[0].data) == b"\x02" * 4096
    assert threading.current_thread().name in reads


def test_a_refused_header_stops_the_read_ahead_before_the_data(tmp_path: Path, reads: list[str]) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes((10**12).to_bytes(8, "little") + b"{}" + b"\0" * 4096)  # a header longer than the file
    read_ahead(path)
    _wait_for_read_aheads()
    assert reads == []
    with pytest.raises(InvalidInput, match="header length"):
        read_flat(path, buffer=ReadBuffer())


@pytest.mark.parametrize("name", ["state.pt", "missing.safetensors", "folder.safetensors"])
def test_other_inputs_are_left_alone(tmp_path: Path, reads: list[str], name: str) -> None:
    path = tmp_path / name
    if name == "state.pt":
        path.write_bytes(b"\0" * 4096)
    elif name.startswith("folder"):
        path.mkdir()
    read_ahead(path)
    assert not any(thread.name == "ckpt-read-ahead" for thread in threading.enumerate())
    if name == "state.pt":
        assert bytes(ReadBuffer().read(path)) == b"\0" * 4096
        assert set(reads) == {threading.current_thread().name}
