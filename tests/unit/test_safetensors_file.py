"""ckptrepo.formats.safetensors_file: the torch-free reader agrees with read_safetensors (the
safetensors library) on every file the library writes, and refuses every malformed file with
InvalidInput naming it."""

from __future__ import annotations

import json
import math
import mmap
import re
import struct
import tempfile
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from ckptrepo.errors import InvalidInput
from ckptrepo.formats import ReadBuffer, safetensors_io, write_state
from ckptrepo.formats.safetensors_file import MAX_HEADER_BYTES, SKELETON_KEY, FlatFile, read_flat
from ckptrepo.state import SUPPORTED_DTYPES, dtype_name, tensor_bytes

MODES = ("read", "mapped", "buffer")


def _read(path: Path, mode: str, buffer: ReadBuffer | None = None) -> FlatFile:
    if mode == "buffer":
        return read_flat(path, buffer=buffer or ReadBuffer())
    return read_flat(path, mapped=mode == "mapped")


def _write(path: Path, header: dict[str, Any] | str | bytes, data: bytes = b"", length: int | None = None) -> Path:
    """A file of ``header`` (JSON of a dict, or text/bytes as is) and ``data``; ``length``
    overrides the length field."""
    if isinstance(header, dict):
        header = json.dumps(header)
    raw = header.encode("utf-8", "surrogatepass") if isinstance(header, str) else header
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def _entry(code: str, shape: list[int], begin: int, end: int) -> dict[str, Any]:
    return {"dtype": code, "shape": shape, "data_offsets": [begin, end]}


def _assert_agrees(flat: FlatFile, path: Path) -> None:
    """``flat`` holds what ``read_safetensors`` gives for the flat file ``path``: names in the
    same order, stored dtype names, shapes and bytes."""
    expected = safetensors_io.read_safetensors(path)
    assert [t.name for t in flat.tensors] == list(expected)
    for t in flat.tensors:
        ref = expected[t.name]
        assert (t.dtype, t.shape) == (dtype_name(ref.dtype), list(ref.shape)), t.name
        assert t.data.format == "B" and t.data.ndim == 1
        assert bytes(t.data) == bytes(tensor_bytes(ref)), t.name


def _every_storable_dtype() -> list[torch.dtype]:
    """Every dtype ``safetensors.torch.save_file`` writes (some it cannot load back itself:
    float8_e8m0fnu and float4, which ``safe_open`` reads)."""
    out = []
    for d in SUPPORTED_DTYPES.values():
        try:
            safetensors.torch.save({"t": torch.zeros(16, dtype=torch.uint8).view(d)})
        except Exception:
            continue
        out.append(d)
    return out


STORABLE = _every_storable_dtype()


def _sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    n = math.prod(shape) * dtype.itemsize
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    if dtype == torch.bool:
        raw %= 2
    return raw.view(dtype).reshape(shape)


def test_the_library_stores_the_dtypes_this_test_expects() -> None:
    names = {dtype_name(d) for d in STORABLE}
    assert {"float32", "bfloat16", "float8_e4m3fn", "float8_e8m0fnu", "float4_e2m1fn_x2", "complex64"} <= names


@pytest.mark.parametrize("mode", MODES)
def test_files_of_every_dtype_agree_with_read_safetensors(tmp_path: Path, mode: str) -> None:
    shapes: list[tuple[int, ...]] = [(3, 4), (), (0,), (2, 0, 2), (5,), (1, 1, 2)]
    tensors = {}
    for i, dtype in enumerate(STORABLE):
        for j, shape in enumerate(shapes):
            if dtype == torch.float4_e2m1fn_x2 and shape == ():
                continue  # safetensors has no scalar of 4-bit values
            tensors[f"{dtype_name(dtype)}.{j}"] = _sample(dtype, shape, i * 10 + j)
    path = tmp_path / "all.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt", "note": "é"})
    flat = _read(path, mode)
    assert flat.metadata == {"format": "pt", "note": "é"} and flat.skeleton is None
    _assert_agrees(flat, path)
    assert {t.name for t in flat.tensors} == set(tensors)


def test_float4_shapes_count_bytes_of_two_values_as_torch_does(tmp_path: Path) -> None:
    path = tmp_path / "f4.safetensors"
    t = _sample(torch.float4_e2m1fn_x2, (3, 2), 1)
    safetensors.torch.save_file({"w": t}, str(path))
    raw = path.read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack_from("<Q", raw)[0]])
    assert header["w"]["dtype"] == "F4" and header["w"]["shape"] == [3, 4]  # safetensors counts 4-bit values
    (w,) = read_flat(path).tensors
    assert (w.dtype, w.shape, bytes(w.data)) == ("float4_e2m1fn_x2", [3, 2], bytes(tensor_bytes(t)))


def test_names_come_in_the_order_safe_open_gives(tmp_path: Path) -> None:
    """Sorted by code point, whatever the offsets' order: commits hash the order."""
    from safetensors import safe_open

    names = ["b", "B", "a", "é", "z", "ä", "a.10", "a.9", "_", "0", "日本"]
    data = b"".join(bytes([i]) for i in range(len(names)))
    header = {n: _entry("U8", [1], i, i + 1) for i, n in enumerate(names)}
    path = _write(tmp_path / "order.safetensors", header, data)
    with safe_open(str(path), "pt") as f:
        expected = list(f.keys())
    assert [t.name for t in read_flat(path).tensors] == expected == sorted(names)
    assert [bytes(t.data) for t in read_flat(path).tensors] == [bytes([names.index(n)]) for n in expected]


@pytest.mark.parametrize("mode", MODES)
def test_nested_state_gives_its_skeleton_and_entries(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "nested.safetensors"
    model = torch.nn.Linear(3, 2)
    write_state({"model": model.state_dict(), "step": 7, "lr": [0.1, 0.01], "empty": torch.zeros(0)}, path)
    flat = _read(path, mode)
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    assert flat.metadata == header["__metadata__"]
    assert flat.skeleton == json.loads(header["__metadata__"][SKELETON_KEY])
    assert [t.name for t in flat.tensors] == sorted(k for k in header if k != "__metadata__")
    # The same entries as a flat read of the same file.
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        entries = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - keys() is the library's order
    assert [t.name for t in flat.tensors] == list(entries)
    for t in flat.tensors:
        assert bytes(t.data) == bytes(tensor_bytes(entries[t.name]))


def test_mapped_tensors_are_views_of_a_private_map(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_file({"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(2)}, str(path))
    before = path.read_bytes()
    flat = read_flat(path, mapped=True)
    a = flat.tensors[0]
    assert isinstance(a.data.obj, mmap.mmap) and not a.data.readonly
    a.data[0] = 0xFF  # copy-on-write: the file keeps its bytes
    assert path.read_bytes() == before
    assert flat.tensors[1].data.obj is a.data.obj  # one map for the whole file


def test_plain_reads_share_one_buffer_and_are_writable(tmp_path: Path) -> None:
    path = tmp_path / "p.safetensors"
    safetensors.torch.save_file({"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(2)}, str(path))
    a, b = read_flat(path).tensors
    assert isinstance(a.data.obj, bytearray) and a.data.obj is b.data.obj and not a.data.readonly


def test_buffered_reads_are_views_of_the_buffer_until_its_next_read(tmp_path: Path) -> None:
    first, second = tmp_path / "1.safetensors", tmp_path / "2.safetensors"
    safetensors.torch.save_file({"a": torch.zeros(4)}, str(first))
    safetensors.torch.save_file({"a": torch.ones(4)}, str(second))
    buffer = ReadBuffer()
    try:
        (a,) = read_flat(first, buffer=buffer).tensors
        assert bytes(a.data) == bytes(16)
        (b,) = read_flat(second, buffer=buffer).tensors
        assert bytes(a.data) == bytes(b.data) == bytes(tensor_bytes(torch.ones(4)))  # the same memory
        assert isinstance(b.data.obj, mmap.mmap)
        del a, b
    finally:
        buffer.close()


# The reasons below are matched loosely: the message must say what is wrong, not how.
_F = _entry  # brevity in the table
BAD: list[tuple[str, bytes | str | dict[str, Any], bytes, int | None, str]] = [
    ("header length over the cap", "{}", b"", MAX_HEADER_BYTES + 1, "more than the"),
    ("header length past the end", "{}", b"", 100, "only 2 bytes follow"),
    ("header length of 2**64-1", "{}", b"", 2**64 - 1, "more than the"),
    ("not UTF-8", b'{"\xff":1}', b"", None, "not UTF-8"),
    ("not JSON", "{x}", b"", None, "not valid JSON"),
    ("empty header", "", b"", None, "not valid JSON"),
    ("trailing characters", '{} x', b"", None, "not valid JSON"),
    ("trailing NUL", "{}\x00", b"", None, "not valid JSON"),
    ("byte-order mark", "\ufeff{}", b"", None, "not valid JSON"),
    ("NaN constant", '{"__metadata__":{"a":"b"},"x":NaN}', b"", None, "NaN is not a JSON value"),
    ("too deep", "[" * 100_000 + "]" * 100_000, b"", None, "nested too deeply"),
    ("huge integer", '{"a":' + "9" * 5000 + "}", b"", None, "not valid JSON"),
    ("a list", "[]", b"", None, "JSON array, not an object"),
    ("a string", '"x"', b"", None, "JSON string, not an object"),
    ("a repeated name", '{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                        '"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x", None, "appears twice"),
    ("metadata a list", {"__metadata__": []}, b"", None, "__metadata__ is a JSON array"),
    ("metadata value an int", {"__metadata__": {"a": 1}}, b"", None, "entry 'a' is a JSON number, not a string"),
    ("metadata value null", {"__metadata__": {"a": None}}, b"", None, "not a string"),
    ("metadata lone surrogate", '{"__metadata__":{"a":"\\udc80"}}', b"", None, "not valid Unicode"),
    ("name lone surrogate", '{"\\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x", None,
     "not valid Unicode"),
    ("entry a number", {"a": 3}, b"", None, "entry of tensor 'a' is a JSON number"),
    ("entry without dtype", {"a": {"shape": [1], "data_offsets": [0, 1]}}, b"x", None, "has no 'dtype'"),
    ("entry without shape", {"a": {"dtype": "U8", "data_offsets": [0, 1]}}, b"x", None, "has no 'shape'"),
    ("entry without offsets", {"a": {"dtype": "U8", "shape": [1]}}, b"x", None, "has no 'data_offsets'"),
    ("unknown dtype", {"a": _F("F128", [1], 0, 16)}, bytes(16), None, "dtype 'F128'"),
    ("lower-case dtype", {"a": _F("f32", [1], 0, 4)}, bytes(4), None, "dtype 'f32'"),
    ("dtype torch lacks", {"a": _F("F6_E2M3", [4], 0, 3)}, bytes(3), None, "dtype 'F6_E2M3'"),
    ("dtype not a string", {"a": _F(1, [1], 0, 1)}, b"x", None, "dtype 1"),  # type: ignore[arg-type]
    ("shape not a list", {"a": _F("U8", 1, 0, 1)}, b"x", None, "shape 1"),  # type: ignore[arg-type]
    ("negative dimension", {"a": _F("U8", [-1], 0, 0)}, b"", None, "shape \\[-1\\]"),
    ("float dimension", {"a": _F("U8", [1.0], 0, 1)}, b"x", None, "shape \\[1.0\\]"),  # type: ignore[list-item]
    ("bool dimension", {"a": _F("U8", [True], 0, 1)}, b"x", None, "shape \\[True\\]"),
    ("three offsets", {"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1, 1]}}, b"x", None, "\\[begin, end\\]"),
    ("string offset", {"a": {"dtype": "U8", "shape": [1], "data_offsets": ["0", 1]}}, b"x", None, "\\[begin, end\\]"),
    ("negative offset", {"a": _F("U8", [0], -1, -1)}, b"", None, "\\[begin, end\\]"),
    ("ends before it begins", {"a": _F("U8", [0], 1, 0)}, b"x", None, "ends before it begins"),
    ("size does not match", {"a": _F("F32", [2], 0, 4)}, bytes(4), None, "takes 8 bytes but its data_offsets span 4"),
    ("elements past 64 bits", {"a": _F("U8", [2**40, 2**40, 0], 0, 0)}, b"", None, "more elements than 64 bits"),
    ("bits past 64 bits", {"a": _F("F64", [2**61], 0, 0)}, b"", None, "more bits than 64 bits"),
    ("dimension past torch's", {"a": _F("U8", [0, 2**63], 0, 0)}, b"", None, "integers from 0 to 2\\*\\*63-1"),
    ("size past the data", {"a": _F("U8", [2**40, 2**20], 0, 1)}, b"x", None, "takes 1152921504606846976 bytes"),
    ("past the data", {"a": _F("U8", [4], 0, 4)}, b"xy", None, "holds only 2 bytes of data"),
    ("overlap", {"a": _F("U8", [2], 0, 2), "b": _F("U8", [2], 1, 3)}, b"xyz", None, "overlaps tensor 'a'"),
    ("same range twice", {"a": _F("U8", [1], 0, 1), "b": _F("U8", [1], 0, 1)}, b"x", None, "overlaps"),
    ("hole at the start", {"a": _F("U8", [1], 1, 2)}, b"xy", None, "bytes 0-1 .* belong to no tensor"),
    ("hole in the middle", {"a": _F("U8", [1], 0, 1), "b": _F("U8", [1], 2, 3)}, b"xyz", None, "hole after tensor 'a'"),
    ("bytes after the last tensor", {"a": _F("U8", [1], 0, 1)}, b"xy", None, "last 1 bytes belong to no tensor"),
    ("data but no tensors", {}, b"x", None, "last 1 bytes belong to no tensor"),
    ("empty tensor out of place", {"a": _F("U8", [1], 0, 1), "z": _F("U8", [0], 2, 2)}, b"x", None, "past|holds only"),
    ("4-bit values not filling a byte", {"a": _F("F4", [3], 0, 2)}, b"xy", None, "not a whole number of bytes"),
    ("4-bit scalar", {"a": _F("F4", [], 0, 0)}, b"", None, "not a whole number of bytes"),
    ("4-bit odd last dimension", {"a": _F("F4", [2, 1], 0, 1)}, b"x", None, "last dimension divisible by 2"),
    ("skeleton not JSON", {"__metadata__": {SKELETON_KEY: "{"}}, b"", None, "skeleton is unusable"),
    ("skeleton NaN", {"__metadata__": {SKELETON_KEY: '{"d":[NaN]}'}}, b"", None, "skeleton is unusable"),
    ("skeleton not a dict", {"__metadata__": {SKELETON_KEY: "[1]"}}, b"", None, "does not describe a dict"),
]
# Refused here although the library reads them: a name given twice (the library keeps the last).
_STRICTER = {"a repeated name"}


@pytest.mark.parametrize(("label", "header", "data", "length", "reason"), BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("mode", MODES)
def test_malformed_files_are_invalid_input_naming_the_file(
    tmp_path: Path, mode: str, label: str, header: Any, data: bytes, length: int | None, reason: str
) -> None:
    path = _write(tmp_path / "bad.safetensors", header, data, length)
    with pytest.raises(InvalidInput) as caught:
        _read(path, mode)
    message = str(caught.value)
    assert message.startswith(f"Cannot read {path}: ") and re.search(reason, message), message
    if mode == "read" and label not in _STRICTER:
        with pytest.raises(InvalidInput):  # the library refuses it too
            safetensors_io.read_safetensors(path)


@pytest.mark.parametrize("size", [0, 1, 7])
@pytest.mark.parametrize("mode", MODES)
def test_files_shorter_than_the_length_field_are_invalid_input(tmp_path: Path, mode: str, size: int) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x02" * size)
    with pytest.raises(InvalidInput, match=f"{re.escape(str(path))}: it is {size} bytes long, too short"):
        _read(path, mode)


@pytest.mark.parametrize("mode", MODES)
def test_missing_files_and_folders_are_invalid_input(tmp_path: Path, mode: str) -> None:
    for path in (tmp_path / "absent.safetensors", tmp_path):
        with pytest.raises(InvalidInput, match=re.escape(str(path))):
            _read(path, mode)


def test_lenient_headers_the_library_reads_are_read(tmp_path: Path) -> None:
    """Whitespace around the JSON, padding, a null __metadata__, unknown fields in an entry, an
    empty name: the library accepts them, so does read_flat."""
    header = ' {"__metadata__":null,"":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":[1]}}   \n '
    path = _write(tmp_path / "lenient.safetensors", header, b"xy")
    flat = read_flat(path)
    assert flat.metadata == {} and [(t.name, t.dtype, t.shape, bytes(t.data)) for t in flat.tensors] == [
        ("", "uint8", [2], b"xy")
    ]
    _assert_agrees(flat, path)


def test_empty_file_of_tensors(tmp_path: Path) -> None:
    path = tmp_path / "none.safetensors"
    safetensors.torch.save_file({}, str(path))
    for mode in MODES:
        assert _read(path, mode) == FlatFile(metadata={}, skeleton=None, tensors=[])


# A file pinned byte for byte, as the library writes it: the header length (200), the header
# (metadata first, then tensors by dtype, widest first, then name; padded with spaces to a
# multiple of 8), then float32 [1.0, -2.0], bfloat16 1.5 and a uint8 [2, 0] tensor of no bytes.
PINNED = (
    b"\xc8\x00\x00\x00\x00\x00\x00\x00"
    b'{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
    b'"b":{"dtype":"BF16","shape":[],"data_offsets":[8,10]},"e":{"dtype":"U8","shape":[2,0],"data_offsets":[10,10]}}'
    b"     "
    b"\x00\x00\x80\x3f\x00\x00\x00\xc0\xc0\x3f"
)


@pytest.mark.parametrize("mode", MODES)
def test_a_pinned_file_reads_as_pinned(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "pinned.safetensors"
    path.write_bytes(PINNED)
    flat = _read(path, mode)
    assert flat.metadata == {"format": "pt"} and flat.skeleton is None
    got = [(t.name, t.dtype, t.shape, bytes(t.data)) for t in flat.tensors]
    assert got == [
        ("b", "bfloat16", [], bytes.fromhex("c03f")),
        ("e", "uint8", [2, 0], b""),
        ("w", "float32", [2], struct.pack("<2f", 1.0, -2.0)),
    ]
    _assert_agrees(flat, path)
    tensors = {"w": torch.tensor([1.0, -2.0]), "b": torch.tensor(1.5, dtype=torch.bfloat16),
               "e": torch.zeros(2, 0, dtype=torch.uint8)}
    assert safetensors.torch.save(tensors, metadata={"format": "pt"}) == PINNED  # what the library writes


# --- fuzzing ------------------------------------------------------------------------------------------

_CODES = ["F32", "F16", "BF16", "U8", "I64", "BOOL", "F8_E4M3", "F8_E8M0", "F4", "C64", "F6_E2M3", "X", 3]
_BAD = [-1, 2**63, 2**64, 1.5, True, "2", None]
_dim = hst.integers(0, 4) | hst.integers(0, 4) | hst.integers(0, 4) | hst.sampled_from(_BAD)
_offsets = hst.tuples(hst.integers(0, 40), hst.integers(0, 40)).map(list) | hst.lists(
    hst.integers(0, 40) | hst.sampled_from(_BAD), max_size=3
)
_entries = hst.fixed_dictionaries(
    {"dtype": hst.sampled_from(_CODES), "shape": hst.lists(_dim, max_size=3) | hst.integers(), "data_offsets": _offsets}
).map(lambda d: {k: v for k, v in d.items() if not (k == "dtype" and v == "X")})  # "X": no dtype at all
_metadata = hst.dictionaries(hst.text(max_size=3), hst.text(max_size=3) | hst.integers(), max_size=2)
_headers = hst.dictionaries(
    hst.sampled_from(["a", "b", "c", "A", "é", ""]) | hst.text(max_size=3),
    _entries | _entries | _entries | hst.integers() | hst.none(),
    max_size=4,
).flatmap(
    lambda h: hst.sampled_from([h, {**h, "__metadata__": None}]) | _metadata.map(lambda m: {**h, "__metadata__": m})
)


def _tidy(header: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """``header`` with most of its entries' offsets laid out validly, and the data length."""
    at = 0
    for name, entry in sorted(header.items()):
        if name == "__metadata__" or not isinstance(entry, dict) or "data_offsets" not in entry:
            continue
        shape = entry.get("shape")
        if isinstance(shape, list) and all(type(d) is int and 0 <= d < 2**32 for d in shape):
            code = str(entry.get("dtype"))
            size = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "C64": 8}.get(code, 1)
            n = math.prod(shape) * size // (2 if code == "F4" else 1)
            if sum(map(ord, name)) % 4:
                entry["data_offsets"] = [at, at + n]
                at += n
    return header, at


def _same_as_library_or_invalid(path: Path) -> None:
    """read_flat raises InvalidInput, and only that; what it accepts, the library reads alike."""
    try:
        flat = read_flat(path)
    except InvalidInput as e:
        assert str(e).startswith(f"Cannot read {path}: ")
        return
    _assert_agrees(flat, path)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    header=_headers,
    extra=hst.sampled_from([0, 0, 0, -2, -1, 1, 2]),
    raw_length=hst.none() | hst.none() | hst.none() | hst.integers(0, 2**64 - 1),
)
def test_arbitrary_headers_are_read_as_the_library_does_or_refused(
    header: dict[str, Any], extra: int, raw_length: int | None
) -> None:
    header, data_len = _tidy(header)
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder) / "f.safetensors", header, bytes(max(0, data_len + extra)), raw_length)
        _same_as_library_or_invalid(path)


@settings(max_examples=250, deadline=None)
@given(
    edits=hst.lists(hst.tuples(hst.integers(0, 10_000), hst.integers(0, 255)), min_size=1, max_size=4),
    cut=hst.one_of(hst.none(), hst.integers(0, 400)),
)
def test_corrupted_bytes_of_a_valid_file_are_read_alike_or_refused(
    edits: list[tuple[int, int]], cut: int | None
) -> None:
    tensors = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16),
               "m": torch.tensor([True, False]), "s": torch.tensor(3, dtype=torch.int64)}
    raw = bytearray(safetensors.torch.save(tensors, metadata={"format": "pt"}))
    for at, value in edits:
        raw[at % len(raw)] = value
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "f.safetensors"
        path.write_bytes(bytes(raw[:cut]))
        _same_as_library_or_invalid(path)
        assert len({_outcome(path, mode) for mode in MODES}) == 1  # every mode reads it alike


def _outcome(path: Path, mode: str) -> str:
    try:
        flat = _read(path, mode)
    except InvalidInput as e:
        return str(e)
    return repr((flat.metadata, [(t.name, t.dtype, t.shape, bytes(t.data)) for t in flat.tensors]))
