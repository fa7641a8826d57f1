"""Unit tests of ckptrepo.state: dtypes, byte views, entry names, flatten/unflatten, load_into."""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch

from ckptrepo.errors import FormatError, IntegrityError, UnsupportedState, UsageError
from ckptrepo.state import (
    SUPPORTED_DTYPES,
    Flattened,
    dtype_from_name,
    dtype_name,
    flatten,
    is_flat_tensor_dict,
    join_path,
    load_into,
    split_path,
    tensor_bytes,
    tensor_from_bytes,
    tensors_bytes,
    unflatten,
)

REQUIRED_DTYPES = [
    "float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "complex64", "complex128",
]  # fmt: skip


def through_storage(flat: Flattened) -> dict[str, torch.Tensor]:
    """What a repository hands back: every entry rebuilt from a copy of its bytes."""
    return {
        name: tensor_from_bytes(bytes(tensor_bytes(t)), dtype_name(t.dtype), list(t.shape))
        for name, t in flat.tensors.items()
    }


def round_trip(state: Any, **kwargs: Any) -> Any:
    flat = flatten(state, **kwargs)
    skeleton = json.loads(json.dumps(flat.skeleton, allow_nan=False))
    return unflatten(skeleton, through_storage(flat), **kwargs)


# --- dtypes and bytes ---------------------------------------------------------------------------


def test_supported_dtypes_cover_every_fixed_layout_dtype() -> None:
    assert set(REQUIRED_DTYPES) <= set(SUPPORTED_DTYPES)
    for name, dtype in SUPPORTED_DTYPES.items():
        assert dtype_name(dtype) == name
        assert dtype_from_name(name) is dtype
    assert dtype_name(torch.half) == "float16"


def test_unknown_dtypes_are_refused() -> None:
    with pytest.raises(KeyError):
        dtype_name(torch.qint8)
    with pytest.raises(FormatError):
        dtype_from_name("float7")


def test_tensor_bytes_aliases_a_contiguous_cpu_tensor() -> None:
    t = torch.arange(4, dtype=torch.float32)
    view = tensor_bytes(t)
    assert view.format == "B" and len(view) == 16
    t[0] = 5.0
    assert bytes(view[:4]) == struct.pack("<f", 5.0)


@pytest.mark.parametrize(
    "t",
    [
        torch.tensor(3.5, dtype=torch.float64),
        torch.zeros(0, 3, dtype=torch.int16),
        torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),
        torch.arange(10, dtype=torch.int64)[::3],
        torch.arange(6, dtype=torch.float32).reshape(2, 3).expand(2, 2, 3),
        torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj(),
    ],
    ids=["0-dim", "empty", "transposed", "strided", "expanded", "conj-view"],
)
def test_tensor_bytes_are_the_contiguous_values(t: torch.Tensor) -> None:
    expected = t.resolve_conj().contiguous().numpy().tobytes()
    assert bytes(tensor_bytes(t)) == expected
    back = tensor_from_bytes(expected, dtype_name(t.dtype), list(t.shape))
    assert back.shape == t.shape and torch.equal(back, t.resolve_conj())


def test_tensor_from_bytes_aliases_writable_buffers_and_copies_readonly_ones() -> None:
    buf = bytearray(struct.pack("<2f", 1.0, 2.0))
    t = tensor_from_bytes(buf, "float32", [2])
    buf[:4] = struct.pack("<f", 7.0)
    assert t[0].item() == 7.0
    raw = torch.tensor([0, 0, 128, 63], dtype=torch.uint8)
    assert tensor_from_bytes(raw, "float32", []).data_ptr() == raw.data_ptr()
    frozen = tensor_from_bytes(struct.pack("<f", 1.0), "float32", [1])
    frozen += 1  # writable although the input was immutable
    assert frozen.item() == 2.0


def test_tensor_from_bytes_handles_misaligned_buffers() -> None:
    data = bytearray(b"\0" + struct.pack("<2d", 1.5, -2.5))
    assert tensor_from_bytes(memoryview(data)[1:], "float64", [2]).tolist() == [1.5, -2.5]


def test_tensor_from_bytes_checks_length_and_bools() -> None:
    with pytest.raises(IntegrityError):
        tensor_from_bytes(b"\0" * 7, "float32", [2])
    with pytest.raises(IntegrityError):
        tensor_from_bytes(b"\x00\x02", "bool", [2])
    with pytest.raises(FormatError):
        tensor_from_bytes(b"", "nope", [0])


# --- entry names --------------------------------------------------------------------------------


def test_join_and_split_path() -> None:
    assert join_path(["model", "layer.0.weight"]) == "model/layer.0.weight"
    assert join_path(["optim", "state", 0, "exp_avg"]) == "optim/state/0/exp_avg"
    assert join_path(["a/b", "50%"]) == "a%2Fb/50%25"
    for parts in (["a/b", "%2F", "%25/", ""], ["x"], ["", ""]):
        assert split_path(join_path(parts)) == parts


def test_entry_names_follow_key_paths() -> None:
    model = torch.nn.Linear(2, 3)
    flat = flatten({"model": model, "extra": [torch.zeros(1)], "odd/key": torch.ones(1)})
    assert list(flat.tensors) == ["model/weight", "model/bias", "extra/0", "odd%2Fkey"]
    assert flatten({"a.b": torch.zeros(1)}).tensors.keys() == {"a.b"}
    assert flat.kinds == dict.fromkeys(flat.tensors, "tensor")


# --- flatten / unflatten ------------------------------------------------------------------------


def test_plain_values_round_trip_with_their_types() -> None:
    state = {
        "none": None,
        "flags": (True, False),
        "ints": [0, -1, 2**100],
        "floats": [1.0, -0.0, 1e-300, math.inf, -math.inf],
        "text": "héllo",
        "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]),
        "device": torch.device("cpu"),
        "np_scalars": [np.float32(1.5), np.int64(-3), np.bool_(True)],
        1: "int key",
        None: "none key",
        2.5: "float key",
        False: "bool key",
    }
    back = round_trip(state)
    assert back == state
    assert [type(k) for k in back] == [type(k) for k in state]
    assert [type(x) for x in back["np_scalars"]] == [np.float32, np.int64, np.bool_]
    assert type(back["flags"]) is tuple and type(back["ints"][2]) is int and type(back["floats"][0]) is float
    nan = round_trip({"nan": math.nan})["nan"]
    assert type(nan) is float and math.isnan(nan)


def test_skeleton_is_strict_compact_json() -> None:
    flat = flatten({"lr": 0.1, "betas": (0.9, 0.999), "bad": math.nan, "w": torch.zeros(2)})
    text = json.dumps(flat.skeleton, allow_nan=False, separators=(",", ":"))
    assert text == '{"d":["lr",0.1,"betas",{"u":[0.9,0.999]},"bad",{"f":"nan"},"w",{"t":"w"}]}'


def test_ties_are_stored_once_and_restored_as_one_object() -> None:
    shared = torch.arange(6.0)
    param = torch.nn.Parameter(torch.ones(2))
    state = {"a": shared, "b": [shared, shared[1:]], "p": param, "q": param}
    flat = flatten(state)
    assert list(flat.tensors) == ["a", "b/1", "p"]
    assert flat.tensors["a"] is shared and flat.tensors["p"] is param
    back = round_trip(state)
    assert back["a"] is back["b"][0] and back["p"] is back["q"]
    assert back["b"][1] is not back["a"] and torch.equal(back["b"][1], shared[1:])
    assert type(back["p"]) is torch.nn.Parameter and back["p"].requires_grad


def test_numpy_arrays_come_back_as_numpy() -> None:
    arr = np.arange(12, dtype=np.uint16).reshape(3, 4)[:, ::2]
    back = round_trip({"a": arr, "same": arr, "c": np.zeros((), dtype=np.complex128)})
    assert isinstance(back["a"], np.ndarray) and back["a"].dtype == np.uint16
    assert np.array_equal(back["a"], arr) and back["same"] is back["a"]
    assert back["c"].shape == () and back["c"].dtype == np.complex128
    assert flatten({"a": arr}).kinds == {"a": "ndarray"}


def test_module_state_dict_keeps_its_version_metadata() -> None:
    bn = torch.nn.BatchNorm1d(3)
    back = round_trip({"bn": bn})["bn"]
    assert isinstance(back, OrderedDict) and back._metadata == bn.state_dict()._metadata  # type: ignore[attr-defined]
    torch.nn.BatchNorm1d(3).load_state_dict(back)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_are_referenced_and_read_back() -> None:
    t = torch.arange(4.0, device="cuda")
    flat = flatten({"t": t})
    assert flat.tensors["t"] is t
    assert torch.equal(round_trip({"t": t})["t"], t.cpu())


# --- refusals and pickling ----------------------------------------------------------------------


class Custom:
    def __init__(self, value: int) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom) and other.value == self.value

    __hash__ = None  # type: ignore[assignment]


def quantized() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)


@pytest.mark.parametrize(
    ("state", "path", "what"),
    [
        ({"optim": {"param_groups": [{"foo": lambda: 1}]}}, "optim/param_groups/0/foo", "function"),
        ({"a": {"b": Custom(1)}}, "a/b", "Custom"),
        ({"a/b": {"50%": [Custom(1)]}}, "a%2Fb/50%25/0", "Custom"),  # the path as entry names spell it
        ({"a": [1, {2, 3}]}, "a/1", "set"),
        ({"w": torch.eye(3).to_sparse()}, "w", "sparse"),
        ({"w": torch.zeros(2, device="meta")}, "w", "meta"),
        ({"w": quantized()}, "w", "quantized"),
        ({"w": torch.zeros(2, dtype=torch.uint4)}, "w", "uint4"),
        ({"a": np.zeros(2, dtype=">f4")}, "a", ">f4"),
        ({"a": np.array(["x"], dtype=object)}, "a", "object"),
        ({"k": {(1, 2): 3}}, "k", "dict key (1, 2)"),
        ({"k": {math.nan: 3}}, "k", "dict key nan"),
        ({"k": {0: 1, "0": 2}}, "k", "share the entry name"),
    ],
)
def test_unsupported_values_are_refused_with_their_path(state: Any, path: str, what: str) -> None:
    with pytest.raises(UnsupportedState) as info:
        flatten(state)
    assert info.value.fields["path"] == path
    assert f"at {path}:" in str(info.value) and what in str(info.value)


def test_a_container_holding_itself_is_refused() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    with pytest.raises(UnsupportedState, match="contains itself"):
        flatten({"loop": loop})


def test_allow_pickle_stores_and_restores_other_objects() -> None:
    state = {"obj": Custom(7), "s": {1, 2}, "w": torch.ones(1)}
    flat = flatten(state, allow_pickle=True)
    assert flat.kinds == {"obj": "pickle", "s": "pickle", "w": "tensor"}
    assert flat.tensors["obj"].dtype == torch.uint8
    back = round_trip(state, allow_pickle=True)
    assert back["obj"] == Custom(7) and back["s"] == {1, 2}
    with pytest.raises(UsageError, match="allow_pickle=True"):
        unflatten(flat.skeleton, through_storage(flat))
    with pytest.raises(UnsupportedState, match="cannot be pickled"):
        flatten({"f": lambda: 1}, allow_pickle=True)


def test_unflatten_rejects_broken_skeletons() -> None:
    with pytest.raises(FormatError, match="unknown"):
        unflatten({"zz": 1}, {})
    with pytest.raises(FormatError):
        unflatten({"d": ["odd"]}, {})
    with pytest.raises(FormatError):
        unflatten({"dt": "not_a_dtype"}, {})
    with pytest.raises(IntegrityError, match="not restored"):
        unflatten({"t": "gone"}, {})


def test_is_flat_tensor_dict() -> None:
    assert is_flat_tensor_dict({"a": torch.zeros(1), "b.c": torch.nn.Parameter(torch.ones(1))})
    assert is_flat_tensor_dict({})
    assert not is_flat_tensor_dict({"a": torch.zeros(1), "n": 1})
    assert not is_flat_tensor_dict({"a": {"b": torch.zeros(1)}})
    assert not is_flat_tensor_dict({0: torch.zeros(1)})


# --- training state and load_into ---------------------------------------------------------------


def make_training(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    return model, opt, sched


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss = model(torch.randn(16, 4, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def test_module_optimizer_scheduler_round_trip_and_load_into() -> None:
    model, opt, sched = make_training(0)
    train(model, opt, sched, 3, seed=1)
    restored = round_trip({"model": model, "optim": opt, "sched": sched, "step": 3})
    assert restored["step"] == 3
    assert set(restored["optim"]["state"]) == {0, 1, 2, 3, 4, 5}

    model2, opt2, sched2 = make_training(99)
    load_into({"model": model2, "optim": opt2, "sched": sched2}, restored)
    for (name, a), b in zip(model.state_dict().items(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    sa, sb = opt.state_dict(), opt2.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for pid, st in sa["state"].items():
        assert st.keys() == sb["state"][pid].keys()
        for key, value in st.items():
            assert torch.equal(value, sb["state"][pid][key]), (pid, key)
    assert sa["state"][0]["step"].item() == 3.0
    assert sched.state_dict() == sched2.state_dict()

    train(model, opt, sched, 2, seed=5)
    train(model2, opt2, sched2, 2, seed=5)
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_load_into_tensors_arrays_and_nested_dicts() -> None:
    target = torch.zeros(3)
    arr = np.zeros(2, dtype=np.int32)
    source = {"w": torch.arange(3.0), "nested": {"a": np.array([4, 5], dtype=np.int32)}, "unused": 1}
    load_into({"w": target, "nested": {"a": arr}}, source)
    assert target.tolist() == [0.0, 1.0, 2.0] and arr.tolist() == [4, 5]
    load_into({"a": arr}, {"a": torch.tensor([6, 7], dtype=torch.int32)})
    assert arr.tolist() == [6, 7]


def test_load_into_errors_name_the_path() -> None:
    with pytest.raises(UsageError, match=r"no 'model'.*'optim', 'step'"):
        load_into({"model": torch.nn.Linear(1, 1)}, {"optim": {}, "step": 1})
    with pytest.raises(UsageError, match=r"'w'.*float32 \[2\].*float32 \[3\]"):
        load_into({"w": torch.zeros(3)}, {"w": torch.zeros(2)})
    with pytest.raises(UsageError, match=r"'w'.*int64"):
        load_into({"w": torch.zeros(2)}, {"w": torch.zeros(2, dtype=torch.int64)})
    with pytest.raises(UsageError, match="'m'"):
        load_into({"m": torch.nn.Linear(2, 2)}, {"m": {"weight": torch.zeros(1)}})
    with pytest.raises(UsageError, match="cannot be loaded into"):
        load_into({"n": 3}, {"n": 4})
    with pytest.raises(UsageError, match="'d/x'"):
        load_into({"d": {"x": torch.zeros(1)}}, {"d": {"x": "text"}})


def test_tensors_bytes_slice_shared_storages_and_equal_tensor_bytes() -> None:
    arena = torch.arange(64, dtype=torch.uint8)
    a = arena[8:24].view(torch.float32)  # views of one storage: sliced from one memoryview
    b = arena[32:40].view(torch.int16).view(2, 2)
    own = torch.arange(5, dtype=torch.int64)
    odd = [torch.arange(12, dtype=torch.int32).reshape(3, 4).t(), torch.tensor(2.5), torch.zeros(0, 3),
           torch.tensor([1 + 2j], dtype=torch.complex64).conj()]
    alias = torch.frombuffer(arena.numpy().data[:16], dtype=torch.uint8)  # same bytes, a smaller storage
    tensors = [a, b, own, *odd, alias, arena[60:]]
    views = tensors_bytes(tensors)
    assert [bytes(v) for v in views] == [bytes(tensor_bytes(t)) for t in tensors]
    arena[8] = 255  # aliased, as tensor_bytes aliases contiguous CPU tensors
    assert views[0][0] == 255 and views[-2][8] == 255
