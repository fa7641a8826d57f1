"""Tensor element types by their stored names, known without importing torch.

A dtype is stored under the name ``ckptrepo.state.SUPPORTED_DTYPES`` gives it (``"float32"``,
``"bfloat16"``, ``"float8_e4m3fn"``, ``"bits8"``: torch's name without ``torch.``). ``DTYPES``
describes every name this ckptrepo knows, whether or not the installed torch has it; ``dtype``
turns a stored name or a ``torch.dtype`` into its ``DType`` without importing torch, so code that
only moves, hashes or summarises bytes (reading a safetensors file, ingest statistics) never
pays for ``import torch``.

Also here: safetensors' dtype codes (``SAFETENSORS_DTYPES``) and the float32 value of every bit
pattern of each one-byte float format (``BYTE_FLOAT_TABLES``), decoded from the formats'
definitions: torch's conversions agree bit for bit (tests check it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from ckptrepo.errors import FormatError

if TYPE_CHECKING:
    import numpy as np
    import torch

    BYTE_FLOAT_TABLES: dict[str, np.ndarray[Any, Any]]

Kind: TypeAlias = Literal["float", "int", "uint", "bool", "complex", "bits"]


@dataclass(frozen=True)
class DType:
    """One element type.

    ``name``: the stored name. ``itemsize``: bytes per element as torch counts them (one byte of
    ``float4_e2m1fn_x2`` holds two 4-bit values). ``kind``: ``"float"`` (every real floating
    format, fp8 and fp4 included), ``"int"``, ``"uint"``, ``"bool"``, ``"complex"`` or ``"bits"``
    (opaque bit containers). ``numpy``: the numpy dtype whose view of the bytes gives the values
    (host byte order), None where numpy has no such type (bfloat16, complex32, fp8, fp4, bits).
    ``safetensors``: its code in a safetensors header, None where safetensors has none.
    """

    name: str
    itemsize: int
    kind: Kind
    numpy: str | None = None
    safetensors: str | None = None

    @property
    def is_complex(self) -> bool:
        return self.kind == "complex"

    @property
    def is_floating_point(self) -> bool:
        """As ``torch.dtype.is_floating_point``: real floats only."""
        return self.kind == "float"


DTypeLike: TypeAlias = "str | DType | torch.dtype"

_ROWS: tuple[DType, ...] = (
    DType("float64", 8, "float", "float64", "F64"),
    DType("float32", 4, "float", "float32", "F32"),
    DType("float16", 2, "float", "float16", "F16"),
    DType("bfloat16", 2, "float", None, "BF16"),
    DType("float8_e4m3fn", 1, "float", None, "F8_E4M3"),
    DType("float8_e5m2", 1, "float", None, "F8_E5M2"),
    DType("float8_e4m3fnuz", 1, "float", None, "F8_E4M3FNUZ"),
    DType("float8_e5m2fnuz", 1, "float", None, "F8_E5M2FNUZ"),
    DType("float8_e8m0fnu", 1, "float", None, "F8_E8M0"),
    DType("float4_e2m1fn_x2", 1, "float", None, "F4"),
    DType("int8", 1, "int", "int8", "I8"),
    DType("int16", 2, "int", "int16", "I16"),
    DType("int32", 4, "int", "int32", "I32"),
    DType("int64", 8, "int", "int64", "I64"),
    DType("uint8", 1, "uint", "uint8", "U8"),
    DType("uint16", 2, "uint", "uint16", "U16"),
    DType("uint32", 4, "uint", "uint32", "U32"),
    DType("uint64", 8, "uint", "uint64", "U64"),
    DType("bool", 1, "bool", "bool", "BOOL"),
    DType("complex32", 4, "complex"),
    DType("complex64", 8, "complex", "complex64", "C64"),
    DType("complex128", 16, "complex", "complex128"),
    DType("bits8", 1, "bits"),
    DType("bits16", 2, "bits"),
    DType("bits1x8", 1, "bits"),
    DType("bits2x4", 1, "bits"),
    DType("bits4x2", 1, "bits"),
)

DTYPES: dict[str, DType] = {d.name: d for d in _ROWS}
"""Every stored dtype name this ckptrepo knows (``state.SUPPORTED_DTYPES`` is the subset the
installed torch has), in ``state``'s order."""

SAFETENSORS_DTYPES: dict[str, str] = {d.safetensors: d.name for d in _ROWS if d.safetensors is not None}
"""safetensors' dtype code -> stored name, for every code whose type torch also has (safetensors'
``F6_E2M3`` and ``F6_E3M2`` have none). ``F4`` counts 4-bit values where ``float4_e2m1fn_x2``
counts bytes of two: a safetensors shape's last dimension is twice torch's."""

_LOOKUP: dict[Any, DType] = dict(DTYPES)  # also keyed by the torch.dtype objects seen so far


def dtype(x: DTypeLike) -> DType:
    """The ``DType`` of a stored name (``"float32"``), a ``torch.dtype`` or a ``DType``.

    torch is never imported: a ``torch.dtype`` is known by its ``str`` (``"torch.float32"``).
    FormatError for a name (or a torch dtype) this ckptrepo does not know.
    """
    try:
        return _LOOKUP[x]
    except (KeyError, TypeError):  # TypeError: an unhashable argument
        pass
    if isinstance(x, DType):
        return x
    name = None
    if not isinstance(x, str) and type(x).__name__ == "dtype" and type(x).__module__.split(".")[0] == "torch":
        text = str(x)
        name = text.removeprefix("torch.") if text.startswith("torch.") else None
    found = DTYPES.get(name) if name is not None else None
    if found is None:
        raise FormatError(detail=f"unknown tensor dtype {x!r}")
    _LOOKUP[x] = found
    return found


def _minifloat(
    exponent_bits: int, mantissa_bits: int, bias: int, nan: Literal["ieee", "fn", "fnuz"]
) -> np.ndarray[Any, Any]:
    """float32 values of the 256 codes of a signed one-byte float: sign, exponent, mantissa from
    the top bit down; exponent 0 is subnormal. ``nan``: ``"ieee"`` the top exponent is ±inf
    (mantissa 0) or NaN; ``"fn"`` (finite) only the all-ones exponent and mantissa are NaN;
    ``"fnuz"`` (finite, unsigned zero) the one NaN is the code of negative zero, 0x80."""
    import numpy as np

    codes = np.arange(256, dtype=np.int64)
    negative = (codes >> 7) == 1
    exponent = (codes >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = (codes & ((1 << mantissa_bits) - 1)).astype(np.float64)
    subnormal = np.ldexp(mantissa, 1 - bias - mantissa_bits)
    normal = np.ldexp(mantissa + (1 << mantissa_bits), exponent - bias - mantissa_bits)
    magnitude = np.where(exponent == 0, subnormal, normal)
    values = np.where(negative, -magnitude, magnitude)  # -0.0 for code 0x80
    top = exponent == (1 << exponent_bits) - 1
    if nan == "ieee":
        infinite = top & (mantissa == 0)
        values[infinite] = np.copysign(np.inf, values[infinite])
        values[top & (mantissa != 0)] = np.nan
    elif nan == "fn":
        values[top & (mantissa == (1 << mantissa_bits) - 1)] = np.nan
    else:
        values[0x80] = np.nan
    return values.astype(np.float32)  # every value is a float32 exactly


def _e8m0() -> np.ndarray[Any, Any]:
    """float32 values of float8_e8m0fnu: an unsigned power of two, 2**(code - 127); 0xFF is NaN."""
    import numpy as np

    values = np.ldexp(np.ones(256), np.arange(256) - 127)
    values[0xFF] = np.nan
    return values.astype(np.float32)  # 2**-127 is a float32 subnormal, exactly


def _read_only(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    a.setflags(write=False)
    return a


def _byte_float_tables() -> dict[str, np.ndarray[Any, Any]]:
    """Stored name -> read-only float32 array of 256: ``table[code]`` is the value of the byte ``code``."""
    return {
        "float8_e4m3fn": _read_only(_minifloat(4, 3, 7, "fn")),
        "float8_e5m2": _read_only(_minifloat(5, 2, 15, "ieee")),
        "float8_e4m3fnuz": _read_only(_minifloat(4, 3, 8, "fnuz")),
        "float8_e5m2fnuz": _read_only(_minifloat(5, 2, 16, "fnuz")),
        "float8_e8m0fnu": _read_only(_e8m0()),
    }


def __getattr__(name: str) -> Any:
    """``BYTE_FLOAT_TABLES`` (``_byte_float_tables``), built on first use: importing this module
    does not import numpy (metadata commands of the CLI never need it)."""
    if name == "BYTE_FLOAT_TABLES":
        tables = globals()[name] = _byte_float_tables()
        return tables
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
