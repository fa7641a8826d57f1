"""Pack files: immutable containers of encoded chunks with a self-describing index.

Format (version 1, little-endian, pinned by tests)::

    header   b"CKPTPACK" + u16 version                                   10 bytes
    payloads encoded chunk payloads from offset 10 (``PackWriter`` writes them back to
             back; a write-ahead pack leaves gaps: bytes no index entry names)
    index    one 90-byte record per chunk, in the order added:
                 chunk id   32 raw bytes (BLAKE3 of the decoded chunk)
                 offset     u64  (from the start of the file)
                 length     u64  (payload bytes)
                 raw_length u64  (decoded bytes)
                 encoding   u8   (``codecs.Encoding``)
                 depth      u8   (delta chain length, 0 = standalone)
                 base id    32 raw bytes, all zeros when there is no base
    trailer  index offset u64, entry count u32, BLAKE3 of the index (32 raw bytes),
             b"CKPTIDX1"                                                52 bytes

The pack id is the BLAKE3 hex of the header, index and trailer. The index names every
chunk by the hash of its content together with its offset, length and encoding, so this
identifies the pack without a second hashing pass over the payloads (each payload is
verified on its own when read, by its chunk id). The index makes the database's chunk
table rebuildable from packs alone; its hash lets a reader trust it.
"""

from __future__ import annotations

import struct
from pathlib import Path

import blake3

from ckptrepo import faults
from ckptrepo.errors import IntegrityError, UsageError
from ckptrepo.ids import ID_HEX_LEN, is_hex
from ckptrepo.locations import ChunkLocation
from ckptrepo.storage.appendfile import AppendFile
from ckptrepo.storage.base import Backend

MAGIC = b"CKPTPACK"
INDEX_MAGIC = b"CKPTIDX1"
VERSION = 1
HEADER = struct.Struct("<8sH")
ENTRY = struct.Struct("<32sQQQBB32s")
TRAILER = struct.Struct("<QI32s8s")
_NO_BASE = bytes(32)
# Most indexes fit in the first tail read: a 64 MiB pack of 1 MiB chunks has a 5.6 KiB index. The
# read is at most 1/64 of a pack (a remote's small packs: a clone reads little beyond their indexes).
_TAIL_GUESS = 64 << 10
_TAIL_LEAST = 2 << 10


def _check_id(value: str, what: str) -> bytes:
    if len(value) != ID_HEX_LEN or not is_hex(value):
        raise UsageError(f"{what} {value!r} is not a {ID_HEX_LEN}-character lowercase hex id")
    return bytes.fromhex(value)


class PackWriter:
    """Streams encoded chunks into a new pack file in ``staging_dir``.

    Owned by one thread. ``finish`` derives the pack id from the header and index without
    reading the payloads back. Until ``finish`` the file is a temporary no reader knows
    about; ``abort`` (or a failed ``finish``) removes it. ``direct``: as ``AppendFile``'s.
    """

    def __init__(self, staging_dir: Path, *, direct: bool = True) -> None:
        self._file: AppendFile | None = AppendFile(staging_dir, "pack-", ".tmp", direct=direct)
        self.path = self._file.path
        self._entries: list[ChunkLocation] = []
        self._size = 0
        try:
            self._append(header())
        except BaseException:
            self.abort()
            raise

    def _append(self, data: bytes | memoryview) -> None:
        if self._file is None:
            raise UsageError("pack writer is already finished or aborted")
        self._file.write(data)
        self._size = self._file.size

    @property
    def size(self) -> int:
        """Bytes written so far (the whole file's size after ``finish``)."""
        return self._size

    @property
    def count(self) -> int:
        """Chunks added so far."""
        return len(self._entries)

    def add(
        self,
        chunk_id: str,
        encoding: int,
        payload: bytes | memoryview,
        raw_length: int,
        *,
        depth: int = 0,
        base_id: str | None = None,
    ) -> ChunkLocation:
        """Append one encoded chunk; returns where it landed (no pack id yet). Validates before
        writing a byte."""
        _check_id(chunk_id, "chunk id")
        if base_id is not None:
            _check_id(base_id, "base id")
        if not 0 <= encoding <= 255 or not 0 <= depth <= 255:
            raise UsageError(f"encoding {encoding} / depth {depth} do not fit in a byte")
        if raw_length < 0:
            raise UsageError(f"raw length {raw_length} is negative")
        size = memoryview(payload).nbytes
        entry = ChunkLocation(chunk_id, "", self._size, size, raw_length, encoding, depth, base_id)
        self._append(payload)
        self._entries.append(entry)
        faults.point("pack.write")
        return entry

    def finish(self) -> tuple[str, Path, list[ChunkLocation]]:
        """Write index and trailer, fsync, close; returns ``(pack_id, temp_path, entries)``, the
        entries located in the new pack.

        The caller moves ``temp_path`` into the store (``Backend.put_file``), which makes it
        visible; this writer no longer owns the file.
        """
        file = self._file
        if file is None:
            raise UsageError("pack writer is already finished or aborted")
        try:
            tail, pack_id = pack_tail(self._entries, self._size)
            self._append(tail)
            # Write ordering step 1 starts here: the pack is durable before put_file names it.
            file.finish()
            self._file = None
        except BaseException:
            self.abort()
            raise
        return pack_id, self.path, [e.in_pack(pack_id) for e in self._entries]

    def abort(self) -> None:
        """Close and delete the temporary file; safe to call more than once."""
        if self._file is not None:
            self._file.abort()
            self._file = None
        self.path.unlink(missing_ok=True)


def pack_key(pack_id: str) -> str:
    """The store key of a pack: ``packs/<first 2 hex>/<pack_id>.pack``."""
    return f"packs/{pack_id[:2]}/{pack_id}.pack"


def header() -> bytes:
    """The first bytes of every pack (magic and version)."""
    return HEADER.pack(MAGIC, VERSION)


def pack_tail(entries: list[ChunkLocation], index_offset: int) -> tuple[bytes, str]:
    """Index and trailer of a pack whose payload area ends at ``index_offset``, and the pack
    id (BLAKE3 of header, index and trailer). Entries may leave gaps in the payload area."""
    index = b"".join(_pack_entry(e) for e in entries)
    trailer = TRAILER.pack(index_offset, len(entries), blake3.blake3(index).digest(), INDEX_MAGIC)
    return index + trailer, blake3.blake3(header() + index + trailer).hexdigest()


def _pack_entry(entry: ChunkLocation) -> bytes:
    base = _NO_BASE if entry.base_id is None else bytes.fromhex(entry.base_id)
    return ENTRY.pack(
        bytes.fromhex(entry.chunk_id),
        entry.offset,
        entry.length,
        entry.raw_length,
        entry.encoding,
        entry.depth,
        base,
    )


def _corrupt(detail: str) -> IntegrityError:
    return IntegrityError(detail=detail)


def _parse_trailer(tail: bytes, file_size: int) -> tuple[int, int, bytes]:
    """(index offset, entry count, index hash) from bytes ending at the end of the file."""
    if file_size < HEADER.size + TRAILER.size or len(tail) < TRAILER.size:
        raise _corrupt(f"pack of {file_size} bytes is too short to hold a header and trailer")
    index_offset, count, digest, magic = TRAILER.unpack_from(tail, len(tail) - TRAILER.size)
    if magic != INDEX_MAGIC:
        raise _corrupt(f"pack trailer magic is {magic!r}, expected {INDEX_MAGIC!r}")
    if index_offset < HEADER.size or index_offset + count * ENTRY.size + TRAILER.size != file_size:
        raise _corrupt(f"pack trailer puts {count} index entries at {index_offset} in a {file_size}-byte pack")
    return index_offset, count, digest


def _parse_entries(index: bytes, count: int, digest: bytes, index_offset: int, pack_id: str) -> list[ChunkLocation]:
    if blake3.blake3(index).digest() != digest:
        raise _corrupt("pack index does not match its hash")
    entries = []
    for k in range(count):
        cid, offset, length, raw_length, encoding, depth, base = ENTRY.unpack_from(index, k * ENTRY.size)
        if offset < HEADER.size or offset + length > index_offset:
            raise _corrupt(f"pack index entry {k} ({offset}+{length}) lies outside the payload area")
        base_id = None if base == _NO_BASE else base.hex()
        entries.append(ChunkLocation(cid.hex(), pack_id, offset, length, raw_length, encoding, depth, base_id))
    return entries


def _check_header(head: bytes) -> None:
    magic, version = HEADER.unpack_from(head, 0)
    if magic != MAGIC:
        raise _corrupt(f"pack header magic is {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise _corrupt(f"pack format version {version}, this ckptrepo reads {VERSION}")


def parse_index(data: bytes, file_size: int | None = None, *, pack_id: str = "") -> list[ChunkLocation]:
    """The entries of a pack from its bytes, located in pack ``pack_id``.

    ``data`` is the whole file, or (with ``file_size``) a tail of it that contains at least
    the index and trailer. Raises IntegrityError when magic, version, lengths or the index
    hash are wrong.
    """
    if file_size is None:
        file_size = len(data)
        if len(data) >= HEADER.size:
            _check_header(data)
    if len(data) > file_size:
        raise UsageError(f"{len(data)} bytes given for a {file_size}-byte pack")
    index_offset, count, digest = _parse_trailer(data, file_size)
    start = len(data) - (file_size - index_offset)
    if start < 0:
        raise UsageError("the given tail does not reach back to the pack index")
    index = data[start : start + count * ENTRY.size]
    return _parse_entries(index, count, digest, index_offset, pack_id)


def read_index(backend: Backend, key: str, *, pack_id: str = "", named: bool = False,
               size: int | None = None) -> list[ChunkLocation]:
    """The entries of the pack stored under ``key`` (located in pack ``pack_id``), reading only
    its header, trailer and index. ``named``: also check that header, index and trailer hash to
    ``pack_id`` (a pack stored under another pack's name, or renamed, is refused). ``size``: the
    object's size, when a listing gave it; then the header is not read either (one request in
    all: a remote's index), and the name check takes the header this version writes."""
    try:
        if size is None:
            size = backend.size(key)
            head = None
        else:
            head = header()
        if size < HEADER.size + TRAILER.size:
            raise _corrupt(f"{size} bytes is too short to be a pack")
        if head is None:
            head = backend.get_range(key, 0, HEADER.size)
        _check_header(head)
        tail_len = min(size, max(_TAIL_LEAST, min(_TAIL_GUESS, size // 64)))
        tail = backend.get_range(key, size - tail_len, tail_len)
        index_offset, _, _ = _parse_trailer(tail, size)
        if size - index_offset > tail_len:
            tail = backend.get_range(key, index_offset, size - index_offset)
        entries = parse_index(tail, size, pack_id=pack_id)
        if named:
            own = tail[len(tail) - (size - index_offset):]
            got = blake3.blake3(head + own).hexdigest()
            if got != pack_id:
                raise _corrupt(f"it hashes to {got[:10]}, not to its name")
        return entries
    except IntegrityError as exc:
        raise _corrupt(f"pack {key}: {exc.fields.get('detail', exc)}") from exc
