"""Writing encoded chunks into packs in a store, and reading them back verified.

Write ordering step 1 happens here: ``PackSink`` makes packs durable in the backend and
only then hands back their chunk locations. The caller inserts rows for them (step 2);
until it does, nothing references the packs, and a crash leaves at most unreferenced
packs that gc reclaims.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ckptrepo import faults
from ckptrepo.chunks.codecs import Encoding, decode, decode_delta
from ckptrepo.chunks.pack import PackWriter, pack_key
from ckptrepo.errors import IntegrityError, StorageError, UsageError
from ckptrepo.ids import hash_bytes
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.base import Backend


@dataclass(frozen=True)
class SealedPack:
    """A pack that is durable in the store, with the locations of its chunks."""

    pack_id: str
    size: int
    locations: list[ChunkLocation]


class PackSink:
    """Appends already-encoded chunks into packs of ~``pack_target`` bytes.

    Single-threaded: the caller serializes ``add``. When the open pack reaches
    ``pack_target``, ``add`` hands it to a background thread that finishes it (index,
    fsync) and ``put_file``s it, while the caller goes on filling the next pack, so the
    fsync of one pack overlaps the encoding and writing of the next. ``seal`` finishes
    the open pack the same way, waits for every pack in flight and returns all packs made
    durable since the last ``seal``, oldest first (or raises the first failure). Nothing
    is visible to the database until the caller inserts rows for the returned locations.
    A chunk id added twice between two ``seal`` calls is stored once. ``abort`` deletes
    the open pack's temporary file and waits for packs in flight; packs already put stay,
    unreferenced, for gc to reclaim. ``direct=False``: pack files are written through the page
    cache (``storage.appendfile``), for packs that are read back soon.
    """

    def __init__(self, backend: Backend, pack_target: int, *, direct: bool = True) -> None:
        if pack_target < 1:
            raise UsageError(f"pack target {pack_target} must be positive")
        self._backend = backend
        self._direct = direct
        self._target = pack_target
        self._writer: PackWriter | None = None
        self._inflight: list[Future[SealedPack | None]] = []
        self._sealer: ThreadPoolExecutor | None = None
        self._failed = False  # a pack failed in the background: put no later one
        self._seen: set[str] = set()

    @property
    def pending_bytes(self) -> int:
        """Bytes in the open pack: accepted by ``add`` but not yet durable in the store."""
        return 0 if self._writer is None else self._writer.size

    def add(
        self,
        chunk_id: str,
        encoding: int,
        payload: bytes | memoryview,
        raw_length: int,
        *,
        depth: int = 0,
        base_id: str | None = None,
    ) -> None:
        """Append one encoded chunk to the open pack (starting one if needed)."""
        if chunk_id in self._seen:
            return
        if self._writer is None:
            self._raise_failures()
            self._writer = PackWriter(self._backend.staging_dir(), direct=self._direct)
        self._writer.add(chunk_id, encoding, payload, raw_length, depth=depth, base_id=base_id)
        self._seen.add(chunk_id)
        if self._writer.size >= self._target:
            self._hand_off_open_pack()

    def _raise_failures(self) -> None:
        """Re-raise the failure of a pack already finished in the background, if any."""
        for future in self._inflight:
            if future.done() and future.exception() is not None:
                future.result()

    def _hand_off_open_pack(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        if self._sealer is None:
            self._sealer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-pack")
        self._inflight.append(self._sealer.submit(self._put, writer))

    def _put(self, writer: PackWriter) -> SealedPack | None:
        if writer.count == 0 or self._failed:
            writer.abort()
            return None
        pack_id, path, entries = writer.finish()
        try:
            # Step 1 of the write ordering: durable and named in the store before any row
            # can point at it.
            faults.point("pack.before_put")
            self._backend.put_file(pack_key(pack_id), path)
            faults.point("pack.after_put")
        except BaseException:
            self._failed = True
            writer.abort()
            raise
        return SealedPack(pack_id, writer.size, entries)

    def _drain(self) -> list[SealedPack]:
        """Wait for every pack in flight; their packs in order, or the first failure."""
        inflight, self._inflight = self._inflight, []
        failure: BaseException | None = None
        sealed: list[SealedPack] = []
        for future in inflight:
            try:
                pack = future.result()
            except BaseException as exc:  # keep waiting: no thread may outlive the call
                failure = failure or exc
                continue
            if pack is not None:
                sealed.append(pack)
        if self._sealer is not None:
            self._sealer.shutdown(wait=True)
            self._sealer = None
        self._failed = False
        if failure is not None:
            raise failure
        return sealed

    def seal(self) -> list[SealedPack]:
        """Make every pack written so far durable in the store and return them (oldest first)."""
        self._hand_off_open_pack()
        try:
            return self._drain()
        finally:
            self._seen.clear()

    def abort(self) -> None:
        """Drop the open pack, wait for packs in flight and forget them; safe to repeat."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.abort()
        with contextlib.suppress(BaseException):  # the commit is being abandoned anyway
            self._drain()
        self._seen.clear()


def _bytes_view(buffer: memoryview) -> memoryview:
    return buffer if buffer.format == "B" and buffer.ndim == 1 else buffer.cast("B")


BaseLookup = Callable[[Collection[str]], dict[str, ChunkLocation]]
"""Locations of chunks by id (those the index has); used to find delta bases."""


class OtherCopy(Protocol):
    """Another copy of a chunk (a remote's), for a read whose own copy is missing or damaged."""

    def read_into(self, chunk_id: str, out: memoryview) -> None:
        """Fill ``out`` with the chunk's bytes, verified; IntegrityError or StorageError if it cannot."""
        ...


Fallback = Callable[[ChunkLocation], "OtherCopy | None"]
"""Where else chunk ``loc`` is stored, or None (``ChunkReader(fallback=)``)."""


class ChunkReader:
    """Reads chunks by location, decodes them and verifies ``BLAKE3(decoded) == chunk_id``.

    A DELTA chunk is decoded by first decoding its base (recursively, down its chain,
    without verifying the intermediate bases) and applying its difference; only the final
    bytes are verified, so a corrupt base fails the check instead of yielding wrong bytes.
    Bases are taken from the ``bases`` mapping given to a read (see ``bases_for``), else
    asked of ``lookup``.

    Thread-safe: several checkout threads may share one (each gets its own scratch
    buffers for fetched payloads and decoded bases).
    A mismatch raises IntegrityError naming the chunk and its pack; a missing pack raises
    the backend's StorageError, once a second read where the index places the chunk and its
    bases now (locations looked up before a move whose old pack is gone) has failed too.
    """

    def __init__(self, backend: Backend, lookup: BaseLookup | None = None, *, max_depth: int = 64,
                 fallback: Fallback | None = None) -> None:
        self._backend = backend
        self._lookup = lookup
        self._max_depth = max_depth
        self._fallback = fallback
        self._local = threading.local()

    def bases_for(self, locs: Iterable[ChunkLocation]) -> dict[str, ChunkLocation]:
        """Every location the delta chains of ``locs`` need, by chunk id: one lookup per chain level."""
        found: dict[str, ChunkLocation] = {}
        wanted = {loc.base_id for loc in locs if loc.base_id is not None}
        for _ in range(self._max_depth):
            wanted -= found.keys()
            if not wanted or self._lookup is None:
                break
            got = self._lookup(sorted(wanted))
            if not got:
                break
            found.update(got)
            wanted = {loc.base_id for loc in got.values() if loc.base_id is not None}
        return found

    def _fetch(self, key: str, loc: ChunkLocation, slot: int = 0) -> memoryview:
        """The payload, read into one of this thread's reused buffers (no allocation, no page faults)."""
        buffers: list[bytearray] | None = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = []
        while len(buffers) <= slot:
            buffers.append(bytearray(0))
        if len(buffers[slot]) < loc.length:
            buffers[slot] = bytearray(loc.length)
        view = memoryview(buffers[slot])[: loc.length]
        self._backend.read_into(key, loc.offset, view)
        return view

    def _base_buffer(self, depth: int, size: int) -> memoryview:
        """This thread's scratch buffer for the decoded base at chain level ``depth``."""
        bases: list[np.ndarray] | None = getattr(self._local, "bases", None)
        if bases is None:
            bases = self._local.bases = []
        while len(bases) <= depth:
            bases.append(np.empty(0, dtype=np.uint8))
        if bases[depth].shape[0] < size:
            bases[depth] = np.empty(size, dtype=np.uint8)
        return bases[depth][:size].data

    def read(self, loc: ChunkLocation, bases: Mapping[str, ChunkLocation] | None = None) -> bytes:
        """The chunk's raw bytes, verified."""
        out = bytearray(loc.raw_length)
        self.read_into(loc, memoryview(out), bases)
        return bytes(out)

    def read_into(self, loc: ChunkLocation, out: memoryview, bases: Mapping[str, ChunkLocation] | None = None,
                  *, verify: bool = True, known: Mapping[str, memoryview] | None = None) -> None:
        """Write the chunk's raw bytes into ``out`` (exactly ``loc.raw_length`` bytes), verified.

        RAW chunks are read straight into ``out``; others are fetched, then decoded into
        it. On IntegrityError ``out`` holds unverified bytes and must not be used.
        ``verify=False`` skips the final hash check: only for bytes used as a delta base at
        ingest, where decoding is deterministic, so a delta taken against damaged base bytes
        still restores exactly (against the same bytes) and the restored chunk is verified.
        ``known``: decoded bytes of chunks by id that the caller holds (read and verified
        already: a merge reads a fine-tune's chunks after their keyframes), taken as delta
        bases instead of decoding those again; the result is verified all the same.
        """
        target = _bytes_view(out)
        if len(target) != loc.raw_length:
            raise UsageError(f"output buffer is {len(target)} bytes, chunk {loc.chunk_id} has {loc.raw_length}")
        try:
            self._materialize(loc, target, bases or {}, 0, known)
            if verify:
                self._verify(loc, target)
        except (IntegrityError, StorageError) as exc:
            if isinstance(exc, StorageError) and self._read_where_now(loc, target, verify, known):
                return
            other = self._fallback(loc) if self._fallback is not None else None
            if other is None:
                raise
            # Another copy (a remote's): read and verified from there, its delta bases with it.
            try:
                other.read_into(loc.chunk_id, target)
            except (IntegrityError, StorageError):
                raise exc from None

    def _read_where_now(self, loc: ChunkLocation, target: memoryview, verify: bool,
                        known: Mapping[str, memoryview] | None) -> bool:
        """After a read failed in the store (a pack gone): read again where the index says the
        chunk and its delta bases are now. A reader's locations may predate a move (a repack, a
        keyframe relocated by a commit, ``catalog.relocate_chunks``) whose old pack ``gc`` has
        deleted since; the index then names the current copy. True once read (and verified);
        False when the index names no other place or that read fails too."""
        if self._lookup is None:
            return False
        now = self._lookup([loc.chunk_id]).get(loc.chunk_id, loc)
        try:
            self._materialize(now, target, {}, 0, known)
            if verify:
                self._verify(now, target)
        except (IntegrityError, StorageError):
            return False
        return True

    def _materialize(self, loc: ChunkLocation, target: memoryview, bases: Mapping[str, ChunkLocation],
                     level: int, known: Mapping[str, memoryview] | None = None) -> None:
        """Decode ``loc`` into ``target`` (unverified), walking its delta chain (down to a base in ``known``)."""
        key = pack_key(loc.pack_id)
        if loc.encoding == Encoding.RAW:
            if loc.length != loc.raw_length:
                raise self._corrupt(loc, f"raw chunk stored as {loc.length} bytes, expected {loc.raw_length}")
            self._backend.read_into(key, loc.offset, target)
            return
        if loc.encoding != Encoding.DELTA:
            self._decode(loc, self._fetch(key, loc), target)
            return
        if loc.base_id is None or level >= self._max_depth:
            raise self._corrupt(loc, "delta chunk without a base" if loc.base_id is None else "delta chain too long")
        held = known.get(loc.base_id) if known else None
        if held is not None and len(held) == loc.raw_length:
            self._apply_delta(loc, key, level, held, target)
            return
        base = bases.get(loc.base_id)
        if base is None and self._lookup is not None:
            base = self._lookup([loc.base_id]).get(loc.base_id)
        if base is None:
            raise self._corrupt(loc, f"its delta base {loc.base_id} is missing from the index")
        if base.raw_length != loc.raw_length:
            raise self._corrupt(loc, f"its delta base {loc.base_id} is {base.raw_length} bytes")
        base_bytes = self._base_buffer(level, loc.raw_length)
        self._materialize(base, base_bytes, bases, level + 1, known)
        self._apply_delta(loc, key, level, base_bytes, target)

    def _apply_delta(self, loc: ChunkLocation, key: str, level: int, base_bytes: memoryview,
                     target: memoryview) -> None:
        """Fetch delta chunk ``loc``'s payload and decode it against ``base_bytes`` into ``target``."""
        payload = self._fetch(key, loc, level + 1)
        try:
            decode_delta(payload, base_bytes, target)
        except IntegrityError as exc:
            raise self._corrupt(loc, str(exc.fields.get("detail", exc))) from exc

    def _decode(self, loc: ChunkLocation, payload: bytes | memoryview, out: memoryview | None) -> bytes | memoryview:
        """Decode a fetched standalone payload (into ``out`` if given)."""
        try:
            return decode(loc.encoding, payload, loc.raw_length, out)
        except IntegrityError as exc:
            raise self._corrupt(loc, str(exc.fields.get("detail", exc))) from exc

    def _verify(self, loc: ChunkLocation, data: bytes | memoryview) -> None:
        actual = hash_bytes(data)
        if actual != loc.chunk_id:
            detail = f"decoded bytes hash to {actual}"
            if loc.encoding == Encoding.DELTA:
                detail += f" (a delta against {loc.base_id}: that base or this payload is damaged)"
            raise self._corrupt(loc, detail)

    @staticmethod
    def _corrupt(loc: ChunkLocation, detail: str) -> IntegrityError:
        return IntegrityError(detail=f"chunk {loc.chunk_id} in pack {loc.pack_id}: {detail}")
