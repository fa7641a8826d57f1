"""Reading a safetensors file as raw byte views, without torch.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of UTF-8 JSON
(an object: ``"__metadata__"`` maps strings to strings; every other key names a tensor with
its ``dtype`` code, ``shape`` and ``data_offsets`` ``[begin, end]`` relative to the data
section), then the data section: the tensors' C-order, little-endian bytes, back to back.

``read_flat`` validates the whole file before returning anything, by the rules the safetensors
library applies (``Metadata::validate`` and ``read_metadata`` of its Rust crate) and a few
stricter ones (``_parse_header``), and returns each tensor as its stored dtype name, shape and
a view of its bytes, in the order ``safe_open(...).keys()`` gives (names sorted by code point),
the order ``read_safetensors`` returns them in. It never unpickles anything and never imports
torch, so ``ckpt commit FILE.safetensors`` can read, hash and summarise a file without it.
"""

from __future__ import annotations

import io
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from ckptrepo.dtypes import DTYPES, SAFETENSORS_DTYPES
from ckptrepo.errors import InvalidInput
from ckptrepo.formats.readbuffer import ReadBuffer

SKELETON_KEY = "ckptrepo.skeleton"  # written by ``safetensors_io.write_safetensors`` for nested states
MAX_HEADER_BYTES = 100_000_000  # the safetensors library refuses longer headers
_LENGTH_BYTES = 8
_USIZE = 2**64  # the library reads sizes and offsets as 64-bit unsigned integers
_MAX_DIM = 2**63  # torch's sizes are signed 64-bit
_VALUES_PER_ELEMENT = {"F4": 2}  # safetensors counts 4-bit values where float4_e2m1fn_x2 counts bytes of two


@dataclass(frozen=True, slots=True)
class FlatTensor:
    """One tensor of a file: ``dtype`` is its stored name (``"float32"``), ``shape`` torch's
    shape, ``data`` exactly its C-order bytes (format ``"B"``, ``len(data)`` = numel * itemsize)."""

    name: str
    dtype: str
    shape: list[int]
    data: memoryview


@dataclass(frozen=True)
class FlatFile:
    """A validated safetensors file: its ``__metadata__`` (empty when absent), the parsed
    ckptrepo skeleton JSON when ``write_state`` stored a nested state (else None), and its
    tensors in ``read_safetensors``'s order (names sorted by code point)."""

    metadata: dict[str, str]
    skeleton: Any | None
    tensors: list[FlatTensor]


@dataclass(frozen=True, slots=True)
class _Entry:
    name: str
    dtype: str
    shape: list[int]
    begin: int
    end: int


_Layout = tuple[dict[str, str], Any | None, list[_Entry]]  # a header's metadata, skeleton and tensor entries


def read_flat(path: Path | str, *, mapped: bool = False, buffer: ReadBuffer | None = None) -> FlatFile:
    """The tensors of the safetensors file ``path`` as byte views, after validating all of it.

    InvalidInput naming ``path`` when it cannot be read, is not a well-formed safetensors file
    (see ``_parse_header`` for the rules), holds a dtype torch has no type for, or has an
    unusable ckptrepo skeleton (not JSON, or not describing a dict; the entries it refers to
    are checked when the state is rebuilt, by ``state.unflatten``).

    Where the bytes live (every ``FlatTensor.data`` is a view, never a copy of its own):
    by default the data section is read into one ``bytearray`` after the header validated.
    ``mapped``: views of a private copy-on-write memory map of the file, read ahead by the
    kernel (``MADV_WILLNEED``) and faulted in when first touched; the file must not be
    truncated while they are in use (touching a page past its end raises SIGBUS).
    ``buffer``: the file is read whole into that ``ReadBuffer`` and the views are of it, valid
    until the buffer's next read (``buffer`` wins over ``mapped``).

    Whichever way: the header is read and validated first, with ordinary reads of its 8-byte
    length and its ``N`` bytes (the length checked against the file's size and the 100 MB cap
    before those bytes are read), so a file that is not a safetensors file is refused having
    read at most its header, however large the file: nothing is mapped, allocated or read for
    the data section until then. The header found again in the buffer or the map must be the
    one validated (InvalidInput: the file changed while being read).
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size, header, layout = _read_header(path, f)
            start = _LENGTH_BYTES + len(header)
            if buffer is None and mapped:
                memory = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
                _check_same(path, memoryview(memory), size, header)
                if hasattr(mmap, "MADV_WILLNEED"):  # only once the file proved valid
                    memory.madvise(mmap.MADV_WILLNEED)
                return _views(layout, memoryview(memory)[start:size])
            if buffer is None:
                section = bytearray(size - start)
                got = _read_into(f, memoryview(section))
    except OSError as e:
        raise InvalidInput(path=str(path), reason=e.strerror or str(e)) from e
    if buffer is not None:
        whole = buffer.read(path)
        _check_same(path, whole, size, header)
        return _views(layout, whole[start:size])
    if got != len(section):
        _fail(path, f"it changed while being read ({got} of {len(section)} data bytes)")
    return _views(layout, memoryview(section))


def check_header(path: Path) -> None:
    """InvalidInput (OSError when it cannot be read) unless ``path`` starts with a header
    ``read_flat`` accepts; nothing past the header is read."""
    with open(path, "rb") as f:
        _read_header(path, f)


def _read_header(path: Path, f: io.BufferedReader) -> tuple[int, bytes, _Layout]:
    """The file's size, its header's bytes and what they hold (``_parse_header``), read from the
    start of ``f`` and checked."""
    size = os.fstat(f.fileno()).st_size
    length = _check_length_field(path, f.read(_LENGTH_BYTES), size)
    header = f.read(length)
    if len(header) != length:
        _fail(path, f"it changed while being read ({len(header)} of {length} header bytes)")
    return size, header, _parse_header(path, header, size - _LENGTH_BYTES - length)


def _check_same(path: Path, whole: memoryview, size: int, header: bytes) -> None:
    """InvalidInput unless ``whole`` (the file read or mapped whole) is ``size`` bytes long and
    holds ``header``, the header validated before it was read: else the file changed meanwhile."""
    start = _LENGTH_BYTES + len(header)
    if len(whole) != size or whole[_LENGTH_BYTES:start] != header:
        _fail(path, f"it changed while being read (its size or header is no longer what it was: {len(whole)} bytes, "
                    f"{size} before)")


def _read_into(f: io.BufferedReader, view: memoryview) -> int:
    """Fill ``view`` from ``f``'s position; the bytes read (fewer at end of file)."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _views(layout: _Layout, data: memoryview) -> FlatFile:
    metadata, skeleton, entries = layout
    tensors = [FlatTensor(e.name, e.dtype, e.shape, data[e.begin : e.end]) for e in entries]
    return FlatFile(metadata=metadata, skeleton=skeleton, tensors=tensors)


def _fail(path: Path, reason: str) -> NoReturn:
    raise InvalidInput(path=str(path), reason=reason)


def _check_length_field(path: Path, head: bytes, size: int) -> int:
    """The header length that a file of ``size`` bytes starting with ``head`` declares, checked:
    the file holds the 8-byte field and that many bytes after it, within the library's cap."""
    if size < _LENGTH_BYTES or len(head) < _LENGTH_BYTES:
        _fail(path, f"it is {size} bytes long, too short for a safetensors file (its header length alone takes 8)")
    length = int.from_bytes(head[:_LENGTH_BYTES], "little")
    if length > MAX_HEADER_BYTES:
        _fail(path, f"its first 8 bytes give a header length of {length}, more than the {MAX_HEADER_BYTES} a "
                    "safetensors header may have (is it a safetensors file?)")
    if length > size - _LENGTH_BYTES:
        _fail(path, f"its first 8 bytes give a header length of {length} but only {size - _LENGTH_BYTES} bytes "
                    "follow (truncated, or not a safetensors file)")
    return length


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {_short(key)} appears twice in one object")
        out[key] = value
    return out


def _no_constant(token: str) -> NoReturn:
    raise ValueError(f"{token} is not a JSON value")


def _strict_json(text: str) -> Any:
    """``json.loads`` without the extensions JSON lacks (NaN, Infinity) and refusing an
    object that repeats a key. ValueError (RecursionError for absurd nesting) when invalid."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_count(value: Any, limit: int = _USIZE) -> bool:
    return type(value) is int and 0 <= value < limit  # bool is an int subclass, not a count


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _is_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape such as "\\ud800"
        return False
    return True


def _parse_header(path: Path, raw: bytes, data_len: int) -> _Layout:
    """Metadata, skeleton and tensor entries (sorted by name) of a header, for a data section of
    ``data_len`` bytes, all checked; InvalidInput naming the first rule broken.

    The header is UTF-8 JSON (no NaN/Infinity, no key twice in an object, valid Unicode) holding
    an object. ``__metadata__``, when present and not null, maps strings to strings. Every other
    key names a tensor: an object with ``dtype`` a safetensors code torch has a type for,
    ``shape`` a list of integers in [0, 2**63) (torch's sizes) whose product, and its bit count,
    fit in 64 bits (the library's), and ``data_offsets`` ``[begin, end]`` of integers in
    [0, 2**64) with begin <= end <= ``data_len`` and end - begin = numel * itemsize (``F4``: a
    whole number of bytes, and an even last dimension, as torch's float4_e2m1fn_x2 needs);
    other keys of the entry are ignored, as the library does. Sorted by offsets, the
    tensors' byte ranges neither overlap nor leave a hole, and cover the data section exactly.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail(path, f"its header is not UTF-8 text (byte {e.start} of it)")
    try:
        doc = _strict_json(text)
    except RecursionError:
        _fail(path, "its header is not usable JSON: it is nested too deeply")
    except ValueError as e:
        _fail(path, f"its header is not valid JSON: {e}")
    if not isinstance(doc, dict):
        _fail(path, f"its header is a JSON {_json_type(doc)}, not an object")
    metadata = _metadata(path, doc.pop("__metadata__", None))
    entries = sorted((_entry(path, name, info, data_len) for name, info in doc.items()), key=lambda e: e.name)
    _check_coverage(path, entries, data_len)
    return metadata, _skeleton(path, metadata), entries


def _metadata(path: Path, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        _fail(path, f"its __metadata__ is a JSON {_json_type(value)}, not an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            _fail(path, f"its __metadata__ entry {_short(key)} is a JSON {_json_type(item)}, not a string")
        if not (_is_utf8(key) and _is_utf8(item)):
            _fail(path, f"its __metadata__ entry {_short(key)} is not valid Unicode")
    return value


def _entry(path: Path, name: str, info: Any, data_len: int) -> _Entry:
    """The checked entry of tensor ``name`` (messages are formatted only on failure: a file may
    hold many thousands of tensors)."""
    if not _is_utf8(name):
        _fail(path, f"the name of tensor {_short(name)} is not valid Unicode")
    if not isinstance(info, dict):
        _fail(path, f"the header entry of tensor {_short(name)} is a JSON {_json_type(info)}, not an object")
    for field in ("dtype", "shape", "data_offsets"):
        if field not in info:
            _fail(path, f"the header entry of tensor {_short(name)} has no {field!r}")
    code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
        known = ", ".join(SAFETENSORS_DTYPES)
        _fail(path, f"tensor {_short(name)} has dtype {_short(code)}, which is not one torch can hold "
                    f"(known: {known})")
    if not isinstance(shape, list) or not all(_is_count(d, _MAX_DIM) for d in shape):
        _fail(path, f"tensor {_short(name)} has shape {_short(shape)}; a shape is a list of integers from 0 to "
                    "2**63-1")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        _fail(path, f"tensor {_short(name)} has data_offsets {_short(offsets)}; they must be [begin, end], "
                    "non-negative integers")
    begin, end = offsets
    if begin > end:
        _fail(path, f"tensor {_short(name)} has data_offsets [{begin}, {end}]: it ends before it begins")
    if end > data_len:
        _fail(path, f"tensor {_short(name)} ends at byte {end} of the data section, but the file holds only "
                    f"{data_len} bytes of data (truncated?)")
    return _Entry(name, SAFETENSORS_DTYPES[code], _torch_shape(path, name, code, shape, end - begin), begin, end)


def _torch_shape(path: Path, name: str, code: str, shape: list[int], nbytes: int) -> list[int]:
    """torch's shape of tensor ``name``, stored with ``code`` and safetensors ``shape`` in
    ``nbytes`` bytes, checked: its element and bit counts fit in 64 bits (as the library
    requires) and fill exactly ``nbytes``."""
    per = _VALUES_PER_ELEMENT.get(code, 1)
    itemsize = DTYPES[SAFETENSORS_DTYPES[code]].itemsize
    numel = 1
    for d in shape:  # in order, as the library multiplies: a 0 after an overflow does not save it
        numel *= d
        if numel >= _USIZE:
            _fail(path, f"{_stored(name, code, shape)} has more elements than 64 bits can count")
    if numel * itemsize * 8 // per >= _USIZE:
        _fail(path, f"{_stored(name, code, shape)} has more bits than 64 bits can count")
    if per == 1:
        if numel * itemsize != nbytes:
            _fail(path, f"{_stored(name, code, shape)} takes {numel * itemsize} bytes but its data_offsets span "
                        f"{nbytes}")
        return shape
    if numel % per:
        _fail(path, f"{_stored(name, code, shape)} is not a whole number of bytes")
    if not shape or shape[-1] % per:
        _fail(path, f"{_stored(name, code, shape)} needs a last dimension divisible by {per} to be torch's "
                    f"{SAFETENSORS_DTYPES[code]}")
    if numel // per * itemsize != nbytes:
        _fail(path, f"{_stored(name, code, shape)} takes {numel // per * itemsize} bytes but its data_offsets "
                    f"span {nbytes}")
    return [*shape[:-1], shape[-1] // per]


def _stored(name: str, code: str, shape: list[int]) -> str:
    return f"tensor {_short(name)} ({code}, shape {_short(shape)})"


def _check_coverage(path: Path, entries: list[_Entry], data_len: int) -> None:
    """The byte ranges, in offset order, tile the data section: no overlap, no hole, no tail."""
    at, previous = 0, None
    for e in sorted(entries, key=lambda e: (e.begin, e.end, e.name)):
        if e.begin < at:
            _fail(path, f"tensor {_short(e.name)} (bytes {e.begin}-{e.end}) overlaps tensor {_short(previous)} "
                        f"(which ends at byte {at})")
        if e.begin > at:
            where = f"after tensor {_short(previous)}" if previous is not None else "at the start of the data"
            _fail(path, f"bytes {at}-{e.begin} of its data section belong to no tensor (a hole {where})")
        at, previous = e.end, e.name
    if at != data_len:
        _fail(path, f"its last {data_len - at} bytes belong to no tensor (the tensors end at byte {at} of the "
                    f"{data_len}-byte data section)")


def _skeleton(path: Path, metadata: dict[str, str]) -> Any | None:
    if SKELETON_KEY not in metadata:
        return None
    try:
        skeleton = _strict_json(metadata[SKELETON_KEY])
    except RecursionError:
        _fail(path, "its ckptrepo skeleton is unusable: it is nested too deeply")
    except ValueError as e:
        _fail(path, f"its ckptrepo skeleton is unusable: {e}")
    if not (isinstance(skeleton, dict) and "d" in skeleton):
        _fail(path, "its ckptrepo skeleton does not describe a dict")
    return skeleton
