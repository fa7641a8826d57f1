"""Property tests: flatten -> bytes -> tensor_from_bytes -> unflatten is bit-exact, keeps ties and types."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptrepo.state import SUPPORTED_DTYPES, dtype_name, flatten, tensor_bytes, tensor_from_bytes, unflatten
from ckptrepo.testing import assert_states_equal

PROFILE = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NUMPY_NAMES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
NUMPY_NAMES |= {"float16", "float32", "float64", "complex64", "complex128"}


@st.composite
def leaf_arrays(draw: st.DrawFn) -> torch.Tensor | np.ndarray[Any, Any]:
    """A tensor of any supported dtype and shape, maybe non-contiguous or a Parameter, or an ndarray."""
    name = draw(st.sampled_from(sorted(SUPPORTED_DTYPES)))
    dtype = SUPPORTED_DTYPES[name]
    shape = draw(st.lists(st.integers(0, 3), max_size=4))
    layout = draw(st.sampled_from(["contiguous", "transposed", "sliced", "parameter", "numpy"]))
    made = list(shape)
    if layout == "transposed" and len(made) >= 2:
        made[0], made[-1] = made[-1], made[0]
    if layout == "sliced" and made:
        made[0] *= 2
    nbytes = math.prod(made) * dtype.itemsize
    data = draw(st.binary(min_size=nbytes, max_size=nbytes))
    raw = torch.tensor(list(data), dtype=torch.uint8)
    if dtype == torch.bool:
        raw %= 2
    t = raw.view(dtype).reshape(made)
    if layout == "transposed" and len(made) >= 2:
        t = t.transpose(0, -1)
    elif layout == "sliced" and made:
        t = t[::2]
    elif layout == "parameter":
        t = torch.nn.Parameter(t, requires_grad=False)
    elif layout == "numpy" and name in NUMPY_NAMES:
        return t.numpy()
    assert list(t.shape) == shape
    return t


plain = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6)
)
keys = st.text(alphabet="ab./%_", max_size=4) | st.integers(-3, 3) | st.none() | st.floats(-2, 2, allow_nan=False)


@st.composite
def states(draw: st.DrawFn) -> Any:
    """A nested state whose leaves are plain values and arrays drawn from a pool, so some repeat (ties)."""
    pool = draw(st.lists(leaf_arrays(), min_size=1, max_size=5))
    leaves = plain | st.sampled_from(range(len(pool))).map(lambda i: pool[i])
    tree = st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=4)
            | st.lists(children, max_size=4).map(tuple)
            | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=12,
    )
    return draw(tree)


def store(t: torch.Tensor, kind: str) -> bytes | bytearray | memoryview | torch.Tensor:
    """The entry's bytes as a repository would hand them back, in one of the accepted buffer types."""
    data = bytes(tensor_bytes(t))
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(bytearray(b"\0" + data))[1:]
    if kind == "tensor":
        return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
    return data


def arrays(state: Any) -> Iterator[Any]:
    """The tensors and arrays of ``state``, depth first in its order."""
    if isinstance(state, torch.Tensor | np.ndarray):
        yield state
    elif isinstance(state, dict | list | tuple):
        for item in state.values() if isinstance(state, dict) else state:
            yield from arrays(item)


def assert_restored(orig: Any, back: Any) -> None:
    """``back`` equals ``orig`` bit for bit with the same types and key order, and has the same
    ties: the arrays that are one object in ``orig`` are one in ``back``, and only those."""
    assert_states_equal(back, orig, ordered=True)
    ties: dict[int, Any] = {}
    for a, b in zip(arrays(orig), arrays(back), strict=True):
        if id(a) in ties:
            assert ties[id(a)] is b, "a tie was not restored as the same object"
        else:
            assert all(t is not b for t in ties.values()), "distinct arrays were merged"
            ties[id(a)] = b


@PROFILE
@given(state=states(), kind=st.sampled_from(["bytes", "bytearray", "memoryview", "tensor"]))
def test_round_trip_is_exact(state: Any, kind: str) -> None:
    flat = flatten(state)
    skeleton = json.loads(json.dumps(flat.skeleton, allow_nan=False))
    restored = {
        name: tensor_from_bytes(store(t, kind), dtype_name(t.dtype), list(t.shape)) for name, t in flat.tensors.items()
    }
    assert_restored(state, unflatten(skeleton, restored))


@PROFILE
@given(state=states())
def test_each_tie_is_stored_once(state: Any) -> None:
    flat = flatten(state)
    storages = [(t.untyped_storage()._cdata, t.storage_offset(), t.shape) for t in flat.tensors.values()]
    assert len(storages) == len(set(storages))
    assert set(flat.kinds.values()) <= {"tensor", "ndarray"}
