"""A safetensors file is refused by its header before its data section is read (issue 45).

The files here are 1 GiB and sparse (``os.truncate``): they take no disk space, yet a reader
that loaded the data before checking the header would read (and allocate) the whole GiB. The
bytes a refusal costs are measured with ``rchar`` of ``/proc/self/io``: every byte the
process's read calls returned, direct I/O included.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptrepo.errors import InvalidInput
from ckptrepo.formats import ReadBuffer, read_state
from ckptrepo.formats.safetensors_file import read_flat

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/io")

GIB = 1 << 30
# A refusal may read the 8-byte length, the header and what Python's buffered reader reads
# ahead (a page or two); far below 1 MiB. The whole file is 1024 times that.
MAX_READ = 1 << 20


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def _sparse(path: Path, head: bytes) -> Path:
    """``path``: ``head`` then zeros up to 1 GiB, without writing them (a sparse file)."""
    path.write_bytes(head)
    os.truncate(path, GIB)
    return path


def _header(doc: object) -> bytes:
    raw = json.dumps(doc).encode()
    return len(raw).to_bytes(8, "little") + raw


# Each one is refused by a different rule of the header, all before any tensor byte is needed.
BAD_HEADERS = {
    # An 8-byte length larger than the library's cap (and than the file).
    "length over the cap": (2**40).to_bytes(8, "little") + b"{}",
    # A sane length, then bytes that are not JSON.
    "garbage JSON": (64).to_bytes(8, "little") + b"\x00garbage" * 8,
    # A valid header for 8 bytes of data: the other ~1 GiB belongs to no tensor.
    "offsets leave a tail": _header({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}),
    # A tensor whose offsets point past the end of the file.
    "offsets past the end": _header({"w": {"dtype": "U8", "shape": [2 * GIB], "data_offsets": [0, 2 * GIB]}}),
}

READERS: dict[str, Callable[[Path], object]] = {
    "read_flat": lambda p: read_flat(p),
    "read_flat mapped": lambda p: read_flat(p, mapped=True),
    "read_flat into a ReadBuffer (ckpt commit, Repo.commit_file)": lambda p: read_flat(p, buffer=ReadBuffer()),
    "read_state": lambda p: read_state(p),
    "read_state mapped": lambda p: read_state(p, mapped=True),
    "read_state into a ReadBuffer (ckpt commit DIR..., read_states)": lambda p: read_state(p, buffer=ReadBuffer()),
}


@pytest.fixture(scope="module", autouse=True)
def _torch_loaded() -> None:
    """Import what ``read_state`` imports on first use, so that its files are not counted."""
    import safetensors.torch  # noqa: F401

    import ckptrepo.formats.safetensors_io  # noqa: F401


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("case", list(BAD_HEADERS))
def test_bad_header_refused_before_the_data_is_read(tmp_path: Path, case: str, reader: str) -> None:
    path = _sparse(tmp_path / "bad.safetensors", BAD_HEADERS[case])
    before = _bytes_read()
    with pytest.raises(InvalidInput) as caught:
        READERS[reader](path)
    read = _bytes_read() - before
    assert read < MAX_READ, f"{reader} read {read:,} bytes to refuse a 1 GiB file ({case})"
    assert str(path) in caught.value.message


def test_commit_file_refuses_without_reading_the_data(tmp_path: Path) -> None:
    """``Repo.commit_file`` (what ``ckpt commit FILE.safetensors`` runs) reads a plain file whole
    into a ReadBuffer: only once its header is valid."""
    from ckptrepo import Repo

    with Repo.init(tmp_path / "repo") as repo:
        for case, head in BAD_HEADERS.items():
            path = _sparse(tmp_path / f"{case.replace(' ', '_')}.safetensors", head)
            before = _bytes_read()
            with pytest.raises(InvalidInput):
                repo.commit_file(path)
            read = _bytes_read() - before
            assert read < MAX_READ, f"commit_file read {read:,} bytes to refuse a 1 GiB file ({case})"
        assert repo.log() == []


def test_a_valid_file_still_reads_whole(tmp_path: Path) -> None:
    """The header is validated from ordinary reads, then the data comes from the buffer or the
    map: the same tensors whichever way."""
    data = bytes(range(256)) * 4
    raw = json.dumps({"b": {"dtype": "U8", "shape": [1024], "data_offsets": [0, 1024]},
                      "a": {"dtype": "F32", "shape": [2], "data_offsets": [1024, 1032]}}).encode()
    path = tmp_path / "ok.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data + b"\x00" * 8)
    for flat in (read_flat(path), read_flat(path, mapped=True), read_flat(path, buffer=ReadBuffer())):
        assert [(t.name, t.dtype, t.shape) for t in flat.tensors] == [("a", "float32", [2]), ("b", "uint8", [1024])]
        assert bytes(flat.tensors[1].data) == data and bytes(flat.tensors[0].data) == b"\x00" * 8


def test_a_header_changed_between_the_check_and_the_read_is_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The buffer must hold the header that was validated: else the file changed meanwhile."""
    raw = json.dumps({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "moving.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"abcd")
    original = ReadBuffer.read

    def swapped(self: ReadBuffer, p: Path) -> memoryview:
        other = raw.replace(b'"a"', b'"b"')  # same length, another tensor name
        p.write_bytes(len(other).to_bytes(8, "little") + other + b"abcd")
        return original(self, p)

    monkeypatch.setattr(ReadBuffer, "read", swapped)
    with pytest.raises(InvalidInput, match="changed while being read"):
        read_flat(path, buffer=ReadBuffer())
