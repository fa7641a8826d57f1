"""Write-ahead: an asynchronous commit's staged bytes written raw to pack files at once.

Phase 2 of an asynchronous commit hashes, then writes what turned out new. With phase 2 at
idle priority (``ingest.priority``), on cores a training job keeps busy it hardly ran until
the next ``commit()`` waited for it, and its pack writes then waited for the disk inside
that stall; at normal priority they still follow the hashing. Those writes need almost no
CPU, only an order: they follow hashing and deduplication. ``WriteAhead`` drops that order for the tensors
that will probably be new — those the previous commit of this process did not find
unchanged (``Repo`` keeps the names it found unchanged): normal-priority threads write
their bytes from the staging arena into pack files once phase 1 has copied them (two files
at a time), page-aligned requests straight from the page-aligned arena with direct I/O (no copy,
a few system calls, the interpreter lock released), while phase 2 hashes them.

Phase 2 then only indexes what turned out new (``add``): a new chunk's entry points at its
bytes where the arena put them (file offset = ``PAGE`` + arena offset - the file's base).
``seal`` waits for the writes, writes the header, index and trailer and puts each file in
the store durably (``put_file``), which makes it a pack like any other; a chunk that
turned out to be known stays in the file unindexed (the pack format allows gaps between
payloads, and ``repack`` rewrites these raw packs anyway), and a file in which nothing
turned out new is deleted. Files are cut at chunk boundaries once they span ``target``
bytes. Without direct I/O (a filesystem that refuses it, ``CKPT_DIRECT_IO=0``) the same
writes go through the page cache.

Thread contract: ``start`` runs on the committing thread once phase 1 has copied every
tensor, before phase 2 is queued (``copied`` during the copy, for a fresh arena whose copy
is bound by page faults: the files it has filled are written meanwhile); ``add`` and
``seal`` on phase 2's thread; ``close`` (phase 2's thread, always, also after a failure;
the committing thread when the commit fails before phase 2 is queued) waits for the
writers and deletes every file not put in the store. The staging slot must not be reused before
``close`` has returned. Until ``seal`` puts a file, it is a temporary ``pack-*.tmp`` in the
store's staging directory, which ``verify`` lists and ``gc`` removes after a crash.

Lease: the first write job takes the commit's lease (``lease``, ``ledger.leases``) before it
creates its file, on its own thread, so phase 1 never waits for it; phase 2 goes on holding
the same lease for the commit's packs and manifest, and ``close`` releases it (phase 2 calls
``close`` only after the commit's transaction).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import tempfile
import threading
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ckptrepo import faults
from ckptrepo.chunks.chunker import chunk_step
from ckptrepo.chunks.codecs import Encoding
from ckptrepo.chunks.pack import header, pack_key, pack_tail
from ckptrepo.chunks.store import SealedPack
from ckptrepo.errors import UsageError
from ckptrepo.ingest.staging import PAGE
from ckptrepo.ledger import leases
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.appendfile import direct_io_enabled, open_direct, pwrite_all
from ckptrepo.storage.base import Backend

REQUEST = 8 << 20  # bytes per write request
GAP = 1 << 20  # tensors this close in the arena are written as one extent (with what lies between)


@dataclass
class _File:
    """One write-ahead pack: the arena ranges it holds and the chunks indexed in it."""

    base: int  # the arena offset written at file offset PAGE
    extents: list[tuple[int, int]]  # page-aligned arena ranges, in order
    path: Path | None = None
    entries: list[ChunkLocation] = field(default_factory=list)

    @property
    def end(self) -> int:
        """File offset just past the last written byte: where the index goes."""
        return PAGE + self.extents[-1][1] - self.base


def _down(n: int) -> int:
    return n // PAGE * PAGE


def _up(n: int) -> int:
    return -(-n // PAGE) * PAGE


class WriteAhead:
    """The write-ahead of one commit: which tensors it writes, its files and their entries.

    ``tensors`` are the staged views in phase 2's order, ``written[i]`` whether tensor ``i``
    is written ahead; every written tensor must lie inside ``arena`` (page-aligned, whole
    pages: ``staging.Slot.arena``). A file spans at most ``target`` bytes of the arena,
    except one that holds a single chunk; a tensor is cut between files at its chunk
    boundaries (``chunk_size``, as ``chunks.chunker`` cuts it), so every chunk lies in one file.
    """

    def __init__(self, backend: Backend, arena: torch.Tensor, tensors: list[torch.Tensor],
                 written: list[bool], *, target: int, chunk_size: int) -> None:
        if arena.data_ptr() % PAGE or arena.numel() % PAGE:
            raise UsageError("the write-ahead needs a page-aligned arena of whole pages")
        self._backend = backend
        self._arena = arena
        self.lease = leases.Lease(backend, "commit")  # the commit's, until close
        self._files: list[_File] = []
        # Per tensor: (arena offset, [(first byte of a piece, its file)]) or None.
        self._where: list[tuple[int, list[tuple[int, int]]] | None] = []
        base, size = arena.data_ptr(), arena.numel()
        for t, wanted in zip(tensors, written, strict=True):
            nbytes = t.numel() * t.element_size()
            start = t.data_ptr() - base
            if not wanted or nbytes == 0 or start < 0 or start + nbytes > size:
                self._where.append(None)
                continue
            self._where.append((start, self._place(start, nbytes, chunk_step(t.element_size(), chunk_size),
                                                   target)))
        self._lock = threading.Lock()
        self._futures: list[Future[None]] = []
        self._queued = 0  # files handed to the executor so far (in order)
        self._started = False
        self._closed = False

    def _place(self, start: int, nbytes: int, step: int, target: int) -> list[tuple[int, int]]:
        """Lay one tensor's bytes into files, whole chunks at a time; returns its pieces."""
        pieces: list[tuple[int, int]] = []
        pos = 0
        while pos < nbytes:
            lo = start + pos
            f = self._files[-1] if self._files else None
            if f is None or _up(lo + min(step, nbytes - pos)) - f.base > target:
                f = _File(_down(lo), [])
                self._files.append(f)
            take = min(nbytes - pos, max(step, (f.base + target - lo) // step * step))
            a, b = _down(lo), _up(lo + take)
            if f.extents and a <= f.extents[-1][1] + GAP:
                f.extents[-1] = (f.extents[-1][0], max(f.extents[-1][1], b))
            else:
                f.extents.append((a, b))
            pieces.append((pos, len(self._files) - 1))
            pos += take
        return pieces

    @property
    def tensors(self) -> int:
        """How many tensors are written ahead."""
        return sum(w is not None for w in self._where)

    def start(self, executor: Executor) -> None:
        """Queue one job per file not queued yet on ``executor`` (normal-priority threads: as
        many files are written at once as it has threads); nothing once closed. The arena
        must hold every tensor's bytes by then (phase 1 has ended)."""
        with self._lock:
            if self._closed or self._started:
                return
            self._started = True
            self._queue(executor, len(self._files))

    def copied(self, below: int, executor: Executor) -> None:
        """Phase 1 has copied every byte of the arena below offset ``below``: queue the files
        that lie wholly there (``start`` queues the rest). For copies slow enough that the
        writes gain more than their wake-ups cost the copying thread (``staging.Slot.fresh``)."""
        with self._lock:
            if self._closed or self._started:
                return
            n = self._queued
            while n < len(self._files) and self._files[n].extents[-1][1] <= below:
                n += 1
            self._queue(executor, n)

    def _queue(self, executor: Executor, upto: int) -> None:
        for f in self._files[self._queued : upto]:
            self._futures.append(executor.submit(self._write, f))
        self._queued = max(self._queued, upto)

    def _write(self, f: _File) -> None:
        view = self._arena.numpy().data
        self.lease.take()  # durable before the file: gc keeps what a live lease may own
        fd, name = tempfile.mkstemp(prefix="pack-", suffix=".tmp", dir=self._backend.staging_dir())
        f.path = Path(name)
        direct = open_direct(name) if direct_io_enabled() else None
        try:
            os.pwrite(fd, header(), 0)
            out = fd if direct is None else direct
            for lo, hi in f.extents:
                for at in range(lo, hi, REQUEST):
                    end = min(hi, at + REQUEST)
                    faults.point("pack.write")
                    pwrite_all(out, view[at:end], PAGE + at - f.base)
            # Flush the payloads now, while training runs: the fsync of ``seal``'s ``put_file``
            # (inside the next commit's wait, when phase 2 is late) then has only the index to flush.
            os.fdatasync(out)
        finally:
            os.close(fd)
            if direct is not None:
                os.close(direct)

    def add(self, tensor: int, offset: int, chunk_id: str, length: int) -> bool:
        """Index the new raw chunk at byte ``offset`` of tensor ``tensor`` if that tensor is
        written ahead (True); False: the caller stores it some other way."""
        where = self._where[tensor] if tensor < len(self._where) else None
        if where is None:
            return False
        start, pieces = where
        piece = pieces[bisect.bisect_right(pieces, (offset, len(self._files))) - 1]
        f = self._files[piece[1]]
        f.entries.append(ChunkLocation(chunk_id, "", PAGE + start + offset - f.base, length, length, int(Encoding.RAW)))
        return True

    def seal(self) -> list[SealedPack]:
        """Wait for the writes (re-raising their failure), finish every file that holds a new
        chunk, make it durable and put it in the store; returns those packs."""
        with self._lock:
            futures, started = self._futures, self._started
        for future in futures:
            future.exception()  # every write has ended before any file is sealed or removed
        for future in futures:
            future.result()
        if not started and any(f.entries for f in self._files):
            raise UsageError("write-ahead chunks were indexed but the writes never started")
        sealed: list[SealedPack] = []
        for f in self._files:
            if f.path is not None and not f.entries:
                f.path.unlink(missing_ok=True)
                f.path = None
            if f.path is None:
                continue
            index_offset = f.end
            tail, pack_id = pack_tail(f.entries, index_offset)
            fd = os.open(f.path, os.O_WRONLY)
            try:
                pwrite_all(fd, memoryview(tail), index_offset)
            finally:
                os.close(fd)
            # Step 1 of the write ordering: durable and named in the store before any row can
            # point at it. ``put_file`` makes the file durable (a local store fsyncs it, which
            # flushes the directly written payloads from the device's cache too).
            faults.point("pack.before_put")
            self._backend.put_file(pack_key(pack_id), f.path)
            faults.point("pack.after_put")
            f.path = None
            size = index_offset + len(tail)
            sealed.append(SealedPack(pack_id, size, [e.in_pack(pack_id) for e in f.entries]))
        return sealed

    def close(self) -> None:
        """Wait for the writer, delete the files not put in the store and release the lease;
        safe to repeat. Phase 2 calls it only once the commit's transaction has ended."""
        with self._lock:
            self._closed = True
            futures = self._futures
        for future in futures:
            future.exception()  # waited for; a failure was (or will not be) reported by seal
        for f in self._files:
            if f.path is not None:
                with contextlib.suppress(OSError):
                    f.path.unlink(missing_ok=True)
                f.path = None
        self.lease.release()
