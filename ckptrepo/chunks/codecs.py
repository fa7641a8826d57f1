"""Per-chunk encodings: raw, zstd, byte-grouped planes (and, later, xor-delta).

``encode`` picks the encoding for one chunk and ``decode`` inverts it. Payloads are
self-describing given the encoding and the raw length recorded next to them, so a
pack's index alone is enough to decode any chunk.

BYTEGROUP payload format (version 1, little-endian, pinned by tests)::

    u8   version            always 1
    u8   width W            element size in bytes, 2..255
    W x  (u8 mode, u32 len) mode 0 = plane stored as is (len == n),
                            mode 1 = plane is one zstd frame of len bytes decoding to n bytes
    W    plane bodies       back to back, plane 0 first
    t    tail               the raw_length % W trailing bytes, stored as is

where ``n = raw_length // W`` and plane ``k`` holds byte ``k`` (in memory order) of
every element: element ``i``'s byte ``k`` is ``plane_k[i]``. For little-endian
floats the last plane carries the sign and the high exponent bits — the plane that
compresses — while the low mantissa planes look random and are stored as is.

ZSTD payloads are a single zstd frame with its content size; RAW payloads are the
bytes themselves. Decoding checks lengths only: the chunk id (BLAKE3 of the decoded
bytes, verified by ``ChunkReader``) is what proves the content.
"""

from __future__ import annotations

import struct
import threading
from enum import IntEnum
from typing import Any

import numpy as np
import zstandard

from ckptrepo.errors import IntegrityError, UsageError

BYTEGROUP_VERSION = 1
_HEAD = struct.Struct("<BB")
_PLANE = struct.Struct("<BI")
_MODE_STORED = 0
_MODE_ZSTD = 1

# A plane larger than this is judged from SAMPLE_WINDOWS windows of SAMPLE_WINDOW bytes
# before paying for a full zstd pass over it.
_SAMPLE_WINDOW = 4096
_SAMPLE_WINDOWS = 4
_SAMPLE_MIN = 16 * _SAMPLE_WINDOW


class Encoding(IntEnum):
    """How a stored chunk's payload maps to its raw bytes (stored in packs and the database)."""

    RAW = 0
    ZSTD = 1
    BYTEGROUP = 2
    DELTA = 3


_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    """This thread's compressor for ``level`` (zstd contexts are not thread-safe; making one is not free).

    Level 1 is tuned for tensor bytes: a minimal match finder (tensor planes have few long
    matches) leaves zstd mostly entropy-coding, which is ~4x faster than stock level 1 and
    compresses exponent planes slightly better.
    """
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    comp = cache.get(level)
    if comp is None:
        if level == 1:
            params = zstandard.ZstdCompressionParameters(
                compression_level=1,
                strategy=zstandard.STRATEGY_FAST,
                window_log=17,
                hash_log=6,
                chain_log=6,
                search_log=1,
                min_match=7,
                write_content_size=True,
            )
            comp = zstandard.ZstdCompressor(compression_params=params)
        else:
            comp = zstandard.ZstdCompressor(level=level, write_content_size=True)
        cache[level] = comp
    return comp


def _decompressor() -> zstandard.ZstdDecompressor:
    dec: zstandard.ZstdDecompressor | None = getattr(_local, "decompressor", None)
    if dec is None:
        dec = _local.decompressor = zstandard.ZstdDecompressor()
    return dec


def _byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def _pays(comp: zstandard.ZstdCompressor, plane: np.ndarray, keep: float) -> bool:
    """Whether zstd is likely to shrink ``plane`` below ``keep`` of its size, judged from a sample."""
    n = plane.shape[0]
    if n <= _SAMPLE_MIN:
        return True
    step = (n - _SAMPLE_WINDOW) // (_SAMPLE_WINDOWS - 1)
    sample = np.concatenate([plane[i * step : i * step + _SAMPLE_WINDOW] for i in range(_SAMPLE_WINDOWS)])
    return len(comp.compress(sample.data)) < keep * sample.nbytes


def _zstd(raw: memoryview, level: int, min_saving: float) -> tuple[Encoding, bytes | memoryview]:
    comp = _compressor(level)
    keep = 1.0 - min_saving
    if not _pays(comp, np.frombuffer(raw, dtype=np.uint8), keep):
        return Encoding.RAW, raw
    packed = comp.compress(raw)
    if len(packed) >= keep * len(raw):
        return Encoding.RAW, raw
    return Encoding.ZSTD, packed


_WORD: dict[int, np.dtype[Any]] = {2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


def _split_planes(raw: memoryview, width: int, planes: np.ndarray) -> None:
    """Fill ``planes`` (width, n) with the byte planes of the first ``n`` elements of ``raw``."""
    n = planes.shape[1]
    word = _WORD.get(width)
    if word is None:
        elements = np.frombuffer(raw, dtype=np.uint8, count=n * width).reshape(n, width)
        np.copyto(planes, elements.T)
        return
    # For native word sizes, shift-and-truncate runs vectorised and ~1.5-2.5x faster than
    # numpy's strided byte transpose.
    words = np.frombuffer(raw, dtype=word, count=n)
    np.copyto(planes[0], words, casting="unsafe")
    for k in range(1, width):
        np.right_shift(words, 8 * k, out=planes[k], casting="unsafe")


def _bytegroup(raw: memoryview, width: int, level: int, min_saving: float) -> memoryview | None:
    """BYTEGROUP payload of ``raw``, or None when it would not save ``min_saving``."""
    comp = _compressor(level)
    keep = 1.0 - min_saving
    total = len(raw)
    n, tail = divmod(total, width)
    head = _HEAD.size + width * _PLANE.size
    elements = np.frombuffer(raw, dtype=np.uint8, count=n * width).reshape(n, width)
    # Samples are gathered from the interleaved bytes, so a chunk none of whose planes
    # compresses costs no plane split at all.
    pays = [_pays(comp, elements[:, k], keep) for k in range(width)]
    if not any(pays):
        return None
    # Planes are split straight into the output; compressed planes are smaller than
    # their slot, so compaction only ever moves bytes towards the front.
    out = np.empty(head + total, dtype=np.uint8)
    _split_planes(raw, width, out[head : head + n * width].reshape(width, n))
    cursor = head
    plane_desc: list[tuple[int, int]] = []
    for k in range(width):
        start = head + k * n
        plane = out[start : start + n]
        packed = comp.compress(plane.data) if pays[k] else None
        if packed is not None and len(packed) < keep * n:
            out[cursor : cursor + len(packed)] = np.frombuffer(packed, dtype=np.uint8)
            plane_desc.append((_MODE_ZSTD, len(packed)))
            cursor += len(packed)
        else:
            if cursor != start:
                out[cursor : cursor + n] = plane  # numpy buffers overlapping copies
            plane_desc.append((_MODE_STORED, n))
            cursor += n
    if tail:
        out[cursor : cursor + tail] = np.frombuffer(raw, dtype=np.uint8, offset=n * width)
        cursor += tail
    if cursor >= keep * total:
        return None
    _HEAD.pack_into(out.data, 0, BYTEGROUP_VERSION, width)
    for k, (mode, length) in enumerate(plane_desc):
        _PLANE.pack_into(out.data, _HEAD.size + k * _PLANE.size, mode, length)
    return out[:cursor].data


def encode(
    raw: memoryview | bytes, itemsize: int, *, level: int = 1, min_saving: float = 0.05
) -> tuple[Encoding, bytes | memoryview]:
    """Choose and apply the encoding for one chunk of raw tensor bytes.

    ``itemsize >= 2`` tries BYTEGROUP (only planes whose sample shows they pay get a full
    zstd pass); ``itemsize == 1`` tries ZSTD. If the result would not save at least
    ``min_saving`` of ``len(raw)``, returns ``(RAW, raw)`` with ``raw`` itself, uncopied.
    The caller must not mutate ``raw`` while it still uses a RAW result. Thread-safe;
    zstd and the numpy plane copies run without the GIL.
    """
    if itemsize < 1 or itemsize > 255:
        raise UsageError(f"itemsize {itemsize} is out of range 1..255")
    if not 0.0 <= min_saving < 1.0:
        raise UsageError(f"min_saving {min_saving} is out of range [0, 1)")
    view = _byte_view(raw)
    if len(view) == 0:
        return Encoding.RAW, raw
    if itemsize == 1 or len(view) < itemsize:
        encoding, payload = _zstd(view, level, min_saving)
        return (Encoding.RAW, raw) if encoding is Encoding.RAW else (encoding, payload)
    grouped = _bytegroup(view, itemsize, level, min_saving)
    if grouped is None:
        return Encoding.RAW, raw
    return Encoding.BYTEGROUP, grouped


def _corrupt(detail: str) -> IntegrityError:
    return IntegrityError(detail=detail)


def _unzstd(frame: memoryview | bytes, expected: int) -> bytes:
    """Decompress one zstd frame that must hold exactly ``expected`` bytes."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise _corrupt(f"bad zstd frame ({exc})") from exc
    if declared != expected:
        raise _corrupt(f"zstd frame declares {declared} bytes, expected {expected}")
    try:
        data = _decompressor().decompress(frame)
    except zstandard.ZstdError as exc:
        raise _corrupt(f"zstd frame does not decode ({exc})") from exc
    if len(data) != expected:
        raise _corrupt(f"zstd frame decoded to {len(data)} bytes, expected {expected}")
    return data


def _parse_bytegroup(payload: memoryview, raw_length: int) -> tuple[int, list[tuple[int, int]]]:
    if len(payload) < _HEAD.size:
        raise _corrupt("bytegroup payload is shorter than its header")
    version, width = _HEAD.unpack_from(payload, 0)
    if version != BYTEGROUP_VERSION:
        raise _corrupt(f"bytegroup payload version {version}, expected {BYTEGROUP_VERSION}")
    if width < 2:
        raise _corrupt(f"bytegroup width {width} is below 2")
    head = _HEAD.size + width * _PLANE.size
    if len(payload) < head:
        raise _corrupt("bytegroup payload is shorter than its plane table")
    n, tail = divmod(raw_length, width)
    planes = [_PLANE.unpack_from(payload, _HEAD.size + k * _PLANE.size) for k in range(width)]
    for mode, length in planes:
        if mode not in (_MODE_STORED, _MODE_ZSTD) or (mode == _MODE_STORED and length != n):
            raise _corrupt(f"bytegroup plane entry ({mode}, {length}) does not fit {n}-byte planes")
    if head + sum(length for _, length in planes) + tail != len(payload):
        raise _corrupt(f"bytegroup payload is {len(payload)} bytes, its table says otherwise")
    return width, planes


def _decode_bytegroup(payload: memoryview, raw_length: int, out: memoryview) -> None:
    width, planes = _parse_bytegroup(payload, raw_length)
    n, tail = divmod(raw_length, width)
    target = np.frombuffer(out, dtype=np.uint8)
    elements = target[: n * width].reshape(n, width)
    cursor = _HEAD.size + width * _PLANE.size
    for k, (mode, length) in enumerate(planes):
        body = payload[cursor : cursor + length]
        plane = body if mode == _MODE_STORED else _unzstd(body, n)
        elements[:, k] = np.frombuffer(plane, dtype=np.uint8)
        cursor += length
    if tail:
        target[n * width :] = np.frombuffer(payload, dtype=np.uint8, offset=cursor)


def _decode_into(encoding: Encoding | int, payload: memoryview, raw_length: int, out: memoryview) -> None:
    if encoding == Encoding.RAW:
        if len(payload) != raw_length:
            raise _corrupt(f"raw payload is {len(payload)} bytes, expected {raw_length}")
        out[:] = payload
    elif encoding == Encoding.ZSTD:
        out[:] = _unzstd(payload, raw_length)
    elif encoding == Encoding.BYTEGROUP:
        _decode_bytegroup(payload, raw_length, out)
    elif encoding == Encoding.DELTA:
        raise _corrupt("delta chunks need their base")
    else:
        raise _corrupt(f"unknown chunk encoding {int(encoding)}")


def decode(
    encoding: Encoding | int,
    payload: bytes | memoryview,
    raw_length: int,
    out: memoryview | None = None,
) -> memoryview | bytes:
    """Inverse of ``encode``: the ``raw_length`` raw bytes of a chunk.

    With ``out`` (a writable buffer of exactly ``raw_length`` bytes) the result is written
    there and ``out`` is returned; otherwise a new buffer (or ``payload`` itself for RAW) is.
    Raises IntegrityError for a malformed payload or an unknown encoding, never returns
    data of another length; on error ``out`` may hold partial data. DELTA needs its base
    chunk and is decoded by the chunk reader. Thread-safe.
    """
    view = _byte_view(payload)
    if out is not None:
        target = _byte_view(out)
        if len(target) != raw_length:
            raise UsageError(f"output buffer is {len(target)} bytes, the chunk has {raw_length}")
        _decode_into(encoding, view, raw_length, target)
        return out
    if encoding == Encoding.RAW:
        if len(view) != raw_length:
            raise _corrupt(f"raw payload is {len(view)} bytes, expected {raw_length}")
        return payload
    if encoding == Encoding.ZSTD:
        return _unzstd(view, raw_length)
    buffer = np.empty(raw_length, dtype=np.uint8).data
    _decode_into(encoding, view, raw_length, buffer)
    return buffer
