"""Per-chunk encodings: raw, zstd, byte-grouped planes, and xor-delta against a base chunk.

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

DELTA payloads have the BYTEGROUP layout (width 1 allowed) and hold the planes of a
difference between the chunk and ``base``, another chunk of the same length (usually the
same tensor's chunk at the same offset in the parent commit). The version byte says which:

- version 1: ``chunk XOR base``;
- version 2 (widths 2, 4 and 8): the word difference ``zigzag(chunk - base)``, each W-byte
  little-endian word subtracted modulo 2^(8W) and zigzag-mapped (0, -1, 1, -2 ... ->
  0, 1, 2, 3 ...); the ``raw_length % W`` tail bytes are XOR-ed.

For related checkpoints either zeroes the sign, the exponent and the high mantissa bits of
most elements, so the high planes compress to almost nothing. The difference does better
than XOR where a value moved across a run of equal mantissa bits (a small step from
1.0111 to 1.1000 is one unit of difference but four flipped bits), which is what weight
decay does to every weight no gradient touched. The base is named in the chunk index, not
in the payload; ``decode_delta`` takes its decoded bytes.

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

try:  # SSE2 split/join kernels for widths 2 and 4; numpy does the same when not built
    import ckptrepo.chunks._planes as _native
except ImportError:  # pragma: no cover - exercised when the extension is not compiled
    _native = None  # type: ignore[assignment]

BYTEGROUP_VERSION = 1
WORD_DELTA_VERSION = 2  # DELTA payloads whose planes hold zigzag(chunk - base) words
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


class PlaneHint:
    """Which planes paid off in recent chunks of one tensor, reused instead of sampling.

    Neighbouring chunks of a tensor have the same statistics, so the sampling of the
    first chunk (and of every ``every``-th after it) decides for the chunks in between;
    a plane that was compressed but did not shrink enough is dropped from the plan at
    once. Shared by the threads encoding one tensor: a race only costs a sample.
    """

    def __init__(self, every: int = 16) -> None:
        self.every = every
        self._plans: dict[str, list[Any]] = {}
        self._uses: dict[str, int] = {}

    def plan(self, key: str) -> list[Any] | None:
        """The plan for ``key`` (``"alone"``, ``"delta"``), or None when it is time to sample."""
        uses = self._uses.get(key, 0)
        self._uses[key] = uses + 1
        return None if uses % self.every == 0 else self._plans.get(key)

    def learn(self, key: str, plan: list[bool]) -> None:
        self._plans[key] = plan

    def alone_ratio(self) -> float | None:
        """The standalone size / raw size measured on a recent chunk, or None when it is time
        to measure again (every ``every``-th chunk)."""
        uses = self._uses.get("ratio", 0)
        self._uses["ratio"] = uses + 1
        ratio = self._plans.get("ratio")
        return None if uses % self.every == 0 or ratio is None else ratio[0]

    def learn_ratio(self, ratio: float) -> None:
        self._plans["ratio"] = [ratio]

    def try_delta(self) -> bool:
        """Whether to try a delta for the next chunk: yes, unless the last try for this tensor
        lost to standalone encoding (then only every ``every``-th chunk tries again)."""
        uses = self._uses.get("delta-try", 0)
        self._uses["delta-try"] = uses + 1
        lost = self._plans.get("delta-lost")
        return uses % self.every == 0 or not (lost and lost[0])

    def delta_result(self, won: bool) -> None:
        self._plans["delta-lost"] = [not won]


def _zstd(raw: memoryview, level: int, min_saving: float,
          hint: PlaneHint | None = None) -> tuple[Encoding, bytes | memoryview]:
    comp = _compressor(level)
    keep = 1.0 - min_saving
    plan = hint.plan("zstd") if hint is not None else None
    pays = plan[0] if plan is not None else _pays(comp, np.frombuffer(raw, dtype=np.uint8), keep)
    packed = comp.compress(raw) if pays else None
    paid = packed is not None and len(packed) < keep * len(raw)
    if hint is not None:
        hint.learn("zstd", [paid])
    if packed is None or not paid:
        return Encoding.RAW, raw
    return Encoding.ZSTD, packed


_WORD: dict[int, np.dtype[Any]] = {2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


def _split_planes(raw: memoryview, width: int, planes: np.ndarray) -> None:
    """Fill ``planes`` (width, n) with the byte planes of the first ``n`` elements of ``raw``."""
    n = planes.shape[1]
    if _native is not None and width in (2, 4):
        _native.split(raw[: n * width], width, planes.reshape(-1))
        return
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


def _join_planes(planes: np.ndarray, width: int, out: np.ndarray) -> None:
    """Inverse of ``_split_planes``: interleave ``planes`` (width, n) into ``out[: n * width]``."""
    n = planes.shape[1]
    if _native is not None and width in (2, 4):
        _native.join(planes.reshape(-1), width, out[: n * width])
        return
    elements = out[: n * width].reshape(n, width)
    for k in range(width):
        elements[:, k] = planes[k]


def _delta_planes(raw: memoryview, base: memoryview, width: int, planes: np.ndarray) -> int:
    """Fill ``planes`` (width, n) with the planes of the DELTA transform of the first ``n``
    elements of ``raw`` against ``base``; returns the payload version it makes."""
    n = planes.shape[1]
    if _native is not None and width in _WORD:
        _native.zigzag_split(raw[: n * width], base[: n * width], width, planes.reshape(-1))
        return WORD_DELTA_VERSION
    diff, version = delta_words(raw[: n * width], base[: n * width], width)
    _split_planes(diff.data, width, planes)
    return version


def _group(
    raw: memoryview, width: int, level: int, keep: float, *, sample_first: bool, limit: float | None = None,
    hint: PlaneHint | None = None, key: str = "alone", base: memoryview | None = None,
) -> memoryview | None:
    """A BYTEGROUP-layout payload of ``raw``, or None if it would not be below ``limit`` bytes
    (default: ``keep`` of its size).

    Each plane is zstd-compressed only if a sample says it pays (mantissa planes of
    floats look random and cost no full zstd pass) and kept compressed only if the whole
    plane shrank below ``keep``. With ``sample_first`` the samples are taken from the
    interleaved bytes, so a chunk none of whose planes compress costs no plane split.
    With a ``hint``, its plan for ``key`` replaces the samples, and the outcome updates it.
    With ``base`` (as long as ``raw``) the payload is a DELTA one: the planes of the word
    difference against it (version 2), or of the XOR for widths other than 2, 4 and 8.
    """
    comp = _compressor(level)
    total = len(raw)
    n, tail = divmod(total, width)
    head = _HEAD.size + width * _PLANE.size
    pays = hint.plan(key) if hint is not None else None
    if pays is not None and len(pays) != width:
        pays = None
    if pays is not None and sample_first and not any(pays):
        return None
    if pays is None and sample_first:
        elements = np.frombuffer(raw, dtype=np.uint8, count=n * width).reshape(n, width)
        pays = [_pays(comp, elements[:, k], keep) for k in range(width)]
        if not any(pays):
            if hint is not None:
                hint.learn(key, pays)
            return None
    # Planes are split straight into the output; compressed planes are smaller than
    # their slot, so compaction only ever moves bytes towards the front.
    out = np.empty(head + total, dtype=np.uint8)
    planes = out[head : head + n * width].reshape(width, n)
    version = BYTEGROUP_VERSION
    if base is None:
        _split_planes(raw, width, planes)
    else:
        version = _delta_planes(raw, base, width, planes)
    if pays is None:
        pays = [_pays(comp, planes[k], keep) for k in range(width)]
    cursor = head
    plane_desc: list[tuple[int, int]] = []
    paid: list[bool] = []
    for k in range(width):
        start = head + k * n
        plane = out[start : start + n]
        packed = comp.compress(plane.data) if pays[k] else None
        paid.append(packed is not None and len(packed) < keep * n)
        if packed is not None and paid[k]:
            out[cursor : cursor + len(packed)] = np.frombuffer(packed, dtype=np.uint8)
            plane_desc.append((_MODE_ZSTD, len(packed)))
            cursor += len(packed)
        else:
            if cursor != start:
                out[cursor : cursor + n] = plane  # numpy buffers overlapping copies
            plane_desc.append((_MODE_STORED, n))
            cursor += n
    if hint is not None:
        hint.learn(key, paid)
    if tail:
        out[cursor : cursor + tail] = np.frombuffer(raw, dtype=np.uint8, offset=n * width)
        if base is not None:
            out[cursor : cursor + tail] ^= np.frombuffer(base, dtype=np.uint8, offset=n * width)
        cursor += tail
    if cursor >= (keep * total if limit is None else limit):
        return None
    _HEAD.pack_into(out.data, 0, version, width)
    for k, (mode, length) in enumerate(plane_desc):
        _PLANE.pack_into(out.data, _HEAD.size + k * _PLANE.size, mode, length)
    return out[:cursor].data


def _standalone(view: memoryview, raw: memoryview | bytes, itemsize: int, level: int,
                min_saving: float, hint: PlaneHint | None) -> tuple[Encoding, bytes | memoryview]:
    if itemsize == 1 or len(view) < itemsize:
        encoding, payload = _zstd(view, level, min_saving, hint)
        return (Encoding.RAW, raw) if encoding is Encoding.RAW else (encoding, payload)
    grouped = _group(view, itemsize, level, 1.0 - min_saving, sample_first=True, hint=hint)
    if grouped is None:
        return Encoding.RAW, raw
    return Encoding.BYTEGROUP, grouped


def xor_bytes(a: memoryview | bytes, b: memoryview | bytes) -> np.ndarray:
    """A new array holding ``a XOR b`` (equal lengths), computed a word at a time."""
    va, vb = _byte_view(a), _byte_view(b)
    if len(va) != len(vb):
        raise UsageError(f"xor of {len(va)} and {len(vb)} bytes")
    out = np.empty(len(va), dtype=np.uint8)
    words = len(va) // 8
    np.bitwise_xor(np.frombuffer(va, dtype=np.uint64, count=words), np.frombuffer(vb, dtype=np.uint64, count=words),
                   out=out[: words * 8].view(np.uint64))
    if len(va) % 8:
        np.bitwise_xor(np.frombuffer(va, dtype=np.uint8, offset=words * 8),
                       np.frombuffer(vb, dtype=np.uint8, offset=words * 8), out=out[words * 8 :])
    return out


def delta_words(chunk: memoryview | bytes, base: memoryview | bytes, width: int) -> tuple[np.ndarray, int]:
    """A new array holding the DELTA transform of ``chunk`` against ``base`` (equal lengths)
    and its payload version: the zigzag word difference for widths 2, 4 and 8, else XOR."""
    if width not in _WORD:
        return xor_bytes(chunk, base), BYTEGROUP_VERSION
    va, vb = _byte_view(chunk), _byte_view(base)
    if len(va) != len(vb):
        raise UsageError(f"delta of {len(va)} bytes against {len(vb)}")
    out = np.frombuffer(va, dtype=np.uint8).copy()
    words = len(va) // width * width
    if _native is not None:
        _native.zigzag_sub(out[:words], vb[:words], width)
    else:
        a = out[:words].view(_WORD[width])
        a -= np.frombuffer(vb, dtype=_WORD[width], count=words // width)  # wraps modulo 2^(8W)
        sign = (a >> (8 * width - 1)).astype(_WORD[width])
        np.bitwise_xor(a << 1, np.negative(sign), out=a)  # 0 - sign: all ones for a negative difference
    if words < len(va):
        np.bitwise_xor(out[words:], np.frombuffer(vb, dtype=np.uint8, offset=words), out=out[words:])
    return out, WORD_DELTA_VERSION


def _undo_word_delta(target: np.ndarray, base: memoryview, width: int) -> None:
    """Inverse of ``delta_words`` for version 2, in place: ``target`` holds the decoded planes."""
    words = len(target) // width * width
    if _native is not None:
        _native.unzigzag_add(target[:words], base[:words], width)
    else:
        z = target[:words].view(_WORD[width])
        low = np.bitwise_and(z, 1)
        np.bitwise_xor(z >> 1, np.negative(low), out=z)
        z += np.frombuffer(base, dtype=_WORD[width], count=words // width)
    if words < len(target):
        np.bitwise_xor(target[words:], np.frombuffer(base, dtype=np.uint8, offset=words), out=target[words:])


def encode(
    raw: memoryview | bytes,
    itemsize: int,
    *,
    level: int = 1,
    min_saving: float = 0.05,
    base: memoryview | bytes | None = None,
) -> tuple[Encoding, bytes | memoryview]:
    """``encode_with_base`` without the standalone size."""
    encoding, payload, _ = encode_with_base(raw, itemsize, base, level=level, min_saving=min_saving)
    return encoding, payload


def encode_with_base(
    raw: memoryview | bytes,
    itemsize: int,
    base: memoryview | bytes | None,
    *,
    level: int = 1,
    min_saving: float = 0.05,
    hint: PlaneHint | None = None,
) -> tuple[Encoding, bytes | memoryview, int]:
    """Choose and apply the encoding for one chunk of raw tensor bytes.

    ``itemsize >= 2`` tries BYTEGROUP (only planes whose sample shows they pay get a full
    zstd pass); ``itemsize == 1`` tries ZSTD. If the result would not save at least
    ``min_saving`` of ``len(raw)``, the standalone choice is ``(RAW, raw)`` with ``raw``
    itself, uncopied. With ``base`` (the decoded bytes of another chunk of the same
    length), DELTA — the byte planes of ``raw XOR base`` — is tried as well and wins if
    it is at least ``min_saving`` smaller than the standalone choice. A ``hint`` shared
    by the chunks of one tensor replaces most per-chunk plane sampling (``PlaneHint``),
    and, where a recent chunk of the tensor measured its standalone size, a delta that
    beats that estimate is taken without encoding the chunk standalone too.
    Returns the encoding, the payload and the standalone choice's size (for DELTA, what
    the chunk would have taken without its base: measured, or with a hint estimated from
    a recent chunk of the same tensor).
    The caller must not mutate ``raw`` while it still uses a RAW result. Thread-safe;
    zstd and the numpy plane copies run without the GIL.
    """
    if itemsize < 1 or itemsize > 255:
        raise UsageError(f"itemsize {itemsize} is out of range 1..255")
    if not 0.0 <= min_saving < 1.0:
        raise UsageError(f"min_saving {min_saving} is out of range [0, 1)")
    view = _byte_view(raw)
    if len(view) == 0:
        return Encoding.RAW, raw, 0
    keep = 1.0 - min_saving
    width = itemsize if len(view) >= itemsize else 1
    if base is not None and hint is not None:
        if len(_byte_view(base)) != len(view):
            raise UsageError(f"delta base is {len(_byte_view(base))} bytes, the chunk {len(view)}")
        ratio = hint.alone_ratio()
        if ratio is not None:
            estimate = ratio * len(view)
            delta = _group(view, width, level, keep, sample_first=False,
                           limit=keep * estimate, hint=hint, key="delta", base=_byte_view(base))
            if delta is not None:
                hint.delta_result(True)
                return Encoding.DELTA, delta, round(estimate)
    encoding, payload = _standalone(view, raw, itemsize, level, min_saving, hint)
    if hint is not None:
        hint.learn_ratio(len(payload) / len(view))
    if base is None:
        return encoding, payload, len(payload)
    if len(_byte_view(base)) != len(view):
        raise UsageError(f"delta base is {len(_byte_view(base))} bytes, the chunk {len(view)}")
    delta = _group(view, width, level, keep, sample_first=False, limit=keep * len(payload),
                   hint=hint, key="delta", base=_byte_view(base))
    if hint is not None:
        hint.delta_result(delta is not None)
    if delta is None:
        return encoding, payload, len(payload)
    return Encoding.DELTA, delta, len(payload)


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


def _parse_planes(payload: memoryview, raw_length: int, min_width: int) -> tuple[int, list[tuple[int, int]]]:
    """Check a plane payload's header and table; DELTA payloads (``min_width`` 1) may be version 2."""
    if len(payload) < _HEAD.size:
        raise _corrupt("byte-plane payload is shorter than its header")
    version, width = _HEAD.unpack_from(payload, 0)
    if version != BYTEGROUP_VERSION and not (version == WORD_DELTA_VERSION and min_width == 1 and width in _WORD):
        raise _corrupt(f"byte-plane payload version {version} (width {width}) is not one this reader knows")
    if width < min_width:
        raise _corrupt(f"byte-plane width {width} is below {min_width}")
    head = _HEAD.size + width * _PLANE.size
    if len(payload) < head:
        raise _corrupt("byte-plane payload is shorter than its plane table")
    n, tail = divmod(raw_length, width)
    planes = [_PLANE.unpack_from(payload, _HEAD.size + k * _PLANE.size) for k in range(width)]
    for mode, length in planes:
        if mode not in (_MODE_STORED, _MODE_ZSTD) or (mode == _MODE_STORED and length != n):
            raise _corrupt(f"byte-plane entry ({mode}, {length}) does not fit {n}-byte planes")
    if head + sum(length for _, length in planes) + tail != len(payload):
        raise _corrupt(f"byte-plane payload is {len(payload)} bytes, its table says otherwise")
    return width, planes


def _scratch(size: int) -> np.ndarray:
    """This thread's reusable plane buffer of at least ``size`` bytes."""
    buf: np.ndarray | None = getattr(_local, "planes", None)
    if buf is None or buf.shape[0] < size:
        buf = _local.planes = np.empty(size, dtype=np.uint8)
    return buf[:size]


def _decode_planes(payload: memoryview, raw_length: int, out: memoryview, min_width: int) -> None:
    width, planes = _parse_planes(payload, raw_length, min_width)
    n, tail = divmod(raw_length, width)
    target = np.frombuffer(out, dtype=np.uint8)
    cursor = _HEAD.size + width * _PLANE.size
    if width == 1:
        mode, length = planes[0]
        body = payload[cursor : cursor + length]
        target[:n] = np.frombuffer(body if mode == _MODE_STORED else _unzstd(body, n), dtype=np.uint8)
        return
    bodies: list[bytes | memoryview] = []
    for mode, length in planes:
        body = payload[cursor : cursor + length]
        bodies.append(body if mode == _MODE_STORED else _unzstd(body, n))
        cursor += length
    if _native is not None:  # interleaved straight from the payload and the decompressed planes
        _native.join_list(bodies, target[: n * width])
    else:  # gathered into a scratch buffer, then interleaved in one pass
        gathered = _scratch(n * width).reshape(width, n)
        for k, body in enumerate(bodies):
            gathered[k] = np.frombuffer(body, dtype=np.uint8)
        _join_planes(gathered, width, target)
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
        _decode_planes(payload, raw_length, out, 2)
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
    (``decode_delta``). Thread-safe.
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


def decode_delta(payload: bytes | memoryview, base: bytes | memoryview, out: memoryview) -> None:
    """Write ``base XOR planes(payload)`` — a DELTA chunk's raw bytes — into ``out``.

    ``base`` is the decoded base chunk and must be as long as ``out``. Checks the
    payload's structure only; the caller verifies the result's hash (a wrong or corrupt
    base yields bytes that fail it). Thread-safe.
    """
    target = _byte_view(out)
    base_view = _byte_view(base)
    if len(base_view) != len(target):
        raise _corrupt(f"delta base is {len(base_view)} bytes, the chunk {len(target)}")
    body = _byte_view(payload)
    _decode_planes(body, len(target), target, 1)
    if len(target):
        arr = np.frombuffer(target, dtype=np.uint8)
        if body[0] == WORD_DELTA_VERSION:
            _undo_word_delta(arr, base_view, body[1])
        else:
            np.bitwise_xor(arr, np.frombuffer(base_view, dtype=np.uint8), out=arr)
