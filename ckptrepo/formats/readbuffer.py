"""Reading whole checkpoint files into one reused buffer, with direct I/O where the filesystem allows.

A file read through the page cache, or faulted in through a memory map, costs its reader new
cache pages for every byte; on this project's reference VM faulting a cold 259 MiB
safetensors file in from the hashing threads of a commit cost ~0.6 CPU-s, while reading it
with ``O_DIRECT`` into memory that is already mapped costs ~0.01 (the device writes the
bytes straight into the buffer). ``ReadBuffer`` is for importing many files in one process
(``repo.commit(read_state(path, buffer=buf), blocking=True)`` in a loop): each ``read``
reuses the buffer, so what an earlier read returned is overwritten by the next one.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

from ckptrepo import knobs
from ckptrepo.errors import InvalidInput

_ALIGN = 4096
_STEP = 8 << 20  # bytes per read call


class ReadBuffer:
    """A page-aligned buffer that ``read`` fills with a whole file, reused from read to read.

    Contract: the view ``read`` returns, and every tensor made over it, is valid until the next
    ``read`` or ``close``; one thread reads at a time. Falls back to ordinary reads where
    direct I/O is refused (tmpfs, some network filesystems) or ``CKPT_DIRECT_IO=0``.
    """

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def read(self, path: Path) -> memoryview:
        """The bytes of ``path``, in the buffer (grown to fit, in whole pages). InvalidInput when
        the file cannot be read or changes length while being read."""
        try:
            fd = self._open(path)
        except OSError as e:
            raise InvalidInput(path=str(path), reason=e.strerror or str(e)) from e
        try:
            size = os.fstat(fd).st_size
            view = memoryview(self._room(size))
            got = 0
            while got < size:
                n = os.preadv(fd, [view[got : got + _STEP]], got)
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
        if hasattr(os, "O_DIRECT") and knobs.get_bool("DIRECT_IO", True):
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
