"""A commit as the files its export would hold, read in place: ranged reads from the chunks.

``CommitView`` lists, for one commit, the files ``Repo.export`` would write (``layout``):

- ``hf``: a Hugging Face folder, the commit's files (``entries.file_entry``: config.json,
  tokenizer files...) and the model's weights as ``formats.hf_layout`` plans them (one
  ``model.safetensors``, or shards and ``model.safetensors.index.json``);
- ``safetensors``: one ``model.safetensors``, of a flat state (byte for byte what ``ckpt
  checkout REV -o model.safetensors`` writes) or of the model's weights (``hf_layout.model_keys``);
- ``auto``: ``hf`` when the commit has a ``config.json``, else ``safetensors``.

Each file is a list of ``Piece`` s that cover it end to end: literal bytes (a safetensors
header, the index JSON) or the stored bytes of one entry (a tensor's C-order bytes, a commit
file's bytes). ``read(name, start, end)`` decodes only the chunks the range touches, each one
verified against its id by ``ChunkReader`` before any of its bytes is returned (a damaged chunk
raises IntegrityError, never wrong bytes). Decoded chunks are kept in a small LRU (``CKPT_VIEW_CACHE``
bytes) so that the many small sequential reads of a FUSE mount (128 KiB each) decode a 1 MiB
chunk once, and after each read the chunks of the next ``CKPT_VIEW_READ_AHEAD`` bytes of the
file are decoded on the worker pool ahead of the reader. A large read decodes its interior
chunks straight into its output, in parallel, and keeps only its two edge chunks.

A tensor stored as boxes (``TensorRow.boxes``: shards of a distributed commit) is read through
a map from its C-order bytes to the boxes' stream, so it too reads only the chunks a range needs.

Thread-safe: any number of threads may read one view (the cache and its in-flight table are
locked; decoding happens outside the lock, and two readers of one chunk share one decode).
The view pins its commit: it never changes, whatever the branch it was opened by does later.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from ckptrepo import entries, knobs
from ckptrepo.chunks.store import ChunkReader
from ckptrepo.chunks.tensors import read_runs
from ckptrepo.dtypes import dtype
from ckptrepo.errors import IntegrityError, UnknownFile, UsageError
from ckptrepo.formats import hf_layout
from ckptrepo.ids import short
from ckptrepo.locations import ChunkLocation
from ckptrepo.restore.hf_export import model_specs
from ckptrepo.rows import TensorRow

LAYOUTS = ("auto", "hf", "safetensors")
CONFIG_NAME = "config.json"  # what makes ``auto`` choose an HF folder
_DIRECT_MIN_CHUNKS = 3  # a read touching this many chunks decodes its interior ones straight into its output


@dataclass(frozen=True, slots=True)
class Piece:
    """Bytes ``[start, start + size)`` of a file: ``data`` (literal) or the stored bytes of ``entry``
    (a tensor's C-order bytes or a commit file's bytes, from its first byte)."""

    start: int
    size: int
    data: bytes | None = None
    entry: str | None = None


@dataclass(frozen=True, slots=True)
class ViewFile:
    """One file of a view: its path (POSIX, relative), size and what backs each of its bytes."""

    name: str
    size: int
    pieces: tuple[Piece, ...]

    def describe(self) -> list[tuple[int, int, str]]:
        """``(start, size, what)`` per piece: ``header``/``bytes`` for literal bytes, else the entry name."""
        return [(p.start, p.size, p.entry if p.entry is not None else "bytes") for p in self.pieces]


class ChunkCache:
    """Decoded, verified chunks by id, least recently used first out, at most ``max_bytes`` together
    (0: nothing kept); a chunk being decoded is shared by every thread that asks for it meanwhile."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._pending: dict[str, Future[bytes]] = {}
        self._lock = threading.Lock()
        self.decoded = 0  # chunks decoded through the cache (tests and benchmarks read it)

    def peek(self, chunk_id: str) -> bytes | None:
        """The chunk's bytes when held (marked as recently used), else None; decodes nothing."""
        with self._lock:
            data = self._held.get(chunk_id)
            if data is not None:
                self._held.move_to_end(chunk_id)
            return data

    def busy(self, chunk_id: str) -> bool:
        """Whether the chunk is held or being decoded."""
        with self._lock:
            return chunk_id in self._held or chunk_id in self._pending

    def get(self, loc: ChunkLocation, decode: Callable[[ChunkLocation], bytes]) -> bytes:
        """The bytes of chunk ``loc``: held, or being decoded by another thread (waited for), or
        ``decode(loc)`` here (it must verify them); an error is raised to every waiting thread."""
        with self._lock:
            data = self._held.get(loc.chunk_id)
            if data is not None:
                self._held.move_to_end(loc.chunk_id)
                return data
            pending = self._pending.get(loc.chunk_id)
            if pending is None:
                mine: Future[bytes] = Future()
                self._pending[loc.chunk_id] = mine
        if pending is not None:
            return pending.result()
        try:
            data = decode(loc)
        except BaseException as exc:
            with self._lock:
                del self._pending[loc.chunk_id]
            mine.set_exception(exc)
            raise
        with self._lock:
            del self._pending[loc.chunk_id]
            self.decoded += 1
            if len(data) <= self.max_bytes:
                self._held[loc.chunk_id] = data
                self._bytes += len(data)
                while self._bytes > self.max_bytes:
                    _, old = self._held.popitem(last=False)
                    self._bytes -= len(old)
        mine.set_result(data)
        return data


class _Stream:
    """The stored bytes of one entry: its chunks, where each starts, and (boxes) the C-order map."""

    def __init__(self, name: str, row: TensorRow, chunks: list[ChunkLocation], commit_id: str) -> None:
        if len(chunks) != len(row.chunk_ids) or sum(c.raw_length for c in chunks) != row.nbytes:
            raise IntegrityError(detail=f"tensor {name!r} of commit {short(commit_id)} has missing chunks")
        self.name, self.row, self.chunks = name, row, chunks
        self.starts: list[int] = []
        pos = 0
        for loc in chunks:
            self.starts.append(pos)
            pos += loc.raw_length
        self._bases: dict[str, ChunkLocation] | None = None

    def bases(self, reader: ChunkReader) -> dict[str, ChunkLocation]:
        """The delta bases this entry's chunks need (looked up once, on first use)."""
        if self._bases is None:
            self._bases = reader.bases_for(self.chunks)
        return self._bases

    def spans(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The ranges of the stored stream that hold C-order bytes ``[lo, hi)``, in order."""
        if self.row.boxes is None or hi <= lo:
            return [(lo, hi)] if hi > lo else []
        return box_spans(list(self.row.shape), dtype(self.row.dtype).itemsize, self.row.boxes, lo, hi)

    def overlapping(self, lo: int, hi: int) -> range:
        """Indexes of the chunks that hold some of stream bytes ``[lo, hi)``."""
        first = bisect.bisect_right(self.starts, lo) - 1
        last = bisect.bisect_left(self.starts, hi)
        return range(max(first, 0), last)


def box_spans(shape: list[int], itemsize: int, boxes: list[list[list[int]]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The ranges of a boxes tensor's stored stream (each box's C-order bytes in turn) that hold
    bytes ``[lo, hi)`` of its C-order bytes, in C order, adjacent ranges merged. IntegrityError
    when the boxes do not cover those bytes exactly once."""
    if not shape:  # a scalar: one box of one element
        return [(lo, hi)]
    width = shape[-1]
    bases, pos = [], 0
    for _, sizes in boxes:
        bases.append(pos)
        pos += math.prod(sizes) * itemsize
    first_el, end_el = lo // itemsize, -(-hi // itemsize)
    out: list[list[int]] = []
    lead = shape[:-1]
    for row in range(first_el // width, (end_el - 1) // width + 1):
        index, rest = [], row
        for d in reversed(lead):
            index.append(rest % d)
            rest //= d
        index.reverse()
        c0, c1 = max(first_el - row * width, 0), min(end_el - row * width, width)
        pieces = []
        for (offsets, sizes), base in zip(boxes, bases, strict=True):
            if not all(o <= i < o + s for i, o, s in zip(index, offsets[:-1], sizes[:-1], strict=True)):
                continue
            a, b = max(c0, offsets[-1]), min(c1, offsets[-1] + sizes[-1])
            if a >= b:
                continue
            inner = 0
            for i, o, s in zip(index, offsets[:-1], sizes[:-1], strict=True):
                inner = inner * s + (i - o)
            at = base + (inner * sizes[-1] + a - offsets[-1]) * itemsize
            pieces.append((a, at, at + (b - a) * itemsize))
        pieces.sort()
        covered = c0
        for a, start, stop in pieces:
            if a != covered:
                break
            covered += (stop - start) // itemsize
            if out and out[-1][1] == start:
                out[-1][1] = stop
            else:
                out.append([start, stop])
        if covered != c1:
            raise IntegrityError(detail=f"the boxes of a tensor of shape {shape} do not cover row {row} once")
    out[0][0] += lo - first_el * itemsize
    out[-1][1] -= end_el * itemsize - hi
    return [(a, b) for a, b in out if b > a]


class CommitView:
    """The files of commit ``commit_id`` in ``layout`` (see the module docstring) and ranged reads of
    them. Built by ``Repo.view``; pure over the commit's layout until a read decodes chunks."""

    def __init__(self, commit_id: str, skeleton: Any, items: Mapping[str, tuple[TensorRow, list[ChunkLocation]]],
                 reader: ChunkReader, pool: Executor, *, layout: str = "auto",
                 max_shard_size: int | str = hf_layout.DEFAULT_MAX_SHARD_SIZE,
                 cache_bytes: int | None = None, read_ahead: int | None = None) -> None:
        if layout not in LAYOUTS:
            raise UsageError(f"unknown view layout {layout!r}", hint=f"Use one of {', '.join(LAYOUTS)}.")
        self.commit_id = commit_id
        self._items = items
        self._reader = reader
        self._pool = pool
        self._streams: dict[str, _Stream] = {}
        self._streams_lock = threading.Lock()
        self.cache = ChunkCache(knobs.get_int("VIEW_CACHE") if cache_bytes is None else cache_bytes)
        self._read_ahead = knobs.get_int("VIEW_READ_AHEAD") if read_ahead is None else read_ahead
        files = _commit_files(items, commit_id)
        if layout == "auto":
            layout = "hf" if CONFIG_NAME in files else "safetensors"
        self.layout = layout
        built = _hf_files(skeleton, items, files, hf_layout.parse_size(max_shard_size), commit_id) if layout == "hf" \
            else _safetensors_file(skeleton, items, commit_id)
        self.files: dict[str, ViewFile] = {f.name: f for f in sorted(built, key=lambda f: f.name)}
        self.dirs = _dirs(self.files)

    def file(self, name: str) -> ViewFile:
        """The file at relative path ``name``; UnknownFile when the view has none."""
        found = self.files.get(name)
        if found is None:
            raise UnknownFile(name=name, commit=short(self.commit_id))
        return found

    def listdir(self, folder: str = "") -> list[str]:
        """The names directly in ``folder`` (``""``: the top), sorted; UnknownFile when it is none."""
        if folder not in self.dirs:
            raise UnknownFile(name=folder, commit=short(self.commit_id))
        return self.dirs[folder]

    def read(self, name: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of file ``name`` (clipped to its size; ``end`` None: to its end),
        reading only the chunks they lie in, each verified (IntegrityError, never wrong bytes)."""
        f = self.file(name)
        if start < 0 or (end is not None and end < 0):
            raise UsageError(f"a read of {name!r} needs offsets >= 0, not {start}..{end}")
        end = f.size if end is None else min(end, f.size)
        if end <= start:
            return b""
        out = bytearray(end - start)
        view = memoryview(out)
        direct: list[tuple[str, ChunkLocation, memoryview]] = []
        for piece in self._pieces(f, start, end):
            lo, hi = max(start, piece.start), min(end, piece.start + piece.size)
            target = view[lo - start : hi - start]
            if piece.data is not None:
                target[:] = piece.data[lo - piece.start : hi - piece.start]
            else:
                assert piece.entry is not None
                self._read_entry(piece.entry, lo - piece.start, hi - piece.start, target, direct)
        if direct:
            read_runs(self._reader, self._pool, direct, commit_id=self.commit_id)
        self._prefetch(f, end)
        return bytes(out)

    @staticmethod
    def _pieces(f: ViewFile, start: int, end: int) -> Iterable[Piece]:
        i = bisect.bisect_right([p.start for p in f.pieces], start) - 1
        for piece in f.pieces[max(i, 0):]:
            if piece.start >= end:
                break
            if piece.start + piece.size > start:
                yield piece

    def _stream(self, entry: str) -> _Stream:
        with self._streams_lock:
            found = self._streams.get(entry)
            if found is None:
                row, chunks = self._items[entry]
                found = self._streams[entry] = _Stream(entry, row, chunks, self.commit_id)
            return found

    def _decode(self, stream: _Stream) -> Callable[[ChunkLocation], bytes]:
        """A function that reads one chunk of ``stream`` into new bytes, verified against its id."""
        def decode(loc: ChunkLocation) -> bytes:
            out = bytearray(loc.raw_length)
            try:
                self._reader.read_into(loc, memoryview(out), stream.bases(self._reader))
            except IntegrityError as exc:
                detail = exc.fields.get("detail", exc.message)
                raise IntegrityError(detail=f"entry {stream.name!r} of commit {short(self.commit_id)}: "
                                            f"{detail}") from exc
            return bytes(out)

        return decode

    def _read_entry(self, entry: str, lo: int, hi: int, target: memoryview,
                    direct: list[tuple[str, ChunkLocation, memoryview]]) -> None:
        """Fill ``target`` with C-order bytes ``[lo, hi)`` of ``entry``: chunks held or at the edges
        through the cache, whole chunks inside a large read left in ``direct`` for the caller."""
        stream = self._stream(entry)
        decode = self._decode(stream)
        at = 0
        for a, b in stream.spans(lo, hi):
            wanted = stream.overlapping(a, b)
            for i in wanted:
                loc, begin = stream.chunks[i], stream.starts[i]
                x, y = max(a, begin), min(b, begin + loc.raw_length)
                out = target[at + x - a : at + y - a]
                inside = x == begin and y == begin + loc.raw_length
                if inside and len(wanted) >= _DIRECT_MIN_CHUNKS and i not in (wanted[0], wanted[-1]):
                    held = self.cache.peek(loc.chunk_id)
                    if held is None:
                        direct.append((entry, loc, out))
                        continue
                    out[:] = held
                    continue
                data = self.cache.get(loc, decode)
                out[:] = memoryview(data)[x - begin : y - begin]
            at += b - a
        if at != hi - lo:
            raise IntegrityError(detail=f"entry {entry!r} of commit {short(self.commit_id)}: "
                                        f"its layout gives {at} bytes for a read of {hi - lo}")

    def _prefetch(self, f: ViewFile, end: int) -> None:
        """Start decoding, on the pool, the chunks of ``f``'s next ``read_ahead`` bytes after ``end``
        not held or under way (errors are left for the read that needs the chunk)."""
        stop = min(f.size, end + self._read_ahead)
        if self._read_ahead <= 0 or stop <= end:
            return
        for piece in self._pieces(f, end, stop):
            if piece.entry is None:
                continue
            stream = self._stream(piece.entry)
            lo, hi = max(end, piece.start) - piece.start, min(stop, piece.start + piece.size) - piece.start
            for a, b in stream.spans(lo, hi):
                for i in stream.overlapping(a, b):
                    loc = stream.chunks[i]
                    if not self.cache.busy(loc.chunk_id):
                        try:
                            self._pool.submit(_quietly, self.cache.get, loc, self._decode(stream))
                        except RuntimeError:  # the pool is shut down (the repository closed): no read-ahead
                            return


def _quietly(fn: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):  # a prefetch's failure is raised again by the read that needs the chunk
        fn(*args)


def _commit_files(items: Mapping[str, tuple[TensorRow, list[ChunkLocation]]], commit_id: str) -> dict[str, str]:
    """``{relative path: entry name}`` of the commit's files; IntegrityError for a path no commit
    may hold (a damaged or forged catalog: such a name never reaches a filesystem)."""
    found = {}
    for name, (row, _) in items.items():
        if not entries.is_file_entry(name):
            continue
        path = entries.file_path(name)
        problem = entries.check_file_path(path)
        if problem is not None or row.dtype != "uint8" or len(row.shape) != 1:
            raise IntegrityError(detail=f"commit {short(commit_id)} holds a file entry {name!r} that is not a "
                                        f"file: {problem or 'not a 1-D uint8 tensor'}")
        found[path] = name
    return found


def _entry_piece(entry: str, row: TensorRow, at: int) -> Piece:
    return Piece(start=at, size=row.nbytes, entry=entry)


def _file_of(name: str, parts: list[tuple[bytes | None, str | None, int]]) -> ViewFile:
    pieces, at = [], 0
    for data, entry, size in parts:
        if size:
            pieces.append(Piece(start=at, size=size, data=data, entry=entry))
        at += size
    return ViewFile(name=name, size=at, pieces=tuple(pieces))


def _shard_files(shards: list[hf_layout.Shard],
                 items: Mapping[str, tuple[TensorRow, list[ChunkLocation]]]) -> list[ViewFile]:
    out = []
    for shard in shards:
        parts: list[tuple[bytes | None, str | None, int]] = [(shard.header, None, len(shard.header))]
        parts += [(None, entry, items[entry][0].nbytes) for _, entry in shard.tensors]
        made = _file_of(shard.name, parts)
        if made.size != shard.size:
            raise IntegrityError(detail=f"{shard.name}: planned as {shard.size} bytes, its tensors give {made.size}")
        out.append(made)
    return out


def _hf_files(skeleton: Any, items: Mapping[str, tuple[TensorRow, list[ChunkLocation]]], files: dict[str, str],
              max_shard_size: int, commit_id: str) -> list[ViewFile]:
    """The commit's files, the model's shards and (several shards) the index: what ``export_hf`` writes."""
    shards = hf_layout.plan(model_specs(skeleton, dict(items), commit_id), max_shard_size)
    out = [_file_of(path, [(None, entry, items[entry][0].nbytes)]) for path, entry in files.items()
           if not hf_layout.is_weight_file(path)]
    out += _shard_files(shards, items)
    index = hf_layout.index_json(shards)
    if index is not None:
        out.append(_file_of(hf_layout.INDEX_NAME, [(index, None, len(index))]))
    return out


def _safetensors_file(skeleton: Any, items: Mapping[str, tuple[TensorRow, list[ChunkLocation]]],
                      commit_id: str) -> list[ViewFile]:
    """One ``model.safetensors`` of the flat state, or of the model's weights, whatever their size."""
    return _shard_files(hf_layout.plan(model_specs(skeleton, dict(items), commit_id), 1 << 62), items)


def _dirs(files: Mapping[str, ViewFile]) -> dict[str, list[str]]:
    """``{folder: sorted names in it}`` for the top (``""``) and every folder a file path implies."""
    dirs: dict[str, set[str]] = {"": set()}
    for name in files:
        parts = name.split("/")
        for depth in range(len(parts)):
            folder = "/".join(parts[:depth])
            dirs.setdefault(folder, set()).add(parts[depth])
    clash = [d for d in dirs if d in files]
    if clash:
        raise IntegrityError(detail=f"{clash[0]!r} is both a file and a folder of the view")
    return {d: sorted(names) for d, names in dirs.items()}
