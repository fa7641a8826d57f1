"""ckptrepo.dtypes: the torch-free dtype table agrees with torch and with ckptrepo.state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ckptrepo import dtypes, state
from ckptrepo.dtypes import BYTE_FLOAT_TABLES, DTYPES, SAFETENSORS_DTYPES, DType
from ckptrepo.errors import FormatError
from ckptrepo.formats import safetensors_io


def test_the_table_names_every_candidate_of_state_in_its_order() -> None:
    assert list(DTYPES) == list(state._DTYPE_CANDIDATES)
    assert set(state.SUPPORTED_DTYPES) <= set(DTYPES)
    assert all(d.name == name for name, d in DTYPES.items())


@pytest.mark.parametrize("name", list(state.SUPPORTED_DTYPES))
def test_each_dtype_agrees_with_torch(name: str) -> None:
    t = state.SUPPORTED_DTYPES[name]
    d = DTYPES[name]
    assert d.itemsize == t.itemsize
    if d.kind == "bits":
        return  # torch refuses to say whether a bits type is a float
    assert d.is_complex == t.is_complex
    assert d.is_floating_point == t.is_floating_point
    if d.kind in ("int", "uint"):
        assert (d.kind == "int") == t.is_signed
    if d.numpy is not None:  # a numpy view of the bytes gives torch's values
        values = (torch.arange(-8, 8) * 3 if d.kind != "uint" else torch.arange(16) * 7).to(t)
        assert np.dtype(d.numpy).itemsize == d.itemsize
        assert np.frombuffer(bytes(state.tensor_bytes(values)), dtype=d.numpy).tolist() == values.tolist()


@pytest.mark.parametrize("name", list(BYTE_FLOAT_TABLES))
def test_byte_float_tables_match_torch_bit_for_bit(name: str) -> None:
    """Every code's float32 value (signed zeros and infinities by their bits, NaNs as NaNs)."""
    table = BYTE_FLOAT_TABLES[name]
    expected = torch.arange(256, dtype=torch.uint8).view(state.SUPPORTED_DTYPES[name]).float().numpy()
    assert table.dtype == np.float32 and table.shape == (256,) and not table.flags.writeable
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(table), nan)
    assert np.array_equal(table[~nan].view(np.uint32), expected[~nan].view(np.uint32))


def test_every_one_byte_float_of_torch_has_a_table() -> None:
    one_byte_floats = {n for n, d in DTYPES.items() if d.kind == "float" and d.itemsize == 1}
    assert set(BYTE_FLOAT_TABLES) == one_byte_floats - {"float4_e2m1fn_x2"}


@pytest.mark.parametrize("name", list(state.SUPPORTED_DTYPES))
def test_dtype_takes_a_name_a_torch_dtype_or_a_dtype(name: str) -> None:
    d = dtypes.dtype(name)
    assert d is DTYPES[name]
    assert dtypes.dtype(state.SUPPORTED_DTYPES[name]) is d
    assert dtypes.dtype(d) is d


def test_torch_aliases_resolve_to_their_stored_names() -> None:
    assert dtypes.dtype(torch.float).name == "float32"
    assert dtypes.dtype(torch.half).name == "float16"
    assert dtypes.dtype(torch.cfloat).name == "complex64"
    assert dtypes.dtype(torch.long).name == "int64"


@pytest.mark.parametrize(
    "bad", ["float128", "torch.float32", "F32", "", torch.qint8, np.dtype("float32"), 3, None, [1]]
)
def test_unknown_dtypes_raise_format_error(bad: object) -> None:
    with pytest.raises(FormatError, match="unknown tensor dtype"):
        dtypes.dtype(bad)  # type: ignore[arg-type]


def test_safetensors_codes_agree_with_the_library() -> None:
    """Every code the library loads into a torch dtype names that dtype; codes it saves agree."""
    import safetensors.torch

    for code, t in safetensors.torch._TYPES.items():
        if t is not None:
            assert SAFETENSORS_DTYPES[code] == state.dtype_name(t)
    saved = set()
    for t in state.SUPPORTED_DTYPES.values():
        try:
            header = safetensors.torch.save({"t": torch.zeros(16, dtype=torch.uint8).view(t)})
        except Exception:
            continue  # a dtype the library has no code for
        code = header[8:].split(b'"dtype":"')[1].split(b'"')[0].decode()
        saved.add(t)
        assert SAFETENSORS_DTYPES[code] == state.dtype_name(t)
        assert DTYPES[state.dtype_name(t)].safetensors == code
    assert set(safetensors_io.SAFETENSORS_DTYPES) <= saved
    assert set(SAFETENSORS_DTYPES) == {
        "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "C64",
        "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0", "F4",
    }  # fmt: skip


def test_dtype_is_a_frozen_value() -> None:
    d = DTYPES["bfloat16"]
    same = DType("bfloat16", 2, "float", None, "BF16")
    assert d == same and hash(d) == hash(same)
    with pytest.raises(AttributeError):
        d.itemsize = 4  # type: ignore[misc]
