"""Copying chunks between stores: payloads read by byte range, written into new packs.

A chunk's encoded payload is copied as it is (its encoding, delta depth and base go with it), so
the destination needs a chunk's delta base as well: callers pass closed sets (``closure``). A pack
all of whose chunks the destination needs travels whole (``copy_whole``: a link or a file copy,
then one upload), keeping its id; the others' chunks are packed anew (``copy``).
Adjacent ranges of one pack are read in one request (gaps up to 64 KiB are read and dropped),
packs are sealed at the repository's pack target and stored on one background thread while the
next one fills, so reading, packing and uploading overlap. What moved is counted in a ``Meter``.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.base import Backend

_GAP = 64 << 10  # bytes between two payloads of one pack still read in one request
_SPAN = 32 << 20  # the most one request reads
_READERS = 4


@dataclass
class Meter:
    """Bytes and objects moved, counted from several threads."""

    bytes_read: int = 0
    bytes_written: int = 0
    objects_written: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def read(self, n: int) -> None:
        with self._lock:
            self.bytes_read += n

    def wrote(self, n: int) -> None:
        with self._lock:
            self.bytes_written += n
            self.objects_written += 1


def closure(wanted: Collection[str], lookup: Callable[[Collection[str]], Mapping[str, ChunkLocation]]
            ) -> dict[str, ChunkLocation]:
    """The locations of ``wanted`` chunks and, transitively, of their delta bases (``lookup``
    gives locations by id; ids it does not know are left out)."""
    found: dict[str, ChunkLocation] = {}
    todo = set(wanted)
    while todo:
        got = lookup(sorted(todo))
        found.update(got)
        todo = {loc.base_id for loc in got.values() if loc.base_id is not None} - found.keys()
    return found


def _ranges(locs: list[ChunkLocation]) -> Iterator[tuple[str, int, int, list[ChunkLocation]]]:
    """``(pack, offset, length, locations in it)``: one read per run of close payloads of a pack."""
    by_pack: dict[str, list[ChunkLocation]] = {}
    for loc in locs:
        by_pack.setdefault(loc.pack_id, []).append(loc)
    for pack, group in sorted(by_pack.items()):
        group.sort(key=lambda c: c.offset)
        run = [group[0]]
        for loc in group[1:]:
            end = run[-1].offset + run[-1].length
            if loc.offset - end <= _GAP and loc.offset + loc.length - run[0].offset <= _SPAN:
                run.append(loc)
            else:
                yield pack, run[0].offset, run[-1].offset + run[-1].length - run[0].offset, run
                run = [loc]
        yield pack, run[0].offset, run[-1].offset + run[-1].length - run[0].offset, run


def payloads(source: Backend, locs: Iterable[ChunkLocation], meter: Meter) -> Iterator[tuple[ChunkLocation, bytes]]:
    """Each location with its encoded payload read from ``source``, a few ranges in flight."""
    from ckptrepo.chunks.pack import pack_key  # numpy: loaded when chunks move

    todo = list(_ranges(list(locs)))

    def read(item: tuple[str, int, int, list[ChunkLocation]]) -> tuple[bytes, int, list[ChunkLocation]]:
        pack, offset, length, run = item
        data = source.get_range(pack_key(pack), offset, length)
        meter.read(length)
        return data, offset, run

    with ThreadPoolExecutor(_READERS, thread_name_prefix="ckpt-transfer") as pool:
        for data, offset, run in pool.map(read, todo):
            for loc in run:
                yield loc, data[loc.offset - offset : loc.offset - offset + loc.length]


def copy(source: Backend, locs: Iterable[ChunkLocation], dest: Backend, pack_target: int,
         meter: Meter) -> list[tuple[str, int, list[ChunkLocation]]]:
    """Write the payloads of ``locs`` (read from ``source``) into new packs stored in ``dest``;
    returns each pack as ``(pack id, size, entries located in it)`` once every one is durable
    there. On failure no pack is left half-written (a stored one is a leftover for gc)."""
    from ckptrepo.chunks.pack import PackWriter, pack_key

    stored: list[tuple[str, int, list[ChunkLocation]]] = []
    pending: list[Future[None]] = []
    writer: PackWriter | None = None

    def put(pid: str, path: Path, size: int) -> None:
        dest.put_file(pack_key(pid), path)
        meter.wrote(size)

    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-upload") as uploads:
        try:
            for loc, payload in payloads(source, locs, meter):
                if writer is None:
                    writer = PackWriter(dest.staging_dir())
                writer.add(loc.chunk_id, loc.encoding, payload, loc.raw_length, depth=loc.depth, base_id=loc.base_id)
                if writer.size >= pack_target:
                    pid, path, entries = writer.finish()
                    stored.append((pid, writer.size, entries))
                    pending.append(uploads.submit(put, pid, path, writer.size))
                    writer = None
            if writer is not None and writer.count:
                pid, path, entries = writer.finish()
                stored.append((pid, writer.size, entries))
                pending.append(uploads.submit(put, pid, path, writer.size))
                writer = None
            for done in pending:
                done.result()
        except BaseException:
            if writer is not None:
                writer.abort()
            for p in pending:
                p.cancel()
            raise
    return stored


def _staged_copy(source: Backend, key: str, dest: Backend) -> Path | None:
    """A copy of ``source``'s object ``key`` in ``dest``'s staging folder, made by a hard link or a
    file copy when ``source`` keeps it as a local file (None otherwise)."""
    root = getattr(getattr(source, "local", source), "root", None)
    if not isinstance(root, Path) or not (root / key).is_file():
        return None
    staged = dest.staging_dir() / f"copy-{os.getpid()}-{threading.get_ident()}-{key.rpartition('/')[2]}.tmp"
    staged.unlink(missing_ok=True)
    try:
        os.link(root / key, staged)
    except OSError:
        shutil.copyfile(root / key, staged)
    return staged


def copy_whole(source: Backend, packs: Mapping[str, list[ChunkLocation]], dest: Backend,
               meter: Meter) -> list[tuple[str, int, list[ChunkLocation]]]:
    """Store each of ``packs`` (pack id -> its index entries) in ``dest`` as it is: packs every
    chunk of which the destination needs, so nothing else travels with them, and the pack keeps
    its id on both sides. Returns ``(pack id, size, entries)`` once every one is durable there."""

    from ckptrepo.chunks.pack import pack_key

    def one(item: tuple[str, list[ChunkLocation]]) -> tuple[str, int, list[ChunkLocation]]:
        pid, entries = item
        key = pack_key(pid)
        staged = _staged_copy(source, key, dest)
        if staged is not None:
            size = staged.stat().st_size
            meter.read(size)
            dest.put_file(key, staged)
        else:
            data = source.get(key)
            size = len(data)
            meter.read(size)
            dest.put_bytes(key, data)
        meter.wrote(size)
        return pid, size, entries

    with ThreadPoolExecutor(_READERS, thread_name_prefix="ckpt-upload") as pool:
        return list(pool.map(one, sorted(packs.items())))
