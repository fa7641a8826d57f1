"""A new file written front to back, with direct I/O where the filesystem allows it.

Packs are written once and read later, often much later. Writing them through the page
cache costs the writer a copy into newly allocated cache pages for every byte (on this
project's reference VM about 2 CPU-s per GiB, more than hashing and encoding together,
taken from a training job that keeps both cores busy) and fills the cache with pages that
nobody reads soon. With ``O_DIRECT`` the device reads the bytes straight from an aligned
buffer: the writer's CPU cost is one copy into that buffer.

``AppendFile`` gathers appends in one of two page-aligned buffers of ``buffer_bytes``; a
full buffer is written by a thread of the file's own while the other fills, so the caller
waits for the device only when it outruns it. ``finish`` pads the last block to the
alignment, truncates the file to its true length and fsyncs it. Where direct I/O is
unavailable (not Linux, tmpfs, some network filesystems: a probe write at open fails) or
the environment sets ``CKPT_DIRECT_IO=0``, the same calls write through the page cache.
The file's content is identical either way.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ckptrepo.errors import UsageError

ALIGN = 4096
DEFAULT_BUFFER = 1 << 20


def direct_io_enabled() -> bool:
    """Whether new files try ``O_DIRECT`` (Linux, unless ``CKPT_DIRECT_IO=0``)."""
    return hasattr(os, "O_DIRECT") and os.environ.get("CKPT_DIRECT_IO", "1") != "0"


def _open_direct(path: str) -> int | None:
    """A direct-I/O descriptor of ``path`` if a probe write through it succeeds, else None."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError:
        return None
    probe = mmap.mmap(-1, ALIGN)
    try:
        os.pwrite(fd, probe, 0)  # zeros at offset 0: overwritten by the first block or truncated
        return fd
    except OSError:
        os.close(fd)
        return None
    finally:
        probe.close()


class AppendFile:
    """A new temporary file in ``directory``, appended to by one thread, then finished or aborted."""

    def __init__(self, directory: Path, prefix: str, suffix: str, buffer_bytes: int = DEFAULT_BUFFER) -> None:
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
        self.path = Path(name)
        self._fd: int | None = fd
        self._size = 0
        self._bufs: list[mmap.mmap] = []
        self._arrays: list[np.ndarray[Any, Any]] = []  # numpy views of _bufs, same order
        self._fill = 0  # bytes in self._bufs[0], the buffer being filled
        self._flushed = 0  # file offset where that buffer's bytes go
        self._writer: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None
        direct = _open_direct(name) if direct_io_enabled() else None
        if direct is not None:
            os.close(fd)
            self._fd = direct
            size = max(ALIGN, buffer_bytes // ALIGN * ALIGN)
            self._bufs = [mmap.mmap(-1, size), mmap.mmap(-1, size)]
            self._arrays = [np.frombuffer(b, dtype=np.uint8) for b in self._bufs]

    @property
    def direct(self) -> bool:
        """True when writes bypass the page cache."""
        return bool(self._bufs)

    @property
    def size(self) -> int:
        """Bytes appended so far."""
        return self._size

    def _live_fd(self) -> int:
        if self._fd is None:
            raise UsageError("file writer is already finished or aborted")
        return self._fd

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` (any C-contiguous buffer)."""
        fd = self._live_fd()
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self._size += len(view)
        if not self._bufs:
            while view:
                view = view[os.write(fd, view) :]
            return
        while view:
            buf = self._arrays[0]
            n = min(len(view), len(buf) - self._fill)
            # numpy copies without holding the interpreter lock (a slice assignment into the
            # mmap would hold it for the whole memcpy, stalling the encoding threads).
            np.copyto(buf[self._fill : self._fill + n], np.frombuffer(view, dtype=np.uint8, count=n))
            self._fill += n
            view = view[n:]
            if self._fill == len(buf):
                self._hand_off(len(buf))

    def _hand_off(self, length: int) -> None:
        """Start writing the filled buffer's first ``length`` bytes; fill the other one next."""
        self._wait()
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-write")
        self._pending = self._writer.submit(_pwrite_all, self._live_fd(), self._bufs[0], length, self._flushed)
        self._flushed += length
        self._bufs.reverse()
        self._arrays.reverse()
        self._fill = 0

    def _wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def finish(self) -> Path:
        """Write what is buffered, set the true length, fsync and close; returns the path."""
        fd = self._live_fd()
        try:
            if self._bufs and self._fill:
                tail = self._fill
                padded = -(-tail // ALIGN) * ALIGN
                self._bufs[0][tail:padded] = bytes(padded - tail)
                self._hand_off(padded)
            self._wait()
            os.ftruncate(fd, self._size)
            os.fsync(fd)
        except BaseException:
            self.abort()
            raise
        self._close()
        return self.path

    def _close(self) -> None:
        try:
            with contextlib.suppress(OSError):  # closing after a failure, raised where it happened
                self._wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown()
                self._writer = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._arrays = []  # numpy views pin the mmaps: drop them before closing
            for buf in self._bufs:
                with contextlib.suppress(BufferError):  # a failed write's traceback still views it
                    buf.close()
            self._bufs = []

    def abort(self) -> None:
        """Close and delete the file; safe to call more than once."""
        self._close()
        self.path.unlink(missing_ok=True)


def _pwrite_all(fd: int, buf: mmap.mmap, length: int, offset: int) -> None:
    view = memoryview(buf)[:length]
    try:
        done = 0
        while done < length:
            done += os.pwrite(fd, view[done:], offset + done)
    finally:
        view.release()
