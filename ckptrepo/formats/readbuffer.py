"""Reading whole checkpoint files into one reused buffer, with direct I/O where the filesystem allows.

A file read through the page cache, or faulted in through a memory map, costs its reader new
cache pages for every byte; on this project's reference VM faulting a cold 259 MiB
safetensors file in from the hashing threads of a commit cost ~0.6 CPU-s, while reading it
with ``O_DIRECT`` into memory that is already mapped costs ~0.01 (the device writes the
bytes straight into the buffer). ``ReadBuffer`` is for importing many files in one process
(``repo.commit(read_state(path, buffer=buf), blocking=True)`` in a loop): each ``read``
reuses the buffer, so what an earlier read returned is overwritten by the next one.

``read_ahead`` starts reading a file on a thread of its own, for a process that has other work
to do before it needs the bytes: a ``ckpt commit FILE`` process reads its file while Python
imports the library (about half a second), and the first ``ReadBuffer.read`` of that file, if
it did not change meanwhile, takes those bytes over instead of reading them again.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ckptrepo import knobs
from ckptrepo.errors import CkptError, InvalidInput

_ALIGN = 4096
_STEP = 8 << 20  # bytes per read call
# Bytes per read call of a read-ahead: between two calls its thread waits for the interpreter
# lock, which the importing main thread hands over every 5 ms.
_AHEAD_STEP = 64 << 20


class ReadBuffer:
    """A page-aligned buffer that ``read`` fills with a whole file, reused from read to read.

    Contract: the view ``read`` returns, and every tensor made over it, is valid until the next
    ``read`` or ``close``; one thread reads at a time. Falls back to ordinary reads where
    direct I/O is refused (tmpfs, some network filesystems) or ``CKPT_DIRECT_IO=0``.
    """

    def __init__(self, *, step: int = _STEP) -> None:
        self._map: mmap.mmap | None = None
        self._step = step

    def read(self, path: Path) -> memoryview:
        """The bytes of ``path``, in the buffer (grown to fit, in whole pages), or in the one a
        ``read_ahead`` of the unchanged file filled, which this buffer then owns. InvalidInput
        when the file cannot be read or changes length while being read."""
        return self._read(path, adopt=True)

    def _read(self, path: Path, *, adopt: bool) -> memoryview:
        try:
            fd = self._open(path)
        except OSError as e:
            raise InvalidInput(path=str(path), reason=e.strerror or str(e)) from e
        try:
            found = os.fstat(fd)
            size = found.st_size
            ahead = _take_ahead(found) if adopt else None
            if ahead is not None:
                self.close()
                self._map, ahead._map = ahead._map, None
                assert self._map is not None  # _take_ahead returns only a completed read
                return memoryview(self._map)[:size]
            view = memoryview(self._room(size))
            got = 0
            while got < size:
                n = os.preadv(fd, [view[got : got + self._step]], got)
                if n <= 0:
                    break
                got += n
        except OSError as e:
            raise InvalidInput(path=str(path), reason=e.strerror or str(e)) from e
        finally:
            os.close(fd)
        if got != size:
            raise InvalidInput(path=str(path), reason=f"it changed while being read ({got} of {size} bytes)")
        return view[:size]

    @staticmethod
    def _open(path: Path) -> int:
        if hasattr(os, "O_DIRECT") and knobs.get_bool("DIRECT_IO"):
            with contextlib.suppress(OSError):
                return os.open(path, os.O_RDONLY | os.O_DIRECT)
        return os.open(path, os.O_RDONLY)

    def _room(self, size: int) -> mmap.mmap:
        """The buffer, at least ``size`` bytes rounded up to whole pages (a new one if smaller)."""
        need = max(_ALIGN, -(-size // _ALIGN) * _ALIGN)
        if self._map is None or len(self._map) < need:
            self.close()
            self._map = mmap.mmap(-1, need)
        return self._map

    def close(self) -> None:
        """Release the buffer (views of it keep the memory alive until they go)."""
        old, self._map = self._map, None
        if old is not None:
            with contextlib.suppress(BufferError):  # tensors over it still exist: freed with them
                old.close()


def _identity(found: os.stat_result) -> tuple[int, ...]:
    """What tells a file and its version apart: device, inode, size, change times."""
    return found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns


_ahead_lock = threading.Lock()
_ahead: dict[tuple[int, int], tuple[threading.Thread, ReadBuffer, list[tuple[int, ...]]]] = {}


def read_ahead(path: Path, check: Callable[[Path], object]) -> None:
    """Start reading ``path`` whole into a buffer of its own, on a daemon thread, once ``check(path)``
    returned (a format's header check: a file it refuses is not read beyond that). The first
    ``ReadBuffer.read`` of the same file in this process waits for that read and takes its buffer,
    if the file's size and change times are what they were before and after it was read; else the
    buffer is dropped and the file read again. A read-ahead that fails (a check or a read error)
    leaves nothing: the reader then reads the file, and reports what is wrong."""
    try:
        key = os.stat(path)
    except OSError:
        return  # the reader reports it
    buffer = ReadBuffer(step=_AHEAD_STEP)
    read: list[tuple[int, ...]] = []  # the file's identity, once read whole and unchanged

    def run() -> None:
        try:
            check(path)
            before = _identity(os.stat(path))
            buffer._read(path, adopt=False)
            if _identity(os.stat(path)) == before:
                read.append(before)
        except (OSError, CkptError):
            buffer.close()

    thread = threading.Thread(target=run, name="ckpt-read-ahead", daemon=True)
    with _ahead_lock:
        _ahead[(key.st_dev, key.st_ino)] = (thread, buffer, read)
    thread.start()


def _take_ahead(found: os.stat_result) -> ReadBuffer | None:
    """The buffer a read-ahead of the file ``found`` describes filled, once that read is over; None
    when there is none, or it failed, or it read another version of the file (dropped then)."""
    with _ahead_lock:
        pending = _ahead.pop((found.st_dev, found.st_ino), None)
    if pending is None:
        return None
    thread, buffer, read = pending
    thread.join()
    if read == [_identity(found)]:
        return buffer
    buffer.close()
    return None
