"""A new file written front to back, with direct I/O where the filesystem allows it.

Packs are written once and read later, often much later. Writing them through the page
cache costs the writer a copy into newly allocated cache pages for every byte (on this
project's reference VM about 2 CPU-s per GiB, more than hashing and encoding together,
taken from a training job that keeps both cores busy) and fills the cache with pages that
nobody reads soon. With ``O_DIRECT`` the device reads the bytes straight from an aligned
buffer: the writer's CPU cost is one copy into that buffer.

``AppendFile`` gathers appends in page-aligned buffers of ``buffer_bytes``; a full buffer
is written by threads of the file's own while the next one fills, with up to ``inflight``
writes at once, so the caller waits for the device only when it outruns it. Several
requests in flight keep the device busy across the thread wake-ups between one request
and the next (one 1 MiB request at a time wrote ~1.1 GB/s from a commit, against 1.8 GB/s
the same disk takes): at most ``inflight + 1`` buffers exist per file, taken as needed
and given back as soon as the last write has completed, to a small process-wide pool that
the next file takes them from. ``finish`` pads the last block to the
alignment, truncates the file to its true length and fsyncs it. Where direct I/O is
unavailable (not Linux, tmpfs, some network filesystems: a probe write at open fails) or
the environment sets ``CKPT_DIRECT_IO=0``, the same calls write through the page cache.
The file's content is identical either way. The knobs ``WRITE_BUFFER`` (bytes per request)
and ``WRITES_IN_FLIGHT`` size the direct-I/O path.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ckptrepo import knobs
from ckptrepo.errors import UsageError

ALIGN = 4096


def write_buffer_bytes() -> int:
    """Bytes per direct-I/O write request (knob ``WRITE_BUFFER``)."""
    return knobs.get_int("WRITE_BUFFER")


def writes_in_flight() -> int:
    """Direct-I/O writes one file keeps in flight (knob ``WRITES_IN_FLIGHT``)."""
    return knobs.get_int("WRITES_IN_FLIGHT")


class _BufferPool:
    """Page-aligned write buffers kept between files, at most ``limit`` bytes of them idle
    (None: what two files hold at the knobs' sizes, a pack being finished and the next one).

    Each new pack would otherwise map fresh buffers and fault their pages in again (on the
    reference VM first touch costs about as much as the copy into them). Only buffers no
    write uses any more are given back, and the pool only keeps what files had in use at
    once before (up to ``limit``), so it adds to a process's peak memory only while no file
    is being written. Thread-safe.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self._idle: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> mmap.mmap:
        """An idle buffer of ``size`` bytes, else a new one."""
        with self._lock:
            for i, buf in enumerate(self._idle):
                if len(buf) == size:
                    return self._idle.pop(i)
        return mmap.mmap(-1, size)

    def give(self, buf: mmap.mmap) -> None:
        """Keep ``buf`` for a later file, or unmap it when the pool is full."""
        limit = 2 * (writes_in_flight() + 1) * write_buffer_bytes() if self.limit is None else self.limit
        with self._lock:
            if not buf.closed and sum(map(len, self._idle)) + len(buf) <= limit:
                self._idle.append(buf)
                return
        with contextlib.suppress(BufferError):  # a failed write's traceback still views it
            buf.close()

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(map(len, self._idle))


_POOL = _BufferPool()


def direct_io_enabled() -> bool:
    """Whether new files try ``O_DIRECT`` (Linux, unless ``CKPT_DIRECT_IO=0``)."""
    return hasattr(os, "O_DIRECT") and knobs.get_bool("DIRECT_IO")


def open_direct(path: str) -> int | None:
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
    """A new temporary file in ``directory``, appended to by one thread, then finished or aborted.

    ``buffer_bytes`` and ``inflight`` (None: the knobs ``WRITE_BUFFER`` / ``WRITES_IN_FLIGHT``)
    size the direct-I/O path: the file holds at most ``inflight + 1`` buffers of
    ``buffer_bytes`` (rounded down to whole pages) while it is being written. ``direct=False``:
    through the page cache whatever the knob says (a file that is read back soon).
    """

    def __init__(self, directory: Path, prefix: str, suffix: str, buffer_bytes: int | None = None,
                 inflight: int | None = None, *, direct: bool = True) -> None:
        buffer_bytes = write_buffer_bytes() if buffer_bytes is None else buffer_bytes
        inflight = writes_in_flight() if inflight is None else inflight
        if buffer_bytes < 1 or inflight < 1:
            raise UsageError(f"write buffer {buffer_bytes} bytes and {inflight} writes in flight must be positive")
        fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
        self.path = Path(name)
        self._fd: int | None = fd
        self._size = 0
        self._direct = False
        self._buf_size = max(ALIGN, buffer_bytes // ALIGN * ALIGN)
        self._inflight = inflight
        self._spare: list[tuple[mmap.mmap, np.ndarray[Any, Any]]] = []  # written buffers to refill
        self._cur: tuple[mmap.mmap, np.ndarray[Any, Any]] | None = None  # the buffer being filled
        self._fill = 0  # bytes in the current buffer
        self._flushed = 0  # file offset where the current buffer's bytes go
        self._writer: ThreadPoolExecutor | None = None
        self._pending: deque[tuple[Future[None], tuple[mmap.mmap, np.ndarray[Any, Any]]]] = deque()
        handle = open_direct(name) if direct and direct_io_enabled() else None
        if handle is not None:
            os.close(fd)
            self._fd = handle
            self._direct = True

    @property
    def direct(self) -> bool:
        """True when writes bypass the page cache."""
        return self._direct

    @property
    def size(self) -> int:
        """Bytes appended so far."""
        return self._size

    def _live_fd(self) -> int:
        if self._fd is None:
            raise UsageError("file writer is already finished or aborted")
        return self._fd

    def _buffer(self) -> tuple[mmap.mmap, np.ndarray[Any, Any]]:
        """The buffer to fill next: one whose write has completed, else a new one (``_hand_off``
        keeps at most ``inflight`` in flight, so at most ``inflight + 1`` exist)."""
        if self._spare:
            return self._spare.pop()
        buf = _POOL.take(self._buf_size)
        return buf, np.frombuffer(buf, dtype=np.uint8)

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data`` (any C-contiguous buffer)."""
        fd = self._live_fd()
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self._size += len(view)
        if not self._direct:
            while view:
                view = view[os.write(fd, view) :]
            return
        while view:
            if self._cur is None:
                self._cur = self._buffer()
            buf = self._cur[1]
            n = min(len(view), len(buf) - self._fill)
            # numpy copies without holding the interpreter lock (a slice assignment into the
            # mmap would hold it for the whole memcpy, stalling the encoding threads).
            np.copyto(buf[self._fill : self._fill + n], np.frombuffer(view, dtype=np.uint8, count=n))
            self._fill += n
            view = view[n:]
            if self._fill == len(buf):
                self._hand_off(len(buf))

    def _hand_off(self, length: int) -> None:
        """Start writing the current buffer's first ``length`` bytes; the next write takes another."""
        pair, self._cur = self._cur, None
        assert pair is not None
        while len(self._pending) >= self._inflight:
            future, done = self._pending.popleft()
            future.result()
            self._spare.append(done)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=self._inflight, thread_name_prefix="ckpt-write")
        future = self._writer.submit(_pwrite_all, self._live_fd(), pair[0], length, self._flushed)
        self._pending.append((future, pair))
        self._flushed += length
        self._fill = 0

    def _wait(self) -> None:
        """Wait for every write in flight; raise the first failure (after waiting for all)."""
        failure: BaseException | None = None
        while self._pending:
            future, pair = self._pending.popleft()
            try:
                future.result()
            except BaseException as exc:  # the others still use the descriptor: wait for them
                failure = failure or exc
            self._spare.append(pair)
        if failure is not None:
            raise failure

    def finish(self) -> Path:
        """Write what is buffered, set the true length, fsync and close; returns the path."""
        fd = self._live_fd()
        try:
            if self._cur is not None and self._fill:
                tail = self._fill
                padded = -(-tail // ALIGN) * ALIGN
                self._cur[0][tail:padded] = bytes(padded - tail)
                self._hand_off(padded)
            self._wait()
            self._free_buffers()  # before the fsync: the next file may be filling meanwhile
            os.ftruncate(fd, self._size)
            os.fsync(fd)
        except BaseException:
            self.abort()
            raise
        self._close()
        return self.path

    def _free_buffers(self) -> None:
        """Give the buffers no write uses any more back to the pool (the numpy views go
        first: they pin the maps)."""
        maps = [buf for buf, _ in self._spare] + ([self._cur[0]] if self._cur is not None else [])
        self._spare, self._cur = [], None
        for buf in maps:
            _POOL.give(buf)

    def _close(self) -> None:
        try:
            with contextlib.suppress(OSError):  # closing after a failure, raised where it happened
                self._wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown()
                self._writer = None
            self._pending.clear()
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self._free_buffers()

    def abort(self) -> None:
        """Close and delete the file; safe to call more than once."""
        self._close()
        self.path.unlink(missing_ok=True)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite`` may write less than it was given)."""
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def _pwrite_all(fd: int, buf: mmap.mmap, length: int, offset: int) -> None:
    view = memoryview(buf)[:length]
    try:
        pwrite_all(fd, view, offset)
    finally:
        view.release()
